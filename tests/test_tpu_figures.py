"""The README's and docs' TPU times and costs are their records' calibrated ranges
(`benchmarks.tpu_records.tpu_figures`): a page figure that drifts from its record fails here,
and so does a TPU page stating a time or cost outside a marker. No libtpu."""

import glob
import json
import os
import re

import pytest

from benchmarks.tpu_records import tpu_figures
from experiments import tpu_calibration

# A TPU time or cost as the pages write one: a number and days, d, h, hour(s), min or
# chip-hour(s), or "$" and a digit.
FIGURE = re.compile(r"\d\s?(?:days?|d|h|hours?|min|chip-hours?)\b|\$\d")
DOCS_MAX_LINES = 600


def unmarked_figures(text: str, page: str = "page") -> list[str]:
    """'page:line: ...' for each TPU time or cost of `text` outside its figure markers."""
    text = tpu_figures.MARKER.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [
        f"{page}:{number}: {match.group(0)!r} in {line.strip()[:120]!r}"
        for number, line in enumerate(text.splitlines(), 1)
        for match in FIGURE.finditer(line)
    ]


def test_every_page_figure_is_its_records_calibrated_range():
    assert tpu_figures.drifted() == []


def test_the_pages_state_the_modernbert_recipe_and_berts_as_ranges():
    pages = {}
    for page in tpu_figures.PAGES:
        with open(f"{tpu_figures.REPO}/{page}") as f:
            pages[page] = [m["ids"] for m in tpu_figures.MARKER.finditer(f.read())]
    recipe = "modernbert_base_tpu.py:phase1@v4:4x4x4+modernbert_base_tpu.py:phase2@v4:4x4x4"
    assert recipe in pages["README.md"] and recipe in pages["docs/tpu_modernbert.md"]
    with_figures = ("README.md", "docs/tpu.md", "docs/tpu_estimates.md", "docs/tpu_modernbert.md")
    assert all(pages[page] for page in with_figures), pages


def test_no_tpu_page_states_a_time_or_cost_outside_a_marker():
    """Issue 77: every TPU time or cost in the docs is a calibrated range from a record. On
    each TPU page (`tpu_figures.TPU_PAGES`: docs/tpu*.md) a number followed by days, d, h,
    hour(s), min or chip-hour(s), or "$" followed by a digit, is a TPU run's time or cost and
    stands only inside a `<!-- tpu-figure IDS -->...<!-- /tpu-figure -->` marker (a record's
    calibrated range, `--write` fills it; prices too: each marker names its own). What the
    pages compare changes by stays: the compiler's raw per-step figures (ms / step, MFU, GB,
    tokens / s), and whole recipes as multiples of one another. What is not a TPU run's
    time is written so that it does not read as one: a compile's duration in minutes or
    seconds spelled out, a published run's time in words ("four days")."""
    found = []
    for page in tpu_figures.TPU_PAGES:
        with open(os.path.join(tpu_figures.REPO, page), encoding="utf-8") as f:
            found += unmarked_figures(f.read(), page)
    assert not found, "a TPU time or cost outside a tpu-figure marker:\n" + "\n".join(found)


def test_the_check_names_each_figure_outside_a_marker_and_no_other():
    text = (
        "| phase 1 | 622.1 ms | 34.4% | 2.6 days |\n"
        "calibrated: <!-- tpu-figure a usd=3.22 -->3.5-4.6 days, 5,337-7,105 chip-hours,\n"
        "$17,185-$22,877 at $3.22/chip-hour<!-- /tpu-figure -->; raw 3.2d\n"
        "a compile took 5 minutes, 285 s; the paper took four days; 0.85x the chip-hours\n"
        "49 min, 3.2 chip-hours at $3.22 a chip-hour; 15.4 h; 1 hour\n"
    )
    lines = [line.split(": ")[0] for line in unmarked_figures(text, "p.md")]
    assert lines == ["p.md:1", "p.md:3", "p.md:5", "p.md:5", "p.md:5", "p.md:5", "p.md:5"]


def test_every_tpu_docs_page_is_checked():
    pages = glob.glob(os.path.join(tpu_figures.REPO, "docs", "tpu*.md"))
    found = {os.path.relpath(page, tpu_figures.REPO) for page in pages}
    assert found == set(tpu_figures.TPU_PAGES)


def test_every_docs_page_is_under_600_lines():
    # Project style: a page past ~600 lines splits along its responsibilities (as
    # docs/tpu_estimates.md and docs/tpu_modernbert.md did into tpu_elementwise.md and
    # tpu_modernbert_changes.md).
    long = []
    for page in sorted(
        glob.glob(os.path.join(tpu_figures.REPO, "docs", "**", "*.md"), recursive=True)
    ):
        with open(page, encoding="utf-8") as f:
            count = len(f.read().splitlines())
        if count >= DOCS_MAX_LINES:
            long.append(f"{os.path.relpath(page, tpu_figures.REPO)}: {count} lines")
    assert not long, f"over {DOCS_MAX_LINES} lines: split along responsibilities: {long}"


def _entry(key, seconds, per_op=None):
    return {"id": key, "slice": "v4:4x4x4", "num_devices": 64, "num_chips": 64,
            "peak_flops_per_device": 275e12, "flops_per_step": 1e16, "steps": 86_400,
            "tokens_per_step": 0, "optimal_seconds": seconds, "per_op_seconds": per_op}  # fmt: skip


def test_a_figure_sums_its_phases_and_divides_by_the_calibration(tmp_path):
    entries = {"a": _entry("a", 1.0, 1.5), "b": _entry("b", 0.5)}
    runs = (tpu_calibration.Run("x", "v4-128", 0.5, {"optimal_seconds": 1.0, "per_op": 0.5}),)
    calibration = tpu_calibration.Calibration(runs)
    # a: optimal 1.0 s / 0.5 = 2.0 s, per-op 1.5 s / 1.0 = 1.5 s; b: 0.5 s / 0.5 = 1.0 s.
    # 86,400 steps: a 1.5-2.0 days, b 1.0 day; 64 chips x 24 h.
    shortest, longest, chips = tpu_figures.calibrated_run(entries, "a+b", calibration)
    assert (shortest, longest, chips) == (pytest.approx(2.5), pytest.approx(3.0), 64)
    text = tpu_figures.render(entries, "a+b", " usd=2.0", calibration)
    assert text == (
        "2.5-3.0 days, 3,840-4,608 chip-hours, $7,680-$9,216 at $2.00/chip-hour "
        "(partly optimal_seconds only: a phase's per-op sum not compiled)"  # b's
    )
    assert tpu_figures.render(entries, "b", " goal_days=1.5", calibration) == (
        "24.0 h, 1,536 chip-hours (optimal_seconds only: the per-op sum not compiled); the upper "
        "end, 1.0 days, is within the 1.5-day goal"
    )
    page = "x <!-- tpu-figure a usd=2.0 -->old<!-- /tpu-figure --> y"
    assert tpu_figures.regenerate(page, entries, calibration) == (
        "x <!-- tpu-figure a usd=2.0 -->36.0 h-2.0 days, 2,304-3,072 chip-hours, "
        "$4,608-$6,144 at $2.00/chip-hour<!-- /tpu-figure --> y"
    )
    with pytest.raises(KeyError, match="no record 'c'"):
        tpu_figures.render(entries, "c", "", calibration)


def test_a_report_is_recorded_under_its_config_and_slice(tmp_path):
    from experiments import aot_report

    report = aot_report.FitReport(
        topology="v4:4x4x4", device_kind="TPU v4", num_devices=64, num_chips=64,
        mesh_shape={"data": 64}, hbm_bytes=32 * 1024**3,
        train=aot_report.MemoryUse(1024**3, 0, 0, 0, 0),
        evaluate=aot_report.MemoryUse(0, 0, 0, 0, 0), flops_per_step=1e16, steps=10,
        peak_flops_per_device=275e12, compile_seconds=1.0, compiler_step_seconds=0.5,
        per_op_step_seconds=0.6,
    )  # fmt: skip
    path = tmp_path / "figures.json"
    tpu_figures.record_report(str(path), report, "modernbert_base_tpu.py:phase1")
    tpu_figures.record_report(str(path), report, "modernbert_base_tpu.py:phase1")  # replaced
    figures = json.loads(path.read_text())["figures"]
    assert len(figures) == 1
    entry = figures[0]
    assert entry["id"] == "modernbert_base_tpu.py:phase1@v4:4x4x4"
    assert entry["optimal_seconds"] == 0.5 and entry["per_op_seconds"] == 0.6
    assert entry["train_gib"] == 1.0 and entry["source"].startswith("experiments.aot_compile")
