"""Model tier 1: output shapes of every head, parameter counts, scan == loop, config checks."""

import ast
import json
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from original_bert import original_script

from bert_jax.config import BertConfig, ConfigError
from bert_jax.convert import stack_layers
from bert_jax.heads import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bert_jax.model import BertModel, gelu, gelu_tanh

TINY = BertConfig(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=40,
)
B, T, P = 3, 11, 4


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.array([T, 7, 3])
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(1, TINY.vocab_size, (B, T)).astype(np.int32) * mask
    types = ((np.arange(T)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
    positions = rng.integers(0, 3, (B, P)).astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types), jnp.asarray(positions)


# Eager on purpose: op-by-op dispatch reuses compiled kernels across tests, while jitting
# each tiny model costs seconds of XLA compile time apiece on a 2-core machine.
def _init(module, *args):
    return nn.meta.unbox(module.init(jax.random.key(0), *args))["params"]


def _apply(module, params, *args, **kwargs):
    return module.apply({"params": params}, *args, **kwargs)


def _count(module, *args) -> int:
    shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), *args))
    return sum(x.size for x in jax.tree_util.tree_leaves(nn.meta.unbox(shapes["params"])))


def _bert_count(c: BertConfig) -> int:
    """BERT's parameter count from its definition (embeddings, L layers, pooler)."""
    h, i = c.hidden_size, c.intermediate_size
    embeddings = (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    return embeddings + c.num_hidden_layers * layer + h * h + h


# --- GELU -------------------------------------------------------------------------------------


def test_gelu_is_the_exact_erf_gelu():
    """Our erf-form GELU (faster on CPU than jax's erfc form) against float64 math.erf."""
    import math

    x = np.concatenate([np.linspace(-10, 10, 4001), [-30.0, -6.5, 0.0, 1e-8, 6.5, 30.0]])
    ref = np.array([v * 0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    ours = np.asarray(gelu(jnp.asarray(x, jnp.float32)), np.float64)
    # f32 rounding of values up to |30|: a few ulps absolute, relative 1e-6 elsewhere.
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=2e-6)
    grad = jax.vmap(jax.grad(gelu))(jnp.asarray(x, jnp.float32))
    cdf = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    ref_grad = cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    np.testing.assert_allclose(np.asarray(grad, np.float64), ref_grad, rtol=1e-5, atol=1e-6)


def test_gelu_tanh_is_the_original_code_gelu():
    """`gelu_tanh` against google-research/bert's own `gelu`, evaluated in float64."""
    path = original_script("modeling.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "gelu"]
    # Its tf.tanh and tf.pow, in numpy: the original's expression, in float64.
    namespace = {"np": np, "tf": types.SimpleNamespace(tanh=np.tanh, pow=np.power)}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)
    x = np.concatenate([np.linspace(-10, 10, 4001), [-30.0, -6.5, 0.0, 1e-8, 6.5, 30.0]])
    ref = namespace["gelu"](x)
    ours = np.asarray(gelu_tanh(jnp.asarray(x, jnp.float32)), np.float64)
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=2e-6)
    # The forms are not interchangeable: 4.7e-4 apart at |x| = 2.7.
    gap = np.abs(ours - np.asarray(gelu(jnp.asarray(x, jnp.float32)), np.float64))
    assert 4.6e-4 < gap.max() < 4.8e-4 and abs(abs(x[gap.argmax()]) - 2.7) < 0.01


# --- Shapes -----------------------------------------------------------------------------------


def test_encoder_output_shapes():
    ids, mask, types, _ = _inputs()
    model = BertModel(TINY)
    out = _apply(model, _init(model, ids, mask, types), ids, mask, types, output_hidden_states=True)
    assert out.sequence_output.shape == (B, T, TINY.hidden_size)
    assert out.pooled_output.shape == (B, TINY.hidden_size)
    assert len(out.hidden_states) == TINY.num_hidden_layers + 1
    assert all(h.shape == (B, T, TINY.hidden_size) for h in out.hidden_states)
    np.testing.assert_array_equal(out.hidden_states[-1], out.sequence_output)


def test_head_output_shapes():
    ids, mask, types, positions = _inputs()
    pre = BertForPreTraining(TINY)
    out = _apply(pre, _init(pre, ids, mask, types, positions), ids, mask, types, positions)
    assert out.mlm_logits.shape == (B, P, TINY.vocab_size)
    assert out.nsp_logits.shape == (B, 2)

    cls = BertForSequenceClassification(TINY, num_labels=5)
    assert _apply(cls, _init(cls, ids, mask, types), ids, mask, types).shape == (B, 5)

    tag = BertForTokenClassification(TINY, num_labels=7)
    tag_params = _init(tag, ids, mask, types)
    assert "pooler" not in tag_params["bert"]
    assert _apply(tag, tag_params, ids, mask, types).shape == (B, T, 7)

    qa = BertForQuestionAnswering(TINY)
    start, end = _apply(qa, _init(qa, ids, mask, types), ids, mask, types)
    assert start.shape == end.shape == (B, T)


def test_mlm_logits_only_at_gathered_positions():
    """Logits for P positions equal the head applied to every position, then gathered."""
    ids, mask, types, positions = _inputs()
    pre = BertForPreTraining(TINY)
    params = _init(pre, ids, mask, types, positions)
    logits = _apply(pre, params, ids, mask, types, positions).mlm_logits
    assert logits.shape == (B, P, TINY.vocab_size)

    # The same head written out by hand in numpy over all T positions.
    seq = np.asarray(_apply(BertModel(TINY), params["bert"], ids, mask, types)[0])
    head = params["mlm"]
    h = seq @ np.asarray(head["transform"]["kernel"]) + np.asarray(head["transform"]["bias"])
    h = np.asarray(jax.nn.gelu(h, approximate=False))
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    h = (h - mean) / np.sqrt(var + TINY.layer_norm_eps)
    h = h * np.asarray(head["layer_norm"]["scale"]) + np.asarray(head["layer_norm"]["bias"])
    table = np.asarray(params["bert"]["embeddings"]["word_embeddings"]["embedding"])
    full = h @ table.T + np.asarray(head["output_bias"])  # (B, T, V)
    expected = np.take_along_axis(full, np.asarray(positions)[..., None], axis=1)
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)


# --- Parameter counts (no materialisation) -------------------------------------------------


@pytest.mark.parametrize(
    "preset,expected_m", [("base", 110), ("large", 335)], ids=["base", "large"]
)
def test_parameter_counts(preset, expected_m):
    config = BertConfig.from_preset(preset)
    ids = jnp.zeros((1, 8), jnp.int32)
    count = _count(BertModel(config), ids)
    print(f"BERT-{preset}: {count:,} parameters")
    assert count == _bert_count(config)
    assert abs(count - expected_m * 1e6) <= 0.01 * expected_m * 1e6
    # The pretraining heads add the MLM transform, its LayerNorm, the vocab bias and NSP;
    # the decoder is the (shared) word-embedding table.
    h = config.hidden_size
    heads = (h * h + h) + 2 * h + config.vocab_size + (2 * h + 2)
    assert _count(BertForPreTraining(config), ids, ids, ids, ids[:, :2]) == count + heads


def test_scanned_count_equals_looped():
    ids = jnp.zeros((1, 8), jnp.int32)
    config = BertConfig.from_preset("base")
    assert _count(BertModel(config.replace(scan_layers=True)), ids) == _count(
        BertModel(config), ids
    )


# --- Scan and loop ----------------------------------------------------------------------------


@pytest.mark.parametrize("remat_policy", ["none", "full"])
def test_scan_equals_loop_for_the_same_weights(remat_policy):
    ids, mask, types, positions = _inputs()
    loop_cfg = TINY.replace(remat_policy=remat_policy)
    scan_cfg = loop_cfg.replace(scan_layers=True)
    params = _init(BertForPreTraining(loop_cfg), ids, mask, types, positions)
    scanned = dict(params)
    scanned["bert"] = dict(params["bert"])
    scanned["bert"]["encoder"] = stack_layers(params["bert"]["encoder"], TINY.num_hidden_layers)
    assert scanned["bert"]["encoder"]["layers"]["intermediate"]["kernel"].shape == (
        TINY.num_hidden_layers,
        TINY.hidden_size,
        TINY.intermediate_size,
    )

    a = _apply(BertModel(loop_cfg), params["bert"], ids, mask, types, output_hidden_states=True)
    b = _apply(BertModel(scan_cfg), scanned["bert"], ids, mask, types, output_hidden_states=True)
    assert len(a.hidden_states) == len(b.hidden_states) == TINY.num_hidden_layers + 1
    for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(a.pooled_output, b.pooled_output, atol=1e-5, rtol=1e-5)

    if remat_policy != "none":
        return  # the heads are not rematerialised; once is enough for them
    la = _apply(BertForPreTraining(loop_cfg), params, ids, mask, types, positions)
    lb = _apply(BertForPreTraining(scan_cfg), scanned, ids, mask, types, positions)
    np.testing.assert_allclose(la.mlm_logits, lb.mlm_logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(la.nsp_logits, lb.nsp_logits, atol=1e-5, rtol=1e-5)


def test_scan_and_loop_differ_only_in_layout():
    ids = jnp.zeros((1, 4), jnp.int32)

    def shapes(module):
        return jax.eval_shape(lambda: nn.meta.unbox(module.init(jax.random.key(0), ids)))

    loop = shapes(BertModel(TINY))["params"]
    scan = shapes(BertModel(TINY.replace(scan_layers=True)))["params"]
    assert set(loop["encoder"]) == {f"layer_{i}" for i in range(TINY.num_hidden_layers)}
    assert set(scan["encoder"]) == {"layers"}
    stacked = stack_layers(
        jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), loop["encoder"]), 3
    )
    assert jax.tree_util.tree_map(np.shape, stacked) == jax.tree_util.tree_map(
        lambda x: x.shape, scan["encoder"]
    )


# --- Attention implementation -----------------------------------------------------------------

NO_ATTENTION_DROPOUT = TINY.replace(attention_probs_dropout_prob=0.0)


def _relative_error(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_fused_attention_equals_einsum_with_padding():
    """jax.nn.dot_product_attention (XLA) computes what the einsum path does: the encoder's
    outputs and the pretraining loss's gradients, under padding and hidden dropout."""
    ids, mask, types, positions = _inputs()
    einsum = BertForPreTraining(NO_ATTENTION_DROPOUT)
    fused = BertForPreTraining(NO_ATTENTION_DROPOUT.replace(attention_implementation="xla"))
    params = _init(einsum, ids, mask, types, positions)
    # The same parameter tree: checkpoints, conversion and export do not see the switch.
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
        _init(fused, ids, mask, types, positions)
    )
    real = np.asarray(mask, bool)
    outs = [
        _apply(m, params, ids, mask, types, method=BertForPreTraining.encode)
        for m in (einsum, fused)
    ]
    # Padding queries' outputs are never used; compare the real tokens' and the pooler's.
    assert _relative_error(outs[1].sequence_output[real], outs[0].sequence_output[real]) < 1e-5
    assert _relative_error(outs[1].pooled_output, outs[0].pooled_output) < 1e-5

    labels = jnp.asarray(np.random.default_rng(1).integers(0, TINY.vocab_size, (B, P)))

    def loss(params, module):  # MLM + NSP cross-entropies, in training mode (hidden dropout)
        rngs = {"dropout": jax.random.key(3)}
        out = _apply(module, params, ids, mask, types, positions, deterministic=False, rngs=rngs)
        mlm = -jnp.take_along_axis(jax.nn.log_softmax(out.mlm_logits), labels[..., None], -1)
        return mlm.mean() - jax.nn.log_softmax(out.nsp_logits)[:, 0].mean()

    (l0, g0), (l1, g1) = (jax.value_and_grad(loss)(params, m) for m in (einsum, fused))
    assert abs(float(l1 - l0)) <= 1e-5 * abs(float(l0))
    scale = max(float(np.abs(g).max()) for g in jax.tree_util.tree_leaves(g0))
    for path, got in jax.tree_util.tree_leaves_with_path(g1):
        want = _get(g0, path)
        name = jax.tree_util.keystr(path)
        if "['key']['bias']" in name:
            # Zero in exact arithmetic (softmax ignores a per-query constant): both are noise.
            assert max(float(np.abs(got).max()), float(np.abs(want).max())) < 1e-6 * scale
        else:
            assert _relative_error(got, want) < 1e-5, name


def _get(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


def test_fused_attention_refuses_attention_dropout_in_training():
    ids, mask, types, _ = _inputs()
    model = BertModel(TINY.replace(attention_implementation="xla"))  # dropout 0.1
    params = _init(model, ids, mask, types)
    _apply(model, params, ids, mask, types)  # inference: nothing is dropped, so it runs
    with pytest.raises(ConfigError) as err:
        rngs = {"dropout": jax.random.key(0)}
        _apply(model, params, ids, mask, types, deterministic=False, rngs=rngs)
    assert "attention_implementation='xla'" in str(err.value)
    assert "attention_probs_dropout_prob=0" in str(err.value)


# --- Config -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(hidden_size=100, num_attention_heads=12), "not divisible by num_attention_heads"),
        (dict(num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
        (dict(vocab_size=-5), "vocab_size must be a positive integer"),
        (dict(hidden_dropout_prob=1.0), "hidden_dropout_prob must be in [0, 1)"),
        (dict(hidden_act="relu"), "hidden_act 'relu' is not supported"),
        (dict(hidden_act="gelu_new"), "use one of ('gelu', 'gelu_tanh')"),
        (dict(remat_policy="some"), "remat_policy must be one of"),
        (dict(dtype="int8"), "dtype must be one of"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps must be positive"),
        (dict(attention_implementation="flash"), "attention_implementation must be one of"),
    ],
)
def test_config_validation(changes, message):
    with pytest.raises(ConfigError) as err:
        BertConfig(**changes)
    assert message in str(err.value)


def test_config_errors_from_files(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        BertConfig.from_preset("huge")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "roberta", "hidden_size": 64}))
    with pytest.raises(ConfigError, match=r"config\.json: model_type 'roberta'"):
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"position_embedding_type": "relative_key"}))
    with pytest.raises(ConfigError, match="relative_key"):
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"hidden_size": 100, "num_attention_heads": 12}))
    with pytest.raises(ConfigError, match=r"config\.json: invalid BertConfig.*not divisible"):
        BertConfig.from_json_file(path)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        BertConfig.from_json_file(path)
    with pytest.raises(ConfigError, match="no such config file"):
        BertConfig.from_json_file(tmp_path / "missing.json")


@pytest.mark.parametrize("hidden_act,google_name", [("gelu_tanh", "gelu"), ("gelu", "gelu_exact")])
def test_google_config_round_trip(tmp_path, hidden_act, google_name):
    config = BertConfig.from_preset(
        "small", vocab_size=21128, type_vocab_size=3, hidden_act=hidden_act
    )
    path = tmp_path / "bert_config.json"
    config.write_json(path, flavour="google")
    data = json.loads(path.read_text())
    # The original's "gelu" is its tanh form; an exact GELU gets a name it refuses.
    assert data["hidden_act"] == google_name
    # The exact key set of google-research/bert's published bert_config.json files.
    assert set(data) == {
        "attention_probs_dropout_prob",
        "hidden_act",
        "hidden_dropout_prob",
        "hidden_size",
        "initializer_range",
        "intermediate_size",
        "max_position_embeddings",
        "num_attention_heads",
        "num_hidden_layers",
        "type_vocab_size",
        "vocab_size",
    }
    assert BertConfig.from_json_file(path, flavour="google") == config


def test_json_hidden_act_names(tmp_path):
    """Each flavour's names for the two forms; anything else is refused by name."""
    path = tmp_path / "config.json"
    expected = {
        "google": {"gelu": "gelu_tanh", "gelu_exact": "gelu"},
        "hf": {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"},
    }
    for flavour, names in expected.items():
        for name, ours in names.items():
            path.write_text(json.dumps({"hidden_act": name}))
            assert BertConfig.from_json_file(path, flavour=flavour).hidden_act == ours
    for flavour, name in [("google", "relu"), ("google", "gelu_tanh"), ("hf", "gelu_fast")]:
        path.write_text(json.dumps({"hidden_act": name}))
        with pytest.raises(ConfigError) as err:
            BertConfig.from_json_file(path, flavour=flavour)
        allowed = tuple(expected[flavour])
        assert f"config.json: hidden_act {name!r} is not supported; use one of {allowed}" in str(
            err.value
        )


@pytest.mark.parametrize("hidden_act,hf_name", [("gelu", "gelu"), ("gelu_tanh", "gelu_new")])
def test_hf_config_round_trip_through_transformers(tmp_path, hidden_act, hf_name):
    transformers = pytest.importorskip("transformers")
    config = BertConfig.from_preset(
        "mini", vocab_size=1000, layer_norm_eps=1e-7, hidden_act=hidden_act
    )
    path = tmp_path / "config.json"
    config.write_json(path, flavour="hf")
    assert json.loads(path.read_text())["hidden_act"] == hf_name
    assert BertConfig.from_json_file(path) == config
    # transformers reads our config.json with the same architecture...
    theirs = transformers.BertConfig.from_json_file(str(path))
    for field in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
    ):
        assert getattr(theirs, field) == getattr(config, field), field
    assert theirs.hidden_act == hf_name
    # ...and the config.json transformers writes reads back as the same config.
    out = tmp_path / "theirs"
    theirs.save_pretrained(str(out))
    assert BertConfig.from_json_file(out / "config.json") == config


# --- Causal (left-to-right) attention ---------------------------------------------------------

CAUSAL = NO_ATTENTION_DROPOUT.replace(causal=True)


def test_causal_mask_is_lower_triangular_and_padding():
    from bert_jax.model import attention_mask

    input_mask = jnp.asarray([[1, 1, 1, 1], [1, 1, 0, 0]])
    mask = np.asarray(attention_mask(input_mask, causal=True))
    assert mask.shape == (2, 1, 4, 4)
    lower = np.tril(np.ones((4, 4), bool))
    np.testing.assert_array_equal(mask[0, 0], lower)
    # Row 1: query t attends keys s <= t among the two real ones.
    np.testing.assert_array_equal(mask[1, 0], lower & (np.arange(4) < 2)[None, :])
    # Without `causal`, every query attends every real key (the encoder's mask).
    np.testing.assert_array_equal(
        np.asarray(attention_mask(input_mask))[:, 0, 0], np.asarray(input_mask, bool)
    )


def test_packed_causal_mask_is_block_diagonal_and_lower_triangular():
    from bert_jax.model import attention_mask

    instance_ids = jnp.asarray([[1, 1, 2, 2, 2, 0]])
    mask = np.asarray(attention_mask(instance_ids > 0, instance_ids, causal=True))[0, 0]
    expected = np.zeros((6, 6), bool)
    for block in (slice(0, 2), slice(2, 5)):
        n = block.stop - block.start
        expected[block, block] = np.tril(np.ones((n, n), bool))
    np.testing.assert_array_equal(mask, expected)


@pytest.mark.parametrize("implementation", ["einsum", "xla"])
def test_a_changed_future_token_leaves_earlier_positions_unchanged(implementation):
    """The causal property through the whole model (embeddings, every layer, MLM head)."""
    ids, mask, types, _ = _inputs()
    config = CAUSAL.replace(attention_implementation=implementation)
    every_position = jnp.broadcast_to(jnp.arange(T), (B, T))
    model = BertForPreTraining(config, next_sentence=False)
    params = _init(model, ids, mask, types, every_position)
    k = 5  # the changed position (real in rows 0 and 1)
    changed = ids.at[:, k].set((ids[:, k] + 1) % TINY.vocab_size)

    def run(module, ids):
        out = _apply(module, params, ids, mask, types, every_position)
        seq = _apply(module, params, ids, mask, types, method=BertForPreTraining.encode)
        return np.asarray(out.mlm_logits), np.asarray(seq.sequence_output)

    for before, after in zip(run(model, ids), run(model, changed), strict=True):
        np.testing.assert_array_equal(before[:2, :k], after[:2, :k])
        assert np.abs(before[:2, k:7] - after[:2, k:7]).min(axis=-1).max() > 0  # it is used
    # The same change reaches every position of a bidirectional model (the test can fail).
    bidirectional = BertForPreTraining(config.replace(causal=False), next_sentence=False)
    before, after = run(bidirectional, ids)[1], run(bidirectional, changed)[1]
    assert np.abs(before[:2, :k] - after[:2, :k]).max() > 1e-3


def test_a_causal_model_pools_its_last_real_token():
    ids, mask, types, _ = _inputs()
    model = BertModel(CAUSAL)
    params = _init(model, ids, mask, types)
    out = _apply(model, params, ids, mask, types)
    last = np.asarray(mask).sum(1) - 1  # rows are padded at the end
    states = np.asarray(out.sequence_output)[np.arange(B), last]  # (B, H)
    kernel, bias = np.asarray(params["pooler"]["kernel"]), np.asarray(params["pooler"]["bias"])
    np.testing.assert_allclose(out.pooled_output, np.tanh(states @ kernel + bias), atol=1e-6)
    # A bidirectional model with the same weights pools [CLS] (position 0).
    cls = np.asarray(_apply(BertModel(TINY), params, ids, mask, types).sequence_output)[:, 0]
    np.testing.assert_allclose(
        _apply(BertModel(TINY), params, ids, mask, types).pooled_output,
        np.tanh(cls @ kernel + bias),
        atol=1e-6,
    )


@pytest.mark.parametrize("implementation", ["einsum", "xla"])
def test_packed_causal_rows_equal_their_instances_alone(implementation):
    """Causal AND block-diagonal: each instance of a packed row has the states and pooled
    output it has alone (pooled at its own last token)."""
    config = CAUSAL.replace(attention_implementation=implementation)
    rng = np.random.default_rng(2)
    lengths = [4, 5, 2]  # three instances in one row of T=11
    alone = [rng.integers(1, TINY.vocab_size, n).astype(np.int32) for n in lengths]
    packed_ids = np.concatenate(alone)[None]  # (1, 11)
    instance_ids = np.repeat(np.arange(1, 4), lengths)[None]
    position_ids = np.concatenate([np.arange(n) for n in lengths])[None]
    cls_positions = np.cumsum([0, *lengths[:-1]])[None]
    model = BertModel(config)
    ones = jnp.ones_like(packed_ids)
    params = _init(model, packed_ids, ones, 0 * ones)
    out = _apply(
        model,
        params,
        jnp.asarray(packed_ids),
        ones,
        0 * ones,
        position_ids=jnp.asarray(position_ids),
        instance_ids=jnp.asarray(instance_ids),
        cls_positions=jnp.asarray(cls_positions),
    )
    assert out.pooled_output.shape == (1, 3, TINY.hidden_size)
    for i, ids in enumerate(alone):
        single = _apply(model, params, jnp.asarray(ids[None]))
        start = int(cls_positions[0, i])
        np.testing.assert_allclose(
            out.sequence_output[0, start : start + len(ids)],
            single.sequence_output[0],
            atol=1e-5,
            rtol=1e-5,
        )
        np.testing.assert_allclose(
            out.pooled_output[0, i], single.pooled_output[0], atol=1e-5, rtol=1e-5
        )


def test_causal_config_json_round_trips(tmp_path):
    config = BertConfig.from_preset("mini", vocab_size=1000, causal=True)
    path = tmp_path / "config.json"
    config.write_json(path, flavour="hf")
    assert json.loads(path.read_text())["is_decoder"] is True
    assert BertConfig.from_json_file(path) == config
    # An encoder's config.json is unchanged by the field: no is_decoder key at all.
    config.replace(causal=False).write_json(path, flavour="hf")
    assert "is_decoder" not in json.loads(path.read_text())
    # Google's bert_config.json has no such field: a causal model is refused, by name.
    with pytest.raises(ConfigError, match="causal .* has no Google bert_config.json"):
        config.write_json(tmp_path / "bert_config.json", flavour="google")
    with pytest.raises(ConfigError, match="causal must be True or False, got 'yes'"):
        BertConfig(causal="yes")


def test_the_objective_alone_makes_an_experiment_model_causal():
    model = {"preset": "tiny", "vocab_size": None}
    assert not BertConfig.from_experiment(model).causal
    assert not BertConfig.from_experiment(model, objective="mlm").causal
    assert BertConfig.from_experiment(model, objective="ltr").causal
    with pytest.raises(ConfigError, match=r"config.objective must be one of .*'nsp'"):
        BertConfig.from_experiment(model, objective="nsp")
    with pytest.raises(ConfigError, match="model.causal=True contradicts config.objective='mlm'"):
        BertConfig.from_experiment({**model, "causal": True}, objective="mlm")
