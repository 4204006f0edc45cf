"""TFRecord framing (masked CRC-32C from google-crc32c) and the TensorFlow-free shard writer."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from data_pipelines import tfrecord_files, tfrecord_framing


def _read(path: str) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(path)]


def test_crc32c_known_values():
    # RFC 3720 (iSCSI), appendix B.4, and the usual check value.
    assert tfrecord_framing.crc32c(b"123456789") == 0xE3069283
    assert tfrecord_framing.crc32c(bytes(32)) == 0x8A9136AA
    assert tfrecord_framing.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert tfrecord_framing.crc32c(bytes(range(32))) == 0x46DD794E
    assert tfrecord_framing.crc32c(b"") == 0


def test_masked_crc32c_by_hand():
    # The rotation and delta spelled out on the check value 0xE3069283:
    # c >> 15 = 0x0001C60D and (c << 17) mod 2^32 = 0x25060000, so the rotation is
    # 0x2507C60D; plus 0xA282EAD8 is 0xC78AB0E5.
    assert tfrecord_framing.masked_crc32c(b"123456789") == 0xC78AB0E5
    # A sum past 2^32 wraps: crc(b"a") = 0xC1D04330 rotates to 0x866183A0.
    assert tfrecord_framing.crc32c(b"a") == 0xC1D04330
    assert tfrecord_framing.masked_crc32c(b"a") == 0x866183A0 + 0xA282EAD8 - 2**32
    # crc(b"") = 0 masks to the delta itself.
    assert tfrecord_framing.masked_crc32c(b"") == 0xA282EAD8


def test_framed_records_equal_tensorflow_writer(tmp_path):
    rng = np.random.default_rng(0)
    lengths = [0, 1, 2, 3, 7, 8, 255, 256, 1000, 4097, *rng.integers(0, 3000, 60).tolist()]
    records = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    records += [b"\x00" * 9, b"\xff" * 100]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    with open(path, "rb") as f:
        expected = f.read()
    assert b"".join(tfrecord_framing.frame_records(records)) == expected
    assert tfrecord_framing.frame_records([]) == []


def test_writer_round_robin_atomic_and_readable(tmp_path):
    out = str(tmp_path / "data" / "train.tfrecord")
    records = [b"record%d" % i for i in range(7)]
    writer = tfrecord_files.TFRecordShardWriter(out, num_shards=3)
    writer.write_framed(tfrecord_framing.frame_records(records[:4]))
    writer.write_framed(tfrecord_framing.frame_records(records[4:]))
    assert os.listdir(tmp_path / "data") and not any(
        name.endswith(".tfrecord") for name in os.listdir(tmp_path / "data")
    )
    paths = writer.close()
    assert [os.path.basename(p) for p in paths] == [
        f"train-0000{i}-of-00003.tfrecord" for i in range(3)
    ]
    assert writer.counts == [3, 2, 2] and writer.total == 7
    assert _read(paths[0]) == [b"record0", b"record3", b"record6"]
    assert _read(paths[2]) == [b"record2", b"record5"]
    assert sorted(os.listdir(tmp_path / "data")) == sorted(os.path.basename(p) for p in paths)

    single = str(tmp_path / "one.tfrecord")
    with tfrecord_files.TFRecordShardWriter(single) as writer:
        writer.write_framed(tfrecord_framing.frame_records(records))
    assert _read(single) == records

    # One record at a time, round-robin or to a chosen shard; comma-separated paths (the
    # original --output_file) are taken as they are.
    listed = f"{tmp_path}/a.rec,{tmp_path}/b.rec"
    with tfrecord_files.TFRecordShardWriter(listed) as writer:
        writer.write(b"1")
        writer.write(b"2")
        writer.write(b"3", shard=1)
        writer.write_framed(tfrecord_framing.frame_records([b"4"]))
    assert writer.counts == [2, 2]
    assert _read(f"{tmp_path}/a.rec") == [b"1", b"4"]
    assert _read(f"{tmp_path}/b.rec") == [b"2", b"3"]

    failed = tmp_path / "failed"
    with pytest.raises(RuntimeError):
        with tfrecord_files.TFRecordShardWriter(str(failed / "x.tfrecord")) as writer:
            writer.write_framed(tfrecord_framing.frame_records([b"half"]))
            raise RuntimeError("interrupted")
    assert not failed.exists()  # nor the directory the writer made


def test_writer_unwritable_output(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match="cannot open output"):
        tfrecord_files.TFRecordShardWriter(str(blocker / "out.tfrecord"))
