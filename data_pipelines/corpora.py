"""Corpus readers: raw text to documents of sentences.

Every reader yields `Document`s lazily, one at a time, so a corpus of any size streams
through in bounded memory. The sources are:

* text files in the original BERT input format (one sentence per line, a blank line
  between documents), many files, globs, gzip, local or any `tf.io.gfile` path;
* TensorFlow Datasets text datasets by name (`wikipedia/20230601.en` or any dataset with
  a text feature), split into sentences with pysbd;
* the embedded corpora that ship with packages, so a demo needs no network, are read by
  `data_pipelines.embedded_corpora` (Shakespeare, People's Daily) and
  `data_pipelines.austen` (Jane Austen's novels), on top of this module's `Document`.

Undecodable bytes are replaced by U+FFFD and counted in `ReadStats`, as are empty files;
a file with any is named in a warning (with its count), and one whose non-blank lines are
mostly undecodable (a binary file, another encoding) can be refused
(`max_undecodable_fraction`) rather than turned into training data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from data_pipelines import paths

log = logging.getLogger(__name__)

_GZIP_MAGIC = b"\x1f\x8b"
_REPLACEMENT = "\ufffd"
_REPLACEMENT_UTF8 = _REPLACEMENT.encode("utf-8")

# The suffix of the side file that carries a corpus' word segmentation (see
# `read_documents`): the same lines as the text file, words separated by one space.
WORDS_SUFFIX = ".words"


@dataclasses.dataclass
class Document:
    """One document: its sentences in order.

    Attributes:
        sentences: the sentences (or, before sentence splitting, paragraphs) of the document.
        words: optional word segmentation, one list of words per sentence, whose
            concatenation is the sentence. Used for whole-word masking of languages that
            WordPiece splits into single characters (Chinese).
        needs_split: `sentences` are paragraphs still to be split into sentences
            (`split_document`); instance creation does that, in its worker processes.
    """

    sentences: list[str]
    words: list[list[str]] | None = None
    needs_split: bool = False


@dataclasses.dataclass
class ReadStats:
    """What a reader met on its way through the inputs (for the stats JSON)."""

    files: int = 0
    empty_files: int = 0
    lines: int = 0
    # Lines holding bytes that are not UTF-8 (or NUL bytes): decoded with replacement.
    lines_with_bad_bytes: int = 0
    # U+FFFD characters that decoding inserted (not the ones already in the input).
    replaced_chars: int = 0
    longest_line_bytes: int = 0  # and where it is, "file:line" (what overlong lines name)
    longest_line: str = ""

    def merge(self, other: ReadStats) -> None:
        for field in dataclasses.fields(self):
            if not field.name.startswith("longest_line"):
                setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))
        if other.longest_line_bytes > self.longest_line_bytes:
            self.longest_line_bytes = other.longest_line_bytes
            self.longest_line = other.longest_line


class UndecodableInputError(ValueError):
    """An input file whose lines are mostly not UTF-8 text (binary, or another encoding)."""


def expand_input_patterns(patterns: str | Sequence[str]) -> list[str]:
    """Expands comma-separated file names and globs, keeping the order given.

    Args:
        patterns: "a.txt,dir/*.txt.gz" or a sequence of such patterns.

    Returns:
        The matching files, each pattern's matches sorted, duplicates dropped.

    Raises:
        FileNotFoundError: a pattern matches no file (naming the pattern).
    """
    if isinstance(patterns, str):
        patterns = patterns.split(",")
    files: list[str] = []
    seen: set[str] = set()
    for pattern in (p.strip() for p in patterns):
        if not pattern:
            continue
        matches = sorted(_glob(pattern))
        if not matches and not _is_remote(pattern) and os.path.isdir(pattern):
            raise FileNotFoundError(
                f"--input_file {pattern!r} is a directory: name its files "
                f"(e.g. {os.path.join(pattern, '*.txt')!r})"
            )
        if not matches:
            raise FileNotFoundError(f"--input_file pattern {pattern!r} matches no file")
        for path in matches:
            if path not in seen:
                seen.add(path)
                files.append(path)
    return files


def _is_remote(path: str) -> bool:
    return "://" in path


def _glob(pattern: str) -> list[str]:
    """The files `pattern` names; an existing file's name is taken literally (brackets and
    all: `paths.literal_or_glob`)."""
    if _is_remote(pattern):
        import tensorflow as tf

        return paths.literal_or_glob(pattern, tf.io.gfile.glob)
    return [p for p in paths.literal_or_glob(pattern) if os.path.isfile(p)]


@contextlib.contextmanager
def _open_binary(path: str) -> Iterator[io.BufferedIOBase]:
    """Opens a local or remote file for reading bytes, gunzipping it when it is gzip."""
    if _is_remote(path):
        import tensorflow as tf

        raw: Any = tf.io.gfile.GFile(path, "rb")
    else:
        raw = open(path, "rb")  # noqa: SIM115 - closed below
    with raw:
        head = raw.read(2)
        raw.seek(0)
        if head == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                yield unzipped
        else:
            yield raw


def decode_line(raw: bytes, stats: ReadStats) -> str:
    """Decodes one line of bytes as UTF-8, replacing (and counting) what is not UTF-8."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        stats.lines_with_bad_bytes += 1
        stats.replaced_chars += text.count(_REPLACEMENT) - raw.count(_REPLACEMENT_UTF8)
        return text
    if "\x00" in text:
        # NUL bytes are valid UTF-8 but mark binary data; the tokenizer drops them.
        stats.lines_with_bad_bytes += 1
    return text


def iter_lines(
    path: str, stats: ReadStats, *, max_undecodable_fraction: float = 1.0
) -> Iterator[str]:
    """Yields the stripped, decoded lines of one file (counting it in `stats`).

    At the end of the file, undecodable lines (see `decode_line`) are reported: a warning
    naming the file and how many characters were replaced, or, when more than
    `max_undecodable_fraction` of its non-blank lines are undecodable, an error.

    Raises:
        UndecodableInputError: too many undecodable lines. Raised after the last line, so
            a caller that writes output must discard what it made of the file.
    """
    own = ReadStats(files=1)  # this file's counts, for its warning
    text_lines = 0
    try:
        with _open_binary(path) as f:
            for raw in f:
                own.lines += 1
                if len(raw) > own.longest_line_bytes:
                    own.longest_line_bytes, own.longest_line = len(raw), f"{path}:{own.lines}"
                line = decode_line(raw, own).strip()
                text_lines += bool(line)
                yield line
        own.empty_files = int(not text_lines)
    finally:  # also when the caller stops early
        stats.merge(own)
    if not own.lines_with_bad_bytes:
        return
    # Blank lines separate documents; only lines with text say what the file holds.
    fraction = own.lines_with_bad_bytes / max(text_lines, 1)
    lines = f"{own.lines_with_bad_bytes} of its {text_lines} non-blank lines"
    if fraction > max_undecodable_fraction:
        raise UndecodableInputError(
            f"{path}: {lines} ({fraction:.0%}) are not plain UTF-8 text ({own.replaced_chars} "
            f"undecodable characters), more than --max_undecodable_fraction="
            f"{max_undecodable_fraction:g}: is it a binary file, or text in another encoding?"
        )
    log.warning(
        "%s: %s are not plain UTF-8 text: %d undecodable characters replaced by U+FFFD "
        "(training on them as they are)",
        path,
        lines,
        own.replaced_chars,
    )


def read_documents(
    paths: Iterable[str],
    stats: ReadStats,
    *,
    word_boundary_files: bool = False,
    lines_are_paragraphs: bool = False,
    max_undecodable_fraction: float = 1.0,
) -> Iterator[Document]:
    """Streams documents from files in the original BERT input format.

    One sentence per line; blank lines separate documents. Unlike the original tool, a
    document never runs on from the end of one file into the next.

    Args:
        paths: the input files (plain or gzip).
        stats: updated with what was read.
        word_boundary_files: also read `<path>.words` for every input: the same lines
            with the words of each sentence separated by single spaces (as written by
            `prepare_corpus` for Chinese), and attach them as `Document.words`.
        lines_are_paragraphs: the lines are paragraphs, not sentences: mark the documents
            `needs_split`.
        max_undecodable_fraction: refuse a file with more of its non-blank lines not
            UTF-8 text (see `iter_lines`); a file with fewer gets a warning.

    Yields:
        Documents with at least one sentence.

    Raises:
        ValueError: a words file does not match its text file line by line.
        FileNotFoundError: a words file is missing.
        UndecodableInputError: a file is mostly not UTF-8 text.
    """
    for path in paths:
        if word_boundary_files:
            yield from _read_with_words(path, stats, max_undecodable_fraction)
            continue
        sentences: list[str] = []
        for line in iter_lines(path, stats, max_undecodable_fraction=max_undecodable_fraction):
            if line:
                sentences.append(line)
            elif sentences:
                yield Document(sentences, needs_split=lines_are_paragraphs)
                sentences = []
        if sentences:
            yield Document(sentences, needs_split=lines_are_paragraphs)


def _read_with_words(
    path: str, stats: ReadStats, max_undecodable_fraction: float
) -> Iterator[Document]:
    words_path = path + WORDS_SUFFIX
    if not _is_remote(words_path) and not os.path.exists(words_path):
        raise FileNotFoundError(f"word boundary file {words_path} (for {path}) does not exist")
    words_stats = ReadStats()  # counted once, through the text file
    sentences: list[str] = []
    words: list[list[str]] = []
    text_lines = iter_lines(path, stats, max_undecodable_fraction=max_undecodable_fraction)
    word_lines = iter_lines(words_path, words_stats)
    for line_no, (line, word_line) in enumerate(_zip_strict(text_lines, word_lines), 1):
        if line is None or word_line is None:
            raise ValueError(
                f"{words_path} has a different number of lines from {path} (line {line_no})"
            )
        line_words = word_line.split()
        if "".join(line_words) != line.replace(" ", "").replace("\t", ""):
            raise ValueError(
                f"{words_path}:{line_no}: words do not spell the text of {path}:{line_no}"
            )
        if line:
            sentences.append(line)
            words.append(line_words)
        elif sentences:
            yield Document(sentences, words)
            sentences, words = [], []
    if sentences:
        yield Document(sentences, words)


def _zip_strict(a: Iterator[str], b: Iterator[str]) -> Iterator[tuple[str | None, str | None]]:
    """Like zip, but yields (x, None)/(None, y) once when one side ends first."""
    while True:
        x = next(a, None)
        y = next(b, None)
        if x is None and y is None:
            return
        yield x, y
        if x is None or y is None:
            return


# ----------------------------------------------------------------------------------------
# Sentence splitting.


def make_sentence_splitter(language: str = "en") -> Callable[[str], list[str]]:
    """Returns a function that splits a paragraph into sentences with pysbd (offline, rules)."""
    import pysbd

    segmenter = pysbd.Segmenter(language=language, clean=False)

    def split(paragraph: str) -> list[str]:
        return [s.strip() for s in segmenter.segment(paragraph) if s.strip()]

    return split


def split_document(document: Document, splitter: Callable[[str], list[str]]) -> Document:
    """Splits every paragraph of a document (without word segmentation) into sentences."""
    if document.words is not None:
        raise ValueError("a document with a word segmentation is already split into sentences")
    return Document([s for paragraph in document.sentences for s in splitter(paragraph)])


# ----------------------------------------------------------------------------------------
# TensorFlow Datasets.


def documents_from_examples(
    examples: Iterable[dict[str, Any]], text_key: str, stats: ReadStats
) -> Iterator[Document]:
    """Turns text examples (e.g. `tfds.as_numpy` of a text dataset) into documents.

    Each example is one document; its text is split into paragraphs at newlines. The
    paragraphs still need sentence splitting (`split_document`).

    Args:
        examples: dicts holding `text_key` as `bytes` or `str`.
        text_key: the name of the text feature (e.g. "text" for `wikipedia`).
        stats: updated with what was read.

    Raises:
        KeyError: an example has no `text_key` feature (naming the keys it has).
    """
    for index, example in enumerate(examples):
        if text_key not in example:
            raise KeyError(
                f"example {index} has no text feature {text_key!r}; "
                f"it has {sorted(example)} (pass the right --tfds_text_key)"
            )
        text = example[text_key]
        if isinstance(text, bytes):
            text = decode_line(text, stats)
        paragraphs = [p.strip() for p in text.splitlines()]
        stats.lines += len(paragraphs)
        paragraphs = [p for p in paragraphs if p]
        if paragraphs:
            yield Document(paragraphs, needs_split=True)


def tfds_documents(
    name: str,
    stats: ReadStats,
    *,
    split: str = "train",
    data_dir: str | None = None,
    text_key: str = "text",
) -> Iterator[Document]:
    """Streams the documents of a TFDS text dataset (paragraphs; split them afterwards).

    Args:
        name: the TFDS name, e.g. "wikipedia/20230601.en".
        stats: updated with what was read.
        split: the TFDS split.
        data_dir: where the prepared dataset lives (TFDS' default when None).
        text_key: the text feature.
    """
    import tensorflow_datasets as tfds

    dataset = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
    stats.files += 1
    yield from documents_from_examples(tfds.as_numpy(dataset), text_key, stats)
