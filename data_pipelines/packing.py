"""Sequence packing without cross-contamination: several instances share one row.

A BERT instance (`[CLS] A [SEP] B [SEP]`) is often much shorter than `max_seq_length`
(short documents, the 10% short-sequence targets, the tail of each document), and a padded
row spends the encoder's compute on padding. Packing puts several instances into one row
and keeps them apart (`records.PACKED_BATCH`): per token the instance it belongs to
(`instance_ids`, which the model turns into a block-diagonal attention mask) and its
position in that instance (`position_ids`, so positions restart at 0); per instance slot
its `[CLS]` position (where the next-sentence head reads), its label and a weight. The
masked-LM positions are moved to the packed row. Neither google-research/bert nor
transformers packs; this is ours.

How rows are filled: **first fit over the rows of one batch, in arrival order**. Each
instance goes into the first of the batch's rows that has room for its tokens, its
predictions and one more instance slot; a new row is opened when none has; the batch is
complete when all its rows are open and the next instance fits in none, and that instance
starts the next batch. Arrival order is the shuffled stream's, so no sort (first-fit
*decreasing* would need a window of instances held back, and it would put the long ones
together early in each window, a bias in what a batch holds). What is kept between batches
is only where the stream stands, which makes the packed stream resumable from a position
(`PackedIterator.position`), and every instance is packed exactly once, never split.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from data_pipelines import records


class RowFiller:
    """First fit of instances, in arrival order, into the rows of one batch."""

    def __init__(
        self,
        *,
        num_rows: int,
        max_seq_length: int,
        max_predictions_per_seq: int,
        max_instances_per_row: int,
    ):
        self.num_rows = num_rows
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.max_instances_per_row = max_instances_per_row
        self.rows: list[list[int]] = []  # instance indexes (in order of `add`) per row
        self._tokens: list[int] = []
        self._predictions: list[int] = []
        self.count = 0  # instances placed

    def add(self, length: int, predictions: int) -> bool:
        """Places the next instance; False (placing nothing) when the batch is full.

        Raises:
            ValueError: an instance longer than a row, or with more predictions than a row.
        """
        if length > self.max_seq_length or predictions > self.max_predictions_per_seq:
            raise ValueError(
                f"instance of {length} tokens and {predictions} predictions does not fit a "
                f"row of max_seq_length={self.max_seq_length}, max_predictions_per_seq="
                f"{self.max_predictions_per_seq}"
            )
        for r, row in enumerate(self.rows):
            if (
                self._tokens[r] + length <= self.max_seq_length
                and self._predictions[r] + predictions <= self.max_predictions_per_seq
                and len(row) < self.max_instances_per_row
            ):
                break
        else:
            if len(self.rows) == self.num_rows:
                return False
            r = len(self.rows)
            self.rows.append([])
            self._tokens.append(0)
            self._predictions.append(0)
        self.rows[r].append(self.count)
        self._tokens[r] += length
        self._predictions[r] += predictions
        self.count += 1
        return True


def first_fit(
    lengths: Sequence[int], predictions: Sequence[int], **sizes: int
) -> tuple[list[list[int]], int]:
    """Assigns instances, in order, to the rows of one batch (see the module docstring).

    Args:
        lengths: tokens of each instance (its real tokens, [CLS] and [SEP]s included).
        predictions: masked-LM predictions of each instance.
        **sizes: `RowFiller`'s num_rows, max_seq_length, max_predictions_per_seq and
            max_instances_per_row.

    Returns:
        (rows, consumed): each row's instance indexes in the order placed, and how many
        leading instances were placed (all, or those before the first that fit nowhere).
    """
    filler = RowFiller(**sizes)
    for length, count in zip(lengths, predictions, strict=True):
        if not filler.add(int(length), int(count)):
            break
    return filler.rows, filler.count


def instance_sizes(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, predictions) of each instance of an unpacked batch, each (N,)."""
    tokens = (batch["input_mask"] > 0).sum(axis=1)
    predictions = (batch["masked_lm_weights"] > 0).sum(axis=1)
    return tokens, predictions


def pack_rows(
    instances: dict[str, np.ndarray],
    rows: Sequence[Sequence[int]],
    *,
    num_rows: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    max_instances_per_row: int,
) -> dict[str, np.ndarray]:
    """A packed batch (`records.batch_spec` with instances) of `rows` of `instances`.

    Args:
        instances: unpacked instances (`records.BATCH` features, (N, ...) arrays); each
            instance's tokens are a prefix of its row (`input_mask`), as records store them.
        rows: instance indexes per row (from `first_fit`); rows past them are all padding.

    Returns:
        name -> array of the packed layout, zero where nothing is packed.
    """
    layout = records.batch_spec(
        num_rows, max_seq_length, max_predictions_per_seq, max_instances_per_row
    )
    out = {name: np.zeros(shape, dtype) for name, (shape, dtype) in layout.items()}
    tokens, _ = instance_sizes(instances)
    for r, row in enumerate(rows):
        offset, pred = 0, 0
        for slot, i in enumerate(row):
            length = int(tokens[i])
            span = slice(offset, offset + length)
            out["input_ids"][r, span] = instances["input_ids"][i, :length]
            out["input_mask"][r, span] = 1
            out["segment_ids"][r, span] = instances["segment_ids"][i, :length]
            out["instance_ids"][r, span] = slot + 1
            out["position_ids"][r, span] = np.arange(length)
            out["cls_positions"][r, slot] = offset
            out["instance_next_sentence_labels"][r, slot] = instances["next_sentence_labels"][i]
            out["instance_weights"][r, slot] = 1.0
            real = instances["masked_lm_weights"][i] > 0  # (P,)
            count = int(real.sum())
            where = slice(pred, pred + count)
            out["masked_lm_positions"][r, where] = (
                instances["masked_lm_positions"][i][real] + offset
            )
            out["masked_lm_ids"][r, where] = instances["masked_lm_ids"][i][real]
            out["masked_lm_weights"][r, where] = instances["masked_lm_weights"][i][real]
            offset += length
            pred += count
    return out


class PackedIterator:
    """Packs the batches of an unpacked stream into packed batches of as many rows.

    `make_source(position)` returns the unpacked stream from a position (None: its start):
    an iterator of per-host batches (`input_pipeline.PretrainingIterator`) whose `position`
    is where its next batch starts. Packing is done here, on the host, in numpy.
    The packed stream's position is the unpacked stream's position of the batch being
    consumed plus the instances of it already packed, so a resumed run packs exactly the
    rows an uninterrupted one would.
    """

    def __init__(
        self,
        make_source,
        *,
        num_rows: int,
        max_seq_length: int,
        max_predictions_per_seq: int,
        max_instances_per_row: int,
        position: dict[str, Any] | None = None,
    ):
        if max_instances_per_row < 1:
            raise ValueError(f"max_instances_per_row must be >= 1, got {max_instances_per_row}")
        self._sizes = dict(
            num_rows=num_rows,
            max_seq_length=max_seq_length,
            max_predictions_per_seq=max_predictions_per_seq,
            max_instances_per_row=max_instances_per_row,
        )
        skip = 0
        if position is not None:
            saved = position.get("max_instances_per_row")
            if saved != max_instances_per_row:
                raise ValueError(
                    f"data position does not belong to this pipeline (max_instances_per_row: "
                    f"saved {saved!r}, now {max_instances_per_row!r})"
                )
            skip = int(position["instance_in_batch"])
        self._source = make_source(position)
        self._pending: dict[str, np.ndarray] | None = None  # the unpacked batch being packed
        self._pending_position = self._source.position  # where that batch starts
        self._offset = 0  # its instances already packed
        if skip:
            self._next_source_batch()
            self._offset = skip

    def _next_source_batch(self) -> None:
        self._pending_position = self._source.position
        self._pending = next(self._source)
        self._pending_sizes = instance_sizes(self._pending)
        self._offset = 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        filler = RowFiller(**self._sizes)
        taken: list[dict[str, np.ndarray]] = []  # the unpacked instances placed, in order
        while True:
            if self._pending is None or self._offset == len(self._pending["input_ids"]):
                self._next_source_batch()
            tokens, predictions = self._pending_sizes
            start, end = self._offset, len(tokens)
            while self._offset < end and filler.add(
                int(tokens[self._offset]), int(predictions[self._offset])
            ):
                self._offset += 1
            taken.append({k: v[start : self._offset] for k, v in self._pending.items()})
            if self._offset < end:  # the batch is full; the rest waits for the next one
                break
        instances = {k: np.concatenate([t[k] for t in taken]) for k in taken[0]}
        return pack_rows(instances, filler.rows, **self._sizes)

    @property
    def position(self) -> dict[str, Any]:
        """JSON-serialisable position after the last packed batch returned."""
        return {
            **self._pending_position,
            "instance_in_batch": self._offset,
            "max_instances_per_row": self._sizes["max_instances_per_row"],
        }
