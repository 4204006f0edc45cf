"""finetune_signals.signals_between_steps: a signal is noted, the step loop asks after each
step; with more than one process the signalled one announces the stop once and every
process stops at the step the agreement names (tests/test_embeddings_multihost.py runs it
on two real processes)."""

import os
import signal

from bert_jax import finetune_signals


def test_one_process_notes_the_signal_and_stops_after_the_step_in_flight():
    before = signal.getsignal(signal.SIGINT)
    with finetune_signals.signals_between_steps() as boundary:
        assert boundary.stop_after(1) is None
        os.kill(os.getpid(), signal.SIGINT)  # noted, not raised
        os.kill(os.getpid(), signal.SIGTERM)
        assert boundary.stop_after(2) == signal.SIGINT  # the first one
    assert signal.getsignal(signal.SIGINT) is before


class _Agreement:
    """The sync service's answer: every process stops after step `at`."""

    def __init__(self, at):
        self.at, self.asked = at, []

    def should_stop(self, step):
        self.asked.append(step)
        return step == self.at


def test_more_processes_stop_at_the_agreed_step_the_signalled_one_announcing_once(monkeypatch):
    announced = []
    monkeypatch.setattr(finetune_signals, "announce_preemption", lambda: announced.append(1))
    signalled = finetune_signals.StepBoundary([signal.SIGINT], _Agreement(3))
    other = finetune_signals.StepBoundary([], _Agreement(3))
    assert [signalled.stop_after(s) for s in (1, 2, 3)] == [None, None, signal.SIGINT]
    assert len(announced) == 1  # once, not once a step
    assert [other.stop_after(s) for s in (1, 2, 3)] == [None, None, signal.SIGTERM]
    assert len(announced) == 1  # a process that got no signal announces nothing
