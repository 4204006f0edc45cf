"""Sentence (pair) examples -> padded int arrays `[CLS] A [SEP] (B [SEP])`, as the original.

Sequences longer than `max_seq_length` are truncated the way google-research/bert's
`run_classifier.py` does it (a single sentence keeps its first T-2 pieces; a pair drops
the last piece of the longer side until both fit in T-3), or, for long single texts with
`keep_tail=K`, keeping the first T-2-K pieces and the last K (the head+tail of Sun et al.
2019, "How to Fine-Tune BERT for Text Classification?": a review's verdict is often at its
end); every truncated example is counted and the count logged, so nothing is cut silently.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from data_pipelines.tasks.formats import SentenceExample, TaskDataError

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SentenceFeatures:
    input_ids: np.ndarray  # (N, T) int32, 0-padded
    input_mask: np.ndarray  # (N, T) int32, 1 on real tokens
    segment_ids: np.ndarray  # (N, T) int32, 0 for [CLS] A [SEP], 1 for B [SEP]
    labels: np.ndarray | None  # (N,) int32 class ids or float32 targets; None if unlabeled
    num_truncated: int  # examples that did not fit in T

    def __len__(self) -> int:
        return len(self.input_ids)


def truncate_pair(a: list[int], b: list[int], max_length: int) -> None:
    """Pops the last piece of the longer list (B on ties) until both fit, in place."""
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()


def encode_sentences(
    examples: Sequence[SentenceExample],
    tokenizer,
    max_seq_length: int,
    labels: Sequence[str] | None,
    *,
    name: str = "examples",
    keep_tail: int = 0,
) -> SentenceFeatures:
    """Tokenizes, truncates and pads `examples`.

    Args:
        examples: the examples, pairs and singles may mix.
        tokenizer: a `data_pipelines.tokenization` tokenizer.
        max_seq_length: T, including [CLS] and [SEP]s (at least 3 for pairs).
        labels: the class names in id order; None for a regression task (float labels).
        name: what the examples are (for messages), e.g. "sst-2 dev".
        keep_tail: a single text longer than T-2 keeps its last `keep_tail` pieces after
            its first T-2-keep_tail (0: only the first T-2, as the original). Pairs are
            truncated as the original truncates them.

    Raises:
        TaskDataError: an example's label is not in `labels` (e.g. seen only at eval), or
            a regression label is not a number.
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
    if not 0 <= keep_tail < max_seq_length - 2:
        raise ValueError(
            f"keep_tail must be in [0, max_seq_length - 2 = {max_seq_length - 2}), got {keep_tail}"
        )
    n = len(examples)
    ids = np.zeros((n, max_seq_length), np.int32)
    mask = np.zeros_like(ids)
    segments = np.zeros_like(ids)
    pieces_a = tokenizer.encode_batch([e.text_a for e in examples])
    pieces_b = tokenizer.encode_batch([e.text_b or "" for e in examples])
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    truncated = 0
    for row, (example, a, b) in enumerate(zip(examples, pieces_a, pieces_b, strict=True)):
        if example.text_b is not None:
            if len(a) + len(b) > max_seq_length - 3:
                truncated += 1
                truncate_pair(a, b, max_seq_length - 3)
            tokens = [cls, *a, sep, *b, sep]
            type_ids = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        else:
            if len(a) > max_seq_length - 2:
                truncated += 1
                head = max_seq_length - 2 - keep_tail
                a = a[:head] + (a[len(a) - keep_tail :] if keep_tail else [])
            tokens = [cls, *a, sep]
            type_ids = [0] * len(tokens)
        ids[row, : len(tokens)] = tokens
        segments[row, : len(tokens)] = type_ids
        mask[row, : len(tokens)] = 1
    if truncated:
        log.warning(
            "%s: %d of %d examples are longer than max_seq_length=%d and were truncated",
            name, truncated, n, max_seq_length,
        )  # fmt: skip
    return SentenceFeatures(ids, mask, segments, _label_array(examples, labels, name), truncated)


def _label_array(examples, labels, name) -> np.ndarray | None:
    present = [e.label is not None for e in examples]
    if not any(present):
        return None
    if not all(present):
        missing = next(e.guid for e in examples if e.label is None)
        raise TaskDataError(f"{name}: example {missing!r} has no label but others have one")
    if labels is None:  # regression
        try:
            return np.asarray([float(e.label) for e in examples], np.float32)
        except ValueError as e:
            raise TaskDataError(f"{name}: a regression label is not a number ({e})") from None
    index = {label: i for i, label in enumerate(labels)}
    out = np.zeros(len(examples), np.int32)
    for i, example in enumerate(examples):
        if example.label not in index:
            raise TaskDataError(
                f"{name}: example {example.guid!r} has label {example.label!r}, not one of the "
                f"labels seen in training {list(labels)}"
            )
        out[i] = index[example.label]
    return out
