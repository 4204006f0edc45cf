"""A newcomer's own run (issue 75): the held-out set is evaluated after the last step
whatever eval_every says, and said so at the start; the progress bar counts steps whose
results are on the host, not steps dispatched."""

from __future__ import annotations

import logging
import types

import numpy as np
import pytest
import synthetic_pretraining as synth

from bert_jax import telemetry, train_loop


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("data")
    synth.write_records(str(directory), "train", 2, 64, seed=0)
    synth.write_records(str(directory), "eval", 1, 32, seed=1)
    return directory


def test_a_run_shorter_than_eval_every_is_evaluated_after_its_last_step(
    tmp_path, data_dir, caplog
):
    config = synth.tiny_config(str(data_dir))
    config.model.num_hidden_layers = 1  # what is checked does not depend on the depth
    config.data.eval_files = str(data_dir / "eval-*")
    config.num_train_steps = 3
    config.eval_every = 500
    config.eval_steps = 1
    config.log_every = 1
    with caplog.at_level(logging.WARNING):
        train_loop.train_and_evaluate(config, str(tmp_path / "run"))
    records = telemetry.read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
    assert [r["step"] for r in records if r["split"] == "eval"] == [0, 3]
    assert "eval_every=500 > the run's 3 steps" in caplog.text


def test_the_bar_shows_a_step_once_its_results_are_on_the_host():
    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    waited = []
    loop = types.SimpleNamespace(progress=Bar(), pending=[])
    real = train_loop.jax.block_until_ready
    train_loop.jax.block_until_ready = lambda x: waited.append(x) or x
    try:
        for step in (1, 2, 3):
            loop.pending.append((step, {"loss": np.float32(step)}))
            train_loop._Pretraining._show_finished_steps(loop)
    finally:
        train_loop.jax.block_until_ready = real
    assert loop.progress.n == 2  # step 3 still in flight: not counted
    assert [w["loss"] for w in waited] == [1, 2]  # each shown step was waited for
