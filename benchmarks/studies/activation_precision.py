r"""Are bf16 activations safe to train with? The demo's BERT and modern recipes, shortened,
under three precisions, compared on held-out masked LM (issue 66, item 3's numerics check).

  python -m benchmarks.studies.activation_precision --workdir=/tmp/activation_precision \
      [--steps=1000] [--seeds=0,1] [--recipes=bert,modern] [--jobs=2] [--launcher=cpu] \
      [--output_json=precision.json]

What runs, each stage resumable (a finished run is read back, an interrupted one resumes
from its checkpoint):
  1. data      experiments.demo's data stages (data_pipelines.recipe): People's Daily
               without the NER splits, every 20th article held out, the vocab, unmasked
               single-segment records of 64 characters; made once, with seed 0's order, in
               <workdir>/records (the corpus beside it, or --corpus_dir)
  2. pretrain  for every recipe x seed x precision, experiments.demo's pretraining stage
               (`demo.pretrain_args`: experiments/configs/demo_arms.py:<recipe>, batch 32,
               the recipe's peak rate and schedule, warmup over steps / 20, the held-out
               records scored every steps / 10 with 15% masked) shortened to --steps, with
               the precision's two model keys appended; --config.seed=<seed> draws the
               initialisation, masks, data order and dropout. Each run is one child process
               (`--launcher` before it, e.g. the machine's CPU-slot wrapper), --jobs at once;
               its log, metrics and checkpoints in <workdir>/<recipe>_<precision>_seed<S>
  3. report    per run: held-out MLM accuracy and loss at the last step, the training
               loss's mean over the last 100 steps, milliseconds per training step (the
               logged intervals after the first, which compiles), the wall time (a wait
               for --launcher's slot included) and the 1-minute load average at its start
               and end; per recipe and precision their means and seed
               spreads; the verdict. Printed as Markdown, and --output_json

The precisions (`PRECISIONS`):
  f32               (a) the CPU default: model.dtype float32, activation_dtype float32
  bf16_matmul       (b) the TPU configs' today: bf16 matmul inputs, f32 accumulation,
                    activations (residual stream, norms, GeGLU, rotary) f32
  bf16_activations  (c) the proposal: bf16 matmul inputs and bf16 activations between the
                    matmuls (norm statistics and softmax stay f32), the residual stream too
  bf16_autocast     (d) the second proposal, after (c) failed on `modern`: (c) but the
                    residual stream (embedding norm, x + branch, post-LN's and the final
                    norm's outputs) in f32, as torch autocast keeps it (model.residual_dtype)

The verdict rule, fixed before any run was made (and held unchanged for (d)): (c) passes
if, for each recipe, both |mean(c) - mean(b)| and |mean(c) - mean(a)| of the held-out MLM
accuracy (the mean over the seeds) are within the larger of the seed spreads (max - min
over the seeds) of (a) and (b). The figures are reported either way. With one seed there is
no spread, so no verdict.

The milliseconds per step say what this CPU paid for each precision (XLA's CPU bf16 code is
not a TPU's, and the machine may be shared), not what a TPU would.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

from absl import app, flags

from data_pipelines import cli, recipe
from experiments import demo

# (model.dtype, model.activation_dtype, model.residual_dtype) of each precision.
PRECISIONS = {
    "f32": ("float32", "float32", "float32"),
    "bf16_matmul": ("bfloat16", "float32", "float32"),
    "bf16_activations": ("bfloat16", "bfloat16", "bfloat16"),
    "bf16_autocast": ("bfloat16", "bfloat16", "float32"),
}
# The two precisions each proposal is held against, and the proposals.
BASELINES, PROPOSALS = ("f32", "bf16_matmul"), ("bf16_activations", "bf16_autocast")
TAIL_STEPS = 100  # the training loss's mean is over the run's last TAIL_STEPS steps

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """This tool's flags beside the demo's, defined when it runs: imported (by tests), the
    module leaves the demo's flags as they are (its --seeds would clash with
    experiments.recipe_compare's)."""
    flags.DEFINE_integer("steps", 1_000, "Pretraining steps of every run (the demo: 6,550-8,000).")
    flags.DEFINE_list("seeds", ["0", "1"], "Pretraining seeds (init, masks, data order, dropout).")
    flags.DEFINE_list("recipes", ["bert", "modern"], "The demo's recipes (demo_arms.ARMS).")
    flags.DEFINE_list("precisions", list(PRECISIONS), "The precisions compared (PRECISIONS).")
    flags.DEFINE_integer("jobs", 2, "Runs at once.")
    flags.DEFINE_string(
        "launcher", "", "A command each run is started under (e.g. a CPU-slot wrapper); '': none."
    )
    flags.DEFINE_string("output_json", "", "Also write every figure here.")
    # The demo's default workdir lies inside the repository; these runs are scratch.
    FLAGS.set_default("workdir", "/tmp/activation_precision")


def run_dir(workdir: str, recipe_name: str, precision: str, seed: int) -> str:
    return os.path.join(workdir, f"{recipe_name}_{precision}_seed{seed}")


def command(
    records: str, vocab: str, out: str, recipe_name: str, precision: str, seed: int, *,
    steps: int, launcher: str = "",
) -> list[str]:  # fmt: skip
    """The run's command line: the demo's pretraining stage (as the demo's flags set it, but
    for the recipe, seed and steps) with the precision's model keys."""
    demo_flags = {"recipe": recipe_name, "seed": seed, "pretrain_steps": steps}
    saved = {name: FLAGS[name].value for name in demo_flags}
    try:
        for name, value in demo_flags.items():
            FLAGS[name].value = value
        _, args = demo.pretrain_args(records, vocab, out)
    finally:
        for name, value in saved.items():
            FLAGS[name].value = value
    dtype, activation_dtype, residual_dtype = PRECISIONS[precision]
    return [
        *shlex.split(launcher), sys.executable, "-m", *args,
        f"--config.model.dtype={dtype}", f"--config.model.activation_dtype={activation_dtype}",
        f"--config.model.residual_dtype={residual_dtype}",
    ]  # fmt: skip


def run(argv: list[str], out: str) -> dict:
    """Runs one pretraining (its output in <out>/log.txt); its timing, stored as run.json."""
    os.makedirs(out, exist_ok=True)
    load_start, start = os.getloadavg()[0], time.time()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with open(os.path.join(out, "log.txt"), "a", encoding="utf-8") as log:
        log.write("$ " + shlex.join(argv) + "\n")
        log.flush()
        returncode = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if returncode:
        raise RuntimeError(f"{out}: the run failed (exit {returncode}); see {out}/log.txt")
    timing = {
        "seconds": time.time() - start, "load_start": load_start,
        "load_end": os.getloadavg()[0], "command": shlex.join(argv),
    }  # fmt: skip
    with open(os.path.join(out, "run.json"), "w", encoding="utf-8") as f:
        json.dump(timing, f, indent=2)
    return timing


def figures(out: str, steps: int) -> dict:
    """A finished run's held-out MLM at its last step, its training loss over the last
    TAIL_STEPS steps (logged intervals are means over their steps) and its timing."""
    from bert_jax import telemetry

    records = telemetry.read_metrics(os.path.join(out, "pretrain", "metrics.jsonl"))
    last = [r for r in records if r["split"] == "eval"][-1]
    if last["step"] != steps:
        raise RuntimeError(f"{out}: the last evaluation is at step {last['step']}, not {steps}")
    train = [r for r in records if r["split"] == "train" and "loss" in r]
    tail, previous = [], steps - TAIL_STEPS
    for record in train:
        if record["step"] > previous:
            tail.append((record["step"] - max(previous, _before(train, record)), record["loss"]))
    with open(os.path.join(out, "run.json"), encoding="utf-8") as f:
        timing = json.load(f)
    # Training steps alone: the logged intervals after the first (which compiles).
    timed = [r for r in train if "steps_per_second" in r][1:]
    intervals = [r["step"] - _before(train, r) for r in timed]
    seconds = sum(n / r["steps_per_second"] for n, r in zip(intervals, timed, strict=True))
    return {
        "mlm_accuracy": last["mlm_accuracy"],
        "mlm_loss": last["mlm_loss"],
        "train_loss_last_100": sum(n * v for n, v in tail) / sum(n for n, _ in tail),
        "ms_per_step": 1000 * seconds / sum(intervals),
        **timing,
    }


def _before(train: list[dict], record: dict) -> int:
    """The step the logged interval ending at `record` starts after."""
    steps = [r["step"] for r in train if r["step"] < record["step"]]
    return max(steps, default=0)


def verdict(accuracy: dict[str, list[float]], proposal: str = PROPOSALS[0]) -> dict:
    """The docstring's rule for one recipe and `proposal`, from each precision's held-out MLM
    accuracy per seed."""
    mean = {p: statistics.fmean(v) for p, v in accuracy.items()}
    spread = max(max(accuracy[p]) - min(accuracy[p]) for p in BASELINES)
    gaps = {p: abs(mean[proposal] - mean[p]) for p in BASELINES}
    return {
        "mean": mean,
        "allowed": spread,
        "gaps": gaps,
        "passes": all(gap <= spread for gap in gaps.values()),
    }


def report(results: dict) -> tuple[str, dict]:
    """The Markdown table of every run and the verdict per recipe."""
    lines = [
        "| recipe | precision | held-out MLM accuracy per seed | mean | spread | held-out "
        "MLM loss, mean | train loss, last 100 steps, mean | ms per training step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    verdicts = {}
    for recipe_name, by_precision in results.items():
        for precision, runs in by_precision.items():
            accuracy = [r["mlm_accuracy"] for r in runs.values()]
            lines.append(
                f"| {recipe_name} | {precision} | "
                + ", ".join(f"{a:.4f}" for a in accuracy)
                + f" | {statistics.fmean(accuracy):.4f} | {max(accuracy) - min(accuracy):.4f} | "
                f"{statistics.fmean(r['mlm_loss'] for r in runs.values()):.4f} | "
                f"{statistics.fmean(r['train_loss_last_100'] for r in runs.values()):.4f} | "
                + ", ".join(f"{r['ms_per_step']:.0f}" for r in runs.values())
                + " |"
            )
        seeds = len(next(iter(by_precision.values())))
        accuracy = {
            p: [r["mlm_accuracy"] for r in runs.values()] for p, runs in by_precision.items()
        }
        for proposal in PROPOSALS:
            if {*BASELINES, proposal} <= set(by_precision) and seeds > 1:
                verdicts.setdefault(recipe_name, {})[proposal] = verdict(accuracy, proposal)
    lines.append("")
    flat = [(r, p, v) for r, by in verdicts.items() for p, v in by.items()]
    for recipe_name, proposal, v in flat:
        gaps = ", ".join(f"|{proposal} - {p}| = {gap:.4f}" for p, gap in v["gaps"].items())
        lines.append(
            f"- {recipe_name}: {gaps}; allowed {v['allowed']:.4f} (the larger seed spread of "
            f"{' and '.join(BASELINES)}): **{'passes' if v['passes'] else 'fails'}**"
        )
    for proposal in PROPOSALS:
        mine = [v["passes"] for _, p, v in flat if p == proposal]
        if mine:
            lines.append(f"\nVerdict: {proposal} {'passes' if all(mine) else 'fails'} the rule.")
    return "\n".join(lines) + "\n", verdicts


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    for name, values, allowed in (
        ("recipes", FLAGS.recipes, demo.demo_arms.ARMS),
        ("precisions", FLAGS.precisions, PRECISIONS),
    ):
        unknown = [v for v in values if v not in allowed]
        if unknown:
            raise app.UsageError(f"--{name}: unknown {unknown}; one of {', '.join(allowed)}")
    if not all(s.isdigit() for s in FLAGS.seeds):
        raise app.UsageError(f"--seeds: {FLAGS.seeds} are not non-negative integers")
    if FLAGS.steps < TAIL_STEPS * 2:
        raise app.UsageError(f"--steps: {FLAGS.steps} is under {TAIL_STEPS * 2}")
    seeds = [int(s) for s in FLAGS.seeds]
    workdir = os.path.abspath(FLAGS.workdir)
    corpora = demo.setting("corpora")
    corpus_dir = os.path.abspath(FLAGS.corpus_dir or os.path.join(workdir, "+".join(corpora)))
    vocab = recipe.prepare_corpus(corpora, corpus_dir, FLAGS.vocab_size)
    records = os.path.join(workdir, "records")
    recipe.make_records(
        corpus_dir, vocab, records, max_seq_length=demo.setting("max_seq_length"),
        dupe_factor=1, seed=0, next_sentence=False, masking="dynamic",
    )  # fmt: skip
    runs = [(r, p, s) for r in FLAGS.recipes for s in seeds for p in FLAGS.precisions]
    pending = [
        k for k in runs if not os.path.exists(os.path.join(run_dir(workdir, *k), "run.json"))
    ]
    print(f"{len(runs) - len(pending)} of {len(runs)} runs done; {len(pending)} to run, "
          f"{FLAGS.jobs} at once", flush=True)  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(FLAGS.jobs) as pool:
        futures = {}
        for key in pending:
            out = run_dir(workdir, *key)
            argv = command(records, vocab, out, *key, steps=FLAGS.steps, launcher=FLAGS.launcher)
            futures[pool.submit(run, argv, out)] = key
        for future in concurrent.futures.as_completed(futures):
            if future.exception():  # stop here: the runs not started are not started
                pool.shutdown(cancel_futures=True)
                raise future.exception()
            timing = future.result()
            name = "/".join(map(str, futures[future]))
            load = f"load {timing['load_start']:.1f} -> {timing['load_end']:.1f}"
            print(f"{name}: {timing['seconds'] / 60:.1f} min, {load}", flush=True)
    results: dict = {}
    for recipe_name, precision, seed in runs:
        out = run_dir(workdir, recipe_name, precision, seed)
        results.setdefault(recipe_name, {}).setdefault(precision, {})[seed] = figures(
            out, FLAGS.steps
        )
    text, verdicts = report(results)
    print("\n" + text)
    if FLAGS.output_json:
        with open(FLAGS.output_json, "w", encoding="utf-8") as f:
            json.dump({"steps": FLAGS.steps, "results": results, "verdicts": verdicts}, f, indent=2)


if __name__ == "__main__":
    _define_flags()
    cli.run(main, stop_on_sigterm=True)
