"""Contrastive pretraining on raw text (issue 81): the pair rules (Contriever's independent
crops, sentence -> the rest of its passage), batches that are a function of the step, a run
that resumes after SIGTERM where it stopped and ends where an uninterrupted run ends, BM25
fusion, and the one-line refusals of bad input."""

from __future__ import annotations

import json
import os
import re
import signal

os.environ.setdefault("USE_TF", "0")

import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params

from bert_jax import config_bounds, convert, retrieval
from bert_jax.config import ConfigError
from data_pipelines import crop_pairs
from data_pipelines.tasks.formats import TaskDataError
from data_pipelines.tokenization import load_tokenizer
from experiments import finetune_embeddings
from experiments.configs import embeddings_contrastive_pretraining as contrastive_pretraining

SENTENCES = [
    "The river runs past the old mill and under the stone bridge.",
    "Farmers bring grain to the mill every autumn.",
    "A violin maker lives in the house beside the harbour.",
    "Her instruments are played in orchestras across the country.",
    "The desert town has one well and a market on Sundays.",
    "Traders cross the dunes with salt and dates.",
    "Winter closes the mountain pass for four months.",
    "The castle on the hill was built to guard that pass.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(minilm_vocab(), do_lower_case=True)


def _corpus(path, documents=12):
    """`documents` documents of 4 sentences each, drawn in turn from SENTENCES."""
    lines = []
    for d in range(documents):
        lines += [SENTENCES[(2 * d + i) % len(SENTENCES)] for i in range(4)] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _is_span(needle: np.ndarray, hay: np.ndarray) -> bool:
    n = len(needle)
    return any(np.array_equal(hay[i : i + n], needle) for i in range(len(hay) - n + 1))


def test_crops_are_independent_spans_of_the_configured_share(tokenizer):
    sentences = [np.asarray(ids, np.int32) for ids in tokenizer.encode_batch(SENTENCES[:4])]
    pieces = np.concatenate(sentences)
    rules = crop_pairs.PairRules(crop_min_ratio=0.2, crop_max_ratio=0.4, sentence_fraction=0.0)
    shares, same_start = [], 0
    for seed in range(200):
        query, positive, rule = crop_pairs.make_pair(np.random.default_rng(seed), sentences, rules)
        assert rule == "crop"
        for crop in (query, positive):
            assert _is_span(crop, pieces)  # contiguous: no deletion configured
            shares.append(len(crop) / len(pieces))
        same_start += np.array_equal(query[:3], positive[:3])
    assert 0.2 - 1 / len(pieces) <= min(shares) and max(shares) <= 0.4 + 1 / len(pieces)
    assert min(shares) < 0.25 and max(shares) > 0.35  # the whole range is drawn
    assert same_start < 40  # two crops of one draw are placed independently


def test_deletion_drops_about_its_share_and_never_empties_a_crop(tokenizer):
    sentences = [np.asarray(ids, np.int32) for ids in tokenizer.encode_batch(SENTENCES)]
    rules = crop_pairs.PairRules(0.5, 0.5, token_deletion=0.3, sentence_fraction=0.0)
    full = round(0.5 * sum(map(len, sentences)))
    kept = [len(crop_pairs.make_pair(np.random.default_rng(s), sentences, rules)[0])
            for s in range(300)]  # fmt: skip
    assert min(kept) >= 1
    assert abs(np.mean(kept) / full - 0.7) < 0.05


def test_the_sentence_rule_takes_one_sentence_out_of_its_passage(tokenizer):
    sentences = [np.asarray(ids, np.int32) for ids in tokenizer.encode_batch(SENTENCES[:4])]
    rules = crop_pairs.PairRules(sentence_fraction=1.0, keep_sentence=0.0)
    for seed in range(20):
        query, positive, rule = crop_pairs.make_pair(np.random.default_rng(seed), sentences, rules)
        assert rule == "sentence"
        i = next(i for i, s in enumerate(sentences) if np.array_equal(s, query))
        rest = np.concatenate([s for j, s in enumerate(sentences) if j != i])
        np.testing.assert_array_equal(positive, rest)
    kept = crop_pairs.PairRules(sentence_fraction=1.0, keep_sentence=1.0)
    _, positive, _ = crop_pairs.make_pair(np.random.default_rng(0), sentences, kept)
    np.testing.assert_array_equal(positive, np.concatenate(sentences))


def test_a_batch_is_a_function_of_the_step_and_an_epoch_sees_every_passage(tokenizer, tmp_path):
    documents = crop_pairs.read_documents(_corpus(tmp_path / "corpus.txt"))
    passages = crop_pairs.make_passages(documents, tokenizer, 30)
    assert all(sum(map(len, p)) <= 30 for p in passages.sentences)

    def stream():
        return crop_pairs.PairStream(passages, tokenizer, crop_pairs.PairRules(), 4, 16, 32, 3)

    a, b = stream(), stream()
    later = [b.batch(s) for s in (5, 2)]  # another order of calls, another instance
    for step, other in zip((5, 2), later, strict=True):
        mine = a.batch(step)
        assert mine.keys() == other.keys()
        for key in mine:
            np.testing.assert_array_equal(mine[key], other[key])
    epoch = np.concatenate([a.passage_ids(s) for s in range(a.per_epoch)])
    assert len(set(epoch.tolist())) == len(epoch) == a.per_epoch * 4
    batch = a.batch(0)
    assert batch["query_tokens"].shape[1] <= 16 and batch["positive_tokens"].shape[1] <= 32
    assert (batch["query_tokens"][:, 0] == tokenizer.cls_id).all()
    lengths = batch["query_mask"].sum(1)
    assert all(batch["query_tokens"][i, n - 1] == tokenizer.sep_id for i, n in enumerate(lengths))


def test_documents_share_a_batch_k_passages_each(tokenizer, tmp_path):
    documents = crop_pairs.read_documents(_corpus(tmp_path / "corpus.txt", documents=12))
    passages = crop_pairs.make_passages(documents, tokenizer, 14)  # a sentence a passage
    assert len(passages) == 48 and passages.documents[:5] == [0, 0, 0, 0, 1]
    rules = crop_pairs.PairRules(passages_per_document=4)
    stream = crop_pairs.PairStream(passages, tokenizer, rules, 8, 16, 16, 0)
    seen = []
    for step in range(stream.per_epoch):
        ids = stream.passage_ids(step)
        docs = [passages.documents[i] for i in ids]
        assert docs[:4] == [docs[0]] * 4 and docs[4:] == [docs[4]] * 4 and docs[0] != docs[4]
        assert len(set(ids.tolist())) == 8
        seen += [docs[0], docs[4]]
    assert sorted(seen) == list(range(12))  # an epoch: every document once
    np.testing.assert_array_equal(stream.passage_ids(1), stream.passage_ids(1))
    with pytest.raises(ValueError, match="passages_per_document=3 does not divide"):
        crop_pairs.PairStream(passages, tokenizer, crop_pairs.PairRules(passages_per_document=3),
                              8, 16, 16, 0)  # fmt: skip
    with pytest.raises(ValueError, match="0 documents hold 5\\+ passages, fewer than the 2"):
        crop_pairs.PairStream(passages, tokenizer, crop_pairs.PairRules(passages_per_document=5),
                              10, 16, 16, 0)  # fmt: skip


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("crop_min_ratio", 0.0, r"crop_min_ratio=0.0 is outside its range: a number in \(0, 1\]"),
        ("crop_max_ratio", 1.5, "crop_max_ratio=1.5"),
        ("crop_min_ratio", 0.6, "crop_min_ratio=0.6 > --config.crop_max_ratio=0.5"),
        ("token_deletion", 0.95, "token_deletion=0.95"),
        ("query_max_seq_length", 512, "query_max_seq_length=512 > --config.max_seq_length=128"),
    ],
)
def test_bad_keys_are_one_line_naming_the_key(key, value, message):
    config = contrastive_pretraining.get_config()
    config.corpus_files = "corpus.txt"
    config[key] = value
    with pytest.raises(ConfigError, match=message):
        config_bounds.check(config, "finetune", devices=8)
    rules = {k: config[k] for k in ("crop_min_ratio", "crop_max_ratio", "token_deletion")}
    if key in rules:
        with pytest.raises(ValueError, match=re.escape(f"--config.{key}={value}")):
            crop_pairs.PairRules(**rules).check()


def test_a_corpus_too_short_for_the_batch_and_bad_text_are_named(tokenizer, tmp_path):
    short = _corpus(tmp_path / "short.txt", documents=2)
    passages = crop_pairs.make_passages(crop_pairs.read_documents(short), tokenizer, 126)
    with pytest.raises(ValueError, match=r"short.txt.*2 passages .* --config.global_batch_size=8"):
        crop_pairs.PairStream(passages, tokenizer, crop_pairs.PairRules(), 8, 64, 128, 0,
                              source=str(short))  # fmt: skip
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("A good line.\nCaf\xe9 au lait.\n".encode("latin-1"))
    with pytest.raises(TaskDataError, match=r"latin1.txt:2: not UTF-8"):
        crop_pairs.read_documents(bad)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(TaskDataError, match="empty.txt: no text"):
        crop_pairs.read_documents(empty)
    bom = tmp_path / "bom.txt"
    bom.write_bytes("\ufeffFirst sentence here.\n".encode())
    assert crop_pairs.read_documents(bom) == [["First sentence here."]]


# ----------------------------------------------------------------------------- the run


def _config(root, steps, **extra):
    hf = root / "hf"
    if not hf.exists():
        convert.save_hf(hf, TINY, pretrained_params(), vocab_file=minilm_vocab(),
                        do_lower_case=True)  # fmt: skip
    config = contrastive_pretraining.get_config()
    config.init_from = str(hf)
    config.corpus_files = str(_corpus(root / "corpus.txt", documents=24))
    config.global_batch_size = 8
    config.chunk_size = 4
    config.num_train_steps = steps
    config.learning_rate = 2e-3
    config.optimizer = "adamw"  # BERT's, whose small first steps this rate was set for
    # One shape of batch (passages of 14 pieces and their crops): one compilation a run.
    config.max_seq_length = 16
    config.query_max_seq_length = 16
    config.log_every = 2
    config.checkpoint_every = 0
    config.passages_per_document = 2  # documents of 4 one-sentence passages
    for key, value in extra.items():
        config[key] = value
    config_bounds.check(config, "finetune", devices=8)
    return config


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpt")
    workdir = root / "straight"
    finetune_embeddings.run(_config(root, 6), str(workdir))
    return root, workdir


def test_pairs_from_raw_text_train_and_save_an_embedding_model(uninterrupted):
    _, workdir = uninterrupted
    log = [json.loads(line) for line in (workdir / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [2, 4, 6]
    assert log[-1]["loss"] < log[0]["loss"]
    assert all(r["steps_per_second"] > 0 for r in log)
    metrics = json.loads((workdir / "metrics.json").read_text())
    assert metrics["train_passages"] >= 8 and "train_pairs" not in metrics
    saved = json.loads((workdir / "checkpoint" / "finetuned.json").read_text())
    assert saved["objective"] == "contrastive_pretraining"
    assert not (workdir / "state").exists()  # a finished run keeps no resume point


@pytest.mark.extended  # four short runs
def test_a_run_stopped_by_sigterm_saves_and_resumes_to_the_same_model(uninterrupted, monkeypatch):
    root, straight = uninterrupted
    workdir = root / "stopped"
    config = _config(root, 6)
    real = finetune_embeddings.CorpusPairs.batch

    def batch_then_term(self, step, *rows):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # noted; the step finishes, then it saves
        return real(self, step, *rows)

    monkeypatch.setattr(finetune_embeddings.CorpusPairs, "batch", batch_then_term)
    from bert_jax.finetune_common import Stopped

    with pytest.raises(Stopped) as stopped:
        finetune_embeddings.run(config, str(workdir))
    assert "at step 3 of 6" in stopped.value.outcome and "resume" in stopped.value.outcome
    assert (workdir / "state").is_dir() and not (workdir / "checkpoint").exists()
    monkeypatch.setattr(finetune_embeddings.CorpusPairs, "batch", real)
    finetune_embeddings.run(config, str(workdir))
    from bert_jax.finetune_common import load_finetuned

    _, want, _, _ = load_finetuned(str(straight / "checkpoint"))
    _, got, _, _ = load_finetuned(str(workdir / "checkpoint"))
    import jax

    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(a, b)
    steps = [json.loads(line)["step"] for line in (workdir / "train_log.jsonl").open()]
    assert steps == [2, 4, 6]  # the resumed run appends where the stopped one left off

    # A stopped run's workdir belongs to its config: another one is refused by name.
    monkeypatch.setattr(finetune_embeddings.CorpusPairs, "batch", batch_then_term)
    with pytest.raises(Stopped):
        finetune_embeddings.run(config, str(root / "third"))
    monkeypatch.setattr(finetune_embeddings.CorpusPairs, "batch", real)
    other = _config(root, 6, learning_rate=1e-3)
    with pytest.raises(ConfigError, match=r"another config: learning_rate=0.002 \(now 0.001\)"):
        finetune_embeddings.run(other, str(root / "third"))


def test_a_pairs_file_and_a_corpus_together_are_refused(tmp_path):
    config = contrastive_pretraining.get_config()
    config.corpus_files, config.train_file = "a.txt", "pairs.tsv"
    with pytest.raises(ConfigError, match="train_file and --config.corpus_files both set"):
        config_bounds.check(config, "finetune", devices=8)


# ----------------------------------------------------------------------------- fusion

DENSE = {"q1": {"a": 0.9, "b": 0.8, "c": 0.1}, "q2": {"c": 0.5, "a": 0.4}}
BM25 = {"q1": {"c": 12.0, "b": 11.0}, "q2": {"a": 30.0, "d": 3.0}}


def test_reciprocal_rank_fusion_sums_one_over_k_plus_rank():
    fused = retrieval.fuse_rrf([DENSE, BM25], k=60)
    assert fused["q1"]["b"] == pytest.approx(1 / 62 + 1 / 62)
    assert fused["q1"]["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert fused["q1"]["a"] == pytest.approx(1 / 61)
    assert list(fused["q1"]) == ["c", "b", "a"]  # first + third beats second twice
    assert list(fused["q2"]) == ["a", "c", "d"]


def test_score_interpolation_normalises_each_run_per_query():
    fused = retrieval.fuse_scores(DENSE, BM25, weight=0.5)
    # q1 dense: a 1, b 0.875, c 0; bm25: c 1, b 0 (a absent: 0)
    assert fused["q1"] == pytest.approx({"a": 0.5, "b": 0.4375, "c": 0.5})
    assert retrieval.fuse_scores(DENSE, BM25, 1.0)["q2"] == {"c": 1.0, "a": 0.0, "d": 0.0}
    # Unnormalised, BM25's scale would decide alone; normalised, weight 0 is BM25's order.
    assert retrieval.fuse_scores(DENSE, BM25, 0.0)["q2"] == {"a": 1.0, "c": 0.0, "d": 0.0}
    with pytest.raises(ValueError, match=r"weight=1.5; the first run's share, in \[0, 1\]"):
        retrieval.fuse_scores(DENSE, BM25, 1.5)


def test_per_query_scores_average_to_evaluate():
    qrels = {"q1": {"b": 1}, "q2": {"d": 1}, "q3": {"a": 1}}
    values = retrieval.per_query(DENSE, qrels)
    assert values["q3"] == 0.0 and values["q2"] == 0.0
    assert values["q1"] == pytest.approx(1 / np.log2(3))
    assert np.mean(list(values.values())) == pytest.approx(
        retrieval.evaluate(DENSE, qrels)["nDCG@10"]
    )
