"""Training pairs for contrastive fine-tuning: a TSV of `query<TAB>positive[<TAB>negative...]`.

One pair a line, UTF-8, no header: the query (a question, a title, a sentence), a text that
answers or matches it, and optionally hard negatives (texts that look relevant and are not),
the same number on every line. `data_pipelines.tasks.squad_retrieval.write_pairs_tsv` writes
this layout. Bad lines are errors naming the file and line: a missing column, an empty text,
a query identical to its positive (a pair that teaches nothing but copying), or a line with
another number of negatives than the first.
"""

from __future__ import annotations

import dataclasses
import os

from data_pipelines.tasks.formats import TaskDataError


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
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            columns = [c.strip() for c in line.split("\t")]
            where = f"{path}:{number}"
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
    return Pairs(queries, positives, negatives)
