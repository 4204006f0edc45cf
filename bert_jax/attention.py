"""The attention core: scaled q, k, v (B, T, A, D) -> the context, by `attention_implementation`.

`bert_jax.model.SelfAttention` projects the queries, keys and values and places rotary
angles; this module computes softmax(q k^T + bias, masked) v. "einsum" writes it out (the
reference), "xla" and "cudnn" call `jax.nn.dot_product_attention`, "splash" Pallas' TPU
kernels (`bert_jax.splash`). Local layers' blocked
inputs (`layers.local_block_mask`, a rank-5 mask) are computed block by block: each block of
r queries against its 3r keys (`layers.key_blocks`), linear in T.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from bert_jax import layers, splash
from bert_jax.config import BertConfig, ConfigError


def refuse_probability_dropout(config: BertConfig, deterministic: bool) -> None:
    """The fused kernels have no dropout on the attention probabilities: a training call
    with attention_probs_dropout_prob > 0 is refused, naming the key."""
    cfg = config
    if cfg.attention_probs_dropout_prob > 0 and not deterministic:
        raise ConfigError(
            f"attention_implementation={cfg.attention_implementation!r} cannot apply "
            f"dropout to attention probabilities: training with it needs "
            f"attention_probs_dropout_prob=0, got {cfg.attention_probs_dropout_prob}"
        )


def attend(
    config: BertConfig,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    inputs: layers.AttentionInputs,
    deterministic: bool,
    dropout: Callable[[jax.Array], jax.Array],
) -> jax.Array:
    """(B, T, A, D) scaled q, k, v -> (B, T, A, D) context under `inputs`; `dropout` drops
    attention probabilities (the einsum path only)."""
    cfg = config
    mask, bias = inputs.mask, inputs.bias  # (B, 1, 1 or T, S) bool, ALiBi's or None
    blocked = mask.ndim == 5
    if cfg.attention_implementation == "splash":
        refuse_probability_dropout(cfg, deterministic)
        if bias is not None or inputs.segments is None:
            raise ConfigError(
                "attention_implementation='splash' takes no additive bias (position_encoding"
                "='alibi') and needs the rows' segment ids (layers.attention_inputs' segments)"
            )
        # Local layers' inputs are the blocked ones (`BertModel` always gives segment ids).
        return splash.attention(cfg, q, k, v, inputs.segments, local=blocked)
    if blocked:
        block, length = layers.local_block_size(cfg.local_attention_window), q.shape[1]
        q = layers.query_blocks(q, block)  # (B, n, r, A, D)
        k, v = (layers.key_blocks(y, block) for y in (k, v))  # (B, n, 3r, A, D)
    if cfg.attention_implementation == "einsum":
        context = einsum_attention(cfg, q, k, v, mask, bias, dropout, blocked)
    else:
        refuse_probability_dropout(cfg, deterministic)
        shape = q.shape
        if blocked:  # the blocks become batch rows: (B n, r, A, D) against (B n, 3r, A, D)
            q, k, v, mask = (y.reshape(-1, *y.shape[2:]) for y in (q, k, v, mask))
            if bias is not None:  # (B or 1, n, A, r, 3r) -> (B n, A, r, 3r)
                bias = jnp.broadcast_to(bias, (*shape[:2], *bias.shape[2:]))
                bias = bias.reshape(-1, *bias.shape[2:])
        if cfg.attention_implementation == "cudnn":
            mask = layers.cudnn_mask(mask, q.shape[1], blocked)
        # q is already scaled (as on the einsum path), so the op's own scale is 1.
        context = jax.nn.dot_product_attention(
            q.astype(cfg.dtype),
            k.astype(cfg.dtype),
            v.astype(cfg.dtype),
            bias=bias,
            mask=mask,
            scale=1.0,
            implementation=cfg.attention_implementation,
        )  # (B, T, A, D), blocked (B n, r, A, D)
        context = context.reshape(shape)
    return layers.unblock(context, length) if blocked else context


def einsum_attention(config, q, k, v, mask, bias, dropout, blocked=False):
    """The written-out reference: mixed-precision einsums around an f32 softmax."""
    cfg = config
    scores, mix = (
        ("bntad,bnsad->bnats", "bnats,bnsad->bntad")
        if blocked
        else ("btad,bsad->bats", "bats,bsad->btad")
    )
    logits = layers.mixed_einsum(scores, q, k, cfg.dtype)  # (B, A, T, S), blocked (B, n, A, r, 3r)
    if bias is not None:
        logits = logits + bias
    probs = jax.nn.softmax(logits + layers.attention_bias(mask), axis=-1)
    probs = dropout(probs)
    return layers.mixed_einsum(mix, probs, v, cfg.dtype)  # (B, T, A, D), blocked (B, n, r, A, D)
