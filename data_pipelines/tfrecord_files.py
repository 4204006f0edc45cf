"""TFRecord shard sets without TensorFlow: their names, the atomic sharded writer, the readers'
check and the cleanup of what dead writers left.

`TFRecordShardWriter` is the project's one TFRecord writer: it writes uncompressed files
(the input pipeline also reads GZIP/ZLIB files written by other tools), each record framed
by `tfrecord_framing` (the file format: masked CRC-32C, record counts, damage checks).

A set of shards appears complete or not at all. One rename moves one file, and readers
glob final names in the user's directory (`out-*-of-00004.tfrecord`), so no single rename
can publish a set; instead:

1. every shard is written under a hidden temporary name, `.NAME.incomplete-PID`;
2. before the first rename, a journal `.FIRST_NAME.renaming-PID` listing the renames is
   written into each output directory, and it is removed after the last rename. A failure
   between renames (an exception, Ctrl-C) removes the shards already renamed;
3. readers (`input_pipeline.list_files` through `check_shard_set`) refuse a file that a
   journal names: its set is being renamed, or its writer died between renames (SIGKILL);
4. the next writer into the directory resolves what dead processes (their PID no longer
   running) left, with a log line naming the files: a journal whose renames all happened
   leaves a complete set (the journal goes), one with none an untouched older set (the
   temporaries go), and one in between a mix of two sets (its shards go); every other
   temporary of a dead process goes too. A live process's files are left alone.

Liveness is judged on this machine, so that cleanup is skipped for URLs (`gs://...`),
whose writers may run elsewhere; their journals still stop readers.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Sequence

from data_pipelines import tfrecord_framing
from data_pipelines.paths import make_directories, remove_empty_directories

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- paths


def shard_paths(output: str | Sequence[str], num_shards: int = 1) -> list[str]:
    """The output paths for `output`.

    Args:
        output: a list of paths (one shard each); or a comma-separated string of paths (the
            original tool's `--output_file`); or one path, which with `num_shards > 1`
            becomes `path-00000-of-0000N` ... (before any `.tfrecord` suffix).
        num_shards: shards to make from a single path.

    Returns:
        One path per shard.
    """
    if isinstance(output, str):
        paths = [p for p in output.split(",") if p]
    else:
        paths = list(output)
    if not paths:
        raise ValueError("no output path given")
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if len(paths) > 1 or num_shards == 1:
        if num_shards not in (1, len(paths)):
            raise ValueError(f"{len(paths)} output paths given but num_shards={num_shards}")
        return paths
    stem, suffix = paths[0], ""
    for ext in (".tfrecord", ".tfrecords", ".tfrec"):
        if stem.endswith(ext):
            stem, suffix = stem[: -len(ext)], ext
    return [f"{stem}-{i:05d}-of-{num_shards:05d}{suffix}" for i in range(num_shards)]


def capped_shard_paths(output: str | Sequence[str], num_shards: int, records: int):
    """The shard names for `records` records dealt round-robin over `num_shards` shards made
    from one path, where they fall short: one shard per record (at least one), the set that
    `num_shards=records` writes, record for record, instead of `num_shards - records` empty
    shards; None where nothing is capped (records enough, or paths listed one by one, which
    are written as named)."""
    single = isinstance(output, str) and len([p for p in output.split(",") if p]) == 1
    if not single or num_shards <= 1 or records >= num_shards:
        return None
    return shard_paths(output, max(records, 1))


def temporary_path(path: str) -> str:
    """Where `path` is written until it is complete."""
    # A dot prefix and a suffix, so neither `out-*` nor `*.tfrecord` globs pick it up (though
    # `tf.io.gfile.glob("dir/*")` does: see `is_temporary`); the PID tells whether its writer
    # still runs (see `remove_stale_temporaries`).
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.incomplete-{os.getpid()}")


def _journal_path(directory: str, first_path: str) -> str:
    return os.path.join(directory, f".{os.path.basename(first_path)}.renaming-{os.getpid()}")


_TEMPORARY = re.compile(r"^\..+\.incomplete-(\d+)$")
_JOURNAL = re.compile(r"^\..+\.renaming-(\d+)$")


def is_temporary(path: str) -> bool:
    """Whether `path` is a writer's temporary or journal (never finished output)."""
    name = os.path.basename(path)
    return bool(_TEMPORARY.match(name) or _JOURNAL.match(name))


# What `create_pretraining_data` writes beside a set's first shard: `<first shard>.stats.json`.
STATS_SUFFIX = ".stats.json"


def read_stats(path: str) -> dict:
    """The stats JSON `path` (local or a `tf.io.gfile` URL).

    Raises:
        ValueError: it is not complete JSON (cut short, damaged), naming the file, the line
            and the column.
    """
    if "://" in path:
        import tensorflow as tf

        with tf.io.gfile.GFile(path) as f:
            text = f.read()
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}: not a readable stats JSON ({error.msg} at line {error.lineno} column "
            f"{error.colno}): cut short or damaged; write the records again, or delete it"
        ) from None


def stats_of(files: Sequence[str]) -> tuple[dict[str, dict], list[str]]:
    """The stats JSONs of the record sets `files` belong to, and the files none names.

    Each file is looked up in the stats JSONs of its directory by name (`output_files`: every
    shard of a set, whichever of them a pattern matched; stats older than the list name the
    first shard they sit beside), so a glob that skips shard 0 still finds its set's stats.

    Returns:
        ({stats path: its contents}, [files no stats JSON names]).

    Raises:
        ValueError: a stats JSON that does not read (`read_stats`), naming it.
    """
    from data_pipelines import paths

    found: dict[str, dict] = {}
    unnamed: list[str] = []
    by_directory: dict[str, list[str]] = {}
    for path in files:
        by_directory.setdefault(os.path.dirname(path), []).append(path)
    for directory, members in by_directory.items():
        owner: dict[str, str] = {}
        stats: dict[str, dict] = {}
        for stats_path in sorted(paths.glob_in(directory, "*" + STATS_SUFFIX)):
            stats[stats_path] = read_stats(stats_path)
            listed = stats[stats_path].get("output_files") or [stats_path[: -len(STATS_SUFFIX)]]
            for name in listed:
                owner.setdefault(os.path.basename(name), stats_path)
        for path in members:
            stats_path = owner.get(os.path.basename(path))
            if stats_path is None:
                unnamed.append(path)
            else:
                found[stats_path] = stats[stats_path]
    return found, unnamed


def is_sidecar(path: str) -> bool:
    """Whether `path` is a stats JSON written beside shards (`dir/train-*` matches it)."""
    return path.endswith(STATS_SUFFIX)


def _is_url(path: str) -> bool:
    return "://" in path


def _absolute(path: str) -> str:
    return path if _is_url(path) else os.path.abspath(path)


def _remove(path: str) -> None:
    if _is_url(path):
        import tensorflow as tf

        if tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)
    elif os.path.exists(path):
        os.remove(path)


def _rename(source: str, target: str) -> None:
    if _is_url(target):
        import tensorflow as tf

        tf.io.gfile.rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


def _list(directory: str) -> list[str]:
    """The names in `directory` (none when it does not exist)."""
    if _is_url(directory):
        import tensorflow as tf

        return tf.io.gfile.listdir(directory) if tf.io.gfile.isdir(directory) else []
    return os.listdir(directory) if os.path.isdir(directory) else []


def _read_journal(path: str) -> tuple[list[tuple[str, str]], list[str]]:
    """A journal's (temporary, final) renames and the paths of all its copies (one per
    output directory); none when it is unreadable: cut short, so its renames never began."""
    try:
        if _is_url(path):
            import tensorflow as tf

            with tf.io.gfile.GFile(path, "r") as f:
                text = f.read()
        else:
            with open(path) as f:
                text = f.read()
        journal = json.loads(text)
        return [(t, final) for t, final in journal["renames"]], list(journal["journals"])
    except Exception:  # noqa: BLE001 - cut short, or removed since it was listed
        return [], []


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# ----------------------------------------------------------------------------- readers


def check_shard_set(paths: Sequence[str]) -> None:
    """Raises if a file of `paths` belongs to a shard set not (yet) completely renamed.

    Looks for writer journals in the files' directories (see the module docstring).

    Raises:
        ValueError: naming the files, the writer's PID and what to do.
    """
    wanted = {_absolute(p): p for p in paths}
    for directory in sorted({os.path.dirname(p) for p in wanted}):
        for name in _list(directory):
            match = _JOURNAL.match(name)
            if not match:
                continue
            renames, _ = _read_journal(os.path.join(directory, name))
            named = sorted(wanted[final] for _, final in renames if final in wanted)
            if not named:
                continue
            pid = int(match.group(1))
            if _is_url(directory):  # its writer may run on another machine
                state = "is renaming them into place, or stopped doing so: wait, or run it again"
            elif _process_alive(pid):
                state = "is renaming them into place now: wait for it to finish"
            else:
                state = (
                    "stopped while renaming them into place, so the set may be partial: "
                    "run it again (its start removes what is partial)"
                )
            raise ValueError(
                f"{', '.join(named)}: the run that writes this shard set (pid {pid}, "
                f"journal {os.path.join(directory, name)}) {state}"
            )


# ----------------------------------------------------------------------------- cleanup


def remove_stale_temporaries(directory: str) -> list[str]:
    """Resolves what writers that are no longer running left in `directory`.

    See the module docstring; logs a warning naming every file removed. Does nothing for
    URLs (a writer elsewhere may own them).

    Returns:
        The paths removed.
    """
    if _is_url(directory):
        return []
    removed: list[str] = []
    names = _list(directory)
    # Journals first: whether a dead writer renamed a shard shows in its temporaries.
    for name in names:
        match = _JOURNAL.match(name)
        if match and not _process_alive(int(match.group(1))):
            removed += _resolve_dead_journal(os.path.join(directory, name), match.group(1))
    for name in names:
        match = _TEMPORARY.match(name)
        path = os.path.join(directory, name)
        if match and not _process_alive(int(match.group(1))) and _unlink(path):
            removed.append(path)
    if removed:
        log.warning(
            "removed %d file(s) left by runs that are no longer running: %s",
            len(removed),
            ", ".join(removed),
        )
    return removed


def _resolve_dead_journal(journal: str, pid: str) -> list[str]:
    """Removes the journal of a dead writer, its copies and temporaries in other output
    directories, and its shards when only some were renamed. Returns what it removed."""
    renames, journals = _read_journal(journal)
    # Renames go in order, and a renamed shard's temporary is gone.
    renamed = sum(not os.path.exists(temporary) for temporary, _ in renames)
    partial = 0 < renamed < len(renames)
    removed = []
    if partial:
        shards = [final for _, final in renames if _unlink(final)]
        log.warning(
            "removed the partial shard set of a run (pid %s) killed while renaming it into "
            "place: %s",
            pid,
            ", ".join(shards),
        )
        removed += shards
    for path in [temporary for temporary, _ in renames] + journals + [journal]:
        if _unlink(path):
            removed.append(path)
    return removed


def _unlink(path: str) -> bool:
    """Removes a local file; False when it is not there (another run may have removed it)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True


# ----------------------------------------------------------------------------- writing


class TFRecordShardWriter:
    """Writes records round-robin over shards (or to a chosen shard), atomically.

    Every shard is written under a hidden temporary name and the whole set is renamed to its
    final names only when `close()` succeeds, so a crashed or interrupted run leaves nothing
    that looks like finished output (see the module docstring for how a set appears at
    once). Use as a context manager: on an exception inside the `with` block the
    temporaries are deleted. Opening the writer first removes what dead runs left in the
    output directories. Local paths need no TensorFlow; URLs (`gs://...`) go through
    `tf.io.gfile`.

    Example::

        with TFRecordShardWriter("out/train.tfrecord", num_shards=4) as writer:
            for record in records:
                writer.write(record)
        print(writer.counts)  # records per shard

    Args:
        output_pattern_or_paths: see `shard_paths`.
        num_shards: shards to make from a single path.

    Raises:
        OSError: an output directory cannot be created or written.
    """

    def __init__(self, output_pattern_or_paths: str | Sequence[str], num_shards: int = 1):
        self._output = output_pattern_or_paths
        self._chosen_shards = False  # a write named its shard: the set is not round-robin
        self.paths = shard_paths(output_pattern_or_paths, num_shards)
        if len(set(self.paths)) != len(self.paths):
            raise ValueError(f"duplicate output paths: {self.paths}")
        self.counts = [0] * len(self.paths)
        self._temporary = [temporary_path(p) for p in self.paths]
        self._next_shard = 0
        self._closed = False
        self._files: list = []
        self._made: list[str] = []  # output directories this writer created, deepest first
        path = self.paths[0]
        try:
            for directory in sorted({os.path.dirname(p) for p in self.paths}):
                remove_stale_temporaries(directory or ".")
                self._made += make_directories(directory)
            for path, temporary in zip(self.paths, self._temporary, strict=True):
                self._files.append(_open_for_writing(path, temporary))
        except Exception as error:
            self._discard()
            raise OSError(f"cannot open output {path!r} for writing: {error}") from error

    @property
    def total(self) -> int:
        """Records written so far, over all shards."""
        return sum(self.counts)

    def write(self, record: bytes, shard: int | None = None) -> None:
        """Writes one serialised record to `shard`, or to the next shard round-robin."""
        if self._closed:
            raise ValueError("write() on a closed TFRecordShardWriter")
        if shard is None:
            shard = self._next_shard
            self._next_shard = (shard + 1) % len(self._files)
        else:
            self._chosen_shards = True
        self._files[shard].write(tfrecord_framing.frame_records([record])[0])
        self.counts[shard] += 1

    def write_framed(self, framed: Iterable[bytes]) -> None:
        """Writes records framed in bulk by `tfrecord_framing.frame_records`, round-robin."""
        if self._closed:
            raise ValueError("write_framed() on a closed TFRecordShardWriter")
        shards = len(self._files)
        if shards == 1:  # one file: a single write of the whole batch
            framed = list(framed)
            self._files[0].write(b"".join(framed))
            self.counts[0] += len(framed)
            return
        for record in framed:
            shard = self._next_shard
            self._next_shard = (shard + 1) % shards
            self._files[shard].write(record)
            self.counts[shard] += 1

    def cap_shards(self) -> bool:
        """Where fewer records than shards were dealt round-robin from one path, keeps one
        shard per record (`capped_shard_paths`: the set `num_shards=<records>` writes) and
        drops the empty rest. Returns whether it capped; call it before `close`."""
        capped = None if self._chosen_shards else capped_shard_paths(
            self._output, len(self.paths), self.total
        )  # fmt: skip
        if capped is None:
            return False
        keep = len(capped)
        for f in self._files[keep:]:
            f.close()
        for temporary in self._temporary[keep:]:
            _remove_quietly(temporary)
        self._files, self._temporary = self._files[:keep], self._temporary[:keep]
        self.paths, self.counts = capped, self.counts[:keep]
        self._next_shard = 0
        return True

    def close(self) -> list[str]:
        """Flushes every shard and renames the set to its final names; returns them.

        On any failure (Ctrl-C included) no shard is left under a final name.
        """
        if self._closed:
            return self.paths
        self._closed = True
        try:
            for f in self._files:
                f.close()
        except BaseException:
            self._discard()
            raise
        publish_shard_set(self._temporary, self.paths)
        return self.paths

    def abort(self) -> None:
        """Closes and deletes every temporary shard; no final file is created."""
        self._closed = True
        self._discard()

    def _discard(self) -> None:
        for f in self._files:
            try:
                f.close()
            except Exception:  # already failing: removing the files matters more
                pass
        for temporary in self._temporary:
            _remove_quietly(temporary)
        remove_empty_directories(self._made)

    def __enter__(self) -> TFRecordShardWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def publish_shard_set(temporaries: Sequence[str], paths: Sequence[str]) -> None:
    """Renames a set of complete, closed temporaries to their final `paths`, the whole set or
    none of it (the journal of the module docstring). On any failure (Ctrl-C included) the
    shards already renamed, the temporaries and the journals are removed.

    `TFRecordShardWriter.close` does this; `beam_records` too, for shards its workers wrote.
    """
    renames = list(zip(temporaries, paths, strict=True))
    # One journal per output directory, so readers find it where they glob.
    journals = [
        _journal_path(directory, paths[0])
        for directory in sorted({os.path.dirname(p) for p in paths})
    ]
    renamed: list[str] = []
    try:
        text = json.dumps(
            {
                "renames": [[_absolute(t), _absolute(p)] for t, p in renames],
                "journals": [_absolute(j) for j in journals],
            }
        )
        for journal in journals:
            _write_synced(journal, text)
        for temporary, path in renames:
            _rename(temporary, path)
            renamed.append(path)
    except BaseException:
        for path in renamed:  # a set is whole or absent
            _remove_quietly(path)
        for path in [*temporaries, *journals]:
            _remove_quietly(path)
        raise
    for journal in journals:
        _remove(journal)


def open_for_writing(path: str, temporary: str):
    """`temporary` (the hidden name of output `path`) opened for writing bytes, its directory
    made; a URL through `tf.io.gfile`."""
    return _open_for_writing(path, temporary)


def _remove_quietly(path: str) -> None:
    try:
        _remove(path)
    except Exception:  # already failing: the first error is the one to report
        pass


def _write_synced(path: str, text: str) -> None:
    """Writes `path` and, locally, waits until it is on disk (so it precedes the renames)."""
    if _is_url(path):
        import tensorflow as tf

        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)
        return
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _open_for_writing(path: str, temporary: str):
    if _is_url(path):
        import tensorflow as tf

        tf.io.gfile.makedirs(os.path.dirname(path))
        return tf.io.gfile.GFile(temporary, "wb")
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    return open(temporary, "wb")
