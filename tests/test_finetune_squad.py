"""SQuAD: reading, windows and answer decoding against google-research/bert's run_squad.py,
hand-made post-processing cases, and the fine-tuning script on the JSON fixtures.

The original's reading, feature and prediction functions are lifted out of
the original `run_squad.py` (`tests/original_bert.py` says where) with `ast` and run with TF's file
and logging calls stubbed; both sides tokenize with the same WordPiece tokenizer, which
is token-exact with the original's (tests/test_tokenization.py).
"""

import ast
import collections
import json
import subprocess
import sys
import types
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params
from original_bert import original_script

from bert_jax import convert
from data_pipelines.tasks import squad
from data_pipelines.tasks.formats import TaskDataError
from data_pipelines.tasks.squad_predictions import postprocess, project_to_context
from data_pipelines.tokenization import WordPieceTokenizer

SQUAD_DIR = Path(__file__).parent / "fixtures" / "tasks" / "squad"
REPO = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer(minilm_vocab(), do_lower_case=True)


def _lift(path: str, names: set[str], namespace: dict) -> dict:
    with open(path) as f:
        tree = ast.parse(f.read())
    body = [
        n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name in names
    ]
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)
    return namespace


def original(version_2: bool):
    """The original run_squad functions, with tf.gfile/tf.logging and FLAGS stubbed."""
    import six

    path = original_script("run_squad.py")
    quiet = lambda *args, **kwargs: None  # noqa: E731
    tf = types.SimpleNamespace(
        gfile=types.SimpleNamespace(Open=open, GFile=open),
        logging=types.SimpleNamespace(info=quiet, warning=quiet),
    )
    tokenization = types.SimpleNamespace(**_lift(
        original_script("tokenization.py"),
        {"whitespace_tokenize", "printable_text", "convert_to_unicode", "BasicTokenizer",
         "_is_whitespace", "_is_control", "_is_punctuation", "preserve_token"},
        # PyPI's release adds an off-by-default --preserve_unused_tokens flag.
        {"six": six, "unicodedata": unicodedata, "tf": tf,
         "FLAGS": types.SimpleNamespace(preserve_unused_tokens=False)},
    ))  # fmt: skip
    flags = types.SimpleNamespace(
        version_2_with_negative=version_2, verbose_logging=False, null_score_diff_threshold=0.0
    )
    names = {
        "SquadExample", "InputFeatures", "read_squad_examples", "convert_examples_to_features",
        "_improve_answer_span", "_check_is_max_context", "write_predictions", "get_final_text",
        "_get_best_indexes", "_compute_softmax",
    }  # fmt: skip
    namespace = {"tf": tf, "tokenization": tokenization, "FLAGS": flags, "six": six,
                 "collections": collections, "json": json, "math": __import__("math")}  # fmt: skip
    return types.SimpleNamespace(**_lift(path, names, namespace))


# --- reading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, training", [("train-v1.1.json", True), ("dev-v1.1.json", False),
                                            ("dev-v2.0.json", False)])  # fmt: skip
def test_reading_equals_the_original(name, training):
    ref = original(version_2=name.endswith("v2.0.json"))
    theirs = ref.read_squad_examples(str(SQUAD_DIR / name), is_training=training)
    ours = squad.read_squad(SQUAD_DIR / name, is_training=training)
    assert [e.qas_id for e in ours] == [e.qas_id for e in theirs]
    for o, t in zip(ours, theirs, strict=True):
        assert list(o.doc_words) == t.doc_tokens and o.question == t.question_text
        if training:
            assert (o.answer_text, o.start_word, o.end_word) == (
                t.orig_answer_text,
                t.start_position,
                t.end_position,
            )


def test_reading_keeps_every_gold_answer_and_impossibility():
    dev = squad.read_squad(SQUAD_DIR / "dev-v1.1.json", is_training=False)
    assert dev[0].gold_answers == ("whale oil", "whale oil", "oil")
    v2 = squad.read_squad(SQUAD_DIR / "dev-v2.0.json", is_training=False)
    assert [(e.qas_id, e.is_impossible, e.gold_answers) for e in v2] == [
        ("v1", False, ("near its mouth",)), ("v2", True, ())
    ]  # fmt: skip


def _write(tmp_path, data) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


def test_answer_not_at_its_offset_is_named(tmp_path, caplog):
    context = "The tower was built in 1889 by engineers."
    good = {"id": "ok", "question": "When?", "answers": [{"text": "1889", "answer_start": 23}]}
    bad = {"id": "q7", "question": "Who?", "answers": [{"text": "engineers", "answer_start": 30}]}
    data = {"data": [{"title": "Tower", "paragraphs": [{"context": context, "qas": [good, bad]}]}]}
    path = _write(tmp_path, data)
    with pytest.raises(TaskDataError, match=r"article 'Tower', paragraph 0, question q7: answer "
                       r"'engineers' does not match the context at answer_start=30 "
                       r"\(the context there reads ' engineer'\)"):  # fmt: skip
        squad.read_squad(path, is_training=True)
    examples = squad.read_squad(path, is_training=True, skip_mismatched=True)
    assert [e.qas_id for e in examples] == ["ok"]
    assert "skipped 1 question(s)" in caplog.text


def test_answer_off_its_offset_is_realigned_to_the_nearest_occurrence(tmp_path, caplog):
    # "engineers" occurs twice; the offset (one too small, as in real SQuAD-format files)
    # is nearest the second occurrence.
    context = "engineers planned it; the tower was built in 1889 by engineers."
    first, second = context.find("engineers"), context.rfind("engineers")
    qa = {
        "id": "q7",
        "question": "Who?",
        "answers": [{"text": "engineers", "answer_start": second - 1}],
    }
    missing = {"id": "q8", "question": "What?", "answers": [{"text": "bridge", "answer_start": 4}]}
    paragraph = {"context": context, "qas": [qa]}
    path = _write(tmp_path, {"data": [{"title": "Tower", "paragraphs": [paragraph]}]})
    (example,) = squad.read_squad(path, is_training=True, realign_mismatched=True)
    assert example.doc_words[example.start_word : example.end_word + 1] == ("engineers.",)
    assert example.start_word == len(context[:second].split())  # the second, not the first
    assert first == 0
    assert f"answer 'engineers' realigned from answer_start={second - 1} to {second}" in caplog.text
    assert "realigned 1 answer(s)" in caplog.text
    # A text that is nowhere in the context is still an error, never realigned.
    paragraph["qas"] = [missing]
    path = _write(tmp_path, {"data": [{"title": "Tower", "paragraphs": [paragraph]}]})
    with pytest.raises(TaskDataError, match="question q8: answer 'bridge' does not match"):
        squad.read_squad(path, is_training=True, realign_mismatched=True)


def test_malformed_json_and_missing_fields_are_named(tmp_path):
    with pytest.raises(TaskDataError, match=r"bad.json:2:13: not valid JSON"):
        squad.read_squad(_write(tmp_path, '{"data": [\n  {"title": }]}'), is_training=False)
    no_question = {"data": [{"title": "T", "paragraphs": [{"context": "x", "qas": [{"id": "a"}]}]}]}
    with pytest.raises(
        TaskDataError, match=r"article 'T', paragraph 0, question a: missing 'question'"
    ):
        squad.read_squad(_write(tmp_path, no_question), is_training=False)
    answers = [{"text": "a", "answer_start": 0}, {"text": "b", "answer_start": 2}]
    qa = {"id": "q", "question": "?", "answers": answers}
    two = {"data": [{"title": "T", "paragraphs": [{"context": "a b", "qas": [qa]}]}]}
    with pytest.raises(TaskDataError, match="a training question needs exactly one answer"):
        squad.read_squad(_write(tmp_path, two), is_training=True)


# --- windows ----------------------------------------------------------------------------------


def _original_features(ref, examples, tokenizer, **windows):
    out = []
    ref.convert_examples_to_features(examples, tokenizer, output_fn=out.append, **windows)
    return out


@pytest.mark.parametrize("training", [True, False])
def test_windows_equal_the_original(tokenizer, training):
    name = "train-v1.1.json" if training else "dev-v1.1.json"
    ref = original(version_2=False)
    windows = dict(max_seq_length=40, doc_stride=12, max_query_length=6)
    theirs = _original_features(ref, ref.read_squad_examples(str(SQUAD_DIR / name), training),
                                tokenizer, is_training=training, **windows)  # fmt: skip
    ours = squad.encode_squad(squad.read_squad(SQUAD_DIR / name, is_training=training),
                              tokenizer, is_training=training, **windows)  # fmt: skip
    assert len(ours) == len(theirs)
    assert ours.num_split == len(ours.tokens) - len(set(ours.example_index.tolist())) > 0 or (
        ours.num_split > 0
    )  # the long contexts span several windows
    assert ours.num_split == len({f.example_index for f in theirs if f.doc_span_index > 0})
    for i, t in enumerate(theirs):
        assert ours.tokens[i] == t.tokens
        assert ours.input_ids[i].tolist() == t.input_ids
        assert ours.input_mask[i].tolist() == t.input_mask
        assert ours.segment_ids[i].tolist() == t.segment_ids
        assert ours.token_to_word[i] == t.token_to_orig_map
        assert ours.token_is_max_context[i] == t.token_is_max_context
        assert ours.example_index[i] == t.example_index
        if training:
            assert (ours.start_positions[i], ours.end_positions[i]) == (
                t.start_position,
                t.end_position,
            )
    if training:  # the span narrowed inside "(1851–1921)." is exactly "1851"
        t3 = [i for i in range(len(ours)) if ours.example_index[i] == 2 and ours.start_positions[i]]
        assert t3 and all(
            ours.tokens[i][ours.start_positions[i] : ours.end_positions[i] + 1] == ["1851"]
            for i in t3
        )


# --- answers from logits ------------------------------------------------------------------------


@pytest.mark.parametrize("name, version_2", [("dev-v1.1.json", False), ("dev-v2.0.json", True)])
def test_predictions_equal_the_original_on_random_logits(tokenizer, tmp_path, name, version_2):
    ref = original(version_2=version_2)
    windows = dict(max_seq_length=40, doc_stride=12, max_query_length=6)
    their_examples = ref.read_squad_examples(str(SQUAD_DIR / name), False)
    their_features = _original_features(ref, their_examples, tokenizer, is_training=False,
                                        **windows)  # fmt: skip
    examples = squad.read_squad(SQUAD_DIR / name, is_training=False)
    features = squad.encode_squad(examples, tokenizer, is_training=False, **windows)
    raw = collections.namedtuple("RawResult", ["unique_id", "start_logits", "end_logits"])
    for seed in range(5):
        rng = np.random.default_rng(seed)
        starts = rng.normal(size=features.input_ids.shape).astype(np.float32) * 3
        ends = rng.normal(size=features.input_ids.shape).astype(np.float32) * 3
        results = [raw(f.unique_id, starts[i].tolist(), ends[i].tolist())
                   for i, f in enumerate(their_features)]  # fmt: skip
        files = [str(tmp_path / n) for n in ("p.json", "n.json", "o.json")]
        ref.write_predictions(their_examples, their_features, results, 5, 8, True, *files)
        ours = postprocess(examples, features, starts, ends, n_best_size=5, max_answer_length=8,
                           version_2_with_negative=version_2)  # fmt: skip
        assert ours.answers == json.loads(Path(files[0]).read_text())
        their_nbest = json.loads(Path(files[1]).read_text())
        for qid, candidates in ours.nbest.items():
            assert [c.text for c in candidates] == [c["text"] for c in their_nbest[qid]]
            np.testing.assert_allclose(
                [c.probability for c in candidates],
                [c["probability"] for c in their_nbest[qid]],
                rtol=1e-5,
            )
        if version_2:
            their_odds = json.loads(Path(files[2]).read_text())
            assert ours.null_score_diff == pytest.approx(their_odds, rel=1e-5)


def test_postprocessing_picks_the_best_valid_span_on_a_hand_made_window():
    context = "Marie Curie won the Nobel Prize in 1903 ."
    example = squad.parse_articles([{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "q", "question": "When?", "answers": [{"text": "1903", "answer_start": 35}]}]}]}],
        "hand", is_training=False)[0]  # fmt: skip
    # [CLS] when ? [SEP] marie curie won the nobel prize in 1903 . [SEP]
    tokens = ["[CLS]", "when", "?", "[SEP]", "marie", "curie", "won", "the", "nobel", "prize",
              "in", "1903", ".", "[SEP]"]  # fmt: skip
    to_word = {p: p - 4 for p in range(4, 13)}
    features = squad.SquadFeatures(
        np.zeros((1, 14), np.int32), np.ones((1, 14), np.int32), np.zeros((1, 14), np.int32),
        np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int64), [tokens],
        [to_word], [dict.fromkeys(to_word, True)], 0, 0,
    )  # fmt: skip
    starts = np.full((1, 14), -5.0, np.float32)
    ends = np.full((1, 14), -5.0, np.float32)
    starts[0, 1] = ends[0, 2] = 9.0  # the question: not a document piece, never chosen
    starts[0, 11], ends[0, 11] = 4.0, 4.0  # "1903"
    starts[0, 12], ends[0, 4] = 6.0, 6.0  # "." ... "marie": end before start, invalid
    out = postprocess([example], features, starts, ends, n_best_size=5, max_answer_length=30)
    assert out.answers == {"q": "1903"}
    best = out.nbest["q"][0]
    assert (best.text, best.start_logit + best.end_logit) == ("1903", 8.0)
    assert all(c.start_logit + c.end_logit < 8.0 for c in out.nbest["q"][1:])
    too_short = postprocess([example], features, starts, ends, n_best_size=5, max_answer_length=0)
    assert too_short.answers == {"q": "empty"}  # nothing valid: the original's placeholder


@pytest.mark.parametrize(
    "pred, orig, lower, expected",
    [
        ("steve smith", "Steve Smith's", True, "Steve Smith"),
        ("cafe muller", "Café Müller company", True, "Café Müller"),
        ("1851", "(1851–1921).", True, "1851"),
        ("[UNK]", "☃ snow", True, "☃ snow"),  # cannot be placed: the whole words
        ("Smith", "Smith's", False, "Smith"),
    ],
)
def test_answer_text_comes_from_the_context(pred, orig, lower, expected):
    assert project_to_context(pred, orig, lower) == expected


# --- the script -----------------------------------------------------------------------------------


def test_finetune_squad_end_to_end_v2(tmp_path):
    from experiments import finetune_squad as fts
    from experiments.configs import finetune_squad as config_module

    hf_dir = convert.save_hf(tmp_path / "hf", TINY, pretrained_params(seed=3),
                             vocab_file=minilm_vocab())  # fmt: skip
    train = json.loads((SQUAD_DIR / "train-v1.1.json").read_text())
    (tmp_path / "train.json").write_text(json.dumps(train))
    config = config_module.get_config("v2.0")
    config.unlock()
    config.update(
        train_file=str(tmp_path / "train.json"), predict_file=str(SQUAD_DIR / "dev-v2.0.json"),
        init_from=str(hf_dir), max_seq_length=48, doc_stride=16, max_query_length=8,
        train_batch_size=8, eval_batch_size=8, num_epochs=1, learning_rate=1e-3, log_every=1,
    )  # fmt: skip
    results = fts.finetune(config, str(tmp_path / "run"))
    predictions = json.loads((tmp_path / "run" / "predictions.json").read_text())
    assert set(predictions) == {"v1", "v2"}
    assert set(json.loads((tmp_path / "run" / "null_odds.json").read_text())) == {"v1", "v2"}
    nbest = json.loads((tmp_path / "run" / "nbest_predictions.json").read_text())
    assert "" in [c["text"] for c in nbest["v2"]]  # v2.0 always offers "no answer"
    scores = results["epochs"][0]["eval"]
    assert scores["total"] == 2 and {"HasAns_f1", "NoAns_f1", "best_f1"} <= set(scores)
    assert results["num_windows"]["train"] > results["num_examples"]["train"]


def test_cli_help():
    result = subprocess.run(
        [sys.executable, "-m", "experiments.finetune_squad", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert "SQuAD v1.1 or v2.0" in result.stdout and "--workdir" in result.stdout
