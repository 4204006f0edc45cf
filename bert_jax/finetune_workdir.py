"""What a fine-tuning run's workdir may hold, checked by `experiments.finetune_main` before
anything is written: a model is never its own fine-tune's output, and a finished run is
never lost to a rerun.

- `check_not_a_model`: the workdir is not, does not hold and is not inside a model the run
  reads (`init_from`, a distillation's `teacher` / `student_init_from`), by real path: the
  run writes `checkpoint/`, `metrics.json` and `train_log.jsonl` there.
- `check_rerun`: a workdir whose run finished (`RECORD_FILE`, written at the end of a
  successful run with the flags it was given) is rerun only with the same flags; other
  flags are refused naming each key that differs, before anything is touched (as
  pretraining refuses to resume another model).
- `keeping_earlier_run`: a rerun of a workdir that holds an earlier run's results (its
  record or metrics.json) copies them aside first and puts them back if it does not
  complete (a signal, an error, a kill: the next start puts them back), so they are lost
  only to a run that replaces them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
from collections.abc import Iterator

log = logging.getLogger(__name__)

RECORD_FILE = "finetune_config.json"  # the tool and flags of the run that finished here
ASIDE = ".earlier_run"  # a copy of the earlier run's results while a rerun goes on
MODEL_KEYS = ("init_from", "teacher", "student_init_from")  # the models a run reads


class WorkdirError(ValueError):
    """A workdir this run may not write to; the message says why and what to do."""


def _model_dir(path: str) -> str | None:
    """The directory that holds the model `path` names (a checkpoint prefix's directory),
    None where nothing is there yet (loading it says so)."""
    if os.path.isdir(path):
        return path
    if os.path.exists(path) or os.path.exists(path + ".index"):
        return os.path.dirname(os.path.abspath(path))
    return None


def check_not_a_model(config, workdir: str) -> None:
    """Refuses a `workdir` that is, holds, or is inside a model the run reads.

    Raises:
        WorkdirError: naming the flag, the model and how they overlap.
    """
    target = os.path.realpath(workdir)
    for key in MODEL_KEYS:
        path = config.get(key) or ""
        if not isinstance(path, str) or not path or "://" in path:
            continue
        found = _model_dir(path)
        if found is None:
            continue
        model = os.path.realpath(found)
        if model == target:
            how = "is the directory of"
        elif model.startswith(target.rstrip(os.sep) + os.sep):
            how = "holds"
        elif target.startswith(model.rstrip(os.sep) + os.sep):
            how = "is inside"
        else:
            continue
        raise WorkdirError(
            f"--workdir={workdir} {how} the model it starts from (--config.{key}={path}): the "
            "run writes checkpoint/, metrics.json and train_log.jsonl there, over or beside "
            "that model. Give a --workdir outside it"
        )


def _flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out |= _flat(value, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): tree}


def given_config(config) -> dict:
    """The flags a run was given, JSON-safe (before the run fills in what it found)."""
    return json.loads(config.to_json_best_effort())


def check_rerun(config, workdir: str, tool: str) -> None:
    """Refuses to rerun a finished `workdir` (its `RECORD_FILE`) with another tool or other
    flags: its results would be replaced by another experiment's.

    Raises:
        WorkdirError: naming each key that differs with both values.
    """
    path = os.path.join(workdir, RECORD_FILE)
    if not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError) as error:
        raise WorkdirError(f"{path}: unreadable ({error}); the record of the run that finished "
                           f"in --workdir={workdir}. Give another --workdir") from None  # fmt: skip
    if record.get("tool") != tool:
        raise WorkdirError(
            f"--workdir={workdir} holds a finished {record.get('tool')} run ({path}): "
            f"{tool} would replace its results. Give another --workdir"
        )
    before, now = _flat(record.get("config") or {}), _flat(given_config(config))
    changed = [k for k in sorted(before.keys() | now.keys()) if before.get(k) != now.get(k)]
    if changed:
        shown = "; ".join(f"--config.{k}: {before.get(k)!r} then, {now.get(k)!r} now"
                          for k in changed[:5])  # fmt: skip
        more = f" (and {len(changed) - 5} more)" if len(changed) > 5 else ""
        raise WorkdirError(
            f"--workdir={workdir} holds a finished run with other flags ({shown}{more}; "
            f"recorded in {path}): this run would replace its results. Give another "
            "--workdir, or the same flags to repeat it"
        )


def write_record(given: dict, workdir: str, tool: str) -> None:
    """The record `check_rerun` reads: the run in `workdir` finished with these flags."""
    path = os.path.join(workdir, RECORD_FILE)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"tool": tool, "config": given}, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


# Where a run saves models and train states: written whole then renamed, needing no copy.
_MODEL_DIRS = ("checkpoint", "checkpoints", "state")


def _is_model(directory: str) -> bool:
    """A saved model (checkpoint/, an export): `convert.writing_dir` replaces it only once
    the new one is complete, so it needs no copy."""
    names = set(os.listdir(directory))
    marks = {"params", "finetuned.json", "model.safetensors", "_CHECKPOINT_METADATA"}
    return bool(names & marks) or any(name.isdigit() for name in names)  # Orbax step dirs


def _results(workdir: str) -> list[str]:
    """The earlier run's files in `workdir` (relative paths), models and locks left out."""
    found = []
    for root, dirs, files in os.walk(workdir):
        keep = []
        for name in sorted(dirs):
            path = os.path.join(root, name)
            if name.startswith(".") or name in _MODEL_DIRS or os.path.islink(path):
                continue
            if not _is_model(path):
                keep.append(name)
        dirs[:] = keep
        for name in sorted(files):
            if name.startswith(".") or name == "run.lock" or name.endswith(".tmp"):
                continue
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(os.path.relpath(path, workdir))
    return found


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGTERM and SIGINT wait while the earlier run's files are put back."""
    held = {signal.SIGTERM, signal.SIGINT}
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, ValueError, OSError):  # no signal masks here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _restore(aside: str, workdir: str) -> list[str]:
    """Moves the copies in `aside` back to their places in `workdir`; returns their names."""
    names = []
    with _signals_held():
        for root, _, files in os.walk(aside):
            for name in files:
                source = os.path.join(root, name)
                relative = os.path.relpath(source, aside)
                destination = os.path.join(workdir, relative)
                os.makedirs(os.path.dirname(destination), exist_ok=True)
                os.replace(source, destination)
                names.append(relative)
        shutil.rmtree(aside, ignore_errors=True)
    return sorted(names)


def _shown(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


@contextlib.contextmanager
def keeping_earlier_run(workdir: str) -> Iterator[None]:
    """Copies the results an earlier run left in `workdir` aside while the body (the rerun)
    goes on, and puts them back unless it completes: a stopped or failed rerun leaves them
    as they were, and its stop message (`finetune_common.Stopped`) says so."""
    from bert_jax.finetune_common import Stopped

    aside = os.path.join(workdir, ASIDE)
    shutil.rmtree(f"{aside}.tmp", ignore_errors=True)  # a copy a kill cut short
    if os.path.isdir(aside):  # a rerun killed before it completed: its files go back first
        restored = _restore(aside, workdir)
        log.warning("%s: put back the earlier run's %s, which a rerun killed before it "
                    "completed had set aside", workdir, _shown(restored))  # fmt: skip
    # A run's results: its record, or metrics.json (what every tool writes as it ends; a
    # workdir without either holds a stopped run's files, which a resuming tool reads).
    finished = any(os.path.isfile(os.path.join(workdir, n)) for n in (RECORD_FILE, "metrics.json"))
    files = _results(workdir) if finished else []
    if not files:
        yield
        return
    os.makedirs(f"{aside}.tmp")
    for relative in files:
        destination = os.path.join(f"{aside}.tmp", relative)
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copy2(os.path.join(workdir, relative), destination)
    os.replace(f"{aside}.tmp", aside)
    kept = (
        f"the earlier run's results in {workdir} ({_shown(files)}, and its checkpoint/ if "
        "it saved one) are as it left them"
    )
    try:
        yield
    except Stopped as stopped:
        if getattr(stopped, "saved", False):  # the final save completed: the new results
            shutil.rmtree(aside, ignore_errors=True)
            raise
        _restore(aside, workdir)
        stopped.outcome = f"{stopped.outcome}; {kept}"
        raise
    except BaseException:
        _restore(aside, workdir)
        log.error("this run did not complete: %s", kept)
        raise
    shutil.rmtree(aside, ignore_errors=True)
