r"""Few-label tagging: many fine-tuning runs (label budgets x subsets x arms) in one process.

`make demo` fine-tunes a pretrained encoder and the same architecture from random weights
("scratch") on People's Daily NER at several label budgets, several label subsets each.
Run one by one through `experiments.finetune_tagging`, each run would re-read and re-encode
the task and compile its own step; here the task's features are encoded once
(`TaggingRunner`), and every run trains with the same jitted step: the learning rate is an
argument of the step (computed on the host from the run's schedule), so runs of any length,
peak learning rate or arm share one compilation per batch shape.

The recipe (`Recipe`) is `finetune_tagging`'s: global-norm clipping, AdamW (the config key
`optimizer`: BERT's without bias correction, or Adam's own), weight decay off LayerNorm and
biases, linear warmup then linear decay to 0, dropout on. What is chosen on dev is chosen
by one rule for both arms (`select`): the peak learning rate, once per budget and arm, on
that budget's first subset; the step, for every run, as the evaluation point with the best
dev entity F1 (dev is scored at `Recipe.evaluations` evenly spaced steps; the test split
only once, with the chosen step's weights).

`paired_subsets` draws a budget's label subsets from the seed alone, so both arms train on
the same sentences (the comparison is paired).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import finetune_common as common
from bert_jax import scoring, train_state
from bert_jax.host_progress import FinishedSteps
from data_pipelines.tasks.tagging_features import TaggingFeatures, decode, encode_tagged
from data_pipelines.tasks.tagging_tasks import TaggingTask
from experiments import finetune_tagging

TRAIN_KEYS = (*finetune_tagging.INPUT_KEYS, "label_ids", "label_weights")


def paired_subsets(
    num_train: int, budgets: Sequence[int], subsets: int, seed: int
) -> dict[int, list[np.ndarray]]:
    """For each budget, `subsets` sets of training-sentence indices (sorted, distinct).

    Subset k of budget n is drawn with numpy's `default_rng([seed, n, k])` alone, so it is
    the same for every arm, run and process; a budget of all `num_train` sentences is
    every index, `subsets` times (its runs differ in their seeds only).

    Raises:
        ValueError: a budget outside 1..num_train.
    """
    out = {}
    for n in budgets:
        if not 0 < n <= num_train:
            raise ValueError(f"label budget {n} is not in 1..{num_train}")
        out[n] = [
            np.sort(np.random.default_rng([seed, n, k]).choice(num_train, n, replace=False))
            for k in range(subsets)
        ]
    return out


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How each run fine-tunes (the same for both arms)."""

    optimizer: str = "adamw_bias_corrected"  # finetune_common.OPTIMIZERS
    learning_rates: tuple[float, ...] = (1e-3,)  # the grid `select` chooses from
    batch_size: int = 16
    epochs: int = 10  # per run, or more to reach min_steps
    min_steps: int = 200
    max_steps: int = 1_000
    warmup_proportion: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    evaluations: int = 5  # dev scorings per run, evenly spaced (the last at the end)

    def steps(self, labels: int) -> int:
        """Steps of a run on `labels` sentences: `epochs` (of whole batches: an epoch drops
        its last partial batch), within [min_steps, max_steps]."""
        epochs = self.epochs * max(labels // self.batch_size, 1)
        return min(max(epochs, self.min_steps), self.max_steps)

    def eval_steps(self, steps: int) -> list[int]:
        return sorted(
            {math.ceil(steps * (i + 1) / self.evaluations) for i in range(self.evaluations)}
        )


def _update_rule(recipe: Recipe) -> tuple:
    """What the compiled train step depends on (the learning rate is its argument)."""
    return recipe.optimizer, recipe.weight_decay, recipe.max_grad_norm


@dataclasses.dataclass
class RunResult:
    learning_rate: float
    steps: int
    chosen_step: int  # the evaluation step with the best dev F1
    dev_f1: dict[int, float]  # at every evaluation step
    test: dict  # scoring.entity_scores of the chosen step's weights
    wall_time_s: float


class TaggingRunner:
    """A tagging task encoded once and the jitted steps every run of it shares.

    Args:
        task: the task; its train, dev and test splits are encoded here.
        tokenizer: the vocab's tokenizer (both arms share the vocab).
        module: the `BertForTokenClassification` both arms run.
        recipe: the fine-tuning recipe.
        dev_sentences: score model selection on the first N dev sentences (None: all).
        test_sentences: score the first N test sentences (None: all; quick checks).
    """

    def __init__(self, task: TaggingTask, tokenizer, module, recipe: Recipe, *,
                 max_seq_length: int, dev_sentences: int | None = None,
                 test_sentences: int | None = None, eval_batch_size: int = 128):  # fmt: skip
        self.task, self.module, self.recipe = task, module, recipe
        self.max_seq_length, self.eval_batch_size = max_seq_length, eval_batch_size
        splits = dict(task.splits)
        for split, count in (("dev", dev_sentences), ("test", test_sentences)):
            if count:
                splits[split] = splits[split][:count]
        self.examples = splits
        self.features: dict[str, TaggingFeatures] = {
            split: encode_tagged(
                examples, tokenizer, max_seq_length, task.tags, name=f"{task.name} {split}"
            )  # fmt: skip
            for split, examples in splits.items()
        }
        self._predict = jax.jit(functools.partial(finetune_tagging.predict_step, model=module))
        self._compile(recipe)

    def _compile(self, recipe: Recipe) -> None:
        self.recipe = recipe
        # The learning rate is applied in the step: the transformation runs at 1.0.
        self.tx = tx = common.make_tx(
            recipe.optimizer, 1.0, recipe.weight_decay, recipe.max_grad_norm
        )
        loss = functools.partial(finetune_tagging.train_loss, model=self.module)

        def step(params, opt_state, batch, rng, step, learning_rate):
            dropout_rng = jax.random.fold_in(rng, step)
            (value, _), grads = jax.value_and_grad(loss, has_aux=True)(params, batch, dropout_rng)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = jax.tree.map(lambda p, u: p + learning_rate * u, params, updates)
            return params, opt_state, value

        self._step = jax.jit(step, donate_argnums=(0, 1))

    def with_recipe(self, recipe: Recipe) -> TaggingRunner:
        """A runner of another recipe on the same encoded task (and prediction step); the
        same train step too unless the recipe changes the update rule (not the rates)."""
        other = copy.copy(self)
        if _update_rule(recipe) == _update_rule(self.recipe):
            other.recipe = recipe
        else:
            other._compile(recipe)
        return other

    @property
    def num_train(self) -> int:
        return len(self.features["train"])

    def score(self, params, split: str) -> dict:
        """Entity scores of `params` on a split (dev: the selection sentences)."""
        features = self.features[split]
        arrays = {k: getattr(features, k) for k in finetune_tagging.INPUT_KEYS}
        lengths = arrays["input_mask"].sum(1)
        predicted = np.zeros(arrays["input_mask"].shape, np.int32)
        for indices, real in common.eval_batches(lengths, self.eval_batch_size):
            length = common.pad_length(lengths[indices], self.max_seq_length)
            out = self._predict(params, common.take(arrays, indices, length))
            predicted[indices[:real], :length] = np.asarray(out)[:real]
        tags = decode(features, predicted, self.task.tags)
        gold = [list(e.tags) for e in self.examples[split]]
        return scoring.entity_scores(gold, tags)

    def run(self, params, indices: np.ndarray, *, learning_rate: float, seed: int,
            progress: Callable[[], None] | None = None) -> RunResult:  # fmt: skip
        """Fine-tunes a copy of `params` on the training sentences `indices`.

        Batches are `common.train_batches` of the subset (shuffled by `seed` and the epoch,
        similar lengths together); dropout keys fold the step into `seed`'s dropout key
        (`train_state.run_keys`), as every fine-tuning script's.

        Raises:
            FloatingPointError: a non-finite training loss (checked at each evaluation).
        """
        start = time.time()
        recipe = self.recipe
        steps = recipe.steps(len(indices))
        eval_steps = set(recipe.eval_steps(steps))
        warmup = int(steps * recipe.warmup_proportion)
        schedule = common.optim.warmup_polynomial_decay(1.0, warmup, steps)
        rates = learning_rate * np.asarray(jax.vmap(schedule)(jnp.arange(steps)))  # on the host
        train = self.features["train"]
        arrays = {k: getattr(train, k)[indices] for k in TRAIN_KEYS}
        lengths = arrays["input_mask"].sum(1)
        batch_size = min(recipe.batch_size, len(indices))
        params = jax.tree.map(jnp.array, params)  # a copy: the step donates its inputs
        opt_state = self.tx.init(params)
        _, rng = train_state.run_keys(seed)
        dev_f1, best, step, epoch = {}, None, 0, 0
        finished = FinishedSteps(lambda _: progress()) if progress else None
        while step < steps:
            epoch += 1
            for batch_indices in common.train_batches(lengths, batch_size, seed, epoch):
                length = common.pad_length(lengths[batch_indices], self.max_seq_length)
                batch = common.take(arrays, batch_indices, length)
                params, opt_state, loss = self._step(
                    params, opt_state, batch, rng, step, rates[step]
                )
                step += 1
                if step in eval_steps:
                    if not np.isfinite(float(loss)):
                        raise FloatingPointError(f"non-finite loss {float(loss)} at step {step}")
                    dev_f1[step] = self.score(params, "dev")["f1"]
                    if best is None or dev_f1[step] > dev_f1[best[0]]:
                        best = (step, jax.tree.map(np.asarray, params))
                if finished:  # counted when its loss is on the host, not when dispatched
                    finished.add(loss)
                if step == steps:
                    break
        if finished:
            finished.drain()
        test = self.score(best[1], "test")
        return RunResult(learning_rate, steps, best[0], dev_f1, test, time.time() - start)


def run_arm(
    runner: TaggingRunner,
    params,
    subsets: list[np.ndarray],
    *,
    seed: int,
    cache: Callable[[str, Callable[[], RunResult]], RunResult],
    progress: Callable[[], None] | None = None,
) -> tuple[float, list[RunResult]]:
    """One arm at one budget: (the chosen learning rate, a run per subset).

    The rule, the same for every arm: each learning rate of the recipe's grid fine-tunes
    subset 0; the one whose run reaches the best dev F1 (at its best evaluation step) is
    chosen, and fine-tunes the other subsets (subset 0 keeps its run at that rate). Run k's
    seed is `seed + k`. `cache(name, make)` returns a stored run or makes and stores it.
    """
    labels = len(subsets[0])

    def run(k: int, lr: float) -> RunResult:
        return cache(f"{labels}_labels_subset{k}_lr{lr:g}", lambda: runner.run(
            params, subsets[k], learning_rate=lr, seed=seed + k, progress=progress))  # fmt: skip

    trials = [run(0, lr) for lr in runner.recipe.learning_rates]
    first = max(trials, key=lambda r: r.dev_f1[r.chosen_step])
    chosen = first.learning_rate
    return chosen, [first] + [run(k, chosen) for k in range(1, len(subsets))]


def paired_difference(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Mean of a[i] - b[i] and its two-sided 95% t-interval (needs 2 or more pairs)."""
    from scipy import stats

    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    if len(d) < 2:
        raise ValueError("a paired interval needs at least 2 pairs")
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return {"mean": float(d.mean()), "low": float(d.mean() - half), "high": float(d.mean() + half)}


def fill_mask(module, params, tokenizer, examples, *, top_k: int = 5,
              max_seq_length: int = 128) -> list[dict]:  # fmt: skip
    """The pretrained MLM's top predictions for each character of an entity, all masked.

    One jitted forward pass for every example: sentences are padded to `pad_length`'s
    multiples (padding changes no real position's output) and the masked positions to the
    longest entity's count (extra rows repeat the last position and are dropped), so a few
    shapes compile once each, where eager calls dispatched each op of every sentence alone.

    Args:
        module: a `BertForPreTraining` (the checkpoint's MLM head).
        examples: (TaggingExample, (start, end) word span of the entity) pairs.

    Returns:
        Per example: `text` (the sentence, the entity's characters as [MASK]), `entity`,
        `type`, and `predictions`: per masked character, the `top_k` tokens, best first.
    """
    predict = jax.jit(
        lambda params, ids, mask, segments, positions: (
            module.apply({"params": params}, ids, mask, segments, positions).mlm_logits
        )
    )
    most = max((end - start for _, (start, end) in examples), default=1)
    out = []
    for example, (start, end) in examples:
        features = encode_tagged([example], tokenizer, max_seq_length, sorted(set(example.tags)))
        ids = features.input_ids.copy()
        positions = features.word_positions[0][start:end]
        ids[0, positions] = tokenizer.mask_id
        length = common.pad_length(features.input_mask.sum(1), max_seq_length)
        padded = np.concatenate([positions, np.repeat(positions[-1:], most - len(positions))])
        logits = predict(
            params,
            ids[:, :length],
            features.input_mask[:, :length],
            features.segment_ids[:, :length],
            padded[None],
        )[0, : len(positions)]  # (P, V)
        best = np.argsort(-np.asarray(logits), axis=-1)[:, :top_k]
        words = list(example.words)
        words[start:end] = ["[MASK]"] * (end - start)
        out.append({
            "text": "".join(words),
            "entity": "".join(example.words[start:end]),
            "type": example.tags[start].split("-")[-1],
            "predictions": [tokenizer.convert_ids_to_tokens(row) for row in best],
        })  # fmt: skip
    return out


def entity_spans(example) -> list[tuple[int, int]]:
    """(start, end) word spans of an example's BIO entities."""
    spans, start = [], None
    for i, tag in enumerate((*example.tags, "O")):
        if start is not None and not tag.startswith("I-"):
            spans.append((start, i))
            start = None
        if tag.startswith("B-"):
            start = i
    return spans
