"""MetricsWriter writes where the workdir is: a local directory or an object store (gs://);
read_metrics reads what it wrote."""

from __future__ import annotations

import json
import re

import pytest
import tensorflow as tf

from bert_jax.telemetry import MetricsFileError, MetricsWriter, read_metrics


def _records(path: str) -> list[dict]:
    with tf.io.gfile.GFile(path) as f:
        return [json.loads(line) for line in f.read().splitlines()]


@pytest.mark.parametrize("remote", [False, True], ids=["local", "object-store"])
def test_a_resumed_run_keeps_the_earlier_records(tmp_path, remote):
    # TensorFlow's in-memory file system stands in for gs:// (same tf.io.gfile code path).
    workdir = f"ram://{tmp_path.name}/run" if remote else str(tmp_path / "run")
    first = MetricsWriter(workdir, enabled=True)
    first.write(1, {"loss": 2.5})
    first.write(2, {"loss": 2.0}, prefix="eval")
    first.close()
    resumed = MetricsWriter(workdir, enabled=True)  # a restart after preemption
    resumed.write(3, {"loss": 1.5})
    # Each write is readable at once (a crash loses nothing already logged).
    assert [r["step"] for r in _records(f"{workdir}/metrics.jsonl")] == [1, 2, 3]
    resumed.close()
    records = _records(f"{workdir}/metrics.jsonl")
    assert records == [
        {"step": 1, "split": "train", "loss": 2.5},
        {"step": 2, "split": "eval", "loss": 2.0},
        {"step": 3, "split": "train", "loss": 1.5},
    ]
    assert tf.io.gfile.glob(f"{workdir}/tensorboard/events.out.tfevents.*")
    if not remote:
        assert not (tmp_path / "ram:").exists()


@pytest.mark.parametrize("remote", [False, True], ids=["local", "object-store"])
def test_a_resumed_run_cuts_the_steps_it_repeats(tmp_path, remote):
    workdir = f"ram://{tmp_path.name}/cut" if remote else str(tmp_path / "cut")
    first = MetricsWriter(workdir, enabled=True)
    for step in range(1, 8):
        first.write(step, {"loss": 10.0 - step})
    first.write(5, {"loss": 4.0}, prefix="eval")
    first.close()
    path = f"{workdir}/metrics.jsonl"
    with tf.io.gfile.GFile(path, "a") as f:
        f.write('{"step": 8, "split": "tr')  # a writer killed mid-line
    # Restored at step 5: steps 6-8 are run again, and logged once.
    resumed = MetricsWriter(workdir, enabled=True, last_step=5)
    assert [(r["split"], r["step"]) for r in _records(path)] == [
        ("train", 1),
        ("train", 2),
        ("train", 3),
        ("train", 4),
        ("train", 5),
        ("eval", 5),
    ]
    resumed.write(6, {"loss": 4.5})
    resumed.close()
    assert [r["step"] for r in _records(path)] == [1, 2, 3, 4, 5, 5, 6]
    # From scratch (no checkpoint to resume): nothing of the interrupted run is kept.
    MetricsWriter(workdir, enabled=True, last_step=-1).close()
    assert _records(path) == []
    if not remote:
        assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == [
            "metrics.jsonl",
            "tensorboard",
        ]


def test_read_metrics_keeps_the_last_record_of_a_step_in_step_order(tmp_path):
    workdir = str(tmp_path / "run")
    first = MetricsWriter(workdir, enabled=True)
    for step in (1, 2, 3):
        first.write(step, {"loss": 10.0 - step})
    first.write(2, {"loss": 7.5}, prefix="eval")
    first.close()
    # Resumed from step 1 by a writer that keeps everything: steps 2-3 are logged twice.
    resumed = MetricsWriter(workdir, enabled=True)
    resumed.write(2, {"loss": 6.0})
    resumed.write(3, {"loss": 5.0, "mfu": 0.25})
    resumed.close()
    assert read_metrics(f"{workdir}/metrics.jsonl") == [
        {"step": 1, "split": "train", "loss": 9.0},
        {"step": 2, "split": "eval", "loss": 7.5},
        {"step": 2, "split": "train", "loss": 6.0},
        {"step": 3, "split": "train", "loss": 5.0, "mfu": 0.25},
    ]


def test_read_metrics_skips_the_half_line_of_a_killed_writer(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "split": "train", "loss": 2.5}\n\n{"step": 2, "split": "tr')
    assert read_metrics(str(path)) == [{"step": 1, "split": "train", "loss": 2.5}]
    path.write_text('{"step": 1, "split": "tr')  # nothing complete: no records
    with pytest.raises(MetricsFileError, match=f"^{re.escape(str(path))}: no records$"):
        read_metrics(str(path))


def test_read_metrics_names_the_file_and_line_of_a_malformed_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "split": "train", "loss": 2.5}\n'
        '{"step": 2, "split": "train", "loss": 2.\n'  # complete, yet not JSON: corruption
        '{"step": 3, "split": "train", "loss": 1.5}\n'
    )
    with pytest.raises(MetricsFileError, match=f"^{re.escape(str(path))} line 2: not valid JSON"):
        read_metrics(str(path))
    with pytest.raises(MetricsFileError, match="no such file"):
        read_metrics(str(tmp_path / "missing" / "metrics.jsonl"))
