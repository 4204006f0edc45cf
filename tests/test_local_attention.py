"""Blocked local attention (issue 42 item 4): local layers compute blocks of r = W // 2
queries against their 3r neighbouring keys, with the window, padding and packing conditions
built per block from the (B, T) segment ids. Checked against the full (T, S) computation the
model ran before (the mask ANDed with `layers.window_mask`), which tests/test_modern_model.py
and transformers' ModernBERT (tests/test_convert_modernbert.py) check in turn.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import layers
from bert_jax.config import BertConfig
from bert_jax.convert import stack_layers
from bert_jax.model import BertModel, SelfAttention

# Window 6: blocks of r = 3, so T = 13 ends in a partial block; 2 heads of 8.
CONFIG = BertConfig.from_preset(
    "modernbert_tiny",
    vocab_size=64,
    hidden_size=16,
    num_hidden_layers=4,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=64,
    local_attention_window=6,
    global_attention_every=3,
    rope_theta=1000.0,
    local_rope_theta=30.0,
)
T = 13
# Row 0 unpacked with 4 padding tokens; rows 1 and 2 packed: instances of 2, 1, 7 tokens
# (shorter and longer than the window) and 1 padding; 5, 8 and no padding.
LENGTHS = [[9], [2, 1, 7], [5, 8]]


def _packing():
    """(B, T) instance ids (0 on padding) and positions restarting in each instance."""
    ids, positions = np.zeros((3, T), np.int32), np.zeros((3, T), np.int32)
    for row, lengths in enumerate(LENGTHS):
        start = 0
        for n, length in enumerate(lengths):
            ids[row, start : start + length] = n + 1
            positions[row, start : start + length] = np.arange(length)
            start += length
    return ids, positions


def _full_local(config, mask, positions):
    """Local layers' inputs as the model built them before: the (T, S) mask and the window."""
    global_inputs, _ = layers.attention_inputs(
        config.replace(local_attention_window=0), mask, positions
    )
    window = layers.window_mask(T, config.local_attention_window)
    local_rotary = global_inputs.rotary
    if config.position_encoding == "rotary":
        local_rotary = layers.rotary_tables(positions, config.head_dim, config.local_rope_theta)
    return layers.AttentionInputs(mask & window, global_inputs.bias, local_rotary)


@pytest.fixture(scope="module")
def attention():
    x = np.random.default_rng(0).normal(size=(3, T, CONFIG.hidden_size)).astype(np.float32)
    module = SelfAttention(CONFIG.replace(linear_bias=True), deterministic=True)
    mask = layers.attention_mask(jnp.ones((3, T)))
    inputs = layers.attention_inputs(CONFIG, mask, jnp.arange(T)[None])
    params = module.init(jax.random.key(0), jnp.asarray(x), inputs[1])["params"]
    return jnp.asarray(x), nn.meta.unbox(params)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("encoding", ["rotary", "alibi"])
@pytest.mark.parametrize("causal", [False, True])
def test_blocked_equals_the_full_masked_attention(attention, packed, encoding, causal):
    x, params = attention
    config = CONFIG.replace(position_encoding=encoding, causal=causal, linear_bias=True)
    instance_ids, positions = _packing()
    if not packed:  # row i: its first sum(LENGTHS[i]) tokens real, positions 0..T-1
        instance_ids = (instance_ids > 0).astype(np.int32)
        positions = np.broadcast_to(np.arange(T), (3, T))
    input_mask, positions = jnp.asarray(instance_ids > 0), jnp.asarray(positions)
    mask = layers.attention_mask(input_mask, jnp.asarray(instance_ids) if packed else None, causal)
    segments = layers.segment_ids(input_mask, jnp.asarray(instance_ids) if packed else None)
    _, blocked = layers.attention_inputs(config, mask, positions, segments)
    assert blocked.mask.shape == (3, 5, 1, 3, 9)  # (B, n, 1, r, 3r): no (T, S) mask
    module = SelfAttention(config, deterministic=True)
    got = module.apply({"params": params}, x, blocked)
    want = module.apply({"params": params}, x, _full_local(config, mask, positions))
    real = instance_ids > 0  # a padding query's output is junk either way
    np.testing.assert_allclose(got[real], want[real], atol=1e-6, rtol=1e-6)


def test_xla_blocks_equal_the_einsum_blocks(attention):
    x, params = attention
    config = CONFIG.replace(position_encoding="alibi", linear_bias=True)
    instance_ids, positions = _packing()
    ids, positions = jnp.asarray(instance_ids), jnp.asarray(positions)
    mask = layers.attention_mask(ids > 0, ids)
    _, blocked = layers.attention_inputs(config, mask, positions, layers.segment_ids(ids > 0, ids))
    want = SelfAttention(config, True).apply({"params": params}, x, blocked)
    xla = config.replace(attention_implementation="xla")
    got = SelfAttention(xla, True).apply({"params": params}, x, blocked)
    real = instance_ids > 0
    np.testing.assert_allclose(got[real], want[real], atol=1e-6, rtol=1e-6)


def _intermediate_shapes(jaxpr):
    """Every intermediate's shape in a jaxpr, sub-jaxprs (cond, scan, custom_vjp) included."""
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            yield tuple(getattr(var.aval, "shape", ()))
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _intermediate_shapes(inner)


def test_a_local_layer_holds_nothing_quadratic_in_length():
    """Forward and backward of one local layer at T = 96 (W = 8): no intermediate has two
    axes of length T (the full computation's (B, A, T, S) scores and (B, 1, T, S) mask)."""
    config = CONFIG.replace(local_attention_window=8, causal=True)
    length = 96
    x = jnp.zeros((1, length, config.hidden_size))
    ids = jnp.ones((1, length), jnp.int32)
    module = SelfAttention(config, deterministic=True)

    def loss(params, x):
        # The padding mask (B, 1, 1, S) is not quadratic; the window and causality are.
        mask = layers.attention_mask(ids)
        _, local = layers.attention_inputs(config, mask, jnp.arange(length)[None], ids)
        return jnp.sum(module.apply({"params": params}, x, local) ** 2)

    _, local = layers.attention_inputs(config, layers.attention_mask(ids), jnp.arange(length)[None])
    params = module.init(jax.random.key(0), x, local)["params"]
    jaxpr = jax.make_jaxpr(jax.grad(loss))(params, x).jaxpr
    quadratic = [s for s in _intermediate_shapes(jaxpr) if s.count(length) >= 2]
    assert not quadratic, quadratic


def _stacked(encoder, num_layers):
    rest = {k: v for k, v in encoder.items() if not k.startswith("layer_")}
    return {**stack_layers(encoder, num_layers), **rest}


@pytest.mark.parametrize("remat", ["none", "full"])
def test_scanned_encoder_equals_the_looped_one_on_packed_rows(remat):
    """Layers 0 and 3 global, 1 and 2 local (blocked): the scanned layer chooses by
    `nn.cond` on its index, the looped one in Python; packed rows, hidden states of all."""
    instance_ids, positions = _packing()
    ids = np.random.default_rng(1).integers(1, CONFIG.vocab_size, (3, T)) * (instance_ids > 0)
    args = (jnp.asarray(ids), jnp.asarray(instance_ids > 0))
    kwargs = dict(position_ids=jnp.asarray(positions), instance_ids=jnp.asarray(instance_ids))
    looped = BertModel(CONFIG, add_pooling_layer=False)
    params = nn.meta.unbox(looped.init(jax.random.key(0), *args, **kwargs))["params"]
    want = looped.apply({"params": params}, *args, output_hidden_states=True, **kwargs)
    scanned = BertModel(CONFIG.replace(scan_layers=True, remat_policy=remat), False)
    stacked = {**params, "encoder": _stacked(params["encoder"], CONFIG.num_hidden_layers)}
    got = scanned.apply({"params": stacked}, *args, output_hidden_states=True, **kwargs)
    real = instance_ids > 0
    for a, b in zip(got.hidden_states, want.hidden_states, strict=True):
        np.testing.assert_allclose(a[real], b[real], atol=1e-6, rtol=1e-6)


def test_scanned_training_with_attention_dropout_runs():
    """Dropout's random bits are drawn inside the cond's branches (a lifted `nn.cond`)."""
    config = CONFIG.replace(scan_layers=True, attention_probs_dropout_prob=0.1)
    ids = jnp.ones((2, T), jnp.int32)
    model = BertModel(config, add_pooling_layer=False)
    params = model.init(jax.random.key(0), ids)["params"]

    def loss(params):
        out = model.apply(
            {"params": params}, ids, deterministic=False, rngs={"dropout": jax.random.key(1)}
        )
        return jnp.sum(out.sequence_output**2)

    grads = jax.grad(loss)(params)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(nn.meta.unbox(grads)))


def test_scanned_layers_keep_no_quadratic_residuals():
    """The scan's saved residuals, stacked over layers, hold no (T, S) array: jax's cond
    would otherwise keep the global branch's probabilities (zeros in local layers) for all."""
    length = 48
    config = CONFIG.replace(scan_layers=True)
    ids = jnp.ones((1, length), jnp.int32)
    model = BertModel(config, add_pooling_layer=False)
    params = model.init(jax.random.key(0), ids)["params"]

    def loss(params):
        return jnp.sum(model.apply({"params": params}, ids).sequence_output ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(loss))(params).jaxpr
    stacked = [
        s
        for s in _intermediate_shapes(jaxpr)
        if len(s) > 2 and s[0] == config.num_hidden_layers and s.count(length) >= 2
    ]
    assert not stacked, stacked
