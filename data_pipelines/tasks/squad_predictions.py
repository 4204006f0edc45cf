"""SQuAD answers from start/end logits: n-best spans per question, text in the context's own
characters, and v2.0's no-answer decision.

For every question, over all of its windows: the `n_best_size` highest start and end
logits give candidate spans; a span is kept if both ends are document pieces, it is not
reversed, it is at most `max_answer_length` pieces long, and its start piece has its
most context in that window. With `version_2_with_negative`, each window's [CLS] score
(start + end logit at position 0) is a candidate "no answer", and the question is answered
"" when the best null score exceeds the best span score by more than
`null_score_diff_threshold` (the original's rule). Candidates sharing the same text are
merged; probabilities are a softmax over the n-best scores.

The answer text is cut from the original context: the predicted pieces, with "##"
continuations joined, are matched (ignoring spaces, case and accents as the tokenizer
does) against the covered words, so a span that starts or ends inside a word
("Smith's" -> "Smith") keeps the context's exact characters.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np

from data_pipelines.tasks.squad import SquadExample, SquadFeatures
from data_pipelines.tokenizer_base import wordpiece_text


@dataclasses.dataclass(frozen=True)
class Candidate:
    text: str
    start_logit: float
    end_logit: float
    probability: float = 0.0


@dataclasses.dataclass
class SquadPredictions:
    answers: dict[str, str]  # question id -> predicted text ("" = no answer)
    nbest: dict[str, list[Candidate]]  # question id -> best candidates, best first
    null_score_diff: dict[str, float]  # v2.0: null score - best span score (the "null odds")


def _normalize(char: str, lower: bool) -> str:
    """What the uncased tokenizer makes of one character: lower-cased, accents dropped."""
    if not lower:
        return char
    decomposed = unicodedata.normalize("NFD", char.lower())
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn")


def project_to_context(pred_text: str, orig_text: str, lower: bool) -> str:
    """The part of `orig_text` that `pred_text` (normalised pieces) spells, else `orig_text`.

    Both sides are compared without whitespace; each normalised character remembers the
    original character it came from, so the result is a substring of `orig_text`.
    """
    normalized, source = [], []
    for i, char in enumerate(orig_text):
        if char.isspace():
            continue
        for n in _normalize(char, lower):
            normalized.append(n)
            source.append(i)
    target = "".join(c for c in pred_text if not c.isspace())
    at = "".join(normalized).find(target)
    if not target or at < 0:
        return orig_text  # e.g. an [UNK] piece: keep the whole words
    return orig_text[source[at] : source[at + len(target) - 1] + 1]


def _top(logits: np.ndarray, n: int) -> list[int]:
    return [int(i) for i in np.argsort(-logits, kind="stable")[:n]]


def _softmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def _span_text(example, features, f, s, e, do_lower_case, pieces_text) -> str:
    """The context text of pieces s..e of window f."""
    pred_text = pieces_text(features.tokens[f][s : e + 1])
    first, last = features.token_to_word[f][s], features.token_to_word[f][e]
    orig_text = " ".join(example.doc_words[first : last + 1])
    return project_to_context(pred_text, orig_text, do_lower_case)


def postprocess(
    examples: Sequence[SquadExample],
    features: SquadFeatures,
    start_logits: np.ndarray,  # (F, T)
    end_logits: np.ndarray,  # (F, T)
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    do_lower_case: bool = True,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
    pieces_text: Callable[[Sequence[str]], str] = wordpiece_text,
) -> SquadPredictions:
    """Answers for every example (see the module docstring). `pieces_text` spells a span's
    pieces as text (`Tokenizer.pieces_text`: the tokenizer's own decoder); the default is
    WordPiece's '##' rule."""
    by_example = collections.defaultdict(list)
    for f, example_index in enumerate(features.example_index):
        by_example[int(example_index)].append(f)
    answers, nbest_out, null_diff = {}, {}, {}
    for index, example in enumerate(examples):
        spans = []  # (score, feature, start, end); start 0 is the no-answer candidate
        null = None  # (score, feature)
        for f in by_example.get(index, []):
            starts, ends = start_logits[f], end_logits[f]
            if version_2_with_negative:
                score = float(starts[0] + ends[0])
                if null is None or score < null[0]:
                    null = (score, f)
            to_word, is_max = features.token_to_word[f], features.token_is_max_context[f]
            for s in _top(starts, n_best_size):
                for e in _top(ends, n_best_size):
                    if s not in to_word or e not in to_word or e < s:
                        continue
                    if e - s + 1 > max_answer_length or not is_max.get(s, False):
                        continue
                    spans.append((float(starts[s] + ends[e]), f, s, e))
        if null is not None:
            spans.append((null[0], null[1], 0, 0))
        spans.sort(key=lambda x: -x[0])  # stable: ties keep window, start, end order

        seen, candidates = set(), []
        for _, f, s, e in spans:
            if len(candidates) >= n_best_size:
                break
            text = (
                "" if s == 0 else _span_text(example, features, f, s, e, do_lower_case, pieces_text)
            )
            if text in seen:
                continue
            seen.add(text)
            candidates.append(Candidate(text, float(start_logits[f][s]), float(end_logits[f][e])))
        if null is not None and "" not in seen:  # the null answer is always a candidate
            f = null[1]
            candidates.append(Candidate("", float(start_logits[f][0]), float(end_logits[f][0])))
        if not candidates:
            candidates = [Candidate("empty", 0.0, 0.0)]
        probabilities = _softmax([c.start_logit + c.end_logit for c in candidates])
        candidates = [dataclasses.replace(c, probability=p)
                      for c, p in zip(candidates, probabilities, strict=True)]  # fmt: skip
        nbest_out[example.qas_id] = candidates

        best_span = next((c for c in candidates if c.text), None)
        if not version_2_with_negative:
            answers[example.qas_id] = candidates[0].text
            continue
        if best_span is None:
            null_diff[example.qas_id] = 0.0 if null is None else float("inf")
            answers[example.qas_id] = ""
            continue
        diff = null[0] - best_span.start_logit - best_span.end_logit  # (null is not None)
        null_diff[example.qas_id] = diff
        answers[example.qas_id] = "" if diff > null_score_diff_threshold else best_span.text
    return SquadPredictions(answers, nbest_out, null_diff)
