"""What every task reader shares: the example types, the data error, and TSV reading.

Readers turn files in a task's official layout into plain examples; feature conversion
(`classification_features`, `tagging_features`, `squad`) turns examples into arrays. Every
problem in a file is a `TaskDataError` that names the file and the 1-based line.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from collections.abc import Iterator, Sequence


class TaskDataError(ValueError):
    """Task data that cannot be read as its format says (names the file and line)."""


@dataclasses.dataclass(frozen=True)
class SentenceExample:
    """One sentence (or sentence pair) with its label.

    Attributes:
        guid: a unique id; for GLUE test sets, the `index` column the submission needs.
        text_a: the first (or only) sentence.
        text_b: the second sentence of a pair, else None.
        label: a class name (str), a regression target (float), or None when unlabeled.
    """

    guid: str
    text_a: str
    text_b: str | None = None
    label: str | float | None = None


@dataclasses.dataclass(frozen=True)
class TaggingExample:
    """One sentence of words with one tag per word (tags are None when unlabeled)."""

    guid: str
    words: tuple[str, ...]
    tags: tuple[str, ...] | None


def read_tsv(path: str | os.PathLike, *, skip_header: bool) -> Iterator[tuple[int, list[str]]]:
    """Yields (1-based line number, fields) of a tab-separated file, quotes kept as text.

    GLUE files are not CSV-quoted (a sentence may start with a quote that never closes),
    so quoting is off, as the original BERT reader has it.
    """
    path = os.fspath(path)
    try:
        f = open(path, encoding="utf-8", newline="")
    except FileNotFoundError:
        raise TaskDataError(f"{path}: no such file") from None
    with f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            for row in reader:
                if skip_header and reader.line_num == 1:
                    continue
                yield reader.line_num, row
        except UnicodeDecodeError as e:
            raise TaskDataError(f"{path}: not UTF-8 near line {reader.line_num + 1} ({e})") from e
        except csv.Error as e:
            raise TaskDataError(f"{path}:{reader.line_num}: {e}") from e


def field(path: str | os.PathLike, line: int, row: Sequence[str], index: int, name: str) -> str:
    """`row[index]`, or a TaskDataError naming the file, line, column and field count."""
    try:
        return row[index]
    except IndexError:
        raise TaskDataError(
            f"{os.fspath(path)}:{line}: expected a {name!r} column at index {index}, the row has "
            f"{len(row)} tab-separated field(s)"
        ) from None


def check_labels(examples: Sequence[SentenceExample], labels: Sequence[str], where: str) -> None:
    """Raises on a label outside `labels` (e.g. a dev label never seen in training)."""
    known = set(labels)
    for example in examples:
        if example.label is not None and example.label not in known:
            raise TaskDataError(
                f"{where}: example {example.guid!r} has label {example.label!r}, which is not "
                f"one of the task's labels {list(labels)}"
            )
