"""`python -m experiments.finetune_embeddings`, its own command line, for
tests/test_embeddings_multihost.py, with one flag of its own before the tool's:
--sigterm_at_step=N sends this process alone SIGTERM while it makes step N's batch (noted:
the step runs). Every process must then stop after the same step, exit 143 saying so, and
a rerun of the same command must resume there.

  python tests/embeddings_multihost_driver.py --sigterm_at_step=0 \
      --coordinator_address=127.0.0.1:PORT --num_processes=2 --process_id=1 \
      --config=experiments/configs/embeddings_contrastive_pretraining.py ... --workdir=DIR
"""

import os
import runpy
import signal
import sys
import time


def _sigterm_at(at: int) -> None:
    """SIGTERM to this process while it makes step `at`'s batch of raw-text pairs. At the
    next step it waits 3 s, a slow host: the other process waits for it in the step's
    collectives, and the stop step is agreed long before the run's last step."""
    from data_pipelines import crop_pairs

    real = crop_pairs.PairStream.batch

    def batch(self, step, *rows):
        if step == at:
            os.kill(os.getpid(), signal.SIGTERM)
        if step == at + 1:
            time.sleep(3)
        return real(self, step, *rows)

    crop_pairs.PairStream.batch = batch


def main(argv: list[str]) -> None:
    prefix = "--sigterm_at_step="
    if len(argv) < 2 or not argv[1].startswith(prefix):
        raise SystemExit(f"usage: {argv[0]} {prefix}N <experiments.finetune_embeddings flags>")
    _sigterm_at(int(argv[1].removeprefix(prefix)))
    sys.argv = [argv[0], *argv[2:]]
    runpy.run_module("experiments.finetune_embeddings", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv)
