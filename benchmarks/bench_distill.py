r"""Inference sequences/s of a distillation teacher and its student on this machine.

  python -m benchmarks.bench_distill --teacher=workdirs/distill/teacher/checkpoint \
      --student=workdirs/distill/mini/student/checkpoint [--batch_size=64 --seq_length=64]

Both are checkpoints that `experiments.finetune_classification` or
`experiments.distill_classification` write. The measurement (interleaved timed passes of
each model's jitted forward pass, best pass reported) is `experiments.inference_speed`,
which `distill_classification` also runs for its report. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os

from experiments.inference_speed import compare


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("--teacher", required=True, help="teacher checkpoint directory")
    parser.add_argument("--student", required=True, help="student checkpoint directory")
    parser.add_argument("--batch_size", type=int, default=64, help="sequences per batch")
    parser.add_argument("--seq_length", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per model")
    parser.add_argument("--iters", type=int, default=10, help="batches per timed pass")
    parser.add_argument("--output_json", default="", help="also write the result here")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    result = compare(
        args.teacher, args.student, batch_size=args.batch_size, seq_length=args.seq_length,
        repeats=args.repeats, iters=args.iters,
    )  # fmt: skip
    print("| model | parameters | seq/s |\n| --- | ---: | ---: |")
    for name in ("teacher", "student"):
        params, rate = result[f"{name}_params"], result[f"{name}_seq_per_s"]
        print(f"| {name} | {params / 1e6:.2f}M | {rate:.0f} |")
    print(f"speed-up {result['speedup']:.2f}x. {result['note']}")
    if args.output_json:
        tmp = args.output_json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        os.replace(tmp, args.output_json)


if __name__ == "__main__":
    main()
