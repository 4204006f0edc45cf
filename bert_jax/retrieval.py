r"""Retrieval evaluation: exact top-k search in JAX, the IR metrics, a BM25 baseline.

What an embedding model is scored by (issue 73): each query's embedding against every
passage's, the passages ranked by inner product, and the ranking scored against the
relevance judgements (qrels) by well-kept IR measures rather than code of ours.

* `top_k`: exact search (no index, no approximation): `queries @ corpus.T` then
  `jax.lax.top_k`, the queries in batches of `batch_size` so that only a
  (batch_size, corpus size) block of scores exists at a time (1024 x 100k floats: 400 MB).
  The product runs at `Precision.HIGHEST`: by default a float32 matmul passes through
  bfloat16 on a TPU (TF32 on recent GPUs), which reorders near ties. With a `mesh`, the
  corpus rows are split over the mesh's `axes`; each device ranks its rows, and the
  devices' top k's are gathered and ranked again, which is exact (any of the overall top k
  is in its own device's top k).
  Scores are inner products: L2-normalise both sides for cosine similarity. Equal scores
  come out lower corpus index first, as `lax.top_k` orders them.
* `run_from_topk` turns indices into ir-measures' run (`{qid: {pid: score}}`), and
  `evaluate` scores a run by `ir_measures.calc_aggregate` (nDCG@10 and Recall@k by
  pytrec_eval, trec_eval's code; RR@10 by MS MARCO's scorer): 'nDCG@10', 'MRR@10', 'R@1',
  'R@10', 'R@100', each the mean over the queries of the qrels (one without a ranking
  counts 0). A run carries scores, not ranks: passages with exactly equal scores are
  ordered by each scorer's own rule (trec_eval: by passage id, descending), so a run with
  ties at the top can score differently from its list order.
* `bm25_run`: the lexical baseline, by the `bm25s` package (Lucene's BM25 variant, k1 =
  1.5, b = 0.75, its defaults): texts lower-cased, split into runs of 2+ word characters
  (scikit-learn's CountVectorizer pattern, bm25s' default), bm25s' English stopword list
  removed, no stemming (a stemmer needs PyStemmer, which is not installed here).
* `fuse_rrf` and `fuse_scores`: a dense run and BM25's combined. Reciprocal rank fusion
  (Cormack, Clarke and Buettcher 2009): a passage scores the sum over the runs of
  1 / (k + its rank), k = 60, so only ranks count. Normalised score interpolation
  (Pyserini's hybrid search): each run's scores min-max normalised per query over the
  passages it returned (its best 1, its worst 0; a passage a run did not return counts 0
  there), then `weight` x the first + (1 - `weight`) x the second. Without normalisation
  BM25's unbounded scores swamp a cosine's [-1, 1], and the sum is BM25's ranking.
* `per_query`: one metric per query (ir-measures), for intervals over questions.
* `paired_interval`: the mean difference of two systems' scores over the same seeds (or
  queries) and its confidence interval, a paired t interval or a bootstrap one (scipy).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
from jax.sharding import Mesh, NamedSharding, PartitionSpec

METRICS = ("nDCG@10", "MRR@10", "R@1", "R@10", "R@100")


def _check_embeddings(query_emb, corpus_emb, k: int) -> tuple[np.ndarray, np.ndarray]:
    queries = np.asarray(query_emb, dtype=np.float32)
    corpus = np.asarray(corpus_emb, dtype=np.float32)
    if queries.ndim != 2 or corpus.ndim != 2 or queries.shape[1] != corpus.shape[1]:
        raise ValueError(
            f"queries {queries.shape} and corpus {corpus.shape}: expected (Q, D) and (N, D)"
        )
    if corpus.shape[0] == 0 or k < 1:
        raise ValueError(f"top_k: k={k} of a corpus of {corpus.shape[0]}: need k >= 1, N >= 1")
    for name, x in (("query", queries), ("corpus", corpus)):
        if not np.isfinite(x).all():
            raise ValueError(f"top_k: {name} embeddings hold NaN or infinity")
    return queries, corpus


@functools.partial(jax.jit, static_argnames="k")
def _search(queries: jax.Array, corpus: jax.Array, k: int):
    scores = jnp.matmul(queries, corpus.T, precision=jax.lax.Precision.HIGHEST)  # (B, N)
    return jax.lax.top_k(scores, k)


def _sharded_search(mesh: Mesh, axes: tuple[str, ...], rows: int, per_shard: int, k: int):
    """The search with the corpus split over `axes`: (queries, corpus) -> (scores, indices)."""
    local_k = min(k, per_shard)

    def local(queries, shard):  # queries (B, D), all of them; shard (per_shard, D)
        first = jax.lax.axis_index(axes) * per_shard
        scores = jnp.matmul(queries, shard.T, precision=jax.lax.Precision.HIGHEST)
        index = first + jnp.arange(per_shard)  # the rows' corpus indices
        scores = jnp.where(index < rows, scores, -jnp.inf)  # padding rows never rank
        scores, where = jax.lax.top_k(scores, local_k)  # (B, local_k)
        # Devices in mesh order hold ascending rows: ties stay lower index first.
        scores = jax.lax.all_gather(scores, axes, axis=1, tiled=True)  # (B, shards * local_k)
        index = jax.lax.all_gather(first + where, axes, axis=1, tiled=True)
        scores, best = jax.lax.top_k(scores, k)
        return scores, jnp.take_along_axis(index, best, axis=1)

    return jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(PartitionSpec(), PartitionSpec(axes)),
            out_specs=(PartitionSpec(), PartitionSpec()),
            check_vma=False,  # all_gather's result is the same on every device
        )
    )


def top_k(
    query_emb,
    corpus_emb,
    k: int,
    *,
    batch_size: int = 1024,
    mesh: Mesh | None = None,
    axes: Sequence[str] = ("data", "fsdp"),
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k passages of each query by inner product (module docstring).

    Args:
        query_emb: (Q, D) query embeddings.
        corpus_emb: (N, D) passage embeddings.
        k: how many passages per query; more than N gives N.
        batch_size: queries scored at once.
        mesh: where to split the corpus rows; None: one device.
        axes: the mesh axes the corpus rows are split over (with `mesh`).

    Returns:
        (scores (Q, k) float32, indices (Q, k) int32), best first, as numpy arrays.
    """
    queries, corpus = _check_embeddings(query_emb, corpus_emb, k)
    rows = corpus.shape[0]
    k = min(k, rows)
    if mesh is None:
        corpus_dev = jnp.asarray(corpus)
        search = functools.partial(_search, k=k)
        place = jnp.asarray
    else:
        axes = tuple(axes)
        shards = math.prod(mesh.shape[a] for a in axes)
        per_shard = -(-rows // shards)
        padded = np.zeros((per_shard * shards, corpus.shape[1]), np.float32)
        padded[:rows] = corpus
        corpus_dev = jax.device_put(padded, NamedSharding(mesh, PartitionSpec(axes)))
        search = _sharded_search(mesh, axes, rows, per_shard, k)
        place = functools.partial(jax.device_put, device=NamedSharding(mesh, PartitionSpec()))
    batch_size = max(1, min(batch_size, queries.shape[0]))
    all_scores, all_indices = [], []
    for start in range(0, queries.shape[0], batch_size):
        batch = queries[start : start + batch_size]
        size = batch.shape[0]
        if size < batch_size:  # one shape for every batch: one compilation
            batch = np.pad(batch, ((0, batch_size - size), (0, 0)))
        scores, indices = search(place(batch), corpus_dev)
        all_scores.append(np.asarray(scores)[:size])
        all_indices.append(np.asarray(indices)[:size])
    if not all_scores:
        return np.zeros((0, k), np.float32), np.zeros((0, k), np.int32)
    return np.concatenate(all_scores), np.concatenate(all_indices).astype(np.int32)


def run_from_topk(
    query_ids: Sequence[str], corpus_ids: Sequence[str], scores, indices
) -> dict[str, dict[str, float]]:
    """`top_k`'s arrays as a run, `{qid: {pid: score}}`, the form ir-measures reads."""
    scores, indices = np.asarray(scores), np.asarray(indices)
    if scores.shape != indices.shape or scores.shape[0] != len(query_ids):
        raise ValueError(
            f"scores {scores.shape}, indices {indices.shape} for {len(query_ids)} queries"
        )
    return {
        qid: {corpus_ids[j]: float(s) for s, j in zip(row_scores, row_indices, strict=True)}
        for qid, row_scores, row_indices in zip(query_ids, scores, indices, strict=True)
    }


def evaluate(
    run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]]
) -> dict[str, float]:
    """nDCG@10, MRR@10 and Recall@1/10/100 of `run`, by ir-measures (module docstring).

    Each is the mean over the queries of `qrels`; one with no ranking in `run` (or an
    empty one) scores 0 on every metric, as trec_eval's `-c` counts it (left to the
    scorers, pytrec_eval would drop it from the mean and MS MARCO's count it as 0). Queries
    of `run` without judgements are ignored.
    """
    import ir_measures
    from ir_measures import RR, R, nDCG

    if not qrels:
        raise ValueError("evaluate: no judged queries (qrels is empty)")
    ranked = {qid: dict(run[qid]) for qid in qrels if run.get(qid)}
    measures = {"nDCG@10": nDCG @ 10, "MRR@10": RR @ 10, "R@1": R @ 1, "R@10": R @ 10,
                "R@100": R @ 100}  # fmt: skip
    if not ranked:
        return dict.fromkeys(measures, 0.0)
    values = ir_measures.calc_aggregate(
        list(measures.values()), {qid: dict(qrels[qid]) for qid in ranked}, ranked
    )
    share = len(ranked) / len(qrels)  # the unranked queries' zeros in the mean
    return {name: float(values[measure]) * share for name, measure in measures.items()}


def bm25_run(
    queries: Mapping[str, str], corpus: Mapping[str, str], k: int = 100
) -> dict[str, dict[str, float]]:
    """The top `k` passages of each query by BM25 (bm25s, settings in the module docstring).

    Args:
        queries: qid -> text.
        corpus: pid -> text.
        k: passages per query; more than the corpus holds gives all of them.

    Returns:
        The run, `{qid: {pid: score}}`, holding only passages that share a word with the
        query (score > 0), as Lucene returns them; a query with none gets an empty ranking.
    """
    import bm25s

    pids = list(corpus)
    retriever = bm25s.BM25()  # method="lucene", k1=1.5, b=0.75
    retriever.index(
        bm25s.tokenize([corpus[p] for p in pids], stopwords="en", show_progress=False),
        show_progress=False,
    )
    qids = list(queries)
    tokens = bm25s.tokenize([queries[q] for q in qids], stopwords="en", return_ids=False,
                            show_progress=False)  # fmt: skip
    vocab = retriever.vocab_dict
    known = [i for i, words in enumerate(tokens) if any(w in vocab for w in words)]
    run: dict[str, dict[str, float]] = {qid: {} for qid in qids}
    if known:
        indices, scores = retriever.retrieve(
            [tokens[i] for i in known], k=min(k, len(pids)), show_progress=False,
            backend_selection="numpy",
        )  # fmt: skip
        for i, row_indices, row_scores in zip(known, indices, scores, strict=True):
            run[qids[i]] = {
                pids[j]: float(s) for j, s in zip(row_indices, row_scores, strict=True) if s > 0
            }
    return run


Run = Mapping[str, Mapping[str, float]]


def fuse_rrf(runs: Sequence[Run], k: int = 60, depth: int = 100) -> dict[str, dict[str, float]]:
    """Reciprocal rank fusion of `runs` (module docstring): each query's passages by the sum
    over the runs of 1 / (k + rank), ranks from 1, the best `depth` kept."""
    if k < 0:
        raise ValueError(f"fuse_rrf: k={k}; 0 or more (60 is the paper's)")
    fused: dict[str, dict[str, float]] = {}
    for qid in {q for run in runs for q in run}:
        total: dict[str, float] = {}
        for run in runs:
            ranked = sorted(run.get(qid, {}).items(), key=lambda item: (-item[1], item[0]))
            for rank, (pid, _) in enumerate(ranked, 1):
                total[pid] = total.get(pid, 0.0) + 1.0 / (k + rank)
        fused[qid] = _best(total, depth)
    return fused


def fuse_scores(
    first: Run, second: Run, weight: float, depth: int = 100
) -> dict[str, dict[str, float]]:
    """`weight` x `first` + (1 - `weight`) x `second`, each run's scores min-max normalised
    per query (module docstring); the best `depth` passages of each query kept."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"fuse_scores: weight={weight}; the first run's share, in [0, 1]")
    fused: dict[str, dict[str, float]] = {}
    for qid in set(first) | set(second):
        a, b = _min_max(first.get(qid, {})), _min_max(second.get(qid, {}))
        total = {p: weight * a.get(p, 0.0) + (1.0 - weight) * b.get(p, 0.0) for p in a | b}
        fused[qid] = _best(total, depth)
    return fused


def _min_max(scores: Mapping[str, float]) -> dict[str, float]:
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    span = high - low
    return {p: (s - low) / span if span > 0 else 1.0 for p, s in scores.items()}


def _best(scores: Mapping[str, float], depth: int) -> dict[str, float]:
    ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:depth]
    return dict(ranked)


def per_query(run: Run, qrels: Mapping[str, Mapping[str, int]], metric: str = "nDCG@10"):
    """`metric` (one of METRICS) of each judged query, in qrels' order: {qid: value}, 0 for
    a query without a ranking."""
    import ir_measures
    from ir_measures import RR, R, nDCG

    measure = {"nDCG@10": nDCG @ 10, "MRR@10": RR @ 10, "R@1": R @ 1, "R@10": R @ 10,
               "R@100": R @ 100}[metric]  # fmt: skip
    ranked = {qid: dict(run[qid]) for qid in qrels if run.get(qid)}
    values = dict.fromkeys(qrels, 0.0)
    if ranked:
        for result in ir_measures.iter_calc([measure], {q: dict(qrels[q]) for q in ranked}, ranked):
            values[result.query_id] = float(result.value)
    return values


@dataclasses.dataclass(frozen=True)
class Interval:
    mean: float  # mean of a - b
    low: float
    high: float
    confidence: float


def paired_interval(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    method: str = "t",
    n_resamples: int = 10_000,
    seed: int = 0,
) -> Interval:
    """Confidence interval of the mean of `a - b`, paired by position (seed or query).

    `method="t"`: Student's t on the differences (what few seeds allow; assumes the
    differences are roughly normal). `method="bootstrap"`: scipy's BCa bootstrap of the
    mean difference, for many pairs (per-query scores).
    """
    diff = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    if diff.ndim != 1 or len(diff) < 2:
        raise ValueError(f"paired_interval: {len(diff)} pairs; need 2 or more, paired")
    if method == "t" and np.all(diff == diff[0]):
        low = high = diff[0]  # no spread: t's scale would be 0
    elif method == "t":
        low, high = scipy.stats.t.interval(
            confidence, len(diff) - 1, loc=diff.mean(), scale=scipy.stats.sem(diff)
        )
    elif method == "bootstrap":
        result = scipy.stats.bootstrap(
            (diff,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
            random_state=np.random.default_rng(seed),
        )  # fmt: skip
        low, high = result.confidence_interval
    else:
        raise ValueError(f"paired_interval: method {method!r}; choose 't' or 'bootstrap'")
    return Interval(float(diff.mean()), float(low), float(high), confidence)
