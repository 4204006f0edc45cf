"""Sentence classification fine-tuning: restoring, the train step, batching, the whole script.

Runs on 8 fake CPU devices with a 2-layer H=32 BERT (tests/finetune_fixtures.py) and the
GLUE fixtures in tests/fixtures/tasks/glue/.
"""

import csv
import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params, write_all, write_train_state

from bert_jax import finetune_common as common
from bert_jax import sharding
from bert_jax.config import BertConfig
from bert_jax.heads import BertForSequenceClassification
from bert_jax.model import BertModel
from bert_jax.train_state import TrainState, make_step, sharded_state
from data_pipelines.tasks.classification_features import encode_sentences
from data_pipelines.tasks.sentence_tasks import load_sentence_task
from data_pipelines.tokenization import load_tokenizer
from experiments import finetune_classification as ftc
from experiments.configs import finetune_glue

GLUE_DIR = Path(__file__).parent / "fixtures" / "tasks" / "glue"
REPO = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def reference_params():
    return pretrained_params(seed=1)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, reference_params):
    return write_all(tmp_path_factory.mktemp("ckpt"), reference_params)


def _equal_trees(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("kind", ["hf", "tf", "orbax", "train_state"])
def test_encoder_restores_from_every_checkpoint_kind_under_a_fresh_head(
    kind, checkpoints, reference_params
):
    module, config, params, vocab = common.load_model(
        BertForSequenceClassification(BertConfig(), 3), str(checkpoints[kind])
    )
    assert config.hidden_size == TINY.hidden_size and module.config == config
    assert not config.causal  # BERT's checkpoints (a workdir without config.objective too)
    assert Path(vocab).read_text() == Path(minilm_vocab()).read_text()
    _equal_trees(params["bert"], reference_params["bert"])  # encoder + pooler, bit for bit
    assert set(params) == {"bert", "classifier"}
    assert params["classifier"]["kernel"].shape == (TINY.hidden_size, 3)
    assert np.std(np.asarray(params["classifier"]["kernel"])) > 0


def test_an_ltr_pretraining_workdir_fine_tunes_causal(tmp_path):
    """A workdir pretrained with config.objective="ltr" restores into a classifier whose
    config is causal (left-to-right attention, pooled at the last token, as the paper
    fine-tunes its LTR model); its pooler starts fresh (the ltr model has none)."""
    from bert_jax.heads import BertForPreTraining

    model = BertForPreTraining(TINY.replace(causal=True), next_sentence=False)
    ids = np.zeros((1, 4), np.int32)
    params = jax.jit(lambda r: nn.unbox(model.init(r, ids, ids, ids, ids)["params"]))(
        jax.random.key(3)
    )
    params = jax.tree.map(np.asarray, params)
    workdir = write_train_state(tmp_path / "ltr", params, objective="ltr")
    module, config, restored, _ = common.load_model(
        BertForSequenceClassification(BertConfig(), 2), str(workdir)
    )
    assert config.causal and module.config.causal
    encoder = {k: v for k, v in restored["bert"].items() if k != "pooler"}
    _equal_trees(encoder, params["bert"])
    assert "pooler" in restored["bert"]  # fresh: only NSP trains a pooler


def test_from_scratch_keeps_the_architecture_but_not_the_weights(checkpoints, reference_params):
    _, config, params, _ = common.load_model(
        BertForSequenceClassification(BertConfig(), 2), str(checkpoints["hf"]), from_scratch=True
    )
    assert config.num_hidden_layers == TINY.num_hidden_layers
    word = np.asarray(params["bert"]["embeddings"]["word_embeddings"]["embedding"])
    reference = reference_params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert word.shape == reference.shape and not np.allclose(word, reference)


def _task_config(init_from, **changes):
    config = finetune_glue.get_config()
    config.init_from = init_from
    config.update(changes)
    return config


def test_load_task_model_reads_the_config_and_checks_the_vocab(checkpoints, tmp_path):
    module = BertForSequenceClassification(BertConfig(), 2)
    loaded = common.load_task_model(_task_config(str(checkpoints["hf"])), module)
    assert loaded.vocab_file == str(Path(checkpoints["hf"]) / "vocab.txt")
    assert loaded.tokenizer.vocab_size == loaded.config.vocab_size == TINY.vocab_size
    assert loaded.module.config == loaded.config and set(loaded.params) == {"bert", "classifier"}
    # The same seed draws the same head; another seed another one.
    again = common.load_task_model(_task_config(str(checkpoints["hf"])), module)
    other = common.load_task_model(_task_config(str(checkpoints["hf"]), seed=7), module)
    head = np.asarray(loaded.params["classifier"]["kernel"])
    np.testing.assert_array_equal(head, np.asarray(again.params["classifier"]["kernel"]))
    assert not np.allclose(head, np.asarray(other.params["classifier"]["kernel"]))

    # A vocab with more tokens than the embedding table has rows is refused, by name.
    big = tmp_path / "big_vocab.txt"
    big.write_text(Path(loaded.vocab_file).read_text() + "extra1\nextra2\n")
    with pytest.raises(ValueError, match="big_vocab.txt has .* tokens > the model's vocab_size"):
        common.load_task_model(_task_config(str(checkpoints["hf"]), vocab_file=str(big)), module)

    # A checkpoint without a vocab beside it and no --config.vocab_file names the flag.
    bare = tmp_path / "bare"
    bare.mkdir()
    for item in Path(checkpoints["hf"]).iterdir():
        if item.name != "vocab.txt":
            shutil.copyfile(item, bare / item.name)  # a link out of it is refused
    with pytest.raises(
        ValueError,
        match="no vocab.txt, tokenizer.json or .model beside .*bare; set --config.vocab_file",
    ):
        common.load_task_model(_task_config(str(bare)), module)


def _setup_step(num_labels, lr=1e-3):
    mesh = sharding.create_mesh((1, 1, 1), jax.devices()[:1])  # the scripts run on 8
    model = BertForSequenceClassification(TINY, num_labels)
    ids = jnp.zeros((1, 16), jnp.int32)
    params = jax.jit(lambda r: model.init(r, ids, ids, ids)["params"])(jax.random.key(0))
    params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, params,
                          is_leaf=lambda x: hasattr(x, "unbox"))  # fmt: skip
    tx, schedule = common.make_optimizer(lr, 100, warmup_proportion=0.0)
    state, shardings = sharded_state(model, tx, mesh, [ids] * 3, params=params)
    step = jax.jit(
        make_step(functools.partial(ftc.train_loss, model=model, regression=False), tx, schedule),
        donate_argnums=0,
    )
    return mesh, state, step


def _random_batch(labels):
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 2000, size=(8, 16)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[:, 12:] = 0
    return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
            "labels": labels}  # fmt: skip


def test_a_few_steps_reduce_the_loss():
    mesh, state, step = _setup_step(3)
    batch = _random_batch(np.array([0, 1, 2, 0, 1, 2, 0, 1], np.int32))
    batch = sharding.global_batch(batch, mesh)
    losses = []
    with sharding.activation_context(mesh):
        for _ in range(12):
            state, metrics = step(state, batch, jax.random.key(0))
            losses.append(float(metrics["loss"]))
    assert int(state.step) == 12
    assert losses[-1] < 0.5 * losses[0], losses


def test_losses():
    logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]], np.float32)
    labels = np.array([0, 1])
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    expected = -(log_softmax[0, 0] + log_softmax[1, 1]) / 2
    assert float(ftc.loss_fn(logits, labels, False)) == pytest.approx(expected, rel=1e-6)
    targets = np.array([1.5, 4.0], np.float32)
    mse = ((2.0 - 1.5) ** 2 + (0.5 - 4.0) ** 2) / 2  # regression reads logit 0 only
    assert float(ftc.loss_fn(logits[:, :1], targets, True)) == pytest.approx(mse)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_cutting_padding_does_not_change_logits(pooling):
    model = BertForSequenceClassification(TINY, 2, pooling=pooling)
    batch = _random_batch(np.zeros(8, np.int32))
    params = model.init(jax.random.key(0), *(batch[k] for k in ftc.INPUT_KEYS))["params"]
    predict = jax.jit(functools.partial(ftc.predict_step, model=model))
    full = predict(params, batch)
    length = common.pad_length(batch["input_mask"].sum(1), 16, multiple=4)
    assert length == 12
    cut = common.take(batch, np.arange(8), length)
    assert cut["input_ids"].shape == (8, 12) and cut["labels"].shape == (8,)
    np.testing.assert_allclose(predict(params, cut), full, atol=1e-5)


def test_mean_pooling_classifies_the_mean_of_the_last_layer_over_real_tokens():
    model = BertForSequenceClassification(TINY, 2, pooling="mean")
    batch = _random_batch(np.zeros(8, np.int32))
    inputs = [batch[k] for k in ftc.INPUT_KEYS]
    params = nn.unbox(model.init(jax.random.key(0), *inputs)["params"])
    logits = model.apply({"params": params}, *inputs)
    hidden = BertModel(TINY).apply({"params": params["bert"]}, *inputs).sequence_output
    mask = np.asarray(batch["input_mask"], np.float32)[..., None]
    assert 0 < mask.sum() < mask.size  # the batch has padding to leave out
    pooled = (np.asarray(hidden) * mask).sum(1) / mask.sum(1)
    head = params["classifier"]
    expected = pooled @ np.asarray(head["kernel"]) + np.asarray(head["bias"])
    np.testing.assert_allclose(logits, expected, atol=1e-5)
    with pytest.raises(ValueError, match="pooling must be 'cls' or 'mean', not 'max'"):
        BertForSequenceClassification(TINY, 2, pooling="max").init(jax.random.key(0), *inputs)


def test_train_batches_cover_each_example_once_in_similar_lengths():
    lengths = np.random.default_rng(0).integers(3, 60, size=1000)
    batches = common.train_batches(lengths, 32, seed=0, epoch=1, group=4)
    flat = np.concatenate(batches)
    assert len(batches) == 31 and len(np.unique(flat)) == len(flat) == 31 * 32
    spread = np.mean([np.ptp(lengths[b]) for b in batches])
    assert spread < 0.5 * np.ptp(lengths)  # grouped runs, not random batches
    again = common.train_batches(lengths, 32, seed=0, epoch=1, group=4)
    assert all((a == b).all() for a, b in zip(batches, again, strict=True))
    other_epoch = common.train_batches(lengths, 32, seed=0, epoch=2, group=4)
    assert not all((a == b).all() for a, b in zip(batches, other_epoch, strict=True))


def test_eval_batches_cover_everything_once():
    lengths = np.array([5, 3, 9, 1, 7])
    seen = []
    for indices, real in common.eval_batches(lengths, 2):
        assert len(indices) == 2
        seen.extend(indices[:real])
    assert sorted(seen) == [0, 1, 2, 3, 4]


def _epochs(num_examples, num_epochs, bad_step, tmp_path):
    """Runs `train_epoch` with a fake step whose param norm is NaN at `bad_step` only."""
    config = ml_collections.ConfigDict(dict(train_batch_size=2, seed=0, max_seq_length=8,
                                            num_epochs=num_epochs, log_every=2))  # fmt: skip
    arrays = {"input_ids": np.ones((num_examples, 8), np.int32),
              "input_mask": np.ones((num_examples, 8), np.int32)}  # fmt: skip
    mesh = sharding.create_mesh((1, 1, 1), jax.devices()[:1])

    def step_fn(state, batch, rng, bad_step):
        step = state.step + 1
        metrics = {"loss": step.astype(jnp.float32), "learning_rate": 0.1 * step,
                   "grad_norm": jnp.float32(1.0), "update_norm": jnp.float32(0.0),
                   "param_norm": jnp.where(step == bad_step, jnp.nan, 1.0)}  # fmt: skip
        return state.replace(step=step), metrics

    state = TrainState(jnp.zeros((), jnp.int32), {}, ())
    losses = []
    with open(tmp_path / "log.jsonl", "w") as log_file:
        for epoch in range(1, num_epochs + 1):
            state, loss = common.train_epoch(
                step_fn, state, jax.random.key(0), arrays, epoch=epoch, config=config, mesh=mesh,
                log_file=log_file, step_args=(bad_step,), show_progress=False,
            )  # fmt: skip
            losses.append(loss)
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    return losses, log


def test_train_epoch_logs_windows_and_checks_every_step_as_pretraining_does(tmp_path):
    losses, log = _epochs(8, 1, bad_step=0, tmp_path=tmp_path)
    assert losses == [2.5]
    assert [(r["step"], r["epoch"], r["loss"]) for r in log] == [(2, 0.5, 1.5), (4, 1.0, 3.5)]
    assert log[-1]["learning_rate"] == pytest.approx(0.4)  # the last step's, not the mean
    # A finite loss does not hide a NaN param norm: the run stops at the next log line...
    with pytest.raises(FloatingPointError, match=r"non-finite param_norm nan at step 3$"):
        _epochs(8, 1, bad_step=3, tmp_path=tmp_path)
    # ... or at the end of an epoch whose last steps fall before the next log line.
    with pytest.raises(FloatingPointError, match=r"non-finite param_norm nan at step 3$"):
        _epochs(6, 2, bad_step=3, tmp_path=tmp_path)


def test_finetune_end_to_end_on_glue_sst2_fixture(checkpoints, tmp_path):
    config = finetune_glue.get_config("sst2")
    config.unlock()
    config.update(
        data_dir=str(GLUE_DIR / "SST-2"), init_from=str(checkpoints["orbax"]), max_seq_length=32,
        train_batch_size=8, eval_batch_size=8, num_epochs=2, learning_rate=1e-3, log_every=1,
        eval_every_epochs=5,
    )  # fmt: skip
    results = ftc.finetune(config, str(tmp_path))

    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["num_examples"] == {"train": 16, "dev": 8, "test": 8}
    assert [e["epoch"] for e in saved["epochs"]] == [1, 2]
    # Dev is scored every 5th epoch and after the last one.
    assert "dev" not in saved["epochs"][0]
    assert 0.0 <= saved["epochs"][-1]["dev"]["accuracy"] <= 1.0
    assert saved["num_train_steps"] == 4 and "test" not in saved  # SST-2 test is unlabeled
    assert results["epochs"] == saved["epochs"]
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]

    with open(tmp_path / "predictions_dev.tsv", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["guid", "label", "prediction", "p_0", "p_1"] and len(rows) == 9
    for row in rows[1:]:
        assert row[2] in ("0", "1")
        assert float(row[3]) + float(row[4]) == pytest.approx(1.0, abs=1e-5)
    submission = (tmp_path / "submission" / "SST-2.tsv").read_text().splitlines()
    assert submission[0] == "index\tprediction" and len(submission) == 9
    assert [line.split("\t")[0] for line in submission[1:]] == [str(i) for i in range(8)]


def test_cli_help():
    result = subprocess.run(
        [sys.executable, "-m", "experiments.finetune_classification", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert "Fine-tunes a pretrained BERT" in result.stdout
    assert "--config" in result.stdout and "--workdir" in result.stdout


def test_saved_checkpoint_reloads_and_predicts_the_same(checkpoints, tmp_path):
    config = finetune_glue.get_config("sst2")
    config.unlock()
    config.update(
        data_dir=str(GLUE_DIR / "SST-2"), init_from=str(checkpoints["hf"]), max_seq_length=32,
        train_batch_size=8, eval_batch_size=8, num_epochs=1, learning_rate=1e-3, pooling="mean",
    )  # fmt: skip
    ftc.finetune(config, str(tmp_path))

    model, bert_config, params, vocab, meta = ftc.load_classifier(str(tmp_path / "checkpoint"))
    assert bert_config.hidden_size == TINY.hidden_size and model.num_labels == 2
    assert meta["pooling"] == model.pooling == "mean"
    task = load_sentence_task(config.task, config.data_dir)
    assert meta["labels"] == ["0", "1"] and meta["num_outputs"] == 2 and meta["task"] == config.task
    assert Path(vocab).read_text() == Path(minilm_vocab()).read_text()
    assert not list(tmp_path.glob(".checkpoint.tmp-*"))  # renamed into place when complete

    # The dev probabilities written during the run came from the in-memory params.
    with open(tmp_path / "predictions_dev.tsv", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))[1:]
    guids = [r[0] for r in rows]
    written = np.array([[float(r[3]), float(r[4])] for r in rows])
    dev = task.splits["dev"]
    assert [e.guid for e in dev] == guids
    features = encode_sentences(dev, load_tokenizer(vocab, do_lower_case=True), 32, task.labels)
    logits = model.apply({"params": params}, features.input_ids, features.input_mask,
                         features.segment_ids)  # fmt: skip
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(logits, -1)), written, atol=2e-6)


def test_missing_finetuned_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="finetuned.json"):
        ftc.load_classifier(str(tmp_path / "nowhere"))


def test_a_kill_during_the_final_save_leaves_metrics_json_at_the_epoch_before(
    checkpoints, tmp_path, monkeypatch
):
    """metrics.json gets the last epoch's record only once the model is saved (issue 74)."""
    config = finetune_glue.get_config("sst2")
    config.unlock()
    config.update(
        data_dir=str(GLUE_DIR / "SST-2"), init_from=str(checkpoints["orbax"]), max_seq_length=32,
        train_batch_size=8, eval_batch_size=8, num_epochs=2, learning_rate=1e-3,
    )  # fmt: skip

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies in the save

    monkeypatch.setattr(ftc, "save_model", killed)
    with pytest.raises(KeyboardInterrupt):
        ftc.finetune(config, str(tmp_path))
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert [e["epoch"] for e in saved["epochs"]] == [1] and "wall_time_s" not in saved
    assert not (tmp_path / "checkpoint").exists()
