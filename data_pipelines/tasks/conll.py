"""CoNLL-format token tagging files: one token per line, a blank line between sentences.

Reads the CoNLL-2003 layout (`word POS chunk NER`, space-separated, `-DOCSTART-` lines
between documents) and every two-or-more-column variant (`word<TAB>tag`, ...): the word is
column 0, the tag column `tag_column` (default the last). Lines holding only whitespace
end a sentence. Tags must be `O` or `<prefix>-<TYPE>` with a prefix of B, I (BIO / IOB1)
or E, S (IOBES); anything else is a `TaskDataError` naming the file and line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from data_pipelines.tasks.formats import TaggingExample, TaskDataError, read_text

_TAG = re.compile(r"^(O|[BIES]-\S+)$")
DOCSTART = "-DOCSTART-"


def read_conll(
    path: str | os.PathLike, *, tag_column: int = -1, min_columns: int = 2
) -> list[TaggingExample]:
    """The sentences of a CoNLL file; each guid is `<file name>:<line of its first token>`."""
    path = os.fspath(path)
    lines = read_text(path).splitlines()  # a BOM dropped; not UTF-8: named by its line
    return parse_conll(lines, os.path.basename(path), tag_column=tag_column,
                       min_columns=min_columns, display=path)  # fmt: skip


def parse_conll(
    lines: Iterable[str],
    name: str,
    *,
    tag_column: int = -1,
    min_columns: int = 2,
    display: str | None = None,
) -> list[TaggingExample]:
    """`read_conll` on lines already read (`name` prefixes the guids, `display` the errors)."""
    display = display or name
    examples: list[TaggingExample] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0

    def flush():
        if words:
            examples.append(TaggingExample(f"{name}:{start}", tuple(words), tuple(tags)))
            words.clear()
            tags.clear()

    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == DOCSTART:
            flush()
            continue
        if len(fields) < min_columns:
            raise TaskDataError(
                f"{display}:{number}: expected a word and a tag ({min_columns}+ whitespace-"
                f"separated columns), got {len(fields)}: {line!r}"
            )
        try:
            tag = fields[tag_column]
        except IndexError:
            raise TaskDataError(
                f"{display}:{number}: no tag column {tag_column} in {len(fields)} columns"
            ) from None
        if not _TAG.match(tag):
            raise TaskDataError(
                f"{display}:{number}: tag {tag!r} is neither 'O' nor B-/I-/E-/S-<TYPE>"
            )
        if not words:
            start = number
        words.append(fields[0])
        tags.append(tag)
    flush()
    if not examples:
        raise TaskDataError(f"{display}: no sentences")
    return examples


def tag_list(examples: Sequence[TaggingExample]) -> tuple[str, ...]:
    """The tag set of `examples`: "O", then every prefix of the scheme for each type seen.

    A type seen only as `B-LOC` in training still gets `I-LOC` (and, for IOBES data,
    `E-LOC` and `S-LOC`), so a well-formed dev tag of a known type is never "unseen".
    """
    tags = {t for e in examples for t in (e.tags or ())} - {"O"}
    prefixes = "BIES" if any(t[0] in "ES" for t in tags) else "BI"
    types = sorted({t[2:] for t in tags})
    return ("O", *(f"{p}-{kind}" for kind in types for p in prefixes))


def write_conll(path: str, examples: Sequence[TaggingExample], predictions) -> None:
    """`word gold predicted` per line, a blank line after each sentence (conlleval's input)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for example, predicted in zip(examples, predictions, strict=True):
            gold = example.tags or ("O",) * len(example.words)
            for word, g, p in zip(example.words, gold, predicted, strict=True):
                f.write(f"{word} {g} {p}\n")
            f.write("\n")
    os.replace(tmp, path)
