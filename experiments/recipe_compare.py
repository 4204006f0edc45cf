r"""The demo's pretraining recipes at equal wall time: which modern choices pay at this scale.

  python -m experiments.recipe_compare --workdir=workdirs/recipes [--arms=bert,modern]
      [--seeds=0,1] [any experiments.demo flag, e.g. --label_budgets=100,400]

Every arm is a recipe of experiments/configs/demo_arms.py (BERT's; rotary, ALiBi, GeGLU,
pre-LN without biases, 30% masking, warmup-stable-decay at a higher peak, each alone; all of
them as `modern`; ELECTRA's objective with BERT's encoder and with the modern one), run
through the whole demo (`experiments.demo --recipe=ARM`: the same records, vocab,
fine-tuning rule, budgets and label subsets, and "scratch" of the arm's own architecture),
so the arms are paired by subset. Stages, each resumable:

  1. calibrate  every arm pretrains --calibration_steps on the demo's records, one at a time,
                evaluating and checkpointing only at its end; its seconds per training step
                (the logged intervals after the first, which compiles) -> calibration.json.
                A demo's 10 evaluations and 5 checkpoints are the same for every arm (a few
                seconds each); at a calibration's length they would be a third of its time
  2. budget     the reference arm (--reference) takes the demo's --pretrain_steps; every other
                arm the steps that take the same wall time (`equal_time_steps`; an arm that
                steps the reference's program, e.g. `wsd`, its steps), reported with their
                model FLOPs (`train.flops_per_step`)
  3. demo       per seed and arm, `experiments.demo` in <workdir>/<arm>_seed<S> (each also
                fits the independent reference, benchmarks.ner_linear_reference's linear
                tagger, on the same subsets); arms of one architecture (`bert`, `wsd`,
                `mask30` and `electra`'s discriminator) share their scratch runs, which
                they would repeat step for step, in <workdir>/scratch
  4. report     comparison.md / comparison.json / curves.png: per budget, every arm's test F1,
                its gain over its own scratch and its difference from the reference arm
                (paired 95% t-intervals over subsets), the linear tagger's F1; the held-out
                MLM accuracy (15% masked in every arm) of every arm in one plot

Equal time is measured on the machine that runs the comparison (calibration.json keeps the
rates and the load they ran at); run it on a quiet machine, as the demo's own timings.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags, logging

from data_pipelines import cli, recipe
from experiments import demo
from experiments.configs import demo_arms

flags.DEFINE_list("arms", list(demo_arms.ARMS), "The recipes compared (demo_arms.ARMS).")
flags.DEFINE_string("reference", "bert", "The arm that takes --pretrain_steps; the others "
                    "its wall time, and the report's differences are from it.")  # fmt: skip
flags.DEFINE_list("seeds", ["0"], "The demo seeds (each: records, init, subsets, runs).")
flags.DEFINE_integer("calibration_steps", 400, "Pretraining steps that time each arm.")
flags.DEFINE_list(
    "arm_steps", [], "ARM=STEPS pairs that replace the calibration (e.g. an earlier machine's)."
)
FLAGS = flags.FLAGS

# The demo's flags that recipe_compare sets per run; every other demo flag given passes on.
_PER_RUN = ("workdir", "recipe", "seed", "pretrain_steps", "corpus_dir")


def equal_time_steps(
    reference_steps: int, seconds_per_step: dict[str, float], reference: str
) -> dict[str, int]:
    """Each arm's pretraining steps that take as long as `reference_steps` of `reference`:
    by the timings, except for an arm whose step is the reference's own program
    (`demo_arms.same_step`, e.g. `wsd` against `bert`), which takes `reference_steps`. Two
    timings of one program differ by up to 15% on a shared 2-core machine.

    Raises:
        ValueError: `reference` was not timed, or a time is not positive.
    """
    if reference not in seconds_per_step:
        raise ValueError(f"the reference arm {reference!r} has no measured time")
    bad = {arm: s for arm, s in seconds_per_step.items() if not s > 0}
    if bad:
        raise ValueError(f"seconds per step must be positive, got {bad}")
    budget = reference_steps * seconds_per_step[reference]
    steps = {arm: max(round(budget / s), 1) for arm, s in seconds_per_step.items()}
    arms = demo_arms.ARMS
    if reference in arms:
        for arm in steps:
            if arm in arms and demo_arms.same_step(arms[arm], arms[reference]):
                steps[arm] = reference_steps
    return steps


def seconds_per_step(metrics: list[dict]) -> float:
    """Wall seconds per step of a pretraining run's log: the logged intervals after the
    first (which compiles), weighted by their steps (what else ran in them included).

    Raises:
        ValueError: fewer than two timed intervals.
    """
    timed = [r for r in metrics if r.get("split") == "train" and "steps_per_second" in r]
    if len(timed) < 2:
        raise ValueError("a run needs at least two logged intervals to be timed")
    steps = [b["step"] - a["step"] for a, b in zip(timed, timed[1:], strict=False)]
    seconds = sum(n / r["steps_per_second"] for n, r in zip(steps, timed[1:], strict=True))
    return seconds / sum(steps)


def flops_per_step(arm: str, vocab_size: int) -> float:
    """Model FLOPs of one pretraining step of `arm` at the demo's shapes."""
    from bert_jax import train

    config = demo_arms.get_config(arm)
    length = demo.setting("max_seq_length")
    config.data.max_seq_length = length
    config.data.max_predictions_per_seq = recipe.predictions_per_seq(
        length, demo_arms.ARMS[arm].masked_lm_prob
    )
    config.global_batch_size = demo.setting("pretrain_batch_size")
    return train.flops_per_step(config, train.model_config(config, vocab_size))


def calibrate(workdir: str, corpus_dir: str) -> dict:
    """Stage 1: every arm's seconds per step (calibration.json; arms timed before are kept)."""
    from bert_jax import telemetry
    from bert_jax.finetune_common import write_json

    path = os.path.join(workdir, "calibration.json")
    done = _read(path) or {"steps": FLAGS.calibration_steps, "arms": {}}
    if done["steps"] != FLAGS.calibration_steps:
        raise app.UsageError(f"{path} timed {done['steps']} steps; --calibration_steps is "
                             f"{FLAGS.calibration_steps}: use another --workdir")  # fmt: skip
    vocab = recipe.prepare_corpus(demo.setting("corpora"), corpus_dir, FLAGS.vocab_size)
    records = os.path.join(workdir, "calibration", "records")
    recipe.make_records(
        corpus_dir, vocab, records, max_seq_length=demo.setting("max_seq_length"),
        dupe_factor=1, seed=0, next_sentence=False, masking="dynamic",
    )  # fmt: skip
    for arm in FLAGS.arms:
        if arm in done["arms"]:
            continue
        out = os.path.join(workdir, "calibration", arm)
        load = os.getloadavg()[0]
        with _demo_flags(recipe=arm, pretrain_steps=FLAGS.calibration_steps, seed=0):
            demo.pretrain(records, vocab, out, timing=True)
        metrics = telemetry.read_metrics(os.path.join(out, "pretrain", "metrics.jsonl"))
        done["arms"][arm] = {"seconds_per_step": seconds_per_step(metrics), "load": load}
        write_json(path, done)
    return done


def arm_steps(workdir: str, corpus_dir: str) -> dict[str, int]:
    """Stage 2: the steps of every arm (--arm_steps, or equal wall time by calibration)."""
    given = {}
    for pair in FLAGS.arm_steps:
        arm, _, steps = pair.partition("=")
        if arm not in demo_arms.ARMS or not steps.isdigit():
            raise app.UsageError(f"--arm_steps: {pair!r} is not ARM=STEPS with an arm of "
                                 f"{', '.join(demo_arms.ARMS)}")  # fmt: skip
        given[arm] = int(steps)
    if all(arm in given for arm in FLAGS.arms):
        return {arm: given[arm] for arm in FLAGS.arms}
    timed = calibrate(workdir, corpus_dir)["arms"]
    with _demo_flags(recipe=FLAGS.reference):  # its demo steps, unless --pretrain_steps says
        reference_steps = demo.setting("pretrain_steps")
    steps = equal_time_steps(
        reference_steps,
        {arm: timed[arm]["seconds_per_step"] for arm in FLAGS.arms},
        FLAGS.reference,
    )
    return steps | {arm: n for arm, n in given.items() if arm in FLAGS.arms}


def run_demo(workdir: str, corpus_dir: str, arm: str, seed: int, steps: int) -> dict:
    """Stage 3 for one arm and seed (a finished run is read back); returns its results.json."""
    out = os.path.join(workdir, f"{arm}_seed{seed}")
    results = os.path.join(out, "results.json")
    if not os.path.exists(results):
        passed = [
            f"--{name}={_flag_text(FLAGS[name].value)}"
            for name in demo.PRETRAINING_FLAGS + DEMO_FINETUNING_FLAGS
            if name not in _PER_RUN and FLAGS[name].present
        ]
        command = [
            sys.executable, "-m", "experiments.demo", f"--workdir={out}", f"--recipe={arm}",
            f"--seed={seed}", f"--pretrain_steps={steps}", f"--corpus_dir={corpus_dir}",
            f"--scratch_cache_dir={os.path.join(workdir, 'scratch')}", *passed,
        ]  # fmt: skip
        logging.info("[3/4 demo] %s", " ".join(command))
        if cli.run_child(command):
            raise RuntimeError(f"the demo of arm {arm}, seed {seed} failed: {' '.join(command)}")
    return _read(results)


# The demo's fine-tuning flags, passed on as given.
DEMO_FINETUNING_FLAGS = (
    "label_budgets", "subsets", "finetune_learning_rates", "finetune_optimizer",
    "finetune_epochs", "min_finetune_steps", "max_finetune_steps", "finetune_batch_size",
    "dev_sentences", "test_sentences", "compare_finetune_optimizers",
)  # fmt: skip


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    unknown = [a for a in [*FLAGS.arms, FLAGS.reference] if a not in demo_arms.ARMS]
    if unknown or FLAGS.reference not in FLAGS.arms:
        raise app.UsageError(
            f"--arms and --reference: arms of {', '.join(demo_arms.ARMS)}, the reference "
            f"among --arms (got {FLAGS.arms}, {FLAGS.reference})"
        )
    if FLAGS.task != "ner":
        raise app.UsageError("recipe_compare runs the ner demo (--task=ner)")
    start = time.time()
    workdir = os.path.abspath(FLAGS.workdir)
    os.makedirs(workdir, exist_ok=True)
    corpus_dir = os.path.abspath(FLAGS.corpus_dir or os.path.join(workdir, "corpus"))
    steps = arm_steps(workdir, corpus_dir)
    seeds = [int(s) for s in FLAGS.seeds]
    runs = {(arm, s): run_demo(workdir, corpus_dir, arm, s, steps[arm])
            for s in seeds for arm in FLAGS.arms}  # fmt: skip
    # Every arm's demo fits the linear tagger on the same subsets: the reference's is read.
    linear = {s: {"label_budgets": runs[FLAGS.reference, s]["linear"]} for s in seeds}
    with open(os.path.join(corpus_dir, "vocab.txt"), encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    from experiments import recipe_report

    arms = {}
    for arm in FLAGS.arms:
        flops = flops_per_step(arm, vocab_size)
        arms[arm] = {
            "description": demo_arms.ARMS[arm].description,
            "objective": demo_arms.ARMS[arm].objective,
            "steps": steps[arm],
            "flops_per_step": flops,
            "pretrain_flops": flops * steps[arm],
        }
    calibration = _read(os.path.join(workdir, "calibration.json"))
    text = recipe_report.report(workdir, arms, runs, linear, FLAGS.reference, calibration)
    print("\n" + text)
    print(f"Wrote {workdir}/comparison.md, comparison.json and curves.png "
          f"({(time.time() - start) / 60:.1f} min)")  # fmt: skip


class _demo_flags:
    """Sets demo flags for a block (`demo.pretrain` reads them), restoring them after."""

    def __init__(self, **values):
        self.values, self.saved = values, {}

    def __enter__(self):
        for name, value in self.values.items():
            self.saved[name] = FLAGS[name].value
            FLAGS[name].value = value

    def __exit__(self, *_):
        for name, value in self.saved.items():
            FLAGS[name].value = value


def _flag_text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _read(path: str):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


if __name__ == "__main__":
    cli.run(main, stop_on_sigterm=True)
