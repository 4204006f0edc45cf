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


@needs_libtpu
@pytest.mark.extended  # ~45 s of TPU compile on 2 cores
def test_the_contrastive_step_compiles_for_a_v4_slice_with_its_gather_priced():
    """A tiny ModernBERT at the TPU config's layout (splash, bf16, 2 cached chunks): it fits,
    the estimate counts the chunk loops' every trip, and the embeddings' all-gather has
    its row in the breakdown."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "experiments.aot_compile", *TINY_TPU],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
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
