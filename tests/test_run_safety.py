"""Runs that refuse a changed model and roll back from loss spikes (issue 32).

A changed model: a checkpoint is resumed only into the model it was trained with
(`bert_jax.model_changes`), unless `config.allow_model_change` says to.

Rollback: the train step is wrapped so that chosen calls of it (counted over the run, steps
done again included) report a loss spike or a NaN; everything after the metric, detection,
restore, skipping data and logging, is the real loop on real tiny runs
(`train_loop.train_and_evaluate` in this process, 8 fake CPU devices, the synthetic records).
"""

import json
import logging

import jax.numpy as jnp
import pytest
import synthetic_pretraining as synth

from bert_jax import checkpointing, pretraining_input, rollback, train, train_loop
from bert_jax.model_changes import MISSING, ModelChangeError, model_changes
from experiments.configs import bert_tiny_cpu

# Each run builds its jitted steps anew: the session's compilation cache compiles each
# program once for the module, not once a run.
pytestmark = pytest.mark.usefixtures("compile_cache")

STEPS = 12
CHECKPOINT_EVERY = 4
# A spike is found at the next flush (steps after it run first); the records of the flush
# between the checkpoint and the spike are what a rollback cuts from metrics.jsonl.
LOG_EVERY = 2
SKIP = 3  # batches skipped after a rollback


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("data")
    synth.write_records(str(directory), "train", 2, 64, seed=0)
    return directory


def _config(data_dir, **changes):
    """bert_tiny_cpu.py on the synthetic records: STEPS steps, rollback on, no evaluation."""
    config = synth.tiny_config(str(data_dir))
    # One layer: what is checked (detection, restore, skipped data, the log) does not depend
    # on the depth, and the step compiles faster.
    config.model.num_hidden_layers = 1
    config.data.eval_files = ""
    config.num_train_steps = STEPS
    config.log_every = LOG_EVERY
    config.checkpoint_every = CHECKPOINT_EVERY
    config.keep_checkpoints = STEPS  # all: the tests read the positions of each
    config.rollback.update(
        enabled=True,
        spike_factor=2.0,
        median_window=4,
        skip_batches=SKIP,
        max_rollbacks=2,
        window_steps=100,
    )
    config.update(changes)
    return config


def _positions(workdir, step=None) -> list:
    manager = checkpointing.make_manager(workdir / "checkpoints", async_save=False)
    try:
        state, positions, _ = checkpointing.restore(manager, step, None)
    finally:
        manager.close()
    assert step is None or int(state["step"]) == step
    return positions, int(state["step"])


def _advanced(config, positions, batches: int):
    """Every process's data position `batches` batches after `positions` (through the
    iterator: a position is opaque JSON)."""
    data = pretraining_input.train_input(
        config, pretraining_input.data_position(positions), mask_config=None
    )
    for _ in range(batches):
        next(data)
    return pretraining_input.gather_positions(data.position)


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _inject(monkeypatch, faults: dict[int, str]) -> list[int]:
    """Makes the train step's call number n (1-based, over the whole run, steps done again
    included) report a loss 1000x too high ("spike") or NaN ("nan") for n in `faults`;
    returns the list of steps run, in order."""
    real_setup, calls = train.setup, []

    def setup(config, mesh, vocab_size=None):
        run = real_setup(config, mesh, vocab_size)

        def step(state, batch, rng):
            state, metrics = run.train_step(state, batch, rng)
            calls.append(int(state.step))
            fault = faults.get(len(calls))
            if fault is not None:
                factor = 1e3 if fault == "spike" else jnp.nan
                metrics = dict(metrics, loss=metrics["loss"] * factor)
            return state, metrics

        return run._replace(train_step=step)

    monkeypatch.setattr(train, "setup", setup)
    return calls


# --- rollback ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault, call, restored",
    [
        # Extended tier: make test keeps the nan case (the same restore, skip and cut log) and
        # test_one_spike_too_many_in_the_window_stops_with_the_evidence (a spike found and
        # rolled back by the running-median detector).
        pytest.param("spike", 11, 8, marks=pytest.mark.extended),
        ("nan", 7, 4),
    ],  # found at the flush of step 12 / 8
)
def test_a_spike_rolls_back_once_skips_the_batches_and_finishes(
    fault, call, restored, tmp_path, data_dir, monkeypatch, caplog
):
    config = _config(data_dir)
    calls = _inject(monkeypatch, {call: fault})
    with caplog.at_level(logging.WARNING):
        train_loop.train_and_evaluate(config, str(tmp_path))
    assert f"at step {call}: rolled back to step {restored}, skipped {SKIP} batches" in (
        caplog.text
    )

    flush = -(-call // LOG_EVERY) * LOG_EVERY
    # Steps up to the flush that found it, then from the checkpoint before it to the end.
    assert calls == list(range(1, flush + 1)) + list(range(restored + 1, STEPS + 1))
    (record,) = _records(tmp_path / "rollbacks.jsonl")
    assert record["step"] == call and record["restored_step"] == restored
    assert record["skipped_batches"] == SKIP
    assert ("non-finite loss nan" if fault == "nan" else "above 2 x") in record["reason"]
    # Skipped from the restored checkpoint's data position, SKIP batches on.
    restored_positions, _ = _positions(tmp_path, restored)
    assert record["skipped_from"] == restored_positions
    assert record["resumed_at"] == _advanced(config, restored_positions, SKIP)
    # The run ends at num_train_steps, SKIP batches further on in the data than the
    # uninterrupted run (which reads a batch a step from the same position), and logs each
    # step once (what the first pass logged after the restored step is cut).
    positions, step = _positions(tmp_path)
    assert step == STEPS
    assert positions == _advanced(config, restored_positions, STEPS - restored + SKIP)
    assert positions != _advanced(config, restored_positions, STEPS - restored)
    logged = [r["step"] for r in _records(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert logged == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))


def test_one_spike_too_many_in_the_window_stops_with_the_evidence(tmp_path, data_dir, monkeypatch):
    config = _config(data_dir)
    config.rollback.max_rollbacks = 1
    # Call 11 is step 11 (found at 12, back to 8); call 14 is step 10, run on other data
    # than the first time: its NaN, found at once, is the second spike within 100 steps.
    calls = _inject(monkeypatch, {11: "spike", 14: "nan"})
    with pytest.raises(rollback.RollbackError) as raised:
        train_loop.train_and_evaluate(config, str(tmp_path))
    message = str(raised.value)
    assert message.startswith("non-finite loss nan")
    assert "at step 10 after 1 rollback(s) within 100 steps" in message
    assert "config.rollback.max_rollbacks=1" in message
    (record,) = _records(tmp_path / "rollbacks.jsonl")
    first = f"{record['reason']} at step 11: rolled back to step 8, skipped {SKIP} batches"
    assert first in message and str(record["skipped_from"]) in message
    assert "above 2 x" in record["reason"] and calls[-1] == 10
    assert _positions(tmp_path)[1] == 8  # nothing saved after the last good checkpoint


def test_a_spike_before_the_first_checkpoint_stops_the_run(tmp_path, data_dir, monkeypatch):
    _inject(monkeypatch, {3: "nan"})
    with pytest.raises(rollback.RollbackError, match=r"^non-finite loss nan.* at step 3; no "):
        train_loop.train_and_evaluate(_config(data_dir), str(tmp_path))


def test_the_spike_detector_judges_against_the_running_median():
    detector = rollback.SpikeDetector(factor=2.0, window=3)
    assert [detector.check(x) for x in (10.0, 100.0, 9.0)] == ["", "", ""]  # filling
    assert detector.check(8.0) == ""  # the window: 100, 9, 8 (median 9)
    assert detector.check(18.5) == "loss 18.5 above 2 x 9, the median of the last 3 steps"
    assert detector.check(17.9) == ""  # a spike never joins the window: still 9 x 2


def test_the_rollback_limit_counts_within_the_window():
    limit = rollback.Rollbacks(max_rollbacks=2, window_steps=10)
    for step in (5, 12):
        limit.check(rollback.LossSpike(step, 9.0, "x"), 0, "ckpt")
        limit.record(rollback.LossSpike(step, 9.0, "x"), 0, 1, [{"p": 0}], [{"p": 1}])
    limit.check(rollback.LossSpike(30, 9.0, "x"), 20, "ckpt")  # 5 and 12 are too far back
    with pytest.raises(rollback.RollbackError, match="at step 14 after 2 rollback"):
        limit.check(rollback.LossSpike(14, 9.0, "x"), 10, "ckpt")
    with pytest.raises(rollback.RollbackError, match="no checkpoint was saved yet in ckpt"):
        rollback.Rollbacks(1, 10).check(rollback.LossSpike(3, float("nan"), "x"), None, "ckpt")


# --- a changed model -----------------------------------------------------------------------


def test_model_changes_name_each_computing_key_with_both_values():
    saved = checkpointing.config_to_json(bert_tiny_cpu.get_config())
    now = bert_tiny_cpu.get_config()
    assert model_changes(saved, now, 8000) == []
    # How the same function is computed is no change.
    now.model.update(scan_layers=True, remat_policy="full", attention_implementation="xla")
    assert model_changes(saved, now, 8000) == []
    now.model.update(
        hidden_size=256, dtype="bfloat16", hidden_act="gelu_tanh", hidden_dropout_prob=0.0
    )
    now.objective = "mlm"
    assert model_changes(saved, now, 8000) == [
        ("objective", "mlm_nsp", "mlm"),
        ("model.hidden_size", 128, 256),  # the saved size is its preset's
        ("model.hidden_act", "gelu", "gelu_tanh"),
        ("model.hidden_dropout_prob", None, 0.0),  # left to the default of its day
        ("model.dtype", "float32", "bfloat16"),
    ]
    # A vocab size left to the vocab file is that file's; another preset changes every size.
    now = bert_tiny_cpu.get_config()
    now.model.update(preset="mini", vocab_size=9000)
    assert model_changes(saved, now, 8000) == [
        ("model.vocab_size", 8000, 9000),
        ("model.hidden_size", 128, 256),
        ("model.num_hidden_layers", 2, 4),
        ("model.num_attention_heads", 2, 4),
        ("model.intermediate_size", 512, 1024),
    ]


def test_a_key_the_saved_config_lacks_is_a_change_only_where_the_run_states_it():
    # A config from before hidden_act and param_dtype were keys, and before the objective.
    saved = checkpointing.config_to_json(bert_tiny_cpu.get_config())
    del saved["model"]["hidden_act"], saved["objective"]
    now = bert_tiny_cpu.get_config()
    # hidden_act is stated now: whatever default the old run had is unknown. param_dtype
    # and layer_norm_eps are left to the default on both sides: nothing to compare.
    assert model_changes(saved, now, 8000) == [("model.hidden_act", MISSING, "gelu")]
    now.model.layer_norm_eps = 1e-6
    assert model_changes(saved, now, 8000)[-1] == ("model.layer_norm_eps", MISSING, 1e-6)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A 2-step run's workdir (checkpoint at step 2), with exact GELU."""
    workdir = tmp_path_factory.mktemp("gelu")
    train_loop.train_and_evaluate(
        _config(data_dir, stop_at_step=2, checkpoint_every=2), str(workdir)
    )
    return workdir


def test_a_changed_model_refuses_to_resume_then_resumes_when_allowed(
    tmp_path, data_dir, trained, caplog
):
    changed = _config(data_dir, stop_at_step=4, checkpoint_every=2)
    changed.model.hidden_act = "gelu_tanh"
    expected = (
        r"were trained with another model: model.hidden_act: saved 'gelu', now 'gelu_tanh'\. "
        r"Set config.allow_model_change=True"
    )
    # Its own checkpoints, then another run's through resume_from.
    with pytest.raises(ModelChangeError, match=expected):
        train_loop.train_and_evaluate(changed, str(trained))
    changed.resume_from = str(trained / "checkpoints")
    with pytest.raises(ModelChangeError, match=expected):
        train_loop.train_and_evaluate(changed, str(tmp_path / "phase2"))

    changed.allow_model_change = True
    with caplog.at_level(logging.WARNING):
        train_loop.train_and_evaluate(changed, str(tmp_path / "phase2"))
    assert "with another model (allow_model_change): model.hidden_act: saved 'gelu'" in (
        caplog.text
    )
    assert _positions(tmp_path / "phase2")[1] == 4  # steps 3-4 ran on the resumed state
