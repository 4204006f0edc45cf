"""Splash attention (jax's Pallas TPU kernels) for global and local layers, with cost estimates.

`attention_implementation="splash"`: each layer's attention is one block-sparse flash kernel
(`jax.experimental.pallas.ops.tpu.splash_attention`), so no (T, S) score or probability array
exists: global layers under splash's `FullMask` (`CausalMask` when causal), local ones under
`LocalMask` (|i - j| <= W // 2; keys after the query dropped when causal), packed rows kept
apart by `SegmentIds` (padding is segment 0, its own: no query row is wholly masked). The
kernel runs inside `shard_map` over the mesh's batch and head axes, one example at a time
(`vmap`). Off a TPU (tests on the CPU) it runs in Pallas' interpret mode, the same kernel.

The TPU compiler's cost model prices a Pallas kernel at zero unless the kernel carries a cost
estimate, and splash attaches none: `priced` re-issues the traced kernels with the block-level
`kernel_costs` (the blocks the mask computes, K/V re-read per query block), so that the
compiler's step-time estimate (`experiments.aot_compile`) counts attention at its roofline.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.extend import core as jax_core

from bert_jax.config import BertConfig, ConfigError

LANES = 128  # splash's tiles: block sizes are multiples of the TPU's 128 lanes
SUBLANES = 8  # the key segment ids and the backward's logsumexp are 8 rows tall
F32 = 4  # bytes of the kernels' f32 side arrays (logsumexp, its derivative, segment ids)
RESIDUAL_TAG = "attend_out"  # checkpoint_name of the forward kernel's output and logsumexp


@dataclasses.dataclass(frozen=True)
class Window:
    """Which keys j a query i attends: i - left <= j <= i + right (None: unbounded)."""

    left: int | None
    right: int | None


def window_of(config: BertConfig, local: bool) -> Window:
    """A layer's window: local layers |i - j| <= W // 2, global ones everything; causal
    layers drop the keys after the query."""
    reach = config.local_attention_window // 2 if local else None
    return Window(reach, 0 if config.causal else reach)


def block_sizes(config: BertConfig, length: int, local: bool) -> tuple[int, int]:
    """(query block, key block) of a global or local layer, at most the row (T).

    Local layers take small tiles: splash computes every tile that holds one attended pair,
    so a 128-token window with 512-token tiles computes as much as a global layer."""
    if local:
        return (min(config.splash_local_block, length),) * 2
    return min(config.splash_block_q, length), min(config.splash_block_kv, length)


def active_blocks(length: int, block_q: int, block_kv: int, window: Window) -> int:
    """How many (query block, key block) tiles hold an attended pair under `window`: the
    tiles splash computes (it skips the others and does not fetch their keys)."""
    count = 0
    for i in range(length // block_q):
        first_q, last_q = i * block_q, (i + 1) * block_q - 1
        for j in range(length // block_kv):
            first_k, last_k = j * block_kv, (j + 1) * block_kv - 1
            # j - i over the tile spans [first_k - last_q, last_k - first_q].
            reaches_back = window.left is None or last_k - first_q >= -window.left
            reaches_ahead = window.right is None or first_k - last_q <= window.right
            count += reaches_back and reaches_ahead
    return count


def kernel_costs(
    length: int,
    heads: int,
    head_dim: int,
    block_q: int,
    block_kv: int,
    window: Window,
    itemsize,
    fused: bool = False,
) -> dict[str, pl.CostEstimate]:
    """Block-level cost of splash's three kernels for one example of `heads` heads.

    Per computed tile (bq x bkv) and head: the forward's two products (q k^T, p v), 4 bq bkv
    D FLOPs and bq bkv exps; the dq kernel recomputes q k^T and p, then dp = do v^T and
    dq = ds k (6 bq bkv D); the dk/dv kernel recomputes q k^T and p, then dv = p^T do,
    dp, dk = ds^T q (8 bq bkv D). Bytes: what each kernel reads and writes in HBM. The
    forward and dq kernels hold a query tile and fetch the key and value tiles of each
    computed tile; the dk/dv kernel holds a key tile and fetches q, do, logsumexp and its
    derivative per computed tile. Query segment ids are laid out (T, 128) int32, key ones
    (8, T), the forward's logsumexp (T, 128) f32 and the backward's (8, T): splash's layouts.

    `fused`: one backward kernel (splash's `use_fused_bwd_kernel`), the dk/dv kernel also
    computing dq = ds k (10 bq bkv D a tile, the probabilities recomputed once): it writes a
    (bq, D) partial dq at every (key tile, query tile) of its grid, computed or not, which
    XLA then sums over the key tiles; there is no dq kernel ("dq" is then unused).
    """
    tiles = active_blocks(length, block_q, block_kv, window)
    pairs, seq = tiles * block_q * block_kv, length * head_dim * itemsize  # one (T, D) array
    kv_tiles = tiles * block_kv * head_dim * itemsize  # one of K or V, fetched per tile
    q_tiles = tiles * block_q * head_dim * itemsize  # one of q or do, fetched per tile
    segments = length * LANES * F32 + tiles * SUBLANES * block_kv * F32
    forward = 2 * seq + 2 * kv_tiles + length * LANES * F32 + segments  # q, o; k, v; lse
    dq = 3 * seq + 2 * kv_tiles + 2 * length * SUBLANES * F32 + segments  # q, do, dq; lse, di
    dkv = (
        4 * seq  # k, v, dk, dv
        + 2 * q_tiles  # q, do per tile
        + 2 * tiles * SUBLANES * block_q * F32  # lse, di per tile
        + tiles * block_q * LANES * F32  # query segment ids per tile
        + length * SUBLANES * F32  # key segment ids
    )

    def estimate(products, nbytes):
        return pl.CostEstimate(
            flops=heads * 2 * products * pairs * head_dim,
            transcendentals=heads * pairs,
            bytes_accessed=heads * nbytes,
        )

    if fused:  # + the partial dq of each (key tile, query tile): T / bkv arrays of (T, D)
        return {"fwd": estimate(2, forward), "dkv": estimate(5, dkv + length // block_kv * seq)}
    return {"fwd": estimate(2, forward), "dq": estimate(3, dq), "dkv": estimate(4, dkv)}


def kernel_kind(name: str) -> str | None:
    """Which of splash's kernels a pallas_call's name is (`splash_mha_fwd...`, `_dq`, `_dkv`)."""
    for kind in ("dkv", "dq", "fwd"):
        if f"_{kind}" in name:
            return kind
    return None


def _is_lane_slice(eqn, lane_wide: set) -> bool:
    """Whether `eqn` is splash's `logsumexp[..., 0]`: lane 0 of a forward kernel's (A, T, 128)
    logsumexp (`slice` to width 1 on the last axis, then a `squeeze`)."""
    if eqn.primitive.name != "slice" or eqn.invars[0] not in lane_wide:
        return False
    shape = eqn.invars[0].aval.shape
    return (
        not any(eqn.params["start_indices"])
        and tuple(eqn.params["limit_indices"]) == (*shape[:-1], 1)
        and eqn.params["strides"] is None
    )


def _lane_reduced(eqn) -> list:
    """`eqn` (`_is_lane_slice`) as a max over the lanes, kept (A, T, 1): the kernel writes the
    same value to all 128 (its running max and sum are lane-broadcast), so the max is lane 0,
    and XLA reads the array once, where for the slice it copied it whole to put T minor first
    (0.9 GB a layer at 72 rows of 1,024 on a v4, docs/tpu_modernbert.md)."""
    (x,), (out,) = eqn.invars, eqn.outvars
    last = len(x.aval.shape) - 1
    row = jax_core.Var(x.aval.update(shape=x.aval.shape[:-1]))
    reduce = jax_core.new_jaxpr_eqn(
        [x], [row], jax.lax.reduce_max_p, {"axes": (last,)}, set(), eqn.source_info, eqn.ctx
    )
    keep = {"shape": out.aval.shape, "broadcast_dimensions": tuple(range(last)), "sharding": None}
    widen = jax_core.new_jaxpr_eqn(
        [row], [out], jax.lax.broadcast_in_dim_p, keep, set(), eqn.source_info, eqn.ctx
    )
    return [reduce, widen]


def _repriced_jaxpr(jaxpr, costs: dict[str, pl.CostEstimate]):
    """`jaxpr` with each splash pallas_call carrying `costs[kind]`, nested jaxprs included,
    and the forward's logsumexp read from its lanes by a max (`_lane_reduced`)."""
    eqns, lane_wide = [], set()
    for eqn in jaxpr.eqns:
        if _is_lane_slice(eqn, lane_wide):
            eqns += _lane_reduced(eqn)
            continue
        params = dict(eqn.params)
        if eqn.primitive.name == "pallas_call":
            kind = kernel_kind(str(params.get("name", "")))
            if kind is not None:
                params["cost_estimate"] = costs[kind]
            lse = eqn.outvars[-1]
            if kind == "fwd" and lse.aval.ndim == 3 and lse.aval.shape[-1] == LANES:
                lane_wide.add(lse)
        for key, value in params.items():
            if isinstance(value, jax_core.ClosedJaxpr):
                params[key] = value.replace(jaxpr=_repriced_jaxpr(value.jaxpr, costs))
            elif isinstance(value, jax_core.Jaxpr):
                params[key] = _repriced_jaxpr(value, costs)
        eqns.append(eqn.replace(params=params))
    return jaxpr.replace(eqns=eqns)


def _repriced(fn, costs):
    """`fn` (arrays in, a pytree of arrays out) traced once, its splash kernels re-priced.

    jax offers no hook to give a library's pallas_call a cost estimate, and splash passes
    none; the kernels are rewritten in the traced program instead (their `cost_estimate`
    parameter), nothing in splash or jax is patched."""

    def wrapped(*args):
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        closed = closed.replace(jaxpr=_repriced_jaxpr(closed.jaxpr, costs))
        out = jax_core.jaxpr_as_fun(closed)(*jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(shape), out)

    return wrapped


def _no_cotangent(x):
    """The zero cotangent of a non-differentiated input (integer arrays take float0)."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


def priced(costs: dict[str, pl.CostEstimate]):
    """One example's splash call (kernel, q, k, v (A, T, D), q and kv segment ids (T,)) ->
    (A, T, D), its forward and backward kernels carrying `costs` (`kernel_costs`).

    The kernel (its mask's block tables) is an argument, not a closure: a scanned layer's
    cond traces the backward again, after the trace that built the kernel has ended."""

    def run(kernel, q, k, v, q_ids, kv_ids):
        return kernel(q, k, v, segment_ids=splash.SegmentIds(q_ids, kv_ids))

    @jax.custom_vjp
    def attend(kernel, q, k, v, q_ids, kv_ids):
        return _repriced(run, costs)(kernel, q, k, v, q_ids, kv_ids)

    def forward(kernel, q, k, v, q_ids, kv_ids):
        def with_pullback(kernel, q, k, v, q_ids, kv_ids):
            return jax.vjp(lambda *qkv: run(kernel, *qkv, q_ids, kv_ids), q, k, v)

        out, pullback = _repriced(with_pullback, costs)(kernel, q, k, v, q_ids, kv_ids)
        return out, (pullback, kernel, q_ids, kv_ids)

    def backward(saved, g):
        pullback, kernel, q_ids, kv_ids = saved
        dq, dk, dv = _repriced(lambda p, g: p(g), costs)(pullback, g)
        kernel, q_ids, kv_ids = jax.tree.map(_no_cotangent, (kernel, q_ids, kv_ids))
        return kernel, dq, dk, dv, q_ids, kv_ids

    attend.defvjp(forward, backward)
    return attend


def splash_mask(length: int, window: Window):
    """splash's mask object for a (T, T) attention under `window`."""
    shape = (length, length)
    if window.left is None and window.right is None:
        return splash.FullMask(shape)
    if window.left is None and window.right == 0:
        return splash.CausalMask(shape)
    if window.left is None or window.right is None:
        raise ValueError(f"no splash mask for {window}")
    return splash.LocalMask(shape, window_size=(window.left, window.right), offset=0)


def _platform() -> str:
    """The platform the program is built for: the ambient mesh's devices' (an ahead-of-time
    TPU compile on a CPU host), else JAX's default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else mesh.abstract_device
    return device.platform if device is not None else jax.default_backend()


def _kernel(length, heads, window, block_q, block_kv, interpret, fused=False):
    """splash's kernel for `heads` heads (a pytree: its mask's block tables); `fused`: one
    backward kernel for dq, dk and dv."""
    sizes = splash.BlockSizes(
        block_q=block_q,
        block_kv=block_kv,
        block_kv_compute=block_kv,
        block_q_dkv=block_q,
        block_kv_dkv=block_kv,
        block_kv_dkv_compute=block_kv,
        block_q_dq=None if fused else block_q,
        block_kv_dq=None if fused else block_kv,
        use_fused_bwd_kernel=fused,
        # q, k, v handed over (A, D, T), T minor: laid out (A, T, D), a head of 64 fills its
        # 128-lane tiles half, and the arrays XLA writes for the kernels are 2x their bytes
        q_layout=splash.QKVLayout.SEQ_MINOR,
        k_layout=splash.QKVLayout.SEQ_MINOR,
        v_layout=splash.QKVLayout.SEQ_MINOR,
    )
    mask = splash.MultiHeadMask([splash_mask(length, window)] * heads)
    return splash.make_splash_mha(
        mask,
        block_sizes=sizes,
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
        # the forward's output and logsumexp, what its backward reads: a remat policy that
        # keeps them (`save_attend_qkv_out`) spares the backward pass the forward kernel
        residual_checkpoint_name=RESIDUAL_TAG,
    )


def attention(
    config: BertConfig, q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, local: bool
) -> jax.Array:
    """(B, T, A, D) scaled q, k, v and (B, T) segment ids (0 on padding) -> (B, T, A, D)."""
    cfg = config
    length = q.shape[1]
    block_q, block_kv = block_sizes(cfg, length, local)
    if length % block_q or length % block_kv:
        raise ConfigError(
            f"attention_implementation='splash' needs the sequence length {length} to be a "
            f"multiple of its splash tiles {block_q} x {block_kv} (config splash_block_q, "
            f"splash_block_kv, splash_local_block)"
        )
    window = window_of(cfg, local)
    interpret = _platform() != "tpu"
    dtype = jnp.dtype(cfg.dtype)

    def shard(q, k, v, segments):  # this device's (b, T, a, D) and (b, T)
        heads = q.shape[2]
        fused = cfg.splash_fused_backward
        kernel = _kernel(length, heads, window, block_q, block_kv, interpret, fused)
        costs = kernel_costs(
            length, heads, q.shape[3], block_q, block_kv, window, dtype.itemsize, fused
        )
        one = jax.vmap(priced(costs), in_axes=(None, 0, 0, 0, 0, 0))
        heads_first = [jnp.swapaxes(y.astype(dtype), 1, 2) for y in (q, k, v)]  # (b, a, T, D)
        out = one(kernel, *heads_first, segments, segments)
        return jnp.swapaxes(out, 1, 2)  # (b, T, a, D)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return shard(q, k, v, segments)
    spec = nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"))
    rows = jax.sharding.PartitionSpec(spec[0], spec[1])
    return jax.shard_map(
        shard, mesh=mesh, in_specs=(spec, spec, spec, rows), out_specs=spec, check_vma=False
    )(q, k, v, segments)
