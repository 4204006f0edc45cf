"""A soak of crashes: `experiments.pretrain` interrupted at moments drawn from a seeded RNG
and restarted each time ends as the uninterrupted run does: the same train state bit for
bit, the same data position, each step once in metrics.jsonl (test_resume's
`_assert_same_run` against its `reference` run; its machinery is reused here).

Three kinds of interruption, each once the run has logged a drawn step:
  steps    SIGKILL after a step that saves no checkpoint;
  save     SIGKILL while the async save of a drawn checkpoint step is writing its temporary
           directory (or just after it landed, when the poll misses that moment);
  sigterm  SIGTERM: the run saves at the step it is at and exits 0.
Every restart resumes from the newest complete checkpoint (from scratch when there is none).
The figures (seed, kinds, the drawn steps, where each interruption landed, the steps resumed
from, wall time) are printed: `pytest -s` shows them, and a failure does.
"""

import os
import re
import signal
import time

import numpy as np
import pytest
import test_resume
from test_resume import (
    CHECKPOINT_EVERY,
    STEPS,
    _assert_same_run,
    _command,
    _finish,
    _resumed_from,
    _start,
    _step_dirs,
    _wait_for,
)

# test_resume's fixtures, instantiated for this module: the reference run is its own.
data_dir, env, reference = test_resume.data_dir, test_resume.env, test_resume.reference

KINDS = ("steps", "save", "sigterm")


def _logged(log_path) -> int:
    """The last step the process writing `log_path` has logged (0 before its first)."""
    steps = re.findall(r"\] step (\d+): ", log_path.read_text())
    return int(steps[-1]) if steps else 0


def _saves_in_flight(workdir, since_ns: int) -> list[int]:
    """Steps of the temporary checkpoint directories made since `since_ns`. An older one is
    a killed run's leftover, which Orbax replaces when it saves that step again."""
    steps = []
    for name in _step_dirs(workdir)[1]:
        try:
            made = os.stat(workdir / "checkpoints" / name).st_mtime_ns
        except FileNotFoundError:  # it landed (was renamed) meanwhile
            continue
        if made >= since_ns:
            steps.append(int(name.split(".")[0]))
    return steps


def _draw_moment(kind: str, resume: int, rng: np.random.Generator) -> int | None:
    """The step after which a run resumed from `resume` is interrupted (None: none left).

    Drawn from the next CHECKPOINT_EVERY + 1 steps (each place relative to the next
    checkpoint), so that a dozen interruptions spread over the run's 30 steps instead of
    the first few reaching its end.
    """
    steps = range(resume + 1, min(resume + CHECKPOINT_EVERY + 1, STEPS) + 1)
    if kind == "save":  # the last checkpoint too: the run waits for it before exiting
        candidates = [s for s in steps if s % CHECKPOINT_EVERY == 0]
    elif kind == "steps":
        candidates = [s for s in steps if s % CHECKPOINT_EVERY and s < STEPS]
    else:
        candidates = [s for s in steps if s < STEPS]
    return int(rng.choice(candidates)) if candidates else None


def _interrupt(kind: str, step: int, workdir, proc, log_path, since_ns: int) -> tuple[dict, str]:
    """Interrupts `proc` at `kind`'s moment after `step` and checks how it ended; returns
    where the interruption landed (figures) and the run's output."""

    def moment():
        if _logged(log_path) < step:
            return False
        return (
            kind != "save" or step in _saves_in_flight(workdir, since_ns) + _step_dirs(workdir)[0]
        )

    _wait_for(moment, proc, f"the moment of {kind} after step {step}")
    in_flight = _saves_in_flight(workdir, since_ns)
    proc.send_signal(signal.SIGTERM if kind == "sigterm" else signal.SIGKILL)
    output = _finish(proc, log_path, expect_rc=None)
    complete, leftovers = _step_dirs(workdir)
    finished = STEPS in complete  # the run ended before the signal reached it
    if kind == "sigterm":
        stopped = re.search(r"stopped by SIGTERM after step (\d+)", output)
        if stopped:
            assert proc.returncode == 0, output[-3000:]
            assert step <= int(stopped.group(1)) == complete[-1] == _logged(log_path)
        else:
            assert finished and proc.returncode in (0, -signal.SIGTERM), output[-3000:]
    else:
        assert proc.returncode == -signal.SIGKILL or (finished and proc.returncode == 0)
    # A save the kill cut short is not a checkpoint (Orbax lists complete steps only).
    assert all(int(name.split(".")[0]) > max(complete, default=0) for name in leftovers)
    figures = {
        "landed": _logged(log_path),  # the last step the run logged
        "saves_cut": [s for s in in_flight if s not in complete],  # in flight, never landed
        "checkpoints": complete,
    }
    return figures, output


def _soak(tmp_path, data_dir, env, reference, seed: int, per_kind: int) -> None:
    """Interrupts and restarts one run `per_kind` times with each kind, in an order and at
    moments drawn from `seed`; lets the last restart finish; compares it with `reference`."""
    rng = np.random.default_rng(seed)
    kinds = [str(kind) for kind in rng.permutation(np.repeat(KINDS, per_kind))]
    print(f"\nsoak: seed {seed}; {len(kinds)} interruptions: {', '.join(kinds)}; in {tmp_path}")
    workdir = tmp_path / "run"
    command = _command(workdir, data_dir)
    began, runs = time.monotonic(), 0
    for i, kind in enumerate([*kinds, None]):  # None: the last run, left to finish
        complete = _step_dirs(workdir)[0]
        resume = complete[-1] if complete else 0
        step = _draw_moment(kind, resume, rng) if kind else None
        if kind and step is None:  # the run has ended (or has only its last step left)
            print(f"  {i}: {kind}: no moment left after step {resume}, skipped")
            continue
        log_path = tmp_path / f"run{i}.log"
        since_ns = time.time_ns()
        proc = _start(command, env, log_path)
        runs += 1
        if kind is None:
            output = _finish(proc, log_path)
            figures = {"checkpoints": _step_dirs(workdir)[0]}
        else:
            figures, output = _interrupt(kind, step, workdir, proc, log_path, since_ns)
        # Each restart resumes from the newest complete checkpoint, whatever else is there.
        if resume:
            assert _resumed_from(output) == resume
        else:
            assert "train state from scratch" in output, output[-3000:]
        print(f"  {i}: {kind or 'to the end'}: resumed from {resume}, drawn {step}, {figures}")
    print(f"soak: {runs} runs, {time.monotonic() - began:.0f} s wall")
    _assert_same_run(workdir, reference)


@pytest.mark.extended  # about a minute: 4 runs besides its own reference
def test_one_interruption_of_each_kind_then_the_run_ends_as_the_uninterrupted_one(
    tmp_path, data_dir, env, reference
):
    """Extended tier. Each kind's path stays in make test: a SIGKILL mid-save (or just after
    a step) then a restart in test_resume's test_sigkill_mid_training_then_restart_equals_the_
    uninterrupted_run, SIGTERM in test_sigterm_saves_at_the_current_step_exits_0_and_resumes_
    exactly; what this adds is the three in one run."""
    _soak(tmp_path, data_dir, env, reference, seed=0, per_kind=1)


@pytest.mark.slow
def test_a_dozen_random_interruptions_then_the_run_ends_as_the_uninterrupted_one(
    tmp_path, data_dir, env, reference
):
    # A new seed each time (SOAK_SEED=<the printed seed> draws the same moments again; where
    # each interruption lands still depends on timing).
    seed = int(os.environ.get("SOAK_SEED", np.random.SeedSequence().entropy % 2**32))
    _soak(tmp_path, data_dir, env, reference, seed, per_kind=4)
