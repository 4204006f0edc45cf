r"""Hard negatives mined from a corpus, for contrastive fine-tuning.

  python -m experiments.mine_negatives --model=<dir or bm25> --pairs=pairs.tsv \
      --corpus=corpus.txt --output=mined.tsv [--num_negatives=3 --range_min=0 \
      --range_max=N --margin=0.1 --relative_margin=0.05 --max_score=S --min_score=S]

--pairs is a pairs file (`data_pipelines.tasks.pairs`: query<TAB>positive, negatives already
there are replaced), --corpus one text a line (empty lines skipped). --model is anything
`experiments.embed` reads (a sentence-transformers directory, a `finetune_embeddings`
workdir, a transformers directory, ...), scored by cosine similarity of its embeddings, or
`bm25` (BM25 by bm25s, as `bert_jax.retrieval` scores it). The output is a pairs file
`experiments.finetune_embeddings` reads: query<TAB>positive<TAB>negative..., one line per
input pair that found its negatives, in the input's order.

The rule (sentence-transformers' `util.mine_hard_negatives` with `sampling_strategy="top"`
and `output_format="n-tuple"`, which tests/test_mine_negatives.py checks it against):

1. Candidates are the distinct texts of the corpus and of the pairs' positives. A query that
   occurs on several lines is one query with all those positives.
2. Each query's `range_max + P` best candidates are kept (P: the most positives one query
   has), and its own positives removed from them.
3. Removed as likely false negatives (a text that answers the query as well as its positive
   does, but is not labelled so: FlagEmbedding issues #850, #1130): a candidate scoring above
   the query's lowest positive score minus `margin`, above (1 - `relative_margin`) times it,
   or above `max_score`; and one below `min_score`.
4. Of what is left, best first, at most `range_max` are ranked; the first `range_min` are
   skipped (the nearest, most often unlabelled positives) and the next `num_negatives` are
   the negatives. A query with fewer is left out of the output, and counted in the log.

`range_max` defaults to range_min + num_negatives + P, or range_min + 10 x num_negatives + P
with a score filter (some candidates will be removed). One difference: where queries have
different numbers of positives, sentence-transformers 5.1.2 takes each query's lowest
positive score over a shifted slice of the positives (its running offset adds the previous
query's count, the last one's for the first); here it is the query's own.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np

log = logging.getLogger(__name__)

BM25 = "bm25"


@dataclasses.dataclass(frozen=True)
class Rule:
    """How negatives are chosen among a query's ranked candidates (the module doc)."""

    num_negatives: int = 3
    range_min: int = 0
    range_max: int | None = None  # None: `default_range_max`
    margin: float | None = None  # absolute: skip scores above (lowest positive - margin)
    relative_margin: float | None = None  # skip scores above (1 - it) x lowest positive
    max_score: float | None = None
    min_score: float | None = None

    @property
    def filters(self) -> bool:
        return any(v is not None for v in (self.margin, self.relative_margin, self.max_score))

    def check(self) -> None:
        if self.num_negatives < 1:
            raise ValueError(f"--num_negatives={self.num_negatives} must be at least 1")
        if self.range_min < 0:
            raise ValueError(f"--range_min={self.range_min} must be at least 0")
        if self.range_max is not None and self.range_max < self.range_min + self.num_negatives:
            raise ValueError(
                f"--range_max={self.range_max} leaves no room for --range_min={self.range_min} "
                f"skipped and --num_negatives={self.num_negatives} kept"
            )

    def default_range_max(self, most_positives: int) -> int:
        if self.range_max is not None:
            return self.range_max
        per_query = self.num_negatives * (10 if self.filters else 1)
        return self.range_min + per_query + most_positives


@dataclasses.dataclass
class Mined:
    """The negatives of each input pair (None: not enough found) and what was skipped."""

    negatives: list[tuple[str, ...] | None]
    skipped: dict[str, int]  # rule -> candidates removed by it


def choose(
    ranked: list[tuple[np.ndarray, np.ndarray]],
    positives: list[set[int]],
    positive_scores: list[float],
    rule: Rule,
    range_max: int,
) -> tuple[list[list[int] | None], dict[str, int]]:
    """For each query, its negatives' candidate indices (None: fewer than `num_negatives`).

    Args:
        ranked: per query, (candidate indices, their scores), best first: its top
            `range_max + P` candidates.
        positives: per query, the candidate indices of its positives.
        positive_scores: per query, its lowest positive score.
    """
    skipped = {"margin": 0, "relative_margin": 0, "max_score": 0, "min_score": 0}
    chosen: list[list[int] | None] = []
    for (indices, scores), own, lowest in zip(ranked, positives, positive_scores, strict=True):
        keep = np.array([int(i) not in own for i in indices], bool)
        tests = {
            "margin": None if rule.margin is None else scores + rule.margin > lowest,
            "relative_margin": None if rule.relative_margin is None
            else scores > lowest * (1 - rule.relative_margin),
            "max_score": None if rule.max_score is None else scores > rule.max_score,
            "min_score": None if rule.min_score is None else scores < rule.min_score,
        }  # fmt: skip
        for name, removed in tests.items():  # counted in this order, each once
            if removed is not None:
                skipped[name] += int((removed & keep).sum())
                keep &= ~removed
        left = [int(i) for i in indices[keep]][:range_max]
        picked = left[rule.range_min : rule.range_min + rule.num_negatives]
        chosen.append(picked if len(picked) == rule.num_negatives else None)
    return chosen, skipped


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def dense_ranking(model, queries: list[str], candidates: list[str], k: int, batch_size: int):
    """(per query (indices, cosine scores) of its top `k`, a function of (query index,
    candidate index) -> cosine) from the embeddings of `model` (bert_jax.embeddings)."""
    from bert_jax import embeddings, retrieval

    q = _unit(embeddings.embed_texts(model, queries, batch_size=batch_size, desc="queries"))
    c = _unit(embeddings.embed_texts(model, candidates, batch_size=batch_size, desc="corpus"))
    scores, indices = retrieval.top_k(q, c, k)
    ranked = list(zip(indices, scores, strict=True))
    return ranked, lambda qi, ci: float(q[qi] @ c[ci])


def bm25_ranking(queries: list[str], candidates: list[str], k: int):
    """The same from BM25 (`bert_jax.retrieval.bm25_run`): a candidate sharing no word with
    the query scores 0 and is not ranked."""
    from bert_jax import retrieval

    run = retrieval.bm25_run(dict(enumerate(queries)), dict(enumerate(candidates)), k=k)
    ranked = []
    for qi in range(len(queries)):
        best = sorted(run[qi].items(), key=lambda item: (-item[1], item[0]))
        ranked.append((np.array([ci for ci, _ in best], np.int64),
                       np.array([s for _, s in best], np.float64)))  # fmt: skip
    return ranked, lambda qi, ci: run[qi].get(ci, 0.0)


def mine(
    model, pair_queries: list[str], pair_positives: list[str], corpus: list[str], rule: Rule,
    *, batch_size: int = 64,
) -> Mined:  # fmt: skip
    """Negatives for each (query, positive) pair from `corpus` by `model` (an
    `embeddings.EmbeddingModel`, or BM25 for the string "bm25"): the module doc's rule."""
    rule.check()
    candidates = list(dict.fromkeys([*corpus, *pair_positives]))
    where = {text: i for i, text in enumerate(candidates)}
    queries = list(dict.fromkeys(pair_queries))
    query_index = {text: i for i, text in enumerate(queries)}
    positives: list[set[int]] = [set() for _ in queries]
    for query, positive in zip(pair_queries, pair_positives, strict=True):
        positives[query_index[query]].add(where[positive])
    most = max(len(p) for p in positives)
    range_max = rule.default_range_max(most)
    k = min(range_max + most, len(candidates))
    log.info("%d queries (%d pairs), %d candidate texts; each query's best %d ranked",
             len(queries), len(pair_queries), len(candidates), k)  # fmt: skip
    if model == BM25:
        # Every candidate that shares a word with it: a positive's score is needed however
        # far down it ranks (the margins), and BM25 gives none to a text outside the run.
        ranked, score = bm25_ranking(queries, candidates, len(candidates) if rule.filters else k)
        ranked = [(i[:k], s[:k]) for i, s in ranked]
    else:
        ranked, score = dense_ranking(model, queries, candidates, k, batch_size)
    lowest = [min(score(qi, ci) for ci in own) for qi, own in enumerate(positives)]
    chosen, skipped = choose(ranked, positives, lowest, rule, range_max)
    per_query = [None if c is None else tuple(candidates[i] for i in c) for c in chosen]
    return Mined([per_query[query_index[q]] for q in pair_queries], skipped)


def write_tsv(path: str, rows: list[tuple[str, ...]]) -> None:
    """The pairs file, through a temporary name beside `path` renamed when complete; a tab,
    carriage return or line feed inside a text becomes a space (`read_pairs` splits on them)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write("\t".join(" ".join(t.replace("\r", " ").split("\t")).replace("\n", " ")
                                  for t in row) + "\n")  # fmt: skip
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_corpus(path: str) -> list[str]:
    """The non-empty lines of a UTF-8 text file, stripped."""
    from experiments.embed import read_lines

    if os.path.isdir(path):
        raise ValueError(f"--corpus={path} is a directory; give a text file, one text a line")
    return [line.strip() for line in read_lines(path) if line.strip()]


def run(model_path: str, pairs_file: str, corpus_file: str, output: str, rule: Rule,
        *, batch_size: int = 64) -> int:  # fmt: skip
    """The whole tool; returns the number of lines written."""
    from data_pipelines.tasks.pairs import read_pairs
    from experiments.embed import check_output

    rule.check()
    check_output(output)
    pairs = read_pairs(pairs_file)
    if pairs.negatives[0]:
        log.info("%s: its %d negatives a line are replaced by the mined ones", pairs_file,
                 len(pairs.negatives[0]))  # fmt: skip
    corpus = read_corpus(corpus_file)
    if model_path == BM25:
        model = BM25
    else:
        from bert_jax import embeddings

        model = embeddings.load_embedding_model(model_path)
    mined = mine(model, pairs.queries, pairs.positives, corpus, rule, batch_size=batch_size)
    rows = [(q, p, *n) for q, p, n in zip(pairs.queries, pairs.positives, mined.negatives,
                                          strict=True) if n is not None]  # fmt: skip
    for name, count in mined.skipped.items():
        if count:
            log.info("Skipped %d candidates by --%s", count, name)
    if len(rows) < len(pairs):
        log.warning("%d of %d pairs found fewer than %d negatives and are left out (widen "
                    "--range_max, or loosen the margins)", len(pairs) - len(rows), len(pairs),
                    rule.num_negatives)  # fmt: skip
    if not rows:
        raise ValueError("no pair found its negatives: nothing written")
    write_tsv(output, rows)
    log.info("Wrote %s: %d pairs with %d negatives each", output, len(rows), rule.num_negatives)
    return len(rows)


def _define_flags():
    from absl import flags

    flags.DEFINE_string("model", None, "Embedding model directory (as experiments.embed), or bm25.")
    flags.DEFINE_string(
        "pairs", None, "Pairs TSV: query<TAB>positive (data_pipelines.tasks.pairs)."
    )
    flags.DEFINE_string("corpus", None, "UTF-8 text, one candidate text a line.")
    flags.DEFINE_string("output", None, "Pairs TSV to write: query, positive, negatives.")
    flags.DEFINE_integer("num_negatives", 3, "Negatives per pair.")
    flags.DEFINE_integer("range_min", 0, "Best remaining candidates skipped before the negatives.")
    flags.DEFINE_integer("range_max", None, "Candidates ranked per query (default: module doc).")
    flags.DEFINE_float("margin", None, "Skip scores above the lowest positive's minus this.")
    flags.DEFINE_float("relative_margin", None,
                       "Skip scores above (1 - this) x the lowest positive's.")  # fmt: skip
    flags.DEFINE_float("max_score", None, "Skip scores above this.")
    flags.DEFINE_float("min_score", None, "Skip scores below this.")
    flags.DEFINE_integer("batch_size", 64, "Texts per forward pass.")
    flags.mark_flags_as_required(["model", "pairs", "corpus", "output"])


def main(argv):
    from absl import app, flags

    from data_pipelines import cli, paths
    from data_pipelines.tasks.formats import TaskDataError

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    cli.progress_logging("bert_jax", "experiments", __name__)
    f = flags.FLAGS
    rule = Rule(f.num_negatives, f.range_min, f.range_max, f.margin, f.relative_margin,
                f.max_score, f.min_score)  # fmt: skip
    model = None if f.model == BM25 else f.model
    try:
        # Before anything is read: an output that is (or is inside) an input would replace it.
        paths.check_not_an_input(f.output, (f.pairs, f.corpus, model), flag="--output")
        run(f.model, f.pairs, f.corpus, f.output, rule, batch_size=f.batch_size)
    except (ValueError, FileNotFoundError, TaskDataError) as error:  # the input: one line
        raise SystemExit(f"mine_negatives: {error}") from None


if __name__ == "__main__":
    from data_pipelines import cli

    _define_flags()
    cli.run(main)
