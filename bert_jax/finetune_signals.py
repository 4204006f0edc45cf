"""SIGTERM and Ctrl-C in a fine-tuning run: one line saying what was saved, exit 128 + the
signal (`stopping_on_signals`), a final save that completes before a stop takes effect
(`final_save`), and a step loop that stops between steps, at the same step on every process
(`signals_between_steps`). Every fine-tuning entry point uses them through `finetune_main`;
`finetune_common` re-exports the names its callers know.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)


class Stopped(KeyboardInterrupt):
    """SIGTERM or Ctrl-C stopped a fine-tuning run (`stopping_on_signals`); `outcome` says
    what of its results was saved."""

    def __init__(self, signum: int, outcome: str = "", saved: bool = False):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.saved = saved  # the run's results were all written before it stopped
        self.outcome = outcome or (
            "during training: nothing of this run was saved (a fine-tuning run writes its "
            "model and final metrics at its end); rerun it"
        )


class _FinalSave(threading.local):
    active = False  # inside `final_save`: a first signal waits for the save
    pending: int | None = None


_FINAL_SAVE = _FinalSave()


class _BetweenSteps(threading.local):
    noted: list[int] | None = None  # inside `signals_between_steps`: signals noted, not raised


_BETWEEN_STEPS = _BetweenSteps()


def _on_signal(signum, frame):
    del frame
    if _BETWEEN_STEPS.noted is not None:
        _BETWEEN_STEPS.noted.append(signum)
        return
    if _FINAL_SAVE.active and _FINAL_SAVE.pending is None:
        _FINAL_SAVE.pending = signum
        log.warning(
            "%s during the final save: it completes first (%s again undoes it and stops at once)",
            signal.Signals(signum).name,
            signal.Signals(signum).name,
        )
        return
    raise Stopped(signum)


@contextlib.contextmanager
def stopping_on_signals(tool: str) -> Iterator[None]:
    """SIGTERM (a preempted VM's notice) and Ctrl-C stop a fine-tuning run with one line
    saying what was saved, exit code 128 + the signal: during training nothing (the run
    saves at its end), during `final_save` the save first completes (a second signal undoes
    it instead). Only in the main thread (signal handlers live there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except Stopped as stopped:
        message = f"{tool}: stopped by {signal.Signals(stopped.signum).name} {stopped.outcome}"
        log.error("%s", message)
        raise SystemExit(128 + stopped.signum) from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def final_save(what: str) -> Iterator[None]:
    """The end of a run that saves (`what`: its checkpoint and metrics.json): a SIGTERM or
    Ctrl-C that arrives inside lets it complete, then stops the run saying so; a second
    one stops it at once, the save undone (`convert.writing_dir` removes its temporary, the
    old checkpoint stays), and says that."""
    _FINAL_SAVE.active, _FINAL_SAVE.pending = True, None
    try:
        yield
    except Stopped as stopped:
        stopped.outcome = (
            f"during the final save, which was undone: {what} hold what they held before"
        )
        raise
    finally:
        _FINAL_SAVE.active = False
    pending, _FINAL_SAVE.pending = _FINAL_SAVE.pending, None
    if pending is not None:
        raise Stopped(
            pending, f"during the final save, which completed first: {what} are written", True
        )


# What JAX's SIGTERM notifier writes in the coordination service when its process gets
# SIGTERM (kPreemptionNoticeKey of xla/tsl's preemption_sync_manager.cc): every process's
# preemption sync manager waits on it, then agrees on the step to stop at.
PREEMPTION_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"


class StepBoundary:
    """Where a step loop inside `signals_between_steps` asks whether to stop: `stop_after`."""

    def __init__(self, noted: list[int], watcher=None):
        self.noted = noted  # the signals this process got, in order
        self._watcher = watcher  # more than one process: the agreement pretraining uses
        self._announced = False

    def stop_after(self, step: int) -> int | None:
        """The signal to stop with once `step` steps are done (None: train on). One process:
        its first signal. More than one: the same step on every process, once any of them
        got SIGTERM or Ctrl-C (JAX's preemption sync service, as `PreemptionWatcher`);
        `step` must grow by one a call, the same on every process."""
        if self._watcher is None:
            return self.noted[0] if self.noted else None
        if self.noted and not self._announced:
            self._announced = True
            announce_preemption()
        if not self._watcher.should_stop(step):
            return None
        here = signal.Signals(self.noted[0]).name if self.noted else "a signal to another process"
        log.warning("stopping after step %d on every process (%s)", step, here)
        return self.noted[0] if self.noted else signal.SIGTERM


def announce_preemption() -> None:
    """Tells every process's preemption sync manager that this one must stop: the notice
    JAX's own SIGTERM notifier posts (its handler is this module's while a loop runs, and
    Ctrl-C has none). A notice already posted (another process's) stands."""
    import datetime

    import jax
    from jax._src import distributed

    now = datetime.datetime.now(datetime.UTC).isoformat()  # the "death time"
    try:
        distributed.global_state.client.key_value_set(PREEMPTION_NOTICE_KEY, now)
    except jax.errors.JaxRuntimeError as error:  # ALREADY_EXISTS: the agreement is under way
        log.info("a preemption notice was posted already: %s", error)


@contextlib.contextmanager
def signals_between_steps(manager=None) -> Iterator[StepBoundary]:
    """SIGTERM and Ctrl-C noted instead of raised while a step loop runs: the loop asks the
    yielded `StepBoundary` after each step, and when it says stop, saves and raises
    `Stopped` (a step interrupted half-way would leave the donated state gone). With more
    than one process the stop step is agreed through `manager` (a checkpoint manager:
    `checkpointing.PreemptionWatcher`'s), so all processes save the same step together.
    Handlers only in the main thread, where they live."""
    import jax

    watcher = None
    if jax.process_count() > 1:
        from jax._src import distributed

        from bert_jax import checkpointing

        watcher = checkpointing.PreemptionWatcher(manager)  # installs no handler here
        if distributed.global_state.preemption_sync_manager is None:
            log.warning(
                "JAX's preemption service is off (jax_enable_preemption_service): SIGTERM "
                "and Ctrl-C cannot stop this multi-process run at one step"
            )
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield StepBoundary(noted, watcher)
        return
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    outer, _BETWEEN_STEPS.noted = _BETWEEN_STEPS.noted, noted
    try:
        yield StepBoundary(noted, watcher)
    finally:
        _BETWEEN_STEPS.noted = outer
        for signum, handler in previous.items():
            signal.signal(signum, handler)
