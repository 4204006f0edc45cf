r"""The feature-based approach to NER (BERT paper, section 5.3, Table 7): a frozen encoder.

  python -m experiments.feature_based_tagging \
      --config=experiments/configs/feature_based_tweet_ner.py --config.layers=last \
      --workdir=workdirs/features_tweet_ner_last

The encoder from `config.init_from` is run once over every sentence, deterministically (no
dropout), and its hidden states are combined as `config.layers` says (`embeddings last
second_to_last sum_last_4 concat_last_4 sum_all scalar_mix`: `bert_jax.feature_based`). A
randomly initialised two-layer BiLSTM with a linear tag layer (`BiLSTMTagger`) learns from
those cached features; the encoder is no part of the train state, so it never changes.

Tagging and scoring are fine-tuning's (`experiments/finetune_tagging.py`): each word's tag
is learned and predicted at its first word piece, entity-level P/R/F1 as conlleval counts
them. Dev and test are scored after every epoch; at the end both are written in conlleval's
input layout (`word gold predicted`).

Writes to --workdir: `metrics.json` (per-epoch and final scores, the combination, the
learned scalar-mix weights, timings), `train_log.jsonl`, `predictions_<split>.txt`.
"""

from __future__ import annotations

import functools
import os
import time
from typing import TYPE_CHECKING

import ml_collections
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import config_bounds
from bert_jax.config import BertConfig
from data_pipelines import cli
from experiments import finetune_tagging as ftt

# JAX and the models are imported where they are used: `-h` answers without them.
if TYPE_CHECKING:
    from bert_jax.feature_based import BiLSTMTagger, FeatureCache

TRAIN_KEYS = ("features", "input_mask", "label_ids", "label_weights")
INPUT_KEYS = ("features", "input_mask")


def train_loss(params, batch, dropout_rng, *, model: BiLSTMTagger):
    """(loss, metrics) of one batch under dropout; only the tagger's params are `params`."""
    logits = model.apply(
        {"params": params},
        batch["features"],
        batch["input_mask"],
        deterministic=False,
        rngs={"dropout": dropout_rng},
    )  # (B, T, C)
    return ftt.loss_fn(logits, batch["label_ids"], batch["label_weights"]), {}


def predict_step(params, batch, *, model: BiLSTMTagger):
    import jax.numpy as jnp

    logits = model.apply({"params": params}, batch["features"], batch["input_mask"])
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)  # (B, T)


def take_features(cache: FeatureCache, arrays: dict[str, np.ndarray], indices, length: int):
    """Rows `indices` of `arrays` cut to `length`, with their cached features padded to it."""
    from bert_jax import finetune_common as common

    return common.take(arrays, indices, length) | {"features": cache.padded(indices, length)}


def make_tagger(config: ml_collections.ConfigDict, num_tags: int) -> BiLSTMTagger:
    from bert_jax.feature_based import BiLSTMTagger

    return BiLSTMTagger(
        num_tags,
        lstm_size=config.lstm_size,
        dropout_rate=config.dropout_rate,
        scalar_mix=config.layers == "scalar_mix",
    )


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs the whole feature-based training described by `config`; returns metrics.json."""
    import jax
    import jax.numpy as jnp

    from bert_jax import feature_based
    from bert_jax import finetune_common as common
    from bert_jax.model import BertModel

    start_time = time.time()
    os.makedirs(workdir, exist_ok=True)
    feature_based.check_combination(config.layers)  # an unknown name fails before loading
    task = ftt.load_task(config)
    encoder, bert_config, encoder_params, tokenizer, _, init_step = common.load_task_model(
        config, BertModel(BertConfig(), add_pooling_layer=False)
    )
    feature_based.check_combination(config.layers, bert_config.num_hidden_layers)
    init_rng, dropout_rng = common.run_keys(config)
    tagger_rng = jax.random.fold_in(init_rng, 1)  # init_rng itself: a from_scratch encoder
    features = ftt.encode_splits(task, tokenizer, config.max_seq_length)

    caches, feature_time = cache_features(config, encoder, encoder_params, features)
    del encoder_params  # dropped before training starts
    feature_shape = caches["train"].feature_shape
    cache_mb = sum(c.values.nbytes for c in caches.values()) / 2**20
    logging.info("features %s %s: %.0f MiB for %d tokens, %.0f s", config.layers,
                 feature_shape, cache_mb, sum(len(c.values) for c in caches.values()),
                 feature_time)  # fmt: skip

    tagger = make_tagger(config, len(task.tags))
    sample = (jnp.zeros((1, 2, *feature_shape), jnp.float32), jnp.ones((1, 2), jnp.int32))
    params = jax.jit(tagger.init)(tagger_rng, *sample)["params"]
    run = common.setup(
        config, tagger, params, len(features["train"]),
        functools.partial(train_loss, model=tagger), TRAIN_KEYS,
        functools.partial(predict_step, model=tagger), INPUT_KEYS, sample_inputs=sample,
    )  # fmt: skip
    del params
    train = features["train"]
    train_arrays = {k: getattr(train, k) for k in ("input_mask", "label_ids", "label_weights")}

    def train_epoch(state, epoch, log_file):
        return common.train_epoch(
            run.train_step, state, dropout_rng, train_arrays, epoch=epoch, config=config,
            mesh=run.mesh, log_file=log_file,
            take_fn=functools.partial(take_features, caches["train"]),
        )  # fmt: skip

    def evaluate(params, split):
        predicted = ftt.predict(
            run.predict_step, params, {"input_mask": features[split].input_mask},
            config.eval_batch_size, run.mesh, f"eval {split}",
            take_fn=functools.partial(take_features, caches[split]),
        )  # fmt: skip
        return ftt.score(task, split, features[split], predicted)

    def mix_weights(params):
        mix = feature_based.scalar_mix_weights(params)
        return {"scalar_mix": mix} if mix else {}

    num_params = sum(x.size for x in jax.tree.leaves(run.state.params))
    results = ftt.describe(task, features, config, init_step) | {
        "from_scratch": config.from_scratch,
        "layers": config.layers,
        "encoder": {
            "num_hidden_layers": bert_config.num_hidden_layers,
            "hidden_size": bert_config.hidden_size,
        },
        "feature_shape": list(feature_shape),
        "feature_cache_mib": cache_mb,
        "feature_time_s": feature_time,
        "lstm_size": config.lstm_size,
        "num_tagger_params": num_params,
        "num_train_steps": run.num_steps,
    }
    logging.info("%s: %d train sentences, %d tags, %d tagger params, %d steps of %d", task.name,
                 len(train), len(task.tags), num_params, run.num_steps,
                 config.train_batch_size)  # fmt: skip
    state = ftt.train_and_score(
        config, workdir, task, results, run.state, mesh=run.mesh, train_epoch=train_epoch,
        evaluate=evaluate, epoch_splits=("dev", "test"), epoch_extras=mix_weights,
    )  # fmt: skip
    results |= mix_weights(state.params)
    results["wall_time_s"] = time.time() - start_time
    common.write_json(os.path.join(workdir, "metrics.json"), results)
    return results


def cache_features(
    config: ml_collections.ConfigDict, encoder, encoder_params, features: dict
) -> tuple[dict[str, FeatureCache], float]:
    """The frozen encoder's features of every split, computed once and deterministically
    (`config.layers` combines its hidden states); returns them and the seconds they took."""
    from bert_jax import feature_based, sharding

    feature_start = time.time()
    mesh = sharding.create_mesh(config.mesh_shape)
    caches = {
        split: feature_based.compute_features(
            encoder,
            encoder_params,
            {k: getattr(f, k) for k in ftt.INPUT_KEYS},
            config.layers,
            batch_size=config.eval_batch_size,
            mesh=mesh,
            desc=f"features {split}",
        )
        for split, f in features.items()
    }
    return caches, time.time() - feature_start


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax

    # Every key in its range, the batches over the devices: one line, before any data is read.
    config_bounds.check_or_exit(
        flags.FLAGS.config, "finetune", "feature_based_tagging", devices=jax.device_count()
    )
    finetune(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Feature-based config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Where metrics.json and predictions are written.")
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
