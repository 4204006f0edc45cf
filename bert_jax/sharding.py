"""The device mesh and the logical-axis rule table that places arrays on it.

The model names its axes (`batch length embed heads kv mlp vocab layers`); this module
maps those names onto a `('data', 'fsdp', 'tensor')` mesh. Switching between data
parallelism, FSDP and tensor parallelism is a change of mesh shape and, where the default
table does not say what is wanted, of `config.sharding_rules` in the experiment config:
never a change of model code. The batch of every step is placed by the table's `batch`
rule too.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax.mesh_shape import MESH_AXES, resolve_mesh_shape

# Logical axis -> mesh axes, in priority order. An axis whose mesh axes are already taken
# by an earlier dimension of the same array stays unsharded (flax's rule), so activations
# `(batch, length, embed)` shard batch over data+fsdp and leave embed whole, while the
# parameters' `embed` dimension is split over fsdp (ZeRO-3 style).
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("length", None),
    ("kv", None),
    ("layers", None),
)


def axis_names(entry) -> tuple[str, ...]:
    """A rule's or a PartitionSpec entry's mesh axes (None, one name, or several) as a tuple."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def rules_of(config) -> tuple[tuple[str, Any], ...]:
    """The rule table of an experiment config: `config.sharding_rules`, else DEFAULT_RULES.

    The config lists (logical axis, mesh axes) pairs as DEFAULT_RULES does; the mesh axes
    are one name, a sequence of names or None. A name that is no mesh axis is refused,
    naming the entry.
    """
    table = config.get("sharding_rules")
    if table is None:
        return DEFAULT_RULES
    rules = []
    for logical, axes in table:
        if axes is not None and not isinstance(axes, str):
            axes = tuple(axes)
        if not set(axis_names(axes)) <= set(MESH_AXES):
            raise ValueError(
                f"config.sharding_rules: {logical!r} -> {axes!r} names no mesh axis of {MESH_AXES}"
            )
        rules.append((logical, axes))
    return tuple(rules)


def create_mesh(mesh_shape: Sequence[int] = (-1, 1, 1), devices=None) -> Mesh:
    """A `('data', 'fsdp', 'tensor')` mesh over `devices` (default: all), -1 fills the rest."""
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(mesh_shape, len(devices))
    try:  # topology-aware placement on TPU/GPU; it refuses some shapes on CPU
        device_array = mesh_utils.create_device_mesh(shape, devices)
    except (ValueError, NotImplementedError, AssertionError):
        device_array = np.asarray(devices).reshape(shape)
    return Mesh(device_array, MESH_AXES)


def logical_to_shardings(logical_specs: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """A tree of logical `PartitionSpec`s -> a tree of `NamedSharding`s on `mesh`."""
    return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def shardings_of(abstract_variables: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """Shardings for a (boxed, possibly abstract) variable tree from `nn.Partitioned` names.

    Leaves without axis names (e.g. an optimizer step counter) are replicated.
    """
    specs = nn.get_partition_spec(abstract_variables)
    return logical_to_shardings(specs, mesh, rules)


@contextlib.contextmanager
def activation_context(mesh: Mesh, rules=DEFAULT_RULES):
    """The ambient mesh and rules under which the model's activation constraints apply."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        yield


def batch_sharding(mesh: Mesh, rules=DEFAULT_RULES) -> NamedSharding:
    """Where the examples of a batch go: the `batch` rule (by default over data x fsdp,
    replicated over tensor)."""
    return logical_to_shardings(PartitionSpec("batch"), mesh, rules)


def global_batch(
    local_batch: dict[str, np.ndarray], mesh: Mesh, rules=DEFAULT_RULES
) -> dict[str, jax.Array]:
    """This host's slice of a batch -> global `jax.Array`s placed by the `batch` rule."""
    sharding = batch_sharding(mesh, rules)
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
        for k, v in local_batch.items()
    }


def process_rows(mesh: Mesh, batch_size: int, rules=DEFAULT_RULES) -> slice:
    """The rows of a global batch of `batch_size` that this process's devices hold under the
    `batch` rule: the slice of it this process gives `global_batch`.

    Raises:
        ValueError: the devices hold no one contiguous share (a mesh whose data axes do
            not split along the processes).
    """
    spans = batch_sharding(mesh, rules).addressable_devices_indices_map((batch_size,))
    starts = [index[0].start or 0 for index in spans.values()]
    stops = [batch_size if index[0].stop is None else index[0].stop for index in spans.values()]
    rows = slice(min(starts), max(stops))
    if rows.stop - rows.start != batch_size // jax.process_count():
        raise ValueError(f"process {jax.process_index()}'s devices hold rows {spans} of the "
                         "batch, not one contiguous share: use a mesh whose data axes split "
                         "along the processes")  # fmt: skip
    return rows


# --- the sharded weight update --------------------------------------------------------------


def data_parallel_axes(mesh: Mesh, rules=DEFAULT_RULES) -> tuple[str, ...]:
    """The mesh axes the `batch` rule splits the examples over (size > 1): the devices that
    hold the same weights and different examples."""
    return tuple(a for a in axis_names(dict(rules).get("batch")) if mesh.shape[a] > 1)


def update_sharding(
    shape: Sequence[int], compute: NamedSharding, rules=DEFAULT_RULES, spread: bool = False
) -> NamedSharding:
    """Where one leaf of the train state lives under the sharded weight update.

    The leaf keeps its compute sharding (`compute`, from the rule table) and is split, in
    addition, over the data-parallel axes it is not split over yet (Xu et al. 2020's
    weight-update sharding; MaxText's `shard_optimizer_over_data`): all of them along its
    largest dimension that divides evenly. A leaf no dimension of which divides by all of
    them stays replicated over them; with `spread` (`config.shard_weight_update_spread`) the
    axes go to different dimensions instead, or the leaf is split over as many of them as
    divide (a mesh of `data x fsdp` used as 2,048 data-parallel cores splits BERT-Large's
    1024 x 1024 kernels 64 x 32 ways): less memory, but on TPU v3 a slower step by the
    compiler's estimate (docs/tpu_estimates.md, "LAMB on 2,048 cores").
    """
    mesh = compute.mesh
    spec = list(compute.spec) + [None] * (len(shape) - len(compute.spec))
    used = {a for entry in spec for a in axis_names(entry)}
    free = tuple(a for a in data_parallel_axes(mesh, rules) if a not in used)
    if math.prod(mesh.shape[a] for a in free) == 1:
        return compute
    split = [math.prod(mesh.shape[a] for a in axis_names(entry)) for entry in spec]
    # Every assignment of each free axis to a dimension (or to none; without `spread`, all to
    # one dimension), largest dimension first; the first of those that split the leaf most
    # ways over the fewest dimensions.
    dims = sorted(range(len(shape)), key=lambda d: -shape[d])
    best, best_key = None, (1, 0)
    choices = itertools.product([None, *dims], repeat=len(free))
    if not spread:  # all the axes along one dimension, or none
        choices = [(d,) * len(free) for d in dims]
    for choice in choices:
        ways = [1] * len(shape)
        for axis, dim in zip(free, choice, strict=True):
            if dim is not None:
                ways[dim] *= mesh.shape[axis]
        if any(shape[d] % (split[d] * ways[d]) for d in range(len(shape))):
            continue
        key = (math.prod(ways), -len({d for d in choice if d is not None}))
        if key > best_key:
            best, best_key = choice, key
    if best is None:
        return compute
    for axis, dim in zip(free, best, strict=True):
        if dim is not None:
            spec[dim] = axis_names(spec[dim]) + (axis,)
    return NamedSharding(mesh, PartitionSpec(*spec))


def update_shardings(
    abstract: Any, compute_shardings: Any, rules=DEFAULT_RULES, spread: bool = False
) -> Any:
    """`update_sharding` of every leaf of an (unboxed, abstract) tree."""
    return jax.tree.map(
        lambda x, s: update_sharding(x.shape, s, rules, spread), abstract, compute_shardings
    )
