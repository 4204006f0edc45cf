r"""The TPU times and costs the README and docs state, generated from records.

Every such figure in a page sits between two markers, the record's ids in the first:

    <!-- tpu-figure bert_large_v4.py:phase1@v4:2x2x4 usd=3.22 -->12-19 h ...<!-- /tpu-figure -->

and is the calibrated range (`experiments.tpu_calibration`: each cost model's estimate over
each measured run's ratio) of the records named, their steps summed where several are
joined by `+` (a recipe's phases): time to train and chip-hours, the cost at `usd=` a
chip-hour where given, and with `goal_days=` whether the range's upper end is within that
goal. The records are `benchmarks/tpu_records/tpu_figures.json`, one per config and slice:
what `experiments.aot_compile --record=` keeps of a compile (model FLOPs, steps, slice,
both cost models' step time, memory, when, at what load), or for rows not
recompiled since, the docs' own table figures with their date (`source`).

    python -m benchmarks.tpu_records.tpu_figures          # exit 1, naming each figure that drifted
    python -m benchmarks.tpu_records.tpu_figures --write  # rewrite them from the records

tests/test_tpu_figures.py runs the check: a page whose figure is not its record's fails; and
on the TPU pages (`TPU_PAGES`) no time or cost stands outside a marker: elsewhere those
pages give the compiler's raw per-step figures (ms / step, MFU, bytes), for comparing
changes, and compare whole recipes as multiples of one another.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from experiments.tpu_records import RECORD, load, record_report  # noqa: F401 (this tool's names)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Every docs page on TPU runs (docs/tpu*.md): none states a TPU time or cost outside a marker
# (tests/test_tpu_figures.py); PAGES are the pages whose markers --write rewrites.
TPU_PAGES = (
    "docs/tpu.md",
    "docs/tpu_embeddings.md",
    "docs/tpu_estimates.md",
    "docs/tpu_elementwise.md",
    "docs/tpu_modernbert.md",
    "docs/tpu_modernbert_changes.md",
    "docs/tpu_modernbert_recipe.md",
)
PAGES = ("README.md", *TPU_PAGES)
MARKER = re.compile(
    r"<!-- tpu-figure (?P<ids>\S+)(?P<opts>(?: \w+=\S+)*) -->(?P<text>.*?)<!-- /tpu-figure -->",
    re.S,
)


def _plan(entry: dict):
    from experiments.aot_report import Plan

    return Plan(
        entry["flops_per_step"],
        entry["peak_flops_per_device"],
        entry["num_devices"],
        entry["num_chips"],
        entry["steps"],
        entry.get("tokens_per_step", 0),
    )


def calibrated_run(entries: dict[str, dict], ids: str, calibration) -> tuple[float, float, int]:
    """(shortest, longest) days of the records `ids` (joined by +) by the calibration, and
    their slice's chips (the records of one figure share a slice)."""
    shortest = longest = 0.0
    chips = set()
    for key in ids.split("+"):
        if key not in entries:
            raise KeyError(f"no record {key!r} in {RECORD}")
        entry = entries[key]
        estimates = {"optimal_seconds": entry["optimal_seconds"]}
        estimates["per_op"] = entry.get("per_op_seconds")
        step = calibration.step_range(estimates)
        plan = _plan(entry)
        shortest += plan.days(step[0])
        longest += plan.days(step[1])
        chips.add(entry["num_chips"])
    if len(chips) != 1:
        raise ValueError(f"{ids}: records on slices of different sizes")
    return shortest, longest, chips.pop()


def render(entries: dict[str, dict], ids: str, opts: str, calibration) -> str:
    """A figure's text: time to train and chip-hours (and cost), calibrated."""
    from experiments.aot_report import _span, duration_range

    shortest, longest, chips = calibrated_run(entries, ids, calibration)
    low, high = shortest * 24 * chips, longest * 24 * chips
    text = f"{duration_range(shortest, longest)}, {_span(f'{low:,.0f}', f'{high:,.0f}')} chip-hours"
    options = dict(opt.split("=", 1) for opt in opts.split())
    if "usd" in options:
        usd = float(options["usd"])
        cost = _span(f"${low * usd:,.0f}", f"${high * usd:,.0f}")
        text += f", {cost} at ${usd:.2f}/chip-hour"
    priced = [bool(entries[key].get("per_op_seconds")) for key in ids.split("+")]
    if not any(priced):
        text += " (optimal_seconds only: the per-op sum not compiled)"
    elif not all(priced):
        text += " (partly optimal_seconds only: a phase's per-op sum not compiled)"
    if "goal_days" in options:  # a goal judged against the range's upper end
        goal = float(options["goal_days"])
        verdict = "within" if longest <= goal else "over"
        text += f"; the upper end, {longest:.1f} days, is {verdict} the {goal:g}-day goal"
    return text


def regenerate(page_text: str, entries: dict[str, dict], calibration) -> str:
    def figure(match):
        text = render(entries, match["ids"], match["opts"], calibration)
        return f"<!-- tpu-figure {match['ids']}{match['opts']} -->{text}<!-- /tpu-figure -->"

    return MARKER.sub(figure, page_text)


def drifted(pages=PAGES, record: str = RECORD) -> list[str]:
    """Each page figure that is not its records' calibrated range: 'page: stated != record'."""
    from experiments import tpu_calibration

    entries, calibration = load(record), tpu_calibration.load()
    found = []
    for page in pages:
        with open(os.path.join(REPO, page)) as f:
            text = f.read()
        for match in MARKER.finditer(text):
            expected = render(entries, match["ids"], match["opts"], calibration)
            if match["text"] != expected:
                found.append(f"{page}: {match['ids']}: {match['text']!r} != {expected!r}")
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the pages' figures")
    args = parser.parse_args(argv)
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    if not args.write:
        found = drifted()
        print("\n".join(found) or "every page figure is its record's calibrated range")
        return 1 if found else 0
    from experiments import tpu_calibration

    entries, calibration = load(), tpu_calibration.load()
    for page in PAGES:
        path = os.path.join(REPO, page)
        with open(path) as f:
            text = f.read()
        new = regenerate(text, entries, calibration)
        if new != text:
            with open(path, "w") as f:
                f.write(new)
            print(f"rewrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
