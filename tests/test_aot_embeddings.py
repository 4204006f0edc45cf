"""The contrastive train step built once (`bert_jax.embeddings_train`): the step
`experiments.finetune_embeddings` trains gives `contrastive_loss`'s own loss, takes the batch
the run feeds, and (with libtpu) compiles for a TPU slice through `experiments.aot_compile`
with its memory, estimate and the embeddings' all-gather priced.

The compile runs `experiments.aot_compile` in a subprocess, as tests/test_aot_compile.py
does: libtpu is loaded only there, never into the pytest process and its CPU devices.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_bounds, embeddings, embeddings_train, sharding
from bert_jax.config import BertConfig, ConfigError
from experiments.configs import embeddings as embeddings_config
from experiments.configs import embeddings_contrastive_pretraining_tpu as pretraining_tpu
from experiments.configs import embeddings_modernbert_base_tpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(
    not HAVE_LIBTPU,
    reason="libtpu is not installed (pip install -e '.[tpu]'): no TPU compiler to check with",
)

TINY = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=32)  # fmt: skip


def _config(batch=8, chunk=4):
    config = embeddings_config.get_config()
    config.global_batch_size, config.chunk_size = batch, chunk
    config.max_seq_length, config.num_train_steps = 16, 10
    config.warmup_proportion = 0.0
    return config


def _batch(batch, negatives, length, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for key in ("query", "positive", "negative"):
        shape = (batch, negatives, length) if key == "negative" else (batch, length)
        if key == "negative" and not negatives:
            continue
        out[f"{key}_tokens"] = rng.integers(1, TINY.vocab_size, shape, dtype=np.int32)
        lengths = rng.integers(2, length + 1, shape[:-1])
        out[f"{key}_mask"] = (np.arange(length) < lengths[..., None]).astype(np.int32)
    out["positive_ids"] = np.arange(batch, dtype=np.int32)
    out["positive_ids"][1] = 0  # a repeated positive: masked out of its twin's negatives
    return out


def test_the_shared_step_gives_contrastive_losss_own_loss(negatives=1):
    """One step of the builder's jitted step over the 8-device mesh reports the loss of
    `contrastive_loss` on one device, with the same dropout key, and moves the params."""
    config = _config()
    module = embeddings.BertForEmbedding(TINY, "mean", normalize=True)  # dropout 0.1: keys agree
    ids = jnp.zeros((1, 16), jnp.int32)
    params = jax.jit(lambda r: nn.unbox(module.init(r, ids, ids, ids)["params"]))(jax.random.key(1))
    mesh = sharding.create_mesh(config.mesh_shape)
    built = embeddings_train.make_train_step(config, module, mesh, negatives=negatives,
                                             params=params)  # fmt: skip
    host = _batch(config.global_batch_size, negatives, config.max_seq_length)
    assert set(built.batch) == set(host)  # the keys and shapes the step was built for
    assert all(built.batch[k].shape == v.shape for k, v in host.items())
    rng = jax.random.key(7)
    with sharding.activation_context(mesh):
        state, metrics = built.step(built.state, sharding.global_batch(host, mesh), rng)

    trained = module.clone(normalize=False)

    def embed(p, tokens, mask, key):
        return trained.apply({"params": p}, tokens, mask, jnp.zeros_like(tokens),
                             deterministic=False, rngs={"dropout": key})  # fmt: skip

    @jax.jit
    def one_device(p, batch, key):  # no mesh: the whole batch's candidates are here
        return embeddings.contrastive_loss(embed, p, batch, key, scale=config.scale,
                                           chunk_size=config.chunk_size)  # fmt: skip

    expected, aux = one_device(params, host, jax.random.fold_in(rng, 0))
    np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-5)
    np.testing.assert_allclose(metrics["accuracy"], aux["accuracy"])
    assert int(state.step) == 1 and float(metrics["update_norm"]) > 0


def test_without_params_the_state_is_abstract_with_the_trained_states_shardings():
    config = _config()
    module = embeddings.BertForEmbedding(TINY, "mean")
    mesh = sharding.create_mesh(config.mesh_shape)
    built = embeddings_train.make_train_step(config, module, mesh, negatives=2)
    leaves = jax.tree.leaves(built.state)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    shardings = jax.tree.leaves(built.shardings)
    assert [x.sharding for x in leaves] == shardings
    assert built.batch["negative_tokens"].shape == (8, 2, 16)
    # What aot_compile lowers: the step traced on the abstract state and batch.
    with sharding.activation_context(mesh):
        lowered = built.step.lower(built.state, built.batch, built.rng)
    state_in, batch_in, _ = lowered.args_info[0]
    assert all(arg.donated for arg in jax.tree.leaves(state_in))  # the state, as in training
    assert not any(arg.donated for arg in jax.tree.leaves(batch_in))


def test_the_tpu_config_is_modernbert_base_at_the_recipe():
    recipe = embeddings_modernbert_base_tpu.get_config()
    pod = embeddings_modernbert_base_tpu.get_config("pod")
    config_bounds.check(recipe, "finetune", devices=4)
    config_bounds.check(pod, "finetune", devices=64)
    cfg = embeddings_train.encoder_config(recipe)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (22, 768, 1152)
    assert (cfg.dtype, cfg.attention_implementation) == ("bfloat16", "splash")
    assert (recipe.learning_rate, recipe.warmup_proportion, recipe.scale) == (8e-5, 0.05, 20.0)
    assert (recipe.global_batch_size, pod.global_batch_size) == (512, 16_384)
    # 16 pairs per chip in each cached chunk: 4 chips, 64 chips.
    assert (recipe.chunk_size, pod.chunk_size) == (64, 1024)
    with pytest.raises(ValueError, match="unknown variant"):
        embeddings_modernbert_base_tpu.get_config("v5e")


def test_an_encoder_of_another_architecture_is_refused_naming_the_preset():
    config = embeddings_modernbert_base_tpu.get_config()
    found = BertConfig.from_preset("modernbert_base", dtype="bfloat16")
    embeddings_train.check_encoder(config, found)  # the overridden dtype is not compared
    with pytest.raises(
        ConfigError, match=r"encoder_preset=modernbert_base: vocab_size=30522 \(prese"
    ):
        embeddings_train.check_encoder(config, BertConfig.from_preset("base"))
    embeddings_train.check_encoder(_config(), BertConfig.from_preset("base"))  # no preset named


def test_model_flops_count_every_text_and_the_cached_forward():
    cfg = BertConfig.from_preset("base")
    flops = embeddings_train.flops_per_step(cfg, pairs=4, negatives=1, seq_len=128)
    # 12 sequences of 128 tokens; per token 24 H^2 per layer + attention 4 T H per layer.
    forward = 12 * 128 * 12 * (24 * 768**2 + 4 * 128 * 768)
    assert flops["model"] == pytest.approx(3 * forward)
    assert flops["with_recompute"] == pytest.approx(4 * forward)


def test_an_extrapolation_continues_every_figure_on_the_line_through_two_proxies():
    from experiments import aot_embeddings
    from experiments.aot_compile import MemoryUse

    def proxy(layers):
        parts = {name: aot_embeddings.Part(10.0 * layers, 1e9 * layers, 1e6, 4) for name in
                 aot_embeddings.PARTS}  # fmt: skip
        return aot_embeddings.ContrastiveReport(
            topology="v4:2x2x1", device_kind="TPU v4", num_devices=4, num_chips=4,
            mesh_shape={"data": 4}, hbm_bytes=32 * 2**30,
            train=MemoryUse(100 + layers, 100 + layers, 100 + layers, 1000 * layers, 7),
            flops={}, steps=10, peak_flops_per_device=275e12, compile_seconds=60.0,
            layout="", texts=96, raw_seconds=0.001 * layers, step_seconds=0.002 * layers,
            program=aot_embeddings.Program([("first forward", 8)], 5.0 * layers, parts),
            collective_seconds={"gather": 0.5, "gradients": 0.1 * layers}, layers=layers,
        )  # fmt: skip

    cfg = BertConfig.from_preset("modernbert_base")
    flops = {"model": 1.0, "with_recompute": 2.0}
    out = aot_embeddings.extrapolate(proxy(3), proxy(6), cfg, flops)
    assert out.layers == 22 and out.flops is flops and out.compile_seconds == 120.0
    assert out.step_seconds == pytest.approx(0.044) and out.raw_seconds == pytest.approx(0.022)
    assert out.train == MemoryUse(122, 122, 122, 22_000, 7)
    assert out.program.parts[aot_embeddings.PARTS[0]].hbm_bytes == pytest.approx(22e9)
    assert out.collective_seconds == pytest.approx({"gather": 0.5, "gradients": 2.2})
    assert [p.layers for p in out.proxies] == [3, 6] and "extrapolated from 3 and 6" in out.layout


# --- contrastive pretraining on raw text at pod scale (embeddings_contrastive_pretraining_tpu)


@pytest.mark.parametrize("variant", list(pretraining_tpu.VARIANTS))
def test_contrastive_pretraining_on_tpu_is_nomics_stage_one_on_its_slice(variant):
    """What fails cheaply before a compile or a slice: the batch over the chips and hosts,
    the chunks, the lengths, the schedule (contrastors' stage 1: docstring)."""
    from experiments import tpu_slice

    config = pretraining_tpu.get_config(variant)
    topology, chips = pretraining_tpu.VARIANTS[variant]
    assert config.topology == topology and tpu_slice.topology_device_count(topology) == chips
    hosts = tpu_slice.topology_hosts(topology)
    config_bounds.check(config, "finetune", devices=chips, processes=hosts)
    batch, chunk = config.global_batch_size, config.chunk_size
    # 16,384 pairs: whole rows for every host and chip, whole chunks of 16 pairs per chip.
    assert batch == 16_384 and batch % (chips * hosts) == 0
    assert chunk == 16 * chips and batch % chunk == 0
    assert batch // chunk == {"pod": 16, "v4_8": 256}[variant]  # the chunk loops' trips
    assert (config.query_max_seq_length, config.max_seq_length) == (64, 256)
    assert config.eval_batch_size % chips == 0
    # The einsum attention: splash tiles are multiples of 128 tokens, a 64-token query is not.
    cfg = embeddings_train.encoder_config(config)
    assert cfg.attention_implementation != "splash" and config.query_max_seq_length % 128
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.dtype) == (22, 768, "bfloat16")
    assert config.max_seq_length <= cfg.max_position_embeddings
    assert (config.learning_rate, config.scale, config.weight_decay) == (2e-4, 50.0, 0.01)
    assert config.num_train_steps == 235_000_000 // batch == 14_343
    assert int(config.num_train_steps * config.warmup_proportion) == 700  # make_optimizer's
    assert not config.corpus_files and not config.train_file  # given on the command line
    with pytest.raises(ValueError, match="unknown variant"):
        pretraining_tpu.get_config("v5e")


def test_contrastive_pretraining_on_tpu_commands_name_what_exists():
    """The config's and the docs' commands name an existing config file and variant, compile
    the pairs-only step (--negatives=0: the raw text gives no hard negatives) and pass the
    corpus; the CPU config they build on is unchanged."""
    from experiments.configs import embeddings_contrastive_pretraining as cpu

    pages = [pretraining_tpu.__doc__]
    with open(os.path.join(REPO, "docs", "tpu_embeddings.md"), encoding="utf-8") as f:
        pages.append(f.read())
    for text in pages:
        named = re.findall(r"--config=(experiments/configs/[\w.]+\.py)(?::(\w+))?", text)
        assert named, text[:200]
        for path, variant in named:
            assert os.path.exists(os.path.join(REPO, path)), path
            if path.endswith("embeddings_contrastive_pretraining_tpu.py") and variant:
                assert variant in pretraining_tpu.VARIANTS, variant
        compiles = [c for c in re.findall(r"aot_compile(?:[^\n]*\\\n)*[^\n]*", text)
                    if "embeddings_contrastive_pretraining_tpu" in c]  # fmt: skip
        assert compiles and all("--negatives=0" in c and "--proxy_layers=3,6" in c
                                for c in compiles), compiles  # fmt: skip
    assert "--config.corpus_files=" in pretraining_tpu.__doc__
    # 16 hosts: each worker's process joins the others (bert_jax.distributed)
    assert "finetune_embeddings --distributed" in pretraining_tpu.__doc__
    default = cpu.get_config()
    assert (default.global_batch_size, default.max_seq_length, default.scale) == (64, 128, 20.0)


def test_model_flops_count_queries_at_their_own_length():
    cfg = BertConfig.from_preset("base")
    flops = embeddings_train.flops_per_step(cfg, pairs=4, negatives=0, seq_len=256,
                                            query_seq_len=64)  # fmt: skip

    def forward(t):  # one sequence of t tokens: 24 H^2 per token per layer + attention
        return t * 12 * (24 * 768**2 + 4 * t * 768)

    assert flops["model"] == pytest.approx(3 * 4 * (forward(64) + forward(256)))
    same = embeddings_train.flops_per_step(cfg, pairs=4, negatives=0, seq_len=256)
    assert same["model"] == pytest.approx(3 * 8 * forward(256))  # no query length: all at T


def test_a_contrastive_report_is_recorded_and_rendered_as_a_calibrated_range(tmp_path):
    """`aot_compile --record` keeps a contrastive report as a pretraining one's: the docs'
    `tpu-figure` markers render it (benchmarks.tpu_records.tpu_figures)."""
    from benchmarks.tpu_records import tpu_figures
    from experiments import aot_embeddings, tpu_calibration, tpu_records
    from experiments.aot_compile import MemoryUse

    config = pretraining_tpu.get_config("pod")
    assert aot_embeddings.token_slots(config, 0) == 16_384 * (64 + 256)
    report = aot_embeddings.ContrastiveReport(
        topology="v4:4x4x4", device_kind="TPU v4", num_devices=64, num_chips=64,
        mesh_shape={"data": 64}, hbm_bytes=32 * 2**30, train=MemoryUse(2**30, 0, 0, 0, 0),
        flops={"model": 1e16, "with_recompute": 1.3e16}, steps=14_343,
        peak_flops_per_device=275e12, compile_seconds=1.0, layout="x", texts=32_768,
        raw_seconds=0.5, step_seconds=1.0, program=None, per_op_seconds=1.2,
        token_slots=aot_embeddings.token_slots(config, 0),
    )  # fmt: skip
    path, name = tmp_path / "figures.json", "embeddings_contrastive_pretraining_tpu.py:pod"
    tpu_records.record_contrastive(str(path), report, name)
    entries = tpu_records.load(str(path))
    key = f"{name}@v4:4x4x4"
    entry = entries[key]
    assert (entry["flops_per_step"], entry["optimal_seconds"], entry["per_op_seconds"]) == (
        1e16, 1.0, 1.2)  # fmt: skip
    assert entry["tokens_per_step"] == 16_384 * 320 and entry["train_gib"] == 1.0
    text = tpu_figures.render(entries, key, " usd=3.22", tpu_calibration.load())
    assert re.fullmatch(r"[\d.]+-[\d.]+ (h|days), [\d,]+-[\d,]+ chip-hours, \$[\d,]+-\$[\d,]+ "
                        r"at \$3\.22/chip-hour", text), text  # fmt: skip


# --- compiled for a TPU slice (libtpu) -------------------------------------------------------

TINY_TPU = (
    "--config=experiments/configs/embeddings_modernbert_base_tpu.py:recipe",
    "--config.encoder_preset=modernbert_tiny",
    "--config.max_seq_length=128",
    "--config.global_batch_size=32",
    "--config.chunk_size=16",
    "--config.eval_batch_size=32",
    "--topology=v4:2x2x1",
)


def _aot_compile(*args: str) -> str:
    """`experiments.aot_compile` with `args` in a process of its own (on this CPU, for TPU
    devices); its stdout, once it exited 0."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "experiments.aot_compile", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result.stdout


@needs_libtpu
@pytest.mark.extended  # ~45 s of TPU compile on 2 cores
def test_the_contrastive_step_compiles_for_a_v4_slice_with_its_gather_priced():
    """A tiny ModernBERT at the TPU config's layout (splash, bf16, 2 cached chunks): it fits,
    the estimate counts the chunk loops' every trip, and the embeddings' all-gather has
    its row in the breakdown."""
    out = _aot_compile(*TINY_TPU)
    assert "slice v4:2x2x1 (v4-8): 4 x TPU v4 (4 chips)" in out
    assert "fits: yes" in out
    # Queries, positives, negatives: a loop each way, the batch of 32 in 2 chunks.
    assert "chunk loops: 3 in the forward pass, 3 in the backward, 2 trips each" in out
    found = re.search(r"compiler's estimate: ([\d.]+) ms/step \(the loops' bodies counted once: "
                      r"([\d.]+) ms\)", out)  # fmt: skip
    assert found, out
    assert float(found.group(1)) > float(found.group(2)) > 0
    mfu = re.search(r"MFU ([\d.]+)% \(model FLOPs\), ([\d.]+)% with the cached forward", out)
    assert mfu and 0 < float(mfu.group(1)) < float(mfu.group(2)) < 100, out
    gather = re.search(r"\| all-gather of the embeddings \(and its backward\) \| ([\d.e-]+) "
                       r"\(alone\) \| [\d.]+ \| ([\d.]+) \|", out)  # fmt: skip
    assert gather and float(gather.group(1)) > 0 and float(gather.group(2)) > 0, out
    assert re.search(r"\| gradient all-reduce \| [\d.e-]+ \(alone\) \|", out), out


@needs_libtpu
@pytest.mark.extended  # ~1 min of TPU compile on 2 cores
def test_contrastive_pretraining_compiles_pairs_with_short_queries_and_is_recorded(tmp_path):
    """A tiny ModernBERT at the pretraining TPU config's layout (einsum attention, pairs
    only, queries at 64 tokens against 128-token passages): it fits, the loops are the two
    kinds of text's, and `--record` keeps it under the config's name and slice."""
    from experiments import tpu_records

    record = tmp_path / "figures.json"
    args = ("--config=experiments/configs/embeddings_contrastive_pretraining_tpu.py:pod",
            "--config.encoder_preset=modernbert_tiny", "--config.max_seq_length=128",
            "--config.global_batch_size=32", "--config.chunk_size=16",
            "--config.eval_batch_size=32", "--topology=v4:2x2x1", "--negatives=0",
            f"--record={record}")  # fmt: skip
    out = _aot_compile(*args)
    assert "fits: yes" in out and "texts of 128 tokens, queries of 64" in out, out
    assert "chunk loops: 2 in the forward pass, 2 in the backward, 2 trips each" in out, out
    (entry,) = tpu_records.load(str(record)).values()
    assert entry["id"].startswith("embeddings_contrastive_pretraining_tpu.py:pod ")
    assert entry["id"].endswith("@v4:2x2x1") and entry["tokens_per_step"] == 32 * (64 + 128)
    assert entry["optimal_seconds"] > 0 and entry["flops_per_step"] > 0
