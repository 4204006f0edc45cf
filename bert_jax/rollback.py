"""Loss-spike rollback: a step whose loss blows up sends the run back to its last checkpoint.

Off by default (`config.rollback.enabled`). With it on, every step's metrics are checked when
the loop fetches them from the device (`bert_jax.train_loop`, every `log_every` steps and before
each checkpoint): a non-finite health metric, a param or update norm that jumped by orders of
magnitude (`bert_jax.train_state.StepHealth`: a loss may still be finite after it, the state
no longer resumable), or a loss above `spike_factor` times the median of the last
`median_window` step losses, is a spike. The run then restores its newest
checkpoint (each is saved only after such a check, so each is good), skips the next
`skip_batches` batches of the data stream from that checkpoint's position and goes on: the
step count continues from the restored step, and the steps done again get the same dropout
keys (`fold_in` of the step) on other data. Each rollback is logged and appended to
`<workdir>/rollbacks.jsonl` (metrics.jsonl holds numeric scalars per step, and is cut back to
the restored step). A spike beyond `max_rollbacks` within `window_steps` steps stops the run
with `RollbackError` naming every spike: a recipe that keeps diverging needs a person.
"""

from __future__ import annotations

import collections
import math

import numpy as np


class LossSpike(FloatingPointError):
    """A step whose metrics call for a rollback: non-finite, a norm that jumped, or a loss far
    above the median."""

    def __init__(self, step: int, loss: float, reason: str):
        super().__init__(f"{reason} at step {step}")
        self.step, self.loss, self.reason = step, loss, reason


class RollbackError(FloatingPointError):
    """A spike the run does not roll back from; the message holds the evidence."""


class SpikeDetector:
    """The running median of the last `window` step losses, and the losses above
    `factor` times it."""

    def __init__(self, factor: float, window: int):
        self.factor = factor
        self._losses = collections.deque(maxlen=window)

    def check(self, loss: float) -> str:
        """Why `loss` is a spike, '' if it is not (it then joins the window).

        Judged only once the window is full: the median of a few steps is too noisy to judge
        by (so the first `window` steps of a run, or of a restart, are checked for non-finite
        metrics only).
        """
        if len(self._losses) == self._losses.maxlen:
            median = float(np.median(self._losses))
            if loss > self.factor * median:
                return (
                    f"loss {loss:.4g} above {self.factor:g} x {median:.4g}, the median of the "
                    f"last {len(self._losses)} steps"
                )
        self._losses.append(loss)
        return ""


class Rollbacks:
    """The rollbacks of a run, and their limit: at most `max_rollbacks` for spikes whose steps
    lie within `window_steps` of each other; one more stops the run."""

    def __init__(self, max_rollbacks: int, window_steps: int):
        self.max_rollbacks = max_rollbacks
        self.window_steps = window_steps
        self.records: list[dict] = []  # one per rollback, as rollbacks.jsonl holds them

    def check(self, spike: LossSpike, checkpoint: int | None, directory) -> None:
        """Raises `RollbackError` where `spike` is not rolled back from: one too many in its
        window, or no checkpoint (`checkpoint` None) to go back to in `directory`."""
        near = [r for r in self.records if abs(r["step"] - spike.step) < self.window_steps]
        if len(near) >= self.max_rollbacks:
            evidence = "; ".join(_evidence(r) for r in near)
            raise RollbackError(
                f"{spike} after {len(near)} rollback(s) within {self.window_steps} steps "
                f"(config.rollback.max_rollbacks={self.max_rollbacks}): {evidence}"
            )
        if checkpoint is None:
            raise RollbackError(
                f"{spike}; no checkpoint was saved yet in {directory} to roll back to"
            )

    def record(
        self, spike: LossSpike, restored_step: int, skipped: int, skipped_from, resumed_at
    ) -> dict:
        """Records a rollback from `spike` to `restored_step` that skipped `skipped` batches,
        from the checkpoint's data positions `skipped_from` to `resumed_at` (every process's,
        as a checkpoint stores them); returns the record."""
        record = {
            "step": spike.step,
            "reason": spike.reason,
            # JSON has no NaN or Infinity: a non-finite loss is written as its name.
            "loss": spike.loss if math.isfinite(spike.loss) else str(spike.loss),
            "restored_step": restored_step,
            "skipped_batches": skipped,
            "skipped_from": skipped_from,
            "resumed_at": resumed_at,
        }
        self.records.append(record)
        return record


def _evidence(record: dict) -> str:
    return (
        f"{record['reason']} at step {record['step']}: rolled back to step "
        f"{record['restored_step']}, skipped {record['skipped_batches']} batches from data "
        f"position {record['skipped_from']}"
    )
