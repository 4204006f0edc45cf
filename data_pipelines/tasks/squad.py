"""SQuAD v1.1 / v2.0: reading the official JSON (or TFDS `squad`) and sliding-window features.

Reading: each context is split into words on whitespace (space, tab, CR, LF and U+202F, as
google-research/bert does), and each answer's character span becomes a word span. An
answer whose `answer_start` does not point at its text in the context is an error naming
the file, the article and the question id (`skip_mismatched=True` skips such questions
instead; `realign_mismatched=True` moves the answer to the occurrence of its text in the
context nearest to `answer_start`, as when an offset is one character off; either logs each
question and counts them, and nothing is changed silently). A training question must have
exactly one answer unless it is marked `is_impossible` (v2.0).

Each document word is tokenized as it reads in the context (`Tokenizer.encode_words`: a
byte-level BPE's words after the first carry the prefix space, 'Ġfox', as in RoBERTa's SQuAD
preprocessing), so a window's pieces are transformers' pieces of the context's text where
its words are single-spaced (a run of spaces or a line break between words is read as one
space, as the original's whitespace split reads it).

Features (the original `run_squad.py` recipe): `[CLS] question [SEP] window [SEP]` (the
pair as the tokenizer lays it out: a tokenizer.json's own post-processor, e.g. RoBERTa's
`<s> question </s></s> window </s>`) with the question cut to `max_query_length` pieces and
the document covered by windows of at most `max_seq_length - len(question) - 3` pieces (3:
the pair's special tokens), each starting `doc_stride` pieces after the previous one. A
piece in several windows is scored only in the window where it has the most context on
both sides (`token_is_max_context`). For training, a window that does not contain the
whole answer (or an unanswerable question) points start and end at position 0 ([CLS]).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Sequence

import numpy as np

from data_pipelines.tasks.formats import TaskDataError, read_text

log = logging.getLogger(__name__)

_WHITESPACE = frozenset(" \t\r\n\u202f")


@dataclasses.dataclass(frozen=True)
class SquadExample:
    qas_id: str
    question: str
    context: str
    doc_words: tuple[str, ...]  # the context split on whitespace
    word_starts: tuple[int, ...]  # character offset of each word in `context`
    answer_text: str | None  # the (first) answer, the training target
    start_word: int  # word span of `answer_text`; -1 when there is none
    end_word: int
    is_impossible: bool  # v2.0: the context does not answer the question
    gold_answers: tuple[str, ...]  # every answer text (what predictions are scored against)
    # Character offset of `answer_text` in `context`; -1: at the start of its first word.
    answer_start: int = -1


def split_words(context: str) -> tuple[list[str], list[int], list[int]]:
    """(words, start char of each word, word index of each character)."""
    words, starts, char_to_word = [], [], []
    previous_space = True
    for i, char in enumerate(context):
        if char in _WHITESPACE:
            previous_space = True
        else:
            if previous_space:
                words.append(char)
                starts.append(i)
            else:
                words[-1] += char
            previous_space = False
        char_to_word.append(len(words) - 1)
    return words, starts, char_to_word


def read_squad(
    path: str | os.PathLike,
    *,
    is_training: bool,
    skip_mismatched: bool = False,
    realign_mismatched: bool = False,
) -> list[SquadExample]:
    """The questions of an official SQuAD JSON file (v1.1 or v2.0)."""
    path = os.fspath(path)
    try:
        data = json.loads(read_text(path))
    except FileNotFoundError:
        raise TaskDataError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise TaskDataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise TaskDataError(f"{path}: expected an object with a 'data' list (SQuAD layout)")
    return parse_articles(data["data"], path, is_training=is_training,
                          skip_mismatched=skip_mismatched,
                          realign_mismatched=realign_mismatched)  # fmt: skip


def parse_articles(
    articles: Iterable[dict],
    source: str,
    *,
    is_training: bool,
    skip_mismatched: bool = False,
    realign_mismatched: bool = False,
) -> list[SquadExample]:
    """SQuAD's `data` list -> examples (`source` names the file in messages)."""
    examples, skipped, realigned = [], 0, [0]
    for a, article in enumerate(articles):
        title = article.get("title", f"article {a}")
        for p, paragraph in enumerate(_get(article, "paragraphs", source, title)):
            where = f"{source}: article {title!r}, paragraph {p}"
            context = _get(paragraph, "context", source, where)
            words, starts, char_to_word = split_words(context)
            for qa in _get(paragraph, "qas", source, where):
                qas_id = str(_get(qa, "id", source, where))
                here = f"{where}, question {qas_id}"
                try:
                    if realign_mismatched:
                        qa = _realigned(qa, context, here, realigned)
                    examples.append(_example(qa, qas_id, context, words, starts, char_to_word,
                                             here, is_training))  # fmt: skip
                except TaskDataError as e:
                    if not (skip_mismatched and "does not match" in str(e)):
                        raise
                    skipped += 1
                    log.warning("skipping question: %s", e)
    if skipped:
        log.warning("%s: skipped %d question(s) whose answer offsets do not match", source, skipped)
    if realigned[0]:
        log.warning("%s: realigned %d answer(s) whose offsets missed their text", source,
                    realigned[0])  # fmt: skip
    if not examples:
        raise TaskDataError(f"{source}: no questions")
    return examples


def _get(obj: dict, key: str, source: str, where: str):
    try:
        return obj[key]
    except (KeyError, TypeError):
        raise TaskDataError(f"{where if where.startswith(source) else f'{source}: {where}'}: "
                            f"missing {key!r}") from None  # fmt: skip


def _realigned(qa: dict, context: str, where: str, count: list[int]) -> dict:
    """`qa` with each answer whose offset misses its text moved to its nearest occurrence.

    An answer whose text is nowhere in the context is left as it is (`_example` reports it).
    """
    answers = []
    for answer in qa.get("answers", []):
        text, start = answer.get("text"), answer.get("answer_start")
        if isinstance(text, str) and text and isinstance(start, int):
            if context[start : start + len(text)] != text and text in context:
                found, at = [], context.find(text)
                while at >= 0:
                    found.append(at)
                    at = context.find(text, at + 1)
                new = min(found, key=lambda at: abs(at - start))
                log.warning("%s: answer %r realigned from answer_start=%d to %d", where, text,
                            start, new)  # fmt: skip
                answer = {**answer, "answer_start": new}
                count[0] += 1
        answers.append(answer)
    return {**qa, "answers": answers}


def _example(qa, qas_id, context, words, starts, char_to_word, where, is_training):
    question = _get(qa, "question", where, where)
    answers = qa.get("answers", [])
    is_impossible = bool(qa.get("is_impossible", False))
    for answer in answers:
        text, start = _get(answer, "text", where, where), _get(answer, "answer_start", where, where)
        if not isinstance(start, int) or context[start : start + len(text)] != text:
            found = context[start : start + len(text)] if isinstance(start, int) else None
            raise TaskDataError(
                f"{where}: answer {text!r} does not match the context at answer_start={start!r} "
                f"(the context there reads {found!r})"
            )
    if is_training and not is_impossible and len(answers) != 1:
        raise TaskDataError(
            f"{where}: a training question needs exactly one answer, it has {len(answers)}"
        )
    answer_text, start_word, end_word, answer_start = None, -1, -1, -1
    if answers and not is_impossible:
        text, start = answers[0]["text"], answers[0]["answer_start"]
        if not text.strip():
            raise TaskDataError(f"{where}: the answer is empty")
        answer_text, answer_start = text, start
        start_word = char_to_word[start]
        end_word = char_to_word[start + len(text) - 1]
    return SquadExample(
        qas_id, question, context, tuple(words), tuple(starts), answer_text, start_word,
        end_word, is_impossible, tuple(a["text"] for a in answers), answer_start,
    )  # fmt: skip


def read_tfds(split: str, *, version: str = "v1.1", data_dir: str | None = None, is_training: bool):
    """TFDS `squad/<version>` (prepared beforehand; no download) as SQuAD examples."""
    import tensorflow_datasets as tfds

    builder = tfds.builder(f"squad/{version}", data_dir=data_dir)
    articles = []
    for record in tfds.as_numpy(builder.as_dataset(split=split)):
        answers = record["answers"]
        qa = {
            "id": record["id"].decode(),
            "question": record["question"].decode(),
            "answers": [{"text": t.decode(), "answer_start": int(s)}
                        for t, s in zip(answers["text"], answers["answer_start"], strict=True)],
            "is_impossible": bool(record.get("is_impossible", False)),
        }  # fmt: skip
        paragraph = {"context": record["context"].decode(), "qas": [qa]}
        articles.append({"title": record["title"].decode(), "paragraphs": [paragraph]})
    return parse_articles(articles, f"tfds squad/{version} {split}", is_training=is_training)


# --- features ----------------------------------------------------------------------------------


@dataclasses.dataclass
class SquadFeatures:
    input_ids: np.ndarray  # (F, T) int32, padded with the tokenizer's pad id
    input_mask: np.ndarray  # (F, T) int32
    segment_ids: np.ndarray  # (F, T) int32: 0 for [CLS] question [SEP], 1 for the window
    start_positions: np.ndarray  # (F,) int32, 0 ([CLS]) when the window has no answer
    end_positions: np.ndarray  # (F,) int32
    example_index: np.ndarray  # (F,) which example each window belongs to
    tokens: list[list[str]]  # the pieces of each window (for answer texts)
    token_to_word: list[dict[int, int]]  # window position -> document word index
    token_is_max_context: list[dict[int, bool]]
    num_split: int  # examples spread over more than one window
    num_query_truncated: int  # questions cut to max_query_length

    def __len__(self) -> int:
        return len(self.input_ids)


def answer_ids(example: SquadExample, tokenizer) -> list[int]:
    """The ids of the answer text as it reads in the document's pieces: its words after a
    space where the answer begins a word that is not the context's first (byte-level
    BPE's 'Ġfox'), as they begin a text where it starts the context or inside a word
    ("1895" of "(1895-1943).")."""
    word_start = example.word_starts[example.start_word]
    at = word_start if example.answer_start < 0 else example.answer_start
    after_space = example.start_word > 0 and at == word_start
    return [i for ids in tokenizer.encode_words(example.answer_text.split(), after_space)
            for i in ids]  # fmt: skip


def improve_answer_span(doc_ids, start, end, target) -> tuple[int, int]:
    """The narrowest piece span inside [start, end] whose pieces are `target`, the
    answer's (`answer_ids`).

    A word span can be wider than the answer ("(1895-1943)." for "1895"); the pieces of
    the answer text, if found inside the span, give the exact start and end.
    """
    n = len(target)
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if new_end - new_start + 1 == n and doc_ids[new_start : new_end + 1] == target:
                return new_start, new_end
    return start, end


def _max_context(windows: Sequence[tuple[int, int]], current: int, position: int) -> bool:
    """Whether window `current` gives piece `position` its most context (ties: first)."""
    best, best_window = None, None
    for i, (start, length) in enumerate(windows):
        if not start <= position < start + length:
            continue
        score = min(position - start, start + length - 1 - position) + 0.01 * length
        if best is None or score > best:
            best, best_window = score, i
    return best_window == current


def encode_squad(
    examples: Sequence[SquadExample],
    tokenizer,
    *,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    is_training: bool,
) -> SquadFeatures:
    """Every example as one or more windows (see the module docstring)."""
    rows: dict[str, list] = {k: [] for k in ("ids", "types", "start", "end", "example")}
    tokens_out, maps, max_contexts = [], [], []
    num_split = num_query_cut = 0
    questions = tokenizer.tokenize_batch([e.question for e in examples])
    specials = tokenizer.num_special_tokens(True)
    for index, (example, query) in enumerate(zip(examples, questions, strict=True)):
        if len(query) > max_query_length:
            num_query_cut += 1
            query = query[:max_query_length]
        # Each word as it reads in the context (after a space, for byte-level BPE).
        word_pieces = tokenizer.encode_words(example.doc_words)
        doc_ids, piece_to_word, word_first_piece = [], [], []
        for w, pieces in enumerate(word_pieces):
            word_first_piece.append(len(doc_ids))
            doc_ids.extend(pieces)
            piece_to_word.extend([w] * len(pieces))
        answer = None
        if is_training and not example.is_impossible and example.start_word >= 0:
            start = word_first_piece[example.start_word]
            last = example.end_word + 1
            end = (word_first_piece[last] if last < len(word_pieces) else len(doc_ids)) - 1
            answer = improve_answer_span(doc_ids, start, end, answer_ids(example, tokenizer))

        room = max_seq_length - len(query) - specials
        if room <= 0:
            raise ValueError(f"max_seq_length={max_seq_length} leaves no room for the document "
                             f"after a {len(query)}-piece question")  # fmt: skip
        windows = []
        offset = 0
        while True:
            length = min(len(doc_ids) - offset, room)
            windows.append((offset, length))
            if offset + length >= len(doc_ids):
                break
            offset += min(length, doc_stride)
        num_split += len(windows) > 1

        query_ids = tokenizer.convert_tokens_to_ids(query)
        for w, (start, length) in enumerate(windows):
            input_ids, types, first = tokenizer.with_special_tokens(
                query_ids, doc_ids[start : start + length]
            )  # `first`: where the window's first piece lands
            tokens = tokenizer.convert_ids_to_tokens(input_ids)
            to_word, is_max = {}, {}
            for i in range(start, start + length):
                to_word[first + i - start] = piece_to_word[i]
                is_max[first + i - start] = _max_context(windows, w, i)
            start_position = end_position = 0
            if answer is not None and start <= answer[0] and answer[1] < start + length:
                start_position = answer[0] - start + first
                end_position = answer[1] - start + first
            rows["ids"].append(input_ids)
            rows["types"].append(types)
            rows["start"].append(start_position)
            rows["end"].append(end_position)
            rows["example"].append(index)
            tokens_out.append(tokens)
            maps.append(to_word)
            max_contexts.append(is_max)

    n = len(rows["ids"])
    ids = np.full((n, max_seq_length), tokenizer.pad_id, np.int32)
    types = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for i, (row, row_types) in enumerate(zip(rows["ids"], rows["types"], strict=True)):
        ids[i, : len(row)] = row
        types[i, : len(row)] = row_types
        mask[i, : len(row)] = 1
    if num_query_cut:
        log.warning("%d questions longer than max_query_length=%d were cut", num_query_cut,
                    max_query_length)  # fmt: skip
    log.info("%d examples -> %d windows (%d examples over several windows)", len(examples), n,
             num_split)  # fmt: skip
    return SquadFeatures(
        ids, mask, types, np.asarray(rows["start"], np.int32), np.asarray(rows["end"], np.int32),
        np.asarray(rows["example"], np.int64), tokens_out, maps, max_contexts, num_split,
        num_query_cut,
    )  # fmt: skip
