"""Single-segment instances, `[CLS] text [SEP]`, for pretraining without next sentence prediction.

The "mlm" ("No NSP") and "ltr" ("LTR & No NSP") objectives of the paper's Table 5
(`bert_jax.train`) have no sentence pair to classify, so an instance is one stretch of
contiguous text from one document, all in segment 0, with no "random next" sampling. The
paper says only that these models were trained "without the NSP task"; the closest named
input format is RoBERTa's DOC-SENTENCES (contiguous text that never crosses a document).
`create_pretraining_data --next_sentence=false` makes these instead of `instances`' pairs.

Per document, drawing from the chunk's `random.Random` as the pair algorithm does:

* the target length is `max_seq_length - 2` (room for `[CLS]` and `[SEP]`), replaced with
  probability `short_seq_prob` by `randint(2, max_seq_length - 2)`, once per document (as
  the original draws its target);
* the document's tokens, sentence after sentence, are cut into consecutive instances of
  the target length; the last one holds the rest. A sentence may be split between two
  instances (the pair algorithm's truncation also cuts sentences), but no token is dropped
  and no instance crosses a document.

A chunk is made as `instances.create_chunk_instances` makes one: documents shuffled,
`dupe_factor` passes, instances shuffled. `assemble` pads them into the same
`instances.InstanceBatch` the pairs fill (segment ids and NSP labels all 0), so masking
and records are shared: the records keep the original schema, `next_sentence_labels` 0 and
unused.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from data_pipelines.instances import InstanceBatch, InstanceStats, Segment, TokenizedChunk


def create_instances_from_document(
    document: Sequence[Segment],
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    stats: InstanceStats | None = None,
) -> list[list[Segment]]:
    """The single-segment instances of one document, as token ranges of its chunk.

    Args:
        document: the document's sentences as (start, length) ranges.
        max_seq_length: the length limit, including `[CLS]` and `[SEP]`.
        short_seq_prob: probability of a shorter random target length.
        rng: the chunk's random stream (one draw, two with a short target).
        stats: optional counters to update.
    """
    max_num_tokens = max_seq_length - 2
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    pieces: list[list[Segment]] = []
    current: list[Segment] = []
    room = target
    for start, length in document:
        while length:
            take = min(room, length)
            current.append((start, take))
            start, length, room = start + take, length - take, room - take
            if not room:
                pieces.append(current)
                current, room = [], target
    if current:
        pieces.append(current)
    if stats is not None:
        stats.instances += len(pieces)
        stats.instance_tokens += sum(length for _, length in document) + 2 * len(pieces)
    return pieces


def create_chunk_instances(
    documents: list[list[Segment]],
    rng: random.Random,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    stats: InstanceStats | None = None,
) -> list[list[Segment]]:
    """All single-segment instances of one chunk: documents shuffled, `dupe_factor`
    passes, instances shuffled, all with `rng` (one document is enough)."""
    documents = list(documents)
    rng.shuffle(documents)
    pieces: list[list[Segment]] = []
    for _ in range(dupe_factor):
        for document in documents:
            pieces.extend(
                create_instances_from_document(document, max_seq_length, short_seq_prob, rng, stats)
            )
    rng.shuffle(pieces)
    return pieces


def assemble(
    chunk: TokenizedChunk,
    pieces: Sequence[list[Segment]],
    max_seq_length: int,
    *,
    cls_id: int,
    sep_id: int,
) -> InstanceBatch:
    """Builds `[CLS] text [SEP]` rows, zero-padded to `max_seq_length`.

    The first token of the text is marked as a word start even when the cut left a
    continuation piece there, so no whole-word unit starts at `[CLS]`.
    """
    n = len(pieces)
    ranges_per_piece = np.fromiter((len(p) for p in pieces), np.int64, n)  # (N,)
    table = np.asarray([r for piece in pieces for r in piece], np.int64).reshape(-1, 2)
    sources, sizes = table[:, 0], table[:, 1]  # (K,) each
    range_row = np.repeat(np.arange(n), ranges_per_piece)  # (K,)
    text_lengths = np.bincount(range_row, weights=sizes, minlength=n).astype(np.int64)
    if np.any(text_lengths < 1):
        raise AssertionError("an empty instance")
    lengths = text_lengths + 2
    if np.any(lengths > max_seq_length):
        raise AssertionError(f"an instance is longer than max_seq_length {max_seq_length}")
    # Range k's tokens go after [CLS] and the ranges before it in its row.
    starts = np.cumsum(sizes) - sizes  # (K,) where range k starts in the concatenation
    first_range = np.cumsum(ranges_per_piece) - ranges_per_piece  # (N,)
    before = starts - starts[first_range][range_row]  # (K,) tokens of the row before it
    offsets = np.arange(int(sizes.sum())) - np.repeat(starts, sizes)  # token within range
    token_sources = np.repeat(sources, sizes) + offsets
    token_dests = np.repeat(range_row * max_seq_length + 1 + before, sizes) + offsets

    input_ids = np.zeros((n, max_seq_length), np.int32)
    word_starts = np.zeros((n, max_seq_length), np.int32)
    input_ids.reshape(-1)[token_dests] = chunk.token_ids[token_sources]
    word_starts.reshape(-1)[token_dests] = chunk.word_starts[token_sources]
    input_ids[:, 0] = cls_id
    input_ids[np.arange(n), lengths - 1] = sep_id
    word_starts[:, 1] = 1
    segment_ids = np.zeros((n, max_seq_length), np.int32)
    labels = np.zeros(n, np.int32)  # no NSP: the records' next_sentence_labels are unused
    return InstanceBatch(input_ids, segment_ids, word_starts, lengths.astype(np.int32), labels)
