"""Inference sequences/s of a distillation teacher and its student on this machine.

Both are checkpoints that `experiments.finetune_classification` or
`experiments.distill_classification` write (`load_classifier`). Each model's jitted
forward pass (no dropout, f32) runs on one device over fixed-shape batches of random
token ids (every position real); after a warm-up, `repeats` timed passes of `iters`
batches alternate between teacher and student, so that load from other processes hits
both alike, and the best pass of each is reported. `distill_classification` puts the
result in its report; `python -m benchmarks.bench_distill` runs it on two checkpoints.
"""

from __future__ import annotations

import os
import platform
import time

import jax
import numpy as np

from experiments.finetune_classification import load_classifier


def _forward(model, params, batch_size: int, seq_length: int, vocab_size: int):
    """A zero-argument callable running one batch to completion, and the placed inputs."""
    device = jax.devices()[0]
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, min(vocab_size, 30000), size=(batch_size, seq_length), dtype=np.int32)
    inputs = [jax.device_put(x, device) for x in (ids, np.ones_like(ids), np.zeros_like(ids))]
    params = jax.device_put(params, device)
    apply = jax.jit(lambda p, *x: model.apply({"params": p}, *x))
    return lambda: apply(params, *inputs).block_until_ready()


def time_models(
    forwards: dict[str, callable], batch_size: int, *, repeats: int = 5, iters: int = 10
) -> dict[str, float]:
    """{name: best sequences/s} over `repeats` interleaved passes of `iters` batches."""
    for run in forwards.values():  # compile and warm up
        run()
        run()
    best = dict.fromkeys(forwards, 0.0)
    for _ in range(repeats):
        for name, run in forwards.items():
            start = time.perf_counter()
            for _ in range(iters):
                run()
            rate = iters * batch_size / (time.perf_counter() - start)
            best[name] = max(best[name], rate)
    return best


def compare(
    teacher_dir: str,
    student_dir: str,
    *,
    batch_size: int = 64,
    seq_length: int = 64,
    repeats: int = 5,
    iters: int = 10,
) -> dict:
    """Teacher vs student throughput: seq/s of each, the speed-up and a note on the setup."""
    forwards, counts = {}, {}
    for name, path in (("teacher", teacher_dir), ("student", student_dir)):
        model, config, params, _, _ = load_classifier(path)
        counts[name] = int(sum(x.size for x in jax.tree.leaves(params)))
        forwards[name] = _forward(model, params, batch_size, seq_length, config.vocab_size)
    rates = time_models(forwards, batch_size, repeats=repeats, iters=iters)
    note = (
        f"Inference: f32 forward, batch {batch_size} x {seq_length} tokens, best of {repeats} "
        f"interleaved passes of {iters} batches on one {jax.devices()[0].platform} device "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at the end; shared machine)."
    )
    return {
        "teacher_seq_per_s": rates["teacher"],
        "student_seq_per_s": rates["student"],
        "speedup": rates["student"] / rates["teacher"],
        "teacher_params": counts["teacher"],
        "student_params": counts["student"],
        "batch_size": batch_size,
        "seq_length": seq_length,
        "note": note,
    }
