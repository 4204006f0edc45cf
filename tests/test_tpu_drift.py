"""Each shipped TPU config's compiler estimate is recorded (benchmarks/results/
tpu_estimates.json) and docs/tpu_estimates.md states the record's figures: a docs figure
that drifts from its record fails here. Reading files only: no libtpu, no compile
(`python -m benchmarks.tpu_records.tpu_drift` recompiles and compares, issue 77 item 5)."""

import glob
import os
import re

import pytest

from benchmarks.tpu_records import tpu_drift


def test_the_docs_state_each_shipped_configs_recorded_estimate():
    assert tpu_drift.docs_drift(tpu_drift.load()) == []


def test_every_bert_tpu_config_has_both_phases_recorded():
    recorded = {e["config"] for e in tpu_drift.load()["estimates"]}
    for path in glob.glob(os.path.join(tpu_drift.REPO, "experiments/configs/bert_*.py")):
        with open(path) as f:
            if not re.search(r'topology="v', f.read()):
                continue
        name = os.path.basename(path)
        assert {f"{name}:phase1", f"{name}:phase2"} <= recorded, name


def test_every_record_entry_says_what_measured_it():
    for entry in tpu_drift.load()["estimates"]:
        assert entry["libtpu"] and entry["jax"] and re.match(r"\d{4}-\d\d-\d\d", entry["measured"])
        assert entry["slice"].startswith(("v3:", "v4:", "v5e:")), entry
        assert all(entry[k] > 0 for k in tpu_drift.FIGURES), entry


def test_a_docs_figure_off_its_record_is_named(tmp_path):
    with open(tpu_drift.DOCS, encoding="utf-8") as f:
        text = f.read()
    row = next(line for line in text.splitlines() if line.startswith("| `bert_large_paper` 2 |"))
    record = tpu_drift.load()
    ms = next(e for e in record["estimates"] if e["config"] == "bert_large_paper.py:phase2")
    drifted = row.replace(f"| {ms['ms_per_step']:.1f} |", "| 69.0 |")
    assert drifted != row
    docs = tmp_path / "tpu_estimates.md"
    docs.write_text(text.replace(row, drifted), encoding="utf-8")
    lines = tpu_drift.docs_drift(record, str(docs))
    assert len(lines) == 1 and "bert_large_paper.py:phase2" in lines[0], lines
    assert "ms_per_step" in lines[0]


def test_a_config_whose_rows_are_gone_is_named(tmp_path):
    docs = tmp_path / "tpu_estimates.md"
    docs.write_text("# nothing\n", encoding="utf-8")
    lines = tpu_drift.docs_drift(tpu_drift.load(), str(docs))
    assert any("bert_base_paper.py:phase2: no row" in line for line in lines)


def test_a_figure_moving_by_more_than_one_percent_is_reported():
    recorded = {"ms_per_step": 76.0, "mfu_percent": 51.6, "hbm_gb": 25.7, "train_gib": 7.59}
    same = {"ms_per_step": 76.7, "mfu_percent": 51.2, "hbm_gb": 25.7, "train_gib": 7.6}
    assert tpu_drift.moved(recorded, same) == []  # within 1%
    # issue 77's BERT-Base phase 2 (commit 517d6a8's f32 products): every figure moved
    moved = {"ms_per_step": 78.8, "mfu_percent": 49.8, "hbm_gb": 26.9, "train_gib": 7.68}
    lines = tpu_drift.moved(recorded, moved)
    assert [line.split()[0] for line in lines] == list(tpu_drift.FIGURES)
    assert lines[0] == "ms_per_step 76 -> 78.8 (+3.7%)"


def test_help_names_the_record_and_the_tolerance(capsys):
    try:
        tpu_drift.main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    assert "tpu_estimates.json" in out and "--tolerance" in out and "--configs" in out


def test_figures_takes_both_estimates_into_the_ranges_record(tmp_path):
    from experiments import tpu_records

    path = tmp_path / "tpu_figures.json"
    entries = tpu_records.load()
    key = "bert_large_paper.py:phase2@v3:8x8"
    # an entry carried from the docs' table: optimal_seconds alone
    carried = dict(entries[key], optimal_seconds=0.0672, per_op_seconds=None, source="docs")
    tpu_records.write(str(path), {key: carried})
    measured = {"optimal_seconds": 0.0673, "per_op_seconds": 0.0911, "train_gib": 5.02}
    assert tpu_drift.update_figures("bert_large_paper.py:phase2", "v3:8x8", measured, str(path))
    entry = tpu_records.load(str(path))[key]
    assert (entry["optimal_seconds"], entry["per_op_seconds"]) == (0.0673, 0.0911)
    assert entry["source"].startswith("python -m benchmarks.tpu_records.tpu_drift --figures")
    assert entry["flops_per_step"] == entries[key]["flops_per_step"]  # the rest is kept
    assert not tpu_drift.update_figures("bert_large_paper.py:phase2", "v3:4x4", measured, str(path))


def test_figures_without_update_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        tpu_drift.main(["--figures"])
    assert exit_info.value.code == 2
    assert "--figures writes what --update measures" in capsys.readouterr().err
