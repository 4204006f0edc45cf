"""TFRecord schemas, serialisation and parsing (files are written by `tfrecord_files`).

Two record schemas live here:

* **masked** (static masking): exactly the original google-research/bert feature names,
  dtypes and fixed shapes, so TFRecords written by either tool train the other::

      input_ids, input_mask, segment_ids      int64[max_seq_length]
      masked_lm_positions, masked_lm_ids      int64[max_predictions_per_seq]
      masked_lm_weights                       float32[max_predictions_per_seq]
      next_sentence_labels                    int64[1]   (0 = B follows A, 1 = B is random)

* **unmasked** (dynamic masking): the instance before masking, masked on the fly in the
  input pipeline::

      input_ids, input_mask, segment_ids, word_starts   int64[max_seq_length]
      next_sentence_labels                              int64[1]

Records are zero-padded to the fixed shapes, like the original writer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

# Which padded length a feature has.
_SEQ = "max_seq_length"
_PRED = "max_predictions_per_seq"
_ONE = "one"


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One fixed-length feature of a record schema."""

    dtype: tf.DType  # tf.int64 or tf.float32: the two types tf.train.Example stores
    length: str  # "max_seq_length", "max_predictions_per_seq" or "one"


# The original BERT pretraining record (create_pretraining_data.py / run_pretraining.py).
PRETRAINING_FEATURES: dict[str, FeatureSpec] = {
    "input_ids": FeatureSpec(tf.int64, _SEQ),
    "input_mask": FeatureSpec(tf.int64, _SEQ),
    "segment_ids": FeatureSpec(tf.int64, _SEQ),
    "masked_lm_positions": FeatureSpec(tf.int64, _PRED),
    "masked_lm_ids": FeatureSpec(tf.int64, _PRED),
    "masked_lm_weights": FeatureSpec(tf.float32, _PRED),
    "next_sentence_labels": FeatureSpec(tf.int64, _ONE),
}

# An instance before masking (dynamic-masking mode).
UNMASKED_FEATURES: dict[str, FeatureSpec] = {
    "input_ids": FeatureSpec(tf.int64, _SEQ),
    "input_mask": FeatureSpec(tf.int64, _SEQ),
    "segment_ids": FeatureSpec(tf.int64, _SEQ),
    "word_starts": FeatureSpec(tf.int64, _SEQ),
    "next_sentence_labels": FeatureSpec(tf.int64, _ONE),
}


def _lengths(max_seq_length: int, max_predictions_per_seq: int | None) -> dict[str, int]:
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    if max_predictions_per_seq is not None and max_predictions_per_seq < 1:
        raise ValueError(f"max_predictions_per_seq must be >= 1, got {max_predictions_per_seq}")
    return {_SEQ: max_seq_length, _PRED: max_predictions_per_seq or 0, _ONE: 1}


def _feature_spec(
    features: Mapping[str, FeatureSpec], lengths: Mapping[str, int]
) -> dict[str, tf.io.FixedLenFeature]:
    return {
        name: tf.io.FixedLenFeature([lengths[f.length]], f.dtype) for name, f in features.items()
    }


def pretraining_feature_spec(
    max_seq_length: int, max_predictions_per_seq: int
) -> dict[str, tf.io.FixedLenFeature]:
    """The `tf.io.parse_example` spec of a masked (original-format) record."""
    return _feature_spec(PRETRAINING_FEATURES, _lengths(max_seq_length, max_predictions_per_seq))


def unmasked_feature_spec(max_seq_length: int) -> dict[str, tf.io.FixedLenFeature]:
    """The `tf.io.parse_example` spec of an unmasked (dynamic-masking) record."""
    return _feature_spec(UNMASKED_FEATURES, _lengths(max_seq_length, None))


# ----------------------------------------------------------------------------- serialising


def _pad(name: str, values: Any, length: int, dtype: np.dtype) -> np.ndarray:
    array = np.asarray(values, dtype=dtype).reshape(-1)
    if array.size > length:
        raise ValueError(f"feature {name!r} has {array.size} values, more than its length {length}")
    if array.size < length:
        array = np.concatenate([array, np.zeros(length - array.size, dtype)])
    return array


def _plan(features: Mapping[str, FeatureSpec]) -> list[tuple[str, bool, type, str]]:
    # (name, is_float, numpy dtype, length key), computed once: tf.DType comparisons are slow.
    return [
        (name, f.dtype == tf.float32, f.dtype.as_numpy_dtype, f.length)
        for name, f in features.items()
    ]


def _example_bytes(
    example: Mapping[str, Any], plan: list[tuple[str, bool, type, str]], lengths: Mapping[str, int]
) -> bytes:
    proto = tf.train.Example()
    feature_map = proto.features.feature
    for name, is_float, dtype, length in plan:
        padded = _pad(name, example[name], lengths[length], dtype).tolist()
        # Filling the message in place is about twice as fast as building nested messages.
        if is_float:
            feature_map[name].float_list.value.extend(padded)
        else:
            feature_map[name].int64_list.value.extend(padded)
    # Sorted map keys: the same example always gives the same bytes.
    return proto.SerializeToString(deterministic=True)


def _normalise(example: Mapping[str, Any], features: Mapping[str, FeatureSpec]) -> dict:
    """Fills the derivable features and rejects unknown or missing ones."""
    example = dict(example)
    # An instance says `next_sentence_label`; the record calls it `next_sentence_labels`.
    if "next_sentence_label" in example:
        if "next_sentence_labels" in example:
            raise ValueError("give next_sentence_label or next_sentence_labels, not both")
        example["next_sentence_labels"] = example.pop("next_sentence_label")
    num_tokens = np.asarray(example["input_ids"]).size if "input_ids" in example else 0
    if "input_mask" not in example:
        example["input_mask"] = np.ones(num_tokens, np.int64)
    if "masked_lm_weights" in features and "masked_lm_weights" not in example:
        num_predictions = np.asarray(example.get("masked_lm_positions", [])).size
        example["masked_lm_weights"] = np.ones(num_predictions, np.float32)
    unknown = sorted(set(example) - set(features))
    missing = sorted(set(features) - set(example))
    if unknown or missing:
        raise ValueError(f"record features: unknown {unknown}, missing {missing}")
    labels = np.asarray(example["next_sentence_labels"]).reshape(-1)
    if labels.size != 1 or labels[0] not in (0, 1):
        raise ValueError(f"next_sentence_labels must be one value in {{0, 1}}, got {labels}")
    return example


_MASKED_PLAN = _plan(PRETRAINING_FEATURES)
_UNMASKED_PLAN = _plan(UNMASKED_FEATURES)


def serialize_masked(
    example: Mapping[str, Any], *, max_seq_length: int, max_predictions_per_seq: int
) -> bytes:
    """Serialises one masked example as an original-format `tf.train.Example`.

    Args:
        example: `input_ids`, `segment_ids`, `masked_lm_positions`, `masked_lm_ids`,
            `next_sentence_labels` (or `next_sentence_label`), and optionally `input_mask`
            (default: ones over `input_ids`) and `masked_lm_weights` (default: ones over the
            positions). Arrays may be unpadded; they are zero-padded to the fixed shapes.
        max_seq_length: padded length of the token features.
        max_predictions_per_seq: padded length of the prediction features.

    Returns:
        The serialised `tf.train.Example`.

    Raises:
        ValueError: a feature is missing, unknown, or longer than its fixed length.
    """
    lengths = _lengths(max_seq_length, max_predictions_per_seq)
    return _example_bytes(_normalise(example, PRETRAINING_FEATURES), _MASKED_PLAN, lengths)


def serialize_unmasked(example: Mapping[str, Any], *, max_seq_length: int) -> bytes:
    """Serialises one unmasked instance (for dynamic masking) as a `tf.train.Example`.

    Args:
        example: `input_ids`, `segment_ids`, `word_starts`, `next_sentence_labels` (or
            `next_sentence_label`), optionally `input_mask` (default: ones over
            `input_ids`). Arrays may be unpadded; they are zero-padded to `max_seq_length`.
        max_seq_length: padded length of the token features.

    Returns:
        The serialised `tf.train.Example`.

    Raises:
        ValueError: a feature is missing, unknown, or longer than `max_seq_length`.
    """
    lengths = _lengths(max_seq_length, None)
    return _example_bytes(_normalise(example, UNMASKED_FEATURES), _UNMASKED_PLAN, lengths)


# ----------------------------------------------------------------------------- parsing


def _parse(serialized: tf.Tensor, spec: dict[str, tf.io.FixedLenFeature]) -> dict[str, tf.Tensor]:
    serialized = tf.convert_to_tensor(serialized, tf.string)
    if serialized.shape.rank == 0:
        return tf.io.parse_single_example(serialized, spec)
    return tf.io.parse_example(serialized, spec)


def parse_masked(
    serialized: tf.Tensor, *, max_seq_length: int, max_predictions_per_seq: int
) -> dict[str, tf.Tensor]:
    """Parses masked records (one scalar string or a vector of them) into int64/float32."""
    return _parse(serialized, pretraining_feature_spec(max_seq_length, max_predictions_per_seq))


def parse_unmasked(serialized: tf.Tensor, *, max_seq_length: int) -> dict[str, tf.Tensor]:
    """Parses unmasked records (one scalar string or a vector of them) into int64 tensors."""
    return _parse(serialized, unmasked_feature_spec(max_seq_length))
