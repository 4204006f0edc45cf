"""Reading this project's Orbax checkpoints: restore (the whole train state, or only the
params), find them, and check that what a save wrote reads back (`check_readable`).

`bert_jax.checkpointing` writes them (and re-exports these names). Each array of `state` is
saved with a fingerprint (`fingerprint`) that a restore compares, since Orbax reads flipped
or overwritten bytes back without complaint. A checkpoint that cannot be read raises
`CheckpointError` naming its step directory; asked for the newest, the one before is tried.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from absl import logging
from etils import epath
from jax.experimental import multihost_utils


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names the directory."""


# The items of a checkpoint step, as `bert_jax.checkpointing` writes them.
ITEMS = ("state", "data", "config")


def _make_manager(directory: str) -> ocp.CheckpointManager:
    """A `CheckpointManager` that only reads `directory` (local or `gs://`): it makes no
    directory and writes nothing (`bert_jax.checkpointing.make_manager` is the writer's)."""
    directory = os.fspath(directory)
    if "://" not in directory:  # Orbax refuses relative local paths
        directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(create=False, enable_async_checkpointing=False)
    return ocp.CheckpointManager(directory, options=options, item_names=ITEMS)


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
    checkpoint to `<step>.unreadable` (`.unreadable.2`, ... where one is kept already: a
    step can turn out unreadable again), kept for inspection, so the run can save that step
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
    manager = _make_manager(directory)

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


def aside_name(path: os.PathLike) -> os.PathLike:
    """Where unreadable step directory `path` is set aside: `<step>.unreadable`, or, where an
    earlier one of that step is kept there already, `<step>.unreadable.2`, `.3`, ... (a
    step can be saved, found unreadable and set aside again at every rerun)."""
    target, n = path.parent / f"{path.name}.unreadable", 1
    while target.exists() or os.path.islink(target):
        n += 1
        target = path.parent / f"{path.name}.unreadable.{n}"
    return target


def _set_aside(paths: list) -> list:
    """Renames each unreadable step directory of `paths` to its `aside_name`; returns the
    names (process 0 renames and returns them; the other processes get none)."""
    targets = []
    if jax.process_index() == 0:
        for path in paths:
            target = aside_name(path)
            path.rename(target)
            logging.warning("renamed %s to %s", path, target)
            targets.append(target)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("checkpointing._set_aside")
    return targets


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


def tree_shapes(tree) -> dict[str, tuple]:
    """{leaf path: shape} of a tree of arrays or of Orbax's array metadata."""
    return {
        _leaf_name(path): tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
        for path, x in jax.tree_util.tree_leaves_with_path(tree)
    }


def check_readable(directory, expected: dict | None = None) -> None:
    """Checks that the checkpoint in `directory` (a step directory of `checkpointing.save`, or
    one PyTree checkpoint: `convert.save_params`'s `params/`) reads back, without reading the
    arrays: each PyTree item's `_METADATA`, its OCDBT manifest and the index it leads to (a
    key for every array), the JSON items' files; and that the tree is `expected`
    (`tree_shapes` of what was saved: every leaf, each of its shape).

    Raises:
        CheckpointError: naming what does not read back, or differs.
    """
    directory = epath.Path(directory)
    state = directory / "state"
    items = [state] if state.exists() else [directory]
    for name in ("data", "config"):
        if (directory / name).exists() or state.exists():
            json.loads((directory / name / "metadata").read_text())
    for item in items:
        for file in ("_METADATA", "manifest.ocdbt"):
            if not (item / file).exists():
                raise CheckpointError(f"{item / file} is missing")
        tree = ocp.PyTreeCheckpointHandler().metadata(item).tree
        url = os.fspath(item) if "://" in os.fspath(item) else f"file://{os.fspath(item)}"
        kvstore = ts.KvStore.open({"driver": "ocdbt", "base": url.rstrip("/") + "/"}).result()
        keys = {key.decode().split("/")[0] for key in kvstore.list().result()}
        missing = [
            m.name for m in jax.tree.leaves(tree) if hasattr(m, "shape") and m.name not in keys
        ]
        if missing:
            raise CheckpointError(
                f"{item}: the OCDBT index lacks {len(missing)} array(s) of its metadata "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
            )
        saved = tree_shapes(tree)
        if expected is not None and saved != expected:
            differ = sorted(set(saved.items()) ^ set(expected.items()))
            names = sorted({name for name, _ in differ})
            raise CheckpointError(
                f"{item}: the saved tree differs from the one written in {len(names)} "
                f"leaves ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
            )


def is_checkpoint_dir(path: str) -> bool:
    """True when `path` holds this project's train-state checkpoints."""
    return bool(_complete_steps(path))


def _complete_steps(path: str) -> list[int]:
    """The steps completely written in the checkpoint directory `path` (none if it is not one)."""
    if not tf_io_isdir(path):
        return []
    try:
        return list(_make_manager(path).all_steps())
    except (OSError, ValueError):
        return []


def tf_io_isdir(path: str) -> bool:
    """`os.path.isdir` that also understands `gs://` (through TensorFlow's file system)."""
    path = os.fspath(path)
    if "://" not in path:
        return os.path.isdir(path)
    import tensorflow as tf

    return tf.io.gfile.isdir(path)
