"""Fine-tuning records the pretraining checkpoint step it read (issue 41 item 6).

`init_from` a pretraining workdir reads its newest checkpoint whose params read: where the
newest does not (a crash mid-write, bad storage), an older one. The path alone in the results
then hid which weights were fine-tuned; the step is logged and written beside it.
"""

import json
import logging
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params

from bert_jax import checkpointing, convert
from bert_jax import finetune_common as common
from bert_jax.config import BertConfig
from bert_jax.heads import BertForSequenceClassification
from bert_jax.train_state import TrainState
from data_pipelines import vocab_fingerprint
from experiments import finetune_classification as ftc
from experiments.configs import finetune_glue

GLUE_DIR = Path(__file__).parent / "fixtures" / "tasks" / "glue"
STEPS = (5, 9)  # the workdir's checkpoints; the newest is made unreadable


@pytest.fixture(scope="module")
def params():
    """{step: the params saved at it}: each step's weights differ."""
    return {step: pretrained_params(seed=step) for step in STEPS}


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory, params):
    """{"healthy" / "newest unreadable": a pretraining workdir with a checkpoint per STEPS}."""
    root = tmp_path_factory.mktemp("pretrain")
    experiment = {
        "model": {"preset": "tiny", "hidden_size": 32, "num_hidden_layers": 2,
                  "num_attention_heads": 2, "intermediate_size": 64,
                  "max_position_embeddings": 128, "vocab_size": None},
        "data": {"vocab_file": minilm_vocab()},
        # What a pretraining checkpoint carries: its vocab outside the workdir is used
        # because it is the very vocabulary the model was trained with.
        "vocab_fingerprint": vocab_fingerprint.fingerprint(minilm_vocab()),
    }  # fmt: skip
    made = {}
    for name in ("healthy", "newest unreadable"):
        manager = checkpointing.make_manager(str(root / name / "checkpoints"), async_save=False)
        for step in STEPS:
            state = TrainState(jnp.asarray(step, jnp.int32), params[step], optax.sgd(0.1).init(0))
            checkpointing.save(manager, step, state, [{}], experiment)
        manager.close()
        made[name] = root / name
    # What a crash mid-write or bad storage leaves: a step directory whose state won't read.
    (made["newest unreadable"] / "checkpoints" / str(STEPS[-1]) / "state" / "_METADATA").unlink()
    return made


def _config(init_from, **changes):
    config = finetune_glue.get_config()
    config.init_from = str(init_from)
    config.update(changes)
    return config


def _classifier():
    return BertForSequenceClassification(BertConfig(), 2)


@pytest.mark.parametrize("name, step", [("healthy", 9), ("newest unreadable", 5)])
def test_the_task_model_says_which_checkpoint_step_it_read(workdirs, params, name, step, caplog):
    with caplog.at_level(logging.INFO):
        loaded = common.load_task_model(_config(workdirs[name]), _classifier())
    assert loaded.init_step == step
    table = loaded.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    saved = params[step]["bert"]["embeddings"]["word_embeddings"]["embedding"]
    np.testing.assert_array_equal(table, saved)
    assert f"Encoder from {workdirs[name]} step {step}; head initialised fresh" in caplog.text


def test_formats_without_steps_record_none(tmp_path):
    hf = convert.save_hf(
        tmp_path / "hf", TINY, pretrained_params(seed=1), vocab_file=minilm_vocab()
    )
    assert common.load_task_model(_config(hf), _classifier()).init_step is None


def test_a_fine_tuning_run_writes_the_step_beside_the_path(workdirs, tmp_path):
    init_from = workdirs["newest unreadable"]
    config = finetune_glue.get_config("sst2")
    config.unlock()
    config.update(
        data_dir=str(GLUE_DIR / "SST-2"), init_from=str(init_from), max_seq_length=32,
        train_batch_size=8, eval_batch_size=8, num_epochs=1, learning_rate=1e-3,
    )  # fmt: skip
    results = ftc.finetune(config, str(tmp_path))
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert (saved["init_from"], saved["init_step"]) == (str(init_from), 5)
    assert results["init_step"] == 5
