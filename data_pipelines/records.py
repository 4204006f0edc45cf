"""The pretraining record: one schema, and the writer, parser and batch layout drawn from it.

`FEATURES` is the schema: every feature a pretraining record can carry, with its stored
dtype and its fixed length. Two records take their features from it:

* **masked** (`MASKED`, static masking): exactly the original google-research/bert record
  (create_pretraining_data.py / run_pretraining.py), so TFRecords written by either tool
  train the other::

      input_ids, input_mask, segment_ids      int64[max_seq_length]
      masked_lm_positions, masked_lm_ids      int64[max_predictions_per_seq]
      masked_lm_weights                       float32[max_predictions_per_seq]
      next_sentence_labels                    int64[1]   (0 = B follows A, 1 = B is random)

* **unmasked** (`UNMASKED`, dynamic masking): the instance before masking, masked on the fly
  by the input pipeline::

      input_ids, input_mask, segment_ids, word_starts   int64[max_seq_length]
      next_sentence_labels                              int64[1]

Records are zero-padded to the fixed shapes, like the original writer's. A training batch
has the masked record's features (`BATCH`, laid out by `batch_spec`), whichever record it
was read from.

A **packed** batch (`PACKED_BATCH`, `data_pipelines.packing`) holds several instances per
row of `max_seq_length` tokens, at most `max_instances_per_row`: the masked record's token
and prediction features (masked_lm_positions index the packed row), and per token the
instance it belongs to and its position in it, per instance slot its [CLS] position, its
next-sentence label and a weight (1 on real instances, 0 on empty slots).

Writing (`encode`) needs no TensorFlow: `create_pretraining_data`'s workers import this
module, and importing TensorFlow alone would cost each of them several CPU seconds. Its
bytes are exactly protobuf's `tf.train.Example(...).SerializeToString(deterministic=True)`
(map keys sorted), written with numpy for a whole batch at once, since building one
protobuf message per record costs more than everything else the tool does per instance.
Wire format (every length a varint)::

    Example   = 0x0A len Features
    Features  = for each key, sorted: 0x0A len Entry
    Entry     = 0x0A len key  0x12 len Feature
    Feature   = 0x1A len Int64List | 0x12 len FloatList
    Int64List = 0x0A len varint*   (packed)
    FloatList = 0x0A len float32le* (packed)

Parsing (`parse`, `feature_spec`) is for tf.data and imports TensorFlow when called. The
files around the records (framing, shards) are `tfrecord_files`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# What a feature's fixed length is.
SEQ = "max_seq_length"
PRED = "max_predictions_per_seq"
ONE = "one"
INST = "max_instances_per_row"


@dataclasses.dataclass(frozen=True)
class Feature:
    """One fixed-length feature of the pretraining records."""

    dtype: str  # "int64" or "float32": the two number types tf.train.Example stores
    length: str  # SEQ, PRED, ONE or INST


# The schema.
FEATURES: dict[str, Feature] = {
    "input_ids": Feature("int64", SEQ),  # [CLS] A [SEP] B [SEP], then zeros
    "input_mask": Feature("int64", SEQ),  # 1 on the real tokens
    "segment_ids": Feature("int64", SEQ),  # 0 on [CLS] A [SEP], 1 on B [SEP]
    "masked_lm_positions": Feature("int64", PRED),  # where the predictions are
    "masked_lm_ids": Feature("int64", PRED),  # the original tokens there
    "masked_lm_weights": Feature("float32", PRED),  # 1.0 on real predictions, 0.0 on padding
    "next_sentence_labels": Feature("int64", ONE),  # 0: B follows A, 1: B is random
    "word_starts": Feature("int64", SEQ),  # 1 where a whole-word masking unit starts
    # Packed rows only.
    "instance_ids": Feature("int64", SEQ),  # 1, 2, ... the token's instance; 0 on padding
    "position_ids": Feature("int64", SEQ),  # the token's position in its instance
    "cls_positions": Feature("int64", INST),  # where each instance's [CLS] is
    "instance_next_sentence_labels": Feature("int64", INST),  # each instance's NSP label
    "instance_weights": Feature("float32", INST),  # 1.0 on real instances, 0.0 on empty slots
}

MASKED = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)
UNMASKED = ("input_ids", "input_mask", "segment_ids", "word_starts", "next_sentence_labels")
# A training batch has the masked record's features (dynamic masking makes them in tf.data).
BATCH = MASKED
# A packed training batch: the masked record's token and prediction features, and packing's.
PACKED_BATCH = (
    *(name for name in MASKED if name != "next_sentence_labels"),
    "instance_ids",
    "position_ids",
    "cls_positions",
    "instance_next_sentence_labels",
    "instance_weights",
)


def shapes(
    names: Sequence[str],
    max_seq_length: int,
    max_predictions_per_seq: int | None = None,
    max_instances_per_row: int | None = None,
) -> dict[str, tuple[int]]:
    """The fixed shape of each feature of `names` in one record (or packed row).

    Raises:
        ValueError: a length below 1, or no `max_predictions_per_seq` for a masked_lm_*
            feature, or no `max_instances_per_row` for a per-instance feature.
    """
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    if max_predictions_per_seq is not None and max_predictions_per_seq < 1:
        raise ValueError(f"max_predictions_per_seq must be >= 1, got {max_predictions_per_seq}")
    if max_instances_per_row is not None and max_instances_per_row < 1:
        raise ValueError(f"max_instances_per_row must be >= 1, got {max_instances_per_row}")
    lengths = {
        SEQ: max_seq_length,
        PRED: max_predictions_per_seq,
        ONE: 1,
        INST: max_instances_per_row,
    }
    out = {}
    for name in names:
        length = lengths[FEATURES[name].length]
        if length is None:
            raise ValueError(f"feature {name!r} needs {FEATURES[name].length}")
        out[name] = (length,)
    return out


def batch_spec(
    batch_size: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    max_instances_per_row: int | None = None,
) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of each array of a training batch of `batch_size` examples (rows).

    int64 features become int32 (JAX's default integers; ids, positions and labels fit),
    float32 ones stay, and a one-value feature is one scalar per example: (B,), not (B, 1).
    With `max_instances_per_row` the batch is packed (`PACKED_BATCH`).
    """
    names = BATCH if max_instances_per_row is None else PACKED_BATCH
    spec = {}
    for name, (length,) in shapes(
        names, max_seq_length, max_predictions_per_seq, max_instances_per_row
    ).items():
        feature = FEATURES[name]
        shape = (batch_size,) if feature.length == ONE else (batch_size, length)
        spec[name] = (shape, np.dtype(np.int32 if feature.dtype == "int64" else np.float32))
    return spec


# ----------------------------------------------------------------------------- parsing


def feature_spec(
    names: Sequence[str], max_seq_length: int, max_predictions_per_seq: int | None = None
) -> dict[str, Any]:
    """The `tf.io.parse_example` spec (`tf.io.FixedLenFeature`s) of a record of `names`."""
    import tensorflow as tf  # here, not at the top: writers never import TensorFlow

    return {
        name: tf.io.FixedLenFeature(list(shape), tf.as_dtype(FEATURES[name].dtype))
        for name, shape in shapes(names, max_seq_length, max_predictions_per_seq).items()
    }


def parse(
    serialized: Any,
    names: Sequence[str],
    *,
    max_seq_length: int,
    max_predictions_per_seq: int | None = None,
) -> dict[str, Any]:
    """Parses records of `names` (one scalar string tensor or a vector of them).

    Returns:
        name -> int64 or float32 tensor, (L,) for one record, (N, L) for N.
    """
    import tensorflow as tf

    spec = feature_spec(names, max_seq_length, max_predictions_per_seq)
    serialized = tf.convert_to_tensor(serialized, tf.string)
    if serialized.shape.rank == 0:
        return tf.io.parse_single_example(serialized, spec)
    return tf.io.parse_example(serialized, spec)


# ----------------------------------------------------------------------------- writing


def encode(names: Sequence[str], features: Mapping[str, np.ndarray]) -> list[bytes]:
    """Serialises N records of `names` (`MASKED` or `UNMASKED`), typed by the schema.

    Args:
        names: the record's features.
        features: name -> (N, L) array, already zero-padded to the feature's fixed length
            (`next_sentence_labels` is (N, 1)).

    Returns:
        N serialised `tf.train.Example`s.

    Raises:
        ValueError: features missing or not in the record, not 2-D, or a width that
            disagrees with the other features of the same length.
    """
    unknown = sorted(set(features) - set(names))
    missing = sorted(set(names) - set(features))
    if unknown or missing:
        raise ValueError(f"record features: unknown {unknown}, missing {missing}")
    widths = {ONE: 1}
    for name in names:
        shape = np.shape(features[name])
        if len(shape) != 2:
            raise ValueError(f"feature {name!r} must be an (N, L) array, got shape {shape}")
        length, width = FEATURES[name].length, shape[1]
        if widths.setdefault(length, width) != width:
            raise ValueError(
                f"feature {name!r} has {width} values per record, not {widths[length]} like "
                f"the other {length} features"
            )
    by_type: dict[str, dict[str, np.ndarray]] = {"int64": {}, "float32": {}}
    for name in names:
        by_type[FEATURES[name].dtype][name] = features[name]
    return encode_examples(by_type["int64"], by_type["float32"])


_FLOAT_LIST = 0x12  # Feature.float_list, field 2, length-delimited
_INT64_LIST = 0x1A  # Feature.int64_list, field 3, length-delimited
_LEN_FIELD_1 = 0x0A  # field 1, length-delimited
_LEN_FIELD_2 = 0x12  # field 2, length-delimited


def _varint_size(values: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each (uint64) value: 1 to 10."""
    size = np.ones(np.shape(values), np.int64)
    top = np.max(values) if np.size(values) else 0
    for k in range(1, 10):
        threshold = np.uint64(1 << (7 * k))
        if top < threshold:
            break
        size += values >= threshold
    return size


def _varint_bytes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of a (N, L) uint64 array as (N, L * K) bytes and a (N, L * K) validity mask.

    Reading each row's valid bytes in order gives the concatenated varints of the row.
    """
    n, length = values.shape
    sizes = _varint_size(values)  # (N, L)
    k = int(sizes.max()) if values.size else 1
    if k == 1:  # all values < 128: one byte each, the common case of masks and labels
        return values.astype(np.uint8), np.ones((n, length), bool)
    if k <= 4:  # narrower arithmetic where the values allow it (token ids)
        values = values.astype(np.uint32)
    data = np.empty((n, length, k), np.uint8)
    valid = np.empty((n, length, k), bool)
    for j in range(k):
        group = ((values >> (7 * j)) & 0x7F).astype(np.uint8)
        continues = sizes > j + 1
        data[:, :, j] = group | (continues.astype(np.uint8) << 7)
        valid[:, :, j] = sizes > j
    return data.reshape(n, length * k), valid.reshape(n, length * k)


def _varint_column(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of a (N,) array of lengths, as a (N, K) piece."""
    return _varint_bytes(values.astype(np.uint64)[:, None])


def _constant(n: int, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    row = np.frombuffer(data, np.uint8)
    return np.broadcast_to(row, (n, len(row))), np.ones((n, len(row)), bool)


def encode_examples(
    int64_features: Mapping[str, np.ndarray],
    float_features: Mapping[str, np.ndarray] | None = None,
) -> list[bytes]:
    """Serialises N examples of any fixed-shape features, given as rows of 2-D arrays.

    Args:
        int64_features: name -> (N, L) integer array (any length L >= 1 per feature).
        float_features: name -> (N, L) float array, stored as float32.

    Returns:
        N serialised `tf.train.Example`s, byte-identical to protobuf's deterministic
        serialisation of the same features.

    Raises:
        ValueError: arrays of different N, not 2-D, or a feature name in both mappings.
    """
    float_features = float_features or {}
    names = sorted({*int64_features, *float_features})
    if len(names) != len(int64_features) + len(float_features):
        raise ValueError("a feature is both int64 and float")
    arrays = {**int64_features, **float_features}
    array_shapes = {name: np.shape(array) for name, array in arrays.items()}
    if any(len(shape) != 2 for shape in array_shapes.values()):
        raise ValueError(f"features must be (N, L) arrays, got shapes {array_shapes}")
    counts = {shape[0] for shape in array_shapes.values()}
    if len(counts) != 1:
        raise ValueError(f"features have different numbers of rows: {array_shapes}")
    n = counts.pop()
    if n == 0:
        return []

    pieces: list[tuple[np.ndarray, np.ndarray]] = []
    features_size = np.zeros(n, np.int64)
    for name in names:
        if name in int64_features:
            # int64 (two's complement for negatives) as protobuf does: uint64 varints.
            values = np.asarray(int64_features[name]).astype(np.int64).view(np.uint64)
            payload = _varint_bytes(values)
            payload_size = payload[1].sum(axis=1)
            list_tag = _INT64_LIST
        else:
            values = np.ascontiguousarray(np.asarray(float_features[name], "<f4"))
            raw = values.view(np.uint8).reshape(n, -1)
            payload = (raw, np.ones(raw.shape, bool))
            payload_size = np.full(n, raw.shape[1], np.int64)
            list_tag = _FLOAT_LIST
        key = name.encode("utf-8")
        list_size = 1 + _varint_size(payload_size.astype(np.uint64)) + payload_size
        feature_size = 1 + _varint_size(list_size.astype(np.uint64)) + list_size
        entry_size = (
            1
            + _varint_size(np.uint64(len(key)))
            + len(key)
            + 1
            + _varint_size(feature_size.astype(np.uint64))
            + feature_size
        )
        features_size += 1 + _varint_size(entry_size.astype(np.uint64)) + entry_size
        key_header = bytes([_LEN_FIELD_1, len(key)]) + key if len(key) < 128 else None
        if key_header is None:
            raise ValueError(f"feature name too long: {name!r}")
        pieces += [
            _constant(n, bytes([_LEN_FIELD_1])),
            _varint_column(entry_size),
            _constant(n, key_header + bytes([_LEN_FIELD_2])),
            _varint_column(feature_size),
            _constant(n, bytes([list_tag])),
            _varint_column(list_size),
            _constant(n, bytes([_LEN_FIELD_1])),
            _varint_column(payload_size),
            payload,
        ]
    pieces = [_constant(n, bytes([_LEN_FIELD_1])), _varint_column(features_size), *pieces]
    data = np.concatenate([p[0] for p in pieces], axis=1)  # (N, W)
    valid = np.concatenate([p[1] for p in pieces], axis=1)  # (N, W)
    flat = data[valid].tobytes()  # row-major: each record's bytes in order
    ends = np.cumsum(valid.sum(axis=1)).tolist()
    starts = [0, *ends[:-1]]
    return [flat[a:b] for a, b in zip(starts, ends, strict=True)]
