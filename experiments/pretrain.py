r"""Pretrains BERT (MLM + NSP, or the objective `--config.objective` names: see
bert_jax.train) on a device mesh, with Orbax checkpoints in --workdir.

  python -m experiments.pretrain --config=experiments/configs/bert_tiny_cpu.py \
      --workdir=workdirs/tiny [--config.key=value ...]

Multi-host: on Cloud TPU VMs `jax.distributed.initialize()` finds its peers by itself;
elsewhere give --coordinator_address, --num_processes and --process_id.
"""

import contextlib
import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import distributed as multihost
from bert_jax.distributed import loopback_bind_address  # noqa: F401 (its home before)
from data_pipelines import cli

FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from bert_jax import config_bounds, workdir_lock

    # The multi-host flags and every key in its range (bert_jax.config_bounds), refused in
    # one line before JAX starts.
    multihost.check_or_exit(FLAGS, "pretrain")
    config_bounds.check_or_exit(FLAGS.config, "pretrain", "pretrain")
    distributed = multihost.requested(FLAGS)
    # One run per workdir, refused before any JAX work; a multi-process run is one run, its
    # process 0 holds the lock (taken once the processes know their indices).
    with contextlib.ExitStack() as lock:
        if not distributed:
            lock.enter_context(workdir_lock.hold_or_exit(FLAGS.workdir, "pretrain"))
        _run(distributed, lock)


def _run(distributed: bool, lock: contextlib.ExitStack) -> None:
    """`main` once the workdir is this run's (`lock`, where process 0 takes it when
    `distributed`)."""
    import jax

    from bert_jax import config_bounds, workdir_lock

    multihost.start(FLAGS)  # jax.distributed when `distributed`, before the backend starts
    # The rules that need the device and process counts (the batch over the data-parallel
    # devices and the data streams), before the mesh, the data and the compile.
    counts = dict(devices=jax.device_count(), processes=jax.process_count())
    config_bounds.check_or_exit(FLAGS.config, "pretrain", "pretrain", **counts)
    if distributed and jax.process_index() == 0:
        lock.enter_context(workdir_lock.hold_or_exit(FLAGS.workdir, "pretrain"))
    if jax.process_index() != 0:
        logging.set_verbosity(logging.WARNING)
    if FLAGS.verbosity <= 0:
        # Orbax narrates every save at INFO; keep the console to our own progress and metrics.
        logging.get_absl_handler().addFilter(lambda record: "/orbax/" not in record.pathname)
    if FLAGS.config.jax_cache_dir:
        # Before the first compile: JAX opens its cache once per process. Set here, it wins
        # over JAX_COMPILATION_CACHE_DIR (that variable only gives the option its default).
        jax.config.update("jax_compilation_cache_dir", FLAGS.config.jax_cache_dir)
        logging.info("compilation cache: %s", FLAGS.config.jax_cache_dir)
    from bert_jax import checkpointing, telemetry, train_loop
    from bert_jax.config import ConfigError
    from data_pipelines.input_pipeline import TokenIdError
    from data_pipelines.vocab_fingerprint import VocabMismatchError

    try:
        final = train_loop.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    except checkpointing.Interrupted as stopped:
        # The first Ctrl-C: the checkpoint of the step it stopped at has landed (named).
        sys.stderr.write(f"pretrain: {stopped}\n")
        raise SystemExit(128 + signal.SIGINT) from None
    except (
        checkpointing.CheckpointError,
        ConfigError,
        TokenIdError,
        VocabMismatchError,
        telemetry.MetricsPathError,
    ) as error:
        # A checkpoint that cannot be written or read, a config the run's parts refuse (the
        # objective's keys, the records' kind, a resumed model, a finished workdir), data
        # the run refuses or metrics it could not write: one line naming it, and the notes
        # on where the run stopped.
        notes = getattr(error, "__notes__", [])
        raise SystemExit("; ".join([f"pretrain: {error}", *notes])) from None
    if jax.process_index() == 0:
        logging.info("final metrics: %s", final)


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard events.")
    multihost.define_flags()  # --distributed, --coordinator_address, ... (bert_jax.distributed)
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
