r"""An independent reference for the demo's few-label NER: a linear tagger on character windows.

  python -m benchmarks.ner_linear_reference [--label_budgets=100,400,1600 --subsets=5 --seed=0]

scikit-learn's logistic regression tags each character from the characters around it
(unigrams at offsets -2..+2 and bigrams at -2..+1, one-hot), on exactly the label subsets
`make demo` fine-tunes on (`experiments.label_budgets.paired_subsets` with the same seed),
its C chosen per subset on the same dev sentences, test entity F1 scored by the same
`bert_jax.scoring.entity_scores`. It is what a few labels give a model that already knows
that neighbouring characters matter, which a transformer trained from random weights must
learn from those labels alone. Prints one JSON line per budget and writes them to --output.
"""

from __future__ import annotations

import json

import numpy as np
from absl import app, flags

from bert_jax import scoring
from data_pipelines import cli
from data_pipelines.tasks.tagging_tasks import load_tagging_task

FLAGS = flags.FLAGS


def window_features(words, i: int) -> dict[str, int]:
    """One-hot character unigrams at offsets -2..+2 and bigrams at -2..+1 around `i`."""

    def at(j: int) -> str:
        return words[j] if 0 <= j < len(words) else "<s>"

    unigrams = {f"c{d}={at(i + d)}": 1 for d in (-2, -1, 0, 1, 2)}
    return unigrams | {f"b{d}={at(i + d)}{at(i + d + 1)}": 1 for d in (-2, -1, 0, 1)}


def sentence_features(examples) -> list[list[dict[str, int]]]:
    return [[window_features(e.words, i) for i in range(len(e.words))] for e in examples]


def tag(model, vectorizer, features) -> list[list[str]]:
    flat = vectorizer.transform([f for sentence in features for f in sentence])
    predicted = iter(model.predict(flat))
    return [[next(predicted) for _ in sentence] for sentence in features]


def linear_reference(budgets, subsets: int, seed: int, dev_sentences: int = 500,
                     test_sentences: int | None = None,
                     c_values=(1.0, 10.0, 100.0)) -> list[dict]:  # fmt: skip
    """Per budget (sorted; "all": every training sentence): `labels`, `linear` (test entity
    F1 per subset, in the order of `label_budgets.paired_subsets(..., subsets, seed)`), `mean`
    and `c` (the C chosen on dev per subset)."""
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression

    from experiments import label_budgets  # JAX: only when run, not for `-h`

    task = load_tagging_task("peoples_daily_ner")
    train = task.splits["train"]
    dev = task.splits["dev"][:dev_sentences]
    test = task.splits["test"][: test_sentences or None]
    dev_features, test_features = sentence_features(dev), sentence_features(test)
    budgets = sorted({len(train) if b == "all" else int(b) for b in budgets})
    drawn = label_budgets.paired_subsets(len(train), budgets, subsets, seed)
    results = []
    for labels in budgets:
        f1, chosen = [], []
        for indices in drawn[labels]:
            examples = [train[i] for i in indices]
            vectorizer = DictVectorizer()
            x = vectorizer.fit_transform([f for s in sentence_features(examples) for f in s])
            y = [t for e in examples for t in e.tags]
            best = None
            for c in c_values:
                model = LogisticRegression(C=c, max_iter=2000).fit(x, y)
                gold = [list(e.tags) for e in dev]
                score = scoring.entity_scores(gold, tag(model, vectorizer, dev_features))["f1"]
                if best is None or score > best[0]:
                    best = (score, c, model)
            gold = [list(e.tags) for e in test]
            predicted = tag(best[2], vectorizer, test_features)
            f1.append(scoring.entity_scores(gold, predicted)["f1"])
            chosen.append(best[1])
        results.append({"labels": labels, "linear": f1, "mean": float(np.mean(f1)), "c": chosen})
    return results


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    results = linear_reference(
        FLAGS.label_budgets, FLAGS.subsets, FLAGS.seed, FLAGS.dev_sentences,
        FLAGS.test_sentences, [float(v) for v in FLAGS.c_values],
    )  # fmt: skip
    for row in results:
        print(json.dumps(row), flush=True)
    if FLAGS.output:
        with open(FLAGS.output, "w", encoding="utf-8") as f:
            json.dump({"seed": FLAGS.seed, "label_budgets": results}, f, indent=2)


if __name__ == "__main__":
    flags.DEFINE_list("label_budgets", ["100", "400", "1600"], "Labelled training sentences.")
    flags.DEFINE_integer("subsets", 5, "Label subsets per budget (the demo's, same seed).")
    flags.DEFINE_integer("seed", 0, "The demo's --seed (it draws the subsets).")
    flags.DEFINE_integer("dev_sentences", 500, "Dev sentences that choose C (the demo's).")
    flags.DEFINE_integer("test_sentences", None, "Score the first N test sentences (the "
                         "demo's --test_sentences; default all).")  # fmt: skip
    flags.DEFINE_list("c_values", ["1", "10", "100"], "Inverse regularisation strengths tried.")
    flags.DEFINE_string("output", "", "A JSON file for the results (optional).")
    cli.run(main)
