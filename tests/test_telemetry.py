"""MetricsWriter writes where the workdir is: a local directory or an object store (gs://)."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from bert_jax.telemetry import MetricsWriter


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
