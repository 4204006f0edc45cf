"""Retrieval evaluation against independent references: top-k against numpy's sort (on one
device and split over 8), the metrics against pytrec_eval called directly and against
hand-worked rankings, BM25 against rank-bm25, the paired interval against scipy's paired
t-test; the SQuAD and Lee readers on fixtures and on the real files where they are cached.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re

import numpy as np
import pytest
import scipy.stats

from bert_jax import retrieval
from bert_jax.sharding import create_mesh
from data_pipelines.tasks import bigbench, lee_similarity, squad_retrieval
from data_pipelines.tasks.formats import TaskDataError

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
DEV = os.path.join(FIXTURES, "squad_retrieval_dev.json")
TRAIN = os.path.join(FIXTURES, "squad_retrieval_train.json")


def _numpy_top_k(queries, corpus, k):
    scores = queries.astype(np.float32) @ corpus.astype(np.float32).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # ties: lower index first
    return np.take_along_axis(scores, order, axis=1), order


@pytest.mark.parametrize("mesh_shape", [None, (4, 2, 1)])
def test_top_k_equals_numpy_sort_in_batches_and_split_over_devices(mesh_shape):
    rng = np.random.default_rng(0)
    queries, corpus = rng.normal(size=(37, 16)), rng.normal(size=(101, 16))  # 101: 8 ∤ N
    mesh = create_mesh(mesh_shape) if mesh_shape else None
    for k in (1, 10, 101, 500):  # 500 > N: all of them
        scores, indices = retrieval.top_k(queries, corpus, k, batch_size=8, mesh=mesh)
        want_scores, want_indices = _numpy_top_k(queries, corpus, k)
        assert indices.dtype == np.int32 and indices.shape == (37, min(k, 101))
        np.testing.assert_array_equal(indices, want_indices)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


def test_top_k_refuses_mismatched_or_non_finite_embeddings():
    with pytest.raises(ValueError, match=r"\(Q, D\) and \(N, D\)"):
        retrieval.top_k(np.zeros((2, 3)), np.zeros((4, 5)), 1)
    with pytest.raises(ValueError, match="corpus embeddings hold NaN"):
        retrieval.top_k(np.zeros((2, 3)), np.full((4, 3), np.nan), 1)


def _random_run_and_qrels(rng, num_queries=30, num_docs=200, depth=120):
    docs = [f"d{i}" for i in range(num_docs)]
    qrels, run = {}, {}
    for q in range(num_queries):
        qid = f"q{q}"
        relevant = rng.choice(num_docs, size=rng.integers(1, 4), replace=False)
        qrels[qid] = {docs[j]: 1 for j in relevant}
        ranked = rng.choice(num_docs, size=depth, replace=False)  # some relevant ones missed
        run[qid] = {docs[j]: float(s) for j, s in zip(ranked, rng.random(depth), strict=True)}
    return run, qrels


def _pytrec_eval_reference(run, qrels):
    """Per-query metrics by pytrec_eval itself; RR@10 as recip_rank of the top 10 alone."""
    import pytrec_eval

    measures = {"ndcg_cut_10", "recall_1", "recall_10", "recall_100"}
    main = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    top10 = {
        q: dict(sorted(docs.items(), key=lambda item: (-item[1], item[0]))[:10])
        for q, docs in run.items()
    }  # trec_eval's order: score descending (no ties in random floats)
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    names = {"nDCG@10": "ndcg_cut_10", "R@1": "recall_1", "R@10": "recall_10",
             "R@100": "recall_100"}  # fmt: skip
    per_query = {q: {name: main[q][m] for name, m in names.items()} for q in main}
    for q in per_query:
        per_query[q]["MRR@10"] = rr[q]["recip_rank"]
    return per_query


def test_evaluate_equals_pytrec_eval_and_counts_an_unranked_query_as_zero():
    run, qrels = _random_run_and_qrels(np.random.default_rng(1))
    reference = _pytrec_eval_reference(run, qrels)
    got = retrieval.evaluate(run, qrels)
    assert list(got) == list(retrieval.METRICS)
    for name in retrieval.METRICS:
        assert got[name] == pytest.approx(np.mean([r[name] for r in reference.values()]))
    del run["q0"]  # unranked: 0 on every metric, the mean still over all 30 queries
    got = retrieval.evaluate(run, qrels)
    for name in retrieval.METRICS:
        want = sum(r[name] for q, r in reference.items() if q != "q0") / 30
        assert got[name] == pytest.approx(want)


def test_evaluate_on_hand_worked_rankings():
    # q1: the one relevant passage third; q2: two relevant, first and 11th.
    qrels = {"q1": {"c": 1}, "q2": {"a": 1, "k": 1}}
    run = {
        "q1": {"a": 0.9, "b": 0.8, "c": 0.7},
        "q2": {p: 1.0 - i / 100 for i, p in enumerate("abcdefghijk")},
    }
    got = retrieval.evaluate(run, qrels)
    ndcg_q2 = 1.0 / (1.0 + 1.0 / math.log2(3))  # ideal DCG@10 has both relevant at 1 and 2
    assert got["nDCG@10"] == pytest.approx((1 / math.log2(4) + ndcg_q2) / 2)
    assert got["MRR@10"] == pytest.approx((1 / 3 + 1) / 2)
    assert got["R@1"] == pytest.approx((0 + 0.5) / 2)
    assert got["R@10"] == pytest.approx((1 + 0.5) / 2)
    assert got["R@100"] == pytest.approx(1.0)


def test_run_from_topk_names_passages_by_id():
    scores, indices = retrieval.top_k(np.eye(2), np.array([[0.0, 1.0], [2.0, 0.0]]), 2)
    run = retrieval.run_from_topk(["qa", "qb"], ["p0", "p1"], scores, indices)
    assert run == {"qa": {"p1": 2.0, "p0": 0.0}, "qb": {"p0": 1.0, "p1": 0.0}}
    assert list(run["qa"]) == ["p1", "p0"]  # best first


CORPUS = {
    "p0": "The quick brown fox jumps over the lazy dog near the river bank",
    "p1": "A river bank holds money for the town, not foxes",
    "p2": "Dogs chase foxes; foxes outrun dogs across the meadow",
    "p3": "The meadow flowers bloom in spring near the old mill",
    "p4": "Spring rain floods the river and the mill wheel turns",
    "p5": "An old dog sleeps by the mill all afternoon",
}
QUERIES = {"fox": "quick fox jumps", "mill": "old mill wheel", "bank": "money bank town",
           "none": "the and of", "meadow": "meadow flowers spring"}  # fmt: skip


def test_bm25_scores_equal_rank_bm25_with_lucene_idf_and_top1_equals_bm25okapi():
    import bm25s
    import rank_bm25

    run = retrieval.bm25_run(QUERIES, CORPUS, k=10)
    pids = list(CORPUS)

    def tokens(texts):  # the same tokenisation as bm25_run's, for rank-bm25
        return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)

    okapi = rank_bm25.BM25Okapi(tokens(list(CORPUS.values())), k1=1.5, b=0.75)
    lucene = rank_bm25.BM25Okapi(tokens(list(CORPUS.values())), k1=1.5, b=0.75)
    n = len(pids)
    # Lucene's BM25 (bm25s' default; Kamphuis et al. 2020) differs from rank-bm25's Okapi
    # in its idf, log(1 + (N - df + 0.5) / (df + 0.5)) (never negative), and in dropping the
    # constant factor (k1 + 1) of the term-frequency part: both put into rank-bm25's.
    for word in lucene.idf:
        df = sum(word in doc for doc in lucene.doc_freqs)
        lucene.idf[word] = math.log(1 + (n - df + 0.5) / (df + 0.5)) / (1.5 + 1)
    assert run["none"] == {}  # stopwords only: nothing matches
    for qid, query_tokens in zip(QUERIES, tokens(list(QUERIES.values())), strict=True):
        if qid == "none":
            continue
        want = lucene.get_scores(query_tokens)
        matched = {pids[j]: want[j] for j in np.flatnonzero(want > 0)}
        assert list(run[qid]) == sorted(matched, key=lambda p: -matched[p])
        np.testing.assert_allclose([run[qid][p] for p in matched], list(matched.values()),
                                   rtol=1e-5)  # fmt: skip
        assert next(iter(run[qid])) == pids[int(np.argmax(okapi.get_scores(query_tokens)))]


def test_paired_t_interval_equals_scipy_paired_t_test_and_bootstrap_brackets_the_mean():
    a, b = [0.61, 0.58, 0.64, 0.60], [0.52, 0.55, 0.50, 0.56]
    got = retrieval.paired_interval(a, b, confidence=0.9)
    want = scipy.stats.ttest_rel(a, b).confidence_interval(confidence_level=0.9)
    assert (got.low, got.high) == pytest.approx((want.low, want.high))
    assert got.mean == pytest.approx(np.mean(a) - np.mean(b))
    rng = np.random.default_rng(0)
    per_query_a, per_query_b = rng.random(200), rng.random(200) * 0.9
    boot = retrieval.paired_interval(per_query_a, per_query_b, method="bootstrap")
    assert boot.low < boot.mean < boot.high
    assert boot == retrieval.paired_interval(per_query_a, per_query_b, method="bootstrap")
    with pytest.raises(ValueError, match="need 2 or more"):
        retrieval.paired_interval([0.5], [0.4])


def test_squad_retrieval_reads_every_question_against_all_paragraphs_merging_repeats(caplog):
    caplog.set_level(logging.INFO)
    data = squad_retrieval.squad_dev_retrieval(DEV)
    # Four paragraphs, 1-0 a whitespace variant of 0-0: three passages.
    assert sorted(data.corpus) == ["0-0", "0-1", "1-1"]
    assert len(data.queries) == 5 and data.queries["q-rhine"] == "Where does the Rhine end?"
    assert data.qrels["q-river-home"] == {"0-1": 1}
    assert data.qrels["q-dup"] == {"0-0": 1}  # asked on the repeat: points at the first
    assert data.qrels["q-rhine"] == {"1-1": 1}
    assert "1 paragraph(s) repeat an earlier one's text" in caplog.text
    # BM25 on it finds each question's paragraph first.
    run = retrieval.bm25_run(data.queries, data.corpus)
    assert retrieval.evaluate(run, data.qrels)["R@1"] == 1.0


def test_squad_reader_names_the_file_and_what_is_missing(tmp_path):
    with open(DEV, encoding="utf-8") as f:
        data = json.load(f)
    del data["data"][1]["paragraphs"][0]["context"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TaskDataError, match=r"bad.json: data\[1\].paragraphs\[0\]: no 'context'"):
        squad_retrieval.squad_dev_retrieval(path)
    path.write_text(json.dumps({"version": "1.1"}))
    with pytest.raises(TaskDataError, match=r"bad.json: top level: no 'data' list"):
        squad_retrieval.squad_dev_retrieval(path)
    path.write_text("{")
    with pytest.raises(TaskDataError, match=r"bad.json:1:2: not valid JSON"):
        squad_retrieval.squad_dev_retrieval(path)


def test_squad_pairs_drop_dev_paragraphs_and_the_tsv_keeps_one_pair_a_line(tmp_path, caplog):
    dev = squad_retrieval.squad_dev_retrieval(DEV)
    caplog.set_level(logging.INFO)
    pairs = squad_retrieval.squad_pairs([TRAIN], exclude_passages=dev.corpus.values())
    # The otter paragraph is the dev one (other line break): its two questions go.
    assert pairs == [("How loud\tis the blender?", "A review:\tthe blender\nis loud but strong.")]
    assert "dropped 1 paragraph(s) (2 question(s))" in caplog.text
    assert len(squad_retrieval.squad_pairs([TRAIN])) == 3
    path = tmp_path / "pairs.tsv"
    assert squad_retrieval.write_pairs_tsv(pairs + [("q", "pos", "neg")], path) == 2
    assert path.read_text(encoding="utf-8").split("\n") == [
        "How loud is the blender?\tA review: the blender is loud but strong.",
        "q\tpos\tneg",
        "",
    ]
    with pytest.raises(ValueError, match="pair 2: .* expected 2 or 3 non-empty texts"):
        squad_retrieval.write_pairs_tsv([("q", "p"), ("q", " \t")], tmp_path / "bad.tsv")


def _cached(call):
    try:
        return call()
    except TaskDataError as e:
        pytest.skip(f"BIG-bench sdist not cached ({e})")


def test_real_squad_dev_is_10565_questions_against_2067_paragraphs_none_in_squadshifts():
    dev_path = _cached(lambda: bigbench.squad_dev(allow_download=False))
    data = squad_retrieval.squad_dev_retrieval(dev_path)
    assert (len(data.queries), len(data.corpus), len(data.qrels)) == (10565, 2067, 10565)
    members = [f"squad_shifts/{shift}.json" for shift in bigbench.SQUAD_SHIFTS]
    shifts = _cached(lambda: bigbench.task_files(members, allow_download=False))
    pairs = squad_retrieval.squad_pairs(shifts, exclude_passages=data.corpus.values())
    assert len(pairs) == 7936 + 10056 + 9767 + 9877  # no SQuADShifts paragraph is a dev one


def test_lee_set_is_50_documents_and_1225_rated_pairs_from_gensims_files():
    from gensim.test.utils import datapath

    assert lee_similarity.gensim_data_dir() == os.path.dirname(datapath("lee.cor"))
    lee = lee_similarity.lee_similarity()
    assert len(lee.documents) == 50 and lee.pairs.shape == (1225, 2) and lee.human.shape == (1225,)
    assert lee.documents[0].startswith("The national executive of the strife-torn Democrats")
    assert np.all(lee.pairs[:, 0] < lee.pairs[:, 1]) and 0 <= lee.human.min() < lee.human.max() <= 1
    matrix = np.loadtxt(datapath("similarities0-1.txt"))
    assert lee.human[0] == matrix[0, 1] and lee.human[-1] == matrix[48, 49]
    # TF-IDF vectors (lower-cased words of 3+ letters, idf log(50 / df)): the correlation
    # by gensim's test's recipe (np.corrcoef of the full cosine matrix's upper triangle).
    # Near LSA's ~0.6, as Lee et al. found for weighted word vectors (Pearson 0.52 here).
    words = [re.findall(r"[a-z]{3,}", doc.lower()) for doc in lee.documents]
    vocab = {w: i for i, w in enumerate(sorted({w for doc in words for w in doc}))}
    counts = np.zeros((50, len(vocab)))
    for i, doc in enumerate(words):
        for word in doc:
            counts[i, vocab[word]] += 1
    tfidf = counts * np.log(50 / (counts > 0).sum(axis=0))
    pearson, spearman = lee_similarity.lee_correlation(tfidf, lee)
    unit = tfidf / np.linalg.norm(tfidf, axis=1, keepdims=True)
    flat = (unit @ unit.T)[np.triu_indices(50, 1)]
    assert pearson == pytest.approx(np.corrcoef(flat, lee.human)[0, 1])
    assert spearman == pytest.approx(scipy.stats.spearmanr(flat, lee.human).statistic)
    assert 0.45 < pearson < 0.6, pearson
