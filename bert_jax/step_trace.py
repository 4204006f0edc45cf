"""The profiler's window over a pretraining run: `config.profile`'s steps traced with
jax.profiler where TensorBoard's profile plugin and XProf look for them
(`bert_jax.train_loop` opens and closes it around each step)."""

from __future__ import annotations

import os

import jax
from absl import logging

from bert_jax.config import ConfigError


class StepTrace:
    """Traces steps [start_step, start_step + num_steps) of `config.profile` with
    jax.profiler into `<workdir>/plugins/profile/<run>/<host>.xplane.pb`, where TensorBoard's
    profile plugin and XProf look for it; on process 0 only unless
    `config.profile.all_processes` (each host then writes its own file). A run that begins
    past start_step (a resume) traces nothing: half a window would read as the whole one.
    """

    def __init__(self, config, workdir: str, start: int):
        profile = config.get("profile")  # configs older than the block: no trace
        first = profile.start_step if profile else 0
        self.steps = range(first, first + (profile.num_steps if profile else 0))
        self.workdir, self.active = workdir, False
        if not self.steps:
            return
        if first < 1:  # the loop's steps count from 1
            raise ConfigError(
                f"config.profile.start_step={first}: the first step is 1 (it also compiles, "
                "so 2 or later traces training steps alone)"
            )
        if jax.process_index() != 0 and not profile.all_processes:
            self.steps = range(0)
        elif start >= first:
            logging.info("no profile trace: the run begins after profile.start_step %d", first)
            self.steps = range(0)

    def before(self, step: int) -> None:
        if self.steps and step == self.steps[0] and not self.active:
            jax.profiler.start_trace(self.workdir)
            self.active = True

    def after(self, step: int, state) -> None:
        if self.active and step == self.steps[-1]:
            # The step's device work, not only its dispatch, belongs in the trace.
            jax.block_until_ready(state)
            self._stop(step)

    def close(self, step: int) -> None:
        if self.active:
            try:
                self._stop(step)
            except Exception as error:  # must not hide why the loop stopped
                logging.warning("the profile trace could not be written: %s", error)

    def _stop(self, step: int) -> None:
        jax.profiler.stop_trace()
        where = os.path.join(self.workdir, "plugins", "profile")
        logging.info("profile trace of steps %d to %d written in %s", self.steps[0], step, where)
        # Traced once: a rollback that repeats the window does not trace it again.
        self.active, self.steps = False, range(0)
