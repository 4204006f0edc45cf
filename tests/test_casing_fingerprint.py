"""Normalisation is part of the vocabulary's identity (issue 75, item 2): the records' stats
and a checkpoint's saved fingerprint record the casing (`do_lower_case`, and the accent
stripping a vocab.txt does with it); records lower-cased for a cased run are refused at
start naming their stats file, both casings and the flag that fixes it; stats made before the
field load with a warning; create_pretraining_data takes the casing of a source model
directory's tokenizer_config.json unless --do_lower_case is given."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import synthetic_pretraining as synth
from create_data_fixtures import _minilm_vocab, _options, _read_records, _write_documents

from data_pipelines import tfrecord_files, vocab_fingerprint
from data_pipelines.create_pretraining_data import create_pretraining_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [[f"The {w} sat on the mat .", f"A {w} ran far away ."] for w in ("Cat", "Dog", "Fox")]


@pytest.fixture(scope="module")
def lower_records(tmp_path_factory):
    """Records made lower-cased (the tool's default) with MiniLM's vocab.txt."""
    tmp_path = tmp_path_factory.mktemp("lower")
    options = _options(tmp_path, _write_documents(tmp_path / "docs.txt", DOCS))
    create_pretraining_data(options)
    return options.output_file


def _stats(output: str) -> dict:
    with open(output + tfrecord_files.STATS_SUFFIX) as f:
        return json.load(f)


def test_lower_cased_records_are_refused_by_a_cased_config(lower_records):
    from bert_jax import pretraining_input

    config = synth.tiny_config(os.path.dirname(lower_records))
    config.data.train_files = lower_records
    config.data.vocab_file = _minilm_vocab()  # the records' own vocabulary: only casing differs
    config.data.do_lower_case = False
    with pytest.raises(vocab_fingerprint.CasingMismatchError) as refused:
        pretraining_input.make_input(config, None, files=lower_records, seed=0, mask_config=None)
    message = str(refused.value)
    assert "\n" not in message
    assert lower_records + tfrecord_files.STATS_SUFFIX in message
    assert "lower-cased, accents stripped (do_lower_case=True)" in message
    assert "cased (do_lower_case=False)" in message
    assert "--do_lower_case=false" in message and "--config.data.do_lower_case=True" in message


def test_records_of_the_runs_casing_pass(lower_records):
    assert _stats(lower_records)["vocab"]["do_lower_case"] is True
    vocab_fingerprint.check_records_vocab(lower_records, _minilm_vocab(), do_lower_case=True)
    with pytest.raises(vocab_fingerprint.CasingMismatchError):
        vocab_fingerprint.check_records_vocab(lower_records, _minilm_vocab(), do_lower_case=False)


def test_stats_without_the_casing_load_with_a_warning(lower_records, tmp_path, caplog):
    old = tmp_path / "out.tfrecord"
    shutil.copyfile(lower_records, old)
    stats = _stats(lower_records)
    del stats["vocab"]["do_lower_case"], stats["vocab"]["strip_accents"]  # made before them
    (tmp_path / ("out.tfrecord" + tfrecord_files.STATS_SUFFIX)).write_text(json.dumps(stats))
    with caplog.at_level("WARNING"):
        vocab_fingerprint.check_records_vocab(str(old), _minilm_vocab(), do_lower_case=False)
    assert any("casing it was made with is not recorded" in r.getMessage() for r in caplog.records)


def test_init_from_refuses_a_checkpoint_of_another_casing_naming_the_config_key(tmp_path):
    """The fingerprint saved with a checkpoint holds its casing; `init_from` compares it, and
    `convert` exports it."""
    import jax.numpy as jnp

    from bert_jax import checkpointing, train_loop

    vocab = synth.write_vocab(str(tmp_path / "vocab.txt"))
    saved = vocab_fingerprint.fingerprint(vocab, do_lower_case=False)  # a cased model's
    assert saved["do_lower_case"] is False and saved["strip_accents"] is False
    manager = checkpointing.make_manager(str(tmp_path / "ckpt"), async_save=False)
    params = {"params": {"w": jnp.ones(2)}}
    checkpointing.save(manager, 1, params, [{}], {"vocab_fingerprint": saved})
    checkpointing.finish_saves(manager)
    config = synth.tiny_config(str(tmp_path))  # do_lower_case=True: uncased
    with pytest.raises(vocab_fingerprint.CasingMismatchError) as refused:
        train_loop._check_init_vocab(str(tmp_path / "ckpt"), config)
    assert "made cased (do_lower_case=False)" in str(refused.value)
    assert "--config.data.do_lower_case=False" in str(refused.value)
    config.data.do_lower_case = False
    train_loop._check_init_vocab(str(tmp_path / "ckpt"), config)
    # convert's HF export writes the casing it was trained with (no --do_lower_case given).
    from bert_jax.convert.__main__ import trained_casing

    assert trained_casing(str(tmp_path / "ckpt")) is False


def _cased_source(directory) -> str:
    """A source model directory: a vocab.txt with capitalised words (MiniLM's plus three)
    and a tokenizer_config.json that says it is cased."""
    os.makedirs(directory)
    with open(_minilm_vocab(), encoding="utf-8") as f:
        tokens = f.read().splitlines()
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join([*tokens, "The", "Cat", "Dog"]) + "\n")
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": False, "tokenizer_class": "BertTokenizer"}, f)
    return str(directory), len(tokens)


def _make(tmp_path, name: str, source: str, *flags: str) -> tuple[str, str]:
    output = str(tmp_path / f"{name}.tfrecord")
    result = subprocess.run(
        [sys.executable, "-m", "data_pipelines.create_pretraining_data",
         f"--input_file={_write_documents(tmp_path / 'docs.txt', DOCS)}",
         f"--output_file={output}", f"--vocab_file={source}", "--masking=dynamic",
         "--max_seq_length=128", "--max_predictions_per_seq=20", *flags],
        cwd=REPO, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return output, result.stderr


def test_create_pretraining_data_takes_a_source_dirs_casing_unless_the_flag_is_given(tmp_path):
    source, the = _cased_source(tmp_path / "source")  # `the`: the id of "The"
    output, log = _make(tmp_path, "cased", source)
    assert "do_lower_case=False (from the tokenizer_config.json" in log
    casing = _stats(output)["vocab"]
    assert casing["do_lower_case"] is False and casing["strip_accents"] is False
    ids = _read_records([output], dynamic=True)["input_ids"]
    assert (ids == the).any() and (ids == the + 1).any()  # "The" and "Cat" kept their capitals
    output, log = _make(tmp_path, "lower", source, "--do_lower_case")  # given: it wins
    assert "do_lower_case=True (given by --do_lower_case)" in log
    assert _stats(output)["vocab"]["do_lower_case"] is True
