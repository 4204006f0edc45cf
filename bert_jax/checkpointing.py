"""Orbax checkpoints of the full train state, the data position and the config.

A checkpoint step directory holds three items:
- `state`: the `TrainState` (params, optimizer state, step), sharded as in training;
- `data`: the input pipeline position of every process, and a fingerprint of each
  array of `state` that restores check (JSON);
- `config`: the experiment config that produced it (JSON).

Orbax writes each step to a temporary directory and renames it when complete, so a
checkpoint interrupted mid-write is never listed, never loaded. Restoring takes abstract
arrays carrying the *current* shardings, so a checkpoint written on one mesh restores
onto another mesh shape or device count.

A save that fails raises `CheckpointError` naming the directory: at once when the step
directory cannot be made, else when the background write is found to have failed
(`finish_saves`, which the train loop polls every step), never only at exit.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging as logging_lib
import os
import re
import signal
import sys
import tempfile
import threading
import warnings
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

_ITEMS = ("state", "data", "config")
# Orbax writes step N into "N.orbax-checkpoint-tmp..." and renames it when complete.
_TMP_SUFFIX = ".orbax-checkpoint-tmp"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names the directory."""


def make_manager(
    directory: str, *, max_to_keep: int = 3, async_save: bool = True, create: bool = True
):
    """A `CheckpointManager` for `directory` (local or `gs://`); `create=False` to only read.

    `create=True` also checks that a local `directory` can be written, so a run that could
    never save stops before its first step.
    """
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        enable_async_checkpointing=async_save,
        create=create,
        # The step directory is made on the calling thread, so a directory that cannot be
        # written fails `save` at once. Made in the background, its failure left Orbax's
        # writer threads waiting for it until their 5-minute timeout, at exit.
        async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
    )
    directory = os.fspath(directory)
    if create:  # Orbax globs its own files: under a pattern it finds none, and no index
        from data_pipelines import paths

        try:
            paths.check_no_glob(directory, "checkpoint directory")
        except paths.GlobCharactersError as error:
            raise CheckpointError(str(error)) from None
    if "://" not in directory:  # Orbax refuses relative local paths
        directory = os.path.abspath(directory)
        if create:
            _check_writable(directory)
    _one_replica_writes_on_cpu()
    return ocp.CheckpointManager(directory, options=options, item_names=_ITEMS)


def _one_replica_writes_on_cpu() -> None:
    """On CPU, a replicated array is written by its first replica alone.

    Orbax's default splits the writing of a replicated array between its replicas, each
    slicing its part on device: on TPU, many hosts' bandwidth for one array. CPU devices
    share one host's memory and disk, so the split buys nothing there, and each leaf shape's
    slice is a program of its own to compile (~50 ms each on a CPU: 96 of them, ~5 s, at a
    tiny BERT's first save on 8 devices). The files are the same either way.
    """
    global _CPU_HANDLER_SET
    if _CPU_HANDLER_SET or jax.default_backend() != "cpu":
        return
    from orbax.checkpoint._src.metadata import array_metadata_store  # Orbax's default's

    handler = ocp.type_handlers.ArrayHandler(
        use_replica_parallel=False, array_metadata_store=array_metadata_store.Store()
    )
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    _CPU_HANDLER_SET = True


_CPU_HANDLER_SET = False


def _check_writable(directory: str) -> None:
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CheckpointError(f"cannot write checkpoints to {directory}: it is not a directory")
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise CheckpointError(f"cannot write checkpoints to {directory}: {error}") from None


def save(manager, step: int, state, data_positions: list[dict], config_json: dict) -> bool:
    """Starts an (async) save of `state` with the data positions and the config.

    Raises `CheckpointError` if the previous save failed or this one cannot start.
    """
    finish_saves(manager)  # what manager.save would wait for first, with our error
    _quiet_abandoned_writes()
    data = {"positions": data_positions, "fingerprint": fingerprint(state)}
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data),
        config=ocp.args.JsonSave(config_json),
    )
    try:
        return manager.save(step, args=args, force=True)
    except Exception as error:
        raise CheckpointError(
            f"cannot save checkpoint step {step} in {manager.directory}: {_reason_line(error)}"
        ) from None


def finish_saves(manager) -> None:
    """Waits for the background save, if any; raises `CheckpointError` if it failed."""
    try:
        manager.wait_until_finished()
    except Exception as error:
        message = f"saving a checkpoint in {manager.directory} failed: {_reason_line(error)}"
        _drop_abandoned_writes(error)
        raise CheckpointError(message) from None


def _drop_abandoned_writes(error: BaseException) -> None:
    """Collects the writes a failed Orbax save left behind, now.

    Orbax stops at the first failed write and closes its event loop with the others still
    pending; the loop stays alive through the frames of the error it keeps. Left to
    interpreter exit, each pending write printed "sys.meta_path is None" after our own error.
    """
    seen = set()
    while error is not None and id(error) not in seen:  # its frames hold the loop
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__
    gc.collect()


def _quiet_abandoned_writes() -> None:
    """Keeps the writes of a failed Orbax save from printing a traceback each.

    Orbax closes its event loop at the first failed write. The writes still in flight then
    end one by one, in Orbax's and tensorstore's threads, some before `finish_saves` can
    know of the failure: asyncio logs "(Task|Future|_GatheringFuture) exception was never
    retrieved" for each failed one, Python warns of the coroutines never awaited, and each
    call back into the closed loop reports "Event loop is closed" through
    `sys.unraisablehook` (140 tracebacks for BERT-tiny). All of them are the one failure
    that `finish_saves` raises, so they are dropped; nothing else is.
    """
    previous = sys.unraisablehook
    if getattr(previous, "quiet_abandoned_writes", False):
        return

    def hook(unraisable):
        value = unraisable.exc_value
        if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
            previous(unraisable)

    hook.quiet_abandoned_writes = True
    sys.unraisablehook = hook

    def not_an_abandoned_write(record: logging_lib.LogRecord) -> bool:
        message = record.getMessage()  # names the exception, and so the unfinished checkpoint
        return not ("exception was never retrieved" in message and _TMP_SUFFIX in message)

    logging_lib.getLogger("asyncio").addFilter(not_an_abandoned_write)
    warnings.filterwarnings(
        "ignore", "coroutine 'async_serialize_from_host.*never awaited", RuntimeWarning
    )


def abstract_like(state, shardings):
    """`ShapeDtypeStruct`s of `state` carrying `shardings`: the restore target."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
    )


def restore(
    manager, step: int | None, abstract_state, *, set_aside: bool = False
) -> tuple[Any, list[dict], dict]:
    """Restores (state, data positions, config) of `step`, by default of the newest readable.

    A checkpoint that cannot be read, or whose arrays do not match the fingerprint saved
    with them, raises `CheckpointError` naming its step and path; with `step=None` it is
    named in a warning and the one before it is tried. `set_aside=True` renames each such
    checkpoint to `<step>.unreadable`, kept for inspection, so the run can save that step
    again (process 0 renames; a training run passes it).
    """

    def read(step):
        _require_state_metadata(manager, step)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
            config=ocp.args.JsonRestore(),
        )
        state_dir = os.path.join(os.fspath(manager.directory), str(step), "state")
        with _naming_shape_mismatches(state_dir, abstract_state):
            restored = manager.restore(step, args=args)
        _verify(restored.state, restored.data.get("fingerprint"))
        return restored.state, restored.data["positions"], restored.config

    return _newest_readable(manager, step, read, set_aside)


def saved_config(manager, step: int | None = None) -> dict:
    """The experiment config saved with checkpoint `step`, by default with the newest one
    whose config reads, without reading the state (what a run checks before restoring it)."""

    def read(step):
        return manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config

    return _newest_readable(manager, step, read, set_aside=False)


def restore_params(directory: str, abstract_params=None, step: int | None = None):
    """Only the params of a train-state checkpoint, and the experiment config saved with them
    (`restore_params_and_step` without the step)."""
    params, config, _ = restore_params_and_step(directory, abstract_params, step)
    return params, config


def restore_params_and_step(directory: str, abstract_params=None, step: int | None = None):
    """Only the params of a train-state checkpoint, the experiment config saved with them and
    the step they are of.

    A partial restore: the optimizer state on disk is never read, so a checkpoint made
    with another optimizer (or none) initialises a new run (`init_from`) or is imported
    (`bert_jax.convert`). `abstract_params` gives the target shapes, dtypes and shardings;
    None restores numpy arrays as saved (flax's partitioning boxes removed). Unreadable
    checkpoints are skipped as in `restore`.

    Returns:
        (params, experiment config as saved: a JSON dict, step): with `step=None`, of the
        newest checkpoint that reads.
    """
    if not tf_io_isdir(directory):
        raise FileNotFoundError(f"{directory} is not a checkpoint directory")
    manager = make_manager(directory, async_save=False, create=False)

    def read(step):
        _require_state_metadata(manager, step)
        state_dir = os.path.join(os.fspath(manager.directory), str(step), "state")
        checkpointer = ocp.PyTreeCheckpointer()
        if abstract_params is None:
            saved = checkpointer.metadata(state_dir).item_metadata.tree
            if "params" not in saved:
                raise CheckpointError(f"{state_dir}: the train state has no 'params'")
            target = {
                "params": jax.tree.map(
                    lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved["params"]
                )
            }
            restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
        else:
            target = {"params": abstract_params}
            restore_args = ocp.checkpoint_utils.construct_restore_args(target)
        with _naming_shape_mismatches(state_dir, target):
            restored = checkpointer.restore(
                state_dir,
                args=ocp.args.PyTreeRestore(
                    item=target, restore_args=restore_args, partial_restore=True
                ),
            )
        items = ocp.args.Composite(data=ocp.args.JsonRestore(), config=ocp.args.JsonRestore())
        saved_items = manager.restore(step, args=items)
        _verify(restored, saved_items.data.get("fingerprint"))
        params = restored["params"]
        params = params if abstract_params is not None else _unbox(params)
        return params, saved_items.config, step

    return _newest_readable(manager, step, read, set_aside=False)


def find_checkpoints(path: str) -> tuple[str, int | None] | None:
    """(checkpoint directory, step) of the train-state checkpoints `path` names, or None.

    `path` may be a step directory (that step), a checkpoint directory or a workdir with
    `checkpoints/` in it (step None: the newest readable).
    """
    path = os.fspath(path)
    parent, name = os.path.split(path.rstrip("/"))
    if name.isdigit() and int(name) in _complete_steps(parent):
        return parent, int(name)
    for directory in (path, os.path.join(path, "checkpoints")):
        if _complete_steps(directory):
            return directory, None
    return None


def missing_params(path: str, abstract_params) -> list[str]:
    """The params of `abstract_params` that the newest complete checkpoint `path` names does
    not hold ('bert/pooler/dense/kernel', ...): another objective's heads, e.g. a "mlm"
    run's checkpoint read into a model with NSP. Empty when it holds them all, or when its
    metadata cannot be read (a restore then says why)."""
    found = find_checkpoints(path)
    if found is None:
        return []
    directory, step = found
    step = step if step is not None else _complete_steps(directory)[-1]
    try:
        state_dir = os.path.join(directory, str(step), "state")
        saved = ocp.PyTreeCheckpointer().metadata(state_dir).item_metadata.tree["params"]
    except Exception:  # noqa: BLE001 - unreadable metadata: restore_params reports it
        return []

    def names(tree) -> set[str]:
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {_leaf_name(p).removesuffix("/value") for p, _ in leaves}

    return sorted(names(abstract_params) - names(saved))


def _unbox(tree):
    """Drops the `{"value": array}` wrappers that flax's partitioning boxes leave on disk."""
    if isinstance(tree, dict):
        if set(tree) == {"value"} and not isinstance(tree["value"], dict):
            return tree["value"]
        return {k: _unbox(v) for k, v in tree.items()}
    return tree


@contextlib.contextmanager
def _naming_shape_mismatches(state_dir: str, target):
    """Re-raises Orbax's "Requested shape ... is not compatible with the stored shape" (which
    names neither the array nor the checkpoint, and suggests `strict=False`) naming the arrays
    whose saved shape differs from `target`'s, as `CheckpointError`."""
    try:
        yield
    except ValueError as error:
        found = re.search(r"Requested shape: (\(.*?\)) is not compatible with the stored "
                          r"shape: (\(.*?\))", str(error))  # fmt: skip
        if not found:
            raise
        wanted, stored = found.groups()
        try:
            saved = ocp.PyTreeCheckpointer().metadata(state_dir).item_metadata.tree
            saved_shapes = {
                _leaf_name(p): tuple(m.shape)
                for p, m in jax.tree_util.tree_leaves_with_path(saved)
                if hasattr(m, "shape")
            }
        except Exception:  # noqa: BLE001 - unreadable metadata: name what the error says
            saved_shapes = {}
        leaves = jax.tree_util.tree_leaves_with_path(target)
        model = {_leaf_name(p): tuple(x.shape) for p, x in leaves}
        differ = [
            f"{name} saved {saved_shapes[name]}, model {shape}"
            for name, shape in model.items()
            if name in saved_shapes and saved_shapes[name] != shape
        ]
        if not differ:  # the metadata agrees with the model: the stored array does not
            named = [name for name, shape in model.items() if str(shape) == wanted]
            differ = [f"{' or '.join(named[:3]) or 'an array'} stored {stored}, model {wanted}"]
        raise CheckpointError(
            f"{state_dir}: arrays of another shape than the model's ({'; '.join(differ[:3])}"
            f"{'; ...' if len(differ) > 3 else ''}): a checkpoint of another model, or damaged"
        ) from None


def _require_state_metadata(manager, step: int) -> None:
    # Without it, a restore onto a TrainState fails as an Orbax "pytree structure error".
    metadata = manager.directory / str(step) / "state" / "_METADATA"  # an etils epath
    if not metadata.exists():
        raise FileNotFoundError(f"{metadata} is missing")


def _newest_readable(manager, step: int | None, read, set_aside: bool):
    """`read(step)`, or with `step=None` `read` of the newest step that reads."""
    directory = os.fspath(manager.directory)
    steps = [step] if step is not None else sorted(manager.all_steps(), reverse=True)
    if not steps:
        raise FileNotFoundError(f"no complete checkpoint in {directory}")
    unreadable = []
    for candidate in steps:
        path = manager.directory / str(candidate)
        try:
            result = read(candidate)
        except Exception as error:  # noqa: BLE001 - any failure to read: corrupt or partial
            reason = _reason_line(error)
            if step is not None:
                message = f"checkpoint step {step} in {path} is unreadable: {reason}"
                raise CheckpointError(message) from error
            logging.warning("checkpoint step %d in %s is unreadable: %s", candidate, path, reason)
            unreadable.append((candidate, path, reason))
            continue
        if unreadable:
            logging.warning(
                "restored step %d in %s: the newest readable checkpoint (%s unreadable)",
                candidate,
                directory,
                ", ".join(f"step {s}" for s, _, _ in unreadable),
            )
            if set_aside:
                _set_aside([p for _, p, _ in unreadable])
        return result
    raise CheckpointError(
        f"no readable checkpoint in {directory}: "
        + "; ".join(f"step {s}: {reason}" for s, _, reason in unreadable)
    )


def _set_aside(paths: list) -> None:
    if jax.process_index() == 0:
        for path in paths:
            path.rename(path.parent / f"{path.name}.unreadable")
            logging.warning("renamed %s to %s.unreadable", path, path)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("checkpointing._set_aside")


def _reason_line(error: BaseException) -> str:
    """The root cause in one line (Orbax wraps tensorstore's errors in a many-line spec)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {error}".splitlines()[0].strip()


# --- fingerprints ----------------------------------------------------------------------------


def fingerprint(state) -> dict[str, list]:
    """{leaf path: [dtype, sum of its bits mod 2**32]}, saved with each checkpoint.

    Orbax reads flipped or overwritten bytes back without complaint; a restore compares
    the arrays with this, so corrupt data is found instead of trained on.
    """
    leaves = [
        (path, x)
        for path, x in jax.tree_util.tree_leaves_with_path(state)
        if not jax.dtypes.issubdtype(jax.numpy.asarray(x).dtype, jax.dtypes.extended)
    ]
    sums = jax.device_get(_bit_sums([x for _, x in leaves]))
    return {
        _leaf_name(path): [str(jax.numpy.asarray(x).dtype), int(total)]
        for (path, x), total in zip(leaves, sums, strict=True)
    }


@jax.jit
def _bit_sums(leaves):
    def bits(x):
        if x.dtype == jax.numpy.bool_:
            x = x.astype(jax.numpy.uint8)
        size = min(x.dtype.itemsize, 4)  # an 8-byte value becomes two uint32
        unsigned = jax.lax.bitcast_convert_type(x, jax.numpy.dtype(f"uint{8 * size}"))
        return jax.numpy.sum(unsigned.astype(jax.numpy.uint32), dtype=jax.numpy.uint32)

    return [bits(x) for x in leaves]


def _leaf_name(path) -> str:
    """'params/bert/encoder/...' for a TrainState attribute path or a restored dict's."""
    names = []
    for key in path:
        for attr in ("name", "key", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
        else:
            names.append(str(key))
    return "/".join(names)


def _verify(state, saved: dict | None) -> None:
    """Raises if an array of `state` differs from its saved fingerprint (None: not saved)."""
    if not saved:
        return
    now = fingerprint(state)
    # A leaf restored into another dtype (a changed param_dtype) has other bits: not checked.
    bad = [
        name
        for name, (dtype, total) in now.items()
        if name in saved and saved[name][0] == dtype and saved[name][1] != total
    ]
    if bad:
        raise CheckpointError(
            f"{len(bad)} array(s) differ from the fingerprint saved with them "
            f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): corrupt data"
        )


def is_checkpoint_dir(path: str) -> bool:
    """True when `path` holds this project's train-state checkpoints."""
    return bool(_complete_steps(path))


def _complete_steps(path: str) -> list[int]:
    """The steps completely written in the checkpoint directory `path` (none if it is not one)."""
    if not tf_io_isdir(path):
        return []
    try:
        return list(make_manager(path, async_save=False, create=False).all_steps())
    except (OSError, ValueError):
        return []


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run after the checkpoint of the step it was on landed; the message
    names the step and the directory (a `KeyboardInterrupt`, so nothing catches it as an
    error on its way out)."""


class PreemptionWatcher:
    """Notices SIGTERM (what a TPU VM gets before maintenance or preemption) and the first
    Ctrl-C (SIGINT): the run saves at the step boundary and stops.

    Single process: a Python signal handler sets a flag; the first SIGINT also puts Python's
    own handler back, so a second Ctrl-C raises KeyboardInterrupt at once (the save in
    flight, if any, still lands). Multi-process: JAX's preemption sync service (started by
    `jax.distributed.initialize`) agrees on one step for all processes; Orbax's
    `reached_preemption` asks it (SIGINT keeps its default there).
    """

    def __init__(self, manager):
        self._manager = manager
        self._event = threading.Event()
        self.signal_name: str | None = None  # "SIGTERM" or "SIGINT" once one arrived
        self._previous = {}
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame):
        del frame
        name = signal.Signals(signum).name
        if signum == signal.SIGINT:
            # A second Ctrl-C is Python's: KeyboardInterrupt wherever the run is.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            logging.warning(
                "Ctrl-C (SIGINT) received: saving a checkpoint after the current step, then "
                "stopping; Ctrl-C again to stop at once without it"
            )
        else:
            # No word of a checkpoint yet: the loop says so once the save has landed.
            logging.warning("SIGTERM received: stopping after the current step")
        self.signal_name = self.signal_name or name
        self._event.set()

    def should_stop(self, step: int) -> bool:
        if jax.process_count() > 1:
            return self._manager.reached_preemption(step)
        return self._event.is_set()

    def close(self):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


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


def check_steps_left(step: int, config, source: str) -> None:
    """Says what a run that restored `step` from `source` has left to do: a warning when it
    is at the stop step already (a finished workdir rerun), an error when it is past it (a
    finished workdir rerun with fewer steps: nothing would train, and nothing would say so).

    Raises:
        ConfigError: naming the flag, the step and by how much it is past it.
    """
    from bert_jax.config import ConfigError

    flag = "stop_at_step" if config.get("stop_at_step") else "num_train_steps"
    stop = config.get(flag)
    if step < stop:
        return
    if step == stop:
        logging.warning("%s is at step %d = --config.%s: nothing left to train", source, step, flag)
        return
    raise ConfigError(
        f"{source} is at step {step}, past --config.{flag}={stop} by {step - stop} steps: "
        f"nothing to train. Give --config.{flag} above {step} to train on, or another --workdir"
    )
