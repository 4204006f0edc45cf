"""Splash attention (`attention_implementation="splash"`, bert_jax.splash) on the CPU, where
Pallas interprets the TPU kernels: outputs and gradients equal the einsum reference's for
packed and padded rows, global and local layers; a packed row equals its instances run
alone; and the cost estimates the kernels carry count what the mask makes them compute.

Splash's tiles are multiples of 128 tokens, so rows are T = 256 (two tiles) here.
"""

import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu import splash_attention as splash_kernels

from bert_jax import attention, layers, splash
from bert_jax.config import BertConfig, ConfigError
from bert_jax.model import BertModel

T = 256
CONFIG = BertConfig.from_preset(
    "modernbert_tiny",
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,  # layer 0 global, layer 1 local
    num_attention_heads=2,
    intermediate_size=48,
    max_position_embeddings=T,
    local_attention_window=48,
    splash_block_q=128,
    splash_block_kv=128,
    splash_local_block=128,
)
# Row 0 one instance and 56 padding tokens; row 1 packed: 60, 100 and 90 tokens, 6 padding.
LENGTHS = [[200], [60, 100, 90]]


def _rows(lengths):
    """(B, T) instance ids (0 on padding), positions restarting per instance, token ids."""
    ids, positions = np.zeros((len(lengths), T), np.int32), np.zeros((len(lengths), T), np.int32)
    for row, row_lengths in enumerate(lengths):
        start = 0
        for n, length in enumerate(row_lengths):
            ids[row, start : start + length] = n + 1
            positions[row, start : start + length] = np.arange(length)
            start += length
    tokens = np.random.default_rng(0).integers(1, CONFIG.vocab_size, ids.shape) * (ids > 0)
    return ids, positions, tokens.astype(np.int32)


def _max_error(got, want):
    return float(np.abs(np.asarray(got) - np.asarray(want)).max())


def test_model_output_and_every_gradient_equal_the_einsum_path():
    ids, positions, tokens = _rows(LENGTHS)
    real = ids > 0
    inputs = dict(position_ids=positions, instance_ids=ids)
    variables = BertModel(CONFIG, add_pooling_layer=False).init(
        jax.random.key(0), tokens, real, **inputs
    )
    weights = np.random.default_rng(1).normal(size=(*ids.shape, CONFIG.hidden_size))
    weights = jnp.asarray(weights * real[..., None], jnp.float32)  # padding's output is junk

    def loss(variables, config):
        model = BertModel(config, add_pooling_layer=False)
        out = model.apply(variables, tokens, real, **inputs).sequence_output
        return (out * weights).sum(), out

    step = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (_, want), want_grads = step(variables, CONFIG)
    (_, got), got_grads = step(variables, CONFIG.replace(attention_implementation="splash"))
    assert _max_error(np.asarray(got)[real], np.asarray(want)[real]) < 1e-5
    got_grads, want_grads = nn.meta.unbox(got_grads), nn.meta.unbox(want_grads)
    for (path, g), w in zip(
        jax.tree_util.tree_leaves_with_path(got_grads),
        jax.tree_util.tree_leaves(want_grads),
        strict=True,
    ):  # q, k and v reach the loss through their projections' kernels
        assert _max_error(g, w) <= 1e-5 * float(np.abs(w).max()), jax.tree_util.keystr(path)


def _dense_reference(q, k, v, ids, window, causal=False):
    """The einsum path under the (T, S) mask: packing, padding and, for a local layer, the
    window ANDed in (the model's computation before blocked local attention)."""
    mask = layers.attention_mask(ids > 0, ids, causal)
    if window:
        mask = mask & layers.window_mask(T, window)
    return attention.einsum_attention(CONFIG, q, k, v, mask, None, lambda p: p)


@pytest.mark.parametrize(
    "window, causal, fused",
    [
        (0, False, False),  # a global layer
        pytest.param(16, False, False, marks=pytest.mark.extended),  # a window inside one tile
        (100, False, False),  # reaching 50 tokens into the neighbouring tiles
        pytest.param(0, True, False, marks=pytest.mark.extended),
        pytest.param(100, True, False, marks=pytest.mark.extended),
        # one backward kernel: dq from partial sums over the key tiles (two tiles here)
        (0, False, True),
        (100, False, True),
        pytest.param(100, True, True, marks=pytest.mark.extended),
    ],
)
def test_kernel_and_its_gradients_equal_the_masked_einsum(window, causal, fused):
    ids, _, _ = _rows(LENGTHS)
    q, k, v = jax.random.normal(jax.random.key(1), (3, 2, T, 2, 16))
    config = CONFIG.replace(
        local_attention_window=window or 48, causal=causal, splash_fused_backward=fused
    )
    real = jnp.asarray(ids > 0)[..., None, None]

    def loss(attend):
        return lambda q, k, v: (attend(q, k, v) * real).sum() * 0.1

    def got(q, k, v):
        return splash.attention(config, q, k, v, jnp.asarray(ids), local=bool(window))

    def want(q, k, v):
        return _dense_reference(q, k, v, jnp.asarray(ids), window, causal)

    assert _max_error(jax.jit(got)(q, k, v) * real, jax.jit(want)(q, k, v) * real) < 1e-5
    got_grads = jax.jit(jax.grad(loss(got), argnums=(0, 1, 2)))(q, k, v)
    want_grads = jax.jit(jax.grad(loss(want), argnums=(0, 1, 2)))(q, k, v)
    for name, g, w in zip("qkv", got_grads, want_grads, strict=True):
        assert _max_error(g, w) < 1e-4, name


def test_on_a_mesh_each_device_attends_its_rows_and_heads():
    """Inside shard_map over the batch (data) and head (tensor) axes: the same output as
    one device's."""
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices (make test runs 8 fake CPU devices)")
    from bert_jax import sharding

    ids, _, _ = _rows(LENGTHS)
    q, k, v = jax.random.normal(jax.random.key(2), (3, 2, T, 2, 16))
    segments = jnp.asarray(ids)

    def attend(q, k, v, segments):
        return splash.attention(CONFIG, q, k, v, segments, local=True)

    want = jax.jit(attend)(q, k, v, segments)
    mesh = sharding.create_mesh((2, 1, 2), devices=jax.devices()[:4])
    with sharding.activation_context(mesh):
        got = jax.jit(attend)(q, k, v, segments)
    assert _max_error(got, want) < 1e-6


def test_a_packed_row_equals_its_instances_run_alone():
    config = CONFIG.replace(attention_implementation="splash")
    model = BertModel(config, add_pooling_layer=False)
    ids, positions, tokens = _rows([LENGTHS[1]])
    variables = model.init(jax.random.key(0), tokens, ids > 0)
    apply = jax.jit(model.apply)
    packed = apply(
        variables, tokens, ids > 0, position_ids=positions, instance_ids=ids
    ).sequence_output[0]
    alone_tokens = np.zeros((3, T), np.int32)
    for n in range(3):
        instance = tokens[0][ids[0] == n + 1]
        alone_tokens[n, : len(instance)] = instance
    alone = apply(variables, alone_tokens, alone_tokens > 0).sequence_output
    for n, length in enumerate(LENGTHS[1]):
        assert _max_error(packed[ids[0] == n + 1], alone[n, :length]) < 1e-5


def test_splash_refuses_attention_probability_dropout_and_alibi():
    ids, positions, tokens = _rows(LENGTHS)
    dropping = CONFIG.replace(attention_implementation="splash", attention_probs_dropout_prob=0.1)
    model = BertModel(dropping, add_pooling_layer=False)
    with pytest.raises(ConfigError, match="attention_probs_dropout_prob=0, got 0.1"):
        model.init(
            {"params": jax.random.key(0), "dropout": jax.random.key(1)},
            tokens,
            ids > 0,
            deterministic=False,
        )
    alibi = CONFIG.replace(attention_implementation="splash", position_encoding="alibi")
    with pytest.raises(ConfigError, match="position_encoding"):
        BertModel(alibi, add_pooling_layer=False).init(jax.random.key(0), tokens, ids > 0)
    with pytest.raises(ConfigError, match="splash_local_block must be a positive multiple of 128"):
        CONFIG.replace(splash_local_block=64)


def _tiles_from_mask(length, block_q, block_kv, reach, causal=False):
    """Tiles holding an attended pair, counted from the dense (T, S) mask itself."""
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    mask = np.ones((length, length), bool) if reach is None else np.abs(i - j) <= reach
    if causal:
        mask &= j <= i
    tiles = mask.reshape(length // block_q, block_q, length // block_kv, block_kv)
    return int(tiles.any(axis=(1, 3)).sum())


@pytest.mark.parametrize(
    "reach, causal, block_q, block_kv",
    [(None, False, 256, 128), (64, False, 128, 128), (200, False, 128, 256), (64, True, 128, 128)],
)
def test_cost_estimates_count_the_tiles_the_mask_computes(reach, causal, block_q, block_kv):
    length, heads, head_dim = 1024, 3, 64
    window = splash.Window(reach, 0 if causal else reach)
    tiles = _tiles_from_mask(length, block_q, block_kv, reach, causal)
    costs = splash.kernel_costs(length, heads, head_dim, block_q, block_kv, window, 2)
    pairs = heads * tiles * block_q * block_kv  # scores computed, over the heads
    # Forward q k^T and p v; dq: q k^T, do v^T, ds k; dk/dv: q k^T, p^T do, do v^T, ds^T q.
    for kind, products in (("fwd", 2), ("dq", 3), ("dkv", 4)):
        assert costs[kind].flops == 2 * head_dim * pairs * products, kind
        assert costs[kind].transcendentals == pairs, kind  # one exp per computed score
    # Bytes: at least q, k, v read and the output written once; each further tile fetches
    # its key and value blocks (bf16) and its key segment ids (8 x bkv int32) once more.
    full = splash.kernel_costs(
        length, heads, head_dim, block_q, block_kv, splash.Window(None, None), 2
    )
    all_tiles = (length // block_q) * (length // block_kv)
    assert costs["fwd"].bytes_accessed >= heads * 4 * length * head_dim * 2
    per_tile = heads * block_kv * (2 * head_dim * 2 + 8 * 4)
    fewer = full["fwd"].bytes_accessed - costs["fwd"].bytes_accessed
    assert fewer == (all_tiles - tiles) * per_tile
    # One backward kernel: dq's product added to dk/dv's, the scores' exps once, and a (bq, D)
    # partial dq written at every (key tile, query tile), T / bkv arrays of (T, D) bf16.
    fused = splash.kernel_costs(length, heads, head_dim, block_q, block_kv, window, 2, True)
    assert set(fused) == {"fwd", "dkv"}
    assert fused["dkv"].flops == 2 * head_dim * pairs * 5
    assert fused["dkv"].transcendentals == pairs
    partials = heads * (length // block_kv) * length * head_dim * 2
    assert fused["dkv"].bytes_accessed == costs["dkv"].bytes_accessed + partials


@pytest.mark.parametrize("fused", [False, True])
def test_the_traced_step_carries_the_estimates_through_vmap_and_the_backward(fused):
    """In a gradient's program each splash kernel carries `kernel_costs` for its kind, times
    the examples (vmap): what the TPU compiler prices. A fused backward is one kernel."""
    ids, _, _ = _rows(LENGTHS)
    q = jnp.zeros((2, T, 2, 16))
    config = CONFIG.replace(local_attention_window=100, splash_fused_backward=fused)

    def loss(q):
        return splash.attention(config, q, q, q, jnp.asarray(ids), local=True).sum()

    found = {}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                found[splash.kernel_kind(str(eqn.params["name"]))] = eqn.params["cost_estimate"]
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if hasattr(inner, "eqns"):
                    walk(inner)

    walk(jax.make_jaxpr(jax.grad(loss))(q).jaxpr)
    want = splash.kernel_costs(T, 2, 16, 128, 128, splash.Window(50, 50), 4, fused)
    assert set(found) == ({"fwd", "dkv"} if fused else {"fwd", "dq", "dkv"})
    for kind, estimate in found.items():
        assert estimate.flops == 2 * want[kind].flops, kind  # two examples
        assert estimate.bytes_accessed == 2 * want[kind].bytes_accessed, kind


def test_the_kernels_read_q_k_v_with_the_sequence_minor():
    """splash's kernels take q, k and v as (A, D, T) (`QKVLayout.SEQ_MINOR`): a TPU lays a
    head dim of 64 over whole 128-lane tiles, so the (A, T, D) arrays XLA writes for the
    kernels would be half padding; with T minor they are dense."""
    ids, _, _ = _rows(LENGTHS)
    q = jnp.zeros((2, T, 2, 16))

    def loss(q):
        return splash.attention(CONFIG, q, q, q, jnp.asarray(ids), local=False).sum()

    seq_minor = {}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                shapes = [v.aval.shape for v in eqn.invars if hasattr(v.aval, "shape")]
                kind = splash.kernel_kind(str(eqn.params["name"]))
                seq_minor[kind] = sum(shape[-2:] == (16, T) for shape in shapes)
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if hasattr(inner, "eqns"):
                    walk(inner)

    walk(jax.make_jaxpr(jax.grad(loss))(q).jaxpr)
    assert seq_minor == {"fwd": 3, "dq": 3, "dkv": 3}


def test_the_forward_reads_its_logsumexp_lanes_by_a_max():
    """splash's forward writes its logsumexp (A, T, 128), one value in all 128 lanes, and keeps
    lane 0 by a slice, for which a TPU copies the whole array; `priced` takes the lanes' max
    instead. The gradients equal those through splash's own slice bit for bit, and the traced
    gradient slices no lane-wide array."""
    ids, _, _ = _rows(LENGTHS)
    window = splash.Window(50, 50)
    kernel = splash._kernel(T, 2, window, 128, 128, interpret=True)
    costs = splash.kernel_costs(T, 2, 16, 128, 128, window, 4)
    rng = np.random.default_rng(2)
    q, k, v, g = (jnp.asarray(rng.normal(size=(2, T, 16)), jnp.float32) for _ in range(4))
    row = jnp.asarray(ids[1])  # the packed row

    def own(q, k, v):
        return kernel(q, k, v, segment_ids=splash_kernels.SegmentIds(row, row))

    def ours(q, k, v):
        return splash.priced(costs)(kernel, q, k, v, row, row)

    want, got = (jax.vjp(f, q, k, v)[1](g) for f in (own, ours))
    for x, y in zip(got, want, strict=True):
        np.testing.assert_array_equal(x, y)

    seen = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("slice", "reduce_max"):
                seen.append((eqn.primitive.name, eqn.invars[0].aval.shape[-1]))
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if hasattr(inner, "eqns"):
                    walk(inner)

    walk(jax.make_jaxpr(jax.grad(lambda q: ours(q, k, v).sum()))(q).jaxpr)
    assert ("reduce_max", splash.LANES) in seen
    assert ("slice", splash.LANES) not in seen


@pytest.mark.extended
def test_interpret_mode_needs_no_libtpu():
    """CI's `make test` has no libtpu: the splash path imports and runs without it (the
    import made impossible here)."""
    code = (
        "import sys; sys.modules['libtpu'] = None\n"
        "import jax, jax.numpy as jnp\n"
        "from bert_jax import splash\n"
        "from bert_jax.config import BertConfig\n"
        "c = BertConfig.from_preset('modernbert_tiny', splash_local_block=128)\n"
        "q = jnp.ones((1, 128, 2, 64))\n"
        "out = splash.attention(c, q, q, q, jnp.ones((1, 128), jnp.int32), local=True)\n"
        "assert bool(jnp.isfinite(out).all())\n"
        "print('ok', jax.default_backend())\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok cpu" in result.stdout
