"""Feature-based tagging (BERT paper, Table 7): the layer combinations against their
definitions, ELMo's scalar mix, a frozen encoder, a BiLSTM blind to padding, a few steps,
and the script end to end on the CoNLL fixtures."""

import functools
import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab

from bert_jax import convert, sharding
from bert_jax import feature_based as fb
from bert_jax import finetune_common as common
from bert_jax.model import BertModel
from experiments import feature_based_tagging as fbt
from experiments.configs import feature_based_tweet_ner

CONLL_DIR = Path(__file__).parent / "fixtures" / "tasks" / "conll"
DEEP = TINY.replace(num_hidden_layers=5)  # more than 4 layers: last-4 differs from all
LENGTHS = np.array([16, 3, 9, 12, 5, 16, 7, 2, 11, 4])


@pytest.fixture(scope="module")
def encoder():
    """(model, params, inputs, hidden states of the whole padded batch as numpy)."""
    model = BertModel(DEEP, add_pooling_layer=False)
    rng = np.random.default_rng(0)
    n, t = len(LENGTHS), 16
    mask = (np.arange(t)[None] < LENGTHS[:, None]).astype(np.int32)
    inputs = {
        "input_ids": (rng.integers(1000, 3000, (n, t)) * mask).astype(np.int32),
        "input_mask": mask,
        "segment_ids": np.zeros((n, t), np.int32),
    }
    args = [inputs[k] for k in ("input_ids", "input_mask", "segment_ids")]
    params = jax.jit(lambda r: nn.unbox(model.init(r, *args)["params"]))(jax.random.key(3))
    params = jax.tree.map(np.asarray, params)
    out = jax.jit(lambda p: model.apply({"params": p}, *args, output_hidden_states=True))(params)
    hidden = [np.asarray(h) for h in out.hidden_states]
    assert len(hidden) == DEEP.num_hidden_layers + 1
    return model, params, inputs, hidden


def _definition(hidden: list[np.ndarray], combination: str) -> np.ndarray:
    """The paper's rows, written out layer by layer from the hidden states."""
    e, layers = hidden[0], hidden[1:]
    n = len(layers)
    return {
        "embeddings": e,
        "last": layers[n - 1],
        "second_to_last": layers[n - 2],
        "sum_last_4": layers[n - 4] + layers[n - 3] + layers[n - 2] + layers[n - 1],
        "concat_last_4": np.concatenate(
            [layers[n - 4], layers[n - 3], layers[n - 2], layers[n - 1]], axis=-1
        ),
        "sum_all": functools.reduce(np.add, layers),
        "scalar_mix": np.stack([e, *layers], axis=2),
    }[combination]


@pytest.mark.parametrize("combination", fb.COMBINATIONS)
def test_each_combination_is_its_definition(encoder, combination):
    _, _, _, hidden = encoder
    got = np.asarray(fb.frozen_features([jnp.asarray(h) for h in hidden], combination))
    want = _definition(hidden, combination)
    n, t, h = hidden[0].shape
    shapes = {"concat_last_4": (n, t, 4 * h), "scalar_mix": (n, t, 6, h)}
    assert got.shape == want.shape == shapes.get(combination, (n, t, h))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_combinations_differ(encoder):
    # Otherwise the test above could not tell them apart.
    _, _, _, hidden = encoder
    wider = ("concat_last_4", "scalar_mix")
    fixed = [_definition(hidden, c) for c in fb.COMBINATIONS if c not in wider]
    for i in range(len(fixed)):
        for j in range(i):
            assert not np.allclose(fixed[i], fixed[j], atol=1e-3)


@pytest.fixture(scope="module")
def cache(encoder):
    """The scalar-mix features (every layer) of the encoder fixture's examples."""
    model, params, inputs, _ = encoder
    mesh = sharding.create_mesh((-1, 1, 1))  # 8 devices: batches split over them
    return fb.compute_features(model, params, inputs, "scalar_mix", batch_size=8, mesh=mesh)


def test_the_cache_holds_each_examples_real_tokens(encoder, cache):
    # Sorted by length into 2 batches of 8, the last filled up: back in input order here.
    want = _definition(encoder[3], "scalar_mix")
    np.testing.assert_array_equal(cache.lengths, LENGTHS)
    assert cache.values.shape == (LENGTHS.sum(), *want.shape[2:])
    for i, n in enumerate(LENGTHS):
        got = cache.values[cache.offsets[i] : cache.offsets[i + 1]]
        np.testing.assert_allclose(got, want[i, :n], rtol=1e-5, atol=1e-5)
    batch = cache.padded(np.array([1, 0, 4]), 8)  # lengths 3, 16 (cut to 8), 5
    assert batch.shape == (3, 8, *want.shape[2:])
    np.testing.assert_array_equal(batch[0, :3], cache.values[cache.offsets[1] : cache.offsets[2]])
    assert not batch[0, 3:].any() and not batch[2, 5:].any()
    np.testing.assert_array_equal(batch[1], cache.values[:8])


def test_unknown_or_too_deep_combinations_are_refused():
    with pytest.raises(ValueError, match=r"config.layers='last_4'.*expected one of"):
        fb.check_combination("last_4")
    with pytest.raises(ValueError, match="'sum_last_4' needs 4 encoder layers; the encoder has 2"):
        fb.check_combination("sum_last_4", 2)
    fb.check_combination("second_to_last", 2)


def test_scalar_mix_is_a_softmax_times_gamma():
    rng = np.random.default_rng(1)
    layers = rng.normal(size=(2, 5, 4, 8)).astype(np.float32)  # (B, T, K, H)
    logits = rng.normal(size=4).astype(np.float32)
    params = {"layer_logits": jnp.asarray(logits), "gamma": jnp.asarray(1.7)}
    mixed = np.asarray(fb.ScalarMix().apply({"params": params}, layers))
    weights = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(mixed, 1.7 * np.einsum("btkh,k->bth", layers, weights), rtol=1e-5)
    summary = fb.scalar_mix_weights({"scalar_mix": params, "tags": {}})
    assert all(w > 0 for w in summary["weights"])
    assert sum(summary["weights"]) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(summary["weights"], weights, rtol=1e-5)
    assert summary["gamma"] == pytest.approx(1.7)
    # Fresh: equal logits, so the mix is gamma times the mean of the layers.
    fresh = fb.ScalarMix().init(jax.random.key(0), layers)["params"]
    np.testing.assert_array_equal(fresh["layer_logits"], np.zeros(4))
    equal = {"layer_logits": jnp.full(4, 0.3), "gamma": jnp.asarray(2.5)}
    mixed = np.asarray(fb.ScalarMix().apply({"params": equal}, layers))
    np.testing.assert_allclose(mixed, 2.5 * layers.mean(axis=2), rtol=1e-5, atol=1e-6)
    assert fb.scalar_mix_weights({"tags": {}}) is None


def test_the_bilstm_never_reads_the_padding():
    tagger = fb.BiLSTMTagger(5, lstm_size=8, dropout_rate=0.0)
    rng = np.random.default_rng(2)
    features = rng.normal(size=(2, 10, 6)).astype(np.float32)
    mask = np.ones((2, 10), np.int32)
    mask[0, 6:] = 0
    params = jax.jit(tagger.init)(jax.random.key(0), features, mask)["params"]
    apply = jax.jit(lambda f, m: tagger.apply({"params": params}, f, m))
    logits = np.asarray(apply(features, mask))
    # Other padding content, and more of it: the real positions do not change.
    longer = rng.normal(size=(2, 14, 6)).astype(np.float32) * 5
    longer[0, :6], longer[1, :10] = features[0, :6], features[1]
    longer_mask = np.zeros((2, 14), np.int32)
    longer_mask[0, :6], longer_mask[1, :10] = 1, 1
    again = np.asarray(apply(longer, longer_mask))
    np.testing.assert_allclose(again[0, :6], logits[0, :6], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(again[1, :10], logits[1], rtol=1e-5, atol=1e-6)
    # The padding itself did change (the forward LSTM runs on through it): a real check.
    assert not np.allclose(again[0, 6:10], logits[0, 6:10])


def _config(**overrides):
    config = feature_based_tweet_ner.get_config()
    config.unlock()
    config.update(max_seq_length=16, train_batch_size=8, eval_batch_size=8, log_every=1,
                  lstm_size=16, **overrides)  # fmt: skip
    return config


def test_the_encoder_never_changes_and_the_tagger_learns(encoder, cache):
    model, params, inputs, _ = encoder
    before = jax.tree.map(np.copy, params)
    config = _config(layers="scalar_mix", num_epochs=15, learning_rate=1e-2,
                     warmup_proportion=0.0, dropout_rate=0.0)  # fmt: skip
    tagger = fbt.make_tagger(config, 5)
    sample = (jnp.zeros((1, 2, *cache.feature_shape)), jnp.ones((1, 2), jnp.int32))
    init = jax.jit(tagger.init)(jax.random.key(0), *sample)["params"]
    rng = np.random.default_rng(4)
    arrays = {
        "input_mask": inputs["input_mask"][:8],
        "label_ids": rng.integers(0, 5, (8, 16)).astype(np.int32) * inputs["input_mask"][:8],
        "label_weights": inputs["input_mask"][:8].astype(np.float32),
    }
    host = fbt.take_features(cache, arrays, np.arange(8), 16)
    run = common.setup(
        config, tagger, init, 8, functools.partial(fbt.train_loss, model=tagger), fbt.TRAIN_KEYS,
        functools.partial(fbt.predict_step, model=tagger), fbt.INPUT_KEYS, sample_inputs=sample,
    )  # fmt: skip
    # Only the tagger is trained: its params are the whole state.
    assert set(run.state.params) == {"scalar_mix", "bilstm_0", "bilstm_1", "tags"}
    state_leaves = jax.tree.leaves((run.state.params, run.state.opt_state))
    assert sum(x.size for x in jax.tree.leaves(run.state.params)) < 20_000
    assert not any(
        x.shape == params["embeddings"]["word_embeddings"]["embedding"].shape for x in state_leaves
    )
    batch = sharding.global_batch(host, run.mesh)
    first = jax.device_get(run.state.params)
    state, losses = run.state, []
    for _ in range(15):
        state, metrics = run.train_step(state, batch, jax.random.key(0))
        losses.append(float(metrics["loss"]))
        if len(losses) == 1:
            # Every tagger weight has a gradient, the mix included: without weight decay,
            # Adam moves a weight at the first step exactly when its gradient is not zero.
            moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), first,
                                 jax.device_get(state.params))  # fmt: skip
            assert all(jax.tree.leaves(moved)), moved
    assert losses[-1] < 0.5 * losses[0], losses
    assert not np.allclose(state.params["scalar_mix"]["layer_logits"], 0.0)
    # The encoder and what it gives are exactly as before.
    jax.tree.map(np.testing.assert_array_equal, params, before)
    mesh = sharding.create_mesh((-1, 1, 1))
    again = fb.compute_features(model, params, inputs, "scalar_mix", batch_size=8, mesh=mesh)
    np.testing.assert_array_equal(again.values, cache.values)


def test_end_to_end_writes_scores_and_conlleval_files(encoder, tmp_path):
    train_text = (CONLL_DIR / "train.txt").read_text()
    (tmp_path / "train.txt").write_text(train_text * 3)  # 9 sentences: a batch of 8 fits
    checkpoint = convert.save_hf(
        tmp_path / "hf", DEEP, encoder[1], vocab_file=minilm_vocab(), do_lower_case=True
    )
    config = _config(
        task="conll", train_file=str(tmp_path / "train.txt"), dev_file=str(CONLL_DIR / "dev.txt"),
        test_file=str(CONLL_DIR / "dev.txt"), init_from=str(checkpoint), layers="scalar_mix",
        num_epochs=2,
    )  # fmt: skip
    results = fbt.finetune(config, str(tmp_path / "run"))
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["layers"] == "scalar_mix" and saved["feature_shape"] == [6, 32]
    assert saved["num_examples"] == {"train": 9, "dev": 2, "test": 2}
    assert [e["epoch"] for e in saved["epochs"]] == [1, 2]
    for record in [*saved["epochs"], saved["final"]]:
        for split in ("dev", "test"):
            assert set(record[split]) >= {"precision", "recall", "f1", "per_type"}
    assert sum(saved["scalar_mix"]["weights"]) == pytest.approx(1.0, abs=1e-6)
    assert saved["wall_time_s"] > saved["feature_time_s"] > 0
    assert results["final"] == saved["final"]
    lines = (tmp_path / "run" / "predictions_test.txt").read_text().split("\n")
    words = [line.split(" ") for line in lines[:4]]
    assert [w[:2] for w in words] == [
        ["Tom", "B-PER"],
        ["left", "O"],
        ["Acme", "B-ORG"],
        [".", "O"],
    ]
    assert all(w[2] in saved["tags"] for w in words)
