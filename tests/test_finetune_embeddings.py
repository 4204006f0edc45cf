"""experiments.finetune_embeddings end to end on a tiny BERT: it learns the pairs, scores
dev retrieval before and after, and saves a model that embed, convert and
sentence-transformers read with its pooling; bad pairs files and keys are one line."""

from __future__ import annotations

import json
import os

os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params

from bert_jax import config_bounds, convert, embeddings
from bert_jax.config import ConfigError
from data_pipelines.tasks.formats import TaskDataError
from data_pipelines.tasks.pairs import read_pairs
from experiments import finetune_embeddings
from experiments.configs import embeddings as embeddings_config

WORDS = ("river mountain engine violin harbor desert planet garden winter castle "
         "pepper rocket candle forest tiger silver").split()  # fmt: skip


def _pairs(path, n, negatives=False):
    """Query word i matches a passage of two other words that share no piece with it:
    only training can tell which passage is whose."""
    lines = []
    for i in range(n):
        a, b, c = WORDS[i % 16], WORDS[(5 * i + 3) % 16], WORDS[(7 * i + 2) % 16]
        row = [a, f"{b} {c}"]
        if negatives:
            row.append(f"{c} {b}")  # the same words: only their order differs
        lines.append("\t".join(row))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("embeddings")
    hf = convert.save_hf(root / "hf", TINY, pretrained_params(), vocab_file=minilm_vocab(),
                         do_lower_case=True)  # fmt: skip
    config = embeddings_config.get_config()
    config.init_from = str(hf)
    config.train_file = str(_pairs(root / "train.tsv", 16, negatives=True))
    # The training pairs scored as retrieval: what the run learned shows in its "after".
    config.dev_file = str(_pairs(root / "dev.tsv", 16))
    config.global_batch_size = 8
    config.chunk_size = 4
    config.num_train_steps = 30
    config.learning_rate = 2e-3
    config.warmup_proportion = 0.0
    # The rate above is BERT's AdamW's (no bias correction: small first steps); the config's
    # default, sentence-transformers' bias-corrected AdamW, takes full steps at once.
    config.optimizer = "adamw"
    config.max_seq_length = 16
    config.eval_batch_size = 8
    config.log_every = 5
    config_bounds.check(config, "finetune", devices=8)
    workdir = root / "workdir"
    metrics = finetune_embeddings.run(config, str(workdir))
    return workdir, metrics, config


@pytest.fixture(scope="module")
def matryoshka(tmp_path_factory):
    """A few steps with the loss over 8- and 16-dimension prefixes too, dev scored at each."""
    root = tmp_path_factory.mktemp("matryoshka")
    hf = convert.save_hf(root / "hf", TINY, pretrained_params(), vocab_file=minilm_vocab(),
                         do_lower_case=True)  # fmt: skip
    config = embeddings_config.get_config()
    config.init_from = str(hf)
    config.train_file = str(_pairs(root / "train.tsv", 16, negatives=True))
    config.dev_file = str(_pairs(root / "dev.tsv", 16))
    config.global_batch_size = 8
    config.num_train_steps = 2
    config.max_seq_length = 16
    config.eval_batch_size = 8
    config.log_every = 1
    config.matryoshka_dims = "8,16"
    config_bounds.check(config, "finetune", devices=8)
    workdir = root / "workdir"
    return workdir, finetune_embeddings.run(config, str(workdir))


def test_training_learns_the_pairs_and_scores_dev_before_and_after(trained):
    workdir, metrics, _ = trained
    log = [json.loads(line) for line in (workdir / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [5, 10, 15, 20, 25, 30]
    assert log[-1]["loss"] < 0.5 * log[0]["loss"]
    assert log[-1]["accuracy"] > log[0]["accuracy"]
    assert set(metrics["before"]) == {"nDCG@10", "MRR@10", "R@1", "R@10", "R@100"}
    assert metrics["after"]["MRR@10"] > metrics["before"]["MRR@10"]
    assert json.loads((workdir / "metrics.json").read_text())["after"] == metrics["after"]


def test_the_saved_model_embeds_with_its_pooling_here_and_in_sentence_transformers(
    trained, tmp_path
):
    st = pytest.importorskip("sentence_transformers")
    import subprocess
    import sys

    workdir, _, config = trained
    model = embeddings.load_embedding_model(str(workdir))
    assert (model.module.pooling, model.module.normalize, model.max_seq_length) == (
        "mean", True, 16)  # fmt: skip
    texts = ["where is the river engine", "the tiger silver is here", ""]
    ours = embeddings.embed_texts(model, texts, show_progress=False)
    out = tmp_path / "st"
    subprocess.run(
        [sys.executable, "-m", "bert_jax.convert", f"--input={workdir / 'checkpoint'}",
         f"--output={out}", "--format=sentence-transformers"],
        check=True, capture_output=True,
    )  # fmt: skip
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)


def test_matryoshka_scores_each_size_and_the_export_carries_its_truncation(matryoshka, tmp_path):
    """metrics.json scores the dev pairs at each prefix; `embed --dims` cuts and re-normalises;
    `convert --truncate_dim` writes it where `embed` reads it back, and sentence-transformers'
    `truncate_dim` gives the same vectors (its own are not re-normalised: compared as unit
    vectors)."""
    st = pytest.importorskip("sentence_transformers")
    import subprocess
    import sys

    workdir, metrics = matryoshka
    log = [json.loads(line) for line in (workdir / "train_log.jsonl").read_text().splitlines()]
    assert {"loss_32", "loss_16", "loss_8"} <= set(log[0])  # each size's own loss
    assert set(metrics["after_dims"]) == {"8", "16"}
    assert set(metrics["after_dims"]["8"]) == set(metrics["after"])
    saved = json.loads((workdir / "metrics.json").read_text())
    assert saved["after_dims"] == metrics["after_dims"]
    meta = json.loads((workdir / "checkpoint" / "finetuned.json").read_text())
    assert meta["embedding"]["matryoshka_dims"] == [32, 16, 8]

    texts = tmp_path / "texts.txt"
    texts.write_text("where is the river engine\nthe tiger silver is here\n", encoding="utf-8")
    full, cut = tmp_path / "full.npy", tmp_path / "cut.npy"
    for out, extra in ((full, []), (cut, ["--dims=8"])):
        subprocess.run([sys.executable, "-m", "experiments.embed", f"--model={workdir}",
                        f"--input_file={texts}", f"--output_file={out}", *extra],
                       check=True, capture_output=True)  # fmt: skip
    full, cut = np.load(full), np.load(cut)
    assert full.shape == (2, 32) and cut.shape == (2, 8)
    expected = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, rtol=0, atol=1e-6)

    export = tmp_path / "st"
    subprocess.run(
        [sys.executable, "-m", "bert_jax.convert", f"--input={workdir}", f"--output={export}",
         "--format=sentence-transformers", "--truncate_dim=8"],
        check=True, capture_output=True,
    )  # fmt: skip
    config = json.loads((export / "config_sentence_transformers.json").read_text())
    assert config["truncate_dim"] == 8
    card = (export / "README.md").read_text()
    assert "truncate_dim=8" in card and "trained at 32, 16, 8" in card
    assert "first 8 dimensions" in card  # the per-size dev scores
    model = embeddings.load_embedding_model(str(export))
    assert model.truncate_dim == 8
    lines = texts.read_text().splitlines()
    np.testing.assert_allclose(embeddings.embed_texts(model, lines, show_progress=False), cut,
                               rtol=0, atol=1e-6)  # fmt: skip
    theirs = st.SentenceTransformer(str(export), device="cpu", truncate_dim=8).encode(lines)
    assert theirs.shape == (2, 8)
    theirs = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)
    np.testing.assert_allclose(cut, theirs, rtol=0, atol=1e-5)
    (export / "config_sentence_transformers.json").write_text('{"truncate_dim": "8"}')
    with pytest.raises(convert.ConversionError, match="truncate_dim '8' is not a whole number"):
        embeddings.load_embedding_model(str(export))


@pytest.mark.parametrize(
    "line,message",
    [
        ("only a query", r"pairs.tsv:2: one column"),
        ("a query\t", r"pairs.tsv:2: column 2 is empty"),
        ("same text\tsame text", r"pairs.tsv:2: the query is identical to its positive"),
        ("q\tp\tn", r"pairs.tsv:2: 3 columns where the first line has 2"),
    ],
)
def test_a_bad_pairs_line_is_named_by_file_and_line(tmp_path, line, message):
    path = tmp_path / "pairs.tsv"
    path.write_text(f"a question\tan answer\n{line}\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=message):
        read_pairs(path)


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("global_batch_size", 1, r"global_batch_size=1: a batch of one pair has no in-batch"),
        ("pooling", "max", r"--config.pooling='max' is outside its range"),
        ("chunk_size", 3, r"--config.chunk_size=3 does not divide --config.global_batch_size=64"),
        ("matryoshka_dims", "64,x", r"--config.matryoshka_dims='64,x' is outside its range"),
        ("matryoshka_dims", "64,64", r"--config.matryoshka_dims='64,64' names a size twice"),
    ],
)
def test_bad_keys_are_refused_by_name(key, value, message):
    config = embeddings_config.get_config()
    config[key] = value
    with pytest.raises(ConfigError, match=message):
        config_bounds.check(config, "finetune", devices=8)
