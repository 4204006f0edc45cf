r"""What the two bf16 options do to a TPU step, by the compiler, and to a held-out MLM curve.

`--what=estimate` compiles a config's train step for its TPU slice (needs libtpu; nothing is
allocated) four times: the default, `grad_reduce_dtype=bfloat16` (matmul kernels' gradients
summed over the cores in bf16), `optimizer.mu_dtype=bfloat16` (Adam's first moment stored in
bf16) and both; for each, the compiler's step time (`optimal_seconds` of the unrolled step,
as `experiments.aot_compile` reports it), the MFU it implies, the peak memory per core and
the bytes of each kind of collective per core (the collectives' results, by dtype).

`--what=curves` reads the `metrics.jsonl` of pretraining runs named `<variant>-s<seed>` under
`--runs` and prints their held-out MLM loss / accuracy at every evaluation.

  python -m benchmarks.studies.bf16_options --config=experiments/configs/bert_large_paper.py:phase1
  python -m benchmarks.studies.bf16_options --what=curves --runs=/tmp/runs
(docs/tpu_estimates.md, "bf16 gradient sums and first moment", has the figures of 2026-11-27.)
"""

from __future__ import annotations

import collections
import os
import re

from absl import flags
from ml_collections import config_flags

from data_pipelines import cli

FLAGS = flags.FLAGS

VARIANTS = {  # name: (grad_reduce_dtype, optimizer.mu_dtype)
    "default": ("float32", "float32"),
    "reduce": ("bfloat16", "float32"),
    "mu": ("float32", "bfloat16"),
    "both": ("bfloat16", "bfloat16"),
}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# `%x = bf16[1024,4096]{1,0} all-gather-start(...`; a tuple `(f32[..], /*index=5*/bf16[..])`.
_OP = re.compile(r" = (.*?) (" + "|".join(COLLECTIVES) + r")(-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
_BYTES = {"f32": 4, "bf16": 2, "s32": 4, "u32": 4, "f16": 2, "pred": 1, "s8": 1, "u8": 1}


def collective_bytes(hlo_text: str) -> dict[tuple[str, str], int]:
    """{(collective, dtype): bytes of its results} of one device's compiled program.

    An async start's tuple holds its operands, then its results (then u32 contexts): the
    results are the second half of its arrays."""
    totals = collections.Counter()
    for line in hlo_text.splitlines():
        match = _OP.search(line)
        if not match:
            continue
        arrays = [(t, d) for t, d in _ARRAY.findall(match.group(1)) if t != "u32"]
        if match.group(3) and match.group(2) != "all-reduce" and len(arrays) > 1:
            arrays = arrays[len(arrays) // 2 :]
        for dtype, dims in arrays:
            size = 1
            for d in filter(None, dims.split(",")):
                size *= int(d)
            totals[(match.group(2), dtype)] += size * _BYTES.get(dtype, 4)
    return dict(totals)


def step_figures(config, devices) -> tuple[float, float, float, dict]:
    """The train step of `config` compiled for `devices`: (compiler ms or NaN, the MFU it
    implies or 0, peak GiB per core, `collective_bytes` of the program)."""
    from bert_jax import train
    from experiments import aot_compile

    compiled, _, _, cfg = aot_compile.compile_steps(config, devices, evaluate=False)
    seconds = aot_compile.optimal_seconds(compiled)
    peak = aot_compile.device_peak_flops(devices[0].device_kind)
    flops = train.flops_per_step(config, cfg)
    mfu = aot_compile.implied_mfu(flops, seconds, peak, len(devices)) if seconds else 0.0
    memory = aot_compile.MemoryUse.of(compiled).total / aot_compile.GiB
    ms = seconds * 1e3 if seconds else float("nan")
    return ms, mfu, memory, collective_bytes(compiled.as_text())


def estimate(config) -> None:
    """Prints one markdown row per variant of `config` on its slice."""
    from experiments import aot_compile

    devices = aot_compile.slice_devices(config.topology)
    print("| variant | ms / step | MFU | peak GiB / core | collectives per core (MB) |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, (reduce, mu) in VARIANTS.items():
        variant = aot_compile.unrolled(config)
        with variant.unlocked():
            variant.grad_reduce_dtype, variant.optimizer.mu_dtype = reduce, mu
        ms, mfu, memory, moved = step_figures(variant, devices)
        parts = ", ".join(f"{k} {t} {b / 1e6:.0f}" for (k, t), b in sorted(moved.items()))
        print(f"| {name} | {ms:.1f} | {mfu:.1%} | {memory:.2f} | {parts} |", flush=True)


def curves(runs: str) -> None:
    """Prints held-out MLM loss / accuracy of each `<variant>-s<seed>` run at each eval."""
    from bert_jax import telemetry

    table = {}
    for name in sorted(os.listdir(runs)):
        path = os.path.join(runs, name, "metrics.jsonl")
        if not os.path.exists(path):
            continue
        records = telemetry.read_metrics(path)
        table[name] = {r["step"]: r for r in records if r["split"] == "eval"}
    steps = sorted({s for evals in table.values() for s in evals})
    print("| run | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("| --- |" + " ---: |" * len(steps))
    for name, evals in table.items():
        cells = [
            f"{evals[s]['mlm_loss']:.3f} / {evals[s]['mlm_accuracy']:.1%}" if s in evals else ""
            for s in steps
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main(argv) -> int:
    del argv
    if FLAGS.what == "curves":
        curves(FLAGS.runs)
    else:
        estimate(FLAGS.config)
    return 0


if __name__ == "__main__":
    # Compile-only use of libtpu, as experiments.aot_compile's: JAX's own backend is the CPU.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    config_flags.DEFINE_config_file("config", None, "A TPU config (with `topology`).")
    flags.DEFINE_enum("what", "estimate", ["estimate", "curves"], "What to measure.")
    flags.DEFINE_string("runs", "", "--what=curves: the folder of the runs.")
    cli.run(main)
