"""The demo's pretraining corpus (`peoples_daily_unlabelled`) holds no sentence the NER task
scores, and loses nothing else.

The reference is the People's Daily file read here on its own: every sentence of it through
`peoples_daily_ner.parse` (the task's reader, not the corpus reader), and the scored
sentences are the dev and test splits of `peoples_daily_ner.load()`.
"""

import collections

import pytest

from data_pipelines import corpora, embedded_corpora, prepare_corpus, recipe
from data_pipelines.tasks import peoples_daily_ner


@pytest.fixture(scope="module")
def ner_data() -> peoples_daily_ner.PeoplesDailyNerData:
    return peoples_daily_ner.load()


@pytest.fixture(scope="module")
def scored(ner_data) -> set[str]:
    """The texts of the NER dev and test sentences."""
    assert len(ner_data.dev) == len(ner_data.test) == 2000
    return {"".join(e.words) for e in (*ner_data.dev, *ner_data.test)}


@pytest.fixture(scope="module")
def source_sentences() -> list[str]:
    """Every sentence of the People's Daily file, in file order, repeats included."""
    with open(embedded_corpora.peoples_daily_path(), encoding="utf-8") as f:
        return ["".join(e.words) for e in peoples_daily_ner.parse(f, "199801.txt")]


@pytest.fixture(scope="module")
def documents() -> list[corpora.Document]:
    return list(prepare_corpus.corpus_documents("peoples_daily_unlabelled"))


def test_the_corpus_holds_no_scored_sentence_and_every_other_one(
    documents, ner_data, scored, source_sentences
):
    sentences = [s for d in documents for s in d.sentences]
    assert not set(sentences) & scored
    # Nor does a scored sentence of MIN_CONTAINED characters or more sit inside one.
    long_scored = [t for t in scored if len(t) >= prepare_corpus.MIN_CONTAINED]
    joined = "\n".join(sentences)
    assert not [t for t in long_scored if t in joined]

    # A sentence quoting a scored text holds its first MIN_CONTAINED characters: only
    # sentences holding one of those prefixes are searched for whole texts (the search of
    # every sentence for every text took ~20 s).
    size = prepare_corpus.MIN_CONTAINED
    prefixes = {t[:size] for t in long_scored}

    def quotes(sentence: str) -> bool:
        if not any(sentence[i : i + size] in prefixes for i in range(len(sentence) - size + 1)):
            return False
        return any(t in sentence for t in long_scored if len(t) < len(sentence))

    # Nothing else is lost: the corpus is the file's sentences less the scored texts and
    # the few that quote one, each as many times as the file has it.
    assert scored <= set(source_sentences)
    kept = [s for s in source_sentences if s not in scored]
    quoting = {s for s in set(kept) if quotes(s)}
    assert 0 < len(quoting) < 20
    kept = [s for s in kept if s not in quoting]
    assert collections.Counter(sentences) == collections.Counter(kept)
    # In particular every training sentence that is neither a dev/test text nor quotes one
    # is there.
    train = {"".join(e.words) for e in ner_data.train}
    assert train - scored - quoting <= set(sentences)
    assert train & scored  # the file repeats some sentences (datelines) across splits
    # The segmentation stays aligned with the sentences that remain.
    for document in documents:
        assert document.sentences
        assert ["".join(w) for w in document.words] == document.sentences


def test_neither_pretraining_split_holds_a_scored_sentence(tmp_path, documents, scored):
    corpus = tmp_path / "corpus.txt"
    counts = prepare_corpus.write_corpus(iter(documents), str(corpus), show_progress=False)
    assert counts["sentences"] == sum(len(d.sentences) for d in documents)
    train, held_out = tmp_path / "train.txt", tmp_path / "eval.txt"
    n_train, n_eval = recipe.split_documents(str(corpus), str(train), str(held_out))
    assert n_train + n_eval == len(documents) and n_eval > 0
    lines = {}
    for path in (train, held_out):
        lines[path.name] = [line for line in path.read_text(encoding="utf-8").split("\n") if line]
        assert not set(lines[path.name]) & scored, path.name
    assert collections.Counter(lines["train.txt"] + lines["eval.txt"]) == collections.Counter(
        s for d in documents for s in d.sentences
    )


def test_without_sentences_drops_the_named_sentences_their_words_and_empty_documents():
    documents = [
        corpora.Document(
            ["甲乙。", "丙丁。", "戊。"], [["甲", "乙", "。"], ["丙丁", "。"], ["戊", "。"]]
        ),
        corpora.Document(["丙丁。"], [["丙丁", "。"]]),  # only dropped sentences: dropped
        corpora.Document(["己。", "甲乙。"], [["己", "。"], ["甲乙", "。"]]),
        corpora.Document(["a.", "b."]),  # no segmentation
    ]
    out = list(
        prepare_corpus.without_sentences(iter(documents), frozenset({"丙丁。", "甲乙。", "b."}))
    )
    assert [(d.sentences, d.words) for d in out] == [
        (["戊。"], [["戊", "。"]]),
        (["己。"], [["己", "。"]]),
        (["a."], None),
    ]
    # The inputs are not modified.
    assert documents[0].sentences == ["甲乙。", "丙丁。", "戊。"]
    assert len(documents[2].words) == 2
