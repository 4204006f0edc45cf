r"""SQuAD as passage retrieval: the dev set's questions against all of its paragraphs, and
(question, paragraph) training pairs from SQuADShifts, with no dev paragraph in training.

The data is the real SQuAD v1.1 dev set and SQuADShifts (Miller et al. 2020) as the
BIG-bench sdist ships them (`data_pipelines.tasks.bigbench`: `squad_dev()`, and
`task_files(["squad_shifts/<shift>.json"])` for `bigbench.SQUAD_SHIFTS`); any file in the
SQuAD JSON layout reads the same. BIG-bench files are for fine-tuning and evaluation only.

**Retrieval set** (`squad_dev_retrieval`): every question is a query, every paragraph of
the file a passage, and the paragraph the question was asked on (the one holding its
answer) is its one relevant passage. A passage's id is `<article index>-<paragraph index>`
in the file, so ids are stable for a given file. Paragraphs whose texts are equal after
whitespace normalisation (runs of whitespace read as one space, ends stripped) are one
passage, under the first one's id, and their questions point at it; the merge is logged.
On the v1.1 dev set: 10,565 questions, 2,067 paragraphs (none duplicated).

**Training pairs** (`squad_pairs`): each question of the files with its own paragraph.
Paragraphs found among `exclude_passages` (whitespace-normalised text, as above) are
dropped with all of their questions, and counted in the log: dropping rather than refusing
lets a user train on files that share a few paragraphs with the evaluation set, and the log
says how many. `write_pairs_tsv` writes the pairs in the pairs format that contrastive
fine-tuning reads: one `query<TAB>positive[<TAB>negative]` line per pair, UTF-8, no header,
each tab, carriage return or line feed inside a text replaced by a space.

A file that is not in the SQuAD layout is a `TaskDataError` naming the file and where the
expected field is missing (`data[3].paragraphs[2]: no 'context' string`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence

from data_pipelines.tasks.formats import TaskDataError, read_text

log = logging.getLogger(__name__)

_CONTROL = str.maketrans({"\t": " ", "\r": " ", "\n": " "})


@dataclasses.dataclass(frozen=True)
class RetrievalSet:
    """Queries, passages and which passages answer which query (ir-measures' qrels)."""

    queries: dict[str, str]  # qid -> question
    corpus: dict[str, str]  # pid -> paragraph
    qrels: dict[str, dict[str, int]]  # qid -> {pid: 1} for each relevant passage


def normalize_text(text: str) -> str:
    """Whitespace runs as one space, ends stripped: the key under which passages are equal."""
    return " ".join(text.split())


def _load(path: str | os.PathLike) -> tuple[str, dict]:
    path = os.fspath(path)
    try:
        return path, json.loads(read_text(path))
    except FileNotFoundError:
        raise TaskDataError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise TaskDataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None


def _field(obj, key: str, kind: type, path: str, where: str):
    """`obj[key]`, checked to be a `kind`; else a TaskDataError naming the file and place."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind):
        name = {list: "list", str: "string"}[kind]
        raise TaskDataError(f"{path}: {where}: no {key!r} {name} (SQuAD layout)")
    return value


def read_paragraphs(path: str | os.PathLike) -> Iterator[tuple[str, str, list[tuple[str, str]]]]:
    """(`<article>-<paragraph>` id, context, [(question id, question)]) of a SQuAD JSON file."""
    path, data = _load(path)
    if not isinstance(data, dict):
        raise TaskDataError(f"{path}: expected an object with a 'data' list (SQuAD layout)")
    for a, article in enumerate(_field(data, "data", list, path, "top level")):
        for p, paragraph in enumerate(_field(article, "paragraphs", list, path, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = _field(paragraph, "context", str, path, where)
            questions = []
            for q, qa in enumerate(_field(paragraph, "qas", list, path, where)):
                qa_where = f"{where}.qas[{q}]"
                qid = _field(qa, "id", str, path, qa_where)
                question = _field(qa, "question", str, path, qa_where)
                if not question.strip():
                    raise TaskDataError(f"{path}: {qa_where} (id {qid}): empty question")
                questions.append((qid, question))
            if not context.strip():
                raise TaskDataError(f"{path}: {where}: empty context")
            yield f"{a}-{p}", context, questions


def squad_dev_retrieval(path: str | os.PathLike) -> RetrievalSet:
    """Every question of a SQuAD JSON file against every paragraph of it (module docstring).

    Args:
        path: a SQuAD v1.1 JSON file, e.g. `data_pipelines.tasks.bigbench.squad_dev()`.
    """
    queries: dict[str, str] = {}
    corpus: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    pid_of_text: dict[str, str] = {}
    merged = 0
    for pid, context, questions in read_paragraphs(path):
        key = normalize_text(context)
        if key in pid_of_text:
            merged += 1
            pid = pid_of_text[key]
        else:
            pid_of_text[key] = pid
            corpus[pid] = context
        for qid, question in questions:
            if qid in queries:
                raise TaskDataError(f"{os.fspath(path)}: question id {qid} appears twice")
            queries[qid] = question
            qrels[qid] = {pid: 1}
    if merged:
        log.info(
            "%s: %d paragraph(s) repeat an earlier one's text and are merged into its id",
            os.fspath(path), merged,
        )  # fmt: skip
    log.info("%s: %d questions, %d passages", os.fspath(path), len(queries), len(corpus))
    return RetrievalSet(queries, corpus, qrels)


def squad_pairs(
    paths: Sequence[str | os.PathLike], exclude_passages: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """(question, paragraph) pairs of SQuAD JSON files, without `exclude_passages`.

    Args:
        paths: SQuAD JSON files, e.g. SQuADShifts' (`bigbench.task_files`).
        exclude_passages: texts (e.g. the dev set's `RetrievalSet.corpus.values()`); a
            paragraph equal to one of them after whitespace normalisation is dropped with
            its questions, and the drops are counted in the log.
    """
    excluded = {normalize_text(text) for text in exclude_passages}
    pairs: list[tuple[str, str]] = []
    for path in paths:
        dropped_paragraphs = dropped_questions = 0
        for _, context, questions in read_paragraphs(path):
            if normalize_text(context) in excluded:
                dropped_paragraphs += 1
                dropped_questions += len(questions)
                continue
            pairs += [(question, context) for _, question in questions]
        if dropped_paragraphs:
            log.warning(
                "%s: dropped %d paragraph(s) (%d question(s)) that are in the excluded "
                "passages", os.fspath(path), dropped_paragraphs, dropped_questions,
            )  # fmt: skip
        log.info("%s: %d pairs so far", os.fspath(path), len(pairs))
    return pairs


def write_pairs_tsv(pairs: Iterable[Sequence[str]], path: str | os.PathLike) -> int:
    """Writes `query<TAB>positive[<TAB>negative]` lines; returns the number written.

    Tabs and line breaks inside a text become spaces, so every pair stays one line of two
    (or three) columns. The file is written to `path.part` and renamed when complete.
    """
    path = os.fspath(path)
    count = 0
    with open(path + ".part", "w", encoding="utf-8", newline="\n") as f:
        for pair in pairs:
            if len(pair) not in (2, 3) or not all(text.strip() for text in pair):
                raise ValueError(f"pair {count + 1}: {pair!r}: expected 2 or 3 non-empty texts")
            f.write("\t".join(text.translate(_CONTROL) for text in pair) + "\n")
            count += 1
    os.replace(path + ".part", path)
    return count
