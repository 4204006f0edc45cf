"""The TPU compiler's second cost model: the per-op cycle estimates in a compiled program.

The TPU compiler prices a compiled program twice. `cost_analysis()["optimal_seconds"]` is
one figure for the whole program; and every op it schedules carries its own estimate,
`"estimated_cycles":"N"` in its backend config. The two disagree (the per-op sum counts ops
that overlap one after another, credits reads from on-chip memory the program figure counts
as HBM bytes, and leaves out what it cannot price), and neither is a measurement: the
ahead-of-time tools give both, a range, and `experiments.tpu_calibration` sets each against
measured runs.

This module sums the per-op estimates of a compiled program's text into seconds:

- every op of the entry computation once, and every op of a `while` loop's body once for
  each of the loop's trips (the program-level figure counts a body once; the trip count is
  the constant the loop's condition compares its counter with);
- a Pallas kernel (`custom_call_target="tpu_custom_call"`) carries no cycle estimate of its
  own but the `pl.CostEstimate` its author gave it (FLOPs, transcendentals, bytes): it is
  priced as the slower of its FLOPs at the chip's peak and its bytes at the chip's HBM
  bandwidth (a roofline: `kernel_seconds`), the way the program-level figure prices it too;
- the cycles are turned into seconds by the chip's clock (`CLOCK_HZ`).

Ops with neither (collectives on some slices, a kernel without a cost estimate) count zero;
`OpCycles.unpriced` says how many there were. Text in, numbers out: no JAX here (MaxText's
driver, `benchmarks/studies/maxtext_reference.py`, reads its programs with it too).
"""

from __future__ import annotations

import dataclasses
import re

from bert_jax.hlo_text import computations

CYCLES = re.compile(r'"estimated_cycles":"([0-9]+)"')
# A Pallas kernel's cost estimate in its backend config (quoted, or escaped inside a string).
_KERNEL_COST = re.compile(
    r"cost_estimate\W+flops\W+([0-9]+)\W+transcendentals\W+([0-9]+)\W+bytes_accessed\W+([0-9]+)"
)
_BODY = re.compile(r"body=%([\w.\-]+)")
_CONDITION = re.compile(r"condition=%([\w.\-]+)")

# The clock of one JAX device, Hz: its peak dense bf16 FLOP/s over 2 x the multiply-adds its
# matrix units do a cycle (128 x 128 each): v2 22.5 TFLOP/s, one MXU a core, 700 MHz; v3 61.5,
# two, 940 MHz; v4 275, eight a megacore chip, 1,050 MHz; v5e 197, four, 1.5 GHz; v5p 459,
# eight a megacore chip, 1.75 GHz. (v6e's is not published: no per-op seconds there.)
CLOCK_HZ = {
    "TPU v2": 700e6,
    "TPU v3": 940e6,
    "TPU v4": 1050e6,
    "TPU v5 lite": 1.5e9,
    "TPU v5": 1.75e9,
}
# HBM bandwidth of one JAX device, bytes/s (a v2/v3 core has half its chip's): for pricing
# Pallas kernels by their cost estimates.
HBM_BYTES_PER_SECOND = {
    "TPU v2": 350e9,
    "TPU v3": 450e9,
    "TPU v4": 1200e9,
    "TPU v5 lite": 819e9,
    "TPU v5": 2765e9,
    "TPU v6 lite": 1640e9,
}
# Ops that do no work of their own (views, tuples, the second half of an async pair).
FREE = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "partition-id",
    "replica-id", "copy-done", "slice-done", "all-reduce-done", "all-gather-done",
    "collective-permute-done", "async-done", "after-all", "iota",
}  # fmt: skip


def loop_trips(hlo_text: str, condition: str) -> int:
    """A loop's trip count: the constant its condition computation compares the counter with
    (`lax.map`, `lax.scan` and `fori_loop` loops count up from 0 to it)."""
    block = re.search(rf"^%{re.escape(condition)} .*?^\}}", hlo_text, re.M | re.S)
    found = re.findall(r"constant\((\d+)\)", block.group(0)) if block else []
    if not found:
        raise ValueError(f"no trip count in the loop condition {condition}")
    return int(found[-1])


def kernel_seconds(attrs: str, peak_flops: float, hbm_bytes_per_second: float) -> float | None:
    """A Pallas kernel's time by its cost estimate: the slower of its FLOPs at peak and its
    bytes at HBM bandwidth; None when the op carries no cost estimate."""
    found = _KERNEL_COST.search(attrs)
    if not found:
        return None
    flops, _, nbytes = (int(g) for g in found.groups())
    return max(flops / peak_flops, nbytes / hbm_bytes_per_second)


@dataclasses.dataclass
class OpCycles:
    """What the per-op estimates of one compiled program sum to."""

    counted: float  # every op's cycles once, loop bodies included once
    cycles: float  # every op's cycles times its loop's trips
    kernel_seconds: float  # Pallas kernels by their cost estimates, times their trips
    kernels: int  # Pallas kernels priced so
    unpriced: int  # ops with no estimate of either kind (priced at zero)
    loops: list[tuple[str, int]]  # (op_name of the while, trips) of each loop, outermost first

    def seconds(self, clock_hz: float) -> float:
        """The program's time by its per-op estimates."""
        return self.cycles / clock_hz + self.kernel_seconds


def op_cycles(hlo_text: str, peak_flops: float = 0.0, hbm_bytes_per_second: float = 0.0):
    """Sums the per-op estimates of a compiled program's text (`compiled.as_text()`): an
    `OpCycles`. Pallas kernels are priced by their cost estimates where `peak_flops` and
    `hbm_bytes_per_second` are given (else counted in `unpriced`)."""
    comps, entry = computations(hlo_text)
    total = OpCycles(0.0, 0.0, 0.0, 0, 0, [])

    def walk(computation: str, weight: int) -> None:
        for inst in comps[computation]:
            if inst.opcode == "while":
                body = _BODY.search(inst.attrs).group(1)
                trips = loop_trips(hlo_text, _CONDITION.search(inst.attrs).group(1))
                name = re.search(r'op_name="([^"]*)"', inst.attrs)
                total.loops.append((name.group(1) if name else inst.name, trips))
                walk(body, weight * trips)
                continue
            if inst.opcode in FREE:
                continue
            cycles = CYCLES.search(inst.attrs)
            if cycles:
                total.counted += int(cycles.group(1))
                total.cycles += weight * int(cycles.group(1))
                continue
            seconds = None
            if peak_flops and hbm_bytes_per_second:
                seconds = kernel_seconds(inst.attrs, peak_flops, hbm_bytes_per_second)
            if seconds is None:
                total.unpriced += 1
                continue
            total.kernel_seconds += weight * seconds
            total.kernels += 1

    walk(entry, 1)
    return total


def per_op_seconds(hlo_text: str, device_kind: str, peak_flops: float) -> float | None:
    """The program's time by the per-op estimates on a `device_kind` device (None: no clock
    known for it, or no op carries an estimate)."""
    if device_kind not in CLOCK_HZ:
        return None
    found = op_cycles(hlo_text, peak_flops, HBM_BYTES_PER_SECOND[device_kind])
    if not found.cycles:
        return None
    return found.seconds(CLOCK_HZ[device_kind])
