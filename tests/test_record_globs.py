"""The file pattern a user types (`--config.data.train_files='<dir>/train-*'`) over a directory
that `create_pretraining_data` wrote with several shards: the stats JSON beside the first
shard (`train-00000-of-00004.tfrecord.stats.json`) matches it too and is skipped, by name
and with a log line; any other file that is not records is refused, by name, before a
record is read (issue 46).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import zlib

import numpy as np
import pytest

from data_pipelines import input_pipeline, input_streams, tfrecord_framing
from data_pipelines.create_pretraining_data import Options, create_pretraining_data

T, P = 32, 5
WORDS = "the cat sat on a mat and dog ran to big red house with green door".split()
SHARDS = 4


@pytest.fixture(scope="module")
def records_dir(tmp_path_factory) -> str:
    """`create_pretraining_data --num_output_shards=4` over a tiny corpus."""
    directory = tmp_path_factory.mktemp("records")
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]))
    rng = np.random.default_rng(0)
    documents = [
        "\n".join(" ".join(rng.choice(WORDS, 6)) + " ." for _ in range(4)) for _ in range(16)
    ]
    corpus = directory / "corpus.txt"
    corpus.write_text("\n\n".join(documents) + "\n")
    out = directory / "out"
    create_pretraining_data(
        Options(
            input_file=str(corpus),
            output_file=str(out / "train.tfrecord"),
            vocab_file=str(vocab),
            max_seq_length=T,
            max_predictions_per_seq=P,
            dupe_factor=2,
            num_output_shards=SHARDS,
            show_progress=False,
        )
    )
    return str(out)


def _stats(records_dir) -> dict:
    with open(f"{records_dir}/train-00000-of-00004.tfrecord.stats.json") as f:
        return json.load(f)


def _make(pattern, **overrides):
    kwargs = dict(
        global_batch_size=4,
        max_seq_length=T,
        max_predictions_per_seq=P,
        seed=5,
        process_index=0,
        process_count=1,
        shuffle_buffer=6,
        cycle_length=2,
    )
    return input_pipeline.make_pretraining_dataset(pattern, **(kwargs | overrides))


def test_the_directory_holds_shards_and_a_stats_json_the_pattern_matches(records_dir):
    shards = [f"train-0000{i}-of-00004.tfrecord" for i in range(SHARDS)]
    assert sorted(os.listdir(records_dir)) == sorted(
        shards + ["train-00000-of-00004.tfrecord.stats.json"]
    )
    assert input_pipeline.list_files(f"{records_dir}/train-*") == [
        f"{records_dir}/{name}" for name in shards
    ]


def test_train_glob_reads_every_record_once_per_epoch_and_logs_the_skipped_stats(
    records_dir, caplog
):
    total = _stats(records_dir)["instances"]
    assert total >= 24  # enough for several batches and windows
    with caplog.at_level(logging.INFO):
        data = _make(f"{records_dir}/train-*")
    assert (
        f"input pattern '{records_dir}/train-*': skipped "
        f"{records_dir}/train-00000-of-00004.tfrecord.stats.json "
        "(create_pretraining_data's stats, not records)"
    ) in caplog.messages
    rows = np.concatenate([next(data)["input_ids"] for _ in range(total // 4)])
    assert len({row.tobytes() for row in rows}) == len(rows) == total // 4 * 4
    assert data.position["streams"]["0"] == {"epoch": 0, "batch_in_epoch": total // 4}


def test_record_counts_over_the_train_glob(records_dir, tmp_path):
    stats = _stats(records_dir)
    files = input_pipeline.list_files(f"{records_dir}/train-*")
    expected = dict(zip(stats["output_files"], stats["records_per_file"], strict=True))
    assert input_streams.record_counts(files) == expected
    assert {f: tfrecord_framing.count_records(f) for f in files} == expected
    # Without the stats JSON (a copy of the shards alone) the framing gives the same counts.
    for path in files:
        with open(path, "rb") as f:
            (tmp_path / os.path.basename(path)).write_bytes(f.read())
    copies = input_pipeline.list_files(f"{tmp_path}/train-*")
    assert list(input_streams.record_counts(copies).values()) == stats["records_per_file"]


def test_resume_over_the_train_glob_yields_the_uninterrupted_batches(records_dir):
    pattern = f"{records_dir}/train-*"
    steps = _stats(records_dir)["instances"] // 4
    reference = _make(pattern)
    uninterrupted = [next(reference)["input_ids"] for _ in range(steps + 2)]  # into epoch 1
    run = _make(pattern)
    for _ in range(steps - 2):  # past the first window: resumed by the records counts
        next(run)
    resumed = _make(pattern, start_position=run.position)
    for want in uninterrupted[steps - 2 :]:
        np.testing.assert_array_equal(next(resumed)["input_ids"], want)


def test_a_stray_file_in_the_pattern_is_refused_by_name(records_dir, tmp_path):
    for path in input_pipeline.list_files(f"{records_dir}/train-*"):
        with open(path, "rb") as f:
            (tmp_path / os.path.basename(path)).write_bytes(f.read())
    stray = tmp_path / "train-notes.txt"  # sorts last: no record of it is read at the start
    stray.write_text("notes on the shards\n")
    with pytest.raises(ValueError, match=rf"{stray}: not a TFRecord file .*'{tmp_path}/train-\*'"):
        _make(f"{tmp_path}/train-*")
    # Only our stats JSONs are skipped: the pattern matching nothing else is refused.
    with pytest.raises(FileNotFoundError, match="matches no file but stats JSONs"):
        input_pipeline.list_files(f"{records_dir}/*.json")


def test_check_framing(tmp_path):
    records = b"".join(tfrecord_framing.frame_records([b"one", b"two records"]))
    good = {
        "plain": (records, None),
        "empty": (b"", None),
        "gzip": (gzip.compress(records), "GZIP"),
        "zlib": (zlib.compress(records), "ZLIB"),
    }
    for name, (data, compression) in good.items():
        (tmp_path / name).write_bytes(data)
        tfrecord_framing.check_framing(str(tmp_path / name), compression)
    bad = {
        "stats.json": (b'{"records_per_file": [1, 2]}\n', None, "not a TFRecord file"),
        "short": (records[:5], None, "not a TFRecord file"),
        "cut": (records[:15], None, r"truncated TFRecord file \(its first record needs 19 bytes, "),
        "text.gz": (gzip.compress(b"some text, not records"), "GZIP", "not a GZIP-compressed"),
        "plain.gz": (records, "GZIP", "not a GZIP-compressed TFRecord file"),
    }
    for name, (data, compression, message) in bad.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=f"{tmp_path / name}: {message}"):
            tfrecord_framing.check_framing(str(tmp_path / name), compression)
