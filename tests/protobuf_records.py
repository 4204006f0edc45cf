"""One pretraining record at a time through protobuf's `tf.train.Example` (tests only).

The reference that `records.encode`'s bytes are checked against, and a handy writer of
small test records: arrays may be unpadded (they are zero-padded to the schema's fixed
lengths), `input_mask` defaults to ones over `input_ids`, `masked_lm_weights` to ones over
the positions, and `next_sentence_label` (as an instance says it) names
`next_sentence_labels`. Names, dtypes and lengths come from `data_pipelines.records`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from data_pipelines import records


def serialize_masked(
    example: Mapping[str, Any], *, max_seq_length: int, max_predictions_per_seq: int
) -> bytes:
    """One masked record (`records.MASKED`, the original format).

    Raises:
        ValueError: a feature is missing, unknown, or longer than its fixed length.
    """
    return _serialize(example, records.MASKED, max_seq_length, max_predictions_per_seq)


def serialize_unmasked(example: Mapping[str, Any], *, max_seq_length: int) -> bytes:
    """One unmasked record (`records.UNMASKED`, for dynamic masking).

    Raises:
        ValueError: a feature is missing, unknown, or longer than `max_seq_length`.
    """
    return _serialize(example, records.UNMASKED, max_seq_length, None)


def _serialize(
    example: Mapping[str, Any],
    names: Sequence[str],
    max_seq_length: int,
    max_predictions_per_seq: int | None,
) -> bytes:
    shapes = records.shapes(names, max_seq_length, max_predictions_per_seq)
    example = _normalise(example, names)
    proto = tf.train.Example()
    feature_map = proto.features.feature
    for name in names:
        dtype = records.FEATURES[name].dtype
        padded = _pad(name, example[name], shapes[name][0], np.dtype(dtype)).tolist()
        # Filling the message in place is about twice as fast as building nested messages.
        if dtype == "float32":
            feature_map[name].float_list.value.extend(padded)
        else:
            feature_map[name].int64_list.value.extend(padded)
    # Sorted map keys: the same example always gives the same bytes.
    return proto.SerializeToString(deterministic=True)


def _pad(name: str, values: Any, length: int, dtype: np.dtype) -> np.ndarray:
    array = np.asarray(values, dtype=dtype).reshape(-1)
    if array.size > length:
        raise ValueError(f"feature {name!r} has {array.size} values, more than its length {length}")
    if array.size < length:
        array = np.concatenate([array, np.zeros(length - array.size, dtype)])
    return array


def _normalise(example: Mapping[str, Any], names: Sequence[str]) -> dict:
    """Fills the derivable features and rejects unknown or missing ones."""
    example = dict(example)
    if "next_sentence_label" in example:
        if "next_sentence_labels" in example:
            raise ValueError("give next_sentence_label or next_sentence_labels, not both")
        example["next_sentence_labels"] = example.pop("next_sentence_label")
    num_tokens = np.asarray(example["input_ids"]).size if "input_ids" in example else 0
    if "input_mask" not in example:
        example["input_mask"] = np.ones(num_tokens, np.int64)
    if "masked_lm_weights" in names and "masked_lm_weights" not in example:
        num_predictions = np.asarray(example.get("masked_lm_positions", [])).size
        example["masked_lm_weights"] = np.ones(num_predictions, np.float32)
    unknown = sorted(set(example) - set(names))
    missing = sorted(set(names) - set(example))
    if unknown or missing:
        raise ValueError(f"record features: unknown {unknown}, missing {missing}")
    labels = np.asarray(example["next_sentence_labels"]).reshape(-1)
    if labels.size != 1 or labels[0] not in (0, 1):
        raise ValueError(f"next_sentence_labels must be one value in {{0, 1}}, got {labels}")
    return example
