"""Vectorised `tf.train.Example` encoding for batches of fixed-shape features.

Building one protobuf message per record costs tens of microseconds in Python, more than
everything else `create_pretraining_data` does per instance. Records of the pretraining
schemas are all alike (a few int64/float32 features of fixed length), so a whole batch is
encoded here with numpy: the protobuf wire format written directly, varints and all.

The bytes are exactly those of `tf.train.Example(...).SerializeToString(deterministic=True)`
(map keys sorted), which is what `data_pipelines.tfrecords.serialize_masked` and
`serialize_unmasked` give; the tests check the two byte for byte.

Wire format (every length a varint):

    Example   = 0x0A len Features
    Features  = for each key, sorted: 0x0A len Entry
    Entry     = 0x0A len key  0x12 len Feature
    Feature   = 0x1A len Int64List | 0x12 len FloatList
    Int64List = 0x0A len varint*   (packed)
    FloatList = 0x0A len float32le* (packed)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

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
    """Serialises N examples whose features are rows of 2-D arrays.

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
    shapes = {name: np.shape(array) for name, array in arrays.items()}
    if any(len(shape) != 2 for shape in shapes.values()):
        raise ValueError(f"features must be (N, L) arrays, got shapes {shapes}")
    counts = {shape[0] for shape in shapes.values()}
    if len(counts) != 1:
        raise ValueError(f"features have different numbers of rows: {shapes}")
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
