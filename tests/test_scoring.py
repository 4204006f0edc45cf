"""Evaluation metrics against hand-worked cases and independent references.

GLUE metrics: values worked out by hand (confusion counts written in the comments) and
numpy's correlation. Entity F1: hand-counted conlleval cases. SQuAD: transformers'
port of the official evaluation script (`transformers.data.metrics.squad_metrics`).
"""

import math

import numpy as np
import pytest

from bert_jax import scoring
from data_pipelines.tasks import glue


def test_accuracy_f1_and_matthews_on_a_hand_worked_case():
    labels = [1, 1, 0, 0, 1]
    preds = [1, 0, 0, 1, 1]  # TP=2 TN=1 FP=1 FN=1
    assert scoring.accuracy(labels, preds) == pytest.approx(3 / 5)
    assert scoring.binary_f1(labels, preds) == pytest.approx(2 / 3)  # P = R = 2/3
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (2 - 1) / sqrt(3*3*2*2)
    assert scoring.matthews_corrcoef(labels, preds) == pytest.approx(1 / 6)
    assert scoring.matthews_corrcoef([0, 1, 0, 1], [0, 0, 0, 0]) == 0.0


def test_pearson_and_spearman():
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    y = x + rng.normal(size=50)
    assert scoring.pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    # Spearman is Pearson on ranks; a monotone map keeps it at 1.
    assert scoring.spearman(x, np.exp(x)) == pytest.approx(1.0)
    ranks = lambda v: np.argsort(np.argsort(v))  # noqa: E731 (no ties here)
    expected = np.corrcoef(ranks(x), ranks(y))[0, 1]
    assert scoring.spearman(x, y) == pytest.approx(expected, abs=1e-12)


def test_classification_metrics_by_glue_task():
    out = scoring.classification_metrics(glue.METRICS["mrpc"], [1, 1, 0, 0, 1], [1, 0, 0, 1, 1])
    assert out == pytest.approx({"f1": 2 / 3, "accuracy": 3 / 5})
    with pytest.raises(ValueError, match="3 labels but 2 predictions"):
        scoring.classification_metrics(("accuracy",), [0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="unknown metric"):
        scoring.classification_metrics(("auc",), [0], [0])


def test_entity_scores_count_like_conlleval():
    gold = [
        ["B-PER", "I-PER", "O", "B-LOC"],
        ["I-ORG", "I-ORG", "O", "B-MISC"],  # conlleval: I- after O opens a chunk
    ]
    pred = [
        ["B-PER", "I-PER", "O", "B-ORG"],  # PER right, LOC typed wrong
        ["B-ORG", "I-ORG", "O", "I-MISC"],  # ORG right (same span), MISC right
    ]
    # gold chunks 4, predicted 4, correct 3 -> P = R = F1 = 0.75
    scores = scoring.entity_scores(gold, pred)
    assert scores["precision"] == pytest.approx(0.75)
    assert scores["recall"] == pytest.approx(0.75)
    assert scores["f1"] == pytest.approx(0.75)
    assert scores["accuracy"] == pytest.approx(5 / 8)  # tags equal at 3 + 2 of 8 positions
    assert scores["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    # A boundary error: the predicted PER is one token short, so no credit at all.
    short = scoring.entity_scores([["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-PER", "O"]])
    assert short["f1"] == 0.0


def test_entity_scores_read_iobes():
    gold = [["S-LOC", "O", "B-PER", "I-PER", "E-PER"]]
    pred = [["S-LOC", "O", "B-PER", "E-PER", "S-PER"]]  # LOC right; PER split in two
    scores = scoring.entity_scores(gold, pred)
    # gold 2 chunks, predicted 3, correct 1 -> P = 1/3, R = 1/2
    assert scores["precision"] == pytest.approx(1 / 3)
    assert scores["recall"] == pytest.approx(1 / 2)
    assert scores["f1"] == pytest.approx(0.4)


def test_entity_scores_length_mismatch_is_named():
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        scoring.entity_scores([["O", "O"]], [["O"]])


# --- SQuAD ------------------------------------------------------------------------------------

PAIRS = [
    ("The Eiffel Tower", "eiffel tower"),
    ("in 1889", "1889"),
    ("an apple a day", "The apple, a day!"),
    ("Norman", "Normans"),
    ("the", ""),
    ("", ""),
    ("", "something"),
    ("10th and 11th centuries", "the 10th century"),
    ("a b a b", "b a"),
]


def test_exact_and_f1_equal_the_official_definitions():
    squad_metrics = pytest.importorskip("transformers.data.metrics.squad_metrics")
    for gold, pred in PAIRS:
        assert scoring.exact_match(gold, pred) == squad_metrics.compute_exact(gold, pred)
        assert scoring.token_f1(gold, pred) == pytest.approx(
            squad_metrics.compute_f1(gold, pred)
        ), (gold, pred)
    # A hand-worked F1: gold {10th, and, 11th, centuries}, pred {10th, century}: 1 common.
    assert scoring.token_f1("10th and 11th centuries", "the 10th century") == pytest.approx(
        2 * (1 / 2) * (1 / 4) / (1 / 2 + 1 / 4)
    )


def test_v11_scores_every_gold_answer_and_differs_only_on_empty_ones():
    gold = {"q1": ["Denver Broncos", "The Denver Broncos"], "q2": ["1889", "in 1889"]}
    predictions = {"q1": "Broncos", "q2": "in 1889"}
    result = scoring.squad_scores(gold, predictions, version="1.1")
    # q1: EM 0, F1 vs "denver broncos" = 2 * (1/1 * 1/2) / (1 + 1/2) = 2/3; q2: EM 1, F1 1.
    assert result == pytest.approx({"exact": 50.0, "f1": 100 * (2 / 3 + 1) / 2, "total": 2})
    # A gold answer that normalises to nothing: v1.1 gives F1 0, v2.0 compares "" with "".
    degenerate = scoring.squad_scores({"q": ["The"]}, {"q": ""}, version="1.1")
    assert (degenerate["exact"], degenerate["f1"]) == (100.0, 0.0)


def test_v2_scores_and_best_threshold_equal_transformers():
    squad_metrics = pytest.importorskip("transformers.data.metrics.squad_metrics")
    from transformers.data.processors.squad import SquadExample

    gold = {
        "a": ["Denver Broncos", "The Denver Broncos"],
        "b": [],
        "c": ["1889"],
        "d": [],
        "e": ["a red car", "red car"],
        "f": ["Saint Bernadette Soubirous"],
    }
    predictions = {"a": "Broncos", "b": "", "c": "1889", "d": "the tower", "e": "red", "f": ""}
    null_scores = {"a": -2.0, "b": 3.0, "c": -5.0, "d": 0.5, "e": 1.5, "f": 2.0}
    ours = scoring.squad_scores(gold, predictions, null_scores=null_scores, null_threshold=1.0)
    examples = [
        SquadExample(q, "question?", "context", None, None, "title",
                     answers=[{"text": t} for t in texts], is_impossible=not texts)
        for q, texts in gold.items()
    ]  # fmt: skip
    theirs = squad_metrics.squad_evaluate(examples, predictions, null_scores, 1.0)
    assert set(ours) == set(theirs)
    for key in theirs:
        assert ours[key] == pytest.approx(theirs[key]), key
    assert not math.isclose(ours["best_f1"], ours["f1"])  # the sweep found a better threshold


def test_missing_prediction_is_an_error():
    with pytest.raises(ValueError, match="1 question\\(s\\) have no prediction"):
        scoring.squad_scores({"q1": ["x"], "q2": ["y"]}, {"q1": "x"})
