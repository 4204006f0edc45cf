"""Paths every tool checks the same way: an output that would overwrite one of its inputs
(`check_not_an_input`), a directory whose name holds glob characters (`check_no_glob`), a
file pattern that names an existing file literally (`literal_or_glob`), and the output
directories a run makes, removed again when it fails (`make_directories`,
`remove_empty_directories`), and the one rule for links in a model directory
(`check_inside`, `model_file`).

It lives in `data_pipelines`, the lowest package: the data tools, `bert_jax` and the
entry points in `experiments` all import it from here.
"""

from __future__ import annotations

import glob as globlib
import os
from collections.abc import Iterable, Sequence

# What glob (Python's, tf.io.gfile's, etils' epath, which Orbax uses on its own
# directories) reads as a pattern rather than as the characters themselves.
GLOB_CHARACTERS = "[]*?"


class OutputIsInputError(ValueError):
    """An output path that is, holds or lies inside one of the tool's inputs; names both."""


class GlobCharactersError(ValueError):
    """A directory name with glob characters that a library would read as a pattern."""


class LinkOutsideError(ValueError):
    """A file of a model directory that links outside it; names the file and its target."""


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(os.fspath(path)))


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)  # hard links and bind mounts too
    except OSError:
        return False


def check_not_an_input(
    output: str, inputs: Iterable[str | None], *, flag: str = "--output_file", tool: str = ""
) -> None:
    """Refuses an output that is one of `inputs`, a directory holding one, or a path inside
    an input directory, by real path (symlinks, `..`, `./` and other spellings of the same
    file, and hard links), before anything is read or written.

    Args:
        output: the path the tool will write (a file, or for some tools a directory).
        inputs: the files and directories the tool reads (None entries are skipped); URLs
            (`gs://`) are compared as written.
        flag: the output's flag, for the message.
        tool: the tool's name, for the message.

    Raises:
        OutputIsInputError: naming the output and the input.
    """
    prefix = f"{tool}: " if tool else ""
    output = os.fspath(output)
    url = "://" in output
    target = output.rstrip("/") if url else _real(output)
    for source in inputs:
        if not source:
            continue
        source = os.fspath(source)
        if ("://" in source) != url:
            continue
        real = source.rstrip("/") if url else _real(source)
        if real == target or (not url and _same(source, output)):
            why = "is"
        elif real.startswith(target.rstrip(os.sep) + os.sep):
            why = "holds"
        elif target.startswith(real.rstrip(os.sep) + os.sep):
            why = "is inside"
        else:
            continue
        raise OutputIsInputError(
            f"{prefix}{flag}={output} {why} an input of this run ({source}); writing it would "
            "replace what is read. Give another output path"
        )


def check_no_glob(path: str, what: str) -> None:
    """Refuses a directory `path` whose name holds glob characters (`[`, `]`, `*`, `?`).

    Orbax lists a checkpoint's per-process files with a glob on its directory: under a path
    such as `runs/w[2]` it finds none, and writes every checkpoint without its index
    (`manifest.ocdbt`), unreadable by the resume, `convert` and fine-tuning.

    Raises:
        GlobCharactersError: naming `what` (a flag), the path and the characters.
    """
    path = os.fspath(path)
    found = sorted({c for c in os.path.abspath(path) if c in GLOB_CHARACTERS})
    if found:
        shown = " ".join(repr(c) for c in found)
        named = f"{what}={path}" if what.startswith("-") else f"{what} {path}"
        raise GlobCharactersError(
            f"{named}: its path holds {shown}, which Orbax's checkpoint writer reads as "
            "a glob pattern (checkpoints written there could not be read back); use a path "
            f"without {''.join(GLOB_CHARACTERS)}"
        )


def has_glob(pattern: str) -> bool:
    return any(c in pattern for c in GLOB_CHARACTERS)


def literal_or_glob(pattern: str, glob=None) -> list[str]:
    """The files `pattern` names: itself when it is an existing file (a name that holds
    `[`, `]`, `*` or `?` is then taken literally), else its glob matches, unsorted.

    `glob`: the function that expands a pattern (default Python's, recursive); a file whose
    directory holds glob characters is globbed with those escaped.
    """
    glob = glob or (lambda p: globlib.glob(p, recursive=True))
    is_url = "://" in pattern
    if not is_url and os.path.isfile(pattern):
        return [pattern]
    if is_url:
        import tensorflow as tf

        if has_glob(pattern) and tf.io.gfile.exists(pattern) and not tf.io.gfile.isdir(pattern):
            return [pattern]
        return glob(pattern)
    matches = glob(pattern)
    directory, name = os.path.split(pattern)
    if not matches and has_glob(directory) and os.path.isdir(directory):
        # `records[1]/*.tfrecord`: the directory exists under that very name.
        matches = glob(os.path.join(globlib.escape(directory), name))
    return matches


def glob_in(directory: str, pattern: str, glob=None) -> list[str]:
    """The files matching `pattern` (a file-name pattern) in `directory`, whose own name is
    taken literally (`records[1]/*.stats.json`); `glob` as in `literal_or_glob`."""
    if "://" in directory:
        import tensorflow as tf

        return (glob or tf.io.gfile.glob)(os.path.join(directory, pattern))
    return (glob or globlib.glob)(os.path.join(globlib.escape(directory), pattern))


def make_directories(directory: str) -> list[str]:
    """Makes local `directory` and its missing parents; returns those it made, deepest first
    (for `remove_empty_directories` when the run fails). A URL's are left to its writer."""
    if not directory or "://" in directory:
        return []
    missing, current = [], os.path.abspath(directory)
    while not os.path.exists(current) and current != os.path.dirname(current):
        missing.append(current)
        current = os.path.dirname(current)
    os.makedirs(directory, exist_ok=True)
    return missing


def remove_empty_directories(directories: Sequence[str]) -> None:
    """Removes `directories` (deepest first) while they are empty: a failed run leaves no
    output directory it made (another writer's file keeps one)."""
    for directory in directories:
        try:
            os.rmdir(directory)
        except OSError:
            return


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def cache_blobs(directory: str) -> str | None:
    """The `blobs/` of the Hugging Face cache model whose snapshot `directory` is, or None."""
    real = os.path.realpath(directory)
    snapshots = os.path.dirname(real)
    model = os.path.dirname(snapshots)
    if os.path.basename(snapshots) == "snapshots" and os.path.basename(model).startswith(
        "models--"
    ):
        return os.path.join(model, "blobs")
    return None


def check_inside(
    directory: str, path: str, what: str | None = None, error: type[Exception] = LinkOutsideError
) -> str:
    """`path` (a file of model directory `directory`), refused unless its real path is
    inside the directory or, for a Hugging Face cache snapshot
    (`.../models--<name>/snapshots/<rev>/`, whose files link to `../../blobs/<hash>`), inside
    that model's blobs/: nothing from outside is read into, or copied with, a model.

    Raises:
      `error` (default LinkOutsideError; each package passes its own): one line naming the
        file (`what`, default `path`) and where it leads.
    """
    if "://" in path:
        return path
    real = os.path.realpath(path)
    if _under(real, os.path.realpath(directory)):
        return path
    blobs = cache_blobs(directory)
    if blobs is not None and _under(real, os.path.realpath(blobs)):
        return path
    allowed = f"{directory}" + (f" or {blobs}" if blobs else "")
    raise error(
        f"{what or path}: a link to {real}, outside the model directory {allowed}; a model "
        "directory reads only its own files (copy the file in to use it)"
    )


def model_file(directory: str, name: str, error: type[Exception] = LinkOutsideError) -> str | None:
    """`directory/name` if it exists (`check_inside`: never a link out), else None."""
    path = os.path.join(directory, name)
    if not os.path.lexists(path):
        return None
    check_inside(directory, path, error=error)
    return path if os.path.exists(path) else None
