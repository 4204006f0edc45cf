"""Orbax checkpoints of the full train state, the data position and the config.

A checkpoint step directory holds three items:
- `state`: the `TrainState` (params, optimizer state, step), sharded as in training;
- `data`: the input pipeline position of every process, and a fingerprint of each
  array of `state` that restores check (JSON);
- `config`: the experiment config that produced it (JSON).

Orbax writes each step to a temporary directory and renames it when complete, so a
checkpoint interrupted mid-write is never listed, never loaded. Restoring takes abstract
arrays carrying the *current* shardings, so a checkpoint written on one mesh restores
onto another mesh shape or device count (`bert_jax.checkpoint_reading`, whose names this
module re-exports).

A save that fails raises `CheckpointError` naming the directory: at once when the step
directory cannot be made, else when the background write is found to have failed
(`finish_saves`, which the train loop polls every step), never only at exit. A save that
landed counts only once it reads back (`checkpoint_reading.check_readable`: its metadata,
its OCDBT index and the tree it holds, not the arrays): one that does not is set aside as
`<step>.unreadable` and raises `CheckpointError` naming it. Only then are the checkpoints
beyond `max_to_keep` deleted, so the one before an unreadable save is always kept.
"""

from __future__ import annotations

import gc
import json
import logging as logging_lib
import os
import signal
import sys
import tempfile
import threading
import warnings

import jax
import orbax.checkpoint as ocp
from absl import logging

from bert_jax.checkpoint_reading import (  # noqa: F401 - this module's public names too
    ITEMS,
    CheckpointError,
    _reason_line,
    _set_aside,
    abstract_like,
    check_readable,
    find_checkpoints,
    fingerprint,
    is_checkpoint_dir,
    missing_params,
    restore,
    restore_params,
    restore_params_and_step,
    saved_config,
    tf_io_isdir,
    tree_shapes,
)

# Orbax writes step N into "N.orbax-checkpoint-tmp..." and renames it when complete.
_TMP_SUFFIX = ".orbax-checkpoint-tmp"


class _Manager(ocp.CheckpointManager):
    """Orbax's `CheckpointManager`, whose saves count once they read back.

    Orbax deletes the steps past `max_to_keep` as soon as a save is written, before anything
    could read it: here it keeps every step, and `wait_until_finished` (which `finish_saves`,
    `close` and the next save call) first checks the landed save (`_check_landed`), then
    deletes the steps past `keep`.
    """

    def __init__(self, directory, *, options, item_names, keep: int | None):
        super().__init__(directory, options=options, item_names=item_names)
        self.keep = keep
        self.async_save = options.enable_async_checkpointing
        self.unchecked: tuple[int, dict] | None = None  # (step, its tree_shapes) saved

    def wait_until_finished(self):
        try:
            super().wait_until_finished()
        except BaseException:
            self.unchecked = None  # never landed: nothing to read back
            raise
        if self.unchecked is not None:
            step, expected = self.unchecked
            self.unchecked = None
            _check_landed(self, step, expected)
            _delete_past_keep(self)


def _check_landed(manager: _Manager, step: int, expected: dict) -> None:
    """Reads back the metadata of the save of `step`; one that does not read is set aside
    (`<step>.unreadable`), forgotten by `manager`, and raises `CheckpointError` naming it."""
    step_dir = manager.directory / str(step)
    try:
        check_readable(step_dir, expected)
    except Exception as error:  # noqa: BLE001 - any failure to read it back
        if not manager.directory.is_dir():
            # The directory went away after the save landed, or while it was read back
            # (unmounted, replaced by a file): there is nothing to set aside here; the next
            # save names the directory in its own error.
            return
        reason = _reason_line(error)
        try:
            aside = (_set_aside([step_dir]) or [f"{step_dir}.unreadable"])[0]
        except OSError:
            if not manager.directory.is_dir():  # it went away between the check and here
                return
            raise
        manager.reload()  # its latest_step is the one before now
        before = manager.latest_step()
        kept = (
            "no checkpoint before it" if before is None else f"step {before} is the last good one"
        )
        raise CheckpointError(
            f"checkpoint step {step} in {step_dir} is unreadable after its save ({reason}): set "
            f"aside as {aside}; {kept} in {manager.directory}"
        ) from None


def _delete_past_keep(manager: _Manager) -> None:
    """Deletes the oldest steps past `manager.keep` (Orbax's `max_to_keep`, applied late)."""
    if manager.keep is None or manager.keep <= 0:
        return
    for step in sorted(manager.all_steps())[: -manager.keep]:
        manager.delete(step)


def make_manager(
    directory: str, *, max_to_keep: int = 3, async_save: bool = True, create: bool = True
):
    """A `CheckpointManager` for `directory` (local or `gs://`); `create=False` to only read.

    `create=True` also checks that a local `directory` can be written, so a run that could
    never save stops before its first step.
    """
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None,  # applied by _Manager once the save reads back
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
    return _Manager(directory, options=options, item_names=ITEMS, keep=max_to_keep)


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
    # Orbax warns of every override ('Type handler registry type ... overriding jax.Array'):
    # this one is meant, and only that line is dropped.
    absl_logger = logging_lib.getLogger("absl")
    absl_logger.addFilter(_not_our_override)
    try:
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    finally:
        absl_logger.removeFilter(_not_our_override)
    _CPU_HANDLER_SET = True


def _not_our_override(record: logging_lib.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.startswith("Type handler registry type") and "jax.Array" in message)


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
        started = manager.save(step, args=args, force=True)
    except Exception as error:
        raise CheckpointError(
            f"cannot save checkpoint step {step} in {manager.directory}: {_reason_line(error)}"
        ) from None
    if started and isinstance(manager, _Manager):
        manager.unchecked = (step, tree_shapes(state))
        if not manager.async_save:
            finish_saves(manager)  # landed already: read back now, as Orbax deleted then
    return started


def finish_saves(manager) -> None:
    """Waits for the background save, if any, and reads it back (`_Manager`); raises
    `CheckpointError` if it failed or does not read back."""
    try:
        manager.wait_until_finished()
    except CheckpointError:  # it landed, and does not read back
        raise
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
