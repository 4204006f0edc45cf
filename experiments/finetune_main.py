"""The `main` every fine-tuning entry point shares (`make_main`): its flags `--config` and
`--workdir` checked and the workdir held before any data is read or any JAX work starts.

Order: the workdir lock (`bert_jax.workdir_lock`: a second run on the workdir is refused at
once, naming the holder), then every config key in its range with the batches over the
devices (`bert_jax.config_bounds`, one line naming the key), then, for scripts whose result
is a saved model, whether that save may replace what is in `<workdir>/checkpoint`
(`finetune_common.check_can_save`): each refusal comes before training, never after it.
SIGTERM and Ctrl-C stop the run with one line saying what was saved
(`finetune_common.stopping_on_signals`).
"""

from __future__ import annotations

from collections.abc import Callable

from absl import app, flags


def make_main(run: Callable[..., object], tool: str, *, saves_model: bool = False):
    """The absl `main` of the entry point `tool`, which calls `run(config, workdir)`."""

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        from bert_jax import config_bounds, workdir_lock

        config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
        with workdir_lock.hold_or_exit(workdir, tool):
            import jax

            config_bounds.check_or_exit(config, "finetune", tool, devices=jax.device_count())
            from bert_jax import finetune_common

            if saves_model:
                finetune_common.check_can_save(workdir, tool)
            # SIGTERM or Ctrl-C: one line saying what was saved, exit 128 + the signal.
            from bert_jax.config import ConfigError

            with finetune_common.stopping_on_signals(tool):
                try:
                    run(config, workdir)
                except ConfigError as error:  # a key the model or data refuse: one line
                    raise SystemExit(f"{tool}: {error}") from None

    return main
