"""create_pretraining_data end to end on real corpora: the records' invariants and statistics
on >= 100k tokens of Shakespeare, whole-word masking with the People's Daily segmentation, and
build_vocab. Determinism, workers, dynamic mode, the command line and bad input are in
test_create_pretraining_data_options.py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from create_data_fixtures import (
    MAX_PRED,
    MAX_SEQ,
    _minilm_vocab,
    _options,
    _read_records,
    _unmasked_ids,
)

from data_pipelines import build_vocab, prepare_corpus, tokenization
from data_pipelines.create_pretraining_data import create_pretraining_data

# ------------------------------------------------------------------------------------------
# >= 100k tokens of Shakespeare, built once for the module.


@pytest.fixture(scope="module")
def shakespeare_file(tmp_path_factory) -> str:
    documents = prepare_corpus.corpus_documents("shakespeare", limit=5)
    path = tmp_path_factory.mktemp("corpus") / "shakespeare.txt"
    prepare_corpus.write_corpus(documents, str(path), show_progress=False)
    return str(path)


@pytest.fixture(scope="module")
def shakespeare_run(shakespeare_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    # 8 passes: ~10k coin-flip pairs, so +-2 points of NSP balance is 4 standard deviations.
    options = _options(
        out, shakespeare_file, dupe_factor=8, num_output_shards=2, documents_per_chunk=64
    )
    stats = create_pretraining_data(options)
    return stats, _read_records(stats["output_files"]), out


def test_shakespeare_records_are_well_formed(shakespeare_run):
    stats, records, _ = shakespeare_run
    tok = tokenization.load_tokenizer(_minilm_vocab())
    assert stats["tokens"] >= 100_000
    n = len(records["input_ids"])
    assert n == stats["instances"] == sum(stats["records_per_file"])
    assert min(stats["records_per_file"]) >= n // 2  # round-robin over the 2 shards
    ids = _unmasked_ids(records)
    lengths = records["input_mask"].sum(1)
    assert lengths.max() <= MAX_SEQ and lengths.min() >= 5
    positions = np.arange(MAX_SEQ)[None, :]
    # input_mask: ones then zeros; padding is zero everywhere.
    assert np.array_equal(records["input_mask"], (positions < lengths[:, None]).astype(int))
    assert not ids[positions >= lengths[:, None]].any()
    assert not records["segment_ids"][positions >= lengths[:, None]].any()
    assert (ids[:, 0] == tok.cls_id).all() and ((ids == tok.cls_id).sum(1) == 1).all()
    is_sep = ids == tok.sep_id
    assert (is_sep.sum(1) == 2).all()
    assert (ids[np.arange(n), lengths - 1] == tok.sep_id).all()
    first_sep = is_sep.argmax(1)
    # segment_ids: 0 through the first [SEP], 1 from there through the last [SEP].
    expected_segments = (positions > first_sep[:, None]) & (positions < lengths[:, None])
    assert np.array_equal(records["segment_ids"], expected_segments.astype(int))
    assert (first_sep >= 2).all() and (lengths - first_sep >= 3).all()  # A and B not empty


def test_shakespeare_masking_statistics(shakespeare_run):
    stats, records, _ = shakespeare_run
    tok = tokenization.load_tokenizer(_minilm_vocab())
    real = records["masked_lm_weights"] > 0
    eligible = int((records["input_mask"].sum(1) - 3).sum())
    masked = int(real.sum())
    assert abs(masked / eligible - 0.15) <= 0.005
    ids = _unmasked_ids(records)
    labels = records["masked_lm_ids"][real]
    # No special token is ever masked (nor padding).
    special = {tok.cls_id, tok.sep_id, tok.pad_id}
    assert not set(np.unique(labels).tolist()) & special
    rows = np.arange(len(ids))[:, None].repeat(MAX_PRED, 1)[real]
    placed = records["input_ids"][rows, records["masked_lm_positions"][real]]
    assert np.array_equal(ids[rows, records["masked_lm_positions"][real]], labels)
    mask_share = float(np.mean(placed == tok.mask_id))
    same_share = float(np.mean(placed == labels))
    random_share = 1 - mask_share - same_share
    assert abs(mask_share - 0.8) <= 0.015
    assert abs(same_share - 0.1) <= 0.015
    assert abs(random_share - 0.1) <= 0.015
    # Positions ascend, then zero padding with weight 0.
    for row in range(200):
        k = int(real[row].sum())
        assert list(records["masked_lm_positions"][row, :k]) == sorted(
            records["masked_lm_positions"][row, :k]
        )
        assert not records["masked_lm_positions"][row, k:].any()
    # The stats JSON says the same.
    masking = stats["masking"]
    assert masking["masked_tokens"] == masked and masking["eligible_tokens"] == eligible
    assert masking["mask_token"] == int((placed == tok.mask_id).sum())


def test_shakespeare_nsp_balance(shakespeare_run):
    stats, records, _ = shakespeare_run
    labels = records["next_sentence_labels"][:, 0]
    nsp = stats["nsp"]
    assert nsp["random_next"] == int(labels.sum())
    # Pairs of one accumulated sentence must take a random B (document ends, long
    # sentences), as in the original; every other pair is a fair coin flip.
    assert 0 < nsp["forced_random_next"] < 0.15 * len(labels)
    coin_flips = len(labels) - nsp["forced_random_next"]
    positives = len(labels) - int(labels.sum())
    assert abs(positives / coin_flips - 0.5) <= 0.02
    assert 0.40 < positives / len(labels) < 0.5


def test_stats_json_is_written_next_to_the_output(shakespeare_run):
    stats, _, out = shakespeare_run
    with open(stats["output_files"][0] + ".stats.json") as f:
        on_disk = json.load(f)
    assert on_disk == json.loads(json.dumps(stats))
    assert on_disk["inputs"]["files"] == 1 and on_disk["documents"] > 50
    assert on_disk["truncation"]["instances"] > 0
    assert on_disk["timing"]["seconds"] > 0
    # Only the shards and the stats: no temporary file left behind.
    assert sorted(os.listdir(out)) == sorted(
        [os.path.basename(p) for p in stats["output_files"]]
        + [os.path.basename(stats["output_files"][0]) + ".stats.json"]
    )


# ------------------------------------------------------------------------------------------
# Chinese: whole-word masking by the corpus' word boundaries; build_vocab.


@pytest.fixture(scope="module")
def peoples_daily(tmp_path_factory):
    root = tmp_path_factory.mktemp("pd")
    text = str(root / "pd.txt")
    prepare_corpus.write_corpus(
        prepare_corpus.corpus_documents("peoples_daily", limit=800), text, show_progress=False
    )
    vocab = str(root / "vocab.txt")
    build_vocab.build_vocab(text, vocab, vocab_size=4000, do_lower_case=False)
    return text, vocab


@pytest.mark.extended  # a 4,000-piece vocabulary and two corpora of records: 22 s; CI runs it
def test_chinese_whole_word_masking_follows_the_segmentation(peoples_daily, tmp_path):
    text, vocab = peoples_daily
    common = dict(
        vocab_file=vocab,
        do_lower_case=False,
        word_boundary_files=True,
        do_whole_word_mask=True,
        random_seed=5,
    )
    (tmp_path / "s").mkdir()
    (tmp_path / "d").mkdir()
    static = create_pretraining_data(_options(tmp_path / "s", text, **common))
    dynamic = create_pretraining_data(_options(tmp_path / "d", text, masking="dynamic", **common))
    masked = _read_records(static["output_files"])
    plain = _read_records(dynamic["output_files"], dynamic=True)
    # The same instances in the same order: masking never touches the pairing.
    assert np.array_equal(_unmasked_ids(masked), plain["input_ids"])
    tok = tokenization.load_tokenizer(vocab, do_lower_case=False)
    assert np.mean(plain["input_ids"][plain["input_mask"] > 0] == tok.unk_id) < 0.01
    multi_char_units = 0
    for row in range(len(plain["input_ids"])):
        n = int(plain["input_mask"][row].sum())
        starts = plain["word_starts"][row, :n].copy()
        special = np.isin(plain["input_ids"][row, :n], [tok.cls_id, tok.sep_id])
        unit = np.cumsum(starts | special)  # unit id of every token
        k = int(masked["masked_lm_weights"][row].sum())
        chosen = set(masked["masked_lm_positions"][row, :k].tolist())
        for u in {int(unit[p]) for p in chosen}:
            members = set(np.flatnonzero(unit == u).tolist())
            assert members <= chosen, (row, u)  # a word is masked whole or not at all
            multi_char_units += len(members) > 1
    assert multi_char_units > 100
    # The segmentation makes most Chinese words longer than one character piece.
    real = plain["input_mask"] > 0
    assert plain["word_starts"][real].mean() < 0.8


def test_build_vocab_wordpiece_and_sentencepiece(shakespeare_file, tmp_path):
    vocab = str(tmp_path / "vocab.txt")
    counts = build_vocab.build_vocab(
        shakespeare_file, vocab, vocab_size=3000, do_lower_case=True, num_unused=3
    )
    assert counts["vocab_size"] == 3000
    with open(vocab, encoding="utf-8") as f:
        head = f.read().split("\n")[:8]
    assert head == [
        "[PAD]",
        "[unused0]",
        "[unused1]",
        "[unused2]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
    ]
    tok = tokenization.load_tokenizer(vocab)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 4, 5, 6, 7)
    pieces = tok.tokenize("To be, or not to be: that is the question.")
    assert tok.unk_id not in tok.convert_tokens_to_ids(pieces) and len(pieces) <= 14

    model = str(tmp_path / "sp.model")
    build_vocab.build_vocab(
        shakespeare_file, model, vocab_size=2000, do_lower_case=True, model_type="sentencepiece"
    )
    sp = tokenization.load_tokenizer(model)
    assert sp.vocab_size == 2000 and (sp.pad_id, sp.unk_id) == (0, 1)
    assert {sp.cls_id, sp.sep_id, sp.mask_id} == {2, 3, 4}
    ids = sp.encode("Now is the winter of our discontent")
    assert ids and sp.unk_id not in ids
    # The sentencepiece model drives the whole pipeline too.
    stats = create_pretraining_data(
        _options(
            tmp_path,
            shakespeare_file,
            vocab_file=model,
            documents_per_chunk=40,
            do_whole_word_mask=True,
        )
    )
    assert stats["instances"] > 1000 and abs(stats["masking"]["masked_fraction"] - 0.15) < 0.01
