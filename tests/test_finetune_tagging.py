"""Token-tagging fine-tuning: the loss, a few steps, and the script on the CoNLL fixtures."""

import functools
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from finetune_fixtures import TINY, pretrained_params, write_tf_checkpoint

from bert_jax import finetune_common as common
from bert_jax import sharding
from bert_jax.heads import BertForTokenClassification
from bert_jax.train_state import make_step, sharded_state
from experiments import finetune_tagging as ftt
from experiments.configs import finetune_conll

CONLL_DIR = Path(__file__).parent / "fixtures" / "tasks" / "conll"
REPO = Path(__file__).parent.parent


def test_loss_averages_over_first_pieces_only():
    logits = np.zeros((1, 3, 2), np.float32)
    logits[0, 0] = [2.0, 0.0]
    logits[0, 2] = [0.0, 1.0]
    labels = np.array([[0, 1, 1]])
    weights = np.array([[1.0, 0.0, 1.0]], np.float32)  # position 1 is a continuation piece
    ce = lambda z, y: np.log(np.exp(z).sum()) - z[y]  # noqa: E731
    expected = (ce(logits[0, 0], 0) + ce(logits[0, 2], 1)) / 2
    assert float(ftt.loss_fn(logits, labels, weights)) == pytest.approx(expected, rel=1e-6)
    assert float(ftt.loss_fn(logits, labels, np.zeros_like(weights))) == 0.0


def test_a_few_steps_reduce_the_loss():
    mesh = sharding.create_mesh((1, 1, 1), jax.devices()[:1])  # the scripts run on 8
    model = BertForTokenClassification(TINY, 5)
    ids = jnp.zeros((1, 16), jnp.int32)
    params = jax.jit(lambda r: common.nn.unbox(model.init(r, ids, ids, ids)["params"]))(
        jax.random.key(0)
    )
    tx, schedule = common.make_optimizer(1e-3, 100, warmup_proportion=0.0)
    state, _ = sharded_state(model, tx, mesh, [ids] * 3, params=params)
    step = jax.jit(make_step(functools.partial(ftt.train_loss, model=model), tx, schedule))
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(1000, 2000, (8, 16)).astype(np.int32),
        "input_mask": np.ones((8, 16), np.int32),
        "segment_ids": np.zeros((8, 16), np.int32),
        "label_ids": rng.integers(0, 5, (8, 16)).astype(np.int32),
        "label_weights": (rng.random((8, 16)) < 0.6).astype(np.float32),
    }
    batch = sharding.global_batch(batch, mesh)
    losses = []
    with sharding.activation_context(mesh):
        for _ in range(12):
            state, metrics = step(state, batch, jax.random.key(0))
            losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0], losses


def test_finetune_end_to_end_writes_scores_and_conlleval_files(tmp_path):
    # Repeat the 3 training sentences so a batch of 8 fits (sentences differ by guid).
    train_text = (CONLL_DIR / "train.txt").read_text()
    (tmp_path / "train.txt").write_text(train_text * 3)
    checkpoint = write_tf_checkpoint(tmp_path / "tf", pretrained_params(seed=2))
    config = finetune_conll.get_config()
    config.unlock()
    config.update(
        train_file=str(tmp_path / "train.txt"), dev_file=str(CONLL_DIR / "dev.txt"),
        test_file=str(CONLL_DIR / "dev.txt"), init_from=str(checkpoint), do_lower_case=True,
        max_seq_length=16, train_batch_size=8, eval_batch_size=8, num_epochs=2,
        learning_rate=1e-3, log_every=1,
    )  # fmt: skip
    config.train_batch_size = 16  # 9 training sentences: not one batch
    with pytest.raises(ValueError, match="9 training examples < --config.train_batch_size=16"):
        ftt.finetune(config, str(tmp_path / "refused"))
    config.train_batch_size = 8
    results = ftt.finetune(config, str(tmp_path / "run"))
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["num_examples"] == {"train": 9, "dev": 2, "test": 2}
    assert saved["tags"][0] == "O" and "I-LOC" in saved["tags"]
    assert [e["epoch"] for e in saved["epochs"]] == [1, 2]
    assert set(saved["final"]["test"]) >= {"precision", "recall", "f1", "per_type"}
    assert results["final"]["dev"] == saved["final"]["dev"]
    lines = (tmp_path / "run" / "predictions_test.txt").read_text().split("\n")
    words = [line.split(" ") for line in lines[:4]]
    assert [w[:2] for w in words] == [
        ["Tom", "B-PER"],
        ["left", "O"],
        ["Acme", "B-ORG"],
        [".", "O"],
    ]
    assert all(w[2] in saved["tags"] for w in words)


def test_cli_help():
    result = subprocess.run(
        [sys.executable, "-m", "experiments.finetune_tagging", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert "token tagging" in result.stdout and "--workdir" in result.stdout
