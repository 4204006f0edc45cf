"""Sentence (pair) classification or regression on your own files: TSV, CSV or JSONL.

Columns (a header row for TSV and CSV, keys for JSONL): `text`, optional `text_b` (the
second text of a pair), and `label` (absent or empty in a test file that is only to be
predicted). The format is the file's extension: `.tsv` (tab-separated, no quoting: a text
may hold quotes), `.csv` (comma-separated, quoted as the `csv` module and spreadsheets write
it), `.jsonl` / `.json` (one object a line).

The label set is the training file's labels in sorted order, or the list given as
`labels`; a dev or test label outside it is an error naming the file and line, as is a
missing `text`. Labels are numbers to regress on when `label_type="number"`, or with
`"auto"` (the default) when every training label is a number and one of them is not an
integer (0/1 and 1..5 stay classes: give `number` to regress on them).
"""

from __future__ import annotations

import csv
import json
import os

from data_pipelines.tasks.formats import SentenceExample, TaskDataError, open_text

LABEL_TYPES = ("auto", "class", "number")
_FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}


def _format(path: str) -> str:
    kind = _FORMATS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise TaskDataError(f"{path}: the extension must be one of {', '.join(_FORMATS)} "
                            "(TSV, CSV or JSON lines)")  # fmt: skip
    return kind


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's keys, each once (json.loads keeps the last of a repeated key)."""
    keys = [k for k, _ in pairs]
    if twice := next((k for k in keys if keys.count(k) > 1), None):
        raise _DuplicateKey(twice)
    return dict(pairs)


def read_rows(path: str) -> list[tuple[int, dict]]:
    """(1-based line, {column: value}) of every non-empty row of `path`."""
    if os.path.isdir(path):
        raise TaskDataError(f"{path}: a directory, not a TSV, CSV or JSONL file")
    kind = _format(path)
    f = open_text(path)  # a BOM (Excel's "UTF-8") dropped; not UTF-8: named by its line
    rows = []
    with f:
        if kind == "jsonl":
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line, object_pairs_hook=_unique_keys)
                except _DuplicateKey as error:
                    raise TaskDataError(f"{path}:{number}: the key {error.args[0]!r} is given "
                                        "twice: which one is it?") from None  # fmt: skip
                except json.JSONDecodeError as error:
                    raise TaskDataError(f"{path}:{number}: not JSON ({error.msg}, column "
                                        f"{error.colno})") from None  # fmt: skip
                if not isinstance(row, dict):
                    raise TaskDataError(f"{path}:{number}: expected an object with 'text'")
                rows.append((number, row))
            return rows
        quoting = csv.QUOTE_NONE if kind == "tsv" else csv.QUOTE_MINIMAL
        reader = csv.reader(f, delimiter="\t" if kind == "tsv" else ",", quoting=quoting)
        header = None
        for fields in reader:
            number = reader.line_num
            if not any(x.strip() for x in fields):
                continue
            if header is None:
                header = [h.strip() for h in fields]
                if "text" not in header:
                    raise TaskDataError(f"{path}:{number}: the header {header} has no 'text' "
                                        "column (expected text[, text_b], label)")  # fmt: skip
                if twice := sorted({h for h in header if header.count(h) > 1}):
                    raise TaskDataError(f"{path}:{number}: the header names {twice[0]!r} "
                                        f"{header.count(twice[0])} times: which column is "
                                        "it? Give each column its own name")  # fmt: skip
                continue
            if len(fields) != len(header):
                raise TaskDataError(f"{path}:{number}: {len(fields)} fields, the header has "
                                    f"{len(header)}")  # fmt: skip
            rows.append((number, dict(zip(header, fields, strict=True))))
    return rows


def _is_number(text) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def read_examples(path: str, *, labeled: bool) -> list[SentenceExample]:
    """The examples of `path`; `labeled` requires a label on every row."""
    examples = []
    for number, row in read_rows(path):
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            raise TaskDataError(f"{path}:{number}: no 'text'")
        text_b = row.get("text_b")
        text_b = text_b if isinstance(text_b, str) and text_b.strip() else None
        label = row.get("label")
        label = None if label is None or (isinstance(label, str) and not label.strip()) else label
        if labeled and label is None:
            raise TaskDataError(f"{path}:{number}: no 'label'")
        examples.append(SentenceExample(f"{os.path.basename(path)}-{number}", text, text_b,
                                        None if label is None else str(label).strip()))  # fmt: skip
    if not examples:
        raise TaskDataError(f"{path}: no rows")
    return examples


def label_set(
    train: list[SentenceExample], labels: str = "", label_type: str = "auto", where: str = ""
):
    """(class names in id order, or None to regress on numbers); `where`: the training
    file, for the messages."""
    if label_type not in LABEL_TYPES:
        raise ValueError(f"label_type={label_type!r}: one of {', '.join(LABEL_TYPES)}")
    values = [e.label for e in train]
    numbers = all(_is_number(v) for v in values)
    if label_type == "number" or (
        label_type == "auto" and numbers and any(float(v) != int(float(v)) for v in values)
    ):
        if not numbers:
            bad = next(v for v in values if not _is_number(v))
            raise TaskDataError(f"{where or 'the training file'}: label_type='number' but "
                                f"the training label {bad!r} is not a number")  # fmt: skip
        return None
    if labels:
        return tuple(x.strip() for x in labels.split(","))
    check_spellings(set(values), where)
    return tuple(sorted(set(values)))


def check_spellings(labels: set[str], where: str = "") -> None:
    """Refuses class labels that are one number spelled several ways ("1", "01", "1.0"):
    each spelling would be a class of its own.

    Raises:
        TaskDataError: naming every spelling of each such number.
    """
    by_value: dict[float, list[str]] = {}
    for label in labels:
        if _is_number(label):
            by_value.setdefault(float(label), []).append(label)
    clashes = [sorted(spellings) for spellings in by_value.values() if len(spellings) > 1]
    if clashes:
        shown = "; ".join(" = ".join(repr(s) for s in c) for c in sorted(clashes))
        raise TaskDataError(
            f"{where or 'the training file'}: labels that are one number spelled several ways "
            f"({shown}) would be "
            f"{sum(map(len, clashes))} classes: write each class one way (or give "
            "--config.labels, or --config.label_type=number to regress on them)"
        )


def check_labels(examples, path: str, classes) -> list[SentenceExample]:
    """Labels as the task needs them: floats to regress on, or class names of `classes`."""
    out = []
    for e in examples:
        if e.label is None:
            out.append(e)
            continue
        line = e.guid.rsplit("-", 1)[1]
        if classes is None:
            if not _is_number(e.label):
                raise TaskDataError(f"{path}:{line}: label {e.label!r} is not a number")
            out.append(SentenceExample(e.guid, e.text_a, e.text_b, float(e.label)))
        elif e.label not in classes:
            raise TaskDataError(f"{path}:{line}: label {e.label!r} is not one of the "
                                f"training labels {list(classes)}")  # fmt: skip
        else:
            out.append(e)
    return out
