"""A diverging learning rate (issue 41 item 5): the run stops, or rolls back, at the step whose
param norm jumps by orders of magnitude, not at the first non-finite loss some steps later, so
the last good checkpoint it names resumes at a sane rate.

Real tiny runs (`train_loop.train_and_evaluate` in this process, 8 fake CPU devices, the
synthetic records). At lr 1e3 (warmup 2: step 1's rate is 0, step 2's 500) a tiny BERT's param
norm goes 32 -> 1.1e6 at step 2 with a finite loss, 1.2e9 at step 6; the loss is first NaN
at step 8. Before this check, step 7 was named the last good checkpoint.
"""

import json
import math
import re

import pytest
import synthetic_pretraining as synth

from bert_jax import checkpointing, rollback, train_loop
from bert_jax.train_state import StepHealth, global_norm

# Each run builds its jitted steps anew: the session's compilation cache compiles each
# program once for the module, not once a run.
pytestmark = pytest.mark.usefixtures("compile_cache")

STEPS = 12
DIVERGING_LR = 1e3
SANE_LR = 1e-3
FRESH_NORM = 32  # a fresh tiny BERT's param norm (bert_tiny_cpu.py, the synthetic vocab)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("data")
    synth.write_records(str(directory), "train", 2, 64, seed=0)
    return directory


def _config(data_dir, learning_rate, **changes):
    """bert_tiny_cpu.py on the synthetic records: every step logged and checkpointed."""
    config = synth.tiny_config(str(data_dir))
    config.data.eval_files = ""
    config.num_train_steps = STEPS
    config.log_every = 1
    config.checkpoint_every = 1
    config.keep_checkpoints = STEPS
    config.optimizer.learning_rate = learning_rate
    config.update(changes)
    return config


def _param_norm(workdir, step) -> float:
    manager = checkpointing.make_manager(workdir / "checkpoints", async_save=False)
    try:
        state, _, _ = checkpointing.restore(manager, step, None)
    finally:
        manager.close()
    assert int(state["step"]) == step
    return float(global_norm(state["params"]))


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# Extended tier (CI runs it; ~20-40 s of make test's budget: a run and its resume). make test
# keeps the detection itself: the next test's rollback sees the same norm jump.
@pytest.mark.extended
def test_a_diverging_rate_stops_at_the_norm_jump_and_the_named_checkpoint_resumes(
    tmp_path, data_dir
):
    with pytest.raises(FloatingPointError) as raised:
        train_loop.train_and_evaluate(_config(data_dir, DIVERGING_LR), str(tmp_path))
    message = str(raised.value)
    found = re.fullmatch(
        r"(.*) at step (\d+); the last good checkpoint is step (\d+) in (\S+)", message
    )
    assert found, message
    assert found.group(1).startswith("param_norm "), message  # the loss is still finite
    bad, good = int(found.group(2)), int(found.group(3))
    assert (bad, good) == (2, 1)
    assert found.group(4).rstrip("/") == str(tmp_path / "checkpoints")
    assert checkpointing.make_manager(found.group(4), create=False).all_steps() == [1]
    assert _param_norm(tmp_path, good) < 2 * FRESH_NORM

    # The named checkpoint resumes at a sane rate: three more steps, each finite.
    config = _config(data_dir, SANE_LR, stop_at_step=good + 3)
    train_loop.train_and_evaluate(config, str(tmp_path))
    resumed = [
        r
        for r in _records(tmp_path / "metrics.jsonl")
        if r["split"] == "train" and r["step"] > good
    ]
    assert [r["step"] for r in resumed] == [good + 1, good + 2, good + 3]
    for record in resumed:
        assert all(math.isfinite(record[k]) for k in ("loss", "param_norm", "update_norm"))
        assert record["param_norm"] < 2 * FRESH_NORM, record


def test_rollback_sees_the_norm_jump_while_the_loss_is_finite(tmp_path, data_dir):
    config = _config(data_dir, DIVERGING_LR)
    config.rollback.update(
        enabled=True,
        spike_factor=2.0,
        median_window=4,
        skip_batches=1,
        max_rollbacks=1,
        window_steps=100,
    )
    # Rolled back to step 1, step 2 diverges again on the next batch: one spike too many.
    with pytest.raises(rollback.RollbackError, match=r"^param_norm .* at step 2 after 1 rollb"):
        train_loop.train_and_evaluate(config, str(tmp_path))
    (record,) = _records(tmp_path / "rollbacks.jsonl")
    assert (record["step"], record["restored_step"]) == (2, 1)
    assert record["reason"].startswith("param_norm ") and "above 1000 x" in record["reason"]
    assert math.isfinite(record["loss"])


def test_step_health_judges_each_norm_against_its_running_median():
    health = StepHealth(jump=1e3, window=3)

    def step(param_norm, update_norm, loss=1.0):
        metrics = dict(loss=loss, grad_norm=1.0, param_norm=param_norm, update_norm=update_norm)
        return health.check(metrics)

    assert step(40.0, 0.0) == ""  # nothing to judge against yet; a zero update never joins
    assert step(41.0, 2.0) == ""  # the first update: judged against none
    assert step(42.0, 4.0) == ""  # warmup doubles the rate: far below 1000x
    assert step(44.0, 2000.0) == ""  # 500x the median update norm (2, 4 -> 3)
    assert step(5e4, 6.0) == "param_norm 5e+04 above 1000 x 42, the median of the last 3 steps"
    assert step(45.0, 5e6) == (
        "update_norm 5e+06 above 1000 x 4, the median of the last 3 steps"
    )  # the jumps never joined: the windows are 41, 42, 44 and 2, 4, 2000
    assert step(45.0, 5.0, loss=float("nan")) == "non-finite loss nan"
    assert step(45.0, 5.0) == ""
