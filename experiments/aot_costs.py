"""What the TPU compiler and the chip say, for the ahead-of-time checks
(`experiments.aot_compile`, `experiments.aot_embeddings`): a TPU slice's compile-only devices,
a device kind's HBM and peak FLOP/s, and a compiled program's cost-model figures (its
`optimal_seconds`, bytes accessed, FLOPs, and the sum of its per-op estimated cycles).
"""

from __future__ import annotations

from experiments.aot_report import GiB
from experiments.tpu_slice import topology_generation

# HBM of one JAX device. TPU v2/v3 expose each TensorCore as a device (v3: 32 GiB per
# chip, 16 GiB per core); v4 and v5p join a chip's two cores into one device (megacore).
HBM_BYTES_BY_DEVICE_KIND = {
    "TPU v2": 8 * GiB,
    "TPU v3": 16 * GiB,
    "TPU v4": 32 * GiB,
    "TPU v5 lite": 16 * GiB,
    "TPU v5": 95 * GiB,
    "TPU v6 lite": 32 * GiB,
}
# Generations whose chips Cloud TPU VMs run as one megacore device.
MEGACORE = ("v4", "v5p")


# On v4 and v5e slices the TPU compiler's memory-space assignment prefetches big arrays in
# slices and reassembles each with a `ConcatBitcast` custom call: a bitcast, no work, but
# libtpu 0.0.42.1's cost model cannot cost it and adds -1 s for each one to
# `optimal_seconds` (BERT-Large phase 1 on v4:2x2x1: -1112.93457 s with 1,113 of them).
# Adding those seconds back gives the estimate of the program the run compiles (65.4 ms
# there); compiling without sliced prefetches instead (`xla_tpu_sliced_prefetch_max_slices
# =0`) gives a costable but different program, 128.8 ms. v3 has none of these ops.
# On v5p with SparseCore-offloaded all-gathers (MaxText's published 32B flags), each
# offloaded gather's `PrepareAsyncCallStart` / `PrepareAsyncCallDone` custom calls count
# -1 s the same way (18 of them, -17.557 s, on MaxText's 32B at 2 layers on v5p-128:
# benchmarks/tpu_records/tpu_calibration.md).
UNCOSTED_OPS = (
    'custom_call_target="ConcatBitcast"',
    'custom_call_target="PrepareAsyncCallStart"',
    'custom_call_target="PrepareAsyncCallDone"',
)


def _costs(compiled) -> dict:
    costs = compiled.cost_analysis()
    if isinstance(costs, list | tuple):  # one dict per program in older jax releases
        costs = costs[0] if costs else None
    return costs or {}


def bytes_accessed(compiled) -> float | None:
    """The HBM bytes one run of `compiled` reads and writes per device, by the cost model."""
    value = _costs(compiled).get("bytes accessed")
    return float(value) if value else None


def cost_model_flops(compiled) -> float | None:
    """The FLOPs one run of `compiled` performs per device, by the cost model (what its time
    estimate prices: a Pallas kernel without a cost estimate counts zero)."""
    value = _costs(compiled).get("flops")
    return float(value) if value else None


def optimal_seconds(compiled) -> float | None:
    """The TPU compiler's estimate of one run of `compiled` in seconds (its cost model's
    `optimal_seconds`, with the -1 s it counts for each of `UNCOSTED_OPS` taken back out);
    None when it gives none, or a non-positive one."""
    seconds = _costs(compiled).get("optimal_seconds")
    if seconds is None:
        return None
    if seconds < 0:
        text = compiled.as_text()
        seconds += sum(text.count(op) for op in UNCOSTED_OPS)
    return float(seconds) if seconds > 0 else None


def slice_devices(topology: str) -> list:
    """The (compile-only) devices of a TPU slice, as Cloud TPU VMs present them."""
    from jax.experimental import topologies

    kwargs = {"chip_config_name": "megacore"} if topology_generation(topology) in MEGACORE else {}
    return list(
        topologies.get_topology_desc(platform="tpu", topology_name=topology, **kwargs).devices
    )


def device_hbm_bytes(device_kind: str) -> int:
    if device_kind not in HBM_BYTES_BY_DEVICE_KIND:
        raise ValueError(f"no HBM size known for device kind {device_kind!r}")
    return HBM_BYTES_BY_DEVICE_KIND[device_kind]


def device_peak_flops(device_kind: str) -> float:
    from bert_jax import telemetry

    if device_kind not in telemetry.PEAK_FLOPS_BY_DEVICE_KIND:
        raise ValueError(f"no peak FLOP/s known for device kind {device_kind!r}")
    return telemetry.PEAK_FLOPS_BY_DEVICE_KIND[device_kind]


def per_op_seconds(compiled, device_kind: str) -> float | None:
    """The compiler's other estimate of one run of `compiled`: its per-op `estimated_cycles`
    summed (loop bodies times their trips) at the chip's clock, Pallas kernels by their cost
    estimates (`bert_jax.hlo_cycles`); None where the chip's clock is not known."""
    from bert_jax import hlo_cycles

    if device_kind not in hlo_cycles.CLOCK_HZ:
        return None
    return hlo_cycles.per_op_seconds(
        compiled.as_text(), device_kind, device_peak_flops(device_kind)
    )


def is_out_of_memory(error: Exception) -> bool:
    """Whether a compile error is the TPU compiler running out of HBM."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text
