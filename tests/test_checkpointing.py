"""Orbax train-state checkpoints: restore onto another mesh or one device, params-only
restore, the config and data-position items, and what counts as a checkpoint directory.
"""

import logging
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import synthetic_pretraining as synth

from bert_jax import checkpointing, optim, sharding, train
from bert_jax.heads import BertForPreTraining
from bert_jax.train_state import sharded_state, state_shardings
from experiments.configs import bert_tiny_cpu

# One layer and a small vocabulary keep the sharded inits cheap; every sharded dimension
# still divides by 8 (heads 8, mlp 256, embed 64, vocab 3008).
MODEL = synth.TINY.replace(num_hidden_layers=1, vocab_size=3008)
STEP = 7
POSITIONS = [{"epoch": 1, "batch_in_epoch": 3, "process_index": 0}]


def _optimizer():
    config = bert_tiny_cpu.get_config().optimizer  # the experiments' BERT AdamW
    config.update(dict(learning_rate=1e-3, warmup_steps=2))
    return optim.make_optimizer(config, 10)


def _inputs():
    return train.init_inputs(train.example_batch(8, synth.SEQ_LEN, synth.PREDICTIONS))


def _abstract(mesh):
    """(abstract state, its shardings on `mesh`)."""
    return state_shardings(BertForPreTraining(MODEL), _optimizer(), mesh, _inputs())


def _distinct(state):
    """Every leaf different from every other (zero moments would compare trivially)."""
    leaves, treedef = jax.tree.flatten(state)
    return treedef.unflatten(
        [
            x + 0.001 * (i + 1) if jnp.issubdtype(x.dtype, jnp.floating) else x + STEP
            for i, x in enumerate(leaves)
        ]
    )


def _experiment_config():
    config = ml_collections.ConfigDict()
    config.seed = 3
    config.mesh_shape = (8, 1, 1)
    config.model = ml_collections.ConfigDict({"preset": "tiny", "vocab_size": None})
    config.optimizer = ml_collections.ConfigDict({"name": "adamw", "learning_rate": 1e-4})
    return config


def _save_state(mesh_shape, directory):
    """Writes a born-sharded state from `mesh_shape`; returns it as numpy arrays."""
    mesh = sharding.create_mesh(mesh_shape)
    model, rng = BertForPreTraining(MODEL), jax.random.key(0)
    state, shardings = sharded_state(model, _optimizer(), mesh, _inputs(), rng=rng)
    state = jax.jit(_distinct, out_shardings=shardings)(state)
    manager = checkpointing.make_manager(directory)  # async, as in training
    config_json = checkpointing.config_to_json(_experiment_config())
    assert checkpointing.save(manager, STEP, state, POSITIONS, config_json)
    manager.wait_until_finished()
    manager.close()
    return jax.tree.map(np.asarray, state)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{source mesh name: (directory, saved numpy state)} for an 8-way data and an 8-way
    fsdp mesh (the latter holds every param split into 8 shards on disk)."""
    out = {}
    for name, shape in {"data8": (8, 1, 1), "fsdp8": (1, 8, 1)}.items():
        directory = str(tmp_path_factory.mktemp(name) / "checkpoints")
        out[name] = (directory, _save_state(shape, directory))
    return out


TARGETS = {
    "data2_tensor4": lambda: sharding.create_mesh((2, 1, 4)),
    "one_device": lambda: sharding.create_mesh((1, 1, 1), jax.devices()[:1]),
}


@pytest.mark.parametrize("source", ["data8", "fsdp8"])
@pytest.mark.parametrize("target", TARGETS)
def test_restores_onto_another_mesh_shape_and_device_count(checkpoints, source, target):
    directory, saved = checkpoints[source]
    mesh = TARGETS[target]()
    abstract, shardings = _abstract(mesh)
    manager = checkpointing.make_manager(directory, async_save=False)
    state, positions, _ = checkpointing.restore(
        manager, None, checkpointing.abstract_like(abstract, shardings)
    )
    manager.close()
    assert positions == POSITIONS
    assert int(state.step) == STEP
    restored = jax.tree_util.tree_leaves_with_path(state)
    assert len(restored) == len(jax.tree.leaves(saved))
    for (path, leaf), want, placement in zip(
        restored, jax.tree.leaves(saved), jax.tree.leaves(shardings), strict=True
    ):
        assert leaf.sharding == placement, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=jax.tree_util.keystr(path))
    kernel = state.params["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]
    if target == "data2_tensor4":  # really split 4 ways now
        assert kernel.sharding.shard_shape(kernel.shape) == (64, 256 // 4)
    else:
        assert kernel.sharding.device_set == {jax.devices()[0]}


@pytest.mark.parametrize("with_shardings", [True, False], ids=["sharded", "plain"])
def test_restore_params_reads_only_the_params(checkpoints, with_shardings):
    directory, saved = checkpoints["fsdp8"]
    mesh = sharding.create_mesh((1, 1, 1), jax.devices()[:1])
    abstract, shardings = _abstract(mesh)
    # train_loop.py passes the plain abstract params (no shardings) for `init_from`.
    target = (
        checkpointing.abstract_like(abstract.params, shardings.params)
        if with_shardings
        else abstract.params
    )
    params, _ = checkpointing.restore_params(directory, target)
    assert jax.tree.structure(params) == jax.tree.structure(saved.params)
    for (path, leaf), want in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(saved.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=jax.tree_util.keystr(path))


def test_restore_params_never_reads_the_optimizer_state(checkpoints, tmp_path):
    _, saved = checkpoints["data8"]
    # A checkpoint whose optimizer state has nothing in common with ours (another optimizer).
    other = {"step": np.int32(3), "params": saved.params, "opt_state": {"trace": [1.0, 2.0]}}
    manager = checkpointing.make_manager(str(tmp_path / "other"), async_save=False)
    checkpointing.save(manager, 3, other, POSITIONS, {})
    manager.close()
    abstract, _ = _abstract(sharding.create_mesh((1, 1, 1), jax.devices()[:1]))
    params, _ = checkpointing.restore_params(str(tmp_path / "other"), abstract.params)
    for (path, leaf), want in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(saved.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=jax.tree_util.keystr(path))


def test_config_and_data_items_round_trip(checkpoints):
    directory, _ = checkpoints["data8"]
    manager = checkpointing.make_manager(directory, async_save=False)
    assert manager.all_steps() == [STEP]
    _, positions, config = checkpointing.restore(manager, None, None)
    manager.close()
    assert positions == POSITIONS
    assert config == checkpointing.config_to_json(_experiment_config())
    assert config["mesh_shape"] == [8, 1, 1]
    assert config["model"] == {"preset": "tiny", "vocab_size": None}
    assert ml_collections.ConfigDict(config).optimizer.learning_rate == 1e-4


def test_is_checkpoint_dir(checkpoints, tmp_path):
    directory, _ = checkpoints["data8"]
    assert checkpointing.is_checkpoint_dir(directory)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not checkpointing.is_checkpoint_dir(str(empty))
    # A Hugging Face directory is not one of ours.
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    assert not checkpointing.is_checkpoint_dir(str(hf))
    # Only a save in progress (Orbax's temporary name): nothing complete to load.
    partial = tmp_path / "partial"
    shutil.copytree(directory, partial)
    os.rename(partial / str(STEP), partial / f"{STEP}.orbax-checkpoint-tmp")
    assert not checkpointing.is_checkpoint_dir(str(partial))
    manager = checkpointing.make_manager(str(partial), async_save=False)
    assert manager.latest_step() is None
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        checkpointing.restore(manager, None, None)
    manager.close()


def test_is_checkpoint_dir_leaves_the_filesystem_alone(tmp_path):
    prefix = tmp_path / "bert_model.ckpt"  # a Google TF checkpoint prefix, not a directory
    (tmp_path / "bert_model.ckpt.index").write_bytes(b"")
    assert not checkpointing.is_checkpoint_dir(str(prefix))
    assert not checkpointing.is_checkpoint_dir(str(tmp_path / "missing"))
    assert sorted(os.listdir(tmp_path)) == ["bert_model.ckpt.index"]


# --- Corrupt checkpoints: named, skipped, set aside ---------------------------------------


def _corrupt(step_dir, kind: str) -> None:
    """The damage a crash, a full disk or bad storage leaves in a complete step directory."""
    if kind == "missing _METADATA":
        (step_dir / "state" / "_METADATA").unlink()
    elif kind == "missing data/metadata":
        (step_dir / "data" / "metadata").unlink()
    else:  # the largest data file: the arrays' raw bytes
        data = max((step_dir / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
        size = data.stat().st_size
        if kind == "truncated data file":
            os.truncate(data, size // 2)
        else:  # flipped bytes, which Orbax reads back without complaint
            with open(data, "r+b") as f:
                f.seek(size // 2)
                flipped = bytes(b ^ 0xFF for b in f.read(64))
                f.seek(size // 2)
                f.write(flipped)


def _three_steps(directory):
    """Steps 1, 2, 3 of a small state whose arrays all differ; returns the states."""
    manager = checkpointing.make_manager(directory, async_save=False)
    states = {}
    for step in (1, 2, 3):
        rng = np.random.default_rng(step)
        states[step] = {
            "step": np.int32(step),
            "params": {"kernel": rng.normal(size=(256, 256)).astype(np.float32)},
        }
        checkpointing.save(manager, step, states[step], [{"step": step}], {"lr": 0.1})
    manager.close()
    return states


CORRUPTIONS = ["missing _METADATA", "missing data/metadata", "truncated data file", "flipped"]


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_a_corrupt_newest_checkpoint_is_named_and_the_one_before_restored(tmp_path, kind, caplog):
    directory = tmp_path / "checkpoints"
    states = _three_steps(directory)
    _corrupt(directory / "3", kind)
    manager = checkpointing.make_manager(directory, async_save=False)
    with pytest.raises(checkpointing.CheckpointError) as error:
        checkpointing.restore(manager, 3, None)  # asked for by step: no fallback
    assert str(error.value).startswith(f"checkpoint step 3 in {directory / '3'} is unreadable: ")
    if kind == "flipped":
        assert "differ from the fingerprint saved with them" in str(error.value)

    with caplog.at_level(logging.WARNING):
        state, positions, config = checkpointing.restore(manager, None, None, set_aside=True)
    manager.close()
    np.testing.assert_array_equal(state["params"]["kernel"], states[2]["params"]["kernel"])
    assert int(state["step"]) == 2 and positions == [{"step": 2}] and config == {"lr": 0.1}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0].startswith(f"checkpoint step 3 in {directory / '3'} is unreadable: ")
    assert (
        f"restored step 2 in {directory}: the newest readable checkpoint (step 3 unreadable)"
        in (warnings)
    )
    # Kept for inspection, out of the way of the run's next save of step 3.
    assert sorted(os.listdir(directory)) == ["1", "2", "3.unreadable"]
    manager = checkpointing.make_manager(directory)
    assert manager.all_steps() == [1, 2]
    checkpointing.save(manager, 3, states[3], [{"step": 3}], {"lr": 0.1})
    manager.wait_until_finished()
    state, _, _ = checkpointing.restore(manager, None, None)
    manager.close()
    np.testing.assert_array_equal(state["params"]["kernel"], states[3]["params"]["kernel"])


def test_no_readable_checkpoint_is_one_line_naming_each(tmp_path):
    directory = tmp_path / "checkpoints"
    _three_steps(directory)
    for step, kind in zip((1, 2, 3), CORRUPTIONS, strict=False):
        _corrupt(directory / str(step), kind)
    manager = checkpointing.make_manager(directory, async_save=False)
    with pytest.raises(checkpointing.CheckpointError) as error:
        checkpointing.restore(manager, None, None, set_aside=True)
    manager.close()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"no readable checkpoint in {directory}: step 3: ")
    assert "; step 2: FileNotFoundError: " in message and "; step 1: FileNotFoundError: " in message
    assert sorted(os.listdir(directory)) == ["1", "2", "3"]  # nothing renamed: nothing restored


def test_restore_params_skips_a_corrupt_newest_checkpoint(tmp_path):
    directory = tmp_path / "checkpoints"
    states = _three_steps(directory)
    _corrupt(directory / "3", "flipped")
    target = {"kernel": jax.ShapeDtypeStruct((256, 256), jnp.float32)}
    params, _ = checkpointing.restore_params(str(directory), target)
    np.testing.assert_array_equal(params["kernel"], states[2]["params"]["kernel"])
    assert sorted(os.listdir(directory)) == ["1", "2", "3"]  # another run's: left as it is


def test_restore_params_without_a_target_reads_numpy_as_saved(tmp_path):
    # What `bert_jax.convert` imports: no model at hand, shapes and dtypes from the checkpoint.
    directory = tmp_path / "checkpoints"
    states = _three_steps(directory)
    _corrupt(directory / "3", "flipped")
    params, config = checkpointing.restore_params(str(directory))
    assert isinstance(params["kernel"], np.ndarray)
    np.testing.assert_array_equal(params["kernel"], states[2]["params"]["kernel"])
    assert config == {"lr": 0.1}
    params, _ = checkpointing.restore_params(str(directory), step=1)
    np.testing.assert_array_equal(params["kernel"], states[1]["params"]["kernel"])


def test_find_checkpoints_takes_a_workdir_a_checkpoint_dir_or_a_step(tmp_path):
    directory = tmp_path / "workdir" / "checkpoints"
    _three_steps(directory)
    newest = (str(directory), None)
    assert checkpointing.find_checkpoints(str(tmp_path / "workdir")) == newest
    assert checkpointing.find_checkpoints(str(directory)) == newest
    assert checkpointing.find_checkpoints(str(directory / "2")) == (str(directory), 2)
    assert checkpointing.find_checkpoints(str(directory / "2") + "/") == (str(directory), 2)
    (directory / "7").mkdir()  # not a step Orbax wrote: named when it is read
    assert checkpointing.find_checkpoints(str(directory / "7")) == (str(directory), 7)
    with pytest.raises(checkpointing.CheckpointError, match=r"step 7 in .* is unreadable"):
        checkpointing.restore_params(str(directory), step=7)
    assert checkpointing.find_checkpoints(str(tmp_path)) is None
    assert checkpointing.find_checkpoints(str(tmp_path / "absent")) is None


def test_the_fingerprint_covers_every_array_and_only_changes_with_the_bits():
    state = {"a": np.arange(6, dtype=np.float32), "b": {"c": np.int32(7)}, "d": np.bool_(True)}
    prints = checkpointing.fingerprint(state)
    assert sorted(prints) == ["a", "b/c", "d"]
    assert prints["a"][0] == "float32" and prints["b/c"] == ["int32", 7]
    assert checkpointing.fingerprint(jax.tree.map(np.copy, state)) == prints
    changed = dict(state, a=state["a"].copy())
    changed["a"][3] = -changed["a"][3]  # one sign bit
    assert checkpointing.fingerprint(changed)["a"] != prints["a"]


def test_on_cpu_a_replicated_array_is_written_whole_without_slicing(tmp_path, caplog):
    """On CPU one replica writes a replicated array (`_one_replica_writes_on_cpu`): Orbax's
    replica-parallel default would compile a slice program per leaf shape. The arrays read
    back equal."""
    mesh = sharding.create_mesh((8, 1, 1))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = {f"w{n}": jnp.arange(8.0 * n).reshape(8, n) for n in (3, 5, 7)}
    state = jax.device_put(state, replicated)
    manager = checkpointing.make_manager(tmp_path / "ckpt", async_save=False)
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        checkpointing.save(manager, 1, state, POSITIONS, {})
        manager.wait_until_finished()
    compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert not [m for m in compiled if "slice" in m], compiled
    restored, _, _ = checkpointing.restore(manager, 1, None)
    manager.close()
    for name, value in state.items():
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(value))
