"""Every save counts only once it reads back (issue 74): a step that landed unreadable is
named, set aside as `<step>.unreadable`, and the checkpoint before it is kept (never deleted
by `max_to_keep`) and restores; the same for a fine-tuned model's `params/`."""

import os
import pathlib

import numpy as np
import orbax.checkpoint as ocp
import pytest
from test_checkpointing import _corrupt

from bert_jax import checkpointing, convert
from bert_jax.config import BertConfig


def _state(step):
    rng = np.random.default_rng(step)
    return {"step": np.int32(step), "params": {"kernel": rng.normal(size=(64, 64)).astype("f4")}}


def _damage(step_dir, kind: str) -> None:
    """What a save can leave behind that Orbax still lists as a complete step."""
    step_dir = pathlib.Path(os.fspath(step_dir))  # Orbax's is an etils path
    state = step_dir / "state"
    if kind == "missing OCDBT manifest":
        (state / "manifest.ocdbt").unlink()
    elif kind == "truncated _METADATA":
        os.truncate(state / "_METADATA", (state / "_METADATA").stat().st_size // 2)
    elif kind == "truncated OCDBT manifest":
        os.truncate(state / "manifest.ocdbt", (state / "manifest.ocdbt").stat().st_size // 2)
    else:
        _corrupt(step_dir, kind)


def _landing_damaged(monkeypatch, step: int, kind: str) -> None:
    """Orbax's save of `step` lands (is renamed complete, as listed), then is damaged."""
    landed = ocp.CheckpointManager.wait_until_finished

    def wait(self):
        landed(self)
        step_dir = self.directory / str(step)
        if step_dir.exists() and not getattr(self, "damaged", False):
            self.damaged = True
            _damage(step_dir, kind)

    monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", wait)


KINDS = ["missing OCDBT manifest", "truncated _METADATA", "truncated OCDBT manifest"]
KINDS += ["missing data/metadata"]


@pytest.mark.parametrize("kind", KINDS)
def test_an_unreadable_save_is_named_and_the_one_before_kept(tmp_path, monkeypatch, kind):
    directory = tmp_path / "checkpoints"
    manager = checkpointing.make_manager(directory, max_to_keep=1)  # async, as in training
    checkpointing.save(manager, 1, _state(1), [{"step": 1}], {"lr": 0.1})
    checkpointing.finish_saves(manager)
    _landing_damaged(monkeypatch, 2, kind)
    checkpointing.save(manager, 2, _state(2), [{"step": 2}], {"lr": 0.1})
    with pytest.raises(checkpointing.CheckpointError) as error:
        checkpointing.finish_saves(manager)  # where the loop waits for the save in flight
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"checkpoint step 2 in {directory / '2'} is unreadable after its ")
    assert f"set aside as {directory / '2'}.unreadable; step 1 is the last good one" in message
    assert manager.latest_step() == 1
    manager.close()
    # max_to_keep=1 deleted nothing for the unreadable step 2: step 1 stays, and restores.
    assert sorted(os.listdir(directory)) == ["1", "2.unreadable"]
    manager = checkpointing.make_manager(directory, async_save=False)
    state, positions, _ = checkpointing.restore(manager, None, None)
    np.testing.assert_array_equal(state["params"]["kernel"], _state(1)["params"]["kernel"])
    assert positions == [{"step": 1}]
    manager.close()


def test_the_next_save_finds_an_unreadable_one_before_it_starts(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    manager = checkpointing.make_manager(directory, max_to_keep=1)
    checkpointing.save(manager, 1, _state(1), [], {})
    _landing_damaged(monkeypatch, 2, "truncated _METADATA")
    checkpointing.save(manager, 2, _state(2), [], {})
    with pytest.raises(checkpointing.CheckpointError, match="checkpoint step 2 in .* unreadable"):
        checkpointing.save(manager, 3, _state(3), [], {})
    manager.close()
    assert sorted(os.listdir(directory)) == ["1", "2.unreadable"]


@pytest.mark.parametrize("async_save", [True, False])
def test_max_to_keep_deletes_only_after_the_newer_save_reads_back(tmp_path, async_save):
    directory = tmp_path / "checkpoints"
    manager = checkpointing.make_manager(directory, max_to_keep=2, async_save=async_save)
    for step in (1, 2, 3):
        checkpointing.save(manager, step, _state(step), [], {})
    checkpointing.finish_saves(manager)
    manager.close()
    assert sorted(os.listdir(directory)) == ["2", "3"]


def _params(value):
    return {"bert": {"encoder": {"kernel": np.full((4, 4), value, "f4")}}}


def test_a_fine_tuned_models_params_that_do_not_read_back_keep_the_older_export(
    tmp_path, monkeypatch
):
    config = BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=16)  # fmt: skip
    output = tmp_path / "checkpoint"
    convert.save_params(output, config, _params(1))
    landed = ocp.StandardCheckpointer.wait_until_finished

    def wait(self):
        landed(self)
        for written in tmp_path.glob("*/params"):  # the temporary beside `output`
            if written.parent != output:
                (written / "manifest.ocdbt").unlink()

    monkeypatch.setattr(ocp.StandardCheckpointer, "wait_until_finished", wait)
    with pytest.raises(checkpointing.CheckpointError, match=r"params/manifest.ocdbt is missing"):
        convert.save_params(output, config, _params(0), overwrite=True)
    monkeypatch.undo()
    _, params, _ = convert.load_params(output)
    np.testing.assert_array_equal(params["bert"]["encoder"]["kernel"], np.ones((4, 4), "f4"))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"]
