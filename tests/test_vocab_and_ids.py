"""Ids and vocabularies checked where they enter (issue 64 item 3): records carry the
fingerprint of the vocabulary they were made with and a run refuses another one by name;
token ids and masked-LM targets outside the vocabulary stop at the first batch holding one,
naming it (never a NaN loss); STS-B scores outside [0, 5] or nan name the file and line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import synthetic_pretraining as synth
from create_data_fixtures import _minilm_vocab, _options, _write_documents
from protobuf_records import serialize_masked

from data_pipelines import input_pipeline, tfrecord_files, vocab_fingerprint
from data_pipelines.create_pretraining_data import create_pretraining_data
from data_pipelines.tasks import glue
from data_pipelines.tasks.formats import TaskDataError


def _same_size_other_vocab(vocab: str, path) -> str:
    """`vocab` with two tokens swapped: the same size, other ids."""
    with open(vocab, encoding="utf-8") as f:
        lines = f.read().splitlines()
    lines[2000], lines[2001] = lines[2001], lines[2000]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def made_records(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("records")
    docs = [[f"the {w} sat on the mat .", f"a {w} ran far away ."] for w in ("cat", "dog", "fox")]
    options = _options(tmp_path, _write_documents(tmp_path / "docs.txt", docs))
    stats = create_pretraining_data(options)
    return tmp_path, options.output_file, stats


def test_new_records_carry_the_fingerprint_of_their_vocabulary(made_records):
    _, output, stats = made_records
    with open(_minilm_vocab(), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    # and the casing its text was made with (a vocab.txt: accents stripped with it).
    casing = {"do_lower_case": True, "strip_accents": True}
    assert stats["vocab"] == {"file": _minilm_vocab(), "sha256": sha, **casing}
    with open(output + tfrecord_files.STATS_SUFFIX) as f:
        assert json.load(f)["vocab"]["sha256"] == sha


def test_another_vocabulary_of_the_same_size_is_refused_naming_both(made_records, tmp_path):
    """The issue's case: records made with one vocabulary trained with another of its size."""
    _, output, _ = made_records
    other = _same_size_other_vocab(_minilm_vocab(), tmp_path / "other_vocab.txt")
    with pytest.raises(vocab_fingerprint.VocabMismatchError) as refused:
        vocab_fingerprint.check_records_vocab(output, other)
    message = str(refused.value)
    assert output in message and _minilm_vocab() in message and other in message
    assert "--config.data.allow_vocab_change=True" in message
    vocab_fingerprint.check_records_vocab(output, other, allow=True)  # meant: a warning
    copy = shutil.copyfile(_minilm_vocab(), tmp_path / "vocab.txt")  # same bytes elsewhere
    vocab_fingerprint.check_records_vocab(output, str(copy))
    vocab_fingerprint.check_records_vocab(output, str(tmp_path))  # a directory: its vocab.txt


def test_records_without_a_fingerprint_are_read_as_before(made_records, tmp_path, caplog):
    directory, output, _ = made_records
    old = tmp_path / "old"
    old.mkdir()
    shutil.copyfile(output, old / "out.tfrecord")
    with open(output + tfrecord_files.STATS_SUFFIX) as f:
        stats = json.load(f)
    del stats["vocab"]
    (old / ("out.tfrecord" + tfrecord_files.STATS_SUFFIX)).write_text(json.dumps(stats))
    other = _same_size_other_vocab(_minilm_vocab(), tmp_path / "other_vocab.txt")
    with caplog.at_level("INFO"):
        vocab_fingerprint.check_records_vocab(str(old / "out.tfrecord"), other)
    assert any("no vocabulary fingerprint" in r.getMessage() for r in caplog.records)


def _write(path, examples) -> str:
    with tfrecord_files.TFRecordShardWriter([str(path)]) as writer:
        for example in examples:
            record = serialize_masked(
                example, max_seq_length=synth.SEQ_LEN, max_predictions_per_seq=synth.PREDICTIONS
            )
            writer.write(record, shard=0)
    return str(path)


def _stream(files, vocab_size: int):
    return input_pipeline.make_pretraining_dataset(
        files,
        global_batch_size=4,
        max_seq_length=synth.SEQ_LEN,
        max_predictions_per_seq=synth.PREDICTIONS,
        seed=0,
        process_index=0,
        process_count=1,
        shuffle_buffer=1,
        vocab_size=vocab_size,
    )


def _examples(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [synth.random_example(rng) for _ in range(n)]  # ids in [1000, 3000)


@pytest.mark.parametrize(
    "field, value, what",
    [
        ("input_ids", 40_000, "token id 40000"),  # records from a larger vocabulary
        ("masked_lm_ids", 3500, "masked-LM target id 3500"),  # a target alone out of range
        ("input_ids", -1, "token id -1"),
    ],
)
def test_an_id_outside_the_vocabulary_stops_at_its_batch_naming_it(tmp_path, field, value, what):
    examples = _examples(12)
    examples[9][field] = examples[9][field].copy()
    examples[9][field][3] = value  # in the third batch of 4
    path = _write(tmp_path / "bad.tfrecord", examples)
    stream = _stream(path, vocab_size=3072)
    next(stream), next(stream)  # the batches before it pass
    with pytest.raises(input_pipeline.TokenIdError) as stopped:
        next(stream)
    message = str(stopped.value)
    assert message.startswith(f"{what} outside the vocabulary's [0, 3072)")
    assert path in message and "stream 0's batch that ends at epoch 0, batch_in_epoch 3" in message


def test_a_smaller_vocabulary_than_the_records_stops_at_the_first_batch(tmp_path):
    """The issue's case through the run's own input: records with ids past the config's vocab
    file (same objective, a vocab of 1500 tokens) stop before any step, naming the file."""
    from bert_jax import pretraining_input
    from experiments.configs import bert_tiny_cpu

    path = _write(tmp_path / "train-0.tfrecord", _examples(8))
    small = tmp_path / "small_vocab.txt"
    with open(synth.minilm_vocab(), encoding="utf-8") as f:
        small.write_text("".join(f.readline() for _ in range(1500)), encoding="utf-8")
    config = bert_tiny_cpu.get_config()
    config.data.train_files = path
    config.data.vocab_file = str(small)
    config.data.max_seq_length = synth.SEQ_LEN
    config.data.max_predictions_per_seq = synth.PREDICTIONS
    config.data.dynamic_masking = False
    config.global_batch_size = 4
    data = pretraining_input.train_input(config, None, None)
    with pytest.raises(input_pipeline.TokenIdError, match=r"token id \d+ outside .*\[0, 1500\)"):
        next(data)


def _stsb(tmp_path, scores) -> str:
    header = "\t".join(["index", "genre", "filename", "year", "old_index", "source1", "source2",
                        "sentence1", "sentence2", "score"])  # fmt: skip
    rows = [
        "\t".join([str(i), "g", "f", "y", "o", "s", "s", "a cat", "a dog", score])
        for i, score in enumerate(scores)
    ]
    (tmp_path / "train.tsv").write_text("\n".join([header, *rows]) + "\n")
    return str(tmp_path)


@pytest.mark.parametrize("score", ["500", "nan", "-0.5", "inf"])
def test_an_sts_b_score_outside_0_to_5_is_refused_with_its_file_and_line(tmp_path, score):
    """The issue's cases: a score of 500 trained (loss 2,238); nan stopped at step 4, no row."""
    data_dir = _stsb(tmp_path, ["0.0", "3.2", score, "5.0"])
    with pytest.raises(TaskDataError) as refused:
        glue.read_split("stsb", data_dir, "train")
    path = os.path.join(data_dir, "train.tsv")
    assert str(refused.value).startswith(f"{path}:4: score {float(score)!r} is outside")
    assert "[0, 5]" in str(refused.value)


def test_sts_b_scores_at_the_ends_of_the_range_are_read(tmp_path):
    examples = glue.read_split("stsb", _stsb(tmp_path, ["0", "5", "2.5"]), "train")
    assert [e.label for e in examples] == [0.0, 5.0, 2.5]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> str:
    """A pretrained BERT-tiny exported as a HF directory, with the MiniLM vocab."""
    from finetune_fixtures import TINY, minilm_vocab, pretrained_params

    from bert_jax import convert

    directory = tmp_path_factory.mktemp("encoder") / "hf"
    return convert.save_hf(directory, TINY, pretrained_params(), vocab_file=minilm_vocab())


def test_fine_tuning_refuses_a_vocab_file_other_than_its_encoders(tmp_path, encoder):
    """--config.vocab_file names another vocabulary, of the same size as the one the encoder
    was pretrained with: refused naming both, unless config.allow_vocab_change."""
    from finetune_fixtures import minilm_vocab

    from bert_jax import finetune_common as common
    from bert_jax.config import BertConfig
    from bert_jax.heads import BertForSequenceClassification
    from experiments.configs import finetune_glue

    other = _same_size_other_vocab(minilm_vocab(), tmp_path / "other_vocab.txt")
    config = finetune_glue.get_config()
    config.init_from, config.vocab_file = str(encoder), other
    module = BertForSequenceClassification(BertConfig(), 2)
    with pytest.raises(vocab_fingerprint.VocabMismatchError) as refused:
        common.load_task_model(config, module)
    message = str(refused.value)
    assert os.path.join(encoder, "vocab.txt") in message and other in message
    assert "--config.allow_vocab_change=True" in message
    config.allow_vocab_change = True
    assert common.load_task_model(config, module).vocab_file == other


def test_a_sentencepiece_model_as_vocab_file_is_refused_before_training(tmp_path, encoder):
    """The issue's case: fine-tuning with a sentencepiece `.model` as vocab_file trained and
    scored, then died at the final save (check_vocab read it as text): the model was lost.
    Now what the save checks is checked when the model loads, before any step."""
    spm = pytest.importorskip("sentencepiece")
    from bert_jax import finetune_common as common
    from bert_jax.config import BertConfig
    from bert_jax.heads import BertForSequenceClassification
    from experiments.configs import finetune_glue

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"the {i} cat sat on mat number {i * 7}" for i in range(300)))
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=120, minloglevel=2,
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"],
    )  # fmt: skip
    config = finetune_glue.get_config()
    config.init_from, config.vocab_file = str(encoder), str(tmp_path / "sp.model")
    with pytest.raises(ValueError):  # UnicodeDecodeError today; named by the tokenizer's check
        common.load_task_model(config, BertForSequenceClassification(BertConfig(), 2))
