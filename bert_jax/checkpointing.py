"""Orbax checkpoints of the full train state, the data position and the config.

A checkpoint step directory holds three items:
- `state`: the `TrainState` (params, optimizer state, step), sharded as in training;
- `data`: the input pipeline position of every process (JSON);
- `config`: the experiment config that produced it (JSON).

Orbax writes each step to a temporary directory and renames it when complete, so a
checkpoint interrupted mid-write is never listed, never loaded. Restoring takes abstract
arrays carrying the *current* shardings, so a checkpoint written on one mesh restores
onto another mesh shape or device count.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

_ITEMS = ("state", "data", "config")


def make_manager(
    directory: str, *, max_to_keep: int = 3, async_save: bool = True, create: bool = True
):
    """A `CheckpointManager` for `directory` (local or `gs://`); `create=False` to only read."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        enable_async_checkpointing=async_save,
        create=create,
    )
    directory = os.fspath(directory)
    if "://" not in directory:  # Orbax refuses relative local paths
        directory = os.path.abspath(directory)
    return ocp.CheckpointManager(directory, options=options, item_names=_ITEMS)


def save(manager, step: int, state, data_positions: list[dict], config_json: dict) -> bool:
    """Starts an (async) save of `state` with the data positions and the config."""
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave({"positions": data_positions}),
        config=ocp.args.JsonSave(config_json),
    )
    return manager.save(step, args=args, force=True)


def abstract_like(state, shardings):
    """`ShapeDtypeStruct`s of `state` carrying `shardings`: the restore target."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
    )


def restore(manager, step: int | None, abstract_state) -> tuple[Any, list[dict], dict]:
    """Restores (state, data positions, config) of `step` (default: the latest)."""
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no complete checkpoint in {manager.directory}")
    args = ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=ocp.args.JsonRestore(),
        config=ocp.args.JsonRestore(),
    )
    restored = manager.restore(step, args=args)
    return restored.state, restored.data["positions"], restored.config


def restore_params(directory: str, abstract_params, step: int | None = None):
    """Only the params of a train-state checkpoint in `directory` (for `init_from`).

    A partial restore: the optimizer state on disk is never read, so a checkpoint made
    with another optimizer (or none) initialises a new run.
    """
    if not tf_io_isdir(directory):
        raise FileNotFoundError(f"{directory} is not a checkpoint directory")
    manager = make_manager(directory, async_save=False, create=False)
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no complete checkpoint in {directory}")
    target = {"params": abstract_params}
    restored = ocp.PyTreeCheckpointer().restore(
        os.path.join(os.fspath(manager.directory), str(step), "state"),
        args=ocp.args.PyTreeRestore(
            item=target,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True,
        ),
    )
    return restored["params"]


def is_checkpoint_dir(path: str) -> bool:
    """True when `path` holds this project's train-state checkpoints."""
    if not tf_io_isdir(path):
        return False
    try:
        return make_manager(path, async_save=False, create=False).latest_step() is not None
    except (OSError, ValueError):
        return False


class PreemptionWatcher:
    """Notices SIGTERM (what a TPU VM gets before maintenance or preemption).

    Single process: a Python signal handler sets a flag. Multi-process: JAX's preemption
    sync service (started by `jax.distributed.initialize`) agrees on one step for all
    processes; Orbax's `reached_preemption` asks it.
    """

    def __init__(self, manager):
        self._manager = manager
        self._event = threading.Event()
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        else:
            self._previous = None

    def _on_sigterm(self, signum, frame):
        del signum, frame
        logging.warning("SIGTERM received: saving a checkpoint and stopping")
        self._event.set()

    def should_stop(self, step: int) -> bool:
        if jax.process_count() > 1:
            return self._manager.reached_preemption(step)
        return self._event.is_set()

    def close(self):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def tf_io_isdir(path: str) -> bool:
    """`os.path.isdir` that also understands `gs://` (through TensorFlow's file system)."""
    path = os.fspath(path)
    if "://" not in path:
        return os.path.isdir(path)
    import tensorflow as tf

    return tf.io.gfile.isdir(path)


def config_to_json(config) -> dict:
    """A JSON-safe copy of an ml_collections config (for the checkpoint's `config` item)."""
    return json.loads(config.to_json_best_effort())
