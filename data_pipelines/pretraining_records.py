"""Instances to TFRecord records: static masking and serialisation, without TensorFlow.

`RecordEncoder` takes a part of the padded instances of a chunk (`instances.InstanceBatch`)
and returns serialised `tf.train.Example`s: masked records (static mode), or unmasked ones
with their `word_starts` (dynamic mode), in the schema of `records`, encoded in bulk. It
also counts what the masking did, for the stats JSON. Masks are drawn from a generator
seeded by (seed, chunk, part of the chunk), so they do not depend on which process
encodes the part.

Static masks come from `numpy_masking.mask_batch` (the rules of `masking_rules`, drawn
from numpy's generator) on every path, local or URL, so a seed means one output: writing
records needs no TensorFlow import, which would cost each worker more than the masking.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from data_pipelines import instances, numpy_masking, records

# Instances per part of a chunk (masked and serialised per call, drawing their own masks):
# bounds the temporaries of a call, and is the unit of work a worker process takes.
MASK_BATCH = 4096


class RecordEncoder:
    """Masks (static mode) and serialises the instances of chunks, counting the masks.

    Args:
        tokenizer: gives `cls_id sep_id mask_id vocab_size replacement_ids`.
        random_seed: seeds the masks together with the chunk and batch indices.
        static_masking: True: masked records (`records.MASKED`, the original's); False:
            unmasked records (`records.UNMASKED`) for dynamic masking.
        max_predictions_per_seq: padded length of the masked_lm_* features.
        masked_lm_prob: fraction of tokens to predict.
        whole_word: mask whole words (by `word_starts`) instead of single pieces.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        random_seed: int,
        static_masking: bool,
        max_predictions_per_seq: int,
        masked_lm_prob: float,
        whole_word: bool,
    ):
        self.tokenizer = tokenizer
        self.random_seed = random_seed
        self.static_masking = static_masking
        self.max_predictions_per_seq = max_predictions_per_seq
        self.masked_lm_prob = masked_lm_prob
        self.whole_word = whole_word

    def encode_part(
        self,
        part: instances.InstanceBatch,
        chunk_index: int,
        part_index: int,
        counts: collections.Counter,
    ) -> list[bytes]:
        """The records of part `part_index` of a chunk's instances, in order.

        Args:
            part: the part (a chunk's instances are split into parts of `MASK_BATCH`).
            chunk_index: seeds the masks, with the random seed and `part_index`.
            part_index: the part's place in its chunk.
            counts: gets eligible_tokens, masked_tokens, mask_token, random_token and
                unchanged added (static mode).

        The parts of a chunk are independent (each has its own masking stream), so
        different processes can encode them.
        """
        if self.static_masking:
            return self._masked_records(part, chunk_index, part_index, counts)
        return self._unmasked_records(part)

    def _masked_records(
        self,
        batch: instances.InstanceBatch,
        chunk_index: int,
        batch_index: int,
        counts: collections.Counter,
    ) -> list[bytes]:
        tokenizer = self.tokenizer
        masked = numpy_masking.mask_batch(
            batch.input_ids,
            batch.word_starts,
            [tokenizer.cls_id, tokenizer.sep_id],
            batch.lengths,
            numpy_masking.masking_rng(self.random_seed, chunk_index, batch_index),
            vocab_size=tokenizer.vocab_size,
            mask_id=tokenizer.mask_id,
            replacement_ids=tokenizer.replacement_ids,
            max_predictions_per_seq=self.max_predictions_per_seq,
            masked_lm_prob=self.masked_lm_prob,
            whole_word=self.whole_word,
        )
        input_ids = masked["input_ids"]  # (N, T)
        positions = masked["masked_lm_positions"]  # (N, P)
        labels = masked["masked_lm_ids"]  # (N, P)
        weights = masked["masked_lm_weights"]  # (N, P)
        _count_masking(batch, input_ids, positions, labels, weights, tokenizer.mask_id, counts)
        return records.encode(
            records.MASKED,
            {
                "input_ids": input_ids,
                "input_mask": _input_mask(batch),
                "segment_ids": batch.segment_ids,
                "masked_lm_positions": positions,
                "masked_lm_ids": labels,
                "masked_lm_weights": weights,
                "next_sentence_labels": batch.next_sentence_labels[:, None],
            },
        )

    def _unmasked_records(self, batch: instances.InstanceBatch) -> list[bytes]:
        return records.encode(
            records.UNMASKED,
            {
                "input_ids": batch.input_ids,
                "input_mask": _input_mask(batch),
                "segment_ids": batch.segment_ids,
                "word_starts": batch.word_starts,
                "next_sentence_labels": batch.next_sentence_labels[:, None],
            },
        )


def _input_mask(batch: instances.InstanceBatch) -> np.ndarray:
    positions = np.arange(batch.input_ids.shape[1])[None, :]
    return (positions < batch.lengths[:, None]).astype(np.int32)  # (N, T)


def _count_masking(
    batch: instances.InstanceBatch,
    masked_ids: np.ndarray,
    positions: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray,
    mask_id: int,
    counts: collections.Counter[str],
) -> None:
    """Adds the observed [MASK] / random / unchanged split of one masked batch."""
    real = weights > 0  # (N, P)
    # Tokens that could be masked: real tokens minus [CLS] and the [SEP]s (two in a pair,
    # one in a single segment, which has no segment-1 token).
    pairs = int(np.count_nonzero(batch.segment_ids.max(axis=1, initial=0) > 0))
    counts["eligible_tokens"] += int(batch.lengths.sum()) - 2 * len(batch.lengths) - pairs
    counts["masked_tokens"] += int(real.sum())
    placed = np.take_along_axis(masked_ids, positions, axis=1)  # (N, P)
    is_mask = real & (placed == mask_id)
    # A random draw that happens to equal the original token reads as "unchanged".
    is_same = real & ~is_mask & (placed == labels)
    counts["mask_token"] += int(is_mask.sum())
    counts["unchanged"] += int(is_same.sum())
    counts["random_token"] += int((real & ~is_mask & ~is_same).sum())
