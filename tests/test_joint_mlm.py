"""Contrastive pretraining with a masked-LM term (`mlm_weight`, coCondenser's way; issue 81):
off it is the contrastive loss bit for bit; on, the positives are masked at BERT's rates with
draws of (seed, step, row), the loss is contrastive + weight x the MLM cross entropy of the
masked positions (checked against numpy), steps lower it, the saved model has no MLM head,
and a negative weight is refused by name."""

from __future__ import annotations

import json
import math
import os

os.environ.setdefault("USE_TF", "0")

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params

from bert_jax import config_bounds, convert, embeddings, embeddings_train, sharding
from bert_jax.config import ConfigError
from data_pipelines import crop_pairs
from data_pipelines.tokenization import load_tokenizer
from experiments import finetune_embeddings
from experiments.configs import embeddings_contrastive_pretraining as cpt

WORDS = (
    "river mill bridge grain farmers autumn violin maker harbour orchestra desert town "
    "well market traders dunes salt dates winter mountain pass castle hill guard"
).split()
QUIET = TINY.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(minilm_vocab(), do_lower_case=True)


def _documents(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [[" ".join(rng.choice(WORDS, rng.integers(3, 15))) + "."
             for _ in range(rng.integers(3, 10))] for _ in range(n)]  # fmt: skip


def _stream(tokenizer, predictions, batch=16, length=64):
    passages = crop_pairs.make_passages(_documents(), tokenizer, length - 2)
    rules = crop_pairs.PairRules(sentence_fraction=0.8, keep_sentence=1.0)
    return crop_pairs.PairStream(passages, tokenizer, rules, batch, 32, length, seed=3,
                                 mlm_predictions=predictions)  # fmt: skip


def _config(weight, **extra):
    config = cpt.get_config()
    config.corpus_files = "corpus.txt"
    config.global_batch_size, config.max_seq_length, config.query_max_seq_length = 16, 64, 32
    config.mlm_weight = weight
    for key, value in extra.items():
        config[key] = value
    return config


def test_masking_follows_berts_rates_and_draws_of_seed_step_row(tokenizer):
    stream = _stream(tokenizer, predictions=10)
    chosen = masked = randomised = kept = 0
    for step in range(60):
        batch = stream.batch(step)
        tokens, mask = batch["positive_tokens"], batch["positive_mask"]
        for r in range(len(tokens)):
            n = int(mask[r].sum())
            weights = batch["mlm_weights"][r]
            count = int(weights.sum())
            assert count == min(10, max(1, round(n * 0.15)))  # 15% of the row, as pretraining
            where = batch["mlm_positions"][r][:count]
            assert 0 < where.min() and where.max() < n - 1  # never [CLS] / [SEP] / padding
            np.testing.assert_array_equal(batch["mlm_ids"][r][:count], tokens[r][where])
            now = batch["mlm_tokens"][r][where]
            chosen += count
            masked += int((now == tokenizer.mask_id).sum())
            kept += int((now == tokens[r][where]).sum())
            randomised += int(((now != tokenizer.mask_id) & (now != tokens[r][where])).sum())
            others = np.setdiff1d(np.arange(tokens.shape[1]), where)
            np.testing.assert_array_equal(batch["mlm_tokens"][r][others], tokens[r][others])
    assert chosen > 3000
    for share, p in ((masked, 0.8), (kept, 0.1), (randomised, 0.1)):
        # A random draw can be its own token (1 in ~20k): within 4.5 binomial sigmas.
        assert abs(share / chosen - p) < 4.5 * math.sqrt(p * (1 - p) / chosen) + 1e-3
    # Each host's rows end to end are the one-host batch: row r's draws are its own.
    whole = stream.batch(7)
    halves = [_stream(tokenizer, 10).batch(7, slice(h * 8, h * 8 + 8)) for h in (0, 1)]
    for key in embeddings_train.MLM_KEYS:
        np.testing.assert_array_equal(whole[key], np.concatenate([h[key] for h in halves]))
    assert "mlm_tokens" not in _stream(tokenizer, predictions=0).batch(0)


def _setup(tokenizer, config, bert=QUIET):
    module = embeddings.BertForEmbedding(bert, "mean", False)
    ids = jnp.zeros((1, 8), jnp.int32)
    params = nn.unbox(module.init(jax.random.key(0), ids, ids, ids)["params"])
    stream = _stream(tokenizer, embeddings_train.mlm_predictions(config))
    batch = {k: jnp.asarray(v) for k, v in stream.batch(0).items()}
    return module, params, batch


def test_weight_zero_is_the_contrastive_loss_bit_for_bit(tokenizer):
    config = _config(0.0)
    module, params, batch = _setup(tokenizer, config, TINY)
    trained = module.clone(normalize=False)

    def embed(p, ids, mask, rng):
        return trained.apply({"params": p}, ids, mask, jnp.zeros_like(ids), deterministic=False,
                             rngs={"dropout": rng})  # fmt: skip

    rng = jax.random.key(5)
    before, _ = embeddings.contrastive_loss(embed, params, batch, rng, scale=config.scale,
                                            chunk_size=config.chunk_size)  # fmt: skip
    without = _config(0.0)
    del without.mlm_weight  # a config written before the key
    for c in (config, without):
        loss, metrics = embeddings_train.loss_fn(c, module, None)(params, batch, rng)
        assert np.asarray(loss).tobytes() == np.asarray(before).tobytes()
        assert "mlm_loss" not in metrics
    assert "mlm_tokens" not in batch


def _numpy_mlm(head, table, states, batch):
    """BertForMaskedLM's head (dense, exact GELU, LayerNorm 1e-12, tied decoder + bias) and
    its cross entropy averaged over the masked positions, in float64 numpy."""
    erf = np.vectorize(math.erf)
    pos = np.asarray(batch["mlm_positions"])
    h = np.take_along_axis(np.asarray(states, np.float64), pos[..., None], axis=1)
    h = h @ np.asarray(head["transform"]["kernel"], np.float64) + head["transform"]["bias"]
    h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-12)
    h = h * head["layer_norm"]["scale"] + head["layer_norm"]["bias"]
    logits = h @ np.asarray(table, np.float64).T + head["output_bias"]
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, np.asarray(batch["mlm_ids"])[..., None], -1)[..., 0]
    w = np.asarray(batch["mlm_weights"], np.float64)
    return (nll * w).sum() / w.sum()


def test_the_loss_is_contrastive_plus_weight_times_masked_lm(tokenizer):
    config = _config(0.5)
    module, params, batch = _setup(tokenizer, config)
    params = {**params, "mlm": embeddings_train.mlm_head_params(config, QUIET)}
    rng = jax.random.key(5)
    loss, metrics = embeddings_train.loss_fn(config, module, None)(params, batch, rng)
    contrastive, _ = embeddings_train.loss_fn(_config(0.0), module, None)(
        {"bert": params["bert"]}, batch, rng
    )
    encoder = embeddings_train.mlm_module(module)
    states = encoder.apply({"params": params}, batch["mlm_tokens"], batch["positive_mask"],
                           jnp.zeros_like(batch["mlm_tokens"]),
                           method=encoder.encode).sequence_output  # fmt: skip
    table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    expected = _numpy_mlm(jax.device_get(params["mlm"]), table, states, batch)
    np.testing.assert_allclose(float(metrics["mlm_loss"]), expected, rtol=2e-4)
    np.testing.assert_allclose(float(metrics["contrastive_loss"]), float(contrastive), rtol=1e-6)
    np.testing.assert_allclose(float(loss), float(contrastive) + 0.5 * expected, rtol=2e-4)
    assert 0 <= float(metrics["mlm_accuracy"]) <= 1


def test_steps_lower_the_masked_lm_loss(tokenizer):
    config = _config(1.0, learning_rate=3e-3, num_train_steps=12, warmup_proportion=0.0,
                     mesh_shape=(-1, 1, 1))  # fmt: skip
    module, params, batch = _setup(tokenizer, config)
    mesh = sharding.create_mesh(config.mesh_shape)
    step = embeddings_train.make_train_step(config, module, mesh, params=params)
    assert set(step.state.params) == {"bert", "mlm"}
    state, rng, losses = step.state, jax.random.key(1), []
    with sharding.activation_context(mesh):
        for _ in range(12):
            placed = sharding.global_batch(jax.device_get(batch), mesh)
            state, metrics = step.step(state, placed, rng)
            losses.append(float(metrics["mlm_loss"]))
    assert losses[-1] < losses[0] - 0.5, losses


def test_a_run_logs_the_mlm_loss_and_saves_no_head(tmp_path):
    hf = tmp_path / "hf"
    convert.save_hf(hf, TINY, pretrained_params(), vocab_file=minilm_vocab(), do_lower_case=True)
    lines = []
    for d in range(24):
        lines += [" ".join(np.random.default_rng(d).choice(WORDS, 12)) + "." for _ in range(4)]
        lines.append("")
    (tmp_path / "corpus.txt").write_text("\n".join(lines), encoding="utf-8")
    config = _config(1.0, init_from=str(hf), corpus_files=str(tmp_path / "corpus.txt"),
                     global_batch_size=8, chunk_size=4, num_train_steps=4, max_seq_length=16,
                     query_max_seq_length=16, log_every=2, checkpoint_every=0,
                     passages_per_document=2)  # fmt: skip
    config_bounds.check(config, "finetune", devices=8)
    # The head starts as init_from's (a pretraining model's); from scratch, fresh.
    head = embeddings_train.pretrained_mlm_head(config, TINY)
    np.testing.assert_allclose(head["output_bias"], pretrained_params()["mlm"]["output_bias"])
    assert embeddings_train.pretrained_mlm_head(_config(1.0, from_scratch=True), TINY) is None
    finetune_embeddings.run(config, str(tmp_path / "run"))
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert {"loss", "contrastive_loss", "mlm_loss", "mlm_accuracy"} <= set(log[-1])
    model = embeddings.load_embedding_model(str(tmp_path / "run"))
    assert set(model.params) == {"bert"}


def test_a_negative_weight_is_refused_by_name():
    config = _config(-0.5)
    with pytest.raises(ConfigError, match=r"--config.mlm_weight=-0.5"):
        config_bounds.check(config, "finetune", devices=8)
    with pytest.raises(ConfigError, match=r"--config.mlm_weight=-0.5"):
        embeddings_train.mlm_weight(config)
