r"""ELECTRA against masked LM at equal compute, on a CPU (issue 33's measurement).

  python -m experiments.electra_compare --workdir=workdirs/electra_compare

(`make electra-compare`.) BERT-tiny-sized encoders (experiments/configs/bert_tiny_cpu.py,
L2/H128/A2) pretrained on the polarity demo's corpus (25,000 IMDB reviews, the 8,000-piece
vocab, sequences of 64, dynamic masking, batches of 64, `experiments.ablations`' recipe) with
three objectives at one compute budget:

- `mlm_nsp`  BERT: masked LM + next sentence, on sentence-pair records;
- `mlm`      masked LM alone, on single-segment records;
- `electra`  replaced-token detection (bert_jax.electra: a generator of 1/4 the hidden size
             corrupts the masked positions, the discriminator is the BERT-tiny encoder), on
             the single-segment records, as the ELECTRA paper has no NSP.

The budget is --pretrain_steps of the `mlm` arm, in model FLOPs (`train.flops_per_step`, the
count behind the logged MFU): each arm trains for budget / its FLOPs per step. ELECTRA's step
costs more than MLM's (the generator, the discriminator's head on every token), so it takes
fewer steps. Equal wall time is measured, not assumed: once `mlm` and `electra` have
pretrained, each one's median seconds per step (its logged `steps_per_second`) gives the
ELECTRA steps that take `mlm`'s wall time; when that count differs from the equal-FLOPs one
by more than --same_time_tolerance, an arm `electra_time` pretrains for it. A control arm,
`electra_pairs`, pretrains ELECTRA on `mlm_nsp`'s sentence-pair records at equal FLOPs: at this
scale the masked LM learns much faster from the pair records than from single segments
(docs/paper_tables.md, Table 5), so the input format must not pass for the objective.

Each pretrained encoder is then fine-tuned on sentence polarity at --label_budgets labelled
sentences, --subsets label subsets per budget; a subset is drawn from the fine-tuning seed
alone, so every arm (and "scratch", the architecture from random weights) trains on the same
sentences and the comparison is paired. The recipe is the polarity demo's (mean of the last
layer, lr 3e-4, at least 3 epochs and 300 steps). The report gives the held-out curves (each
objective's own held-out metrics at each sixth of the budget) and the test accuracy table
with the paired differences of ELECTRA against each other arm and their 95% intervals.

Every stage resumes: a pretraining restarts from its checkpoint, a finished fine-tuning run
is read back. On a machine with several cores, independent processes pinned to one core each
are much faster than one process on all of them (the tiny model's matmuls do not spread):
--stage and --arms pick the pretrainings or the arms to fine-tune, --part=K/N a share of the
fine-tuning runs, and a last run without them writes the report (docs/electra.md gives the
commands used there).
"""

from __future__ import annotations

import math
import os
import statistics
import time

from absl import app, flags, logging

from data_pipelines import cli, recipe
from experiments import ablations

ARMS = ("mlm_nsp", "mlm", "electra")
TIME_ARM = "electra_time"  # ELECTRA at `mlm`'s wall time, when that differs from its FLOPs
PAIRS_ARM = "electra_pairs"  # control: ELECTRA on mlm_nsp's sentence-pair records
LR_ARM = "electra_mlm_lr"  # control: ELECTRA at the MLM arms' learning rate
EXTRA_ARMS = (TIME_ARM, PAIRS_ARM, LR_ARM)
ARM_NAMES = {
    "mlm_nsp": "BERT (MLM + NSP)",
    "mlm": "MLM alone",
    "electra": "ELECTRA (equal FLOPs)",
    TIME_ARM: "ELECTRA (equal wall time)",
    PAIRS_ARM: "ELECTRA on sentence pairs (equal FLOPs)",
    LR_ARM: "ELECTRA at the MLM learning rate (equal FLOPs)",
    "scratch": "no pretraining (random weights)",
}
# What each objective's held-out evaluation reports, in the curves table.
CURVE_METRICS = {
    "mlm_nsp": ("mlm_loss", "mlm_accuracy", "nsp_accuracy"),
    "mlm": ("mlm_loss", "mlm_accuracy"),
    "electra": ("disc_loss", "prior_gap", "disc_accuracy", "disc_precision", "disc_recall",
                "mlm_accuracy"),
}  # fmt: skip
STAGES = ("all", "pretrain", "finetune")


def run_config(opts, objective: str):
    """The pretraining config `ablations.pretrain` runs for `objective` (for its FLOPs)."""
    from experiments.configs import bert_tiny_cpu

    config = bert_tiny_cpu.get_config()
    config.objective = objective
    config.global_batch_size = opts.pretrain_batch_size
    config.data.max_seq_length = opts.max_seq_length
    config.data.max_predictions_per_seq = recipe.predictions_per_seq(opts.max_seq_length)
    return config


def flops_per_step(opts, objective: str, vocab: str) -> float:
    """Model FLOPs of one pretraining step of `objective` (train.flops_per_step)."""
    from bert_jax import train

    with open(vocab, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    config = run_config(opts, objective)
    return train.flops_per_step(config, train.model_config(config, vocab_size))


def equal_flops_steps(opts, vocab: str) -> dict[str, int]:
    """Each arm's steps for the FLOPs of --pretrain_steps steps of `mlm`."""
    budget = opts.pretrain_steps * flops_per_step(opts, "mlm", vocab)
    return {arm: round(budget / flops_per_step(opts, arm, vocab)) for arm in ARMS}


def seconds_per_step(pretrain_dir: str) -> float:
    """Median seconds per step over a run's logged training intervals (the first, which
    compiles, left out)."""
    from bert_jax import telemetry

    records = telemetry.read_metrics(os.path.join(pretrain_dir, "metrics.jsonl"))
    rates = [r["steps_per_second"] for r in records if "steps_per_second" in r][1:]
    if not rates:
        raise ValueError(f"{pretrain_dir}/metrics.jsonl logs no steps_per_second")
    return 1.0 / statistics.median(rates)


def same_time_steps(opts, dirs: dict[str, str]) -> int:
    """ELECTRA steps that take as long as --pretrain_steps of `mlm` (measured rates)."""
    return round(opts.pretrain_steps * seconds_per_step(dirs["mlm"]) / seconds_per_step(
        dirs["electra"]))  # fmt: skip


def learning_rate(opts, arm: str) -> float:
    """The arm's peak pretraining learning rate (ELECTRA's is its own)."""
    electra = arm.startswith("electra") and arm != LR_ARM
    return opts.electra_learning_rate if electra else opts.pretrain_learning_rate


def finished(pretrain_dir: str, steps: int) -> bool:
    """Whether a pretraining run logged its last step."""
    from bert_jax import telemetry

    path = os.path.join(pretrain_dir, "metrics.jsonl")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return False  # not started, or stopped before it logged anything
    return any(r["step"] == steps for r in telemetry.read_metrics(path))


def pretrain_arms(opts, workdir: str, vocab: str, arms) -> tuple[dict, dict]:
    """Pretrains `arms` (those not finished); returns ({arm: dir}, {arm: steps}) for every
    arm whose run exists, `electra_time` included when the measured rates call for it."""
    steps = equal_flops_steps(opts, vocab)
    steps[PAIRS_ARM] = steps[LR_ARM] = steps["electra"]
    dirs = {arm: os.path.join(workdir, "pretrain", arm) for arm in (*ARMS, *EXTRA_ARMS)}
    records = {}
    for arm in (*ARMS, PAIRS_ARM, LR_ARM):
        if arm in arms:
            pairs = arm in ("mlm_nsp", PAIRS_ARM)
            if pairs not in records:
                records[pairs] = ablations.make_records(opts, workdir, vocab, pairs)
            objective = "electra" if arm.startswith("electra") else arm
            ablations.pretrain(
                opts, dirs[arm], records[pairs], vocab, objective=objective, steps=steps[arm],
                learning_rate=learning_rate(opts, arm),
            )  # fmt: skip
    if finished(dirs["mlm"], steps["mlm"]) and finished(dirs["electra"], steps["electra"]):
        timed = same_time_steps(opts, dirs)
        if abs(timed - steps["electra"]) > opts.same_time_tolerance * steps["electra"]:
            steps[TIME_ARM] = timed
            if TIME_ARM in arms:
                single = ablations.make_records(opts, workdir, vocab, False)
                ablations.pretrain(
                    opts, dirs[TIME_ARM], single, vocab, objective="electra", steps=timed,
                    learning_rate=learning_rate(opts, TIME_ARM),
                )  # fmt: skip
    present = {arm: dirs[arm] for arm in steps if finished(dirs[arm], steps[arm])}
    return present, steps


def finetune_epochs(labels: int, batch_size: int, min_steps: int) -> int:
    """3 epochs, or more to reach `min_steps` (the polarity demo's rule)."""
    return max(3, math.ceil(min_steps / max(labels // batch_size, 1)))


def finetune_jobs(opts, num_train: int, arms) -> list[tuple[int, str, int]]:
    """Every (labels, arm, seed) fine-tuning run, in a fixed order."""
    seeds = [opts.seed * opts.subsets + k for k in range(opts.subsets)]
    budgets = sorted({num_train if b == "all" else int(b) for b in opts.label_budgets})
    for n in budgets:
        if not 0 < n <= num_train:
            raise app.UsageError(f"--label_budgets: {n} is not in 1..{num_train} (or all)")
    return [(n, arm, seed) for n in budgets for seed in seeds for arm in arms]


def finetune(opts, workdir: str, dirs: dict, vocab: str, jobs) -> dict:
    """Test accuracy of each job: {(labels, arm, seed): accuracy}."""
    from tqdm import tqdm

    from data_pipelines.tasks import polarity

    num_train = len(polarity.load(None).train)
    scores = {}
    logging.set_verbosity(logging.ERROR)  # the bar is the progress; errors still show
    for labels, arm, seed in tqdm(jobs, desc="finetune", unit="run"):
        init_from = dirs.get(arm, dirs["mlm_nsp"])  # scratch: BERT-tiny's architecture
        config = ablations.classification_config(
            opts, "polarity", init_from, vocab, seed, scratch=arm == "scratch"
        )
        config.optimizer = "adamw"  # the polarity demo's
        config.max_train_examples = None if labels == num_train else labels
        config.num_epochs = finetune_epochs(labels, config.train_batch_size, opts.min_steps)
        config.eval_every_epochs = config.num_epochs
        out = os.path.join(workdir, "finetune", f"{labels}_labels", f"{arm}_seed{seed}")
        scores[labels, arm, seed] = ablations.finetune_classifier(out, config)
    logging.set_verbosity(logging.INFO)
    return scores


def prior_gap(record: dict) -> float:
    """How far the discriminator's held-out loss is below the class prior's: the entropy of
    the replaced fraction r, -r ln r - (1 - r) ln(1 - r), minus the RTD loss (nats per
    token; 0 for a discriminator that only knows how often tokens are replaced)."""
    r = record["replaced_fraction"]
    entropy = -sum(p * math.log(p) for p in (r, 1 - r) if p > 0)
    return entropy - record["disc_loss"]


def curves(dirs: dict) -> dict[str, list[dict]]:
    """Each arm's held-out evaluations, in step order (ELECTRA's with `prior_gap`)."""
    from bert_jax import telemetry

    out = {}
    for arm, path in dirs.items():
        records = telemetry.read_metrics(os.path.join(path, "metrics.jsonl"))
        evals = [r for r in records if r["split"] == "eval"]  # in step order
        for r in evals:
            if "disc_loss" in r:
                r["prior_gap"] = prior_gap(r)
        out[arm] = evals
    return out


def report(opts, steps: dict, flops: dict, timing: dict, held: dict, scores: dict) -> str:
    """The Markdown report: budget, held-out curves, fine-tuning table, paired differences."""
    from experiments.label_budgets import paired_difference

    arms = [arm for arm in (*ARMS, *EXTRA_ARMS) if arm in held]
    lines = [
        "| arm | steps | GFLOPs / step | total TFLOPs | s / step | wall time (min) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for arm in arms:
        objective = "electra" if arm.startswith("electra") else arm
        total = steps[arm] * flops[objective] / 1e12
        wall = steps[arm] * timing[arm] / 60
        lines.append(f"| {ARM_NAMES[arm]} | {steps[arm]:,} | {flops[objective] / 1e9:.2f} | "
                     f"{total:.1f} | {timing[arm]:.3f} | {wall:.1f} |")  # fmt: skip
    for arm in arms:  # the held-out curves, one table per arm (its objective's metrics)
        keys = CURVE_METRICS["electra" if arm.startswith("electra") else arm]
        lines += ["", f"{ARM_NAMES[arm]}, held-out:", "",
                  "| step | budget spent | " + " | ".join(keys) + " |",
                  "| ---: | ---: |" + " ---: |" * len(keys)]  # fmt: skip
        for r in held[arm]:
            values = " | ".join(f"{r[k]:.3f}" if k in r else "-" for k in keys)
            lines.append(f"| {r['step']:,} | {r['step'] / steps[arm]:.2f} | {values} |")
    budgets = sorted({labels for labels, _, _ in scores})
    seeds = sorted({seed for _, _, seed in scores})
    table_arms = [*arms, "scratch"]
    lines += ["", f"Polarity test accuracy (%), mean ± std over {len(seeds)} paired label "
              "subsets (seeds):", "",
              "| labelled sentences | " + " | ".join(ARM_NAMES[a] for a in table_arms) + " |",
              "| ---: |" + " ---: |" * len(table_arms)]  # fmt: skip
    differences = []
    for n in budgets:
        runs = {arm: [100 * scores[n, arm, s] for s in seeds] for arm in table_arms}
        cells = [f"{statistics.mean(v):.1f} ± {statistics.stdev(v) if len(v) > 1 else 0:.1f}"
                 for v in runs.values()]  # fmt: skip
        lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
        for arm in arms:
            for other in table_arms:
                if arm.startswith("electra") and not other.startswith("electra"):
                    d = paired_difference(runs[arm], runs[other])
                    interval = f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"
                    differences.append(
                        f"- {n:,} labels, {ARM_NAMES[arm]} - {ARM_NAMES[other]}: {interval}"
                    )
    lines += ["", "ELECTRA's paired differences (points) with their 95% t-intervals:", ""]
    return "\n".join(lines + differences) + "\n"


def main(argv):
    opts = flags.FLAGS
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    start = time.time()
    workdir = os.path.abspath(opts.workdir)  # Orbax refuses relative checkpoint directories
    os.makedirs(workdir, exist_ok=True)
    opts.corpus_dir = os.path.abspath(opts.corpus_dir)
    cli.check_same_flags(
        workdir, "compare_flags.json", {name: getattr(opts, name) for name in RUN_FLAGS}
    )
    part, parts = parse_part(opts.part)
    vocab = recipe.prepare_corpus(["imdb"], opts.corpus_dir, opts.vocab_size)
    unknown = set(opts.arms) - {*ARMS, *EXTRA_ARMS, "scratch"}
    if unknown:
        raise app.UsageError(f"--arms: unknown {sorted(unknown)}")
    arms = opts.arms or [*ARMS, *EXTRA_ARMS]
    if opts.stage in ("all", "pretrain"):
        dirs, steps = pretrain_arms(opts, workdir, vocab, arms)
    else:
        dirs, steps = pretrain_arms(opts, workdir, vocab, ())
    if opts.stage == "pretrain":
        return
    # The three objectives (and the equal-time arm where it is due) are needed; the
    # controls are reported when they ran.
    required = [arm for arm in (*ARMS, TIME_ARM) if arm in steps]
    controls = [arm for arm in (PAIRS_ARM, LR_ARM) if arm in dirs]
    tuned = opts.arms or [*required, *controls, "scratch"]
    missing = [arm for arm in tuned if arm != "scratch" and arm not in dirs]
    if missing:
        raise app.UsageError(
            f"fine-tuning needs the pretraining of {missing}: run --stage=pretrain"
        )
    from data_pipelines.tasks import polarity

    jobs = finetune_jobs(opts, len(polarity.load(None).train), tuned)
    scores = finetune(opts, workdir, dirs, vocab, jobs[part::parts])
    if parts > 1 or opts.arms:
        return  # the report needs every run: a last process without --part and --arms
    flops = {arm: flops_per_step(opts, arm, vocab) for arm in ARMS}
    timing = {arm: seconds_per_step(path) for arm, path in dirs.items()}
    held = curves(dirs)
    markdown = report(opts, steps, flops, timing, held, scores)
    runs = [{"labels": n, "arm": a, "seed": s, "accuracy": v} for (n, a, s), v in scores.items()]
    data = {
        "steps": steps, "flops_per_step": flops, "seconds_per_step": timing, "held_out": held,
        "scores": runs, "wall_time_s": time.time() - start,
    }  # fmt: skip
    ablations.write_results(workdir, markdown, data)


def parse_part(text: str) -> tuple[int, int]:
    """'K/N' -> (K - 1, N): this process runs fine-tuning jobs K-1, K-1+N, ..."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise app.UsageError(f"--part: {text!r} is not K/N (e.g. 1/2)") from None
    if not 1 <= k <= n:
        raise app.UsageError(f"--part: {text!r} needs 1 <= K <= N")
    return k - 1, n


# The flags that decide the records, pretrainings and fine-tuning runs a workdir holds.
RUN_FLAGS = (
    "corpus_dir", "seed", "pretrain_steps", "pretrain_batch_size", "pretrain_learning_rate",
    "electra_learning_rate",
    "max_seq_length", "dupe_factor", "vocab_size", "same_time_tolerance", "min_steps",
)  # fmt: skip


def define_flags() -> None:
    """The command line (`experiments.ablations`' names where they mean the same)."""
    flags.DEFINE_string("workdir", "workdirs/electra_compare", "Records, runs and the report.")
    flags.DEFINE_string("corpus_dir", "workdirs/imdb", "The polarity demo's corpus and vocab.")
    flags.DEFINE_integer("seed", 0, "Seeds the records, the pretraining and the label subsets.")
    flags.DEFINE_integer("pretrain_steps", 3_600, "The budget: this many steps of `mlm`.")
    flags.DEFINE_integer("pretrain_batch_size", 64, "Pretraining sequences per step.")
    flags.DEFINE_float(
        "pretrain_learning_rate", 1e-3, "Peak learning rate of mlm_nsp and mlm (the demo's)."
    )
    flags.DEFINE_float(
        "electra_learning_rate", 1e-4, "Peak learning rate of the ELECTRA arms but "
        f"{LR_ARM} (at the MLM arms' 1e-3 the discriminator learns little beyond the class "
        "prior: docs/electra.md)."
    )  # fmt: skip
    flags.DEFINE_integer("max_seq_length", 64, "Pretraining sequence length (pieces).")
    flags.DEFINE_integer("dupe_factor", 2, "Copies of the training corpus in the records.")
    flags.DEFINE_integer("vocab_size", 8000, "WordPiece vocabulary size (the demo's).")
    flags.DEFINE_float(
        "same_time_tolerance", 0.03, "Relative gap between ELECTRA's equal-time and "
        "equal-FLOPs steps above which the equal-time arm is pretrained too."
    )  # fmt: skip
    flags.DEFINE_list("label_budgets", ["250", "1000", "all"], "Labelled polarity sentences.")
    flags.DEFINE_integer("subsets", 5, "Label subsets (fine-tuning seeds) per budget.")
    flags.DEFINE_integer("min_steps", 300, "Fine-tuning steps at least (more epochs if needed).")
    flags.DEFINE_enum("stage", "all", STAGES, "Run the pretrainings, the fine-tuning, or both.")
    flags.DEFINE_list(
        "arms", [], f"Pretrain, or fine-tune, only these arms (default all: "
        f"{ARMS + EXTRA_ARMS}, and 'scratch' when fine-tuning); no report."
    )  # fmt: skip
    flags.DEFINE_string("part", "1/1", "K/N: fine-tune every N-th run from the K-th only, "
                        "for N processes in parallel (no report).")  # fmt: skip


if __name__ == "__main__":
    define_flags()
    cli.run(main, stop_on_sigterm=True)
