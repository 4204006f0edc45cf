"""`activation_dtype`: the encoder's activations between matmuls (residual stream, norm outputs,
GeGLU, rotary) in bf16, statistics and softmax in f32; the default keeps them all f32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.config import BertConfig
from bert_jax.model import BertModel

CONFIG = BertConfig.from_preset(
    "modernbert_tiny",
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=48,
    max_position_embeddings=32,
    local_attention_window=8,
    dtype="bfloat16",
)


def _run(config):
    tokens = np.random.default_rng(0).integers(1, 64, (2, 32)).astype(np.int32)
    tokens[1, 20:] = 0
    model = BertModel(config, add_pooling_layer=False)
    variables = model.init(jax.random.key(0), tokens, tokens > 0)
    apply = jax.jit(lambda v: model.apply(v, tokens, tokens > 0, output_hidden_states=True))
    return apply(variables), jax.make_jaxpr(apply)(variables), tokens > 0


def _array_dtypes(jaxpr):
    """The dtypes of every value the program computes, nested programs included."""
    found = set()
    for eqn in jaxpr.eqns:
        found |= {str(v.aval.dtype) for v in eqn.outvars if hasattr(v.aval, "dtype")}
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                found |= _array_dtypes(inner)
    return found


# 17 s in the full suite (two bf16 compiles on the CPU): the extended tier, which CI runs too.
@pytest.mark.extended
def test_bf16_activations_carry_the_stream_in_bf16_near_the_f32_one():
    full, full_program, real = _run(CONFIG)
    low, low_program, _ = _run(
        CONFIG.replace(activation_dtype="bfloat16", residual_dtype="bfloat16")
    )
    # The default keeps every layer's output in f32; bf16 activations and a bf16 residual
    # stream put every layer's output, and the final norm's, in bf16.
    assert all(h.dtype == jnp.float32 for h in full.hidden_states)
    assert full.sequence_output.dtype == jnp.float32
    assert all(h.dtype == jnp.bfloat16 for h in low.hidden_states)
    assert low.sequence_output.dtype == jnp.bfloat16
    assert "float32" in _array_dtypes(low_program.jaxpr)  # statistics and softmax stay f32
    got = np.asarray(low.sequence_output, np.float32)[real]
    want = np.asarray(full.sequence_output)[real]
    # bf16 keeps 8 bits of mantissa: a layer-normed output is within a few of its 2^-8 steps.
    assert np.abs(got - want).max() < 0.1
    assert np.abs(got - want).mean() < 0.01


def _stream_dtypes(config):
    """(hidden states' dtypes, sequence output's dtype) of `config`, traced, not compiled."""
    tokens = np.ones((1, 8), np.int32)
    model = BertModel(config, add_pooling_layer=False)

    def forward():
        variables = model.init(jax.random.key(0), tokens)
        return model.apply(variables, tokens, output_hidden_states=True)

    out = jax.eval_shape(forward)
    return {h.dtype for h in out.hidden_states}, out.sequence_output.dtype


@pytest.mark.parametrize("preset", ["modernbert_tiny", "tiny"])  # pre-LN and post-LN
def test_residual_dtype_sets_the_stream_apart_from_the_activations(preset):
    config = BertConfig.from_preset(
        preset,
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=8,
        dtype="bfloat16",
    )
    bf16, f32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
    # torch autocast's split: bf16 inside the blocks, the stream (embedding norm, x + branch,
    # post-LN's and the final norm's outputs) stays f32; the default keeps both f32.
    assert _stream_dtypes(config.replace(activation_dtype="bfloat16")) == ({f32}, f32)
    assert _stream_dtypes(config) == ({f32}, f32)
    both = config.replace(activation_dtype="bfloat16", residual_dtype="bfloat16")
    assert _stream_dtypes(both) == ({bf16}, bf16)
    assert _stream_dtypes(config.replace(residual_dtype="bfloat16")) == ({bf16}, bf16)


def test_an_f32_stream_with_bf16_blocks_differs_from_a_bf16_stream():
    config = CONFIG.replace(num_hidden_layers=1, activation_dtype="bfloat16")
    tokens = np.random.default_rng(0).integers(1, 64, (1, 16)).astype(np.int32)
    model = BertModel(config, add_pooling_layer=False)
    variables = model.init(jax.random.key(0), tokens)

    def stream(residual):
        cfg = config.replace(residual_dtype=residual)
        out = BertModel(cfg, add_pooling_layer=False).apply(variables, tokens)
        return np.asarray(out.sequence_output.astype(jnp.float32))

    wide, narrow = stream("float32"), stream("bfloat16")
    # the f32 stream is not the bf16 one widened: it keeps bits bf16 rounds away
    assert not np.array_equal(wide, narrow)
    assert not np.array_equal(wide, wide.astype(jnp.bfloat16).astype(np.float32))
    assert np.abs(wide - narrow).max() < 0.1  # both near the same function
