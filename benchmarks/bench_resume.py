r"""Time to the first batch after a resume, at 10% and 90% of an epoch: the input pipeline
of a git revision before streams (which re-read the epoch's records up to the position)
against today's (which skips whole files by their record counts).

  python -m benchmarks.bench_resume --corpus_dir=workdirs/shakespeare \
      --workdir=/tmp/bench_resume --num_shards=256 --output_json=resume.json

1. Records: `create_pretraining_data` on `<corpus_dir>/train.txt` with `<corpus_dir>/vocab.txt`
   (`make pretrain-data` makes both), `--num_shards` shards of masked records with their
   stats JSON (skipped when the workdir has them). `--dupe_factor` sets the epoch's size, and
   `--repeat_records=K` multiplies it cheaply: each shard's bytes written K times over into
   `<workdir>/xK/` (TFRecords are self-framed, so that is a valid shard of K times the
   records; the epoch holds K copies of each, which changes nothing that is timed).
2. For each fraction of the epoch, the position a run there would have saved (global
   batch `--batch`, one process, seed 0), then `--reps` times, in alternating order: build
   the iterator from that position and take one batch, with the `--baseline_rev` pipeline
   (loaded from `git show REV:data_pipelines/input_pipeline.py`) and with today's. Also
   today's without the stats JSON (every shard counted once by reading it).
Medians; nothing here asserts a time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import types

from absl import flags

from data_pipelines import cli

# TensorFlow is imported where it is used: `-h` answers without it.

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_records(pattern: str) -> None:
    command = [
        sys.executable,
        "-m",
        "data_pipelines.create_pretraining_data",
        f"--input_file={FLAGS.corpus_dir}/train.txt",
        f"--output_file={FLAGS.workdir}/train.tfrecord",
        f"--vocab_file={FLAGS.corpus_dir}/vocab.txt",
        "--do_lower_case",
        "--max_seq_length=128",
        "--max_predictions_per_seq=20",
        f"--dupe_factor={FLAGS.dupe_factor}",
        f"--num_output_shards={FLAGS.num_shards}",
    ]
    subprocess.run(command, check=True, cwd=REPO)


def repeated(pattern: str, stats_path: str, times: int) -> tuple[str, str]:
    """(pattern, stats JSON) of the shards of `pattern`, each written `times` times over."""
    directory = os.path.join(FLAGS.workdir, f"x{times}")
    with open(stats_path) as f:
        stats = json.load(f)
    paths = [os.path.join(directory, os.path.basename(p)) for p in stats["output_files"]]
    out_stats = paths[0] + ".stats.json"
    if not os.path.exists(out_stats):
        os.makedirs(directory, exist_ok=True)
        for source, target in zip(stats["output_files"], paths, strict=True):
            with open(os.path.join(FLAGS.workdir, os.path.basename(source)), "rb") as f:
                data = f.read()
            with open(target, "wb") as f:
                f.write(data * times)
        counts = [count * times for count in stats["records_per_file"]]
        with open(out_stats, "w") as f:
            json.dump({"output_files": paths, "records_per_file": counts}, f)
    return os.path.join(directory, os.path.basename(pattern)), out_stats


def baseline_module() -> types.ModuleType:
    """The input pipeline module of `--baseline_rev`, imported from its source."""
    source = subprocess.run(
        ["git", "show", f"{FLAGS.baseline_rev}:data_pipelines/input_pipeline.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("baseline_input_pipeline")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(source, f"{FLAGS.baseline_rev}:input_pipeline.py", "exec"), module.__dict__)
    return module


def first_batch_seconds(module, pattern: str, position) -> float:
    start = time.perf_counter()
    iterator = module.make_pretraining_dataset(
        pattern,
        global_batch_size=FLAGS.batch,
        max_seq_length=128,
        max_predictions_per_seq=20,
        seed=0,
        process_index=0,
        process_count=1,
        start_position=position,
    )
    next(iterator)
    return time.perf_counter() - start


def main(argv):
    from data_pipelines import input_pipeline

    del argv
    load = os.getloadavg()[0]
    os.makedirs(FLAGS.workdir, exist_ok=True)
    pattern = os.path.join(FLAGS.workdir, "train-*.tfrecord")
    stats = os.path.join(FLAGS.workdir, f"train-00000-of-{FLAGS.num_shards:05d}.tfrecord")
    stats += ".stats.json"
    if not os.path.exists(stats):
        make_records(pattern)
    if FLAGS.repeat_records > 1:
        pattern, stats = repeated(pattern, stats, FLAGS.repeat_records)
    with open(stats) as f:
        records = sum(json.load(f)["records_per_file"])
    batches = records // FLAGS.batch
    baseline = baseline_module()
    hidden = stats + ".hidden"
    results = {"records": records, "shards": FLAGS.num_shards, "batches_per_epoch": batches}
    results["repeat_records"] = FLAGS.repeat_records
    for fraction in FLAGS.fractions:
        batch = int(fraction * batches)
        old_position = {
            "epoch": 0,
            "batch_in_epoch": batch,
            "process_index": 0,
            "process_count": 1,
            "seed": 0,
            "per_host_batch": FLAGS.batch,
            "num_host_files": FLAGS.num_shards,
            "dynamic_masking": False,
        }
        new_position = input_pipeline.merge_positions([old_position])
        new_position.pop("per_host")  # a position today's pipeline saved: no warning
        times = {"baseline": [], "streams": [], "streams_counting": []}
        for rep in range(FLAGS.reps):
            order = ["baseline", "streams"] if rep % 2 == 0 else ["streams", "baseline"]
            for name in order:
                module = baseline if name == "baseline" else input_pipeline
                position = old_position if name == "baseline" else new_position
                times[name].append(first_batch_seconds(module, pattern, position))
            os.rename(stats, hidden)  # no counts: each shard is read once to count it
            try:
                times["streams_counting"].append(
                    first_batch_seconds(input_pipeline, pattern, new_position)
                )
            finally:
                os.rename(hidden, stats)
        medians = {name: statistics.median(values) for name, values in times.items()}
        results[f"{fraction:g}"] = {
            "batch_in_epoch": batch,
            "seconds": times,
            "median_seconds": medians,
            "speedup": medians["baseline"] / medians["streams"],
        }
        print(
            f"{fraction:.0%} of the epoch (batch {batch} of {batches}): first batch after "
            f"{medians['baseline']:.2f} s ({FLAGS.baseline_rev}) vs {medians['streams']:.2f} s "
            f"(streams; {medians['streams_counting']:.2f} s counting without stats): "
            f"{medians['baseline'] / medians['streams']:.1f}x"
        )
    results["load_average_at_start"] = load
    if FLAGS.output_json:
        with open(FLAGS.output_json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    flags.DEFINE_string("corpus_dir", "workdirs/shakespeare", "train.txt and vocab.txt.")
    flags.DEFINE_string("workdir", "/tmp/bench_resume", "Where the sharded records go.")
    flags.DEFINE_integer("num_shards", 256, "Shards of the epoch.")
    flags.DEFINE_integer("dupe_factor", 5, "Masked copies of the corpus: the epoch's size.")
    flags.DEFINE_integer("repeat_records", 1, "Each shard written this many times over.")
    flags.DEFINE_integer("batch", 256, "Global batch (one process).")
    flags.DEFINE_multi_float("fractions", [0.1, 0.9], "Where in the epoch to resume.")
    flags.DEFINE_integer("reps", 3, "Measurements of each pipeline at each fraction.")
    flags.DEFINE_string("baseline_rev", "75d008b", "A git revision before streams.")
    flags.DEFINE_string("output_json", None, "Write every figure here.")
    cli.run(main)
