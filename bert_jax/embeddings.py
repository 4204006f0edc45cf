"""Sentence embeddings from any encoder here, and the contrastive losses that train them.

Pooling reads the encoder's output as transformers' `last_hidden_state` is: for a pre-LN
encoder (ModernBERT) the stream after its final norm. `mean` averages the real tokens (the
input mask), `cls` takes position 0, `last` the last real token (a causal encoder's summary);
`normalize` divides by the L2 norm, so a dot product is a cosine. These are
sentence-transformers' `Pooling` modes of the same names and its `Normalize` module.

The loss is the in-batch-negatives ranking loss of Henderson et al. 2017 (InfoNCE;
sentence-transformers' `MultipleNegativesRankingLoss`): query i against every positive of
the batch (and every mined hard negative), cosine similarity times `scale`, cross-entropy
with its own positive as the label; `symmetric` adds positive i against every query
(`MultipleNegativesSymmetricRankingLoss`). Two properties make it a pod's job:

* **Negatives across the mesh.** The loss is written on the global batch: under `jax.jit`
  with the batch split over the mesh's data axes, each device embeds its own rows and the
  candidates are all-gathered (`gather_candidates`), so every query is scored against every
  positive of the whole global batch: the loss and gradients of one device holding it all.
* **Cached chunks (GradCache, Gao et al. 2021).** With `chunk_size` below the batch, the
  encoder runs over chunks in a `lax.map` whose body is rematerialised
  (`jax.checkpoint(policy=nothing_saveable)`): the forward keeps only each chunk's
  embeddings, the loss is taken over all of them, and the backward re-runs one chunk at a
  time with its slice of the embeddings' gradient. Memory is that of one chunk, the loss and
  gradient those of one pass (`CachedMultipleNegativesRankingLoss`). A chunk takes every
  `num_chunks`-th row, so each chunk is spread evenly over the data-parallel devices.

A repeated positive inside a batch would be a false negative for the other query that has
it: rows whose `positive_ids` are equal are masked out of each other's negatives
(sentence-transformers avoids them with its no-duplicates sampler instead).

**Matryoshka** (Kusupati et al. 2022; sentence-transformers' `MatryoshkaLoss`): with `dims`,
the loss is the weighted sum (weights 1 by default) of the ranking loss over the first d
components of every embedding, for each d of `dims`, each prefix re-normalised for its
cosine; the embeddings are computed once (cached chunks included) and cut d ways. Only the
listed sizes are trained: list the full size too (`experiments.finetune_embeddings` always
adds it), or the full embedding is not trained.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax.config import BertConfig
from bert_jax.layers import last_token_positions
from bert_jax.model import BertModel

if TYPE_CHECKING:
    import numpy as np

POOLINGS = ("mean", "cls", "last")


def check_pooling(pooling: str, what: str = "pooling") -> str:
    """`pooling` if it is one of POOLINGS, else a one-line ValueError listing them."""
    if pooling not in POOLINGS:
        raise ValueError(f"{what}={pooling!r} is not a known pooling: {', '.join(POOLINGS)}")
    return pooling


def pool(sequence: jax.Array, input_mask: jax.Array, pooling: str) -> jax.Array:
    """(B, T, H) encoder output, (B, T) mask -> (B, H) float32 sentence vectors."""
    check_pooling(pooling)
    sequence = sequence.astype(jnp.float32)
    if pooling == "cls":
        return sequence[:, 0]
    if pooling == "last":
        last = last_token_positions(input_mask)  # (B,)
        return jnp.take_along_axis(sequence, last[:, None, None], axis=1)[:, 0]
    mask = input_mask[..., None].astype(jnp.float32)  # (B, T, 1)
    # sentence-transformers clamps the count at 1e-9: an empty row gives 0, not NaN.
    return (sequence * mask).sum(1) / jnp.maximum(mask.sum(1), 1e-9)


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
    """x / max(||x||, eps) over the last axis (torch's `F.normalize`)."""
    norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
    return x / jnp.maximum(norm, eps)


class BertForEmbedding(nn.Module):
    """The encoder (no pooler) and a pooling: (B, T) tokens -> (B, H) embeddings.

    The encoder is named `bert`, as in every head model, so `bert_jax.convert` fills it
    from any checkpoint it reads (BERT, ModernBERT, MosaicBERT, ELECTRA's discriminator).
    """

    config: BertConfig
    pooling: str = "mean"
    normalize: bool = False
    has_head = False  # nothing of it is initialised fresh on top of a loaded encoder

    @nn.compact
    def __call__(self, input_ids, input_mask, token_type_ids, *, deterministic: bool = True):
        check_pooling(self.pooling)
        out = BertModel(self.config, add_pooling_layer=False, name="bert")(
            input_ids, input_mask, token_type_ids, deterministic=deterministic
        )
        pooled = pool(out.sequence_output, input_mask, self.pooling)
        return l2_normalize(pooled) if self.normalize else pooled


# ---------------------------------------------------------------------------------------
# Contrastive losses


def gather_candidates(x: jax.Array, mesh) -> jax.Array:
    """Every device's copy of the whole (N, H) candidate matrix: the all-gather that puts
    the negatives of the whole global batch beside each device's queries (a no-op without
    a mesh)."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec()))


def ranking_loss(
    queries: jax.Array,
    positives: jax.Array,
    negatives: jax.Array | None = None,
    *,
    scale: float = 20.0,
    symmetric: bool = False,
    positive_ids: jax.Array | None = None,
    mesh=None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The in-batch-negatives ranking loss of (B, H) queries and positives.

    Args:
        negatives: (B, K, H) mined hard negatives, K per pair (each a candidate for every
            query, as sentence-transformers' extra columns are), or None.
        scale: the cosine similarities' multiplier (1 / temperature; 20 is
            sentence-transformers' default, Ettin's and ModernBERT's).
        symmetric: average with the loss of each positive against all queries.
        positive_ids: (B,) ints equal for equal positives: another row's copy of a query's
            positive is not counted as its negative (nor, symmetric, a query repeated).
        mesh: the device mesh the batch is split over; its candidates are gathered whole.

    Returns:
        (mean loss, metrics: the in-batch top-1 accuracy of the queries).
    """
    batch = queries.shape[0]
    q = l2_normalize(queries.astype(jnp.float32))
    candidates = positives.astype(jnp.float32)
    if negatives is not None:  # positives first, then negative column k for all rows
        columns = jnp.swapaxes(negatives, 0, 1).reshape(-1, negatives.shape[-1])
        candidates = jnp.concatenate([candidates, columns.astype(jnp.float32)])
    c = gather_candidates(l2_normalize(candidates), mesh)  # (B * (1 + K), H)
    scores = scale * (q @ c.T)  # (B, B * (1 + K))
    labels = jnp.arange(batch)
    if positive_ids is not None:
        same = positive_ids[:, None] == positive_ids[None, :]  # (B, B)
        false_negative = same & ~jnp.eye(batch, dtype=bool)
        pad = jnp.zeros((batch, scores.shape[1] - batch), bool)
        scores = jnp.where(jnp.concatenate([false_negative, pad], 1), -jnp.inf, scores)
    else:
        false_negative = None
    loss = _cross_entropy(scores, labels)
    if symmetric:
        backward = scores[:, :batch].T  # positive j against every query
        loss = (loss + _cross_entropy(backward, labels)) / 2
    accuracy = jnp.mean(jnp.argmax(scores, axis=1) == labels)
    return loss, {"accuracy": accuracy}


def matryoshka_loss(
    queries: jax.Array,
    positives: jax.Array,
    negatives: jax.Array | None = None,
    *,
    dims: Sequence[int],
    weights: Sequence[float] | None = None,
    **kwargs,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """sum_d weight_d x `ranking_loss` of the embeddings' first d components, d in `dims`
    (`ranking_loss` re-normalises each prefix); weights 1 where None. `kwargs` go to
    `ranking_loss`. The metrics: the in-batch accuracy at the largest d, and `loss_<d>` for
    each d (unweighted).

    Raises:
        ValueError: no dims, a dim < 1 or above the embedding's size, or weights that do not
            pair with the dims.
    """
    size = queries.shape[-1]
    dims = [int(d) for d in dims]
    weights = [1.0] * len(dims) if weights is None else [float(w) for w in weights]
    if not dims or len(weights) != len(dims) or not all(1 <= d <= size for d in dims):
        raise ValueError(f"Matryoshka dims {dims} (weights {weights}) must be 1 to {size} (the "
                         "embedding's size), one weight each")  # fmt: skip
    total, metrics = 0.0, {}
    for d, weight in sorted(zip(dims, weights, strict=True), reverse=True):
        cut = None if negatives is None else negatives[..., :d]
        loss, found = ranking_loss(queries[..., :d], positives[..., :d], cut, **kwargs)
        total = total + weight * loss
        metrics.setdefault("accuracy", found["accuracy"])  # the largest d's
        metrics[f"loss_{d}"] = loss
    return total, metrics


def _cross_entropy(scores: jax.Array, labels: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(scores, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))


EmbedFn = Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array]


def embed_in_chunks(
    embed: EmbedFn, params, input_ids: jax.Array, input_mask: jax.Array, rng, chunk_size: int
) -> jax.Array:
    """`embed(params, ids, mask, rng)` over (N, T) rows, `chunk_size` rows at a time.

    Each chunk is rematerialised in the backward pass (GradCache: activations of one chunk
    at a time, whatever N); chunk c holds rows c, c + n, c + 2n, ... (n chunks), so a batch
    split over the data-parallel devices stays split within each chunk. Chunk c's dropout
    key is `fold_in(rng, c)`, the same in the forward pass and its recomputation.
    A `chunk_size` of 0 or >= N is one pass.
    """
    n = input_ids.shape[0]
    if not chunk_size or chunk_size >= n:
        return embed(params, input_ids, input_mask, rng)
    if n % chunk_size:
        raise ValueError(f"chunk_size={chunk_size} does not divide the batch's {n} rows")
    chunks = n // chunk_size

    def split(x):  # (N, T) -> (n, chunk, T), chunk c = rows c, c + n, ...
        return jnp.swapaxes(x.reshape(chunk_size, chunks, *x.shape[1:]), 0, 1)

    body = jax.checkpoint(
        lambda p, ids, mask, c: embed(p, ids, mask, jax.random.fold_in(rng, c)),
        policy=jax.checkpoint_policies.nothing_saveable,
    )
    out = jax.lax.map(
        lambda xs: body(params, *xs), (split(input_ids), split(input_mask), jnp.arange(chunks))
    )  # (n, chunk, H)
    return jnp.swapaxes(out, 0, 1).reshape(n, out.shape[-1])


def contrastive_loss(
    embed: EmbedFn,
    params,
    batch: dict[str, jax.Array],
    rng,
    *,
    scale: float = 20.0,
    symmetric: bool = False,
    chunk_size: int = 0,
    dims: Sequence[int] = (),
    weights: Sequence[float] | None = None,
    mesh=None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`ranking_loss` of a batch of token arrays: `query_tokens query_mask positive_tokens
    positive_mask` (B, T), optional `negative_tokens negative_mask` (B, K, T) and
    `positive_ids` (B,) keys of equal positives; queries, positives and negatives each embedded
    (in chunks of `chunk_size`) with their own dropout keys. With `dims`, `matryoshka_loss`
    of those prefixes (and `weights`) instead."""
    keys = jax.random.split(rng, 3)
    q = embed_in_chunks(embed, params, batch["query_tokens"], batch["query_mask"], keys[0],
                        chunk_size)  # fmt: skip
    p = embed_in_chunks(embed, params, batch["positive_tokens"], batch["positive_mask"],
                        keys[1], chunk_size)  # fmt: skip
    negatives = None
    if "negative_tokens" in batch:
        tokens, mask = batch["negative_tokens"], batch["negative_mask"]  # (B, K, T)
        b, k, t = tokens.shape
        # Row-major (B * K) keeps each row's negatives on the device that holds the row.
        flat = embed_in_chunks(embed, params, tokens.reshape(b * k, t), mask.reshape(b * k, t),
                               keys[2], chunk_size * k if chunk_size else 0)  # fmt: skip
        negatives = flat.reshape(b, k, -1)
    options = {"scale": scale, "symmetric": symmetric, "positive_ids": batch.get("positive_ids"),
               "mesh": mesh}  # fmt: skip
    if dims:
        return matryoshka_loss(q, p, negatives, dims=dims, weights=weights, **options)
    return ranking_loss(q, p, negatives, **options)


# ---------------------------------------------------------------------------------------
# Loading an embedding model and embedding text


class EmbeddingModel(NamedTuple):
    """An encoder ready to embed: the module (with its pooling), its params and tokenizer."""

    module: BertForEmbedding
    params: Any
    tokenizer: Any  # data_pipelines.tokenization.load_tokenizer's
    vocab_file: str
    max_seq_length: int  # tokens per text, special tokens included; longer ones are cut
    source: str  # where pooling and normalize came from: "flags", the file, or "default"
    truncate_dim: int | None = None  # Matryoshka: the first d components kept (None: all)


def directory_settings(path: str) -> tuple[dict[str, Any], str] | None:
    """(pooling / normalize / max_seq_length, the file that says so) of an embedding model
    directory: a sentence-transformers directory's modules, or the `embedding` block that
    `experiments.finetune_embeddings` saves in its checkpoint's finetuned.json (of the
    model `convert.locations.resolve` finds at `path`); else None.

    Raises:
      ConversionError: a directory holding its own model and a fine-tuned one (`resolve`),
        or a file of it that links outside it.
    """
    import json
    import os

    from bert_jax.convert import locations, sentence_transformers

    settings = sentence_transformers.read_settings(path) if os.path.isdir(path) else None
    if settings is not None:
        found = {"pooling": settings.pooling, "normalize": settings.normalize,
                 "max_seq_length": settings.max_seq_length,
                 "truncate_dim": settings.truncate_dim}  # fmt: skip
        return found, os.path.join(path, sentence_transformers.MODULES_FILE)
    model_dir = locations.resolve(path)
    meta = os.path.isdir(model_dir) and locations.model_file(model_dir, locations.FINETUNED_FILE)
    if meta:
        with open(meta, encoding="utf-8") as f:
            block = json.load(f).get("embedding")
        if block:
            return dict(block), meta
    return None


def _do_lower_case(vocab_file: str) -> bool:
    """tokenizer_config.json's `do_lower_case` beside the vocabulary (True where it says
    nothing, as transformers' BertTokenizer; a tokenizer.json normalises by itself); one
    that links out of the vocabulary's directory is refused (`locations.model_file`)."""
    import json
    import os

    from bert_jax.convert import locations

    directory = os.path.dirname(os.path.abspath(vocab_file))
    config = locations.model_file(directory, "tokenizer_config.json")
    if config is None or not os.path.isfile(config):
        return True
    with open(config, encoding="utf-8") as f:
        return bool(json.load(f).get("do_lower_case", True))


def load_embedding_model(
    path: str,
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    max_seq_length: int | None = None,
    vocab_file: str | None = None,
    do_lower_case: bool | None = None,
    truncate_dim: int | None = None,
) -> EmbeddingModel:
    """An embedding model from anything `bert_jax.convert` reads, or a sentence-transformers
    directory, or a workdir of `experiments.finetune_embeddings`.

    `pooling`, `normalize`, `max_seq_length` and `truncate_dim` left None take the
    directory's own (`directory_settings`), else mean pooling, no normalisation, the model's
    positions (at most 512) and every dimension. `do_lower_case` None takes
    tokenizer_config.json's beside the vocabulary.
    """
    from bert_jax import convert
    from bert_jax.convert import locations
    from data_pipelines.tokenization import load_tokenizer

    if max_seq_length is not None and (isinstance(max_seq_length, bool) or max_seq_length < 3):
        # Before the model is read: 0 is a length, not "the directory's own" (None is).
        raise ValueError(f"max_seq_length={max_seq_length} must be at least 3 tokens (the "
                         "special tokens and one of text)")  # fmt: skip
    found, where = directory_settings(path) or ({}, "default")
    chosen = {"pooling": pooling, "normalize": normalize, "max_seq_length": max_seq_length}
    source = "flags" if pooling is not None and normalize is not None else where
    settings = {k: v if v is not None else found.get(k) for k, v in chosen.items()}
    settings["pooling"] = check_pooling(settings["pooling"] or "mean")
    settings["normalize"] = bool(settings["normalize"])
    # A sentence-transformers directory's module folder, a fine-tuning workdir's checkpoint/,
    # ...: the one resolver `convert` reads through, so both read the same model.
    model_dir = locations.resolve(path)
    template = BertForEmbedding(BertConfig(), settings["pooling"], settings["normalize"])
    config, params, found_vocab = convert.load_pretrained(model_dir, model=template)
    vocab_file = vocab_file or found_vocab
    if not vocab_file:
        raise ValueError(f"no vocab.txt, tokenizer.json or .model beside {path}; pass a vocab")
    convert.check_vocab(vocab_file, config)
    if do_lower_case is None:
        do_lower_case = _do_lower_case(vocab_file)
    tokenizer = load_tokenizer(vocab_file, do_lower_case=do_lower_case)
    length = settings["max_seq_length"]  # 0 is refused below, not taken for "unset"
    if length is None:
        length = min(512, config.max_position_embeddings)
    if not 3 <= length <= config.max_position_embeddings:
        raise ValueError(f"max_seq_length={length} must be in [3, max_position_embeddings="
                         f"{config.max_position_embeddings}] of {path}")  # fmt: skip
    module = template.clone(config=config)
    truncate_dim = truncate_dim if truncate_dim is not None else found.get("truncate_dim")
    if truncate_dim is not None and not 1 <= truncate_dim <= config.hidden_size:
        raise ValueError(f"truncate_dim={truncate_dim} must be in [1, {config.hidden_size}] "
                         f"(the embedding's size) of {path}")  # fmt: skip
    return EmbeddingModel(module, params, tokenizer, vocab_file, int(length), source,
                          truncate_dim)  # fmt: skip


def truncate(vectors: np.ndarray, dim: int | None, normalize: bool) -> np.ndarray:
    """The first `dim` components of each (N, H) row (all where None), re-normalised to unit
    length when `normalize` (a Matryoshka prefix of a normalised model is used as a cosine;
    sentence-transformers' `truncate_dim` cuts after its Normalize and leaves the norm)."""
    import numpy as np

    if dim is None or dim >= vectors.shape[-1]:
        return vectors
    cut = vectors[..., :dim]
    if normalize:
        norm = np.linalg.norm(cut, axis=-1, keepdims=True)
        cut = cut / np.maximum(norm, 1e-12)
    return np.ascontiguousarray(cut, dtype=np.float32)


def tokenize(tokenizer, texts: list[str], max_seq_length: int) -> tuple[list, list]:
    """Each text's (ids, type ids) with the tokenizer's special tokens, cut to the length."""
    encoded = tokenizer.encode_for_model_batch(texts, None, max_seq_length)
    return [ids for ids, _, _ in encoded], [types for _, types, _ in encoded]


def embed_texts(
    model: EmbeddingModel,
    texts: list[str],
    *,
    batch_size: int = 64,
    show_progress: bool = True,
    desc: str = "embed",
) -> np.ndarray:
    """(N, H) float32 embeddings of `texts`, in order ((N, d) with the model's `truncate_dim`,
    `truncate`).

    Texts are batched by length (shortest first, each batch padded to its longest rounded up
    to 16: few shapes to compile, little padding) and put back in input order.
    """
    import numpy as np
    from tqdm import tqdm

    ids, types = tokenize(model.tokenizer, list(texts), model.max_seq_length)
    lengths = np.array([len(x) for x in ids])
    out = np.zeros((len(texts), model.module.config.hidden_size), np.float32)
    forward = _forward(model.module)
    order = np.argsort(lengths, kind="stable")
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=desc, unit="batch", disable=not show_progress):
        rows = order[start : start + batch_size]
        width = min(model.max_seq_length, -(-int(lengths[rows].max()) // 16) * 16)
        tokens = np.full((batch_size, width), model.tokenizer.pad_id, np.int32)
        segment = np.zeros_like(tokens)
        mask = np.zeros_like(tokens)
        for row, i in enumerate(rows):
            tokens[row, : lengths[i]], segment[row, : lengths[i]], mask[row, : lengths[i]] = (
                ids[i], types[i], 1,
            )  # fmt: skip
        out[rows] = np.asarray(forward(model.params, tokens, mask, segment))[: len(rows)]
    return truncate(out, model.truncate_dim, model.module.normalize)


def _forward(module: BertForEmbedding):
    @jax.jit
    def forward(params, tokens, mask, segment):
        return module.apply({"params": params}, tokens, mask, segment)

    return forward
