"""What every task reader shares: the example types, the data error, and TSV reading.

Readers turn files in a task's official layout into plain examples; feature conversion
(`classification_features`, `tagging_features`, `squad`) turns examples into arrays. Every
problem in a file is a `TaskDataError` that names the file and the 1-based line.
"""

from __future__ import annotations

import csv
import dataclasses
import io
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


def read_text(path: str | os.PathLike) -> str:
    """The text of a UTF-8 file, a byte-order mark (Excel's "UTF-8 with BOM") dropped.

    Raises:
        TaskDataError: no such file, or bytes that are not UTF-8, naming the file and the
            1-based line that holds them.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise TaskDataError(f"{path}: no such file") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise TaskDataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[error.start]:02x} at column {column}: "
            f"{error.reason}); save the file as UTF-8"
        ) from None


def open_text(path: str | os.PathLike) -> io.StringIO:
    """`read_text` as a file to read (newlines as written: csv reads them itself)."""
    return io.StringIO(read_text(path), newline="")


def read_tsv(path: str | os.PathLike, *, skip_header: bool) -> Iterator[tuple[int, list[str]]]:
    """Yields (1-based line number, fields) of a tab-separated file, quotes kept as text.

    GLUE files are not CSV-quoted (a sentence may start with a quote that never closes),
    so quoting is off, as the original BERT reader has it. A byte-order mark is dropped;
    bytes that are not UTF-8 are an error naming the line.
    """
    path = os.fspath(path)
    f = open_text(path)
    with f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            for row in reader:
                if skip_header and reader.line_num == 1:
                    continue
                yield reader.line_num, row
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
