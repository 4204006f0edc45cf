"""One run per workdir (bert_jax.workdir_lock): a second run is refused at once, naming the
workdir and the holder's pid and host; a lock left by a killed run on this host is taken over
with a log line; one left on another host is refused; gs:// says it cannot lock."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from bert_jax import workdir_lock
from tests.conftest import run_captured

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_second_holder_is_refused_naming_pid_and_host(tmp_path):
    with workdir_lock.hold(str(tmp_path), "first"):
        lock_file = tmp_path / workdir_lock.LOCK_FILE
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()
        with pytest.raises(workdir_lock.WorkdirLockedError) as refused:
            workdir_lock.acquire(str(tmp_path), "second")
        message = str(refused.value)
        assert str(tmp_path) in message
        assert f"pid {os.getpid()}" in message and socket.gethostname() in message
    assert not lock_file.exists()  # released: the next run finds no lock at all
    with workdir_lock.hold(str(tmp_path), "third"):
        pass


def test_a_stale_lock_on_this_host_is_taken_over_with_a_log_line(tmp_path, caplog):
    stale = {"pid": _dead_pid(), "host": socket.gethostname(), "command": "pretrain"}
    (tmp_path / workdir_lock.LOCK_FILE).write_text(json.dumps(stale))
    with caplog.at_level("WARNING"), workdir_lock.hold(str(tmp_path), "rerun"):
        held = json.loads((tmp_path / workdir_lock.LOCK_FILE).read_text())
    assert held["pid"] == os.getpid()
    taken = [r.getMessage() for r in caplog.records if "stale lock" in r.getMessage()]
    assert taken and f"pid {stale['pid']}" in taken[0] and "gone" in taken[0]


def test_a_lock_left_on_another_host_is_refused_naming_it(tmp_path):
    other = {"pid": 4242, "host": "tpu-vm-other-host"}
    (tmp_path / workdir_lock.LOCK_FILE).write_text(json.dumps(other))
    with pytest.raises(workdir_lock.WorkdirLockedError, match="tpu-vm-other-host.*delete"):
        workdir_lock.acquire(str(tmp_path))


def test_object_store_workdir_warns_that_it_cannot_lock(caplog):
    with caplog.at_level("WARNING"):
        assert workdir_lock.acquire("gs://bucket/run") is None
    assert any("no run lock on an object store" in r.getMessage() for r in caplog.records)


def test_hold_or_exit_is_one_line(tmp_path):
    with workdir_lock.hold(str(tmp_path)):
        with pytest.raises(SystemExit) as exited:
            with workdir_lock.hold_or_exit(str(tmp_path), "finetune_classification"):
                pass
    assert str(exited.value).startswith("finetune_classification: workdir ")


@pytest.mark.parametrize(
    "module, config",
    [
        ("experiments.pretrain", "experiments/configs/bert_tiny_cpu.py"),
        ("experiments.finetune_classification", "experiments/configs/finetune_tiny_polarity.py"),
    ],
)
def test_a_second_process_is_refused_before_any_jax_work(tmp_path, module, config):
    """The issue's case: two `experiments.pretrain` on one --workdir ran side by side."""
    workdir = tmp_path / "run"
    with workdir_lock.hold(str(workdir), "the first run"):
        started = time.perf_counter()
        result = run_captured(
            [sys.executable, "-m", module, f"--config={config}", f"--workdir={workdir}"],
            timeout=120,
            cwd=REPO,
        )
        seconds = time.perf_counter() - started
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert str(workdir) in last and f"pid {os.getpid()}" in last, result.stderr[-2000:]
    assert socket.gethostname() in last
    assert "Traceback" not in result.stderr
    assert not (workdir / "checkpoints").exists() and not (workdir / "metrics.jsonl").exists()
    print(f"{module} refused in {seconds:.1f} s")


def test_a_workdir_the_lock_made_is_removed_if_nothing_was_written(tmp_path):
    """A run refused after taking the lock (a config the devices refuse) leaves no workdir
    behind; one that wrote there keeps it."""
    fresh = tmp_path / "fresh"
    with workdir_lock.hold(str(fresh)):
        assert (fresh / workdir_lock.LOCK_FILE).exists()
    assert not fresh.exists()
    used = tmp_path / "used"
    with workdir_lock.hold(str(used)):
        (used / "metrics.jsonl").write_text("{}\n")
    assert sorted(os.listdir(used)) == ["metrics.jsonl"]
    existing = tmp_path / "existing"
    existing.mkdir()
    with workdir_lock.hold(str(existing)):
        pass
    assert existing.is_dir()  # not made by the lock: kept, empty or not
