"""The device mesh's axes and how a config's `mesh_shape` covers a number of devices.

No JAX here: the slice check that `tpu.mk` runs before every Cloud TPU target
(`experiments.tpu_slice`) resolves a config's mesh without paying for JAX's import.
`bert_jax.sharding` builds the mesh itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MESH_AXES = ("data", "fsdp", "tensor")


def resolve_mesh_shape(mesh_shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Replaces one -1 in `mesh_shape` by whatever makes the product `num_devices`."""
    shape = [int(s) for s in mesh_shape]
    if len(shape) != len(MESH_AXES):
        raise ValueError(f"mesh_shape {tuple(shape)} must have one entry per axis {MESH_AXES}")
    if shape.count(-1) > 1:
        raise ValueError(f"mesh_shape {tuple(shape)} has more than one -1")
    if any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh_shape {tuple(shape)} entries must be positive or -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ValueError(
                f"mesh_shape {tuple(shape)}: {num_devices} devices do not divide by {known}"
            )
        shape[shape.index(-1)] = num_devices // known
    if math.prod(shape) != num_devices:
        raise ValueError(
            f"mesh_shape {tuple(shape)} uses {math.prod(shape)} devices but {num_devices} exist"
        )
    return tuple(shape)
