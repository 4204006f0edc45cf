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

from bert_jax import telemetry
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
