"""The TPU compiler's step-time estimates set against measured runs: a calibrated range.

The compiler prices a step twice (`optimal_seconds`, and the sum of its per-op
`estimated_cycles`: `bert_jax.hlo_cycles`), and neither is a measurement. The record
`benchmarks/tpu_records/tpu_calibration.json` holds published, measured TPU runs (MFU with the
slice and config measured on), each compiled here and priced by both models; a run's
ratio for a model is measured MFU / estimated MFU (= estimated / measured step time). A
step of estimated time s by a model then takes s / ratio on a TPU, by that run; over every
run, each model's estimate gives a span [s / largest ratio, s / smallest ratio]. The
calibrated range is where the two models' spans overlap (a time each model allows within
the error it showed on every run: each run's own measured time lies in it), and both spans
together where they do not overlap (`Calibration.step_range`). How far that is to be trusted
beyond the runs themselves: `leave_one_out`, each run predicted by the others.
benchmarks/tpu_records/tpu_calibration.md is the table.
"""

from __future__ import annotations

import dataclasses
import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(REPO, "benchmarks", "tpu_records", "tpu_calibration.json")
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

    def relative_estimates(self) -> dict[str, float]:
        """Each model's estimate of this run's step in units of its measured step time: its
        ratio (the run as a step to predict, `leave_one_out`)."""
        return {m: self.ratio(m) for m in MODELS if self.ratio(m)}


@dataclasses.dataclass(frozen=True)
class Calibration:
    runs: tuple[Run, ...]
    source: str = "benchmarks/tpu_records/tpu_calibration.md"

    def ratios(self, model: str) -> list[float]:
        return [r for r in (run.ratio(model) for run in self.runs) if r is not None]

    def spans(self, estimates: dict[str, float | None]) -> dict[str, tuple[float, float]]:
        """Per model with an estimate and runs: (shortest, longest) step time, its estimate
        over each run's ratio."""
        found = {}
        for model, seconds in estimates.items():
            ratios = self.ratios(model)
            if seconds and ratios:
                found[model] = (seconds / max(ratios), seconds / min(ratios))
        return found

    def step_range(self, estimates: dict[str, float | None]) -> tuple[float, float] | None:
        """(shortest, longest) measured step time the estimates imply: where the models'
        spans overlap, else both spans together; None when no model has an estimate and runs."""
        spans = list(self.spans(estimates).values())
        if not spans:
            return None
        low, high = max(s[0] for s in spans), min(s[1] for s in spans)
        if low <= high:
            return low, high
        return min(s[0] for s in spans), max(s[1] for s in spans)

    def describe(self) -> str:
        """The source, as a report names it: runs and each model's ratios."""
        spans = []
        for model in MODELS:
            ratios = self.ratios(model)
            if ratios:
                spans.append(f"{MODEL_NAMES[model]} x{min(ratios):.2f}-{max(ratios):.2f}")
        return (
            f"{len(self.runs)} measured runs, measured/estimated {', '.join(spans)} (the range: "
            f"where both models' spans overlap); {self.source}"
        )


def leave_one_out(calibration: Calibration) -> list[tuple[str, tuple[float, float] | None]]:
    """Each run's step predicted by the calibration of the other runs: (name, range as a
    multiple of the run's measured step time; 1 inside it: the others' calibration covers
    it). How well the range carries to a step the runs do not include."""
    found = []
    for index, run in enumerate(calibration.runs):
        others = Calibration(calibration.runs[:index] + calibration.runs[index + 1 :])
        found.append((run.name, others.step_range(run.relative_estimates())))
    return found


def table(record: dict) -> str:
    """The record's runs as the markdown table benchmarks/tpu_records/tpu_calibration.md shows
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
    lines += [
        "\nEach run predicted by the calibration of the others (the range as a multiple of its "
        "measured step time):\n",
        "| run | others' range | covers it |",
        "| --- | --- | --- |",
    ]
    for name, found in leave_one_out(calibration):
        low, high = found
        verdict = (
            "yes" if low <= 1 <= high
            else f"no: the run took {1 / high - 1:.0%} longer than the upper end" if high < 1
            else f"no: the run took {1 - 1 / low:.0%} less than the lower end"
        )  # fmt: skip
        lines.append(f"| {name} | {low:.2f}-{high:.2f}x | {verdict} |")
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
