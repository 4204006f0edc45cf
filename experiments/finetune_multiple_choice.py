r"""Fine-tunes a pretrained BERT on multiple choice, in the paper's SWAG shape.

  python -m experiments.finetune_multiple_choice \
      --config=experiments/configs/finetune_minilm_multiple_choice.py --workdir=workdirs/mc

Every choice of an example is one sequence, `[CLS] context [SEP] ending [SEP]`; the model
(`heads.BertForMultipleChoice`: the encoder from `config.init_from`, a new one-output layer
on the pooled [CLS]) scores each, and the loss is the cross-entropy of the softmax over an
example's choices (BERT paper, section 4.4). The recipe is the original fine-tuning one
(BERT AdamW, linear warmup and decay, `config.num_epochs`). After every
`eval_every_epochs` epochs the dev split is scored; at the end the test split. The task
(`data_pipelines.tasks.multiple_choice`: `goal_step_wikihow`, 4 choices) gives the chance
level, 1/choices, written beside the accuracies.

Writes to --workdir: `metrics.json` (per-epoch dev accuracy, test accuracy, chance,
example and truncation counts, wall time), `train_log.jsonl`, `predictions_<split>.tsv`
(each example's chosen ending and the softmax over its choices) and the fine-tuned model in
`checkpoint/`.
"""

from __future__ import annotations

import csv
import functools
import os
import time

import ml_collections
import numpy as np
from absl import flags, logging
from ml_collections import config_flags
from tqdm import tqdm

from bert_jax import scoring
from bert_jax.config import BertConfig
from data_pipelines import cli
from data_pipelines.tasks.multiple_choice import (
    ChoiceFeatures,
    encode_choices,
    load_multiple_choice_task,
)
from experiments import finetune_main

# JAX, Optax and the model are imported where they are used: `-h` answers without them.

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


def train_loss(params, batch, dropout_rng, *, model):
    """Mean cross-entropy of the softmax over each example's choices, under dropout."""
    import jax.numpy as jnp
    import optax

    logits = model.apply(
        {"params": params},
        *(batch[k] for k in INPUT_KEYS),
        deterministic=False,
        rngs={"dropout": dropout_rng},
    )  # (B, K)
    losses = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), batch["labels"]
    )
    return jnp.mean(losses), {}


def predict_step(params, batch, *, model):
    import jax.numpy as jnp

    return model.apply({"params": params}, *(batch[k] for k in INPUT_KEYS)).astype(jnp.float32)


def predict(predict_fn, params, features: ChoiceFeatures, batch_size: int, mesh, desc: str,
            show_progress: bool = True) -> np.ndarray:  # fmt: skip
    """(N, K) choice scores for every example, in order (batched by length, padding cut)."""
    from bert_jax import finetune_common as common
    from bert_jax import sharding

    arrays = {k: getattr(features, k) for k in INPUT_KEYS}
    lengths = common.sequence_lengths(features.input_mask)
    out = np.zeros(features.input_ids.shape[:2], np.float32)
    batches = common.eval_batches(lengths, batch_size)
    total = common.num_batches(len(features), batch_size)
    for indices, real in tqdm(batches, total=total, desc=desc, leave=False,
                              disable=not show_progress):  # fmt: skip
        length = common.pad_length(lengths[indices], features.input_ids.shape[-1])
        batch = sharding.global_batch(common.take(arrays, indices, length), mesh)
        out[indices[:real]] = np.asarray(predict_fn(params, batch))[:real]
    return out


def write_predictions(path: str, examples, logits: np.ndarray) -> None:
    import jax

    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    with open(path + ".tmp", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["guid", "label", "prediction", "chosen_ending", "probabilities"])
        for example, p in zip(examples, probs, strict=True):
            choice = int(p.argmax())
            writer.writerow([example.guid, example.label, choice, example.endings[choice],
                             " ".join(f"{x:.6f}" for x in p)])  # fmt: skip
    os.replace(path + ".tmp", path)


def finetune(
    config: ml_collections.ConfigDict, workdir: str, *, show_progress: bool = True
) -> dict:
    """Runs the whole fine-tuning described by `config`; returns what metrics.json holds."""
    from bert_jax import finetune_common as common
    from bert_jax import sharding
    from bert_jax.heads import BertForMultipleChoice

    start_time = time.time()
    os.makedirs(workdir, exist_ok=True)
    task = load_multiple_choice_task(config.task, config.data_file or None)
    if config.max_train_examples:
        train = task.splits["train"]
        chosen = np.random.default_rng(config.seed).permutation(len(train))
        task.splits["train"] = [train[i] for i in np.sort(chosen[: config.max_train_examples])]
    model, bert_config, params, tokenizer, vocab_file, init_step = common.load_task_model(
        config, BertForMultipleChoice(BertConfig())
    )
    _, dropout_rng = common.run_keys(config)
    features = {
        split: encode_choices(
            examples, tokenizer, config.max_seq_length, name=f"{task.name} {split}"
        )  # fmt: skip
        for split, examples in task.splits.items()
    }
    train = features["train"]
    run = common.setup(
        config, model, params, len(train),
        functools.partial(train_loss, model=model), (*INPUT_KEYS, "labels"),
        functools.partial(predict_step, model=model), INPUT_KEYS,
    )  # fmt: skip
    del params
    mesh, state, num_steps = run.mesh, run.state, run.num_steps
    train_arrays = {k: getattr(train, k) for k in (*INPUT_KEYS, "labels")}
    results = {
        "task": task.name,
        "init_from": config.init_from,
        "init_step": init_step,  # of a pretraining workdir: the checkpoint it read
        "from_scratch": config.from_scratch,
        "num_choices": task.num_choices,
        "chance_accuracy": 1 / task.num_choices,
        "num_examples": {s: len(f) for s, f in features.items()},
        "num_truncated": {s: f.num_truncated for s, f in features.items()},
        "max_seq_length": config.max_seq_length,
        "num_train_steps": num_steps,
        "epochs": [],
    }
    logging.info("%s: %d train examples of %d choices, %d steps of %d; model %s", task.name,
                 len(train), task.num_choices, num_steps, config.train_batch_size,
                 bert_config)  # fmt: skip
    logits = {}
    with (
        sharding.activation_context(mesh),
        open(os.path.join(workdir, "train_log.jsonl"), "w", encoding="utf-8") as log_file,
    ):
        for epoch in range(1, config.num_epochs + 1):
            state, loss = common.train_epoch(
                run.train_step, state, dropout_rng, train_arrays, epoch=epoch, config=config,
                mesh=mesh, log_file=log_file, show_progress=show_progress,
            )  # fmt: skip
            record = {"epoch": epoch, "train_loss": loss}
            if epoch % config.eval_every_epochs == 0 or epoch == config.num_epochs:
                logits["dev"] = predict(run.predict_step, state.params, features["dev"],
                                        config.eval_batch_size, mesh, "eval dev",
                                        show_progress)  # fmt: skip
                record["dev"] = {"accuracy": accuracy(features["dev"], logits["dev"])}
            logging.info("epoch %d: %s", epoch, record)
            results["epochs"].append(record)
            if epoch < config.num_epochs:  # the last is written once the model is saved
                common.write_json(os.path.join(workdir, "metrics.json"), results)
        logits["test"] = predict(run.predict_step, state.params, features["test"],
                                 config.eval_batch_size, mesh, "predict test",
                                 show_progress)  # fmt: skip
    results["test"] = {"accuracy": accuracy(features["test"], logits["test"])}
    for split in ("dev", "test"):
        write_predictions(os.path.join(workdir, f"predictions_{split}.tsv"), task.splits[split],
                          logits[split])  # fmt: skip
    meta = {"task": config.task, "num_choices": task.num_choices,
            "do_lower_case": config.do_lower_case, "max_seq_length": config.max_seq_length,
            "init_from": config.init_from, "init_step": init_step}  # fmt: skip
    # metrics.json's final form only once the model is saved; a signal lets both complete.
    with common.final_save(f"{workdir}/checkpoint and metrics.json"):
        common.save_finetuned(os.path.join(workdir, "checkpoint"), bert_config, state.params,
                              vocab_file=vocab_file, metadata=meta)  # fmt: skip
        results["wall_time_s"] = time.time() - start_time
        common.write_json(os.path.join(workdir, "metrics.json"), results)
    logging.info("test accuracy %.4f (chance %.4f)", results["test"]["accuracy"],
                 results["chance_accuracy"])  # fmt: skip
    return results


def accuracy(features: ChoiceFeatures, logits: np.ndarray) -> float:
    return scoring.accuracy(features.labels, logits.argmax(-1))


main = finetune_main.make_main(finetune, "finetune_multiple_choice", saves_model=True)


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Fine-tuning config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Where metrics.json and predictions are written.")
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
