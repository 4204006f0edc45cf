"""The architecture switches of issue 42 (rotary, ALiBi, windows, GeGLU, pre-LN, no biases)
against numpy references written from the papers' formulas, packed rows against their
instances run alone, scan against loop, and a sharded forward against one device.

transformers' ModernBERT checks the whole model (tests/test_convert_modernbert*.py); here
the primitives are checked on their own, where a wrong formula shows directly.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax import layers, sharding
from bert_jax.config import BertConfig, ConfigError, model_changes
from bert_jax.convert import stack_layers
from bert_jax.heads import BertForPreTraining
from bert_jax.model import BertModel, SelfAttention, gelu
from bert_jax.train_state import sharded_state

# Every switch away from BERT; layers 0 and 2 global, 1 local with a window (4) shorter than
# the rows; every dimension the sharded test splits divides by 2.
MODERN = BertConfig.from_preset(
    "modernbert_tiny",
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=64,
    local_attention_window=4,
    global_attention_every=2,
    rope_theta=1000.0,
    local_rope_theta=50.0,
)
B, T = 3, 12


def _inputs():
    rng = np.random.default_rng(0)
    mask = (np.arange(T)[None] < np.array([[T], [9], [5]])).astype(np.int32)
    ids = rng.integers(1, MODERN.vocab_size, (B, T)).astype(np.int32) * mask
    return jnp.asarray(ids), jnp.asarray(mask)


def _init(module, *args):
    return nn.meta.unbox(module.init(jax.random.key(0), *args))["params"]


def _randomised(params, seed=1):
    """Every leaf drawn afresh (norm scales and biases too), so that none is a trivial 1 or 0."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [
        x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys, strict=True)
    ]
    return jax.tree.unflatten(tree, new)


@pytest.fixture(scope="module")
def looped():
    """The modern model's params (looped layout, randomised) and its outputs."""
    ids, mask = _inputs()
    positions = jnp.asarray([[1, 4], [0, 8], [2, 3]])
    model = BertForPreTraining(MODERN, next_sentence=False)
    params = _randomised(_init(model, ids, mask, 0 * ids, positions))
    out = model.apply({"params": params}, ids, mask, 0 * ids, positions)
    seq = BertModel(MODERN, add_pooling_layer=False).apply(
        {"params": params["bert"]}, ids, mask, output_hidden_states=True
    )
    return params, positions, out.mlm_logits, seq


# --- the parameter tree -----------------------------------------------------------------------


def test_param_tree_has_the_contracts_leaves(looped):
    params = looped[0]
    bert, layer = params["bert"], params["bert"]["encoder"]["layer_1"]
    assert set(bert["embeddings"]) == {"word_embeddings", "layer_norm"}  # no position, no types
    assert set(bert["embeddings"]["layer_norm"]) == {"scale"}
    assert layer["intermediate"]["kernel"].shape == (32, 2, 48)
    assert layer["output"]["kernel"].shape == (48, 32)
    for name in ("query", "key", "value", "output"):
        assert set(layer["attention"][name]) == {"kernel"}
    assert set(layer) == {
        "attention",
        "attention_layer_norm",
        "intermediate",
        "output",
        "output_layer_norm",
    }
    assert set(bert["encoder"]) == {"layer_0", "layer_1", "layer_2", "final_layer_norm"}
    assert "attention_layer_norm" in bert["encoder"]["layer_0"]  # held, not applied
    assert set(params["mlm"]) == {"transform", "layer_norm", "output_bias"}
    assert set(params["mlm"]["transform"]) == {"kernel"}
    boxed = jax.eval_shape(
        lambda: BertModel(MODERN).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    )["params"]
    glu = boxed["encoder"]["layer_0"]["intermediate"]["kernel"]
    assert glu.names == ("embed", None, "mlp")


def test_modernbert_base_counts_the_published_149m():
    """ModernBERT-base has 149M parameters, -large 395M (Warner et al. 2024, Table 3)."""
    ids = jnp.zeros((1, 8), jnp.int32)
    model_ids = (ids, ids, ids, ids[:, :2])

    def count(config):
        model = BertForPreTraining(config, next_sentence=False)
        shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), *model_ids))
        return sum(x.size for x in jax.tree.leaves(nn.meta.unbox(shapes["params"])))

    assert int(count(BertConfig.from_preset("modernbert_base")) / 1e6) == 149
    assert int(count(BertConfig.from_preset("modernbert_large")) / 1e6) == 395


# --- primitives against the papers' formulas -------------------------------------------------


def _press_slopes(n):
    """The ALiBi paper's head slopes: a geometric sequence starting at 2^(-8/n) with that
    ratio; for n not a power of two, the closest power's, then every other of twice it."""
    if math.log2(n).is_integer():
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    closest = 2 ** math.floor(math.log2(n))
    return _press_slopes(closest) + _press_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", [1, 2, 4, 6, 8, 12, 16, 20])
def test_alibi_slopes_follow_press_et_al(heads):
    np.testing.assert_allclose(layers.alibi_slopes(heads), _press_slopes(heads), rtol=1e-6)
    if heads == 8:  # the paper's own example: 1/2, 1/4, ..., 1/256
        np.testing.assert_allclose(layers.alibi_slopes(8), 0.5 ** np.arange(1, 9))


def test_window_mask_spans_half_the_window_each_side():
    got = np.asarray(layers.window_mask(7, 4))[0, 0]
    want = np.array([[abs(i - j) <= 2 for j in range(7)] for i in range(7)])
    np.testing.assert_array_equal(got, want)


def _roformer(x, positions, theta):
    """RoFormer's rotation, pair by pair: dimension i and i + D/2 turned by angle
    position * theta^(-2i/D), as an explicit 2x2 rotation (x: (B, T, A, D))."""
    out = np.empty_like(x, dtype=np.float64)
    half = x.shape[-1] // 2
    for i in range(half):
        angle = positions[:, :, None].astype(np.float64) * theta ** (-2.0 * i / x.shape[-1])
        c, s = np.cos(angle), np.sin(angle)
        a, b = x[..., i], x[..., i + half]
        out[..., i], out[..., i + half] = c * a - s * b, s * a + c * b
    return out


@pytest.mark.parametrize("product_dtype", [None, jnp.float32])  # slices; the TPU path's product
def test_rotary_is_roformers_rotation(product_dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 9, 3, 8)).astype(np.float32)
    positions = np.array([list(range(9)), [0, 1, 2, 3, 0, 1, 2, 0, 1]])  # row 1 packed
    tables = layers.rotary_tables(jnp.asarray(positions), 8, 500.0)
    got = np.asarray(layers.apply_rotary(jnp.asarray(x), tables, product_dtype))
    np.testing.assert_allclose(got, _roformer(x, positions, 500.0), atol=2e-6)


def test_rotary_as_a_product_materialises_no_half_head():
    """The product form's forward and backward hold no (.., D/2) array (a TPU pads each half
    of a 64-wide head to 128 lanes): the half-swap is one (D, D) product, not two slices."""
    tables = layers.rotary_tables(jnp.arange(9)[None], 8, 500.0)

    def loss(x):
        return (layers.apply_rotary(x, tables, jnp.bfloat16) ** 2).sum()

    jaxpr = jax.make_jaxpr(jax.grad(loss))(jnp.ones((1, 9, 3, 8)))
    shapes = [v.aval.shape for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars]
    assert not [shape for shape in shapes if shape[-1:] == (4,)]


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("encoding", ["rotary", "alibi"])
def test_attention_equals_a_numpy_attention(encoding):
    """One local layer's attention (window, padding, positions) written out in numpy."""
    config = MODERN.replace(position_encoding=encoding, linear_bias=True)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 10, 32)).astype(np.float32)
    input_mask = np.ones((2, 10), np.int32)
    input_mask[1, 7:] = 0
    positions = np.broadcast_to(np.arange(10), (2, 10))
    mask = layers.attention_mask(jnp.asarray(input_mask))
    _, local = layers.attention_inputs(config, mask, jnp.asarray(positions))
    attention = SelfAttention(config, deterministic=True)
    params = _randomised(_init(attention, jnp.asarray(x), local))
    got = np.asarray(attention.apply({"params": params}, jnp.asarray(x), local))

    w = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    q, k, v = (
        np.einsum("bth,had->btad", x, w[n]["kernel"]) + w[n]["bias"]
        for n in ("query", "key", "value")
    )
    if encoding == "rotary":  # the local layers' base
        q, k = _roformer(q, positions, 50.0), _roformer(k, positions, 50.0)
    logits = np.einsum("btad,bsad->bats", q, k) / math.sqrt(8)
    if encoding == "alibi":
        slopes = np.asarray(_press_slopes(4))[None, :, None, None]
        logits = logits - slopes * np.abs(positions[:, :, None] - positions[:, None, :])[:, None]
    i = np.arange(10)
    allowed = (np.abs(i[:, None] - i[None]) <= 2)[None, None] & (input_mask[:, None, None] > 0)
    with np.errstate(invalid="ignore"):  # a padding query with no real key in its window
        probs = _softmax(np.where(allowed, logits, -np.inf))
    context = np.einsum("bats,bsad->btad", probs, v)
    want = np.einsum("btad,adh->bth", context, w["output"]["kernel"]) + w["output"]["bias"]
    real = input_mask > 0  # padding queries (row 1's last may see no real key) are junk
    np.testing.assert_allclose(got[real], want[real], atol=2e-5, rtol=1e-5)


def test_gated_feed_forward_is_geglu():
    h = np.random.default_rng(0).normal(size=(2, 3, 2, 5)).astype(np.float32)
    want = np.asarray(gelu(jnp.asarray(h[..., 0, :]))) * h[..., 1, :]
    np.testing.assert_allclose(np.asarray(layers.gated(jnp.asarray(h), gelu)), want, rtol=1e-6)


# --- layouts, packing, sharding ---------------------------------------------------------------


def _stacked(encoder, num_layers):
    """The looped encoder's params in the scanned layout (the final norm stays outside)."""
    rest = {k: v for k, v in encoder.items() if not k.startswith("layer_")}
    return {**stack_layers(encoder, num_layers), **rest}


@pytest.mark.parametrize("scan, remat", [(True, "none"), (False, "full"), (True, "full")])
def test_scan_and_remat_equal_the_loop(looped, scan, remat):
    """Layers differ (global/local, layer 0 without its attention norm): a scanned layer
    selects by its index, a looped one statically; all compute the same function."""
    params, positions, _, want = looped
    ids, mask = _inputs()
    config = MODERN.replace(scan_layers=scan, remat_policy=remat)
    encoder = params["bert"]["encoder"]
    bert = {**params["bert"], "encoder": _stacked(encoder, 3) if scan else encoder}
    model = BertModel(config, add_pooling_layer=False)
    got = model.apply({"params": bert}, ids, mask, output_hidden_states=True)
    for x, y in zip(got.hidden_states, want.hidden_states, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got.sequence_output, want.sequence_output, atol=1e-5, rtol=1e-5)


def test_pre_ln_model_ends_in_its_final_norm(looped):
    """Pre-LN: the last hidden state is the final norm of the last layer's output."""
    params, _, _, seq = looped
    norm = params["bert"]["encoder"]["final_layer_norm"]["scale"]
    last = np.asarray(seq.hidden_states[-1], np.float64)
    centred = last - last.mean(-1, keepdims=True)
    want = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5) * np.asarray(norm)
    np.testing.assert_allclose(seq.sequence_output, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("encoding", ["rotary", "alibi"])
def test_a_packed_row_equals_its_instances_alone(looped, encoding):
    """Positions restart per instance and windows (4, shorter than every instance) never
    reach into a neighbour: each instance's states are those it has alone."""
    config = MODERN.replace(position_encoding=encoding)
    bert = looped[0]["bert"]
    rng = np.random.default_rng(3)
    lengths = [5, 4, 2]  # three instances and one padding token in a row of T=12
    alone = [rng.integers(1, config.vocab_size, n).astype(np.int32) for n in lengths]
    packed = np.concatenate([*alone, [0]])[None]
    instance_ids = np.concatenate([np.repeat(np.arange(1, 4), lengths), [0]])[None]
    position_ids = np.concatenate([*(np.arange(n) for n in lengths), [0]])[None]
    model = BertModel(config, add_pooling_layer=False)
    out = model.apply(
        {"params": bert},
        jnp.asarray(packed),
        jnp.asarray(instance_ids > 0),
        position_ids=jnp.asarray(position_ids),
        instance_ids=jnp.asarray(instance_ids),
    ).sequence_output
    start = 0
    for ids in alone:
        single = model.apply({"params": bert}, jnp.asarray(ids[None])).sequence_output
        np.testing.assert_allclose(
            out[0, start : start + len(ids)], single[0], atol=1e-5, rtol=1e-5
        )
        start += len(ids)


def test_bfloat16_compute_stays_near_float32(looped):
    params, positions, mlm_logits, _ = looped
    ids, mask = _inputs()
    model = BertForPreTraining(MODERN.replace(dtype="bfloat16"), next_sentence=False)
    got = model.apply({"params": params}, ids, mask, 0 * ids, positions).mlm_logits
    assert got.dtype == jnp.float32
    error = np.abs(np.asarray(got) - np.asarray(mlm_logits)).max()
    assert 0 < error < 0.05 * np.abs(np.asarray(mlm_logits)).max()


def test_sharded_forward_equals_single_device(looped):
    """data x fsdp x tensor = 2 x 2 x 2 on the scanned layout; the GLU kernel (L, H, 2, F)
    splits H over fsdp and F over tensor by its logical names."""
    params, positions, want, _ = looped
    ids, mask = _inputs()
    ids, mask = jnp.tile(ids, (2, 1))[:4], jnp.tile(mask, (2, 1))[:4]  # 4 rows: data x fsdp
    positions = jnp.tile(positions, (2, 1))[:4]
    config = MODERN.replace(scan_layers=True)
    model = BertForPreTraining(config, next_sentence=False)
    stacked = {**params, "bert": {**params["bert"]}}
    stacked["bert"]["encoder"] = _stacked(params["bert"]["encoder"], 3)
    mesh = sharding.create_mesh((2, 2, 2))
    args = [ids, mask, 0 * ids, positions]
    state, _ = sharded_state(model, optax.identity(), mesh, args, params=stacked)
    kernel = state.params["bert"]["encoder"]["layers"]["intermediate"]["kernel"]
    assert kernel.sharding.is_equivalent_to(
        NamedSharding(mesh, P(None, "fsdp", None, "tensor")), kernel.ndim
    )

    names = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")

    def forward(params, batch):  # (a jitted dict comes back with its keys sorted)
        return model.apply({"params": params}, *(batch[k] for k in names)).mlm_logits

    batch = sharding.global_batch(dict(zip(names, args, strict=True)), mesh)
    with sharding.activation_context(mesh):
        got = jax.jit(forward)(state.params, batch)
    np.testing.assert_allclose(np.asarray(got)[:B], want, atol=2e-5, rtol=1e-5)


# --- config -----------------------------------------------------------------------------------


def test_presets_are_modernberts():
    base = BertConfig.from_preset("modernbert_base")
    assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size) == (22, 768, 1152)
    assert (base.max_position_embeddings, base.vocab_size, base.type_vocab_size) == (8192, 50368, 0)
    assert (base.rope_theta, base.local_rope_theta) == (160000.0, 10000.0)
    assert (base.local_attention_window, base.global_attention_every) == (128, 3)
    large = BertConfig.from_preset("modernbert_large")
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads) == (28, 1024, 16)
    assert large.intermediate_size == 2624 and large.norm_placement == "pre"


def test_an_experiment_builds_a_modernbert_preset():
    block = {"preset": "modernbert_tiny", "local_attention_window": 16, "vocab_size": None}
    config = BertConfig.from_experiment(block, vocab_size=300, objective="mlm")
    assert config.vocab_size == 300 and config.local_attention_window == 16
    assert config.position_encoding == "rotary" and config.feed_forward == "glu"
    # Resuming a ModernBERT checkpoint as BERT is a change of model, named field by field.
    changed = {k for k, *_ in model_changes({"model": block}, {"model": {"preset": "tiny"}})}
    assert {"model.position_encoding", "model.norm_placement", "model.linear_bias"} <= changed


@pytest.mark.parametrize(
    "change, message",
    [
        ({"position_encoding": "sinusoid"}, "position_encoding must be one of"),
        ({"feed_forward": "swiglu"}, "feed_forward must be one of"),
        ({"norm_placement": "sandwich"}, "norm_placement must be one of"),
        ({"rope_theta": 0.0}, "rope_theta must be a positive number"),
        ({"local_rope_theta": -1.0}, "local_rope_theta must be a positive number"),
        ({"local_attention_window": -2}, "local_attention_window must be a non-negative"),
        ({"global_attention_every": 0}, "global_attention_every must be a positive integer"),
        ({"linear_bias": "no"}, "linear_bias must be True or False"),
        ({"type_vocab_size": -1}, "type_vocab_size must be a non-negative"),
        ({"hidden_size": 36, "num_attention_heads": 4}, "rotary' needs an even head dim"),
    ],
)
def test_bad_switches_are_refused_by_name(change, message):
    with pytest.raises(ConfigError, match=message):
        MODERN.replace(**change)


def test_bert_formats_refuse_a_modern_architecture():
    with pytest.raises(ConfigError, match="position_encoding='rotary'.*transformers BertConfig"):
        MODERN.to_hf_dict()
    with pytest.raises(ConfigError, match="norm_placement='pre'.*Google bert_config.json"):
        MODERN.to_google_dict()
    with pytest.raises(ConfigError, match="type_vocab_size=0"):
        BertConfig(type_vocab_size=0).to_hf_dict()
    assert BertConfig().non_bert_fields() == []
