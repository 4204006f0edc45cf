r"""Fine-tunes a pretrained BERT on token tagging (NER in CoNLL format, BIO or IOBES tags).

  python -m experiments.finetune_tagging --config=experiments/configs/finetune_minilm_tweet_ner.py \
      --workdir=workdirs/minilm_tweet_ner

  python -m experiments.finetune_tagging --config=experiments/configs/finetune_conll.py \
      --config.train_file=conll2003/eng.train --config.dev_file=conll2003/eng.testa \
      --config.test_file=conll2003/eng.testb --config.init_from=cased_L-12_H-768_A-12 \
      --config.do_lower_case=False --workdir=workdirs/conll2003

The encoder comes from `config.init_from` (see experiments/finetune_classification.py);
a fresh linear layer tags every position. Each word's tag is learned and predicted at its
first word piece. Dev entity-level precision / recall / F1 (conlleval's counting) after
every epoch; at the end dev and test are scored and written in conlleval's input layout
(`word gold predicted`).

Writes to --workdir: `metrics.json`, `train_log.jsonl`, `predictions_<split>.txt`.
"""

from __future__ import annotations

import functools
import os
import time
from typing import TYPE_CHECKING

import ml_collections
import numpy as np
from absl import flags, logging
from ml_collections import config_flags
from tqdm import tqdm

from bert_jax import scoring
from bert_jax.config import BertConfig
from data_pipelines import cli
from data_pipelines.tasks.conll import write_conll
from data_pipelines.tasks.tagging_features import TaggingFeatures, decode, encode_tagged
from data_pipelines.tasks.tagging_tasks import TaggingTask, load_tagging_task
from experiments import finetune_main

# JAX, Optax and the model are imported where they are used: `-h` answers without them.
if TYPE_CHECKING:
    import jax

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


def loss_fn(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """Cross-entropy averaged over the weighted (first-piece) positions."""
    import jax.numpy as jnp
    import optax

    per_token = optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # (B, T)
    return jnp.sum(per_token * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def train_loss(params, batch, dropout_rng, *, model):
    """(loss, metrics) of one batch under dropout: what the train step differentiates."""
    import jax.numpy as jnp

    logits = model.apply(
        {"params": params},
        *(batch[k] for k in INPUT_KEYS),
        deterministic=False,
        rngs={"dropout": dropout_rng},
    )  # (B, T, C)
    return loss_fn(logits.astype(jnp.float32), batch["label_ids"], batch["label_weights"]), {}


def predict_step(params, batch, *, model):
    import jax.numpy as jnp

    logits = model.apply({"params": params}, *(batch[k] for k in INPUT_KEYS))
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)  # (B, T)


def predict(predict_fn, params, arrays: dict[str, np.ndarray], batch_size: int, mesh,
            desc: str, take_fn=None) -> np.ndarray:  # fmt: skip
    """(N, T) predicted tag ids, batched by length with the padding cut.

    Args:
        predict_fn: the jitted `(params, batch) -> (B, T) tag ids`.
        arrays: the model's inputs by name, (N, ...) each, `input_mask` (N, T) among them.
        take_fn: `(arrays, indices, length) -> host batch` (default `common.take`).
    """
    from bert_jax import finetune_common as common
    from bert_jax import sharding

    take_fn = take_fn or common.take
    lengths = arrays["input_mask"].sum(1)
    max_length = arrays["input_mask"].shape[1]
    out = np.zeros(arrays["input_mask"].shape, np.int32)
    batches = common.eval_batches(lengths, batch_size)
    total = common.num_batches(len(lengths), batch_size)
    for indices, real in tqdm(batches, total=total, desc=desc, leave=False):
        length = common.pad_length(lengths[indices], max_length)
        batch = take_fn(arrays, indices, length)
        predicted = np.asarray(predict_fn(params, sharding.global_batch(batch, mesh)))
        out[indices[:real], :length] = predicted[:real]
    return out


def load_task(config: ml_collections.ConfigDict) -> TaggingTask:
    """The config's tagging task, its training split cut to `max_train_examples`."""
    task = load_tagging_task(
        config.task, train_file=config.train_file, dev_file=config.dev_file,
        test_file=config.test_file, tag_column=config.tag_column,
    )  # fmt: skip
    if config.max_train_examples:
        task.splits["train"] = task.splits["train"][: config.max_train_examples]
    return task


def check_train_tags(task: TaggingTask) -> None:
    """Logs the tag set with each tag's count in the training split, and refuses a split
    of one tag (every word "O"): it trains to loss 0 and tags nothing.

    Raises:
        TaskDataError: naming the task, the one tag and the number of words.
    """
    from collections import Counter

    from data_pipelines.tasks.formats import TaskDataError

    counts = Counter(tag for example in task.splits["train"] for tag in example.tags or ())
    logging.info("%s: %d tags (training words of each): %s", task.name, len(task.tags),
                 ", ".join(f"{t} ({counts[t]})" for t in task.tags))  # fmt: skip
    if len(counts) == 1:
        ((tag, words),) = counts.items()
        raise TaskDataError(f"{task.name}: all {words} training words are tagged {tag!r}: a "
                            "single tag trains to loss 0 and tags nothing else")  # fmt: skip


def encode_splits(task: TaggingTask, tokenizer, max_seq_length: int) -> dict[str, TaggingFeatures]:
    return {
        split: encode_tagged(
            examples, tokenizer, max_seq_length, task.tags, name=f"{task.name} {split}"
        )  # fmt: skip
        for split, examples in task.splits.items()
    }


def score(task: TaggingTask, split: str, features: TaggingFeatures, predicted: np.ndarray):
    """(entity scores, predicted tags per word) of (N, T) tag ids: each word's tag is the one
    at its first piece (`decode`), scored against the gold tags by `scoring.entity_scores`."""
    tags = decode(features, predicted, task.tags)
    gold = [list(e.tags) for e in task.splits[split]]
    return scoring.entity_scores(gold, tags), tags


def describe(
    task: TaggingTask, features: dict[str, TaggingFeatures], config, init_step: int | None
) -> dict:
    """What metrics.json says of the data and of the encoder's checkpoint (`init_step`: the
    pretraining checkpoint step `init_from` gave, `finetune_common.TaskModel`)."""
    return {
        "task": task.name,
        "init_from": config.init_from,
        "init_step": init_step,
        "tags": list(task.tags),
        "num_examples": {s: len(f) for s, f in features.items()},
        "num_truncated": {s: f.num_truncated for s, f in features.items()},
        "num_words_cut": {s: f.num_words_cut for s, f in features.items()},
        "num_empty_words": {s: f.num_empty_words for s, f in features.items()},
        "num_unknown_words": {s: f.num_unknown_words for s, f in features.items()},
        "max_seq_length": config.max_seq_length,
    }


def train_and_score(
    config: ml_collections.ConfigDict,
    workdir: str,
    task: TaggingTask,
    results: dict,
    state,
    *,
    mesh,
    train_epoch,
    evaluate,
    epoch_splits: tuple[str, ...] = ("dev",),
    epoch_extras=None,
):
    """The epochs, each scored, then the final scores and conlleval files; returns the state.

    After every epoch the `epoch_splits` are scored and metrics.json (`results`, whose
    `epochs` list grows) is rewritten; at the end dev and test (when the task has it) are
    scored into `results["final"]` and written as `predictions_<split>.txt` (conlleval's
    `word gold predicted` layout).

    Args:
        train_epoch: `(state, epoch, log_file) -> (state, mean train loss)`.
        evaluate: `(params, split) -> (entity scores, predicted tags per word)`.
        epoch_extras: `(params) -> dict` added to each epoch's record.
    """
    from bert_jax import finetune_common as common
    from bert_jax import sharding

    results["epochs"] = []
    log_path = os.path.join(workdir, "train_log.jsonl")
    with sharding.activation_context(mesh), open(log_path, "w", encoding="utf-8") as log_file:
        for epoch in range(1, config.num_epochs + 1):
            state, loss = train_epoch(state, epoch, log_file)
            record = {"epoch": epoch, "train_loss": loss}
            for split in epoch_splits:
                if split in task.splits:
                    record[split], _ = evaluate(state.params, split)
            scores = record["dev"]
            logging.info("epoch %d: dev F1 %.4f (P %.4f, R %.4f)", epoch, scores["f1"],
                         scores["precision"], scores["recall"])  # fmt: skip
            results["epochs"].append(record | (epoch_extras(state.params) if epoch_extras else {}))
            common.write_json(os.path.join(workdir, "metrics.json"), results)
        for split in ("dev", "test"):
            if split not in task.splits:
                continue
            scores, tags = evaluate(state.params, split)
            results.setdefault("final", {})[split] = scores
            write_conll(os.path.join(workdir, f"predictions_{split}.txt"), task.splits[split], tags)
    common.write_json(os.path.join(workdir, "metrics.json"), results)
    logging.info("final: %s", {s: round(r["f1"], 4) for s, r in results["final"].items()})
    return state


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs the whole fine-tuning described by `config`; returns what metrics.json holds."""
    from bert_jax import finetune_common as common
    from bert_jax.heads import BertForTokenClassification

    start_time = time.time()
    os.makedirs(workdir, exist_ok=True)
    task = load_task(config)
    check_train_tags(task)
    model, _, params, tokenizer, _, init_step = common.load_task_model(
        config, BertForTokenClassification(BertConfig(), len(task.tags))
    )
    _, dropout_rng = common.run_keys(config)
    features = encode_splits(task, tokenizer, config.max_seq_length)
    train = features["train"]

    train_keys = (*INPUT_KEYS, "label_ids", "label_weights")
    run = common.setup(
        config, model, params, len(train), functools.partial(train_loss, model=model),
        train_keys, functools.partial(predict_step, model=model), INPUT_KEYS,
    )  # fmt: skip
    del params
    mesh, num_steps = run.mesh, run.num_steps
    train_arrays = {k: getattr(train, k) for k in train_keys}

    def train_epoch(state, epoch, log_file):
        return common.train_epoch(
            run.train_step, state, dropout_rng, train_arrays, epoch=epoch, config=config,
            mesh=mesh, log_file=log_file,
        )  # fmt: skip

    def evaluate(params, split):
        arrays = {k: getattr(features[split], k) for k in INPUT_KEYS}
        predicted = predict(run.predict_step, params, arrays, config.eval_batch_size, mesh,
                            f"eval {split}")  # fmt: skip
        return score(task, split, features[split], predicted)

    results = describe(task, features, config, init_step) | {
        "from_scratch": config.from_scratch,
        "do_lower_case": config.do_lower_case,  # the encoder's, as load_task_model found it
        "num_train_steps": num_steps,
    }
    logging.info("%s: %d train sentences, %d tags, %d steps of %d", task.name, len(train),
                 len(task.tags), num_steps, config.train_batch_size)  # fmt: skip
    train_and_score(config, workdir, task, results, run.state, mesh=mesh,
                    train_epoch=train_epoch, evaluate=evaluate)  # fmt: skip
    results["wall_time_s"] = time.time() - start_time
    common.write_json(os.path.join(workdir, "metrics.json"), results)
    return results


main = finetune_main.make_main(finetune, "finetune_tagging")


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Fine-tuning config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Where metrics.json and predictions are written.")
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
