"""Sentence-pair instances for BERT pretraining, by the original algorithm.

`create_instances_from_document` and `truncate_seq_pair` follow google-research/bert's
`create_pretraining_data.py` step for step, drawing from a `random.Random` in the same
order, so on the same tokenized documents and seed they make the same pairs, NSP labels
and truncations:

* the target length is `max_seq_length - 3` (room for `[CLS] A [SEP] B [SEP]`), replaced
  with probability `short_seq_prob` by `randint(2, max_seq_length - 3)`;
* sentences ("segments") are accumulated until the target is reached or the document
  ends, then split at a random point into A and B;
* with probability 0.5, and always when only one segment was accumulated, B is instead
  read from a random start in a random *other* document (up to 10 draws to avoid the
  same one) and the unused segments are put back to start the next pair;
* `truncate_seq_pair` shortens the longer side one token at a time, from the front or
  the back at random.

Masking is not done here: it is vectorised (the rules of `data_pipelines.masking_rules`, with
draws from TensorFlow in `masking` for dynamic masking and from numpy in `numpy_masking` for
static records), so the `random.Random` stream differs from the original's (which
interleaves mask draws) and the masks differ, while their distribution is the same.

Two deliberate differences, both for streaming in bounded memory:

* The original reads the whole corpus, shuffles all documents, draws the random other
  document from all of them and shuffles all instances at the end: memory grows with the
  corpus, and users of large corpora run out of it. Here the corpus is processed in
  *chunks* of consecutive documents (`create_chunk_instances`): documents are shuffled,
  random other documents drawn and instances shuffled within a chunk. A chunk of a few
  hundred documents is plenty to make "B from another document" a real negative; the
  training input pipeline shuffles across chunks and files.
* Documents never run on from the end of one input file into the next (the original
  merges the last document of a file with the first of the next unless the file ends
  with a blank line).

Each instance also carries `word_starts` for whole-word masking (see `tokenized_chunks`).
The first token of A and of B is always a start, even when truncation cut a word, so a
unit never spans `[SEP]`.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence

import numpy as np

from data_pipelines.tokenized_chunks import (  # noqa: F401 - instances' public names too
    DocumentTokenizer,
    InstanceStats,
    Segment,
    TokenizedChunk,
    Tokenizer,
    chunk_from_token_lists,
)


@dataclasses.dataclass(slots=True)
class PairSpec:
    """One instance `[CLS] A [SEP] B [SEP]` as token ranges of its chunk (before padding)."""

    a: list[Segment]  # the ranges of A, after truncation
    b: list[Segment]  # the ranges of B, after truncation
    next_sentence_label: int  # 0: B follows A in the document; 1: B is from another one


def truncate_seq_pair(
    len_a: int, len_b: int, max_num_tokens: int, rng: random.Random
) -> tuple[int, int, int, int]:
    """Shortens a pair to `max_num_tokens`, one token at a time from the longer side.

    Each token is removed from the front or the back with probability 1/2, one
    `rng.random()` per token, as in the original (which deletes list items one by one;
    here only the counts are kept).

    Returns:
        Tokens removed from (front of A, back of A, front of B, back of B).
    """
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0, 0, 0
    # One draw per removed token, in order; 1: from the front (see `_front_flags`).
    fronts = _front_flags(rng, excess)
    # Which side loses each token depends only on the lengths: the longer one (B on a tie)
    # until they differ by at most one, then the two sides alternate.
    if len_a > len_b:
        lead, lead_is_a = len_a - len_b, True
    else:
        lead, lead_is_a = len_b - len_a + 1, False
    lead = min(lead, excess)
    first, second = fronts[lead::2], fronts[lead + 1 :: 2]  # alternating, led by the other
    lead_fronts = fronts[:lead].count(1)
    if lead_is_a:  # A first, then B, A, B, ...
        a_fronts, a_total = lead_fronts + second.count(1), lead + len(second)
        b_fronts, b_total = first.count(1), len(first)
    else:  # B first, then A, B, A, ...
        a_fronts, a_total = first.count(1), len(first)
        b_fronts, b_total = lead_fronts + second.count(1), lead + len(second)
    return a_fronts, a_total - a_fronts, b_fronts, b_total - b_fronts


# Byte -> 1 when its top bit is clear (see `_front_flags`).
_TOP_BIT_CLEAR = bytes(int(b < 128) for b in range(256))


def _front_flags(rng: random.Random, count: int) -> bytes:
    """`bytes(rng.random() < 0.5 for _ in range(count))`, consuming `rng` identically.

    CPython's `random()` reads two 32-bit Mersenne Twister words and is below 0.5 exactly
    when the top bit of the first is clear; `getrandbits(64 * count)` reads the same
    2 * count words and returns them as one integer, the first word lowest. Truncation
    draws ~20 of these per instance, so one call instead of a Python loop matters (the
    parity tests against the original tool check the equivalence).
    """
    if type(rng) is not random.Random:  # another generator (a subclass, a test double)
        return bytes(rng.random() < 0.5 for _ in range(count))
    words = rng.getrandbits(64 * count).to_bytes(8 * count, "little")
    return words[3::8].translate(_TOP_BIT_CLEAR)  # byte 3: the first word's top byte


def _clip(segments: list[Segment], front: int, back: int) -> list[Segment]:
    """The ranges of `segments` without their first `front` and last `back` tokens."""
    if not front and not back:
        return segments
    clipped = list(segments)
    while front:
        start, length = clipped[0]
        if length <= front:
            front -= length
            clipped.pop(0)
        else:
            clipped[0] = (start + front, length - front)
            front = 0
    while back:
        start, length = clipped[-1]
        if length <= back:
            back -= length
            clipped.pop()
        else:
            clipped[-1] = (start, length - back)
            back = 0
    return clipped


def create_instances_from_document(
    all_documents: Sequence[list[Segment]],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    stats: InstanceStats | None = None,
) -> list[PairSpec]:
    """The sentence-pair instances of one document (the original algorithm, see module doc).

    Args:
        all_documents: the documents of the chunk, as sentence ranges; "random next" B
            segments come from them.
        document_index: the document to make instances from.
        max_seq_length: the length limit, including `[CLS]` and two `[SEP]`.
        short_seq_prob: probability of a shorter random target length.
        rng: the random stream (consumed exactly as the original does, minus masking).
        stats: optional counters to update.

    Returns:
        The instances as ranges (see `assemble`).
    """
    document = all_documents[document_index]
    num_documents = len(all_documents)
    max_num_tokens = max_seq_length - 3
    uniform, randint = rng.random, rng.randint  # hot loop: bound once
    target_seq_length = max_num_tokens
    if uniform() < short_seq_prob:
        target_seq_length = randint(2, max_num_tokens)

    instances: list[PairSpec] = []
    counts = [0, 0, 0, 0, 0, 0]  # random next, forced, truncated, removed, tokens
    current_chunk: list[Segment] = []
    current_length = 0
    i = 0
    last = len(document) - 1
    while i <= last:
        segment = document[i]
        current_chunk.append(segment)
        current_length += segment[1]
        if i == last or current_length >= target_seq_length:
            a_end = 1
            if len(current_chunk) >= 2:
                a_end = randint(1, len(current_chunk) - 1)
            tokens_a = current_chunk[:a_end]
            len_a = sum([length for _, length in tokens_a])

            # The short-circuit matters: with one segment no random number is drawn.
            forced = len(current_chunk) == 1
            if forced or uniform() < 0.5:
                is_random_next = 1
                target_b_length = target_seq_length - len_a
                for _ in range(10):
                    random_document_index = randint(0, num_documents - 1)
                    if random_document_index != document_index:
                        break
                random_document = all_documents[random_document_index]
                random_start = randint(0, len(random_document) - 1)
                tokens_b = []
                len_b = 0
                for j in range(random_start, len(random_document)):
                    tokens_b.append(random_document[j])
                    len_b += random_document[j][1]
                    if len_b >= target_b_length:
                        break
                # The segments after A were not used: they start the next pair.
                i -= len(current_chunk) - a_end
            else:
                is_random_next = 0
                tokens_b = current_chunk[a_end:]
                len_b = current_length - len_a

            if len_a + len_b > max_num_tokens:
                a_front, a_back, b_front, b_back = truncate_seq_pair(
                    len_a, len_b, max_num_tokens, rng
                )
                removed = a_front + a_back + b_front + b_back
                tokens_a = _clip(tokens_a, a_front, a_back)
                tokens_b = _clip(tokens_b, b_front, b_back)
                counts[2] += 1
                counts[3] += removed
            else:
                removed = 0
            instances.append(PairSpec(tokens_a, tokens_b, is_random_next))
            counts[0] += is_random_next
            counts[1] += forced
            counts[4] += len_a + len_b + 3 - removed
            current_chunk = []
            current_length = 0
        i += 1
    if stats is not None:
        stats.instances += len(instances)
        stats.random_next += counts[0]
        stats.forced_random_next += counts[1]
        stats.truncated_instances += counts[2]
        stats.truncated_tokens += counts[3]
        stats.instance_tokens += counts[4]
    return instances


def create_chunk_instances(
    documents: list[list[Segment]],
    rng: random.Random,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    stats: InstanceStats | None = None,
) -> list[PairSpec]:
    """All instances of one chunk of documents, as the original makes them for a corpus.

    Shuffles the documents, makes `dupe_factor` passes of `create_instances_from_document`
    over them, and shuffles the instances, all with `rng`.

    Raises:
        ValueError: fewer than two documents (no "random next" document to draw from).
    """
    if len(documents) < 2:
        raise ValueError(
            f"next sentence prediction needs at least 2 documents, got {len(documents)}: "
            "separate the documents of the corpus with blank lines"
        )
    documents = list(documents)
    rng.shuffle(documents)
    instances: list[PairSpec] = []
    for _ in range(dupe_factor):
        for document_index in range(len(documents)):
            instances.extend(
                create_instances_from_document(
                    documents, document_index, max_seq_length, short_seq_prob, rng, stats
                )
            )
    rng.shuffle(instances)
    return instances


def chunk_rng(random_seed: int, chunk_index: int) -> random.Random:
    """The random stream of chunk `chunk_index`: independent of how chunks are scheduled.

    Chunk 0 uses `random_seed` itself, so a corpus that fits in one chunk gets exactly the
    original tool's document shuffle, pairs, NSP labels and truncations.
    """
    if chunk_index == 0:
        return random.Random(random_seed)
    # Distinct integer seeds per (seed, chunk); random.Random hashes them with SHA-512.
    return random.Random((random_seed << 64) ^ (chunk_index * 0x9E3779B97F4A7C15 + 1))


@dataclasses.dataclass
class InstanceBatch:
    """Instances as zero-padded arrays, ready for masking and serialisation."""

    input_ids: np.ndarray  # (N, T) int32
    segment_ids: np.ndarray  # (N, T) int32
    word_starts: np.ndarray  # (N, T) int32, 0 on [CLS]/[SEP]/padding
    lengths: np.ndarray  # (N,) int32
    next_sentence_labels: np.ndarray  # (N,) int32

    def __len__(self) -> int:
        return len(self.lengths)

    # Workers send instances through pipes: pickle each array in the narrowest integer type
    # that holds its values (token ids in 16 bits, flags in 8), a third of the bytes.
    def __getstate__(self) -> dict[str, np.ndarray]:
        return {f.name: _narrow(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def __setstate__(self, state: dict[str, np.ndarray]) -> None:
        for name, array in state.items():
            setattr(self, name, array.astype(np.int32))

    def split(self, rows: int) -> list[InstanceBatch]:
        """Consecutive parts of at most `rows` instances each (views, not copies)."""
        return [
            InstanceBatch(
                *(getattr(self, f.name)[start : start + rows] for f in dataclasses.fields(self))
            )
            for start in range(0, len(self), rows)
        ]


def _narrow(array: np.ndarray) -> np.ndarray:
    """`array` in the smallest integer type that holds its values."""
    if array.size == 0:
        return array
    low, high = int(array.min()), int(array.max())
    return array.astype(np.result_type(np.min_scalar_type(low), np.min_scalar_type(high)))


def assemble(
    chunk: TokenizedChunk,
    pairs: Sequence[PairSpec],
    max_seq_length: int,
    *,
    cls_id: int,
    sep_id: int,
) -> InstanceBatch:
    """Builds `[CLS] A [SEP] B [SEP]` rows, zero-padded to `max_seq_length`.

    The first token of A and of B is marked as a word start even when truncation left a
    continuation piece there, so no whole-word unit spans `[SEP]`.
    """
    n = len(pairs)
    # Every range of every pair, A's then B's: (start, length) in the chunk.
    ranges: list[Segment] = []
    for pair in pairs:
        ranges += pair.a
        ranges += pair.b
    a_ranges_per_pair = [len(pair.a) for pair in pairs]
    ranges_per_pair = [len(pair.b) + a for pair, a in zip(pairs, a_ranges_per_pair, strict=True)]
    flat = np.fromiter(itertools.chain.from_iterable(ranges), np.int64, 2 * len(ranges))
    table = flat.reshape(-1, 2)  # (K, 2)
    sources, sizes = table[:, 0], table[:, 1]
    per_pair = np.asarray(ranges_per_pair, np.int64)  # (N,)
    range_row = np.repeat(np.arange(n), per_pair)  # (K,)
    first_range = np.cumsum(per_pair) - per_pair  # (N,) index of each pair's first range
    index_in_pair = np.arange(len(sizes)) - first_range[range_row]
    in_b = index_in_pair >= np.asarray(a_ranges_per_pair, np.int64)[range_row]  # (K,)
    len_b = np.bincount(range_row, weights=sizes * in_b, minlength=n).astype(np.int64)
    len_a = np.bincount(range_row, weights=sizes * ~in_b, minlength=n).astype(np.int64)
    labels = np.fromiter([p.next_sentence_label for p in pairs], np.int32, n)
    if np.any(len_a < 1) or np.any(len_b < 1):
        raise AssertionError("empty A or B segment")
    lengths = len_a + len_b + 3
    if np.any(lengths > max_seq_length):
        raise AssertionError(f"an instance is longer than max_seq_length {max_seq_length}")
    # Where each range goes in its row: after [CLS], the ranges before it, and for B's the
    # [SEP] after A.
    before = np.cumsum(sizes) - sizes - (np.cumsum(sizes) - sizes)[first_range][range_row]
    dests = 1 + before + in_b

    # Expand the ranges into per-token indices: range k covers sizes[k] tokens, read from
    # sources[k] + i and written to flat position row * T + dests[k] + i of the output.
    # Within a range both move together, so each is arange + a per-range offset.
    index_type = np.int64 if n * max_seq_length + len(chunk.token_ids) >= 2**31 else np.int32
    first_token = np.cumsum(sizes) - sizes  # (K,) where range k starts in the expansion
    token_sources = np.arange(int(sizes.sum()), dtype=index_type)
    token_sources += np.repeat((sources - first_token).astype(index_type), sizes)
    flat_dests = (range_row * max_seq_length + dests - sources).astype(index_type)  # (K,)
    token_dests = token_sources + np.repeat(flat_dests, sizes)

    input_ids = np.zeros((n, max_seq_length), np.int32)
    word_starts = np.zeros((n, max_seq_length), np.int32)
    input_ids.reshape(-1)[token_dests] = chunk.token_ids[token_sources]
    word_starts.reshape(-1)[token_dests] = chunk.word_starts[token_sources]
    row_index = np.arange(n)
    input_ids[:, 0] = cls_id
    input_ids[row_index, len_a + 1] = sep_id
    input_ids[row_index, lengths - 1] = sep_id
    word_starts[:, 1] = 1
    word_starts[row_index, len_a + 2] = 1
    positions = np.arange(max_seq_length)[None, :]
    segment_ids = ((positions >= (len_a + 2)[:, None]) & (positions < lengths[:, None])).astype(
        np.int32
    )
    return InstanceBatch(input_ids, segment_ids, word_starts, lengths.astype(np.int32), labels)
