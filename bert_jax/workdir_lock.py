"""One run per workdir: a lock file held for the life of a run (`hold`).

Two runs writing one workdir log every step twice and interleave their checkpoints, one of
which a resume then cannot read. A run therefore takes `<workdir>/run.lock` first; a second
run meets it at once (before any JAX work) with an error naming the workdir and the holder's
pid and host.

Local disks: the lock is an exclusive `flock` on the file, which the kernel drops when its
process ends, however it ends. The file also holds the holder's pid and host: a file left by
a killed run on this host is taken over with a log line; one that names another host (a
shared file system) is refused, naming the host and pid, since this host cannot tell whether
that run is still alive: delete the file once it is not.

Object stores (`gs://`): no lock. Creating an object only if absent (a generation
precondition) is not something `tf.io.gfile` offers, and a check-then-write is not atomic, so
a warning says that nothing stops a second run there: on a TPU pod, start one run per
workdir (the pod's processes are one run; only process 0 takes the lock).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator

from absl import logging

LOCK_FILE = "run.lock"


class WorkdirError(RuntimeError):
    """A workdir a run cannot use: its name holds glob characters, or it cannot be written."""


class WorkdirLockedError(WorkdirError):
    """Another run holds the workdir; the message names it, its pid and host."""


def _holder(path: str) -> dict:
    """The holder the lock file names ({} if none or unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _describe(holder: dict) -> str:
    what = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("command"):
        what += f" ({holder['command']})"
    if holder.get("started"):
        what += f", since {holder['started']}"
    return what


@dataclasses.dataclass(frozen=True)
class Held:
    """A lock `acquire` took: its open file, and whether it made the workdir (then `release`
    removes the workdir again if nothing else was written there: a refused run leaves none)."""

    workdir: str
    fd: int
    made_workdir: bool


def acquire(workdir: str, command: str = "") -> Held | None:
    """Takes `<workdir>/run.lock` (None on `gs://`: no lock there).

    Raises:
        WorkdirLockedError: another live run holds it, or a run on another host left it.
        WorkdirError: its path holds glob characters (`data_pipelines.paths.check_no_glob`),
            or it cannot be written.
    """
    workdir = os.fspath(workdir)
    if "://" in workdir:
        logging.warning(
            "%s: no run lock on an object store (no atomic create-if-absent through "
            "tf.io.gfile); make sure no other run writes this workdir",
            workdir,
        )
        return None
    from data_pipelines import paths

    try:  # Orbax would write checkpoints there that no run can read back
        paths.check_no_glob(workdir, "--workdir")
    except paths.GlobCharactersError as error:
        raise WorkdirError(str(error)) from None
    made = not os.path.isdir(workdir)
    path = os.path.join(workdir, LOCK_FILE)
    try:
        os.makedirs(workdir, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
    except OSError as error:  # read-only, a file where the directory should be, no space
        raise WorkdirError(
            f"cannot write to --workdir={workdir}: {error.strerror or error} ({path})"
        ) from None
    held = Held(workdir, -1, made)
    host = socket.gethostname()
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            _remove_if_made(held)
            raise WorkdirLockedError(
                f"workdir {workdir} is in use by another run: {_describe(_holder(path))}. "
                f"One run per workdir: wait for it, stop it, or give another --workdir"
            ) from None
        # The file may have been released and removed between our open and our flock:
        # then we hold a lock on a name no one else will open. Try again on the new file.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    previous = _holder(path)
    if previous.get("pid") and previous.get("host") not in (None, host):
        os.close(fd)
        _remove_if_made(held)
        raise WorkdirLockedError(
            f"workdir {workdir} is locked by a run on another host: {_describe(previous)}. "
            f"If that run is gone, delete {path}"
        )
    if previous.get("pid"):
        # The flock is free, so its process is gone (the kernel drops a lock at exit).
        state = "alive, but not holding it" if _alive(int(previous["pid"])) else "gone"
        logging.warning(
            "taking over the stale lock %s of %s (that process is %s)",
            path,
            _describe(previous),
            state,
        )
    record = {
        "pid": os.getpid(),
        "host": host,
        "command": command,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return dataclasses.replace(held, fd=fd)


def release(held: Held | None) -> None:
    """Removes the lock file, drops the lock, and removes the workdir if `acquire` made it
    and nothing else is in it (a no-op for None)."""
    if held is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(held.workdir, LOCK_FILE))
    os.close(held.fd)  # drops the flock
    _remove_if_made(held)


def _remove_if_made(held: Held) -> None:
    if held.made_workdir:
        with contextlib.suppress(OSError):  # not empty: the run wrote there
            os.rmdir(held.workdir)


@contextlib.contextmanager
def hold(workdir: str, command: str = "") -> Iterator[None]:
    """Holds `<workdir>/run.lock` for the body (see the module docstring)."""
    held = acquire(workdir, command)
    try:
        yield
    finally:
        release(held)


@contextlib.contextmanager
def hold_or_exit(workdir: str, command: str) -> Iterator[None]:
    """`hold` for an entry point's main: a refusal exits with its one-line message."""
    try:
        held = acquire(workdir, command)
    except WorkdirError as error:
        raise SystemExit(f"{command}: {error}") from None
    try:
        yield
    finally:
        release(held)


def hold_until_exit(workdir: str, command: str) -> None:
    """`hold_or_exit` for the rest of the process (released at interpreter exit)."""
    try:
        held = acquire(workdir, command)
    except WorkdirError as error:
        raise SystemExit(f"{command}: {error}") from None
    atexit.register(release, held)
