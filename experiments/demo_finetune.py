"""Stage 5 of the demo (`experiments.demo`): fine-tuning both arms at every label budget.

`--task=ner` (`finetune_ner`): People's Daily NER in this process (`experiments.label_budgets`),
the pretrained model and the same architecture from random weights on the same label subsets,
every run stored as it ends (`run_cache`) so that an interrupted demo continues; beside them
the linear tagger on character windows (`LinearReference`), fitted in the background while
the demo pretrains. `--task=polarity` (`finetune_polarity`): every (budget, seed, arm) through
`experiments.finetune_classification`. The run's settings come in as arguments (the demo's
flags, the task's defaults applied), so nothing here reads the command line; errors name the
demo flag that set the value.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import subprocess
import sys

from absl import app, logging

from data_pipelines import cli
from experiments.demo_report import ARMS, NER_TASK

# Fine-tuning reads whole sentences (1% of People's Daily's are longer than 140 characters).
NER_MAX_SEQ_LENGTH = 128


def label_budgets(budgets: list[str], num_train: int) -> list[int]:
    """--label_budgets as sorted numbers ("all" = every training sentence)."""
    sizes = set()
    for budget in budgets:
        n = num_train if budget == "all" else int(budget)
        if not 0 < n <= num_train:
            raise app.UsageError(f"--label_budgets: {budget} is not in 1..{num_train} (or all)")
        sizes.add(n)
    return sorted(sizes)


# ------------------------------------------------------------------------------ ner


def finetune_ner(
    pretrain_dir: str,
    vocab: str,
    workdir: str,
    recipe,
    *,
    budgets: list[str],
    subsets: int,
    seed: int,
    dev_sentences: int,
    test_sentences: int | None,
    scratch_cache_dir: str,
    compare_optimizers: bool,
) -> dict:
    """Every budget, subset and arm with `recipe` (a `label_budgets.Recipe`), and with
    `compare_optimizers` the smallest budget with the other optimizer; returns results.json's
    fine-tuning part. `scratch_cache_dir`: where the scratch arm's runs are shared with the
    demos of other recipes of this architecture ("": the workdir's own)."""
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
    init_rng, _ = train_state.run_keys(seed)
    module = BertForTokenClassification(BertConfig(), len(task.tags))
    params = {}
    for arm in ARMS:
        module, _, params[arm], _ = common.load_model(
            module, pretrain_dir, from_scratch=arm == "scratch", rng=init_rng
        )
    runner = lb.TaggingRunner(
        task, tokenizer, module, recipe, max_seq_length=NER_MAX_SEQ_LENGTH,
        dev_sentences=dev_sentences, test_sentences=test_sentences,
    )  # fmt: skip
    sizes = label_budgets(budgets, runner.num_train)
    k = subsets
    if k < 2:
        raise app.UsageError("--subsets must be at least 2 (the paired interval needs them)")
    drawn = lb.paired_subsets(runner.num_train, sizes, k, seed)
    # Scratch runs shared with the demos of other recipes of this architecture, if asked.
    shared_scratch = scratch_cache_dir and architecture_id(module.config, vocab, sizes, k)
    runs_per_arm = len(recipe.learning_rates) + k - 1
    total = sum(recipe.steps(n) * runs_per_arm for n in sizes)
    total += recipe.steps(sizes[0]) * k * compare_optimizers
    bar = tqdm(total=total * len(ARMS), desc="5/6 finetune", unit="step", smoothing=0.05)
    decided_by = (dev_sentences, test_sentences, seed)

    def budget_row(n: int, recipes: dict) -> dict:
        """Every arm's runs at budget `n`, each arm with its recipe in `recipes`."""
        row = {"labels": n, "steps": recipe.steps(n), "optimizer": recipes[ARMS[0]].optimizer}
        for arm in ARMS:
            rid = recipe_id(recipes[arm], *decided_by)
            runs_dir = os.path.join(workdir, "finetune", rid, arm)
            if arm == "scratch" and shared_scratch:
                runs_dir = os.path.join(scratch_cache_dir, rid, shared_scratch)
            cache = run_cache(runs_dir)
            lr, runs = lb.run_arm(runner.with_recipe(recipes[arm]), params[arm], drawn[n],
                                  seed=seed * k, cache=cache,
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
        results = {"budgets": [budget_row(n, dict.fromkeys(ARMS, recipe)) for n in sizes]}
        if compare_optimizers:
            # The smallest budget with the other optimizer, each arm at the rate it chose.
            first = results["budgets"][0]
            optimizer = next(o for o in common.OPTIMIZERS if o != recipe.optimizer)
            other = {
                arm: dataclasses.replace(
                    recipe, optimizer=optimizer, learning_rates=(first["learning_rate"][arm],)
                )
                for arm in ARMS
            }
            results["optimizer_comparison"] = budget_row(sizes[0], other)
    logging.set_verbosity(logging.INFO)
    results["recipe"] = dataclasses.asdict(recipe) | {
        "dev_sentences": dev_sentences, "test_sentences": test_sentences
    }  # fmt: skip
    return results


class LinearReference:
    """The linear tagger on character windows (benchmarks.ner_linear_reference) on the
    demo's subsets, dev and test sentences: what a model told that neighbouring characters
    matter does with these labels. It fits in a background process while the demo
    pretrains (the tiny model leaves part of the second core idle); `result()` waits for it.
    Stored in the workdir: a rerun reads it back. A context manager: leaving the block
    (an error, a stopped demo) stops a fit still running."""

    def __init__(
        self,
        workdir: str,
        budgets: list[str],
        subsets: int,
        *,
        seed: int,
        dev_sentences: int,
        test_sentences: int | None,
    ):
        key = json.dumps([budgets, subsets, seed, dev_sentences, test_sentences])
        name = f"linear_{hashlib.sha256(key.encode()).hexdigest()[:10]}"
        self.path = os.path.join(workdir, name + ".json")
        self.process = None
        if not os.path.exists(self.path):
            command = [
                sys.executable, "-m", "benchmarks.ner_linear_reference", f"--seed={seed}",
                f"--label_budgets={','.join(budgets)}", f"--subsets={subsets}",
                f"--dev_sentences={dev_sentences}", f"--output={self.path}",
                *([f"--test_sentences={test_sentences}"] if test_sentences else []),
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


def recipe_id(r, dev_sentences: int, test_sentences: int | None, seed: int) -> str:
    """A short name of a fine-tuning recipe and what else decides its runs."""
    decided_by = [dataclasses.asdict(r), dev_sentences, test_sentences, seed]
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


# ------------------------------------------------------------------------------ polarity


def finetune_epochs(labels: int, batch_size: int, epochs: int, min_steps: int) -> int:
    """polarity: the epochs of a run, `epochs` and at least `min_steps` steps."""
    steps_per_epoch = max(labels // batch_size, 1)
    return max(epochs, math.ceil(min_steps / steps_per_epoch))


def finetune_polarity(
    pretrain_dir: str,
    vocab: str,
    workdir: str,
    *,
    learning_rates: list[float],
    pooling: str,
    optimizer: str,
    budgets: list[str],
    subsets: int,
    seed: int,
    epochs: int,
    min_steps: int,
) -> dict:
    """Every (budget, seed, arm) through finetune_classification; returns results.json's
    fine-tuning part."""
    from tqdm import tqdm

    from data_pipelines.tasks import polarity
    from experiments import finetune_classification
    from experiments.configs import finetune_tiny_polarity
    from experiments.label_budgets import paired_difference

    if len(learning_rates) != 1:
        raise app.UsageError("--task=polarity takes one --finetune_learning_rates value")
    lr = learning_rates[0]
    base = finetune_tiny_polarity.get_config()
    base.init_from, base.vocab_file = pretrain_dir, vocab
    base.learning_rate, base.pooling = lr, pooling
    base.optimizer = optimizer
    num_train = len(polarity.load(base.data_dir or None).train)
    k = subsets
    seeds = [seed * k + i for i in range(k)]
    # Runs are kept per fine-tuning recipe: another recipe in the same workdir reruns them.
    name = f"{pooling}_lr{lr:g}_epochs{epochs}_min{min_steps}_{base.optimizer}"
    sizes = label_budgets(budgets, num_train)
    jobs = [(n, s, arm) for n in sizes for s in seeds for arm in ARMS]
    results = {}
    # Orbax narrates each save and restore, and every run warns that its head is fresh and
    # that 1-2 sentences are truncated: the bar below is the stage's progress, errors aside.
    logging.set_verbosity(logging.ERROR)
    for labels, run_seed, arm in tqdm(jobs, desc="5/6 finetune", unit="run"):
        out = os.path.join(workdir, "finetune", name, f"{labels}_labels", f"{arm}_seed{run_seed}")
        metrics_file = os.path.join(out, "metrics.json")
        if os.path.exists(metrics_file):
            with open(metrics_file, encoding="utf-8") as f:
                metrics = json.load(f)
        if not (os.path.exists(metrics_file) and "wall_time_s" in metrics):
            config = base.copy_and_resolve_references()
            config.seed, config.from_scratch = run_seed, arm == "scratch"
            config.max_train_examples = None if labels == num_train else labels
            config.num_epochs = finetune_epochs(labels, config.train_batch_size, epochs, min_steps)
            # Only test accuracy is reported: dev is scored once, at the end (250 labels
            # train 43 epochs, and scoring dev after each took half the run).
            config.eval_every_epochs = config.num_epochs
            metrics = finetune_classification.finetune(config, out, show_progress=False)
        results[labels, arm, run_seed] = metrics["test"]["test"]["accuracy"]
    logging.set_verbosity(logging.INFO)
    rows = [
        {
            "labels": labels,
            "epochs": finetune_epochs(labels, base.train_batch_size, epochs, min_steps),
            "seeds": seeds,
            **{arm: [results[labels, arm, s] for s in seeds] for arm in ARMS},
        }
        for labels in sizes
    ]
    for row in rows:
        row["difference"] = paired_difference(row["pretrained"], row["scratch"])
    return {"budgets": rows, "recipe": {"pooling": pooling, "learning_rate": lr,
                                         "optimizer": base.optimizer}}  # fmt: skip
