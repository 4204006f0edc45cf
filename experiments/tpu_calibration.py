"""The TPU compiler's step-time estimates set against measured runs: a calibrated range.

The compiler prices a step twice (`optimal_seconds`, and the sum of its per-op
`estimated_cycles`: `bert_jax.hlo_cycles`), and neither is a measurement. The record
`benchmarks/results/tpu_calibration.json` holds published, measured TPU runs (MFU with the
slice and config measured on), each compiled here and priced by both models; a run's
ratio for a model is measured MFU / estimated MFU (= estimated / measured step time). A
step of estimated time s by a model then takes s / ratio on a TPU, by that run; over every
run and both models, the calibrated range is [smallest, largest] of those times
(`Calibration.step_range`). benchmarks/results/tpu_calibration.md is the table.
"""

from __future__ import annotations

import dataclasses
import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(REPO, "benchmarks", "results", "tpu_calibration.json")
# The two cost models, as the records and reports name them.
MODELS = ("optimal_seconds", "per_op")
MODEL_NAMES = {"optimal_seconds": "optimal_seconds", "per_op": "per-op cycles"}


@dataclasses.dataclass(frozen=True)
class Run:
    """One published, measured TPU run and its estimates by both cost models."""

    name: str
    slice: str
    measured_mfu: float
    estimated_mfu: dict[str, float]  # by model (`MODELS`); a model missing: not compiled

    def ratio(self, model: str) -> float | None:
        """Measured over estimated MFU (estimated over measured step time)."""
        estimate = self.estimated_mfu.get(model)
        return self.measured_mfu / estimate if estimate else None


@dataclasses.dataclass(frozen=True)
class Calibration:
    runs: tuple[Run, ...]
    source: str = "benchmarks/results/tpu_calibration.md"

    def ratios(self, model: str) -> list[float]:
        return [r for r in (run.ratio(model) for run in self.runs) if r is not None]

    def step_range(self, estimates: dict[str, float | None]) -> tuple[float, float] | None:
        """(shortest, longest) measured step time the estimates imply: each model's estimate
        over each run's ratio for that model; None when no model has both."""
        times = [
            seconds / ratio
            for model, seconds in estimates.items()
            if seconds
            for ratio in self.ratios(model)
        ]
        return (min(times), max(times)) if times else None

    def describe(self) -> str:
        """The source, as a report names it: runs and each model's ratios."""
        spans = []
        for model in MODELS:
            ratios = self.ratios(model)
            if ratios:
                spans.append(f"{MODEL_NAMES[model]} x{min(ratios):.2f}-{max(ratios):.2f}")
        return (
            f"{len(self.runs)} measured runs, measured/estimated {', '.join(spans)}; {self.source}"
        )


def table(record: dict) -> str:
    """The record's runs as the markdown table benchmarks/results/tpu_calibration.md shows
    (tests/test_hlo_cycles.py checks the page holds it), with each model's spread."""
    lines = [
        "| measured run | slice | bound by | measured MFU | MFU by optimal_seconds | MFU by "
        "per-op cycles | measured / optimal_seconds | measured / per-op |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    calibration = from_record(record)
    used = [r for r in record["runs"] if r.get("use", True)]
    for run, entry in zip(calibration.runs, used, strict=True):
        estimated = run.estimated_mfu
        lines.append(
            f"| {run.name} | {run.slice} | {entry.get('bound', '')} | {run.measured_mfu:.1%} | "
            f"{estimated['optimal_seconds']:.1%} | {estimated['per_op']:.1%} | "
            f"{run.ratio('optimal_seconds'):.2f} | {run.ratio('per_op'):.2f} |"
        )
    for model in MODELS:
        ratios = calibration.ratios(model)
        lines.append(
            f"\n{MODEL_NAMES[model]}: measured / estimated {min(ratios):.2f}-{max(ratios):.2f} "
            f"(spread {max(ratios) / min(ratios):.2f}x) over {len(ratios)} runs"
        )
    return "\n".join(lines)


def from_record(record: dict) -> Calibration:
    runs = tuple(
        Run(
            name=run["name"],
            slice=run["slice"],
            measured_mfu=run["measured_mfu"],
            estimated_mfu={
                m: run["estimated_mfu"][m] for m in MODELS if run["estimated_mfu"].get(m)
            },
        )
        for run in record["runs"]
        if run.get("use", True)
    )
    return Calibration(runs)


def load(path: str = RECORD) -> Calibration | None:
    """The calibration in `path`; None when there is no record."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return from_record(json.load(f))
