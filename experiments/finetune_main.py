"""The `main` every fine-tuning entry point shares (`make_main`): its flags `--config` and
`--workdir` checked and the workdir held before any data is read or any JAX work starts.

Order: the workdir against the models the run reads and the run that finished there
(`bert_jax.finetune_workdir`: a workdir that is, holds or is inside `init_from` is refused,
and so is a finished workdir rerun with other flags, both before anything is written), the
workdir lock (`bert_jax.workdir_lock`: a second run on the workdir is refused at once,
naming the holder), then every config key in its range with the batches over the devices
(`bert_jax.config_bounds`, one line naming the key), then, for scripts whose result is a
saved model, whether that save may replace what is in `<workdir>/checkpoint`
(`finetune_common.check_can_save`): each refusal comes before training, never after it.
An earlier run's results stay as they were unless the rerun completes
(`finetune_workdir.keeping_earlier_run`); a completed run records its flags
(`finetune_workdir.RECORD_FILE`). SIGTERM and Ctrl-C stop the run with one line saying what
was saved (`finetune_common.stopping_on_signals`); data, vocabulary and config errors are
one line naming the file, line or key.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

from absl import app, flags


def make_main(
    run: Callable[..., object], tool: str, *, saves_model: bool = False, holds_workdir: bool = True
):
    """The absl `main` of the entry point `tool`, which calls `run(config, workdir)`.

    `holds_workdir=False` is for the processes of a multi-process run but the first: they
    make the same refusals (each reads the same workdir and config, so all stop together)
    and run, while process 0 alone holds the workdir lock, sets an earlier run's results
    aside and records the finished run.
    """

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        from bert_jax import config_bounds, finetune_workdir, workdir_lock

        config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
        try:  # before the lock: nothing is written to a workdir refused here
            finetune_workdir.check_not_a_model(config, workdir)
            finetune_workdir.check_rerun(config, workdir, tool)
        except finetune_workdir.WorkdirError as error:
            raise SystemExit(f"{tool}: {error}") from None
        given = finetune_workdir.given_config(config)  # before the run fills in what it found
        held = workdir_lock.hold_or_exit(workdir, tool) if holds_workdir else nullcontext()
        with held:
            import jax

            config_bounds.check_or_exit(config, "finetune", tool, devices=jax.device_count())
            from bert_jax import finetune_common

            if saves_model:
                finetune_common.check_can_save(workdir, tool)
            # SIGTERM or Ctrl-C: one line saying what was saved, exit 128 + the signal.
            with finetune_common.stopping_on_signals(tool):
                try:
                    if not holds_workdir:
                        run(config, workdir)
                    else:
                        with finetune_workdir.keeping_earlier_run(workdir):
                            _run_and_record(run, config, workdir, tool, given)
                except _one_line_errors() as error:  # a key, file or vocabulary refused
                    raise SystemExit(f"{tool}: {error}") from None

    return main


def _run_and_record(run, config, workdir: str, tool: str, given: dict) -> None:
    """`run`, then the record that the run finished with the flags `given`."""
    from bert_jax import finetune_common, finetune_workdir

    try:
        run(config, workdir)
    except finetune_common.Stopped as stopped:
        if stopped.saved:  # stopped once its final save completed: the run is finished
            finetune_workdir.write_record(given, workdir, tool)
        raise
    finetune_workdir.write_record(given, workdir, tool)


def _one_line_errors() -> tuple[type[Exception], ...]:
    """What a fine-tuning run refuses in one line rather than a traceback: a config key the
    model or data refuse, a data file's line, a vocabulary or casing of another model, a
    checkpoint that does not read as its format says."""
    from bert_jax.config import ConfigError
    from bert_jax.convert import ConversionError
    from data_pipelines.tasks.formats import TaskDataError
    from data_pipelines.vocab_fingerprint import VocabMismatchError

    return ConfigError, ConversionError, TaskDataError, VocabMismatchError
