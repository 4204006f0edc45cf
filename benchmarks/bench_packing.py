r"""Sequence packing on a CPU: the padding it removes and the real tokens per second it buys.

  python -m benchmarks.bench_packing --train_files='workdirs/shakespeare/train-*.tfrecord' \
      --vocab_file=workdirs/shakespeare/vocab.txt --max_seq_length=128 \
      --max_predictions_per_seq=20 --steps=200 --reps=3 --output_json=packing128.json

1. Padding: the input pipeline's batches (global batch `--batch`, seed 0), unpacked and
   packed (`--max_instances_per_row`), over `--padding_batches` batches: the fraction of row
   tokens that are padding, and instances per row.
2. Throughput: `experiments.pretrain` with `bert_tiny_cpu.py` on those records, unpacked and
   packed in turn (`--reps` times, the first mode alternating), `--steps` steps each, no
   evaluation. metrics.jsonl gives steps/s per `--log_every` window (the first step, which
   compiles, is never timed); the real (non-padding) tokens of each window's steps are
   counted from the same deterministic stream. Figures are medians over all windows.
Nothing here asserts a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from absl import flags

from data_pipelines import cli

# TensorFlow and JAX are imported where they are used: `-h` answers without them.

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stream(pack: bool):
    from data_pipelines import input_pipeline

    return input_pipeline.make_pretraining_dataset(
        FLAGS.train_files,
        global_batch_size=FLAGS.batch,
        max_seq_length=FLAGS.max_seq_length,
        max_predictions_per_seq=FLAGS.max_predictions_per_seq,
        seed=0,  # bert_tiny_cpu's seed: the stream its training run reads
        process_index=0,
        process_count=1,
        max_instances_per_row=FLAGS.max_instances_per_row if pack else None,
    )


def real_tokens_per_step(pack: bool, steps: int) -> list[int]:
    stream = _stream(pack)
    return [int(next(stream)["input_mask"].sum()) for _ in range(steps)]


def padding(pack: bool) -> dict[str, float]:
    stream = _stream(pack)
    tokens = rows = instances = 0
    for _ in range(FLAGS.padding_batches):
        batch = next(stream)
        tokens += int(batch["input_mask"].sum())
        rows += len(batch["input_ids"])
        instances += int(batch["instance_weights"].sum()) if pack else len(batch["input_ids"])
    return {
        "padding_fraction": 1 - tokens / (rows * FLAGS.max_seq_length),
        "instances_per_row": instances / rows,
    }


def train_windows(pack: bool, real_tokens: list[int]) -> list[float]:
    """Real tokens/s of each logged window of one `experiments.pretrain` run."""
    from bert_jax import telemetry

    with tempfile.TemporaryDirectory() as workdir:
        command = [
            sys.executable,
            "-m",
            "experiments.pretrain",
            f"--config={REPO}/experiments/configs/bert_tiny_cpu.py",
            f"--workdir={workdir}",
            f"--config.data.train_files={FLAGS.train_files}",
            "--config.data.eval_files=",
            f"--config.data.vocab_file={FLAGS.vocab_file}",
            f"--config.data.max_seq_length={FLAGS.max_seq_length}",
            f"--config.data.max_predictions_per_seq={FLAGS.max_predictions_per_seq}",
            f"--config.data.pack={pack}",
            f"--config.data.max_instances_per_row={FLAGS.max_instances_per_row}",
            f"--config.global_batch_size={FLAGS.batch}",
            f"--config.num_train_steps={FLAGS.steps}",
            f"--config.log_every={FLAGS.log_every}",
            "--config.eval_every=0",
            f"--config.checkpoint_every={10 * FLAGS.steps}",
        ]
        subprocess.run(command, check=True, cwd=REPO, capture_output=True)
        logged = telemetry.read_metrics(os.path.join(workdir, "metrics.jsonl"))
    windows, previous = [], 1  # step 1 compiles and is not timed
    for record in logged:
        if record.get("split") != "train" or "steps_per_second" not in record:
            continue
        step = record["step"]
        tokens = sum(real_tokens[previous:step])  # steps previous+1 .. step (0-based list)
        windows.append(tokens * record["steps_per_second"] / (step - previous))
        previous = step
    return windows


def main(argv):
    del argv
    result = {
        "max_seq_length": FLAGS.max_seq_length,
        "batch": FLAGS.batch,
        "max_instances_per_row": FLAGS.max_instances_per_row,
        "load_before": os.getloadavg(),
    }
    for pack in (False, True):
        result[("packed" if pack else "unpacked") + "_padding"] = padding(pack)
    print(json.dumps(result, indent=1), flush=True)
    if FLAGS.steps:
        tokens = {pack: real_tokens_per_step(pack, FLAGS.steps) for pack in (False, True)}
        windows = {False: [], True: []}
        for rep in range(FLAGS.reps):
            for pack in (rep % 2 == 1, rep % 2 == 0):  # alternate which mode runs first
                windows[pack] += train_windows(pack, tokens[pack])
                print(f"rep {rep} pack={pack}: {np.median(windows[pack]):.0f} real tokens/s")
        for pack, name in ((False, "unpacked"), (True, "packed")):
            result[f"{name}_real_tokens_per_second"] = float(np.median(windows[pack]))
            result[f"{name}_real_tokens_per_step"] = float(np.mean(tokens[pack][1:]))
        result["gain"] = (
            result["packed_real_tokens_per_second"] / result["unpacked_real_tokens_per_second"]
        )
        result["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    if FLAGS.output_json:
        with open(FLAGS.output_json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    flags.DEFINE_string("train_files", None, "Masked pretraining TFRecords (glob).")
    flags.DEFINE_string("vocab_file", None, "The vocab the records were made with.")
    flags.DEFINE_integer("max_seq_length", 128, "T of the records.")
    flags.DEFINE_integer("max_predictions_per_seq", 20, "P of the records.")
    flags.DEFINE_integer("max_instances_per_row", 4, "Instance slots of a packed row.")
    flags.DEFINE_integer("batch", 64, "Global batch (rows).")
    flags.DEFINE_integer("padding_batches", 200, "Batches counted for the padding figures.")
    flags.DEFINE_integer("steps", 200, "Training steps per run (0: padding figures only).")
    flags.DEFINE_integer("log_every", 10, "Steps per timed window.")
    flags.DEFINE_integer("reps", 3, "Runs of each mode, interleaved.")
    flags.DEFINE_string("output_json", "", "Where to write the figures.")
    flags.mark_flags_as_required(["train_files", "vocab_file"])
    cli.run(main)
