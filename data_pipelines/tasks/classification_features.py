"""Sentence (pair) examples -> padded int arrays laid out as the tokenizer's model expects.

BERT's `[CLS] A [SEP] (B [SEP])`, as the original; a tokenizer.json's own post-processor
(RoBERTa's `<s> A </s></s> B </s>`, ModernBERT's `[CLS] A [SEP] B [SEP]`) for any other,
ids equal to transformers' `tokenizer(a, b, truncation=True, max_length=T)`
(`Tokenizer.encode_for_model_batch`).

Sequences longer than `max_seq_length` are truncated the way google-research/bert's
`run_classifier.py` does it (a single sentence keeps its first pieces; a pair drops the
last piece of the longer side until both fit; a tokenizer.json: the `tokenizers` library's
longest-first rule, as transformers), or, for long single texts with `keep_tail=K`,
keeping the first pieces and the last K (the head+tail of Sun et al. 2019, "How to
Fine-Tune BERT for Text Classification?": a review's verdict is often at its end); every
truncated example is counted and the count logged, so nothing is cut silently.
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
    input_ids: np.ndarray  # (N, T) int32, padded with the tokenizer's pad id
    input_mask: np.ndarray  # (N, T) int32, 1 on real tokens
    segment_ids: np.ndarray  # (N, T) int32, the tokenizer's token types (BERT: 0 on A, 1 on B)
    labels: np.ndarray | None  # (N,) int32 class ids or float32 targets; None if unlabeled
    num_truncated: int  # examples that did not fit in T

    def __len__(self) -> int:
        return len(self.input_ids)


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
        max_seq_length: T, special tokens included (at least 3 for BERT's pairs).
        labels: the class names in id order; None for a regression task (float labels).
        name: what the examples are (for messages), e.g. "sst-2 dev".
        keep_tail: a single text longer than T keeps its last `keep_tail` pieces after as
            many first ones as fit (0: only the first, as the original). Pairs are
            truncated as the tokenizer truncates them.

    Raises:
        TaskDataError: an example's label is not in `labels` (e.g. seen only at eval), or
            a regression label is not a number.
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
    room = max_seq_length - tokenizer.num_special_tokens(False)  # a single text's pieces
    if not 0 <= keep_tail < room:
        raise ValueError(f"keep_tail must be in [0, max_seq_length - {max_seq_length - room} "
                         f"= {room}), got {keep_tail}")  # fmt: skip
    n = len(examples)
    ids = np.full((n, max_seq_length), tokenizer.pad_id, np.int32)  # RoBERTa's id 0 is <s>
    mask = np.zeros_like(ids)
    segments = np.zeros_like(ids)
    inputs = tokenizer.encode_for_model_batch(
        [e.text_a for e in examples], [e.text_b for e in examples], max_seq_length
    )
    truncated = 0
    for row, (example, (tokens, type_ids, cut)) in enumerate(zip(examples, inputs, strict=True)):
        truncated += cut
        if cut and keep_tail and example.text_b is None:
            a = tokenizer.encode(example.text_a)
            tokens, type_ids, _ = tokenizer.with_special_tokens(
                a[: room - keep_tail] + a[len(a) - keep_tail :]
            )
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
