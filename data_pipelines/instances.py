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

Masking is not done here: it is vectorised in TensorFlow (`data_pipelines.masking`), so
the `random.Random` stream differs from the original's (which interleaves mask draws)
and the masks differ, while their distribution is the same.

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

Each instance also carries `word_starts` for whole-word masking: 1 on the first token of
a word (a token that is not a WordPiece continuation, or, with a word segmentation as
for Chinese, the first token of a segmented word), 0 on continuation pieces and special
tokens. The first token of A and of B is always a start, even when truncation cut a
word, so a unit never spans `[SEP]`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from data_pipelines.corpora import Document

# A segment: a sentence as token ids and the parallel word_starts flags.
Segment = tuple[list[int], list[int]]
# A tokenized document: its non-empty segments.
TokenizedDocument = list[Segment]


class Tokenizer(Protocol):
    """What instance creation needs from `data_pipelines.tokenization.WordPieceTokenizer`."""

    cls_id: int
    sep_id: int

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[str]]: ...

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]: ...

    def is_continuation(self, token: str) -> bool: ...


@dataclasses.dataclass
class Instance:
    """`[CLS] A [SEP] B [SEP]`, unpadded, before masking."""

    input_ids: list[int]
    segment_ids: list[int]
    next_sentence_label: int  # 0: B follows A in the document; 1: B is from another one
    word_starts: list[int]


@dataclasses.dataclass
class InstanceStats:
    """Counts for the stats JSON."""

    documents: int = 0
    sentences: int = 0
    tokens: int = 0  # tokens in the tokenized documents (one pass, before duplication)
    # Sentences with more tokens than fit in one instance (max_seq_length - 3): their
    # tokens get truncated wherever they are used.
    overlong_sentences: int = 0
    # Documents dropped because no sentence of theirs has a token.
    empty_documents: int = 0
    instances: int = 0
    random_next: int = 0
    truncated_instances: int = 0
    truncated_tokens: int = 0
    # Instance tokens (including [CLS]/[SEP]), summed over instances.
    instance_tokens: int = 0

    def merge(self, other: InstanceStats) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


class DocumentTokenizer:
    """Tokenizes chunks of documents into segments (ids + word_starts), batched in Rust.

    Args:
        tokenizer: a WordPiece or sentencepiece tokenizer from `data_pipelines.tokenization`.
        use_word_segmentation: take word starts from `Document.words` where a document has
            them (Chinese): each segmented word is tokenized on its own and its first
            token starts the word. Otherwise (and for documents without words) a token
            starts a word unless it is a continuation piece (`##x`).
    """

    def __init__(self, tokenizer: Tokenizer, *, use_word_segmentation: bool = True):
        self._tokenizer = tokenizer
        self._use_words = use_word_segmentation
        # token -> (id, 1 if it starts a word else 0): the vocabulary is small, the corpus
        # large, so each distinct token is looked up once.
        self._token_info: dict[str, tuple[int, int]] = {}

    def _info(self, tokens: list[str]) -> tuple[list[int], list[int]]:
        cache = self._token_info
        missing = [t for t in set(tokens) if t not in cache]
        if missing:
            ids = self._tokenizer.convert_tokens_to_ids(missing)
            for token, token_id in zip(missing, ids):
                cache[token] = (token_id, 0 if self._tokenizer.is_continuation(token) else 1)
        pairs = [cache[t] for t in tokens]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def __call__(
        self, documents: Sequence[Document], stats: InstanceStats, max_num_tokens: int
    ) -> list[TokenizedDocument]:
        """Tokenizes documents; drops empty sentences and documents (counted in `stats`)."""
        plain = [d for d in documents if not (self._use_words and d.words is not None)]
        plain_tokens = self._tokenizer.tokenize_batch([s for d in plain for s in d.sentences])
        segmented = [d for d in documents if self._use_words and d.words is not None]
        word_tokens = self._tokenize_words(segmented)

        result: list[TokenizedDocument] = []
        plain_iter = iter(plain_tokens)
        for document in documents:
            segments: TokenizedDocument = []
            if self._use_words and document.words is not None:
                for words in document.words:
                    ids: list[int] = []
                    starts: list[int] = []
                    for word in words:
                        word_ids, word_starts = word_tokens[word]
                        ids.extend(word_ids)
                        starts.extend(word_starts)
                    if ids:
                        segments.append((ids, starts))
            else:
                for _ in document.sentences:
                    tokens = next(plain_iter)
                    if tokens:
                        segments.append(self._info(tokens))
            stats.sentences += len(segments)
            stats.tokens += sum(len(s[0]) for s in segments)
            stats.overlong_sentences += sum(len(s[0]) > max_num_tokens for s in segments)
            if segments:
                stats.documents += 1
                result.append(segments)
            else:
                stats.empty_documents += 1
        return result

    def _tokenize_words(self, documents: Sequence[Document]) -> dict[str, Segment]:
        unique = sorted({w for d in documents for words in d.words or () for w in words})
        table: dict[str, Segment] = {}
        for word, tokens in zip(unique, self._tokenizer.tokenize_batch(unique)):
            ids, _ = self._info(tokens)
            table[word] = (ids, [1] + [0] * (len(ids) - 1) if ids else [])
        return table


def truncate_seq_pair(
    tokens_a: Segment, tokens_b: Segment, max_num_tokens: int, rng: random.Random
) -> tuple[Segment, Segment, int]:
    """Shortens the pair to `max_num_tokens`, one token at a time from the longer side.

    Each removed token is taken from the front or the back with probability 1/2 (one
    `rng.random()` per token, as in the original).

    Returns:
        The truncated A and B (new lists) and the number of tokens removed.
    """
    len_a, len_b = len(tokens_a[0]), len(tokens_b[0])
    # [start, end) windows of A and B that survive; moved instead of deleting items.
    a0, a1, b0, b1 = 0, len_a, 0, len_b
    removed = 0
    while (a1 - a0) + (b1 - b0) > max_num_tokens:
        front = rng.random() < 0.5
        if (a1 - a0) > (b1 - b0):
            if front:
                a0 += 1
            else:
                a1 -= 1
        elif front:
            b0 += 1
        else:
            b1 -= 1
        removed += 1
    if not removed:
        return tokens_a, tokens_b, 0
    return (
        (tokens_a[0][a0:a1], tokens_a[1][a0:a1]),
        (tokens_b[0][b0:b1], tokens_b[1][b0:b1]),
        removed,
    )


def _concat(segments: Sequence[Segment]) -> Segment:
    ids: list[int] = []
    starts: list[int] = []
    for segment_ids, segment_starts in segments:
        ids.extend(segment_ids)
        starts.extend(segment_starts)
    return ids, starts


def create_instances_from_document(
    all_documents: Sequence[TokenizedDocument],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    *,
    cls_id: int,
    sep_id: int,
    stats: InstanceStats | None = None,
) -> list[Instance]:
    """The sentence-pair instances of one document (the original algorithm, see module doc).

    Args:
        all_documents: the tokenized documents that "random next" B segments come from.
        document_index: the document to make instances from.
        max_seq_length: the length limit, including `[CLS]` and two `[SEP]`.
        short_seq_prob: probability of a shorter random target length.
        rng: the random stream (consumed exactly as the original does, minus masking).
        cls_id: id of `[CLS]`.
        sep_id: id of `[SEP]`.
        stats: optional counters to update.

    Returns:
        The instances, unpadded and unmasked.
    """
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances: list[Instance] = []
    current_chunk: list[Segment] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment[0])
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = _concat(current_chunk[:a_end])

                # The short-circuit matters: with one segment no random number is drawn.
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a[0])
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    b_segments = []
                    b_length = 0
                    for j in range(random_start, len(random_document)):
                        b_segments.append(random_document[j])
                        b_length += len(random_document[j][0])
                        if b_length >= target_b_length:
                            break
                    tokens_b = _concat(b_segments)
                    # The segments after A were not used: they start the next pair.
                    i -= len(current_chunk) - a_end
                else:
                    is_random_next = False
                    tokens_b = _concat(current_chunk[a_end:])

                tokens_a, tokens_b, removed = truncate_seq_pair(
                    tokens_a, tokens_b, max_num_tokens, rng
                )
                instance = _assemble(tokens_a, tokens_b, is_random_next, cls_id, sep_id)
                instances.append(instance)
                if stats is not None:
                    stats.instances += 1
                    stats.random_next += is_random_next
                    stats.truncated_instances += removed > 0
                    stats.truncated_tokens += removed
                    stats.instance_tokens += len(instance.input_ids)
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def _assemble(
    tokens_a: Segment, tokens_b: Segment, is_random_next: bool, cls_id: int, sep_id: int
) -> Instance:
    ids_a, starts_a = tokens_a
    ids_b, starts_b = tokens_b
    if not ids_a or not ids_b:
        raise AssertionError("empty A or B segment: max_seq_length is too small")
    input_ids = [cls_id, *ids_a, sep_id, *ids_b, sep_id]
    segment_ids = [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
    # A truncated segment may begin with a continuation piece: it still starts a unit.
    word_starts = [0, 1, *starts_a[1:], 0, 1, *starts_b[1:], 0]
    return Instance(input_ids, segment_ids, int(is_random_next), word_starts)


def create_chunk_instances(
    documents: list[TokenizedDocument],
    rng: random.Random,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    cls_id: int,
    sep_id: int,
    stats: InstanceStats | None = None,
) -> list[Instance]:
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
    instances: list[Instance] = []
    for _ in range(dupe_factor):
        for document_index in range(len(documents)):
            instances.extend(
                create_instances_from_document(
                    documents,
                    document_index,
                    max_seq_length,
                    short_seq_prob,
                    rng,
                    cls_id=cls_id,
                    sep_id=sep_id,
                    stats=stats,
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
    word_starts: np.ndarray  # (N, T) int32
    lengths: np.ndarray  # (N,) int32
    next_sentence_labels: np.ndarray  # (N,) int32


def to_batch(instances: Sequence[Instance], max_seq_length: int) -> InstanceBatch:
    """Pads instances into arrays of width `max_seq_length`."""
    n = len(instances)
    input_ids = np.zeros((n, max_seq_length), np.int32)
    segment_ids = np.zeros((n, max_seq_length), np.int32)
    word_starts = np.zeros((n, max_seq_length), np.int32)
    lengths = np.zeros((n,), np.int32)
    labels = np.zeros((n,), np.int32)
    for row, instance in enumerate(instances):
        length = len(instance.input_ids)
        if length > max_seq_length:
            raise AssertionError(f"instance of {length} tokens > max_seq_length {max_seq_length}")
        input_ids[row, :length] = instance.input_ids
        segment_ids[row, :length] = instance.segment_ids
        word_starts[row, :length] = instance.word_starts
        lengths[row] = length
        labels[row] = instance.next_sentence_label
    return InstanceBatch(input_ids, segment_ids, word_starts, lengths, labels)
