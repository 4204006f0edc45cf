r"""How long an Orbax checkpoint save blocks the pretraining loop: async vs synchronous.

Runs `bert_jax.train`'s jitted train step (f32 params, the original BERT AdamW with its two
moment trees, global-norm clipping) on a random batch and saves the full train state with
`bert_jax.checkpointing.save` every `--every` steps, exactly as `train_and_evaluate` does
(the step's results are fetched before the save, as the loop's metric flush does). Three
modes, each with its own `CheckpointManager`, are interleaved phase by phase (the starting
mode rotates) so that load drifts on a shared machine hit them alike:

- `none`: no checkpoint (the step time without any saving);
- `async`: `make_manager(async_save=True)`, what training uses;
- `sync`: `make_manager(async_save=False)`, for comparison.

Per save interval (`--every` steps and one save) the loop is *blocked* for the time spent
inside `checkpointing.save`, which includes Orbax waiting for the previous save when that is
still being written; the blocking fraction is blocked time / interval wall time. At the end
of each phase the benchmark also waits for the last save (`wait_until_finished`, reported
as `drain`, not counted as blocked: training waits only at the end of the run), so that no
background work spills into the next mode's phase; the drain bounds how long the background
write takes, i.e. the shortest interval at which a save would not wait for the previous one.
With `async` the writing goes on in background threads that share the CPU with the training
steps: the interval's wall time against `none` is reported as `vs none`.

Examples:
  python -m benchmarks.bench_checkpointing --size=mini --every=10 --reps=3
  python -m benchmarks.bench_checkpointing --size=base --batch=8 --every=4 --reps=2 \
      --output_json=/tmp/ckpt_base.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
from tqdm import tqdm

MODES = ("none", "async", "sync")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_checkpointing",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples:")[1],
    )
    parser.add_argument("--size", default="mini", help="a bert_jax.config preset (mini, base...)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--preds", type=int, default=20, help="masked positions per sequence")
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--saves", type=int, default=2, help="saves per mode per phase")
    parser.add_argument("--reps", type=int, default=3, help="phases per mode (interleaved)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {MODES}")
    parser.add_argument("--keep", type=int, default=2, help="checkpoints kept per mode")
    parser.add_argument(
        "--workdir", default="", help="where checkpoints go (default: a temporary directory)"
    )
    parser.add_argument("--output_json", default="", help="write every figure here")
    args = parser.parse_args(argv)
    args.modes = args.modes.split(",")
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        parser.error(f"--modes: unknown {bad}; choose from {list(MODES)}")
    if args.every < 1 or args.saves < 1 or args.reps < 1:
        parser.error("--every, --saves and --reps must be >= 1")
    return args


def build(args):
    """(jitted train step, initial state on one device, device batch, rng, config json)."""
    import jax
    import jax.numpy as jnp

    from benchmarks.bench_model import make_inputs
    from bert_jax import checkpointing, optim, sharding, train
    from bert_jax.config import BertConfig
    from bert_jax.heads import BertForPreTraining
    from bert_jax.train_state import sharded_state
    from experiments.configs import bert_tiny_cpu

    config = bert_tiny_cpu.get_config().optimizer  # the experiments' BERT AdamW
    config.update(dict(learning_rate=1e-4, warmup_steps=10))
    steps = 10_000
    tx = optim.make_optimizer(config, steps)
    schedule = optim.learning_rate_schedule(config, steps)
    model = BertForPreTraining(BertConfig.from_preset(args.size, vocab_size=args.vocab))
    mesh = sharding.create_mesh((1, 1, 1), devices=jax.devices()[:1])
    example = train.init_inputs(train.example_batch(1, args.seq, args.preds))
    state, shardings = sharded_state(model, tx, mesh, example, rng=jax.random.key(0))
    step_fn, _ = train.jit_steps(model, tx, schedule, mesh, shardings)
    inputs = make_inputs(args.batch, args.seq, args.preds, args.vocab, seed=0)
    batch = sharding.global_batch(inputs, mesh)
    config_json = {"optimizer": config.to_dict(), "size": args.size, "batch": args.batch}
    del jnp, checkpointing
    return mesh, step_fn, state, batch, jax.random.key(1), config_json


def state_bytes(state) -> int:
    import jax

    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)))


def run(args, workdir: str) -> dict[str, Any]:
    import jax

    from bert_jax import checkpointing, sharding

    mesh, step_fn, state, batch, rng, config_json = build(args)
    nbytes = state_bytes(state)
    logging.info("%s: train state %.1f MiB", args.size, nbytes / 2**20)
    managers = {
        m: checkpointing.make_manager(
            os.path.join(workdir, m), max_to_keep=args.keep, async_save=(m == "async")
        )
        for m in args.modes
        if m != "none"
    }
    positions = [{"epoch": 0, "batch_in_epoch": 0, "process_index": 0}]
    step = 0
    with sharding.activation_context(mesh):
        start = time.perf_counter()
        state, metrics = step_fn(state, batch, rng)  # compile, excluded
        jax.block_until_ready(metrics)
        step += 1
        logging.info("compiled and ran the first step in %.1f s", time.perf_counter() - start)
        intervals: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
        for rep in tqdm(range(args.reps), desc="phases"):
            shift = rep % len(args.modes)
            for mode in args.modes[shift:] + args.modes[:shift]:
                for save_index in range(args.saves):
                    begin = time.perf_counter()
                    for _ in range(args.every):
                        state, metrics = step_fn(state, batch, rng)
                        step += 1
                    # The loop's metric flush fetches the step's results before a save.
                    loss = float(jax.device_get(metrics["loss"]))
                    if not np.isfinite(loss):
                        raise FloatingPointError(f"non-finite loss {loss} at step {step}")
                    stepped = time.perf_counter()
                    saving = drain = 0.0
                    if mode != "none":
                        t0 = time.perf_counter()
                        checkpointing.save(managers[mode], step, state, positions, config_json)
                        saving = time.perf_counter() - t0
                    end = time.perf_counter()
                    if mode != "none" and save_index == args.saves - 1:
                        managers[mode].wait_until_finished()
                        drain = time.perf_counter() - end
                    intervals[mode].append(
                        dict(
                            steps_s=stepped - begin,
                            blocked_s=saving,
                            interval_s=end - begin,
                            drain_s=drain,
                        )
                    )
    for manager in managers.values():
        manager.wait_until_finished()
        manager.close()
    return dict(state_bytes=nbytes, intervals=intervals, last_step=step)


def summarise(
    result: dict[str, Any], every: int, saves_per_phase: int
) -> dict[str, dict[str, float]]:
    """Per mode: step time, interval, blocked time and fraction, drain, slowdown vs none."""
    rows = {}
    base = result["intervals"].get("none")
    base_interval = float(np.median([r["interval_s"] for r in base])) if base else None
    for mode, records in result["intervals"].items():
        blocked = np.array([r["blocked_s"] for r in records])
        interval = np.array([r["interval_s"] for r in records])
        steps = np.array([r["steps_s"] for r in records])
        row = dict(
            intervals=len(records),
            step_ms_median=1e3 * float(np.median(steps)) / every,
            interval_s_median=float(np.median(interval)),
            blocked_s_median=float(np.median(blocked)),
            blocked_s_max=float(np.max(blocked)),
            blocked_fraction=float(blocked.sum() / interval.sum()),
            blocked_fraction_max=float(np.max(blocked / interval)),
            # The drain is measured after each phase's last save only.
            drain_s_median=float(
                np.median([r["drain_s"] for r in records[saves_per_phase - 1 :: saves_per_phase]])
            ),
        )
        if base_interval:
            row["interval_vs_none"] = row["interval_s_median"] / base_interval
        rows[mode] = row
    return rows


def print_report(out: dict[str, Any]) -> None:
    print(
        f"\n{out['args']['size']} B{out['args']['batch']}: train state "
        f"{out['state_bytes'] / 2**20:.1f} MiB, a save every {out['args']['every']} steps"
    )
    header = (
        f"{'mode':6} {'n':>3} {'step ms':>8} {'interval s':>11} {'blocked s':>10} "
        f"{'max s':>7} {'blocked %':>10} {'max %':>7} {'drain s':>8} {'vs none':>8}"
    )
    print(header + "\n" + "-" * len(header))
    for mode, r in out["summary"].items():
        vs = f"{r['interval_vs_none']:7.3f}x" if "interval_vs_none" in r else "     n/a"
        print(
            f"{mode:6} {r['intervals']:3d} {r['step_ms_median']:8.1f} "
            f"{r['interval_s_median']:11.2f} {r['blocked_s_median']:10.3f} "
            f"{r['blocked_s_max']:7.3f} {100 * r['blocked_fraction']:9.2f}% "
            f"{100 * r['blocked_fraction_max']:6.2f}% {r['drain_s_median']:8.3f} {vs}"
        )


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every save step
    out: dict[str, Any] = dict(
        argv=sys.argv,
        args=vars(args),
        started=time.strftime("%Y-%m-%d %H:%M:%S"),
        machine=dict(
            platform=platform.platform(), cpus=os.cpu_count(), load_before=os.getloadavg()
        ),
    )
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_ckpt_")
    try:
        out.update(run(args, workdir))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    out["machine"]["load_after"] = os.getloadavg()
    import jax
    import orbax.checkpoint as ocp

    out["versions"] = dict(jax=jax.__version__, orbax=ocp.__version__)
    out["summary"] = summarise(out, args.every, args.saves)
    print_report(out)
    if args.output_json:
        tmp = args.output_json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.output_json)
        logging.info("wrote %s", args.output_json)


if __name__ == "__main__":
    main()
