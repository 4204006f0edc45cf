r"""Fine-tunes a pretrained BERT on sentence (pair) classification or regression.

  python -m experiments.finetune_classification \
      --config=experiments/configs/finetune_minilm_polarity.py --workdir=workdirs/polarity \
      [--config.init_from=PATH --config.learning_rate=3e-5 ...]

  python -m experiments.finetune_classification --config=experiments/configs/finetune_glue.py:mrpc \
      --config.data_dir=glue_data/MRPC --config.init_from=uncased_L-12_H-768_A-12 --workdir=...

The encoder comes from `config.init_from` (a pretraining workdir or checkpoint dir of this
project, a params-only Orbax dir, a Google TF checkpoint or a Hugging Face directory); the
classifier on the pooled [CLS] is new. All weights are trained with the original recipe
(BERT AdamW, linear warmup over `warmup_proportion`, linear decay to 0, batch 32).
After every epoch the dev split(s) are scored with the task's metrics; at the end the
test split is scored (when labeled) or written as a GLUE submission TSV.

Writes to --workdir: `metrics.json` (per-epoch dev metrics, final test metrics, counts of
truncated examples, wall time), `train_log.jsonl` (loss, learning rate and gradient,
param and update norms every `log_every` steps), `predictions_<split>.tsv`,
`submission/<GLUE file>.tsv` and the fine-tuned model in `checkpoint/` (`load_classifier`
reloads it, e.g. as a distillation teacher).
"""

from __future__ import annotations

import csv
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
from data_pipelines.tasks import glue
from data_pipelines.tasks.classification_features import SentenceFeatures, encode_sentences
from data_pipelines.tasks.sentence_tasks import SentenceTask, load_sentence_task
from experiments import finetune_main

# JAX, Optax and the model are imported where they are used: `-h` answers without them.
if TYPE_CHECKING:
    import jax

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


def loss_fn(logits: jax.Array, labels: jax.Array, regression: bool) -> jax.Array:
    """Mean cross-entropy over the batch, or mean squared error for regression."""
    import jax.numpy as jnp
    import optax

    if regression:
        return jnp.mean((logits[:, 0] - labels) ** 2)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def train_loss(params, batch, dropout_rng, *, model, regression):
    """(loss, metrics) of one batch under dropout: what the train step differentiates."""
    import jax.numpy as jnp

    logits = model.apply(
        {"params": params},
        *(batch[k] for k in INPUT_KEYS),
        deterministic=False,
        rngs={"dropout": dropout_rng},
    )  # (B, C)
    return loss_fn(logits.astype(jnp.float32), batch["labels"], regression), {}


def predict_step(params, batch, *, model):
    import jax.numpy as jnp

    return model.apply({"params": params}, *(batch[k] for k in INPUT_KEYS)).astype(jnp.float32)


def predict(
    predict_fn,
    params,
    features: SentenceFeatures,
    batch_size: int,
    mesh,
    desc: str,
    show_progress: bool = True,
):
    """(N, C) logits for every example, in order (batched by length, padding cut)."""
    from bert_jax import finetune_common as common
    from bert_jax import sharding

    arrays = {"input_ids": features.input_ids, "input_mask": features.input_mask,
              "segment_ids": features.segment_ids}  # fmt: skip
    lengths = features.input_mask.sum(1)
    max_length = features.input_ids.shape[1]
    out = None
    batches = common.eval_batches(lengths, batch_size)
    total = common.num_batches(len(features), batch_size)
    for indices, real in tqdm(
        batches, total=total, desc=desc, leave=False, disable=not show_progress
    ):
        batch = common.take(arrays, indices, common.pad_length(lengths[indices], max_length))
        logits = np.asarray(predict_fn(params, sharding.global_batch(batch, mesh)))
        if out is None:
            out = np.zeros((len(features), logits.shape[-1]), np.float32)
        out[indices[:real]] = logits[:real]
    return out


def score(task: SentenceTask, labels: np.ndarray, logits: np.ndarray):
    """(metrics, predictions): class ids (argmax) or regression values."""
    predictions = logits[:, 0] if task.labels is None else logits.argmax(-1)
    return scoring.classification_metrics(task.metrics, labels, predictions), predictions


def write_predictions(path, task, examples, logits, predictions) -> None:
    import jax

    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        if task.labels is None:
            writer.writerow(["guid", "label", "prediction"])
            for example, value in zip(examples, predictions, strict=True):
                writer.writerow([example.guid, example.label, f"{value:.6f}"])
        else:
            probs = np.asarray(jax.nn.softmax(logits, axis=-1))
            writer.writerow(["guid", "label", "prediction", *(f"p_{n}" for n in task.labels)])
            for example, pred, p in zip(examples, predictions, probs, strict=True):
                label = "" if example.label is None else example.label
                writer.writerow([example.guid, label, task.labels[pred], *(f"{x:.6f}" for x in p)])
    os.replace(tmp, path)


def load_classifier(directory: str):
    """A model saved in `<workdir>/checkpoint` by `finetune`, ready to predict.

    Returns:
        (BertForSequenceClassification, its BertConfig, numpy params, vocab file, metadata
        with `task` and `data_dir` (as configured), `labels` (None for regression),
        `num_outputs`, `do_lower_case` and `max_seq_length`).
    """
    from bert_jax import finetune_common as common
    from bert_jax.heads import BertForSequenceClassification

    bert_config, params, vocab_file, meta = common.load_finetuned(directory)
    pooling = meta.get("pooling", "cls")  # (models saved before the option pooled [CLS])
    model = BertForSequenceClassification(bert_config, meta["num_outputs"], pooling=pooling)
    return model, bert_config, params, vocab_file, meta


def finetune(
    config: ml_collections.ConfigDict, workdir: str, *, show_progress: bool = True
) -> dict:
    """Runs the whole fine-tuning described by `config`; returns what metrics.json holds.

    `show_progress=False` hides the per-epoch progress bars (a caller running many
    fine-tunings shows its own).
    """
    from bert_jax import finetune_common as common
    from bert_jax import sharding
    from bert_jax.heads import BertForSequenceClassification

    start_time = time.time()
    os.makedirs(workdir, exist_ok=True)
    task = load_task(config)
    num_outputs = 1 if task.labels is None else len(task.labels)
    model, bert_config, params, tokenizer, vocab_file, init_step = common.load_task_model(
        config, BertForSequenceClassification(BertConfig(), num_outputs, pooling=config.pooling)
    )
    features = encode_splits(task, tokenizer, config)
    run = common.setup(
        config, model, params, len(features["train"]),
        functools.partial(train_loss, model=model, regression=task.labels is None),
        (*INPUT_KEYS, "labels"), functools.partial(predict_step, model=model), INPUT_KEYS,
    )  # fmt: skip
    del params
    results = describe(task, features, config, init_step, run.num_steps)
    logging.info("%s: %d train examples, %d steps of %d; model %s", task.name,
                 len(features["train"]), run.num_steps, config.train_batch_size,
                 bert_config)  # fmt: skip
    with sharding.activation_context(run.mesh):
        state, final_logits = train_and_score(
            config, workdir, task, features, run, results, show_progress=show_progress
        )
        write_final_predictions(
            config, workdir, task, features, run, state.params, final_logits, results,
            show_progress=show_progress,
        )  # fmt: skip
    # metrics.json's final form only once the model is saved; a signal lets both complete.
    with common.final_save(f"{workdir}/checkpoint and metrics.json"):
        save_model(config, workdir, task, bert_config, state.params, vocab_file, init_step)
        results["wall_time_s"] = time.time() - start_time
        common.write_json(os.path.join(workdir, "metrics.json"), results)
    logging.info("final: %s", {k: results.get(k) for k in ("epochs", "test", "wall_time_s")})
    return results


def load_task(config: ml_collections.ConfigDict) -> SentenceTask:
    """The config's task, its training split cut to a random `max_train_examples`."""
    files = None
    if config.task == "files":  # your own TSV / CSV / JSONL (data_pipelines.tasks.own_files)
        files = {k: config.get(k, "") for k in ("train_file", "dev_file", "test_file", "labels")}
        files["label_type"] = config.get("label_type", "auto")
    task = load_sentence_task(
        config.task, config.data_dir or None, source=config.data_source,
        skip_malformed=config.skip_malformed, files=files,
    )  # fmt: skip
    if config.max_train_examples:
        # A label budget: a random subset drawn with the run's seed, so seeds differ in the
        # examples they see as well as in initialisation and order (as few-shot runs report).
        train = task.splits["train"]
        chosen = np.random.default_rng(config.seed).permutation(len(train))
        task.splits["train"] = [train[i] for i in np.sort(chosen[: config.max_train_examples])]
    return task


def encode_splits(
    task: SentenceTask, tokenizer, config: ml_collections.ConfigDict
) -> dict[str, SentenceFeatures]:
    """Every split as model inputs (`encode_sentences`).

    Raises:
        ValueError: the train split has no labels.
    """
    features = {
        split: encode_sentences(
            examples,
            tokenizer,
            config.max_seq_length,
            task.labels,
            name=f"{task.name} {split}",
            keep_tail=config.keep_tail,
        )  # fmt: skip
        for split, examples in task.splits.items()
    }
    if features["train"].labels is None:
        raise ValueError(f"{task.name} train split has no labels")
    check_train_labels(task, features["train"].labels)
    return features


def check_train_labels(task: SentenceTask, labels: np.ndarray) -> None:
    """Logs the label set with each class's count in the training split, and refuses one
    that cannot teach anything: a single class (or a single regression target), which
    trains to loss 0 and predicts it everywhere.

    Raises:
        TaskDataError: naming the task, the one label and the number of examples.
    """
    from data_pipelines.tasks.formats import TaskDataError

    if task.labels is None:
        values = np.unique(labels)
        logging.info("%s: %d regression targets in [%g, %g]", task.name, len(labels),
                     labels.min(), labels.max())  # fmt: skip
        if len(values) < 2 and len(labels) > 1:
            raise TaskDataError(f"{task.name}: every one of the {len(labels)} training targets "
                                f"is {values[0]:g}: nothing to regress on")  # fmt: skip
        return
    counts = np.bincount(labels, minlength=len(task.labels))
    shown = ", ".join(f"{n!r} ({c})" for n, c in zip(task.labels, counts, strict=True))
    logging.info("%s: %d labels (training examples of each): %s", task.name, len(task.labels),
                 shown)  # fmt: skip
    present = [name for name, count in zip(task.labels, counts, strict=True) if count]
    if len(present) < 2:
        raise TaskDataError(
            f"{task.name}: all {len(labels)} training examples have the label {present[0]!r}: "
            "a single class trains to loss 0 and predicts it everywhere. Give examples of "
            f"at least two classes (the task's labels: {list(task.labels)})"
        )


def describe(
    task: SentenceTask,
    features: dict[str, SentenceFeatures],
    config: ml_collections.ConfigDict,
    init_step: int | None,
    num_steps: int,
) -> dict:
    """What metrics.json says before the first epoch: the data, the encoder's checkpoint
    (`init_step`: the pretraining checkpoint step `init_from` gave) and the run's length."""
    return {
        "task": task.name,
        "init_from": config.init_from,
        "init_step": init_step,  # of a pretraining workdir: the checkpoint it read
        "from_scratch": config.from_scratch,
        "do_lower_case": config.do_lower_case,  # the encoder's, as load_task_model found it
        "num_examples": {s: len(f) for s, f in features.items()},
        "num_truncated": {s: f.num_truncated for s, f in features.items()},
        "max_seq_length": config.max_seq_length,
        "num_train_steps": num_steps,
        "epochs": [],
    }


def train_and_score(
    config: ml_collections.ConfigDict,
    workdir: str,
    task: SentenceTask,
    features: dict[str, SentenceFeatures],
    run,
    results: dict,
    *,
    show_progress: bool = True,
):
    """The epochs, each logged to train_log.jsonl; returns (final state, final logits).

    After every `eval_every_epochs`-th epoch and the last, the eval splits are scored and
    metrics.json (`results`, whose `epochs` list grows) is rewritten, but after the last
    epoch (the caller writes it once the model is saved: `finetune_common.final_save`). The
    last epoch's logits (split -> (N, C)), those of the final model, are returned for reuse.

    Args:
        run: `finetune_common.setup`'s: the mesh, the starting state and the jitted steps.
    """
    from bert_jax import finetune_common as common

    _, dropout_rng = common.run_keys(config)
    train = features["train"]
    train_arrays = {"input_ids": train.input_ids, "input_mask": train.input_mask,
                    "segment_ids": train.segment_ids, "labels": train.labels}  # fmt: skip
    state, final_logits = run.state, {}
    log_path = os.path.join(workdir, "train_log.jsonl")
    with open(log_path, "w", encoding="utf-8") as log_file:
        for epoch in range(1, config.num_epochs + 1):
            state, loss = common.train_epoch(
                run.train_step, state, dropout_rng, train_arrays, epoch=epoch, config=config,
                mesh=run.mesh, log_file=log_file, show_progress=show_progress,
            )  # fmt: skip
            epoch_result = {"epoch": epoch, "train_loss": loss}
            scored = epoch % config.eval_every_epochs == 0 or epoch == config.num_epochs
            for split in task.eval_splits if scored else ():
                logits = predict(run.predict_step, state.params, features[split],
                                 config.eval_batch_size, run.mesh, f"eval {split}",
                                 show_progress)  # fmt: skip
                epoch_result[split], _ = score(task, features[split].labels, logits)
                final_logits[split] = logits  # the last epoch's are the final model's
            logging.info("epoch %d: %s", epoch, epoch_result)
            results["epochs"].append(epoch_result)
            if epoch < config.num_epochs:  # the last is written once the model is saved
                common.write_json(os.path.join(workdir, "metrics.json"), results)
    return state, final_logits


def write_final_predictions(
    config: ml_collections.ConfigDict,
    workdir: str,
    task: SentenceTask,
    features: dict[str, SentenceFeatures],
    run,
    params,
    final_logits: dict[str, np.ndarray],
    results: dict,
    *,
    show_progress: bool = True,
) -> None:
    """The final model's predictions of every eval and test split.

    Each split is written to `predictions_<split>.tsv`; a labeled test split is scored into
    `results["test"]`, an unlabeled one with a GLUE submission file written there too.
    Splits scored after the last epoch reuse those logits (`final_logits`).
    """
    for split in (*task.eval_splits, *task.test_splits):
        examples, split_features = task.splits[split], features[split]
        logits = final_logits.get(split)
        if logits is None:
            logits = predict(run.predict_step, params, split_features,
                             config.eval_batch_size, run.mesh, f"predict {split}",
                             show_progress)  # fmt: skip
        if split_features.labels is not None:
            metrics, predictions = score(task, split_features.labels, logits)
            if split in task.test_splits:
                results.setdefault("test", {})[split] = metrics
        else:
            predictions = logits[:, 0] if task.labels is None else logits.argmax(-1)
        write_predictions(os.path.join(workdir, f"predictions_{split}.tsv"), task, examples,
                          logits, predictions)  # fmt: skip
        if split_features.labels is None and split in task.submission_files:
            os.makedirs(os.path.join(workdir, "submission"), exist_ok=True)
            path = os.path.join(workdir, "submission", task.submission_files[split])
            glue.write_submission(path, task.glue_task, [e.guid for e in examples], predictions)
            logging.info("wrote %s", path)


def save_model(
    config: ml_collections.ConfigDict,
    workdir: str,
    task: SentenceTask,
    bert_config: BertConfig,
    params,
    vocab_file: str,
    init_step: int | None,
) -> None:
    """The fine-tuned model in `<workdir>/checkpoint`, with what `load_classifier` needs."""
    from bert_jax import finetune_common as common

    meta = {"task": config.task, "labels": task.labels,
            "num_outputs": 1 if task.labels is None else len(task.labels),
            "pooling": config.pooling, "do_lower_case": config.do_lower_case,
            "max_seq_length": config.max_seq_length,
            "init_from": config.init_from, "init_step": init_step,
            "data_dir": config.data_dir}  # fmt: skip
    common.save_finetuned(os.path.join(workdir, "checkpoint"), bert_config, params,
                          vocab_file=vocab_file, metadata=meta)  # fmt: skip


main = finetune_main.make_main(finetune, "finetune_classification", saves_model=True)


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Fine-tuning config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Where metrics.json and predictions are written.")
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
