"""Task scoring: downstream evaluation metrics, each as its task's official scorer computes it.

* GLUE: accuracy, binary F1 (MRPC, QQP), Matthews correlation (CoLA), Pearson and Spearman
  correlation (STS-B), from scikit-learn and scipy.
* Tagging: entity-level precision / recall / F1 as the CoNLL `conlleval` script counts
  them (an entity is right only if its type and both boundaries are), from `seqeval` in its
  default (conlleval-compatible) mode, which reads BIO, IOB1 and IOBES tags.
* SQuAD: exact match and token F1 of the official v1.1 / v2.0 evaluation scripts
  (answer normalisation, max over the gold answers, no-answer handling, v2.0's best
  null-score threshold), written out below because no maintained package ships them
  without a network download.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Mapping, Sequence

import numpy as np


def accuracy(labels: Sequence, predictions: Sequence) -> float:
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(labels, predictions))


def binary_f1(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """F1 of the positive class (label 1), as GLUE scores MRPC and QQP."""
    from sklearn.metrics import f1_score

    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0))


def matthews_corrcoef(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """Matthews correlation (CoLA); 0 when a side is constant."""
    from sklearn.metrics import matthews_corrcoef as mcc

    return float(mcc(labels, predictions))


def pearson(labels: Sequence[float], predictions: Sequence[float]) -> float:
    from scipy.stats import pearsonr

    return float(pearsonr(np.asarray(labels, np.float64), np.asarray(predictions, np.float64))[0])


def spearman(labels: Sequence[float], predictions: Sequence[float]) -> float:
    from scipy.stats import spearmanr

    labels, predictions = np.asarray(labels, np.float64), np.asarray(predictions, np.float64)
    return float(spearmanr(labels, predictions)[0])


_METRIC_FNS = {
    "accuracy": accuracy,
    "f1": binary_f1,
    "matthews_corrcoef": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def classification_metrics(
    names: Sequence[str], labels: Sequence, predictions: Sequence
) -> dict[str, float]:
    """{name: value} for metric `names` from `_METRIC_FNS` (e.g. a `glue.METRICS` entry)."""
    if len(labels) != len(predictions):
        raise ValueError(f"{len(labels)} labels but {len(predictions)} predictions")
    unknown = [n for n in names if n not in _METRIC_FNS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {sorted(_METRIC_FNS)}")
    return {name: _METRIC_FNS[name](labels, predictions) for name in names}


# --- tagging -------------------------------------------------------------------------------


def entity_scores(
    gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
) -> dict[str, float | dict]:
    """conlleval's overall and per-type precision, recall and F1 (and token accuracy).

    Returns:
        {"precision", "recall", "f1", "accuracy", "per_type": {type: {precision, recall,
        f1, support}}}, precision/recall/F1 as fractions (conlleval prints percentages).
    """
    from seqeval.metrics import (
        accuracy_score,
        classification_report,
        f1_score,
        precision_score,
        recall_score,
    )

    gold, predicted = [list(s) for s in gold], [list(s) for s in predicted]
    for i, (g, p) in enumerate(zip(gold, predicted, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
    report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    per_type = {
        name: {
            "precision": float(r["precision"]),
            "recall": float(r["recall"]),
            "f1": float(r["f1-score"]),
            "support": int(r["support"]),
        }
        for name, r in report.items()
        if not name.endswith(" avg")
    }
    return {
        "precision": float(precision_score(gold, predicted, zero_division=0)),
        "recall": float(recall_score(gold, predicted, zero_division=0)),
        "f1": float(f1_score(gold, predicted, zero_division=0)),
        "accuracy": float(accuracy_score(gold, predicted)),
        "per_type": per_type,
    }


# --- SQuAD ---------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, squeeze whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(gold: str, prediction: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(prediction))


def token_f1(gold: str, prediction: str, *, empty_matches_empty: bool = True) -> float:
    """Bag-of-normalised-tokens F1.

    v2.0 scores an empty side 1 if both are empty, else 0; v1.1 (`empty_matches_empty=False`)
    scores any comparison with no common token 0.
    """
    gold_tokens = normalize_answer(gold).split()
    predicted_tokens = normalize_answer(prediction).split()
    if empty_matches_empty and (not gold_tokens or not predicted_tokens):
        return float(gold_tokens == predicted_tokens)
    common = collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(
    gold_answers: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    *,
    version: str = "2.0",
    null_scores: Mapping[str, float] | None = None,
    null_threshold: float = 1.0,
) -> dict[str, float]:
    """The official SQuAD evaluation (`evaluate-v1.1.py` / `evaluate-v2.0.py`), EM and F1 in %.

    Args:
        gold_answers: question id -> gold answer texts; an empty list is an unanswerable
            (v2.0) question, whose only right answer is "".
        predictions: question id -> predicted text ("" predicts no answer). A question
            without a prediction is an error (the official scripts only print a warning).
        version: "1.1" or "2.0": which script's rules (they differ only on answers that
            normalise to nothing, and v2.0 adds the no-answer breakdown).
        null_scores: v2.0: question id -> no-answer score (the official `na_prob` file; here
            null score minus best span score). Above `null_threshold` the answer counts as
            "no answer" (the official `--na-prob-thresh`), and the best threshold is searched.
        null_threshold: see `null_scores`.

    Returns:
        {"exact", "f1", "total"}; v2.0 data with unanswerable questions adds
        "HasAns_*"/"NoAns_*" breakdowns, and with `null_scores` also
        "best_exact"/"best_f1" and their thresholds.
    """
    if version not in ("1.1", "2.0"):
        raise ValueError(f"version must be '1.1' or '2.0', got {version!r}")
    missing = [q for q in gold_answers if q not in predictions]
    if missing:
        raise ValueError(f"{len(missing)} question(s) have no prediction, e.g. {missing[:3]}")
    v2 = version == "2.0"
    exact, f1 = {}, {}
    for qid, answers in gold_answers.items():
        golds = ([a for a in answers if normalize_answer(a)] or [""]) if v2 else list(answers)
        prediction = predictions[qid]
        exact[qid] = max(exact_match(g, prediction) for g in golds)
        f1[qid] = max(token_f1(g, prediction, empty_matches_empty=v2) for g in golds)
    if not v2:
        return _mean_scores(exact, f1, list(exact))
    has_answer = {q: bool(gold_answers[q]) for q in exact}
    scores = {q: 0.0 for q in exact} if null_scores is None else null_scores
    exact_t = {q: float(not has_answer[q]) if scores[q] > null_threshold else s
               for q, s in exact.items()}  # fmt: skip
    f1_t = {q: float(not has_answer[q]) if scores[q] > null_threshold else s
            for q, s in f1.items()}  # fmt: skip
    result = _mean_scores(exact_t, f1_t, list(exact))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        ids = [q for q in exact if has_answer[q] == wanted]
        if ids:
            result |= {f"{prefix}_{k}": v for k, v in _mean_scores(exact_t, f1_t, ids).items()}
    if null_scores is not None:
        result |= _best_thresholds(exact, f1, null_scores, has_answer, predictions)
    return result


def _mean_scores(exact, f1, ids) -> dict[str, float]:
    return {
        "exact": 100.0 * sum(exact[q] for q in ids) / len(ids),
        "f1": 100.0 * sum(f1[q] for q in ids) / len(ids),
        "total": len(ids),
    }


def _best_thresholds(exact, f1, null_scores, has_answer, predictions) -> dict[str, float]:
    """The official v2.0 `find_best_thresh` on the raw (unthresholded) scores."""
    out = {}
    for name, scores in (("exact", exact), ("f1", f1)):
        # Every question answered "no answer" is right exactly on the unanswerable ones.
        current = best = float(sum(not has_answer[q] for q in scores))
        best_threshold = 0.0
        for qid in sorted(null_scores, key=lambda q: null_scores[q]):
            if qid not in scores:
                continue
            if has_answer[qid]:
                delta = scores[qid]
            else:
                delta = -1.0 if predictions[qid] else 0.0
            current += delta
            if current > best:
                best, best_threshold = current, null_scores[qid]
        out[f"best_{name}"] = 100.0 * best / len(scores)
        out[f"best_{name}_thresh"] = float(best_threshold)
    return out
