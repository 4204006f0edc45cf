"""The Jane Austen corpus: R lazy-load database reading, chapter parsing, the real novels."""

from __future__ import annotations

import gzip
import os
import struct
import zlib

import numpy as np
import pytest

from data_pipelines import austen, prepare_corpus

rdata = pytest.importorskip("rdata")


def _serialize(tmp_path, value) -> bytes:
    """R's uncompressed XDR serialisation of `value`, written by rdata's unparser."""
    path = tmp_path / "object.rds"
    rdata.write_rds(path, value, compression=None)
    return path.read_bytes()


def _write_database(tmp_path, objects: dict[str, list[str]], corrupt: str = "") -> str:
    """A lazy-load database as R's makeLazyLoadDB writes it: zlib records + gzipped index."""
    directory = tmp_path / "data"
    directory.mkdir()
    blob, index = b"", {}
    for name, lines in objects.items():
        serialized = _serialize(tmp_path, np.array(lines, dtype=object))
        record = struct.pack(">I", len(serialized)) + zlib.compress(serialized)
        if name == corrupt:
            record = record[:4] + b"not zlib" + record[12:]
        index[name] = np.array([len(blob), len(record)], dtype=np.int32)
        blob += record
    (directory / "Rdata.rdb").write_bytes(blob)
    rdata.write_rds(
        directory / "Rdata.rdx",
        {"variables": index, "references": {}, "compressed": np.array([True])},
    )
    return str(directory)


NOVEL = [
    "A NOVEL",
    "",
    "By Somebody",
    "",
    "VOLUME I",
    "",
    "CHAPTER I",
    "",
    "It is a truth that a reader,",
    "having _read_ a line,   reads the next.",
    "",
    '"Quite so," said she.',
    "",
    "",
    "Chapter 2",
    "",
    "VOLUME II",
    "A second chapter.",
    "",
    "THE END",
    "",
    "A note by the editor.",
]


def test_chapters_paragraphs_and_markup():
    chapters = austen.parse_novel(NOVEL)
    assert [c.sentences for c in chapters] == [
        [
            "It is a truth that a reader, having read a line, reads the next.",
            '"Quite so," said she.',
        ],
        ["A second chapter."],
    ]
    assert all(c.needs_split for c in chapters)


def test_lazyload_database_round_trip(tmp_path):
    objects = {"first": ["line one", "", "line two"], "second": ["ä ü", "CHAPTER 1"]}
    directory = _write_database(tmp_path, objects)
    assert austen.read_lazyload_database(directory) == objects


def test_documents_from_a_database(tmp_path):
    directory = _write_database(tmp_path, {"emma": NOVEL, "persuasion": NOVEL[:-3]})
    documents = list(austen.austen_documents(data_dir=directory, novels=("emma", "persuasion")))
    # pysbd splits the first paragraph's one sentence and keeps the quote whole.
    assert [d.sentences for d in documents][:2] == [
        [
            "It is a truth that a reader, having read a line, reads the next.",
            '"Quite so," said she.',
        ],
        ["A second chapter."],
    ]
    assert len(documents) == 4
    with pytest.raises(austen.AustenDataError, match="no novel.*'mansfieldpark'"):
        list(austen.austen_documents(data_dir=directory, novels=("mansfieldpark",)))


def test_corrupt_database_names_the_file_and_object(tmp_path):
    directory = _write_database(tmp_path, {"good": ["a"], "bad": ["b"]}, corrupt="bad")
    with pytest.raises(austen.AustenDataError, match=r"Rdata\.rdb: object 'bad'"):
        austen.read_lazyload_database(directory)


def test_truncated_database_names_the_object(tmp_path):
    directory = _write_database(tmp_path, {"only": ["some text"] * 50})
    rdb = os.path.join(directory, "Rdata.rdb")
    with open(rdb, "r+b") as f:
        f.truncate(10)
    with pytest.raises(austen.AustenDataError, match="object 'only'.*past the end"):
        austen.read_lazyload_database(directory)


def test_index_that_is_not_an_index(tmp_path):
    directory = tmp_path / "data"
    directory.mkdir()
    with gzip.open(directory / "Rdata.rdx", "wb") as f:
        f.write(b"this is not R")
    (directory / "Rdata.rdb").write_bytes(b"")
    with pytest.raises(austen.AustenDataError, match=r"Rdata\.rdx: not an R lazy-load index"):
        austen.read_lazyload_database(str(directory))


def test_missing_data_without_download_says_how_to_fetch(tmp_path, monkeypatch):
    monkeypatch.setattr(austen, "R_LIBRARIES", (str(tmp_path / "no_r"),))
    with pytest.raises(austen.AustenDataError, match="python -m data_pipelines.austen"):
        austen.find_data_dir(str(tmp_path / "cache"), allow_download=False)


@pytest.fixture(scope="module")
def real_data_dir():
    try:
        return austen.find_data_dir()
    except austen.AustenDataError as e:  # no apt-get, or no package lists on this machine
        pytest.skip(f"the Debian package {austen.DEBIAN_PACKAGE} is not reachable: {e}")


def test_the_six_novels(real_data_dir):
    texts = austen.read_lazyload_database(real_data_dir)
    assert set(austen.NOVELS) <= set(texts)
    chapters = {n: austen.parse_novel(texts[n]) for n in austen.NOVELS}
    # The chapter counts of the published novels (Emma's three volumes restart at I).
    assert {n: len(c) for n, c in chapters.items()} == {
        "sensesensibility": 50,
        "prideprejudice": 61,
        "mansfieldpark": 48,
        "emma": 55,
        "northangerabbey": 31,
        "persuasion": 24,
    }
    assert (
        chapters["prideprejudice"][0]
        .sentences[0]
        .startswith(
            "It is a truth universally acknowledged, that a single man in possession of a good "
            "fortune, must be in want of a wife."
        )
    )
    # No headings, end markers or italics markers leak into the text.
    paragraphs = [p for c in chapters.values() for d in c for p in d.sentences]
    assert not [p for p in paragraphs if austen._CHAPTER.match(p) or austen._THE_END.match(p)]
    assert not [p for p in paragraphs if "_" in p]
    words = sum(len(p.split()) for p in paragraphs)
    assert 700_000 < words < 730_000


def test_prepare_corpus_writes_austen(real_data_dir, tmp_path):
    output = str(tmp_path / "austen.txt")
    counts = prepare_corpus.write_corpus(
        prepare_corpus.corpus_documents("austen", limit=1), output, show_progress=False
    )
    assert counts["documents"] == 50  # Sense and Sensibility
    with open(output, encoding="utf-8") as f:
        documents = f.read().split("\n\n")
    assert len(documents) == 50
    first = documents[0].splitlines()
    # One sentence per line.
    assert first[0] == ("The family of Dashwood had long been settled in Sussex.")
    assert len(first) > 10
