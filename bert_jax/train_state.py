"""The train state, the one way to build it sharded, and the one optimizer-update tail.

Pretraining, fine-tuning and distillation all train a `TrainState`. It is built by
`sharded_state`: `jax.eval_shape` of the model's init finds every leaf's shape and logical
axis names without allocating anything, the rule table turns the names into shardings, and
a jitted init writes each shard straight onto its devices (params born sharded). The same
abstract state (`state_shardings`) is the restore target of a checkpoint and what the
ahead-of-time check compiles.

Each job writes only its loss; `make_step` turns it into the pure train step
`(state, batch, rng, *args) -> (state, metrics)` with the same update, the same health
metrics and so the same non-finite checks (`nonfinite`) everywhere; the pretraining loop also
stops at a param or update norm that jumps by orders of magnitude (`StepHealth`).
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import sharding

# jax's PRNG implementations a run's dropout masks may come from (`config.prng_impl`).
# threefry2x32 is jax's default: the same bits on every backend and mesh. rbg and unsafe_rbg
# draw bits with XLA's RngBitGenerator, cheaper per bit than threefry's integer hashing,
# but the bits may change with the sharding and the XLA version; unsafe_rbg also derives
# split and fold_in keys with it (faster, statistically less vetted). Under a sharded jit
# the TPU compiler (libtpu 0.0.42.1) does not split RngBitGenerator: every core draws the
# whole global array, so on a data-parallel TPU step rbg costs more than it saves
# (docs/tpu_estimates.md, "Dropout masks").
PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def run_keys(seed: int, prng_impl: str = "threefry2x32") -> tuple[jax.Array, jax.Array]:
    """(init key, dropout key) of a run with `seed`; the step folds its number into the latter.

    Both come from one threefry2x32 key split in two, so a seed's initial weights are the
    same under every `prng_impl` and on every mesh: the implementation is a choice for the
    per-step dropout masks only. The dropout key is that stream's key itself under
    threefry2x32, else a `prng_impl` key whose data are bits drawn from it.
    """
    if prng_impl not in PRNG_IMPLS:
        raise ValueError(f"config.prng_impl must be one of {PRNG_IMPLS}, got {prng_impl!r}")
    init_rng, dropout_rng = jax.random.split(jax.random.key(seed))
    if prng_impl != "threefry2x32":
        # rbg keys hold 4 uint32 words (threefry's 2): draw as many as the impl's key has.
        data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=prng_impl)))
        bits = jax.random.bits(dropout_rng, data.shape, data.dtype)
        dropout_rng = jax.random.wrap_key_data(bits, impl=prng_impl)
    return init_rng, dropout_rng


class TrainState(flax.struct.PyTreeNode):
    step: jax.Array  # optimizer updates taken (pretraining: micro-batches)
    params: Any
    opt_state: Any


def _boxed_state(model: nn.Module, tx: optax.GradientTransformation, inputs, rng) -> TrainState:
    """A fresh state; params and optimizer moments keep the model's axis-name boxes."""
    params = model.init(rng, *inputs)["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def state_shardings(
    model: nn.Module,
    tx: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    inputs: Sequence[jax.Array],
    rules=sharding.DEFAULT_RULES,
    shard_update: bool = False,
    spread: bool = False,
) -> tuple[TrainState, TrainState]:
    """(abstract unboxed state, its shardings) without allocating anything.

    Args:
        inputs: example positional inputs of `model` (one example will do: the params'
            shapes do not depend on the batch).
        shard_update: store the params and optimizer state split over the data-parallel
            devices as well (`sharding.update_sharding`); the step then gathers the params
            to the shardings it returns without (`make_step`'s `layout`).
        spread: with `shard_update`, leaves no dimension of which divides by all the
            data-parallel axes are split over several dimensions (`sharding.update_sharding`).
    """
    abstract = jax.eval_shape(functools.partial(_boxed_state, model, tx, inputs), jax.random.key(0))
    unboxed, shardings = nn.unbox(abstract), nn.unbox(sharding.shardings_of(abstract, mesh, rules))
    if shard_update:
        shardings = sharding.update_shardings(unboxed, shardings, rules, spread)
    check_divisible(unboxed, shardings, mesh)
    return unboxed, shardings


def check_divisible(abstract, shardings, mesh: jax.sharding.Mesh) -> None:
    """Refuses a mesh that cannot split a weight as its sharding says (jax's
    `IndivisibleError` at the compile names no key), naming the weight, its shape and the
    mesh axes, before anything compiles.

    Raises:
        ConfigError: naming `mesh_shape`, the weight and the dimension.
    """
    from bert_jax.config import ConfigError

    bad = []

    def check(path, leaf, placed):
        spec = getattr(placed, "spec", None) or ()
        for dim, axes in enumerate(spec[: len(leaf.shape)]):
            names = axes if isinstance(axes, tuple) else (axes,) if axes else ()
            parts = math.prod(mesh.shape[a] for a in names)
            if names and leaf.shape[dim] % parts:
                bad.append((path, leaf.shape, dim, names, parts))

    jax.tree_util.tree_map_with_path(check, abstract, shardings)
    if bad:
        path, shape, dim, names, parts = bad[0]
        name = "/".join(
            str(next((getattr(k, a) for a in ("name", "key", "idx") if hasattr(k, a)), k))
            for k in path
        )
        raise ConfigError(
            f"--config.mesh_shape={tuple(mesh.devices.shape)} cannot split {name} (shape "
            f"{tuple(shape)}): its dimension {dim} of {shape[dim]} over mesh axes "
            f"{'x'.join(names)} = {parts} devices ({len(bad)} weight(s) alike); choose a "
            "mesh whose axes divide it"
        )


def sharded_state(
    model: nn.Module,
    tx: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    inputs: Sequence[jax.Array],
    *,
    rng: jax.Array | None = None,
    params: Any = None,
    rules=sharding.DEFAULT_RULES,
    shard_update: bool = False,
    spread: bool = False,
) -> tuple[TrainState, TrainState]:
    """(a train state at step 0 born sharded on `mesh`, its shardings).

    Args:
        inputs: example positional inputs of `model` (see `state_shardings`).
        rng: initialises the params with `model.init` (give `rng` or `params`).
        params: the params to start from instead (host or device arrays in the model's
            structure, e.g. a pretrained encoder under a fresh head). They are copied, never
            donated: the caller's arrays stay valid (a second run can start from them).
        shard_update, spread: born in the sharded weight update's layout (`state_shardings`).

    The optimizer state is fresh. A frozen model (a distillation teacher) is placed with
    `optax.identity()`: its params are sharded exactly as a trained model's would be.
    """
    if (rng is None) == (params is None):
        raise ValueError("sharded_state takes one of rng and params")
    _, shardings = state_shardings(model, tx, mesh, inputs, rules, shard_update, spread)
    if rng is not None:
        # No ambient mesh here: flax would then constrain DenseGeneral's flat (pre-reshape)
        # kernels with the full-rank names; `out_shardings` already places every leaf.
        init = functools.partial(_boxed_state, model, tx, inputs)
        return jax.jit(lambda r: nn.unbox(init(r)), out_shardings=shardings)(rng), shardings
    expected = jax.tree.structure(shardings.params)
    if jax.tree.structure(params) != expected:
        raise ValueError(
            f"params do not have the structure of {type(model).__name__}: "
            f"{jax.tree.structure(params)} vs {expected}"
        )
    # Device arrays are copied first: `device_put` may hand back their own buffers (a shard
    # already on its device), which the donation below would free under the caller.
    params = jax.tree.map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x, params)
    init = jax.jit(
        lambda p: TrainState(jnp.zeros((), jnp.int32), p, tx.init(p)),
        out_shardings=shardings,
        donate_argnums=0,
    )
    return init(jax.device_put(params, shardings.params)), shardings


class UpdateLayout(NamedTuple):
    """The params' two placements under the sharded weight update."""

    compute: Any  # shardings the forward and backward passes read them in (the rule table's)
    update: Any  # shardings they are stored, updated and checkpointed in (split over data)
    # With `config.shard_weight_update_explicit_gather`: the model's compute dtype, which the
    # matmul kernels are gathered in by an explicit all-gather (`gather_params`). None: the
    # params are gathered as stored, by a sharding constraint.
    gather_dtype: Any = None


def gather_params(params: Any, layout: UpdateLayout) -> Any:
    """`params` as the forward and backward passes read them: gathered to `layout.compute`.

    Without `layout.gather_dtype` they are gathered as stored (f32) by a sharding
    constraint, and the model casts its matmul kernels to its compute dtype. With it, each
    matmul kernel split over data-parallel devices is cast to that dtype on its shard and
    gathered by an explicit all-gather (`_gather_kernel`), which is the value the model's
    own cast makes of the gathered f32 kernel: the same forward and backward passes, bit
    for bit. Which is faster depends on the slice (docs/tpu_estimates.md, "Collectives"): on v3-128
    the compiler lowers a 64-way gather to an all-reduce of the kernel zero-padded from
    its shard, and given only the constraint it pads in f32 before it converts. Gradients
    stay f32 either way (`bert_jax.model.matmul`) and go back to `layout.update`.
    """
    if layout.gather_dtype is None:
        return jax.lax.with_sharding_constraint(params, layout.compute)

    def gather(path, x, compute, update):
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        split = _data_split(compute, update)
        if not names or names[-1] != "kernel" or split is None:
            return jax.lax.with_sharding_constraint(x, compute)
        return _gather_kernel(x, compute, update, *split, layout.gather_dtype)

    return jax.tree_util.tree_map_with_path(gather, params, layout.compute, layout.update)


def _data_split(compute, update) -> tuple[int, tuple[str, ...]] | None:
    """(dimension, mesh axes) the update sharding splits a leaf over beyond its compute
    sharding (`sharding.update_sharding`: the axes follow the compute ones on that
    dimension), or None when it adds none or spreads them over several dimensions."""
    spec = list(compute.spec) + [None] * (len(update.spec) - len(compute.spec))
    extra = [
        (dim, tuple(a for a in sharding.axis_names(entry) if a not in sharding.axis_names(c)))
        for dim, (entry, c) in enumerate(zip(update.spec, spec, strict=True))
    ]
    extra = [(dim, axes) for dim, axes in extra if axes]
    return extra[0] if len(extra) == 1 else None


def _gather_kernel(x, compute, update, dim: int, axes: tuple[str, ...], dtype):
    """`x` (f32, placed by `update`) as its `compute` placement: each shard cast to `dtype`,
    all-gathered over `axes` along `dim`, and cast back (exactly: the model casts it to
    `dtype` again). Its gradient is put back to `update` as the constraint's is."""
    gather = jax.shard_map(
        lambda shard: jax.lax.all_gather(shard.astype(dtype), axes, axis=dim, tiled=True),
        mesh=compute.mesh,
        in_specs=update.spec,
        out_specs=compute.spec,
        check_vma=False,
    )

    @jax.custom_vjp
    def gathered(x):
        return gather(x).astype(x.dtype)

    def forward(x):
        return gathered(x), None

    def backward(_, grad):
        return (jax.lax.with_sharding_constraint(grad, update),)

    gathered.defvjp(forward, backward)
    return gathered(x)


def cast_kernels(params: Any, dtype) -> Any:
    """`params` with every matmul kernel (a leaf named "kernel") cast to `dtype`.

    What the bf16 gradient reduction (`make_step`'s `grad_reduce_dtype`) reads: the model
    multiplies its kernels in its compute dtype anyway, so with that dtype the passes compute
    the same values; but the kernel gradient now leaves its product in `dtype`
    (`bert_jax.model.matmul` returns it in the kernel's dtype), which is where the compiler
    sums it over the data-parallel devices: a bf16 all-reduce (or reduce-scatter) of half
    the bytes. The cast's transpose puts the sum back in f32 for the update. Embedding
    tables, LayerNorm and biases (~10% of BERT-Large's weights) are read, and summed, in f32.
    """

    def cast(path, x):
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return x.astype(dtype) if names and names[-1] == "kernel" else x

    return jax.tree_util.tree_map_with_path(cast, params)


def global_norm(tree) -> jax.Array:
    return optax.tree_utils.tree_norm(tree)


def make_step(
    loss_fn: Callable[..., tuple[jax.Array, dict[str, jax.Array]]],
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    accum_steps: int = 1,
    layout: UpdateLayout | None = None,
    grad_reduce_dtype=None,
) -> Callable[..., tuple[TrainState, dict[str, jax.Array]]]:
    """The pure train step of `loss_fn`: `(state, batch, rng, *args) -> (state, metrics)`.

    Args:
        loss_fn: `(params, batch, dropout_rng, *args) -> (loss, metrics)`; differentiated
            with respect to `params` only (`args`, e.g. a frozen teacher's params, never
            receive a gradient).
        accum_steps: micro-batches per optimizer update (`optim.make_optimizer`'s
            accumulation): the learning rate is read at `state.step // accum_steps`.
        layout: for a state stored with the sharded weight update (`state_shardings(
            shard_update=True)`): the step gathers the f32 params to `layout.compute` for
            the forward and backward passes and puts the gradients back to
            `layout.update`, where the params live (summed over the devices into the
            shards), so the clipping, the update and the norms each run on 1/N of every
            split leaf. The math is the replicated step's.
        grad_reduce_dtype: None, or the dtype (bf16) the matmul kernels' gradients are summed
            over the data-parallel devices in (MLPerf BERT's `reduce_gradients_in_bf16`;
            `cast_kernels`). None: every gradient is summed in f32.

    Dropout randomness is `fold_in(rng, state.step)`, so a resumed run repeats the
    uninterrupted one exactly. The metrics are `loss_fn`'s plus the learning rate and the
    global norms of the gradients, the new params and the update (`nonfinite` checks them).
    """

    def objective(params, *args):
        if layout is not None:
            params = gather_params(params, layout)
        if grad_reduce_dtype is not None:
            params = cast_kernels(params, grad_reduce_dtype)
        return loss_fn(params, *args)

    def train_step(state: TrainState, batch, rng, *args):
        dropout_rng = jax.random.fold_in(rng, state.step)
        grad_fn = jax.value_and_grad(objective, has_aux=True)
        (loss, metrics), grads = grad_fn(state.params, batch, dropout_rng, *args)
        if layout is not None:  # summed over the devices into the shards
            grads = jax.lax.with_sharding_constraint(grads, layout.update)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss} | metrics
        metrics |= {
            "learning_rate": schedule(state.step // accum_steps),
            "grad_norm": global_norm(grads),
            "param_norm": global_norm(params),
            "update_norm": global_norm(updates),
        }
        return TrainState(state.step + 1, params, opt_state), metrics

    return train_step


# A finite loss can hide NaN params (e.g. Adam's 0/0 on a never-used weight).
HEALTH_KEYS = ("loss", "grad_norm", "param_norm")
# Norms that no healthy step multiplies by orders of magnitude: a diverging learning rate
# first shows there (a tiny BERT's param norm 43 -> 1e6 in one step at lr 1e3) while the loss
# is still finite, and a state saved after such a jump goes non-finite when resumed even at a
# sane rate. The gradient norm is not among them: a loss spike may legitimately multiply it.
NORM_KEYS = ("param_norm", "update_norm")
# "Many orders of magnitude": 1000x the running median. Warmup's update norms grow by the
# learning rate's ratio between steps (2x at most after its first), a run's param norm a few
# times over all of training.
NORM_JUMP = 1e3
NORM_WINDOW = 20  # steps in each norm's running median


def nonfinite(metrics: dict) -> str:
    """'loss nan, grad_norm inf' for the health metrics of one step that are not finite;
    '' when all are."""
    return ", ".join(f"{k} {metrics[k]}" for k in HEALTH_KEYS if not np.isfinite(metrics[k]))


class StepHealth:
    """The pretraining loop's check of each step's metrics, in step order: non-finite health
    metrics (`nonfinite`), or a param or update norm above `NORM_JUMP` times its median over
    the last `NORM_WINDOW` healthy steps. Either stops the run (or rolls it back,
    `bert_jax.rollback`) before a checkpoint holds such a state."""

    def __init__(self, jump: float = NORM_JUMP, window: int = NORM_WINDOW):
        self.jump = jump
        self._norms = {k: collections.deque(maxlen=window) for k in NORM_KEYS}

    def check(self, metrics: dict) -> str:
        """Why the step with `metrics` is unhealthy ('non-finite loss nan', 'param_norm 1.1e+06
        above 1000 x 42.7, the median of the last 1 steps'), '' if it is healthy (its norms then
        join the medians).

        An update norm of 0 (a warmup's first step at rate 0, a gradient-accumulation
        micro-step) is no update: it neither joins the median nor is judged against it.
        """
        bad = nonfinite(metrics)
        if bad:
            return f"non-finite {bad}"
        values = {k: float(metrics[k]) for k in NORM_KEYS if k in metrics}
        jumps = []
        for key, value in values.items():
            window = self._norms[key]
            median = float(np.median(window)) if window else 0.0
            if window and value > self.jump * median:
                jumps.append(
                    f"{key} {value:.4g} above {self.jump:g} x {median:.4g}, the median of the "
                    f"last {len(window)} steps"
                )
        if jumps:
            return "; ".join(jumps)
        for key, value in values.items():
            if value > 0:
                self._norms[key].append(value)
        return ""
