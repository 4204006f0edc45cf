"""SIGTERM and Ctrl-C in a fine-tuning run: one line saying what was saved, exit 128 + the
signal (`stopping_on_signals`), and a final save that completes before a stop takes effect
(`final_save`). Every fine-tuning entry point uses them through `finetune_main`;
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


def _on_signal(signum, frame):
    del frame
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
