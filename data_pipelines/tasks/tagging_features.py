"""Tagged words -> `[CLS] pieces [SEP]` arrays with each word's tag on its first piece.

Each word is tokenized as it reads in the sentence `" ".join(words)` (`Tokenizer.encode_words`:
a byte-level BPE's words after the first carry the prefix space, 'Ġfox'), so its pieces are
those transformers gives the sentence. As in the BERT paper's NER setup, a word's label
(and, at evaluation, its prediction) sits on its first piece; the other pieces carry
weight 0. Words that do not fit in `max_seq_length` are cut (the example is counted as
truncated, the cut words are counted) and predicted "O" at evaluation, so every word of the
input still gets a tag; words that tokenize to nothing (e.g. a lone control character) are
counted and predicted "O" too. Words the vocabulary cannot spell (only `[UNK]`) are counted
and warned of above UNKNOWN_WARN_FRACTION: a model that reads most of a script as `[UNK]`
(an English vocab on Chinese text) cannot tell its words apart, whatever fine-tuning does.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from data_pipelines.tasks.formats import TaggingExample, TaskDataError

log = logging.getLogger(__name__)

UNKNOWN_WARN_FRACTION = 0.01  # warn when more words than this are only [UNK]


@dataclasses.dataclass
class TaggingFeatures:
    input_ids: np.ndarray  # (N, T) int32, padded with the tokenizer's pad id
    input_mask: np.ndarray  # (N, T) int32
    segment_ids: np.ndarray  # (N, T) int32, all 0
    label_ids: np.ndarray  # (N, T) int32: tag id at first pieces, 0 elsewhere
    label_weights: np.ndarray  # (N, T) float32: 1 at first pieces of words that fit
    word_positions: list[np.ndarray]  # per example: each word's first-piece index, -1 if none
    num_truncated: int  # examples with words cut off
    num_words_cut: int  # words beyond max_seq_length
    num_empty_words: int  # words with no word pieces
    num_unknown_words: int = 0  # words whose only piece is [UNK]

    def __len__(self) -> int:
        return len(self.input_ids)


def encode_tagged(
    examples: Sequence[TaggingExample],
    tokenizer,
    max_seq_length: int,
    tags: Sequence[str],
    *,
    name: str = "examples",
) -> TaggingFeatures:
    """Tokenizes every word, places tags on first pieces, pads to `max_seq_length`.

    Raises:
        TaskDataError: a tag outside `tags` (e.g. a type never seen in training), naming
            the example (its guid is `file:line`) and the tag.
    """
    n = len(examples)
    ids = np.full((n, max_seq_length), tokenizer.pad_id, np.int32)
    mask = np.zeros_like(ids)
    label_ids = np.zeros_like(ids)
    weights = np.zeros((n, max_seq_length), np.float32)
    index = {t: i for i, t in enumerate(tags)}
    # Each word as it reads in its sentence: after a space, for byte-level BPE.
    pieces = [p for e in examples for p in (tokenizer.encode_words(e.words) if e.words else [])]
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    truncated = cut = empty = 0
    unknown = sum(1 for p in pieces if len(p) == 1 and p[0] == tokenizer.unk_id)
    positions = []
    offset = 0
    for row, example in enumerate(examples):
        word_pieces = pieces[offset : offset + len(example.words)]
        offset += len(example.words)
        tokens = [cls]
        where = np.full(len(example.words), -1, np.int64)
        cut_here = 0
        for w, piece_ids in enumerate(word_pieces):
            if not piece_ids:
                empty += 1
                continue
            if len(tokens) + len(piece_ids) > max_seq_length - 1:
                cut_here = len(example.words) - w
                break
            where[w] = len(tokens)
            tokens.extend(piece_ids)
        if cut_here:
            truncated += 1
            cut += cut_here
        tokens.append(sep)
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
        positions.append(where)
        if example.tags is not None:
            for w, tag in enumerate(example.tags):
                if tag not in index:
                    raise TaskDataError(
                        f"{name}: {example.guid}: tag {tag!r} (word {w + 1}, "
                        f"{example.words[w]!r}) is not one of the training tags {list(tags)}"
                    )
                if where[w] >= 0:
                    label_ids[row, where[w]] = index[tag]
                    weights[row, where[w]] = 1.0
    if truncated or empty:
        log.warning(
            "%s: %d of %d examples longer than max_seq_length=%d (%d words cut, predicted 'O'); "
            "%d words without word pieces (predicted 'O')",
            name, truncated, n, max_seq_length, cut, empty,
        )  # fmt: skip
    if pieces and unknown > UNKNOWN_WARN_FRACTION * len(pieces):  # one entry per word
        log.warning(
            "%s: %d of %d words (%.1f%%) are [UNK] in this vocabulary: the model cannot tell "
            "them apart (is the vocab made for this language?)",
            name, unknown, len(pieces), 100.0 * unknown / len(pieces),
        )  # fmt: skip
    return TaggingFeatures(ids, mask, np.zeros_like(ids), label_ids, weights, positions,
                           truncated, cut, empty, unknown)  # fmt: skip


def decode(
    features: TaggingFeatures, predicted: np.ndarray, tags: Sequence[str]
) -> list[list[str]]:
    """(N, T) predicted tag ids -> one tag per word of every example ("O" where unplaced)."""
    out = []
    for row, where in enumerate(features.word_positions):
        out.append([tags[int(predicted[row, p])] if p >= 0 else "O" for p in where])
    return out
