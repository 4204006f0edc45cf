"""bf16 matmuls as an accelerator runs them: every product of the train step, forward and
backward, takes `dtype` operands, and the cuDNN attention path passes cuDNN's own checks.

No GPU here: what is checked is the program jax builds (its jaxpr) and jax's own shape and
layout checks, which are what failed or ran slowly on the H100 of 2026-11-26.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jax_core

from bert_jax import layers as layers_lib
from bert_jax.config import BertConfig
from bert_jax.heads import BertForPreTraining
from bert_jax.layers import mixed_einsum

CONFIG = BertConfig(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=40,
    attention_probs_dropout_prob=0.0,
)
B, T, P = 3, 10, 4  # cuDNN trains with a mask at even lengths only


def _inputs():
    rng = np.random.default_rng(0)
    mask = (np.arange(T)[None] < np.array([T, 7, 3])[:, None]).astype(np.int32)
    ids = rng.integers(1, CONFIG.vocab_size, (B, T)).astype(np.int32) * mask
    types = (np.arange(T)[None] >= 5).astype(np.int32) * mask
    positions = rng.integers(0, 3, (B, P)).astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types), jnp.asarray(positions)


def _packing(mask):
    """Two instances in each row: ids 1 and 2, positions restarting at 0."""
    instance_ids = jnp.where(jnp.arange(T)[None] < T // 2, 1, 2) * mask
    return dict(
        instance_ids=instance_ids,
        position_ids=jnp.where(instance_ids == 2, jnp.arange(T) - T // 2, jnp.arange(T)),
        cls_positions=jnp.tile(jnp.array([[0, T // 2]]), (B, 1)),
    )


def _training_loss(model, ids, mask, types, positions, **packing):
    def loss(variables):
        rngs = {"dropout": jax.random.key(1)}
        out = model.apply(
            variables, ids, mask, types, positions, deterministic=False, rngs=rngs, **packing
        )
        return out.mlm_logits.astype(jnp.float32).sum() + out.nsp_logits.sum()

    return loss


def dot_operand_dtypes(jaxpr) -> list[tuple[str, str]]:
    """(lhs, rhs) dtypes of every dot_general in `jaxpr` and the jaxprs nested in it."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(tuple(str(v.aval.dtype) for v in eqn.invars[:2]))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax_core.ClosedJaxpr):
                    found += dot_operand_dtypes(sub.jaxpr)
                elif isinstance(sub, jax_core.Jaxpr):
                    found += dot_operand_dtypes(sub)
    return found


@pytest.mark.parametrize("scan_layers", [False, True], ids=["looped", "scanned"])
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_every_product_of_a_bf16_train_step_is_bf16(monkeypatch, scan_layers, packed):
    """Forward and backward (the dense layers, the attention einsums, the tied MLM decoder):
    no f32 operand, which a GPU would multiply as a TF32 GEMM at half the bf16 rate. Traced
    as for an accelerator (`layers.product_dtype`; a CPU multiplies the backward's rounded
    operands in f32, run below)."""
    monkeypatch.setattr(layers_lib, "product_dtype", lambda dtype: dtype)
    model = BertForPreTraining(CONFIG.replace(dtype="bfloat16", scan_layers=scan_layers))
    ids, mask, types, positions = _inputs()
    packing = _packing(mask) if packed else {}
    variables = jax.eval_shape(
        lambda: model.init(jax.random.key(0), ids, mask, types, positions, **packing)
    )
    loss = _training_loss(model, ids, mask, types, positions, **packing)
    jaxpr = jax.make_jaxpr(jax.grad(loss))(variables).jaxpr
    dtypes = dot_operand_dtypes(jaxpr)
    # Layers (one scan body, or 2) x (4 attention + 2 FFN denses, 2 einsums) + pooler + MLM
    # transform + decoder + NSP, each once forward and twice backward.
    layers = 1 if scan_layers else CONFIG.num_hidden_layers
    assert len(dtypes) == 3 * (layers * (6 + 2) + 4)
    assert set(dtypes) == {("bfloat16", "bfloat16")}


def test_a_bf16_train_step_runs_on_the_cpu_near_the_f32_one():
    """XLA:CPU has no bf16 x bf16 -> f32 kernel for some backward layouts (the attention
    context's): the step must run here, and its gradients stay near the f32 step's."""
    ids, mask, types, positions = _inputs()
    grads = {}
    for dtype in ("float32", "bfloat16"):
        model = BertForPreTraining(CONFIG.replace(dtype=dtype))
        variables = model.init(jax.random.key(0), ids, mask, types, positions)
        loss = _training_loss(model, ids, mask, types, positions)
        grads[dtype] = jax.jit(jax.grad(loss))(variables)
    low, full = (nn.meta.unbox(grads[d]) for d in ("bfloat16", "float32"))
    leaves = jax.tree_util.tree_leaves_with_path(low)
    overall = max(float(np.abs(g).max()) for g in jax.tree_util.tree_leaves(full))
    for (path, got), want in zip(leaves, jax.tree_util.tree_leaves(full), strict=True):
        name = jax.tree_util.keystr(path)
        error = float(np.abs(np.asarray(got) - np.asarray(want)).max())
        # The key bias's gradient is zero in exact arithmetic (softmax ignores a per-query
        # constant): both are rounding noise, small against the gradient's scale.
        scale = 1e-3 * overall if "['key']['bias']" in name else float(np.abs(want).max())
        assert np.isfinite(error) and error <= 5e-2 * scale, name


@pytest.mark.parametrize(
    "subscripts, a_shape, b_shape",
    [
        ("btad,bsad->bats", (2, 5, 3, 4), (2, 6, 3, 4)),  # attention logits
        ("bats,bsad->btad", (2, 3, 5, 6), (2, 6, 3, 4)),  # attention context
    ],
)
def test_mixed_einsum_gradients_equal_jnp_einsums(subscripts, a_shape, b_shape):
    """In f32, exactly jax's own einsum and its derived gradients; in bf16, the same within
    bf16's rounding of the operands and of the incoming gradient."""
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in (a_shape, b_shape))
    weights = jnp.asarray(rng.normal(size=jnp.einsum(subscripts, a, b).shape), jnp.float32)

    def reference(a, b):
        return (jnp.einsum(subscripts, a, b) * weights).sum()

    def ours(dtype):
        return lambda a, b: (mixed_einsum(subscripts, a, b, dtype) * weights).sum()

    want = jax.grad(reference, argnums=(0, 1))(a, b)
    exact = jax.grad(ours(jnp.float32), argnums=(0, 1))(a, b)
    rounded = jax.grad(ours(jnp.bfloat16), argnums=(0, 1))(a, b)
    for w, e, r in zip(want, exact, rounded, strict=True):
        np.testing.assert_allclose(e, w, rtol=1e-6, atol=1e-6)
        assert r.dtype == jnp.float32
        scale = float(jnp.abs(w).max())
        assert float(jnp.abs(r - w).max()) < 3e-2 * scale
        assert float(jnp.abs(r - w).max()) > 0  # bf16 really was used


def test_mixed_einsum_gradients_leave_in_the_product_dtype():
    """bf16 products give bf16-valued input gradients (widened to the inputs' f32), as
    jax's own transpose of the cast copies does: an f32 gradient of the attention
    probabilities doubles the bytes the TPU step moves (issue 77: BERT-Base phase 2 on
    v3-32 76.0 -> 78.8 ms by the compiler's estimate)."""
    rng = np.random.default_rng(1)
    probs, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((2, 3, 5, 6), (2, 6, 3, 4)))
    weights = jnp.asarray(rng.normal(size=(2, 5, 3, 4)), jnp.float32)
    grads = jax.grad(
        lambda a, b: (mixed_einsum("bats,bsad->btad", a, b, jnp.bfloat16) * weights).sum(),
        argnums=(0, 1),
    )(probs, v)
    for g in grads:
        assert g.dtype == jnp.float32
        np.testing.assert_array_equal(g, g.astype(jnp.bfloat16).astype(jnp.float32))


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_cudnn_attention_passes_cudnns_layout_checks(monkeypatch, packed):
    """The cuDNN path traces, forward and backward, through jax's own checks of what cuDNN
    accepts (`fused_attention_stablehlo.check_layout`), for an unpacked row's (B, 1, 1, S)
    padding mask and a packed row's (B, 1, T, S) one. cuDNN takes a mask only at full
    (T, S): the H100 run of 2026-11-26 failed here ("Bias must have same seq length as QKV,
    got 1 and 128"). Only the cuDNN version probe, which needs a GPU, is stood in for."""
    from jax._src.cudnn import fused_attention_stablehlo

    monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 91000)
    ids, mask, types, positions = _inputs()
    config = CONFIG.replace(attention_implementation="cudnn", dtype="bfloat16")
    model = BertForPreTraining(config)
    packing = _packing(mask) if packed else {}
    variables = jax.eval_shape(
        lambda: model.init(jax.random.key(0), ids, mask, types, positions, **packing)
    )
    loss = _training_loss(model, ids, mask, types, positions, **packing)
    grads = jax.eval_shape(jax.grad(loss), variables)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(variables)


@pytest.mark.parametrize("blocked", [False, True], ids=["global", "local-blocked"])
def test_cudnn_mask_gives_an_empty_row_its_own_key_and_leaves_the_rest(blocked):
    """cuDNN's backward turns a query row that attends nothing into NaN gradients in every
    parameter (ModernBERT-base, window 128, T = 1,024, H200, 2026-11-27): `cudnn_mask`
    gives such a row (padding) its own key and nothing else, and leaves every row that
    attends something as it was. Packed rows with trailing padding, both mask layouts."""
    from bert_jax import layers

    instance_ids = jnp.asarray([[1, 1, 1, 2, 2, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0]])
    input_mask = (instance_ids > 0).astype(jnp.int32)
    window = 4  # blocks of r = 2 queries against 3r = 6 keys
    if blocked:
        mask = layers.local_block_mask(layers.segment_ids(input_mask, instance_ids), window)
        mask = mask.reshape(-1, *mask.shape[2:])  # (B n, 1, r, 3r), as the cuDNN path has it
        queries, offset = layers.local_block_size(window), layers.local_block_size(window)
    else:
        mask = layers.attention_mask(input_mask, instance_ids)  # (B, 1, T, S)
        queries, offset = instance_ids.shape[1], 0
    out = np.asarray(layers.cudnn_mask(mask, queries, blocked))
    before = np.asarray(jnp.broadcast_to(mask, out.shape))
    empty = ~before.any(axis=-1)  # (rows, 1, queries)
    assert empty.any() and (~empty).any()  # the case exercises both kinds of row
    assert (out[~empty] == before[~empty]).all()
    itself = np.arange(out.shape[-1])[None] == np.arange(queries)[:, None] + offset
    rows, _, query = np.nonzero(empty)
    assert (out[rows, 0, query] == itself[query]).all()
    assert out.any(axis=-1).all()  # no row attends nothing
