"""Issue 82 (Hardening 5), the fine-tuning and embed parts: a model is never its own
fine-tune's output (item 2), casing is kept end to end (item 4), embed's rows are the input's
lines as `wc -l` counts them (item 5), degenerate training data is refused or named
(item 6), and the unclear cases of fine-tuning and embed are one line, at start (item 9)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import types

os.environ.setdefault("USE_TF", "0")

import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params, write_train_state

from bert_jax import convert, finetune_common
from bert_jax.config import ConfigError
from data_pipelines import vocab_fingerprint
from data_pipelines.tasks import own_files, pairs
from data_pipelines.tasks.formats import TaskDataError, read_tsv
from experiments import embed, finetune_main
from experiments.configs import embeddings as embeddings_config
from experiments.configs import finetune_tiny_polarity

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def params():
    return pretrained_params()


@pytest.fixture(scope="module")
def cased_hf(tmp_path_factory, params):
    """A Hugging Face directory whose tokenizer_config.json says it is cased."""
    root = tmp_path_factory.mktemp("cased")
    return str(convert.save_hf(root / "hf", TINY, params, vocab_file=minilm_vocab(),
                               do_lower_case=False))  # fmt: skip


@pytest.fixture(scope="module")
def uncased_hf(tmp_path_factory, params):
    root = tmp_path_factory.mktemp("uncased")
    return str(convert.save_hf(root / "hf", TINY, params, vocab_file=minilm_vocab(),
                               do_lower_case=True))  # fmt: skip


def _hashes(directory) -> dict[str, str]:
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _main(monkeypatch, run, tool, config, workdir):
    """`finetune_main.make_main(run, tool)`'s main as the flags `config` and `workdir` call it."""
    main = finetune_main.make_main(run, tool, saves_model=True)
    flags_now = types.SimpleNamespace(config=config, workdir=str(workdir))
    monkeypatch.setattr(finetune_main.flags, "FLAGS", flags_now)
    return main(["tool"])


def _polarity(**changes):
    config = finetune_tiny_polarity.get_config()
    config.train_batch_size = 8
    config.eval_batch_size = 8
    for key, value in changes.items():
        config[key] = value
    return config


# --- item 2: a model is never its own fine-tune's output ------------------------------------


def test_finetune_embeddings_into_the_workdir_it_starts_from_is_refused_untouched(tmp_path, params):
    """The issue's case: `finetune_embeddings --config.init_from=W/checkpoint --workdir=W`
    replaced the model it started from. Refused at start, W's files unchanged, no lock."""
    workdir = tmp_path / "W"
    finetune_common.save_finetuned(
        str(workdir / "checkpoint"), TINY, params, vocab_file=minilm_vocab(),
        metadata={"task": "embedding", "embedding": {"pooling": "mean", "normalize": True,
                                                     "max_seq_length": 16}},
    )  # fmt: skip
    (workdir / "metrics.json").write_text("{}\n")
    before = _hashes(workdir)
    (tmp_path / "pairs.tsv").write_text("a\tb\nc\td\n")
    result = subprocess.run(
        [sys.executable, "-m", "experiments.finetune_embeddings",
         "--config=experiments/configs/embeddings.py",
         f"--config.init_from={workdir}/checkpoint", f"--workdir={workdir}",
         f"--config.train_file={tmp_path / 'pairs.tsv'}"],
        cwd=REPO, capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("finetune_embeddings: --workdir=") and "holds the model" in last
    assert "--config.init_from=" in last and "Traceback" not in result.stderr
    assert _hashes(workdir) == before


@pytest.mark.parametrize("where", ["same", "inside", "holds", "link", "prefix"])
def test_a_workdir_that_is_holds_or_is_inside_the_init_directory_is_refused(
    tmp_path, where, uncased_hf
):
    """By real path: the HF directory itself, a folder inside it, its parent, a symlink to
    it, and a TF checkpoint prefix's directory."""
    import shutil

    from bert_jax import finetune_workdir

    model = tmp_path / "model"
    shutil.copytree(uncased_hf, model)
    init, workdir = str(model), {
        "same": model, "inside": model / "runs" / "a", "holds": tmp_path,
        "link": tmp_path / "link", "prefix": model,
    }[where]  # fmt: skip
    if where == "link":
        workdir.symlink_to(model)
    if where == "prefix":
        (model / "bert_model.ckpt.index").write_bytes(b"")
        init = str(model / "bert_model.ckpt")
    config = _polarity(init_from=init)
    with pytest.raises(finetune_workdir.WorkdirError, match=r"--config.init_from=") as refused:
        finetune_workdir.check_not_a_model(config, str(workdir))
    assert str(workdir) in str(refused.value)
    finetune_workdir.check_not_a_model(config, str(tmp_path / "elsewhere"))  # beside it: fine


def test_a_distillation_teacher_is_a_model_the_workdir_may_not_be(tmp_path):
    from bert_jax import finetune_workdir

    teacher = tmp_path / "teacher"
    teacher.mkdir()
    config = types.SimpleNamespace(get={"teacher": str(teacher)}.get)
    with pytest.raises(finetune_workdir.WorkdirError, match=r"--config.teacher="):
        finetune_workdir.check_not_a_model(config, str(teacher / "distilled"))


def _fake_run(log_lines: list[str], stop: bool = False):
    """A fine-tuning run that writes train_log.jsonl and metrics.json, and with `stop` is
    stopped by SIGTERM halfway, as a real one is."""

    def run(config, workdir):
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "train_log.jsonl"), "w") as f:
            f.write(log_lines[0] + "\n")
            f.flush()
            if stop:
                os.kill(os.getpid(), signal.SIGTERM)
            f.writelines(line + "\n" for line in log_lines[1:])
        finetune_common.write_json(
            os.path.join(workdir, "metrics.json"), {"lr": config.learning_rate}
        )

    return run


def test_a_finished_workdir_rerun_with_other_flags_is_refused_before_anything_is_touched(
    tmp_path, monkeypatch
):
    from bert_jax import finetune_workdir

    workdir = tmp_path / "run"
    _main(monkeypatch, _fake_run(['{"step": 1}', '{"step": 2}']), "ft", _polarity(), workdir)
    assert (workdir / finetune_workdir.RECORD_FILE).exists()
    before = _hashes(workdir)
    for changes in ({"learning_rate": 1e-4}, {"num_epochs": 1, "seed": 3}):
        with pytest.raises(SystemExit) as refused:
            _main(monkeypatch, _fake_run(["x"]), "ft", _polarity(**changes), workdir)
        message = str(refused.value.code)
        assert message.startswith("ft: --workdir=") and "finished run with other flags" in message
        for key in changes:
            assert f"--config.{key}:" in message
        assert _hashes(workdir) == before and not (workdir / "run.lock").exists()
    with pytest.raises(SystemExit, match=r"holds a finished ft run"):  # another tool
        _main(monkeypatch, _fake_run(["x"]), "other_tool", _polarity(), workdir)
    # The same flags repeat it.
    _main(monkeypatch, _fake_run(['{"step": 9}']), "ft", _polarity(), workdir)
    assert (workdir / "train_log.jsonl").read_text() == '{"step": 9}\n'


@pytest.mark.parametrize("recorded", [True, False])
def test_a_stopped_rerun_keeps_the_earlier_runs_log_and_says_so(
    tmp_path, monkeypatch, caplog, recorded
):
    """The issue's case: a finished workdir rerun, stopped by SIGTERM, lost the old run's
    train_log.jsonl while its message said nothing of this run was saved. Also for a run
    that finished before runs recorded their flags (metrics.json, no record)."""
    from bert_jax import finetune_workdir

    workdir = tmp_path / "run"
    old = ['{"step": 1, "loss": 0.7}', '{"step": 2, "loss": 0.5}']
    _main(monkeypatch, _fake_run(old), "ft", _polarity(), workdir)
    if not recorded:
        (workdir / finetune_workdir.RECORD_FILE).unlink()
    before = _hashes(workdir)
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as stopped:
        _main(monkeypatch, _fake_run(['{"step": 1, "loss": 9}'] * 2, stop=True), "ft",
              _polarity(), workdir)  # fmt: skip
    assert stopped.value.code == 128 + signal.SIGTERM
    assert _hashes(workdir) == before  # train_log.jsonl, metrics.json, the record
    assert not (workdir / finetune_workdir.ASIDE).exists()
    message = caplog.records[-1].getMessage()
    assert "nothing of this run was saved" in message
    assert "the earlier run's results" in message and "train_log.jsonl" in message


def test_a_rerun_killed_outright_gets_the_earlier_results_back_at_the_next_start(tmp_path):
    from bert_jax import finetune_workdir

    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "train_log.jsonl").write_text("old\n")
    (workdir / finetune_workdir.RECORD_FILE).write_text("{}\n")
    aside = workdir / finetune_workdir.ASIDE
    aside.mkdir()
    (aside / "train_log.jsonl").write_text("old\n")
    (workdir / "train_log.jsonl").write_text("half of a killed rerun\n")
    with finetune_workdir.keeping_earlier_run(str(workdir)):
        assert (workdir / "train_log.jsonl").read_text() == "old\n"
    assert not aside.exists()


# --- item 4: casing end to end ----------------------------------------------------------


def test_fine_tuning_takes_a_cased_encoders_casing_and_refuses_another(cased_hf, uncased_hf):
    from bert_jax.config import BertConfig
    from bert_jax.embeddings import BertForEmbedding

    module = BertForEmbedding(BertConfig(), "mean", True)
    config = embeddings_config.get_config()
    config.init_from = cased_hf
    task = finetune_common.load_task_model(config, module)
    assert config.do_lower_case is False
    ids = [ids for ids, _, _ in task.tokenizer.encode_for_model_batch(
        ["KING HENRY", "king henry"], None, 16)]  # fmt: skip
    assert ids[0] != ids[1]
    config = embeddings_config.get_config()
    config.init_from, config.do_lower_case = cased_hf, True
    with pytest.raises(vocab_fingerprint.CasingMismatchError) as refused:
        finetune_common.load_task_model(config, module)
    message = str(refused.value)
    assert "--config.do_lower_case=True" in message and "tokenizer_config.json" in message
    assert "cased (do_lower_case=False)" in message and "\n" not in message
    config = embeddings_config.get_config()
    config.init_from = uncased_hf  # an uncased one: lower-cased, as before
    finetune_common.load_task_model(config, module)
    assert config.do_lower_case is True


def test_a_fine_tuned_checkpoint_records_its_encoders_casing_and_embed_keeps_it(
    tmp_path, cased_hf, params
):
    """The issue's case: finetuned.json said do_lower_case true for a cased encoder, and
    `embed` read `KING HENRY` as `king henry`."""
    checkpoint = tmp_path / "W" / "checkpoint"
    # What finetune_embeddings saves (no casing of its own in the metadata).
    finetune_common.save_finetuned(
        str(checkpoint), TINY, params, vocab_file=minilm_vocab(),
        metadata={"task": "embedding", "init_from": cased_hf,
                  "embedding": {"pooling": "mean", "normalize": False, "max_seq_length": 16}},
    )  # fmt: skip
    meta = json.loads((checkpoint / "finetuned.json").read_text())
    assert meta["do_lower_case"] is False
    assert json.loads((checkpoint / "tokenizer_config.json").read_text())["do_lower_case"] is False
    texts = tmp_path / "texts.txt"
    texts.write_text("KING HENRY\nking henry\n")
    for model in (str(tmp_path / "W"), cased_hf):
        out = tmp_path / "emb.npy"
        embed.run(model, str(texts), str(out), batch_size=2)
        rows = np.load(out)
        assert not np.allclose(rows[0], rows[1])
    with pytest.raises(vocab_fingerprint.CasingMismatchError, match=r"--do_lower_case=True"):
        embed.run(cased_hf, str(texts), str(tmp_path / "x.npy"), do_lower_case=True)


def test_a_pretraining_checkpoints_saved_casing_is_found(tmp_path, monkeypatch, params):
    import finetune_fixtures

    from bert_jax import encoder_vocab

    saved = vocab_fingerprint.fingerprint(minilm_vocab(), do_lower_case=False)
    monkeypatch.setattr(vocab_fingerprint, "fingerprint",
                        lambda path, do_lower_case=None: saved)  # fmt: skip
    workdir = finetune_fixtures.write_train_state(tmp_path / "pre", params)
    monkeypatch.undo()
    lower, where = encoder_vocab.saved_casing(str(workdir))
    assert lower is False and "fingerprint" in where
    with pytest.raises(vocab_fingerprint.CasingMismatchError, match=r"--config.do_lower_case"):
        encoder_vocab.resolve_casing(str(workdir), True, minilm_vocab(), "--config.do_lower_case")


def test_extract_features_takes_the_checkpoints_casing(tmp_path, cased_hf):
    from experiments import extract_features

    (tmp_path / "in.txt").write_text("KING HENRY\n")
    out = tmp_path / "out.jsonl"
    extract_features.run(str(tmp_path / "in.txt"), str(out), cased_hf, layers="-1",
                         max_seq_length=16)  # fmt: skip
    tokens = [f["token"] for f in json.loads(out.read_text())["features"]]
    assert "king" not in tokens  # not lower-cased: the uncased vocab has no "KING"
    with pytest.raises(vocab_fingerprint.CasingMismatchError, match=r"--do_lower_case"):
        extract_features.run(str(tmp_path / "in.txt"), str(out), cased_hf, layers="-1",
                             max_seq_length=16, do_lower_case=True)  # fmt: skip


@pytest.fixture(scope="module")
def same_size_vocab(tmp_path_factory):
    """MiniLM's vocab.txt with two tokens swapped: the same size, other ids."""
    lines = open(minilm_vocab(), encoding="utf-8").read().splitlines()
    lines[2000], lines[2001] = lines[2001], lines[2000]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_embed_refuses_a_same_size_vocab_against_a_checkpoints_fingerprint(
    tmp_path, params, same_size_vocab
):
    workdir = write_train_state(tmp_path / "pre", params)
    (tmp_path / "t.txt").write_text("hello\n")
    with pytest.raises(vocab_fingerprint.VocabMismatchError) as refused:
        embed.run(str(workdir), str(tmp_path / "t.txt"), str(tmp_path / "o.npy"),
                  vocab_file=same_size_vocab)  # fmt: skip
    assert same_size_vocab in str(refused.value) and "--vocab_file" in str(refused.value)
    assert not (tmp_path / "o.npy").exists()


def test_a_vocabulary_mismatch_in_fine_tuning_is_one_line(
    tmp_path, monkeypatch, uncased_hf, same_size_vocab
):
    from bert_jax.config import BertConfig
    from bert_jax.heads import BertForSequenceClassification

    def run(config, workdir):
        finetune_common.load_task_model(config, BertForSequenceClassification(BertConfig(), 2))

    config = _polarity(init_from=uncased_hf, vocab_file=same_size_vocab)
    with pytest.raises(SystemExit) as refused:
        _main(monkeypatch, run, "finetune_classification", config, tmp_path / "w")
    message = str(refused.value.code)
    assert message.startswith("finetune_classification: the encoder in ")
    assert "allow_vocab_change" in message and "\n" not in message


# --- item 5: rows are lines -------------------------------------------------------------


@pytest.mark.parametrize("inner", ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85",
                                   "\u2028", "\u2029"])  # fmt: skip
def test_embed_reads_lines_as_wc_counts_them(tmp_path, inner):
    data = f"\ufefffirst\r\nsecond{inner}half\n\nlast".encode()
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    lines = embed.read_lines(str(path))
    assert len(lines) == data.count(b"\n") + 1  # wc -l, and the unterminated last line
    assert lines == ["first", f"second{inner}half", "", "last"]
    path.write_bytes(b"a\nb\n")
    assert embed.read_lines(str(path)) == ["a", "b"]


def test_embed_writes_one_row_per_line_with_a_lone_carriage_return(tmp_path, uncased_hf):
    """The issue's case: 4 rows for 3 lines."""
    path = tmp_path / "in.txt"
    path.write_bytes(b"one\ntwo\rstill two\nthree\n")
    out = tmp_path / "o.npy"
    assert embed.run(uncased_hf, str(path), str(out), batch_size=2) == 3
    assert np.load(out).shape[0] == 3


def test_the_docs_say_rows_are_lines():
    text = open(os.path.join(REPO, "docs", "embeddings.md"), encoding="utf-8").read()
    assert "wc -l" in text


# --- item 6: degenerate training data ----------------------------------------------------


HEADERS = ["query\tpositive", "Query\tPositive\tNegative", "anchor\tpositive\tnegative_1",
           "question\tanswer"]  # fmt: skip


@pytest.mark.parametrize("header", HEADERS)
def test_a_pairs_header_line_is_skipped_with_a_log_line(tmp_path, header, caplog):
    width = header.count("\t") + 1
    rows = ["\t".join(f"{w}{i}" for w in ("q", "p", "n")[:width]) for i in range(3)]
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join([header, *rows]) + "\n")
    with caplog.at_level(logging.INFO):
        read = pairs.read_pairs(path)
    assert len(read) == 3 and read.queries[0] == "q0"
    assert any("pairs.tsv:1: a header line" in r.getMessage() for r in caplog.records)


def test_a_pair_that_only_looks_like_a_header_is_kept(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("query about rivers\ta positive passage\nq\tp\n")
    assert len(pairs.read_pairs(path)) == 2


@pytest.mark.parametrize("same", ["one answer", "The Same Text"])
def test_pairs_whose_positives_are_all_one_text_are_refused(tmp_path, same):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"question {i}\t{same}\n" for i in range(5)))
    with pytest.raises(TaskDataError, match=r"pairs.tsv: all 5 pairs have the same positive"):
        pairs.read_pairs(path)


@pytest.mark.parametrize(
    "labels,named",
    [
        (["0", "01", "1", "1.0"], "'01' = '1' = '1.0'"),
        (["2", "2.0", "+2", "3"], "'+2' = '2' = '2.0'"),
        (["0", "0.0", "pos"], "'0' = '0.0'"),
    ],
)
def test_labels_that_are_one_number_spelled_several_ways_are_named(tmp_path, labels, named):
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\n" + "".join(f"text {i}\t{x}\n" for i, x in enumerate(labels)))
    train = own_files.read_examples(str(path), labeled=True)
    with pytest.raises(TaskDataError, match="one number spelled several ways") as refused:
        own_files.label_set(train, where=str(path))
    assert named in str(refused.value) and str(path) in str(refused.value)


def _own_task(tmp_path, rows: str, name="train.tsv"):
    from data_pipelines.tasks.sentence_tasks import load_sentence_task

    path = tmp_path / name
    path.write_text(rows, encoding="utf-8")
    files = {"train_file": str(path), "dev_file": "", "test_file": "", "labels": "",
             "label_type": "auto"}  # fmt: skip
    return load_sentence_task("files", None, files=files)


@pytest.mark.parametrize("rows", ["text\tlabel\na\tpos\nb\tpos\nc\tpos\n",
                                  "text\tlabel\na\t2.5\nb\t2.5\n"])  # fmt: skip
def test_a_single_class_or_a_single_target_is_refused_before_training(tmp_path, rows):
    from data_pipelines.tokenization import load_tokenizer
    from experiments import finetune_classification

    task = _own_task(tmp_path, rows)
    config = _polarity(max_seq_length=16)
    tokenizer = load_tokenizer(minilm_vocab(), do_lower_case=True)
    with pytest.raises(TaskDataError, match=r"every one of the 2 training targets|all 3 "):
        finetune_classification.encode_splits(task, tokenizer, config)


def test_the_label_set_is_logged_with_its_counts(tmp_path, caplog):
    from data_pipelines.tokenization import load_tokenizer
    from experiments import finetune_classification

    task = _own_task(tmp_path, "text\tlabel\na\tpos\nb\tneg\nc\tpos\n")
    tokenizer = load_tokenizer(minilm_vocab(), do_lower_case=True)
    with caplog.at_level(logging.INFO):
        finetune_classification.encode_splits(task, tokenizer, _polarity(max_seq_length=16))
    assert any("'neg' (1), 'pos' (2)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "name,rows",
    [
        ("t.tsv", "text\tlabel\tlabel\na\t1\t0\n"),
        ("t.csv", "text,text,label\na,b,1\n"),
        ("t.jsonl", '{"text": "a", "label": "1", "label": "0"}\n'),
    ],
)
def test_a_duplicated_header_column_is_refused(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text(rows)
    with pytest.raises(TaskDataError, match=r":1: the (header names|key) '(label|text)'"):
        own_files.read_rows(str(path))


# --- item 9: one line, at start ---------------------------------------------------------


def test_embed_output_in_a_missing_directory_or_onto_a_directory_is_refused_at_start(tmp_path):
    (tmp_path / "t.txt").write_text("a\n")
    never_read = str(tmp_path / "no_model_here")  # the output is checked before the model
    with pytest.raises(ValueError, match=r"--output_file=.*missing/o.npy: its directory .* "
                                         r"does not exist"):  # fmt: skip
        embed.run(never_read, str(tmp_path / "t.txt"), str(tmp_path / "missing" / "o.npy"))
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match=r"--output_file=.*out is a directory"):
        embed.run(never_read, str(tmp_path / "t.txt"), str(tmp_path / "out"))


def test_embed_refuses_a_string_max_seq_length_in_the_directory_in_one_line(tmp_path, params):
    checkpoint = tmp_path / "W" / "checkpoint"
    finetune_common.save_finetuned(
        str(checkpoint), TINY, params, vocab_file=minilm_vocab(),
        metadata={"task": "embedding",
                  "embedding": {"pooling": "mean", "normalize": False, "max_seq_length": "16"}},
    )  # fmt: skip
    (tmp_path / "t.txt").write_text("a\n")
    with pytest.raises(ValueError, match=r"finetuned.json: max_seq_length '16' is not a pos"):
        embed.run(str(tmp_path / "W"), str(tmp_path / "t.txt"), str(tmp_path / "o.npy"))


def test_one_example_with_batch_8_names_the_key():
    config = _polarity()
    with pytest.raises(ConfigError, match=r"1 training examples < --config.train_batch_size=8"):
        finetune_common.setup(config, None, None, 1, None, (), None, ())


@pytest.mark.parametrize("name,header", [("train.tsv", "text\tlabel"), ("train.csv", "text,label"),
                                         ("train.jsonl", None)])  # fmt: skip
def test_an_excel_byte_order_mark_is_read_as_utf8(tmp_path, name, header):
    """The issue's case: "the header ['\\ufefftext', 'label'] has no 'text' column"."""
    sep = "\t" if name.endswith(".tsv") else ","
    if header is None:
        body = '{"text": "good", "label": "pos"}\n{"text": "bad", "label": "neg"}\n'
    else:
        body = f"{header}\ngood{sep}pos\nbad{sep}neg\n"
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    examples = own_files.read_examples(str(path), labeled=True)
    assert [e.text_a for e in examples] == ["good", "bad"]


def test_every_task_reader_drops_a_byte_order_mark(tmp_path):
    from data_pipelines.tasks import conll, squad

    bom = b"\xef\xbb\xbf"
    (tmp_path / "g.tsv").write_bytes(bom + b"sentence\tlabel\nhello\t1\n")
    assert list(read_tsv(tmp_path / "g.tsv", skip_header=False))[0] == (1, ["sentence", "label"])
    (tmp_path / "p.tsv").write_bytes(bom + b"a query\ta passage\nb\tc\n")
    assert pairs.read_pairs(tmp_path / "p.tsv").queries[0] == "a query"
    (tmp_path / "c.txt").write_bytes(bom + b"EU B-ORG\nrejects O\n\n")
    assert conll.read_conll(tmp_path / "c.txt")[0].words[0] == "EU"
    qa = {"id": "q1", "question": "Who?", "answers": [{"text": "Ann", "answer_start": 0}]}
    squad_json = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "Ann sat.", "qas": [qa]}]}]}  # fmt: skip
    (tmp_path / "s.json").write_bytes(bom + json.dumps(squad_json).encode())
    assert squad.read_squad(tmp_path / "s.json", is_training=False)[0].qas_id == "q1"


@pytest.mark.parametrize("reader", ["pairs", "own", "tsv"])
def test_a_non_utf8_file_is_named_with_its_line(tmp_path, reader):
    lines = [b"text\tlabel", b"good one\tpos", b"caf\xe9 latin-1\tneg"]
    path = tmp_path / "data.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TaskDataError, match=r"data.tsv:3: not UTF-8 text \(byte 0xe9"):
        if reader == "pairs":
            pairs.read_pairs(path)
        elif reader == "own":
            own_files.read_rows(str(path))
        else:
            list(read_tsv(path, skip_header=True))


def test_a_tagging_split_of_one_tag_is_refused(tmp_path):
    from data_pipelines.tasks import conll
    from data_pipelines.tasks.tagging_tasks import load_tagging_task
    from experiments import finetune_tagging

    (tmp_path / "train.txt").write_text("EU O\nrejects O\n\nPeter O\n\n")
    (tmp_path / "dev.txt").write_text("EU B-ORG\n\n")
    assert conll.read_conll(tmp_path / "train.txt")
    task = load_tagging_task("conll", train_file=str(tmp_path / "train.txt"),
                             dev_file=str(tmp_path / "dev.txt"))  # fmt: skip
    with pytest.raises(TaskDataError, match=r"all 3 training words are tagged 'O'"):
        finetune_tagging.check_train_tags(task)


def test_a_cased_encoder_fine_tuned_end_to_end_stays_cased(tmp_path, cased_hf):
    """The issue's case through a whole fine-tuning run: finetuned.json says
    do_lower_case false, and the fine-tuned model embeds `KING HENRY` apart from
    `king henry`."""
    from experiments import finetune_classification
    from experiments.configs import finetune_own_classification

    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\n" + "".join(f"text {i}\t{'ab'[i % 2]}\n" for i in range(8)))
    config = finetune_own_classification.get_config()
    config.init_from, config.train_file = cased_hf, str(train)
    config.num_epochs, config.train_batch_size, config.eval_batch_size = 1, 8, 8
    config.max_seq_length = 16
    workdir = tmp_path / "W"
    results = finetune_classification.finetune(config, str(workdir), show_progress=False)
    assert results["do_lower_case"] is False
    meta = json.loads((workdir / "checkpoint" / "finetuned.json").read_text())
    assert meta["do_lower_case"] is False
    texts = tmp_path / "texts.txt"
    texts.write_text("KING HENRY\nking henry\n")
    embed.run(str(workdir / "checkpoint"), str(texts), str(tmp_path / "e.npy"), batch_size=2)
    rows = np.load(tmp_path / "e.npy")
    assert not np.allclose(rows[0], rows[1])
