"""Training pairs for contrastive fine-tuning: a TSV of `query<TAB>positive[<TAB>negative...]`.

One pair a line, UTF-8 (a byte-order mark dropped), lines split on "\n" alone: the query (a
question, a title, a sentence), a text that answers or matches it, and optionally hard
negatives (texts that look relevant and are not), the same number on every line.
`data_pipelines.tasks.squad_retrieval.write_pairs_tsv` writes this layout. A first line
that names the columns (`query<TAB>positive[<TAB>negative...]`, or the usual other names:
`HEADER_NAMES`) is a header: skipped, with a log line. Bad lines are errors naming the file
and line: bytes that are not UTF-8, a missing column, an empty text, a query identical to
its positive (a pair that teaches nothing but copying), or a line with another number of
negatives than the first; so is a file whose positives are all one text (every query's
answer the same: nothing to tell apart, the loss 0 from the first step).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re

from data_pipelines.tasks.formats import TaskDataError

log = logging.getLogger(__name__)

# Column names a header line of a pairs file uses (lower-cased), as sentence-transformers'
# and BEIR's files name them; negatives: "negative", "negative_1", "hard_negative2", ...
HEADER_NAMES = (
    {"query", "queries", "question", "anchor", "q", "sentence1", "text", "text_a", "title"},
    {"positive", "pos", "positives", "answer", "passage", "document", "doc", "context",
     "sentence2", "text_b", "positive_passage"},
)  # fmt: skip
_NEGATIVE = re.compile(r"(hard_?)?neg(ative)?s?(_?\d+)?$")


def is_header(columns: list[str]) -> bool:
    """Whether a pairs file's first line names its columns rather than holding a pair."""
    names = [c.strip().lower() for c in columns]
    if len(names) < 2 or names[0] not in HEADER_NAMES[0] or names[1] not in HEADER_NAMES[1]:
        return False
    return all(_NEGATIVE.match(name) for name in names[2:])


@dataclasses.dataclass(frozen=True)
class Pairs:
    """Parallel lists: `queries[i]` matches `positives[i]`; `negatives[i]` is a tuple of K
    hard negatives (K = 0 when the file has none)."""

    queries: list[str]
    positives: list[str]
    negatives: list[tuple[str, ...]]

    def __len__(self) -> int:
        return len(self.queries)


def read_pairs(path: str | os.PathLike) -> Pairs:
    """The pairs of a TSV file (see the module doc).

    Raises:
        TaskDataError: naming the file and line of the first bad line, or an empty file.
        FileNotFoundError / IsADirectoryError: naming the path.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory; a pairs file is a TSV of query, "
                                "positive[, negative]")  # fmt: skip
    queries, positives, negatives = [], [], []
    width = None
    with open(path, "rb") as f:
        data = f.read()
    first = True
    for number, raw in enumerate(data.split(b"\n"), 1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8").removesuffix("\r")
        except UnicodeDecodeError as error:
            raise TaskDataError(
                f"{where}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column "
                f"{error.start + 1}); save the file as UTF-8"
            ) from None
        if not line.strip():
            continue
        columns = [c.strip() for c in line.split("\t")]
        if first:
            first = False
            if is_header(columns):
                log.info("%s: a header line (%s): skipped", where, ", ".join(columns))
                continue
        if len(columns) < 2:
            raise TaskDataError(f"{where}: one column; expected query<TAB>positive"
                                "[<TAB>negative...]")  # fmt: skip
        if empty := [i + 1 for i, c in enumerate(columns) if not c]:
            raise TaskDataError(f"{where}: column {empty[0]} is empty")
        if columns[0] == columns[1]:
            raise TaskDataError(f"{where}: the query is identical to its positive")
        if width is None:
            width = len(columns)
        elif len(columns) != width:
            raise TaskDataError(
                f"{where}: {len(columns)} columns where the first line has {width} (the "
                "same number of negatives on every line)"
            )
        queries.append(columns[0])
        positives.append(columns[1])
        negatives.append(tuple(columns[2:]))
    if not queries:
        raise TaskDataError(f"{path}: no pairs (expected query<TAB>positive lines)")
    if len(queries) > 1 and len(set(positives)) == 1:
        raise TaskDataError(
            f"{path}: all {len(queries)} pairs have the same positive ({positives[0][:40]!r}): "
            "in-batch negatives need other positives to tell apart (the loss is 0 from the "
            "first step)"
        )
    return Pairs(queries, positives, negatives)
