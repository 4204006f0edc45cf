"""Reader errors name what failed (issue 41 item 3): a record cut short or corrupted inside
one file of a glob is reported with that file and the record (tf.data names only a byte
offset: "truncated record at 47107"), and the batch-size refusal names the user's flag.
"""

from __future__ import annotations

import gzip
import os
import re

import protobuf_records
import pytest
import tensorflow as tf

from data_pipelines import input_pipeline, input_streams, tfrecord_framing

T, P = 16, 4
RECORDS = 10  # per file


def _record(uid: int) -> bytes:
    example = {
        "input_ids": [101, uid, 7, 102, 9, 102],
        "segment_ids": [0, 0, 0, 0, 1, 1],
        "next_sentence_label": uid % 2,
        "masked_lm_positions": [2],
        "masked_lm_ids": [7],
    }
    return protobuf_records.serialize_masked(example, max_seq_length=T, max_predictions_per_seq=P)


def _write(directory, compress: bool = False) -> list[bytes]:
    """Files a.tfrecord and b.tfrecord of RECORDS records each; returns their framed records."""
    framed = []
    for f, name in enumerate("ab"):
        records = tfrecord_framing.frame_records(
            [_record(10 + f * 100 + i) for i in range(RECORDS)]
        )
        data = b"".join(records)
        with open(os.path.join(directory, f"{name}.tfrecord"), "wb") as out:
            out.write(gzip.compress(data) if compress else data)
        framed.append(records)
    return framed


def _make(pattern, **overrides):
    kwargs = dict(
        global_batch_size=4,
        max_seq_length=T,
        max_predictions_per_seq=P,
        seed=3,
        process_index=0,
        process_count=1,
        shuffle_buffer=4,
        cycle_length=2,
    )
    return input_pipeline.make_pretraining_dataset(pattern, **(kwargs | overrides))


def _read_until_error(data) -> input_streams.DamagedRecordError:
    with pytest.raises(input_streams.DamagedRecordError) as caught:
        for _ in range(2 * RECORDS // 4):  # one epoch
            next(data)
    return caught.value


@pytest.mark.parametrize("damaged", ["a", "b"])
@pytest.mark.parametrize("damage", ["truncated", "corrupted data", "corrupted length"])
def test_a_damaged_record_is_named_by_file_and_record(tmp_path, damaged, damage):
    framed = _write(tmp_path)  # equal layouts: tf.data's offset fits either file
    path = tmp_path / f"{damaged}.tfrecord"
    records = framed["ab".index(damaged)]
    start = sum(len(r) for r in records[:7])  # record 7's first byte
    data = bytearray(path.read_bytes())
    if damage == "truncated":  # the file cut inside its last record
        start = sum(len(r) for r in records[:-1])
        data = data[: start + 20]
        expected = (
            rf"record 9 \(byte {start}\) is truncated: it needs {len(records[-1])} bytes, the "
            r"file ends 20 bytes after its start"
        )
    elif damage == "corrupted data":
        data[start + 30] ^= 0x40
        expected = rf"record 7 \(byte {start}\) is corrupted: its data's CRC does not match"
    else:
        data[start + 1] ^= 0x40
        expected = rf"record 7 \(byte {start}\) is corrupted: its length's CRC does not match"
    path.write_bytes(bytes(data))
    error = _read_until_error(_make(f"{tmp_path}/*.tfrecord"))
    assert re.match(rf"{path}: {expected} \(tf.data: {damage.split()[0]} record at \d+", str(error))
    assert error.path == str(path)
    assert isinstance(error, tf.errors.DataLossError)  # still what callers catch


def test_a_damaged_record_in_a_compressed_file_is_named_by_file(tmp_path):
    framed = _write(tmp_path, compress=True)
    path = tmp_path / "b.tfrecord"
    with gzip.open(path) as f:
        data = f.read()
    path.write_bytes(gzip.compress(data[:-30]))  # the last record cut short
    error = _read_until_error(_make(f"{tmp_path}/*.tfrecord", compression="GZIP"))
    start = len(data) - len(framed[1][-1])
    assert str(error).startswith(
        f"{path}: the record at byte {start} of its decompressed bytes is damaged "
        f"(tf.data: truncated record at {start}"
    )
    assert error.path == str(path)


def test_find_damage_walks_the_framing_to_the_offset(tmp_path):
    records = tfrecord_framing.frame_records([_record(i) for i in range(4)])
    path = tmp_path / "x.tfrecord"
    path.write_bytes(b"".join(records))
    starts = [sum(len(r) for r in records[:i]) for i in range(4)]
    # A healthy file: nothing damaged at any record's start, data or in between.
    for offset in (0, 12, starts[2], starts[2] + 12, starts[2] + 5, starts[3] + 100):
        assert tfrecord_framing.find_damage(str(path), offset) is None


def test_batch_size_refusal_names_the_flag_its_value_and_what_fits(tmp_path):
    _write(tmp_path)
    with pytest.raises(ValueError) as caught:
        _make(f"{tmp_path}/*.tfrecord", global_batch_size=48, process_count=2, process_index=1)
    message = str(caught.value)
    assert message.startswith(
        "--config.global_batch_size=48 takes 24 records per batch from each of the 2 data "
        "streams, but stream 1 has 10 records in its 1 files, fewer than its share of a batch "
        "(24): set --config.global_batch_size to at most 20 (a multiple of 2), or write more "
        "records: ["
    ), message
    assert "stream_batch" not in message
    with pytest.raises(ValueError, match=r"^--config.global_batch_size 5 is not a positive "):
        _make(f"{tmp_path}/*.tfrecord", global_batch_size=5, process_count=2)
