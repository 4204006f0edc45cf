r"""Fine-tunes a pretrained BERT on SQuAD v1.1 or v2.0 (extractive question answering).

  python -m experiments.finetune_squad --config=experiments/configs/finetune_squad.py:v1.1 \
      --config.train_file=squad/train-v1.1.json --config.predict_file=squad/dev-v1.1.json \
      --config.init_from=uncased_L-12_H-768_A-12 --workdir=workdirs/squad11

The encoder comes from `config.init_from` (see experiments/finetune_classification.py);
a fresh layer scores every piece as an answer start and end. Documents longer than
`max_seq_length` are read in windows `doc_stride` apart; answers are decoded from the
n-best spans (`data_pipelines.tasks.squad_predictions`) and scored with the official
evaluation's exact match and F1 after every epoch (v2.0 also with the best null threshold).

Writes to --workdir: `predictions.json` (question id -> answer, the official evaluation's
input), `nbest_predictions.json`, for v2.0 `null_odds.json`, `metrics.json` and
`train_log.jsonl`.
"""

from __future__ import annotations

import dataclasses
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
from data_pipelines.tasks import squad
from data_pipelines.tasks.squad_predictions import postprocess
from experiments import finetune_main

# JAX, Optax and the model are imported where they are used: `-h` answers without them.
if TYPE_CHECKING:
    import jax

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


def loss_fn(start_logits, end_logits, start_positions, end_positions) -> jax.Array:
    """The original's loss: the mean of the start and end cross-entropies."""
    import jax.numpy as jnp
    import optax

    start = optax.softmax_cross_entropy_with_integer_labels(start_logits, start_positions)
    end = optax.softmax_cross_entropy_with_integer_labels(end_logits, end_positions)
    return jnp.mean(start + end) / 2


def train_loss(params, batch, dropout_rng, *, model):
    """(loss, metrics) of one batch under dropout: what the train step differentiates."""
    import jax.numpy as jnp

    start, end = model.apply(
        {"params": params},
        *(batch[k] for k in INPUT_KEYS),
        deterministic=False,
        rngs={"dropout": dropout_rng},
    )  # (B, T) each
    return loss_fn(start.astype(jnp.float32), end.astype(jnp.float32),
                   batch["start_positions"], batch["end_positions"]), {}  # fmt: skip


def predict_step(params, batch, *, model):
    import jax.numpy as jnp

    start, end = model.apply({"params": params}, *(batch[k] for k in INPUT_KEYS))
    return start.astype(jnp.float32), end.astype(jnp.float32)


def predict(predict_fn, params, features: squad.SquadFeatures, batch_size, mesh):
    """(F, T) start and end logits of every window."""
    from bert_jax import finetune_common as common
    from bert_jax import sharding

    arrays = {k: getattr(features, k) for k in INPUT_KEYS}
    lengths = features.input_mask.sum(1)
    shape = features.input_ids.shape
    starts = np.full(shape, -1e9, np.float32)  # padding never wins
    ends = np.full(shape, -1e9, np.float32)
    batches = common.eval_batches(lengths, batch_size)
    total = common.num_batches(len(features), batch_size)
    for indices, real in tqdm(batches, total=total, desc="predict", leave=False):
        length = common.pad_length(lengths[indices], shape[1])
        batch = sharding.global_batch(common.take(arrays, indices, length), mesh)
        start, end = (np.asarray(x) for x in predict_fn(params, batch))
        starts[indices[:real], :length] = start[:real]
        ends[indices[:real], :length] = end[:real]
    return starts, ends


def write_predictions(workdir, predictions, version_2: bool) -> None:
    from bert_jax import finetune_common as common

    common.write_json(os.path.join(workdir, "predictions.json"), predictions.answers)
    nbest = {q: [dataclasses.asdict(c) for c in cands] for q, cands in predictions.nbest.items()}
    common.write_json(os.path.join(workdir, "nbest_predictions.json"), nbest)
    if version_2:
        common.write_json(os.path.join(workdir, "null_odds.json"), predictions.null_score_diff)


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs the whole fine-tuning described by `config`; returns what metrics.json holds."""
    from bert_jax import finetune_common as common
    from bert_jax import sharding
    from bert_jax.heads import BertForQuestionAnswering

    start_time = time.time()
    os.makedirs(workdir, exist_ok=True)
    version_2 = config.version == "v2.0"

    def read(path, is_training):
        if config.data_source == "tfds":
            return squad.read_tfds(path, version=config.version, is_training=is_training)
        return squad.read_squad(path, is_training=is_training,
                                skip_mismatched=config.skip_mismatched,
                                realign_mismatched=config.realign_mismatched)  # fmt: skip

    train_examples = read(config.train_file, True)
    eval_examples = read(config.predict_file, False)
    if config.max_train_examples:
        train_examples = train_examples[: config.max_train_examples]
    model, _, params, tokenizer, _, init_step = common.load_task_model(
        config, BertForQuestionAnswering(BertConfig())
    )
    _, dropout_rng = common.run_keys(config)
    windows = dict(max_seq_length=config.max_seq_length, doc_stride=config.doc_stride,
                   max_query_length=config.max_query_length)  # fmt: skip
    train = squad.encode_squad(train_examples, tokenizer, is_training=True, **windows)
    evaluation = squad.encode_squad(eval_examples, tokenizer, is_training=False, **windows)

    train_keys = (*INPUT_KEYS, "start_positions", "end_positions")
    run = common.setup(
        config, model, params, len(train), functools.partial(train_loss, model=model),
        train_keys, functools.partial(predict_step, model=model), INPUT_KEYS,
        what="training windows",
    )  # fmt: skip
    del params
    mesh, state, num_steps = run.mesh, run.state, run.num_steps
    step_fn, predict_fn = run.train_step, run.predict_step
    train_arrays = {k: getattr(train, k) for k in train_keys}
    gold = {e.qas_id: list(e.gold_answers) for e in eval_examples}

    def evaluate():
        starts, ends = predict(predict_fn, state.params, evaluation, config.eval_batch_size, mesh)
        predictions = postprocess(
            eval_examples, evaluation, starts, ends, n_best_size=config.n_best_size,
            max_answer_length=config.max_answer_length, do_lower_case=config.do_lower_case,
            version_2_with_negative=version_2,
            null_score_diff_threshold=config.null_score_diff_threshold,
            pieces_text=tokenizer.pieces_text,
        )  # fmt: skip
        scores = scoring.squad_scores(
            gold, predictions.answers, version="2.0" if version_2 else "1.1",
            null_scores=predictions.null_score_diff if version_2 else None,
            null_threshold=config.null_score_diff_threshold,
        )  # fmt: skip
        return scores, predictions

    results = {
        "version": config.version,
        "init_from": config.init_from,
        "init_step": init_step,  # of a pretraining workdir: the checkpoint it read
        "do_lower_case": config.do_lower_case,  # the encoder's, as load_task_model found it
        "num_examples": {"train": len(train_examples), "eval": len(eval_examples)},
        "num_windows": {"train": len(train), "eval": len(evaluation)},
        "num_split_over_windows": {"train": train.num_split, "eval": evaluation.num_split},
        "num_query_truncated": {
            "train": train.num_query_truncated,
            "eval": evaluation.num_query_truncated,
        },  # fmt: skip
        "num_train_steps": num_steps,
        "epochs": [],
    }
    log_path = os.path.join(workdir, "train_log.jsonl")
    with sharding.activation_context(mesh), open(log_path, "w", encoding="utf-8") as log_file:
        for epoch in range(1, config.num_epochs + 1):
            state, loss = common.train_epoch(
                step_fn, state, dropout_rng, train_arrays, epoch=epoch, config=config, mesh=mesh,
                log_file=log_file,
            )  # fmt: skip
            scores, predictions = evaluate()
            results["epochs"].append({"epoch": epoch, "train_loss": loss, "eval": scores})
            logging.info("epoch %d: EM %.2f F1 %.2f", epoch, scores["exact"], scores["f1"])
            write_predictions(workdir, predictions, version_2)
            common.write_json(os.path.join(workdir, "metrics.json"), results)
    results["wall_time_s"] = time.time() - start_time
    common.write_json(os.path.join(workdir, "metrics.json"), results)
    return results


main = finetune_main.make_main(finetune, "finetune_squad")


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Fine-tuning config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Where predictions.json and metrics.json are written.")
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
