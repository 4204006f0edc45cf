r"""Pretrains BERT (MLM + NSP, or the objective `--config.objective` names: see
bert_jax.train) on a device mesh, with Orbax checkpoints in --workdir.

  python -m experiments.pretrain --config=experiments/configs/bert_tiny_cpu.py \
      --workdir=workdirs/tiny [--config.key=value ...]

Multi-host: on Cloud TPU VMs `jax.distributed.initialize()` finds its peers by itself;
elsewhere give --coordinator_address, --num_processes and --process_id.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from data_pipelines import cli

FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from bert_jax import config_bounds

    # Every key in its range (bert_jax.config_bounds), refused in one line before JAX starts.
    config_bounds.check_or_exit(FLAGS.config, "pretrain", "pretrain")
    import jax

    if FLAGS.coordinator_address or FLAGS.distributed:
        if FLAGS.coordinator_address:
            # Gloo gives CPU processes their cross-process collectives (no effect elsewhere).
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=FLAGS.coordinator_address,
            num_processes=FLAGS.num_processes,
            process_id=FLAGS.process_id,
        )
    # The rules that need the device and process counts (the batch over the data-parallel
    # devices and the data streams), before the mesh, the data and the compile.
    counts = dict(devices=jax.device_count(), processes=jax.process_count())
    config_bounds.check_or_exit(FLAGS.config, "pretrain", "pretrain", **counts)
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
    from bert_jax import checkpointing, train_loop

    try:
        final = train_loop.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    except (checkpointing.CheckpointError, config_bounds.ConfigError) as error:
        # A checkpoint that cannot be written or read, or a config the run's parts refuse
        # (the objective's keys, the records' kind, a resumed model): one line naming it.
        raise SystemExit(f"pretrain: {error}") from None
    if jax.process_index() == 0:
        logging.info("final metrics: %s", final)


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard events.")
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-host off TPU).")
    flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host off TPU).")
    flags.DEFINE_integer("process_id", None, "This process's index (multi-host off TPU).")
    flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (Cloud TPU pods).")
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
