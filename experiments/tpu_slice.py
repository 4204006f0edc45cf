r"""The Cloud TPU slice a config runs on, and whether the config's mesh and batch fit it.

  python -m experiments.tpu_slice --config=experiments/configs/bert_large_paper.py:phase1
  v3-128

  python -m experiments.tpu_slice --config=experiments/configs/bert_large_paper.py:phase1 \
      --accelerator_type=v3-512
  refused: experiments/configs/bert_large_paper.py:phase1 does not fit v3-512 ...   (exit 1)

Without --accelerator_type the slice is the config's `topology` ('v3:8x8'); with it, the
slice given. Either way the config's `mesh_shape` (-1: the rest of the devices) must
cover the slice's devices, and the global batch (also over the slice's hosts) and the
model's sharded dimensions must divide over its axes. The accelerator type is printed
when they do; otherwise one line says why and the exit status is 1. `tpu.mk` asks this
before `tpu-create`, `tpu-qr-create`, `tpu-pretrain` and `tpu-spot-pretrain` create or
launch anything. Memory is not checked here: `make aot-check` compiles the steps for the
slice.

Names, as the Cloud TPU docs give them: a v2, v3, v4 or v5p chip has two TensorCores
and those accelerator types count cores (`v3-128`: 64 chips, `v4-32`: 16 chips); a v5e
or v6e chip has one, and `v5litepod-N` / `v6e-N` count chips. JAX sees one device per
core on v2/v3; v4 and v5p run a chip's two cores as one (megacore) device.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys

from absl import app, flags

from bert_jax import config_bounds
from bert_jax.config import BertConfig, objective
from bert_jax.mesh_shape import MESH_AXES, resolve_mesh_shape
from data_pipelines import cli

# TensorCores per chip, as accelerator-type names count them.
CORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}
# JAX devices per chip: one per TensorCore on v2/v3, one (megacore) per chip elsewhere.
DEVICES_PER_CHIP = {"v2": 2, "v3": 2}
# The accelerator-type prefix where it is not the generation's name.
TYPE_PREFIX = {"v5e": "v5litepod"}
# Chips one TPU VM drives: 4 in pod slices; a v5e/v6e slice of up to 8 chips is one VM.
CHIPS_PER_HOST = 4
SINGLE_HOST_CHIPS = {"v5e": 8, "v6e": 8}


@dataclasses.dataclass(frozen=True)
class Slice:
    """A Cloud TPU slice: a chip generation and a number of chips."""

    generation: str  # 'v3', 'v4', 'v5e', ...
    chips: int

    @classmethod
    def from_topology(cls, topology: str) -> Slice:
        """'v3:8x8' (as `jax.experimental.topologies` names slices) -> 64 v3 chips."""
        generation, sep, shape = topology.partition(":")
        if not sep or not shape:
            raise ValueError(f"topology {topology!r} is not of the form 'v3:8x8' or 'v4:2x2x2'")
        if generation not in CORES_PER_CHIP:
            raise ValueError(f"topology {topology!r}: no TPU generation {generation!r}")
        dims = shape.split("x")
        if not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"topology {topology!r} has a malformed shape")
        return cls(generation, math.prod(int(d) for d in dims))

    @classmethod
    def from_accelerator_type(cls, name: str) -> Slice:
        """'v3-128' -> 64 v3 chips; 'v5litepod-16' -> 16 v5e chips."""
        prefixes = {TYPE_PREFIX.get(g, g): g for g in CORES_PER_CHIP}
        match = re.fullmatch(r"(\w+)-(\d+)", name)
        if not match or match[1] not in prefixes or int(match[2]) == 0:
            raise ValueError(
                f"accelerator type {name!r} is not one of {', '.join(p + '-N' for p in prefixes)}"
            )
        generation, cores = prefixes[match[1]], int(match[2])
        if cores % CORES_PER_CHIP[generation]:
            raise ValueError(f"accelerator type {name!r}: a {generation} chip has two cores")
        return cls(generation, cores // CORES_PER_CHIP[generation])

    @property
    def accelerator_type(self) -> str:
        """The `gcloud --accelerator-type`: 'v3-128', 'v4-32', 'v5litepod-16'."""
        prefix = TYPE_PREFIX.get(self.generation, self.generation)
        return f"{prefix}-{self.chips * CORES_PER_CHIP[self.generation]}"

    @property
    def devices(self) -> int:
        """JAX devices as Cloud TPU VMs run the slice ('v3-128' -> 128 cores)."""
        return self.chips * DEVICES_PER_CHIP.get(self.generation, 1)

    @property
    def hosts(self) -> int:
        """TPU VM hosts (JAX processes) of the slice."""
        if self.chips <= SINGLE_HOST_CHIPS.get(self.generation, CHIPS_PER_HOST):
            return 1
        return self.chips // CHIPS_PER_HOST


def topology_generation(topology: str) -> str:
    """'v3:8x8' -> 'v3'."""
    return Slice.from_topology(topology).generation


def topology_chips(topology: str) -> int:
    """'v3:8x8' -> 64 chips."""
    return Slice.from_topology(topology).chips


def topology_device_count(topology: str) -> int:
    """'v3:8x8' -> 128 devices (one per v3 core)."""
    return Slice.from_topology(topology).devices


def topology_hosts(topology: str) -> int:
    """'v3:8x8' -> 16 TPU VM hosts."""
    return Slice.from_topology(topology).hosts


def accelerator_type(topology: str) -> str:
    """'v3:8x8' -> 'v3-128', 'v4:2x2x4' -> 'v4-32', 'v5e:4x4' -> 'v5litepod-16'."""
    return Slice.from_topology(topology).accelerator_type


def misfit(config, slice_: Slice) -> str | None:
    """Why `config` cannot run on `slice_` (its mesh, batch or sharded dims); None if it can."""
    try:
        shape = resolve_mesh_shape(config.mesh_shape, slice_.devices)
    except ValueError as e:
        return str(e)
    mesh = dict(zip(MESH_AXES, shape, strict=True))
    laid_out = f"mesh_shape {tuple(config.mesh_shape)} -> " + " x ".join(
        f"{axis} {size}" for axis, size in mesh.items()
    )
    batch, batch_ways = config.global_batch_size, mesh["data"] * mesh["fsdp"]
    if batch % batch_ways:
        return f"{laid_out}: global_batch_size {batch} does not divide over data x fsdp"
    if batch % slice_.hosts:
        return f"global_batch_size {batch} does not divide over the {slice_.hosts} hosts"
    cfg = BertConfig.from_experiment(config.model, objective=objective(config))
    # The rule table shards `embed` over fsdp and heads, the FFN and the vocab over tensor.
    for key, size, axis in (
        ("hidden_size", cfg.hidden_size, "fsdp"),
        ("num_attention_heads", cfg.num_attention_heads, "tensor"),
        ("intermediate_size", cfg.intermediate_size, "tensor"),
        ("vocab_size", cfg.vocab_size, "tensor"),
    ):
        if size % mesh[axis]:
            return f"{laid_out}: model {key} {size} does not divide over {axis}"
    return None


def resolve(config, config_name: str, requested: str | None) -> str:
    """The accelerator type `config` runs on: `requested` if given, else its topology's.

    Raises ValueError (one line, naming `config_name`) when there is none or it misfits.
    """
    if requested:
        slice_ = Slice.from_accelerator_type(requested)
    elif config.get("topology"):
        slice_ = Slice.from_topology(config.topology)
    else:
        raise ValueError(f"{config_name} has no topology: give the slice (ACCELERATOR_TYPE=...)")
    reason = misfit(config, slice_)
    if reason:
        raise ValueError(
            f"{config_name} does not fit {slice_.accelerator_type} ({slice_.devices} devices "
            f"on {slice_.hosts} host{'s' * (slice_.hosts > 1)}): {reason}"
        )
    return slice_.accelerator_type


def main(argv, config_flag, accelerator_type_flag) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config_name = flags.FLAGS[config_flag.name].config_filename
    config_bounds.check_or_exit(config_flag.value, "pretrain", "tpu_slice")
    try:
        print(resolve(config_flag.value, config_name, accelerator_type_flag.value))
    except ValueError as e:
        print(f"refused: {e}", file=sys.stderr)
        return 1
    return 0


def _run():
    # Flags are defined here, not at import: aot_compile imports this module and has its
    # own --config.
    from ml_collections import config_flags

    config_flag = config_flags.DEFINE_config_file(
        "config", None, "Experiment config file (optionally with :variant).", lock_config=True
    )
    accelerator_type_flag = flags.DEFINE_string(
        "accelerator_type",
        None,
        "The slice, e.g. v3-128, v4-32, v5litepod-16 (default: the config's topology).",
    )
    flags.mark_flag_as_required("config")
    cli.run(lambda argv: sys.exit(main(argv, config_flag, accelerator_type_flag)))


if __name__ == "__main__":
    _run()
