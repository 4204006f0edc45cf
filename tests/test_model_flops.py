"""The model-FLOP count behind every MFU figure, checked against the model's own matmuls.

`bert_jax.telemetry` counts FLOPs from a formula (training logs MFU with it, and
benchmarks/bench_model.py reports useful GFLOP/s with it). Here the same count is taken
from the traced program instead: every `dot_general` in the jaxpr of the real model
(forward, and forward + backward), 2 x output elements x contracted size each.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jax_core

from bert_jax import layers, telemetry
from bert_jax.config import BertConfig
from bert_jax.heads import BertForPreTraining

BATCH, SEQ, PREDICTIONS = 3, 32, 5


def matmul_flops(jaxpr, repeat: int = 1) -> int:
    """FLOPs of the dot_generals in `jaxpr` and the jaxprs nested in it (scan bodies x length)."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            contracted = int(np.prod([lhs[d] for d in contracting]))
            total += repeat * 2 * int(np.prod(eqn.outvars[0].aval.shape)) * contracted
        inner = repeat * eqn.params.get("length", 1) if eqn.primitive.name == "scan" else repeat
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax_core.ClosedJaxpr):
                    total += matmul_flops(sub.jaxpr, inner)
                elif isinstance(sub, jax_core.Jaxpr):
                    total += matmul_flops(sub, inner)
    return total


def _model_and_inputs(scan_layers: bool):
    # intermediate_size not 4 x hidden, so the formula's FFN term is really checked.
    config = BertConfig.from_preset(
        "tiny", vocab_size=1000, intermediate_size=300, scan_layers=scan_layers
    )
    model = BertForPreTraining(config)
    ids = jnp.ones((BATCH, SEQ), jnp.int32)
    positions = jnp.ones((BATCH, PREDICTIONS), jnp.int32)
    inputs = (ids, ids, ids, positions)
    variables = jax.jit(lambda rng: model.init(rng, *inputs))(jax.random.key(0))
    return config, model, variables, inputs


@pytest.mark.parametrize("scan_layers", [False, True])
def test_forward_flops_equal_the_models_matmuls(scan_layers):
    config, model, variables, inputs = _model_and_inputs(scan_layers)
    jaxpr = jax.make_jaxpr(lambda v: model.apply(v, *inputs))(variables).jaxpr
    counted = matmul_flops(jaxpr)
    assert counted > 0
    assert counted == BATCH * telemetry.forward_flops_per_sequence(config, SEQ, PREDICTIONS)


def test_train_step_flops_equal_forward_and_backward_matmuls():
    config, model, variables, inputs = _model_and_inputs(scan_layers=False)

    def loss(v):
        out = model.apply(v, *inputs)
        return out.mlm_logits.sum() + out.nsp_logits.sum()

    jaxpr = jax.make_jaxpr(jax.grad(loss))(variables).jaxpr
    expected = telemetry.train_flops_per_step(config, BATCH, SEQ, PREDICTIONS)
    assert matmul_flops(jaxpr) == expected


# --- modern encoders (issue 42): GeGLU, no position table, local attention ------------------


def _modern_config(window: int) -> BertConfig:
    """A tiny ModernBERT (rotary, GeGLU, pre-LN, no biases, no token types); with `window`,
    layer 1 of 3 is local (every 2nd layer global)."""
    return BertConfig.from_preset(
        "modernbert_tiny", vocab_size=1000, hidden_size=64, intermediate_size=96,
        num_hidden_layers=3, local_attention_window=window, global_attention_every=2,
    )  # fmt: skip


def _traced_flops(config: BertConfig) -> tuple[int, int]:
    """Matmul FLOPs of the traced forward pass and of its gradient (forward + backward)."""
    model = BertForPreTraining(config)
    ids = jnp.ones((BATCH, SEQ), jnp.int32)
    inputs = (ids, ids, ids, jnp.ones((BATCH, PREDICTIONS), jnp.int32))
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))

    def loss(v):
        out = model.apply(v, *inputs)
        return out.mlm_logits.sum() + out.nsp_logits.sum()

    forward = jax.make_jaxpr(lambda v: model.apply(v, *inputs))(variables).jaxpr
    return matmul_flops(forward), matmul_flops(jax.make_jaxpr(jax.grad(loss))(variables).jaxpr)


def test_glu_and_rotary_flops_equal_the_models_matmuls():
    """GeGLU's three H x F matmuls (not BERT's two) and no position-table term, as traced."""
    config = _modern_config(window=0)
    assert config.feed_forward == "glu" and config.position_encoding == "rotary"
    forward, step = _traced_flops(config)
    assert forward == BATCH * telemetry.forward_flops_per_sequence(config, SEQ, PREDICTIONS)
    assert step == telemetry.train_flops_per_step(config, BATCH, SEQ, PREDICTIONS)
    # The GLU term is really counted: an MLP of the same F is 2 x T x H x F per layer cheaper.
    mlp = config.replace(feed_forward="mlp")
    saved = telemetry.forward_flops_per_sequence(config, SEQ, PREDICTIONS) - (
        telemetry.forward_flops_per_sequence(mlp, SEQ, PREDICTIONS)
    )
    assert saved == 3 * 2 * SEQ * 64 * 96


def _computed_pairs(window: int) -> int:
    """The (query, key) pairs the model's local layer computes, counted by hand: blocked
    local attention scores each block of r = W // 2 queries against its 3r neighbouring
    keys, ceil(T / r) blocks (the padding beyond the row's ends included)."""
    r = layers.local_block_size(window)
    assert r == max(window // 2, 1)
    return -(-SEQ // r) * r * 3 * r


@pytest.mark.parametrize("window", [6, 9, 2 * SEQ])
def test_a_local_layer_counts_its_window_not_what_it_computes(window):
    """Model FLOPs count a local layer's useful pairs, |i - j| <= W // 2 (counted here by
    hand), whatever the implementation computes and masks besides."""
    config = _modern_config(window)
    forward, step = _traced_flops(config)
    i, j = np.indices((SEQ, SEQ))
    band = int((np.abs(i - j) <= window // 2).sum())  # W + 1 keys per query, fewer at the ends
    # Layer 1 (local) scores and reads `band` pairs per head dim; layers 0 and 2 are global.
    masked = 4 * (_computed_pairs(window) - band) * config.hidden_size
    expected = telemetry.forward_flops_per_sequence(config, SEQ, PREDICTIONS)
    assert forward - BATCH * masked == BATCH * expected
    assert step - 3 * BATCH * masked == telemetry.train_flops_per_step(
        config, BATCH, SEQ, PREDICTIONS
    )
    global_only = telemetry.forward_flops_per_sequence(
        config.replace(local_attention_window=0), SEQ, PREDICTIONS
    )
    assert global_only - expected == 4 * (SEQ * SEQ - band) * config.hidden_size
