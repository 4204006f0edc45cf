"""create_pretraining_data's options on a small Shakespeare file: determinism across worker
counts and mask batch sizes, TensorFlow-free local runs, URLs, dynamic mode, no next sentence,
the original command line, and every kind of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from create_data_fixtures import (
    MAX_SEQ,
    _minilm_vocab,
    _options,
    _read_records,
    _unmasked_ids,
    _write_documents,
)

from data_pipelines import corpora, embedded_corpora, pretraining_records, tokenization
from data_pipelines.create_pretraining_data import create_pretraining_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------------
# Determinism, workers, dynamic mode, the command line.


@pytest.fixture(scope="module")
def small_file(tmp_path_factory) -> str:
    scenes = embedded_corpora.shakespeare_documents(split_sentences=False, max_plays=3)
    documents = list(scenes)[:24]
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
    local = create_pretraining_data(_options(tmp_path / "local", small_file, dupe_factor=1))
    output = f"file://{tmp_path}/url/out.tfrecord"
    stats = create_pretraining_data(
        _options(
            tmp_path,
            small_file,
            dupe_factor=1,
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
