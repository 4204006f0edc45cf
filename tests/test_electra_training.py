"""`config.objective = "electra"` in the pretraining loop: config checks, the FLOP count behind
its MFU, a sharded run that resumes bit for bit, the AOT check, the HF export of a workdir
(checked against transformers' Electra models) and fine-tuning from a workdir.

The runs are in-process `train_loop.train_and_evaluate` calls on the synthetic records of
`synthetic_pretraining`, with an ELECTRA-Small-shaped model (E=128 < H=256, projected; the
generator half as wide, 2 heads) on a (data 2, fsdp 2, tensor 2) mesh of the 8 fake devices.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import synthetic_pretraining as synth
import test_resume
from conftest import FAST_COMPILE
from test_model_flops import matmul_flops

from bert_jax import checkpointing, electra, telemetry, train, train_loop
from bert_jax.config import BertConfig, ConfigError
from bert_jax.convert.electra import read_electra_train_state
from bert_jax.model_changes import GENERATOR_SIZES, model_changes

# The uninterrupted run, the resumed pair and the MFU run build the same train step anew:
# compiled once, loaded from the session's cache after.
pytestmark = pytest.mark.usefixtures("compile_cache")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, STOP = 4, 2
# Wall-clock figures, not results: left out when comparing two runs' logs.
TIMING_KEYS = ("steps_per_second", "sequences_per_second", "tokens_per_second", "mfu")


def _config(data_dir, stop_at_step=None):
    """bert_tiny_cpu.py on the synthetic records, objective "electra", STEPS steps."""
    config = synth.tiny_config(str(data_dir))
    config.objective = "electra"
    config.model.hidden_size = 256
    config.model.num_attention_heads = 4
    config.model.intermediate_size = 1024
    config.model.embedding_size = 128
    # 128 wide: 2 heads, which split over the tensor axis (1/4's 64 would be one head).
    config.electra.generator_hidden_fraction = 0.5
    config.num_train_steps = STEPS
    config.stop_at_step = stop_at_step
    config.log_every = 1
    config.checkpoint_every = 1000  # only the last step of each run saves
    config.mesh_shape = (2, 2, 2)
    return config


data_dir = test_resume.data_dir  # the same synthetic records (a module-scoped fixture)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_dir):
    """The workdir of an uninterrupted STEPS-step run."""
    workdir = tmp_path_factory.mktemp("straight")
    train_loop.train_and_evaluate(_config(data_dir), str(workdir))
    return workdir


def _restore(workdir):
    manager = checkpointing.make_manager(workdir / "checkpoints", async_save=False)
    try:
        state, positions, _ = checkpointing.restore(manager, None, None)
    finally:
        manager.close()
    return state, positions


def _log(workdir) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING_KEYS} for x in lines]


# --- config ---------------------------------------------------------------------------------


def test_electra_takes_static_or_dynamic_masking_and_refuses_packing(tmp_path):
    config = _config(tmp_path)
    train.check_objective(config)  # static (masked) records: their masks are the generator's
    config.data.dynamic_masking = True
    train.check_objective(config)
    config.data.pack = True
    with pytest.raises(ConfigError, match=r"config.data.pack=False"):
        train.check_objective(config)


def test_configs_without_the_electra_block_get_the_papers_generator():
    disc = BertConfig.from_preset("small", embedding_size=128)
    assert electra.experiment_generator({}, disc) == electra.generator_config(disc)
    assert electra.experiment_settings({})["disc_weight"] == electra.DISC_WEIGHT


def test_resuming_with_another_generator_is_a_model_change(tmp_path):
    saved = checkpointing.config_to_json(_config(tmp_path))
    now = _config(tmp_path)
    now.electra.generator_layer_fraction = 0.5
    now.electra.disc_weight = 10.0  # a loss weight, not the model
    vocab = synth.TINY.vocab_size
    assert model_changes(saved, now, vocab) == [("electra.generator_layer_fraction", 1.0, 0.5)]
    del saved["electra"]  # a config older than the block trained the defaults
    assert model_changes(saved, now, vocab) == [
        ("electra.generator_hidden_fraction", 0.25, 0.5),
        ("electra.generator_layer_fraction", 1.0, 0.5),
    ]
    defaults = electra.EXPERIMENT_DEFAULTS
    assert {k: defaults[k] for k in GENERATOR_SIZES} == GENERATOR_SIZES


def test_init_from_refuses_what_is_not_a_whole_electra_checkpoint(tmp_path):
    model = electra.ElectraForPreTraining(FLOPS_DISC, FLOPS_GEN)
    with pytest.raises(ConfigError, match="starts only from an electra checkpoint"):
        train_loop._load_init_params(str(tmp_path), model, None, jax.random.key(0))


# --- FLOPs ----------------------------------------------------------------------------------

B, T, P = 3, 16, 4
# E < H, a generator narrower than E (both encoders project), FFN not 4H: every term counts.
FLOPS_DISC = BertConfig(
    vocab_size=101,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=48,
    max_position_embeddings=T,
)
FLOPS_GEN = electra.generator_config(FLOPS_DISC, hidden_fraction=0.25, layer_fraction=0.5)


def _flops_model_and_inputs():
    model = electra.ElectraForPreTraining(FLOPS_DISC, FLOPS_GEN)
    batch = {k: jnp.ones((B, T), jnp.int32) for k in ("input_ids", "input_mask", "segment_ids")}
    batch |= {
        "masked_lm_positions": jnp.ones((B, P), jnp.int32),
        "masked_lm_ids": jnp.ones((B, P), jnp.int32),
        "masked_lm_weights": jnp.ones((B, P), jnp.float32),
    }
    inputs = electra.model_inputs(batch, jax.random.key(1))
    variables = jax.jit(lambda r: model.init(r, *inputs))(jax.random.key(0))
    return model, batch, inputs, variables


def test_electra_flops_equal_the_models_matmuls_forward_and_backward():
    assert FLOPS_GEN.hidden_size == 8 and FLOPS_GEN.num_hidden_layers == 1
    model, batch, inputs, variables = _flops_model_and_inputs()
    forward = jax.make_jaxpr(lambda v: model.apply(v, *inputs))(variables).jaxpr
    per_sequence = telemetry.electra_forward_flops_per_sequence(FLOPS_DISC, FLOPS_GEN, T, P)
    assert matmul_flops(forward) == B * per_sequence

    def loss(v):
        return electra.electra_loss(model.apply(v, *inputs), batch)[0]

    backward = jax.make_jaxpr(jax.grad(loss))(variables).jaxpr
    assert matmul_flops(backward) == telemetry.train_flops_per_step(FLOPS_DISC, B, T, P, FLOPS_GEN)


def test_the_run_counts_the_generator_in_its_mfu(tmp_path):
    config = _config(tmp_path)
    cfg = train.model_config(config, synth.TINY.vocab_size)
    data = config.data
    args = (cfg, config.global_batch_size, data.max_seq_length, data.max_predictions_per_seq)
    generator = electra.experiment_generator(config, cfg)
    assert train.flops_per_step(config, cfg) == telemetry.train_flops_per_step(*args, generator)
    config.objective = "mlm"
    assert train.flops_per_step(config, cfg) == telemetry.train_flops_per_step(*args)


# --- the AOT check --------------------------------------------------------------------------


# The slow tier: the training tests below compile the same `train.setup` steps already.
@pytest.mark.slow
def test_the_aot_check_compiles_the_electra_step(tmp_path):
    from experiments import aot_compile

    config = _config(tmp_path)
    config.model.vocab_size = synth.TINY.vocab_size
    train_step, eval_step, mesh, cfg = aot_compile.compile_steps(config, jax.devices())
    batch_args = train_step.input_shardings[0][1]  # (state, batch, rng) -> the batch's
    assert {"masked_lm_ids", "masked_lm_weights"} <= set(batch_args)
    params = train_step.input_shardings[0][0].params
    assert {"bert", "generator", "rtd"} == set(params)
    assert eval_step is not None and dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert cfg.embedding_size == 128


# --- training -------------------------------------------------------------------------------


# The three tests on the uninterrupted run are in the extended tier (CI runs them): the run
# and its compile cost ~46 s of make test's budget. make test keeps ELECTRA's numerics
# (tests/test_electra.py: logits and losses against transformers) and the checks above.
@pytest.mark.extended
def test_a_sharded_run_logs_the_electra_metrics(straight):
    records = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train_records] == list(range(1, STEPS + 1))
    for key in ("loss", "mlm_accuracy", "mlm_loss", "disc_loss", "disc_accuracy", "grad_norm"):
        assert all(np.isfinite(r[key]) for r in train_records), key
    assert all(0 < r["mfu"] for r in train_records[1:])  # the first step only compiles
    # at step 0, and after the last step (eval_every is past the run's end)
    evaluations = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in evaluations] == [0, STEPS]
    assert all("disc_precision" in r for r in evaluations)
    state, _ = _restore(straight)
    assert set(state["params"]) == {"bert", "generator", "rtd"}
    assert int(state["step"]) == STEPS


@pytest.mark.extended  # two more ELECTRA runs, each with its compile
def test_a_resumed_run_repeats_the_uninterrupted_one_bit_for_bit(tmp_path, data_dir, straight):
    """Extended tier, beside the in-process resume with keys from (seed, step) in
    test_resume's test_each_prng_impl_resumes_bit_for_bit[unsafe_rbg]; make test keeps
    ELECTRA's sampled replacements from the step key in test_electra's tests."""
    # Steps 1-2, a checkpoint, then a new call (new keys from the seed) restores and runs 3-4:
    # the generator's samples come from (seed, step) as the dropout masks do.
    train_loop.train_and_evaluate(_config(data_dir, stop_at_step=STOP), str(tmp_path))
    train_loop.train_and_evaluate(_config(data_dir), str(tmp_path))
    state, positions = _restore(tmp_path)
    reference, ref_positions = _restore(straight)
    assert positions == ref_positions and int(state["step"]) == STEPS
    for (path, leaf), ref_leaf in zip(
        jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(reference), strict=True
    ):
        np.testing.assert_array_equal(
            np.asarray(leaf), np.asarray(ref_leaf), err_msg=jax.tree_util.keystr(path)
        )
    assert _log(tmp_path) == _log(straight)


# --- export and fine-tuning -----------------------------------------------------------------


@pytest.mark.extended  # on the uninterrupted run (above)
def test_a_workdir_exports_to_transformers_electra_models(straight, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    output = tmp_path / "hf"
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", XLA_FLAGS=FAST_COMPILE)
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.convert", f"--input={straight}", f"--output={output}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (output / "vocab.txt").exists() and (output / "generator" / "vocab.txt").exists()

    config, generator, params, _ = read_electra_train_state(straight)
    model = electra.ElectraForPreTraining(config, generator)
    batch = synth.random_batch(4, seed=7)
    ours = model.apply({"params": params}, *electra.model_inputs(batch, jax.random.key(3)))
    mask = torch.tensor(batch["input_mask"], dtype=torch.long)
    segments = torch.tensor(batch["segment_ids"], dtype=torch.long)
    loaded = {}
    for name, directory in (
        ("ElectraForPreTraining", output),
        ("ElectraForMaskedLM", output / "generator"),
    ):
        cls = getattr(transformers, name)
        theirs, info = cls.from_pretrained(directory, output_loading_info=True)
        assert not any(info.values()), (name, info)
        loaded[name] = theirs.eval()
    with torch.no_grad():
        replaced = torch.tensor(np.asarray(ours.replaced_ids), dtype=torch.long)
        disc = loaded["ElectraForPreTraining"](
            input_ids=replaced, attention_mask=mask, token_type_ids=segments
        ).logits.numpy()
        masked = torch.tensor(batch["input_ids"], dtype=torch.long)
        gen = loaded["ElectraForMaskedLM"](
            input_ids=masked, attention_mask=mask, token_type_ids=segments
        ).logits.numpy()  # (B, T, V)
    at_masks = np.take_along_axis(gen, batch["masked_lm_positions"][..., None], axis=1)
    real = batch["input_mask"] > 0
    np.testing.assert_allclose(disc[real], np.asarray(ours.disc_logits)[real], atol=1e-5)
    np.testing.assert_allclose(at_masks, np.asarray(ours.mlm_logits), atol=1e-5)


@pytest.mark.extended  # on the uninterrupted run (above)
def test_a_workdir_fine_tunes_its_discriminator(straight, tmp_path):
    from experiments import finetune_classification as ftc
    from experiments.configs import finetune_glue

    glue = os.path.join(os.path.dirname(__file__), "fixtures", "tasks", "glue", "SST-2")
    config = finetune_glue.get_config("sst2")
    config.unlock()
    config.update(
        data_dir=glue,
        init_from=str(straight),
        max_seq_length=32,
        train_batch_size=8,
        eval_batch_size=8,
        num_epochs=1,
        log_every=1,
    )
    ftc.finetune(config, str(tmp_path))
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert 0.0 <= saved["epochs"][-1]["dev"]["accuracy"] <= 1.0

    from bert_jax import finetune_common as common
    from bert_jax.heads import BertForSequenceClassification

    module, cfg, restored, _ = common.load_model(
        BertForSequenceClassification(BertConfig(), 2), str(straight)
    )
    state, _ = _restore(straight)
    assert cfg.embedding_size == 128 and cfg.hidden_size == 256
    for path, leaf in jax.tree_util.tree_leaves_with_path(state["params"]["bert"]):
        keys = [p.key for p in path]
        value = restored["bert"]
        for key in keys:
            value = value[key]
        np.testing.assert_array_equal(np.asarray(value), np.asarray(leaf), err_msg=str(keys))
