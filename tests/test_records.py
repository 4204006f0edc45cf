"""The record writer gives protobuf's bytes exactly; the schema gives the original's spec."""

from __future__ import annotations

import numpy as np
import protobuf_records
import pytest
import tensorflow as tf

from data_pipelines import records


def _protobuf(int64_rows: dict, float_rows: dict) -> bytes:
    example = tf.train.Example()
    features = example.features.feature
    for name, values in int64_rows.items():
        features[name].int64_list.value.extend(int(v) for v in values)
    for name, values in float_rows.items():
        features[name].float_list.value.extend(float(v) for v in values)
    return example.SerializeToString(deterministic=True)


def test_bytes_equal_protobuf_on_every_varint_width():
    rng = np.random.default_rng(0)
    n = 64
    # Values of every varint size (1..10 bytes), negatives (10-byte two's complement) and 0.
    wide = rng.integers(0, 2**63 - 1, (n, 9), dtype=np.int64) >> rng.integers(0, 63, (n, 9))
    wide[:, 0] = -rng.integers(1, 2**40, n)
    wide[:, 1] = 0
    ints = {
        "ids": rng.integers(0, 30522, (n, 37)),
        "wide": wide,
        "flag": rng.integers(0, 2, (n, 1)),
        "a_very_long_feature_name_to_check_key_headers": rng.integers(0, 200, (n, 3)),
    }
    floats = {"weights": rng.standard_normal((n, 5)).astype(np.float32)}
    encoded = records.encode_examples(ints, floats)
    assert len(encoded) == n
    for row in range(n):
        expected = _protobuf(
            {k: v[row] for k, v in ints.items()}, {k: v[row] for k, v in floats.items()}
        )
        assert encoded[row] == expected, row


def test_bytes_equal_the_protobuf_serialisers():
    rng = np.random.default_rng(1)
    n, seq, pred = 16, 32, 5
    lengths = rng.integers(5, seq + 1, n)
    ids = rng.integers(1, 30000, (n, seq)) * (np.arange(seq) < lengths[:, None])
    mask = (np.arange(seq) < lengths[:, None]).astype(int)
    segments = rng.integers(0, 2, (n, seq)) * mask
    starts = rng.integers(0, 2, (n, seq)) * mask
    positions = np.sort(rng.integers(1, 5, (n, pred)), 1)
    labels = rng.integers(1, 30000, (n, pred))
    weights = np.ones((n, pred), np.float32)
    weights[:, 3:] = 0
    positions[:, 3:] = labels[:, 3:] = 0
    nsp = rng.integers(0, 2, (n, 1))
    masked = records.encode(
        records.MASKED,
        {
            "input_ids": ids,
            "input_mask": mask,
            "segment_ids": segments,
            "masked_lm_positions": positions,
            "masked_lm_ids": labels,
            "masked_lm_weights": weights,
            "next_sentence_labels": nsp,
        },
    )
    unmasked = records.encode(
        records.UNMASKED,
        {
            "input_ids": ids,
            "input_mask": mask,
            "segment_ids": segments,
            "word_starts": starts,
            "next_sentence_labels": nsp,
        },
    )
    for r in range(n):
        length = lengths[r]
        assert masked[r] == protobuf_records.serialize_masked(
            {
                "input_ids": ids[r, :length],
                "segment_ids": segments[r, :length],
                "masked_lm_positions": positions[r, :3],
                "masked_lm_ids": labels[r, :3],
                "next_sentence_labels": nsp[r],
            },
            max_seq_length=seq,
            max_predictions_per_seq=pred,
        )
        assert unmasked[r] == protobuf_records.serialize_unmasked(
            {
                "input_ids": ids[r, :length],
                "segment_ids": segments[r, :length],
                "word_starts": starts[r, :length],
                "next_sentence_labels": nsp[r],
            },
            max_seq_length=seq,
        )


def test_bad_shapes_are_rejected():
    assert records.encode_examples({"a": np.zeros((0, 3))}) == []
    with pytest.raises(ValueError, match="different numbers of rows"):
        records.encode_examples({"a": np.zeros((2, 3)), "b": np.zeros((3, 3))})
    with pytest.raises(ValueError, match=r"\(N, L\)"):
        records.encode_examples({"a": np.zeros(3)})
    with pytest.raises(ValueError, match="both"):
        records.encode_examples({"a": np.zeros((1, 1))}, {"a": np.zeros((1, 1))})


def test_encode_checks_the_schema():
    n, seq = 2, 8
    unmasked = {
        "input_ids": np.ones((n, seq), int),
        "input_mask": np.ones((n, seq), int),
        "segment_ids": np.zeros((n, seq), int),
        "word_starts": np.ones((n, seq), int),
        "next_sentence_labels": np.zeros((n, 1), int),
    }
    assert len(records.encode(records.UNMASKED, unmasked)) == n
    with pytest.raises(ValueError, match=r"unknown \['masked_lm_ids'\], missing \['word_starts'\]"):
        records.encode(
            records.UNMASKED,
            {**{k: v for k, v in unmasked.items() if k != "word_starts"}, "masked_lm_ids": 0},
        )
    with pytest.raises(ValueError, match="'segment_ids' has 7 values per record, not 8"):
        records.encode(records.UNMASKED, {**unmasked, "segment_ids": np.zeros((n, 7), int)})
    with pytest.raises(ValueError, match="'next_sentence_labels' has 2 values per record, not 1"):
        records.encode(
            records.UNMASKED, {**unmasked, "next_sentence_labels": np.zeros((n, 2), int)}
        )
    with pytest.raises(ValueError, match=r"must be an \(N, L\) array"):
        records.encode(records.UNMASKED, {**unmasked, "input_ids": np.ones(seq, int)})
    with pytest.raises(ValueError, match="'masked_lm_positions' needs max_predictions_per_seq"):
        records.shapes(records.MASKED, seq)


def test_batch_layout():
    i32, f32 = np.dtype(np.int32), np.dtype(np.float32)
    assert records.batch_spec(4, 8, 3) == {
        "input_ids": ((4, 8), i32),
        "input_mask": ((4, 8), i32),
        "segment_ids": ((4, 8), i32),
        "masked_lm_positions": ((4, 3), i32),
        "masked_lm_ids": ((4, 3), i32),
        "masked_lm_weights": ((4, 3), f32),
        "next_sentence_labels": ((4,), i32),
    }
