"""One process of a contrastive-pretraining run (experiments.finetune_embeddings on raw
text) for tests/test_embeddings_multihost.py: with --num_processes=2 each of two processes
owns 4 CPU devices (jax.distributed + gloo) and feeds its rows of the global batch; with 1,
a plain process owns all 8 (the reference). With --sigterm_at_step, this process alone
sends itself SIGTERM while it makes that step's batch: every process must stop after the
same step, exit 143 saying so, and a rerun must resume there."""

import os
import signal
import sys
import time

import jax


def main(argv: list[str]) -> None:
    from absl import flags

    flags.DEFINE_integer("num_processes", 2, "1: a plain single-process run (the reference).")
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
    flags.DEFINE_integer("process_id", 0, "This process's index.")
    flags.DEFINE_string("init_from", None, "The encoder (a transformers directory).")
    flags.DEFINE_string("corpus", None, "The raw text the pairs are made from.")
    flags.DEFINE_string("workdir", None, "The run's workdir.")
    flags.DEFINE_integer("sigterm_at_step", -1, "This process gets SIGTERM at this step.")
    flag_values = flags.FLAGS
    flag_values(argv)
    from multihost_driver import start_processes

    start_processes(flag_values)
    from bert_jax import finetune_signals
    from experiments import finetune_embeddings
    from experiments.configs import embeddings_contrastive_pretraining

    config = embeddings_contrastive_pretraining.get_config()
    config.init_from = flag_values.init_from
    config.corpus_files = flag_values.corpus
    config.global_batch_size = 16
    config.chunk_size = 8
    config.num_train_steps = 4
    config.learning_rate = 2e-3
    config.warmup_proportion = 0.0
    config.max_seq_length = 16
    config.query_max_seq_length = 16
    config.log_every = 1
    config.passages_per_document = 2
    config.checkpoint_every = 2  # a multi-process save of the resume point too
    if flag_values.sigterm_at_step >= 0:
        _sigterm_at(finetune_embeddings.CorpusPairs, flag_values.sigterm_at_step)
    try:  # as the fine-tuning CLI: a stop is one line saying what was saved, exit 128 + 15
        with finetune_signals.stopping_on_signals("embeddings_multihost_driver"):
            finetune_embeddings.run(config, flag_values.workdir)
    finally:
        if flag_values.num_processes > 1:
            jax.distributed.shutdown()


def _sigterm_at(pairs, at: int) -> None:
    """SIGTERM to this process while it makes step `at`'s batch (noted: the step runs). At
    the next step it waits 3 s, a slow host: the other process waits for it in the step's
    collectives, and the stop step is agreed long before the run's last step."""
    real = pairs.batch

    def batch(self, step):
        if step == at:
            os.kill(os.getpid(), signal.SIGTERM)
        if step == at + 1:
            time.sleep(3)
        return real(self, step)

    pairs.batch = batch


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv)
