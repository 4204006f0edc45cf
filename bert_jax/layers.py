"""The attention primitives the encoder composes by config: masks, positions, the gated FFN.

Pure jnp functions, no parameters: `bert_jax.model` builds the layers around them. BERT uses
the padding (and packing, and causal) mask alone; ModernBERT adds rotary positions (RoFormer,
Su et al. 2021) with one base for global and one for local layers and a sliding window of
local attention; MosaicBERT adds ALiBi (Press et al. 2022) distance biases; both gate their
feed-forward (GeGLU, Shazeer 2020).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.config import BertConfig


def attention_mask(
    input_mask: jax.Array, instance_ids: jax.Array | None = None, causal: bool = False
) -> jax.Array:
    """Which keys each query attends, as a boolean mask broadcastable to (B, A, T, S).

    Unpacked rows, (B, T) 1/0 `input_mask` -> (B, 1, 1, S): every query attends the real
    tokens. Packed rows, (B, T) `instance_ids` (1, 2, ... per instance, 0 on padding) ->
    (B, 1, T, S) block-diagonal: a token attends only its own instance, and padding attends
    nothing and is attended by nothing. `causal` ANDs in the lower triangle (B, 1, T, S):
    query t attends keys s <= t only (within its instance, when packed, since instances
    are contiguous).
    """
    if instance_ids is None:
        mask = (input_mask > 0)[:, None, None, :]  # (B, 1, 1, S)
    else:
        same = instance_ids[:, :, None] == instance_ids[:, None, :]  # (B, T, S)
        mask = (same & (instance_ids[:, None, :] > 0))[:, None]  # (B, 1, T, S)
    if causal:
        length = input_mask.shape[1]
        mask = mask & jnp.tril(jnp.ones((length, length), bool))[None, None]  # (B, 1, T, S)
    return mask


def last_token_positions(
    input_mask: jax.Array, instance_ids: jax.Array | None = None, num_instances: int = 0
) -> jax.Array:
    """Where each row's (or, packed, each instance slot's) last real token is.

    (B, T) -> (B,) positions; packed, (B, T) `instance_ids` -> (B, I) positions for the I
    slots, 0 for an empty slot. The highest real position, not the count minus one, so a
    mask need not be a prefix.
    """
    positions = jnp.arange(input_mask.shape[1])  # (T,)
    if instance_ids is None:
        return jnp.max(jnp.where(input_mask > 0, positions, 0), axis=1)  # (B,)
    slots = jnp.arange(1, num_instances + 1)  # (I,)
    in_slot = instance_ids[:, None, :] == slots[None, :, None]  # (B, I, T)
    return jnp.max(jnp.where(in_slot, positions, 0), axis=2)  # (B, I)


def attention_bias(mask: jax.Array) -> jax.Array:
    """A boolean attention mask -> the additive f32 bias: 0 where attended, -inf-ish elsewhere.

    A query that attends nothing (packed padding) gets the same bias on every key, hence
    uniform (finite) probabilities over junk it never passes on.
    """
    big_negative = jnp.finfo(jnp.float32).min
    return jnp.where(mask, 0.0, big_negative).astype(jnp.float32)


def window_mask(length: int, window: int) -> jax.Array:
    """(1, 1, T, S) bool: query i attends key j iff |i - j| <= window // 2.

    ModernBERT's sliding window (its `local_attention`, the whole width W). Token indices,
    not positions: within a packed instance they differ alike, and ANDed with the packing
    mask the window never reaches into a neighbouring instance.
    """
    index = np.arange(length)
    near = np.abs(index[:, None] - index[None, :]) <= window // 2
    return jnp.asarray(near)[None, None]


def rotary_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, ...]:
    """cos and sin, each (B or 1, T, D), of RoFormer's angles position * theta^(-2i/D).

    The D/2 frequencies are laid out twice over the head (rotate-half, not interleaved
    pairs), as GPT-NeoX and ModernBERT do; angles are f32.
    """
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # (B, T, D/2)
    angles = jnp.concatenate([angles, angles], axis=-1)  # (B, T, D)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, tables: tuple[jax.Array, ...], product_dtype=None) -> jax.Array:
    """Rotates (B, T, A, D) queries or keys by their positions' angles (`rotary_tables`).

    Dimension i pairs with i + D/2: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), so that
    a query-key product depends on the positions only through their difference.

    `product_dtype` (None: slices) forms the rotated half-swap (-x2, x1) as a product with a
    (D, D) signed permutation, x rounded to `product_dtype` (each output is one product, so
    exact in f32): on a TPU the two (.., D/2) slices of a head of 64 are each laid out in
    whole 128-lane tiles, and XLA writes them to HBM 4x padded, forward and backward.
    """
    cos, sin = (t[:, :, None, :] for t in tables)  # (B, T, 1, D)
    if product_dtype is None:
        x1, x2 = jnp.split(x, 2, axis=-1)
        rotated = jnp.concatenate([-x2, x1], axis=-1)
    else:
        swap = jnp.asarray(rotate_half_matrix(x.shape[-1]), product_dtype)
        rotated = jnp.einsum(
            "btad,de->btae", x.astype(product_dtype), swap, preferred_element_type=jnp.float32
        )
    return x * cos + rotated * sin


def rotate_half_matrix(head_dim: int) -> np.ndarray:
    """(D, D) P with x @ P = (-x2, x1), x2 the upper half of x: rotary's half-swap."""
    half = head_dim // 2
    index = np.arange(half)
    swap = np.zeros((head_dim, head_dim), np.float32)
    swap[half + index, index] = -1.0  # output i < D/2 takes -x[i + D/2]
    swap[index, half + index] = 1.0  # output i + D/2 takes x[i]
    return swap


def alibi_slopes(num_heads: int) -> np.ndarray:
    """Press et al.'s head slopes: for A a power of two, 2^(-8h/A) for h = 1..A.

    Otherwise the A' = 2^floor(log2 A) slopes of A', then the odd-numbered slopes of 2A'
    (2^(-8h/2A') for h = 1, 3, 5, ...) until there are A: the geometric sequence
    interleaved, as the paper's code extends it.
    """
    base = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * h / base) for h in range(1, base + 1)]
    extra = [2.0 ** (-8.0 * h / (2 * base)) for h in range(1, 2 * base + 1, 2)]
    return np.asarray(slopes + extra[: num_heads - base], np.float32)


def alibi_bias(positions: jax.Array, num_heads: int) -> jax.Array:
    """(B or 1, A, T, S) f32: -slope_a * |p_i - p_j|, the symmetric distance MosaicBERT uses
    for a bidirectional encoder (Press et al.'s causal form sees only j <= i)."""
    distance = jnp.abs(positions[:, :, None] - positions[:, None, :]).astype(jnp.float32)
    slopes = jnp.asarray(alibi_slopes(num_heads))[None, :, None, None]  # (1, A, 1, 1)
    return -slopes * distance[:, None]


def gated(h: jax.Array, act: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """GLU: (..., 2, F) input and gate halves -> act(input) * gate (..., F)."""
    return act(h[..., 0, :]) * h[..., 1, :]


def cudnn_mask(mask: jax.Array, queries: int, blocked: bool) -> jax.Array:
    """A boolean mask as cuDNN's fused attention takes it: (B, 1, T, S), every query row
    attending at least one key.

    cuDNN takes a mask only at full (T, S): an unpacked row's (B, 1, 1, S) padding mask is
    broadcast over the queries. A row that attends nothing (a padding query of a packed row
    or of a local block) attends its own key instead: cuDNN's backward turns an empty row
    into NaN gradients in every parameter (ModernBERT-base, window 128, T = 1,024, on an
    H200: loss finite, grads NaN; the xla path's finite), and the row's output is junk no
    real token reads. `blocked` (B n, 1, r, 3r) masks: a block's own keys are its middle r.
    """
    batch, _, _, keys = mask.shape
    mask = jnp.broadcast_to(mask, (batch, 1, queries, keys))
    offset = queries if blocked else 0
    itself = np.arange(keys)[None, :] == np.arange(queries)[:, None] + offset  # (T, S)
    empty = ~jnp.any(mask, axis=-1, keepdims=True)  # (B, 1, T, 1)
    return mask | (empty & jnp.asarray(itself))


def segment_ids(input_mask: jax.Array, instance_ids: jax.Array | None = None) -> jax.Array:
    """(B, T) int32: which instance each token is in, 0 on padding (unpacked rows: 1 for
    every real token). Blocked local attention builds its masks from these, block by block."""
    if instance_ids is None:
        return (input_mask > 0).astype(jnp.int32)
    return instance_ids.astype(jnp.int32)


def local_block_size(window: int) -> int:
    """r = W // 2 (at least 1): a query block of r tokens reaches no further than the r
    keys before and after it, so its own block and its two neighbours hold every key."""
    return max(window // 2, 1)


def query_blocks(x: jax.Array, block: int) -> jax.Array:
    """(B, T, ...) -> (B, n, r, ...), n = ceil(T / r): T padded with zeros at the end."""
    batch, length = x.shape[:2]
    count = -(-length // block)
    pad = [(0, 0), (0, count * block - length)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, pad).reshape(batch, count, block, *x.shape[2:])


def key_blocks(x: jax.Array, block: int) -> jax.Array:
    """(B, T, ...) -> (B, n, 3r, ...): query block i's keys, blocks i - 1, i and i + 1
    (zeros beyond either end), so that a local layer's scores are (n, r, 3r), not (T, T)."""
    padded = query_blocks(jnp.pad(x, [(0, 0), (block, block)] + [(0, 0)] * (x.ndim - 2)), block)
    return jnp.concatenate([padded[:, :-2], padded[:, 1:-1], padded[:, 2:]], axis=2)


def unblock(x: jax.Array, length: int) -> jax.Array:
    """(B, n, r, ...) query blocks -> (B, T, ...), the end padding dropped."""
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


def _block_indices(length: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, r) query and (n, 3r) key token indices of each block (keys may lie outside
    [0, T): those are the zero padding `key_blocks` adds)."""
    count = -(-length // block)
    queries = np.arange(count * block).reshape(count, block)
    keys = queries[:, :1] - block + np.arange(3 * block)[None]
    return queries, keys


def local_block_mask(segments: jax.Array, window: int, causal: bool = False) -> jax.Array:
    """(B, n, 1, r, 3r) bool, blocked local attention's mask built from (B, T) `segment_ids`:
    key j attends query i iff |i - j| <= W // 2, both lie in one instance and j is real
    (and j <= i when `causal`): today's `attention_mask & window_mask` on the real queries,
    without a (T, S) array. A padding query attends nothing."""
    block = local_block_size(window)
    queries, keys = _block_indices(segments.shape[1], block)
    near = np.abs(queries[:, :, None] - keys[:, None, :]) <= window // 2  # (n, r, 3r)
    if causal:
        near &= keys[:, None, :] <= queries[:, :, None]
    query_seg = query_blocks(segments, block)[..., :, None]  # (B, n, r, 1)
    key_seg = key_blocks(segments, block)[..., None, :]  # (B, n, 1, 3r), 0 beyond the row
    allowed = (query_seg == key_seg) & (key_seg > 0) & jnp.asarray(near)[None]
    return allowed[:, :, None]  # (B, n, 1, r, 3r)


def local_block_alibi(positions: jax.Array, num_heads: int, window: int) -> jax.Array:
    """(B or 1, n, A, r, 3r) f32: `alibi_bias` block by block, for blocked local attention."""
    block = local_block_size(window)
    query_pos = query_blocks(positions, block)[..., :, None]  # (B, n, r, 1)
    key_pos = key_blocks(positions, block)[..., None, :]  # (B, n, 1, 3r)
    distance = jnp.abs(query_pos - key_pos).astype(jnp.float32)[:, :, None]  # (B, n, 1, r, 3r)
    slopes = jnp.asarray(alibi_slopes(num_heads))[None, None, :, None, None]
    return -slopes * distance


class AttentionInputs(NamedTuple):
    """What a layer's attention takes besides its input: one per kind of layer.

    Global layers (and local ones given only a full mask) hold (T, S)-shaped masks and
    biases; blocked local layers hold per-block ones, told apart by the mask's rank (5).
    """

    # (B, 1, 1 or T, S) bool: which keys each query attends; blocked: (B, n, 1, r, 3r)
    mask: jax.Array
    # (B or 1, A, T, S) f32 added to the logits (ALiBi), blocked (B or 1, n, A, r, 3r), or None
    bias: jax.Array | None
    rotary: tuple[jax.Array, ...] | None  # (cos, sin) each (B or 1, T, D), or None
    # (B, T) int32 `segment_ids` (splash attention's packing and padding), or None: unknown
    segments: jax.Array | None = None


def attention_inputs(
    config: BertConfig,
    mask: jax.Array,
    positions: jax.Array,
    segments: jax.Array | None = None,
) -> tuple[AttentionInputs, AttentionInputs | None]:
    """The attention inputs of global layers and of local ones (None: every layer global).

    `mask` is `attention_mask`'s, `positions` (B or 1, T) each token's position in its
    instance: the rotary angles and ALiBi distances restart with every packed instance.
    `segments` (`segment_ids`, (B, T)) makes local layers blocked (linear in T); an
    unpacked, non-causal `mask` (B, 1, 1, S) gives them itself. Without either, local
    layers AND the window into the full (T, S) mask.
    """
    cfg = config
    bias = (
        alibi_bias(positions, cfg.num_attention_heads) if cfg.position_encoding == "alibi" else None
    )

    def rotary(theta):
        if cfg.position_encoding != "rotary":
            return None
        return rotary_tables(positions, cfg.head_dim, theta)

    if segments is None and mask.shape[2] == 1 and not cfg.causal:
        segments = mask[:, 0, 0, :].astype(jnp.int32)  # (B, S) 1 on real tokens
    global_inputs = AttentionInputs(mask, bias, rotary(cfg.rope_theta), segments)
    window = cfg.local_attention_window
    if not window:
        return global_inputs, None
    local_rotary = rotary(cfg.local_rope_theta or cfg.rope_theta)
    if segments is None:
        local_mask = mask & window_mask(positions.shape[1], window)
        return global_inputs, AttentionInputs(local_mask, bias, local_rotary)
    block_mask = local_block_mask(segments, window, cfg.causal)
    block_bias = None
    if cfg.position_encoding == "alibi":
        block_bias = local_block_alibi(positions, cfg.num_attention_heads, window)
    return global_inputs, AttentionInputs(block_mask, block_bias, local_rotary, segments)


def select(condition, if_true, if_false):
    """`if_true` where `condition` else `if_false`, leaf by leaf: decided in Python when the
    condition is a Python bool (a looped layer knows its index), by `jnp.where` when it is
    traced (a scanned layer's index is a scan input)."""
    if isinstance(condition, bool | np.bool_):
        return if_true if condition else if_false
    return jax.tree.map(lambda a, b: jnp.where(condition, a, b), if_true, if_false)


def product_dtype(dtype):
    """The dtype the backward's products multiply in, their operands rounded to `dtype`:
    `dtype` itself on an accelerator; f32 on XLA:CPU, which has no bf16 x bf16 -> f32 kernel
    for some of the backward's layouts ("Unsupported element type for DotThunk"). A product
    of two bf16 values is exact in f32, so both accumulate the same terms."""
    return jnp.float32 if jax.default_backend() == "cpu" else dtype


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def mixed_einsum(subscripts: str, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """`jnp.einsum(subscripts, a, b)` as `matmul` computes a product: both inputs cast to
    `dtype`, accumulated and returned in f32, and the backward's products `dtype` x `dtype`
    (the incoming gradient cast too), accumulated in f32. Every index of `a` must appear in
    `b` or the output, and likewise for `b` (no sum over one input's own index)."""
    return _einsum_forward(subscripts, a, b, dtype)[0]


def _einsum_forward(subscripts, a, b, dtype):
    a_c, b_c = a.astype(dtype), b.astype(dtype)
    y = jnp.einsum(subscripts, a_c, b_c, preferred_element_type=jnp.float32)
    return y, (a_c, b_c, jnp.zeros((), a.dtype), jnp.zeros((), b.dtype))


def _einsum_backward(subscripts, dtype, saved, g):
    a_c, b_c, a_type, b_type = saved
    inputs, out = subscripts.split("->")
    a_axes, b_axes = inputs.split(",")
    compute = product_dtype(dtype)
    g, a_c, b_c = g.astype(dtype).astype(compute), a_c.astype(compute), b_c.astype(compute)
    da = jnp.einsum(f"{out},{b_axes}->{a_axes}", g, b_c, preferred_element_type=jnp.float32)
    db = jnp.einsum(f"{out},{a_axes}->{b_axes}", g, a_c, preferred_element_type=jnp.float32)
    # The inputs' gradients leave in `dtype`, as jax's own transpose of the cast copies gives
    # them (rounded once from the f32 accumulation), then widen to the inputs' dtype. Left in
    # f32 (517d6a8 to issue 77), the (B, A, T, S) probabilities' gradient crossed HBM at
    # twice the bytes: BERT-Base phase 2 on v3-32 76.0 -> 78.8 ms by the TPU compiler.
    return da.astype(dtype).astype(a_type.dtype), db.astype(dtype).astype(b_type.dtype)


mixed_einsum.defvjp(_einsum_forward, _einsum_backward)
