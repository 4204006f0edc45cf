"""Fault injection on `experiments.pretrain`: what the user sees, and that nothing is lost,
when the checkpoint directory cannot be written, a background write fails, SIGTERM meets a
failing save, or the loss diverges before any checkpoint.

Every run is a real `python -m experiments.pretrain` process on 2 fake CPU devices; they
share the session's persistent XLA compilation cache with test_resume's, whose program
they run: only the first run of the session compiles the train step.
Write failures without root or a full disk: a file where the checkpoint directory should
be, and RLIMIT_FSIZE (a process limit on file size; writes past it fail with EFBIG).
"""

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time

import jax
import numpy as np
import pytest
import synthetic_pretraining as synth
from conftest import subprocess_env

from bert_jax import checkpointing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = synth.STEPS  # checkpoints every synth.CHECKPOINT_EVERY = 5 steps
TIMEOUT_S = 300
# Far below Orbax's 300 s timeout, which a run waiting on its threads would reach.
PROMPT_EXIT_S = 60
SMALL_FILES = 1 << 20  # bytes: checkpoint data files are larger, everything else smaller


@pytest.fixture(scope="module")
def env(xla_cache):
    return subprocess_env(xla_cache)


@pytest.fixture(scope="module")
def data_dir(synthetic_data):
    return synthetic_data


_command = synth.pretrain_command


def _limit_file_size(pid: int) -> None:
    """No file of process `pid` may grow past SMALL_FILES: larger writes fail with EFBIG."""
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (SMALL_FILES, SMALL_FILES))


class _Run:
    """A pretraining process whose output goes to a log file."""

    def __init__(self, command, env, log_path, small_files=False):
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        if small_files:  # long before its first checkpoint write
            _limit_file_size(self.proc.pid)

    def wait_for(self, condition, what: str):
        deadline = time.monotonic() + TIMEOUT_S
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended before {what}:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"timed out waiting for {what}")
            time.sleep(0.01)

    def finish(self, expect_rc) -> str:
        try:
            self.proc.wait(timeout=TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
        output = self.output()
        if self.proc.returncode != expect_rc:
            pytest.fail(f"exit code {self.proc.returncode}, not {expect_rc}:\n{output[-4000:]}")
        return output

    def output(self) -> str:
        return self.log_path.read_text()


def _run(command, env, log_path, expect_rc=0, small_files=False) -> str:
    return _Run(command, env, log_path, small_files).finish(expect_rc)


def _steps(directory) -> list[int]:
    names = os.listdir(directory) if directory.exists() else []
    return sorted(int(n) for n in names if n.isdigit())


def _train_steps_logged(workdir) -> list[int]:
    path = workdir / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [r["step"] for r in map(json.loads, lines) if r["split"] == "train"]


def _last_line(output: str) -> str:
    return output.rstrip().splitlines()[-1]


def _checkpoint_error(output: str) -> str:
    """The one checkpoint error line, with none of the noise of Orbax's abandoned writes."""
    lines = [x for x in output.splitlines() if re.match(r"pretrain: [a-z]", x)]
    assert len(lines) == 1, lines  # (tqdm's "pretrain: " lines go on with a space or digit)
    for noise in ("sys.meta_path is None", "never retrieved", "Event loop is closed"):
        assert noise not in output
    return lines[0]


def _restored_step(directory) -> int:
    manager = checkpointing.make_manager(directory, async_save=False, create=False)
    try:
        state, _, _ = checkpointing.restore(manager, None, None)
    finally:
        manager.close()
    return int(state["step"])


@pytest.fixture(scope="module")
def finished(pretrain_reference):
    """An uninterrupted run (the session's: its compile fills the cache for the others)."""
    assert _steps(pretrain_reference / "checkpoints") == [10, 15, STEPS]  # keep_checkpoints=3
    return pretrain_reference


def test_a_checkpoint_path_that_is_a_file_stops_the_run_before_its_first_step(
    tmp_path, data_dir, env
):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "checkpoints").write_text("not a directory\n")
    started = time.monotonic()
    output = _run(_command(workdir, data_dir), env, tmp_path / "log", expect_rc=1)
    assert time.monotonic() - started < PROMPT_EXIT_S
    assert _last_line(output) == (
        f"pretrain: cannot write checkpoints to {workdir / 'checkpoints'}: it is not a directory"
    )
    assert "Traceback" not in output
    assert _train_steps_logged(workdir) == []
    assert (workdir / "checkpoints").read_text() == "not a directory\n"


@pytest.mark.extended  # a run of its own to the save it breaks
def test_a_checkpoint_directory_gone_unwritable_mid_run_stops_at_that_save(
    tmp_path, data_dir, env, finished
):
    """Extended tier. make test still covers its path, a save that fails mid-run stopping the
    run and keeping the older checkpoint: test_a_failing_background_write_stops_the_run_at_
    once_and_keeps_the_older_checkpoint."""
    workdir = tmp_path / "run"
    checkpoints = workdir / "checkpoints"
    run = _Run(_command(workdir, data_dir), env, tmp_path / "log")
    run.wait_for(lambda: 5 in _steps(checkpoints), "the step-5 checkpoint")
    # The directory is replaced by a file before the step-10 save (as if unmounted).
    kept = tmp_path / "kept_checkpoints"
    os.rename(checkpoints, kept)
    checkpoints.write_text("")
    swapped = time.monotonic()
    output = run.finish(expect_rc=1)
    assert time.monotonic() - swapped < PROMPT_EXIT_S  # no wait on Orbax's threads
    last = _last_line(output)
    assert last.startswith(
        f"pretrain: cannot save checkpoint step 10 in {checkpoints}: NotADirectoryError: "
    ), last
    assert max(_train_steps_logged(workdir)) == 10  # stopped at the failed save
    assert "checkpoint saved" not in output
    assert _restored_step(kept) == 5  # what was saved is intact


@pytest.mark.extended  # a run of its own to the write it breaks (~19 s); CI runs it
def test_a_failing_background_write_stops_the_run_at_once_and_keeps_the_older_checkpoint(
    tmp_path, data_dir, env, finished
):
    workdir = tmp_path / "run"
    checkpoints = workdir / "checkpoints"
    run = _Run(_command(workdir, data_dir), env, tmp_path / "log")
    run.wait_for(lambda: 5 in _steps(checkpoints), "the step-5 checkpoint")
    # From now on no file may grow past 1 MiB: the step-10 save's data files fail (EFBIG)
    # in Orbax's background threads, as on a full disk.
    _limit_file_size(run.proc.pid)
    limited = time.monotonic()
    output = run.finish(expect_rc=1)
    assert time.monotonic() - limited < PROMPT_EXIT_S
    error = _checkpoint_error(output)
    assert error.startswith(f"pretrain: saving a checkpoint in {checkpoints} failed: "), error
    assert "File too large" in error
    # Polled every step: the run stops within a few steps of the failed save, not at the next.
    assert 10 <= max(_train_steps_logged(workdir)) < 15
    assert _steps(checkpoints) == [5] and _restored_step(checkpoints) == 5

    output = _run(_command(workdir, data_dir), env, tmp_path / "restarted.log")
    assert f"train state from {checkpoints} step 5" in output
    assert _steps(checkpoints)[-1] == STEPS


def test_sigterm_never_claims_a_checkpoint_that_was_not_saved(tmp_path, data_dir, env, finished):
    workdir = tmp_path / "run"
    # No periodic checkpoints, and no file may grow past 1 MiB: SIGTERM's save fails.
    command = _command(
        workdir, data_dir, "--config.checkpoint_every=1000", "--config.num_train_steps=200"
    )
    run = _Run(command, env, tmp_path / "log", small_files=True)
    run.wait_for(lambda: max(_train_steps_logged(workdir), default=0) >= 3, "step 3")
    run.proc.send_signal(signal.SIGTERM)
    output = run.finish(expect_rc=1)
    assert "SIGTERM received: stopping after the current step" in output
    assert "checkpoint saved" not in output and "stopped by SIGTERM" not in output
    assert _checkpoint_error(output).startswith(
        f"pretrain: saving a checkpoint in {workdir / 'checkpoints'} failed: "
    )
    assert _steps(workdir / "checkpoints") == []


def test_non_finite_loss_before_any_checkpoint_says_there_is_none(
    tmp_path, data_dir, env, finished
):
    workdir = tmp_path / "run"
    command = _command(
        workdir, data_dir, "--config.optimizer.learning_rate=1e30", "--config.checkpoint_every=100"
    )
    output = _run(command, env, tmp_path / "log", expect_rc=1)
    last = _last_line(output)
    assert last.startswith("FloatingPointError: non-finite "), last
    assert last.endswith(f"; no checkpoint was saved yet in {workdir / 'checkpoints'}"), last
    assert "step None" not in output
    assert _steps(workdir / "checkpoints") == []


def _arrays_equal(directory, reference) -> None:
    """The newest checkpoint in `directory` holds `reference`'s newest state bit for bit."""

    def newest(path):
        manager = checkpointing.make_manager(path, async_save=False, create=False)
        try:
            return checkpointing.restore(manager, None, None)
        finally:
            manager.close()

    (state, positions, _), (want, want_positions, _) = newest(directory), newest(reference)
    assert positions == want_positions
    for (path, leaf), ref in zip(
        jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(want), strict=True
    ):
        np.testing.assert_array_equal(leaf, ref, err_msg=jax.tree_util.keystr(path))


def test_a_corrupt_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
    tmp_path, data_dir, env, finished
):
    workdir = tmp_path / "run"
    shutil.copytree(finished, workdir)
    checkpoints = workdir / "checkpoints"
    # Bytes flipped inside the arrays of the newest checkpoint: Orbax would read them back.
    data = max((checkpoints / "20" / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
    with open(data, "r+b") as f:
        f.seek(data.stat().st_size // 2)
        flipped = bytes(b ^ 0xFF for b in f.read(64))
        f.seek(data.stat().st_size // 2)
        f.write(flipped)
    output = _run(_command(workdir, data_dir), env, tmp_path / "restarted.log")
    assert f"checkpoint step 20 in {checkpoints / '20'} is unreadable: CheckpointError: " in output
    assert "differ from the fingerprint saved with them" in output
    assert f"renamed {checkpoints / '20'} to {checkpoints / '20'}.unreadable" in output
    assert f"train state from {checkpoints} step 15" in output
    # Steps 16-20 again, as the uninterrupted run did them; the damaged copy is kept.
    assert sorted(os.listdir(checkpoints)) == ["10", "15", "20", "20.unreadable"]
    _arrays_equal(checkpoints, finished / "checkpoints")


def test_no_readable_checkpoint_stops_the_run_with_one_line(tmp_path, data_dir, env, finished):
    workdir = tmp_path / "run"
    checkpoints = workdir / "checkpoints"
    shutil.copytree(finished / "checkpoints" / "20", checkpoints / "20")
    (checkpoints / "20" / "state" / "_METADATA").unlink()
    output = _run(_command(workdir, data_dir), env, tmp_path / "log", expect_rc=1)
    assert _last_line(output) == (
        f"pretrain: no readable checkpoint in {checkpoints}: step 20: FileNotFoundError: "
        f"{checkpoints / '20' / 'state' / '_METADATA'} is missing"
    )
    assert "Traceback" not in output
    assert sorted(os.listdir(checkpoints)) == ["20"]  # nothing renamed, nothing written
    assert _train_steps_logged(workdir) == []
