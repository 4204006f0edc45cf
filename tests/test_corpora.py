"""Corpus readers: the original text format (files, globs, gzip, bad bytes, empty files),
the TFDS adapter, sentence splitting, the embedded corpora and prepare_corpus."""

from __future__ import annotations

import gzip
import os
import re

import pytest

from data_pipelines import corpora, embedded_corpora, prepare_corpus


def _write(path, data: bytes | str) -> str:
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode) as f:
        f.write(data)
    return str(path)


def test_documents_are_separated_by_blank_lines(tmp_path):
    path = _write(tmp_path / "a.txt", "s1\n  s2  \n\n\n\ns3\n \t\ns4\ns5")
    stats = corpora.ReadStats()
    docs = list(corpora.read_documents([path], stats))
    assert [d.sentences for d in docs] == [["s1", "s2"], ["s3"], ["s4", "s5"]]
    assert (stats.files, stats.lines, stats.empty_files) == (1, 9, 0)


def test_globs_gzip_and_file_boundaries(tmp_path):
    _write(tmp_path / "b.txt", "b1\nb2\n")
    with gzip.open(tmp_path / "a.txt.gz", "wt") as f:
        f.write("a1\n\na2\n")
    os.mkdir(tmp_path / "sub")
    _write(tmp_path / "sub" / "c.txt", "c1")
    files = corpora.expand_input_patterns(f"{tmp_path}/*.txt*,{tmp_path}/sub/*.txt")
    assert [os.path.basename(f) for f in files] == ["a.txt.gz", "b.txt", "c.txt"]
    docs = list(corpora.read_documents(files, corpora.ReadStats()))
    # A file's last document does not run on into the next file.
    assert [d.sentences for d in docs] == [["a1"], ["a2"], ["b1", "b2"], ["c1"]]
    # The same file named twice is read once.
    assert len(corpora.expand_input_patterns([str(files[1]), str(files[1])])) == 1


def test_pattern_without_match_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        corpora.expand_input_patterns(f"{tmp_path}/nothing-here*.txt")


def test_non_utf8_bytes_are_replaced_and_counted(tmp_path):
    # Line 1: one invalid byte; line 2: a genuine U+FFFD (not counted); line 3: a truncated
    # 3-byte sequence and a lone continuation byte; line 4: NUL bytes (binary).
    data = b"ok \xff here\nkeep \xef\xbf\xbd this\n\xe4\xb8 x \x80\nbin\x00ary\n"
    path = _write(tmp_path / "bad.txt", data)
    stats = corpora.ReadStats()
    [doc] = corpora.read_documents([path], stats)
    assert doc.sentences[0] == "ok \ufffd here"
    assert doc.sentences[1] == "keep \ufffd this"
    assert doc.sentences[2] == "\ufffd x \ufffd"
    assert stats.lines_with_bad_bytes == 3
    assert stats.replaced_chars == 3


def test_empty_files_are_skipped_and_counted(tmp_path):
    empty = _write(tmp_path / "empty.txt", "")
    blank = _write(tmp_path / "blank.txt", "\n  \n\n")
    full = _write(tmp_path / "full.txt", "x\n")
    stats = corpora.ReadStats()
    docs = list(corpora.read_documents([empty, blank, full], stats))
    assert [d.sentences for d in docs] == [["x"]]
    assert (stats.files, stats.empty_files) == (3, 2)


def test_word_boundary_side_file(tmp_path):
    text = _write(tmp_path / "zh.txt", "我们爱北京。\n你好\n\n新年快乐\n")
    _write(tmp_path / "zh.txt.words", "我们 爱 北京 。\n你好\n\n新年 快乐\n")
    docs = list(corpora.read_documents([text], corpora.ReadStats(), word_boundary_files=True))
    assert [d.words for d in docs] == [[["我们", "爱", "北京", "。"], ["你好"]], [["新年", "快乐"]]]
    assert [d.sentences for d in docs] == [["我们爱北京。", "你好"], ["新年快乐"]]


def test_word_boundary_side_file_must_match(tmp_path):
    text = _write(tmp_path / "zh.txt", "我们爱北京\n\n你好\n")
    _write(tmp_path / "zh.txt.words", "我们 爱 上海\n\n你好\n")
    with pytest.raises(ValueError, match=r"zh.txt.words:1"):
        list(corpora.read_documents([text], corpora.ReadStats(), word_boundary_files=True))
    _write(tmp_path / "zh.txt.words", "我们 爱 北京\n")
    with pytest.raises(ValueError, match="different number of lines"):
        list(corpora.read_documents([text], corpora.ReadStats(), word_boundary_files=True))
    os.remove(tmp_path / "zh.txt.words")
    with pytest.raises(FileNotFoundError, match="zh.txt.words"):
        list(corpora.read_documents([text], corpora.ReadStats(), word_boundary_files=True))


def test_tfds_adapter_on_a_tf_data_dataset():
    import tensorflow as tf
    import tensorflow_datasets as tfds

    texts = [
        "First paragraph. It has two sentences.\nSecond paragraph here.",
        "",
        "Dr. Smith went to Washington. He arrived at 5 p.m. on Monday.",
        b"bytes \xff too".decode("latin-1").encode("latin-1"),
    ]
    dataset = tf.data.Dataset.from_tensor_slices({"text": texts, "title": ["a", "b", "c", "d"]})
    stats = corpora.ReadStats()
    docs = list(corpora.documents_from_examples(tfds.as_numpy(dataset), "text", stats))
    assert len(docs) == 3 and all(d.needs_split for d in docs)
    assert docs[0].sentences == ["First paragraph. It has two sentences.", "Second paragraph here."]
    assert stats.lines_with_bad_bytes == 1 and stats.replaced_chars == 1
    splitter = corpora.make_sentence_splitter("en")
    split = [corpora.split_document(d, splitter).sentences for d in docs[:2]]
    assert split[0] == ["First paragraph.", "It has two sentences.", "Second paragraph here."]
    # pysbd keeps abbreviations and times inside their sentence.
    assert split[1] == ["Dr. Smith went to Washington.", "He arrived at 5 p.m. on Monday."]
    with pytest.raises(KeyError, match="tfds_text_key"):
        list(corpora.documents_from_examples(tfds.as_numpy(dataset), "body", stats))


def test_shakespeare_scenes():
    docs = list(embedded_corpora.shakespeare_documents(split_sentences=False, max_plays=2))
    paths = embedded_corpora.shakespeare_play_paths()
    assert len(paths) == 38
    with open(paths[0], encoding="utf-8") as f:
        markdown = f.read()
    scenes = len(re.findall(r"^#+\s*(SCENE|PROLOGUE|EPILOGUE|INDUCTION)", markdown, re.M | re.I))
    first_play = embedded_corpora.parse_play(markdown)
    # One document per scene (prologues and epilogues count as scenes).
    assert len(first_play) == scenes
    assert len(docs) > len(first_play)
    text = " ".join(s for d in docs for s in d.sentences)
    assert len(text.split()) > 20_000
    # No markup, speaker headings or stage directions left.
    assert not re.search(r"[#*_\\\[\]]", text)
    assert "Exeunt" not in text and not re.search(r"\bEnter [A-Z]{3,}", text)
    # Speeches become sentences with pysbd.
    split = corpora.split_document(docs[0], corpora.make_sentence_splitter())
    assert len(split.sentences) > len(docs[0].sentences)
    assert all(s[-1] in ".!?'\"-:;," or s[-1].isalpha() for s in split.sentences)


def test_peoples_daily_articles_and_words():
    docs = list(embedded_corpora.peoples_daily_documents(max_lines=60))
    # The first articles: the New Year address, the New Year editorial, the concert...
    assert docs[0].sentences[0] == "迈向充满希望的新世纪——一九九八年新年讲话（附图片１张）"
    assert docs[1].sentences[0] == "在十五大精神指引下胜利前进——元旦献辞"
    assert docs[2].sentences[0] == "北京举行新年音乐会"
    assert 5 <= len(docs) <= 12
    for doc in docs:
        assert len(doc.words) == len(doc.sentences) > 1
        for sentence, words in zip(doc.sentences, doc.words, strict=True):
            assert "".join(words) == sentence
            assert "/" not in sentence and "  " not in sentence
    # Sentences end at sentence punctuation (closing quotes stay with them).
    body = [s for d in docs for s in d.sentences[2:]]
    ends = sum(s[-1] in "。！？”）" for s in body)
    assert ends / len(body) > 0.9


def test_peoples_daily_paragraph_kinds():
    kind = embedded_corpora._paragraph_kind
    assert kind(["北京", "举行", "新年", "音乐会"]) == "headline"
    assert kind(["讲话", "（", "附", "图片", "１", "张", "）"]) == "headline"
    assert kind(["谢谢", "！", "（", "新华社", "北京", "电", "）"]) == "body"
    assert kind(["（", "新华社", "记者", "摄", "）"]) == "note"
    assert embedded_corpora.split_words_into_sentences(["好", "。", "”", "他", "说", "！"]) == [
        ["好", "。", "”"],
        ["他", "说", "！"],
    ]


def test_prepare_corpus_round_trip(tmp_path):
    output = str(tmp_path / "pd.txt")
    documents = list(prepare_corpus.corpus_documents("peoples_daily", limit=60))
    counts = prepare_corpus.write_corpus(iter(documents), output, show_progress=False)
    assert counts["documents"] == len(documents)
    assert counts["words"] == sum(len(w) for d in documents for w in d.words)
    back = list(corpora.read_documents([output], corpora.ReadStats(), word_boundary_files=True))
    assert [d.sentences for d in back] == [d.sentences for d in documents]
    assert [d.words for d in back] == [d.words for d in documents]
    assert sorted(os.listdir(tmp_path)) == ["pd.txt", "pd.txt.words"]


def test_prepare_corpus_failure_leaves_nothing(tmp_path):
    def broken():
        yield corpora.Document(["one sentence"])
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        prepare_corpus.write_corpus(broken(), str(tmp_path / "out.txt"), show_progress=False)
    assert os.listdir(tmp_path) == []
