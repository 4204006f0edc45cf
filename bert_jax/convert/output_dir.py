"""Writing an export directory so that nothing is lost that was not ours (`writing_dir`).

An export is written under a hidden temporary name beside its destination and renamed into
place when complete, so a half-written one never looks complete. Replacing an existing
directory (`overwrite`) is allowed only for a directory that is an export, recognised by
its files (`EXPORT_FILES`: what `save_hf`, `save_params`, `save_hf_electra` and a fine-tuned
checkpoint hold), never for the input of the conversion or a directory above it
(`check_output`). The old export is renamed aside, the new one renamed in, then the old one
deleted: a kill at any point leaves one complete export under the destination's name or
beside it, and the next write to that destination puts it back (if the destination is
missing) or removes it, and removes the temporaries of killed writes
(`_clean_leftovers`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence

log = logging.getLogger(__name__)

# What an export directory of this project holds; `generator/` is an ELECTRA export's second
# model (the same files), `params/` an Orbax checkpoint (its own files, not looked into).
EXPORT_FILES = frozenset(
    {
        "config.json",
        "model.safetensors",
        "vocab.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "finetuned.json",
        "params",
        "generator",
        # --format=sentence-transformers's modules (bert_jax.convert.sentence_transformers)
        "modules.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
        "1_Pooling",
    }
)
_TMP, _OLD = "tmp", "old"


def not_an_export(path: str) -> str | None:
    """Why the existing `path` is not an export `writing_dir` may replace (None: it is one,
    or an empty directory)."""
    if not os.path.isdir(path) or os.path.islink(path):
        return "it is not a directory"
    names = set(os.listdir(path))
    other = sorted(names - EXPORT_FILES)
    if "generator" in names and not other:
        other = [
            f"generator/{n}" for n in sorted(set(os.listdir(f"{path}/generator")) - EXPORT_FILES)
        ]
    if other:
        shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
        return f"it holds files an export does not ({shown})"
    if names and "config.json" not in names:
        return "it has no config.json"
    return None


def check_output(output_dir: str, overwrite: bool, reads: Sequence[str | None] = ()) -> None:
    """Refuses an output that would destroy what this run reads or what is not an export.

    Args:
        output_dir: the directory to write.
        overwrite: whether an existing export there may be replaced.
        reads: the paths the run reads (the input checkpoint, its vocab and config files):
            the output may be none of them nor a directory above one.

    Raises:
        FileExistsError: `output_dir` exists and may not be replaced; the message says why.
    """
    target = os.path.realpath(output_dir)
    for read in filter(None, reads):
        source = os.path.realpath(read)
        if source == target or source.startswith(target.rstrip(os.sep) + os.sep):
            raise FileExistsError(
                f"--output={output_dir} exists: it is, or holds, what this conversion reads "
                f"({read}); write the export somewhere else"
            )
    if not os.path.lexists(output_dir):
        return
    if not overwrite:
        raise FileExistsError(f"{output_dir} exists; pass overwrite=True (--overwrite)")
    reason = not_an_export(output_dir)
    if reason:
        raise FileExistsError(
            f"{output_dir} exists and is not an export, the only directory ever replaced: "
            f"{reason}. Delete it yourself, or write somewhere else"
        )


def _temporary_prefix(output_dir: str, kind: str) -> str:
    return f".{os.path.basename(output_dir)}.{kind}-"


def _writer_alive(name: str, prefix: str) -> bool:
    """Whether the process a temporary name holds (`<prefix><pid>-...`) is running."""
    pid = name[len(prefix) :].split("-", 1)[0]
    if not pid.isdigit():  # written before names carried a pid
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_leftovers(output_dir: str) -> None:
    """Puts back an old export a killed replacement left aside (when `output_dir` is
    missing), else removes it; removes the temporaries of killed writes. Another running
    process's (its pid in the name) are left alone."""
    parent = os.path.dirname(os.path.abspath(output_dir))
    if not os.path.isdir(parent):
        return
    for kind in (_OLD, _TMP):  # an old export first: it is put back before tmp is judged
        prefix = _temporary_prefix(output_dir, kind)
        for name in sorted(os.listdir(parent)):
            if not name.startswith(prefix) or _writer_alive(name, prefix):
                continue
            path = os.path.join(parent, name)
            if kind == _OLD and not os.path.lexists(output_dir):
                os.rename(path, output_dir)
                log.warning("put back %s, which a killed write left as %s", output_dir, path)
            else:
                shutil.rmtree(path, ignore_errors=True)
                log.warning("removed %s, left by a killed write of %s", path, output_dir)
    # A save that wrote through a `writing_dir` of its own temporary (a fine-tuned model's,
    # before it wrote the files itself) left `..<name>.tmp-<pid>-...` beside it when killed.
    nested = "." + _temporary_prefix(output_dir, _TMP)
    for name in sorted(os.listdir(parent)):
        if name.startswith(nested) and not _writer_alive(name, nested):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            log.warning("removed %s, left by a killed write of %s", name, output_dir)


@contextlib.contextmanager
def writing_dir(output_dir: str, overwrite: bool = False) -> Iterator[str]:
    """Yields a temporary directory beside `output_dir`, renamed to it only on success.

    An existing `output_dir` is replaced only with `overwrite` and only if it is an export
    (`check_output`); the old one is renamed aside before the new one is renamed in, then
    deleted.
    """
    output_dir = os.fspath(output_dir)
    _clean_leftovers(output_dir)
    check_output(output_dir, overwrite)
    parent = os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(parent, exist_ok=True)
    pid = f"{os.getpid()}-"
    tmp = tempfile.mkdtemp(prefix=_temporary_prefix(output_dir, _TMP) + pid, dir=parent)
    try:
        yield tmp
        _modes_from_umask(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    check_output(output_dir, overwrite)  # what appeared there meanwhile
    if not os.path.lexists(output_dir):
        os.rename(tmp, output_dir)
        return
    aside = tempfile.mkdtemp(prefix=_temporary_prefix(output_dir, _OLD) + pid, dir=parent)
    os.rename(output_dir, aside)  # replaces the empty directory mkdtemp made
    os.rename(tmp, output_dir)
    shutil.rmtree(aside)


def _modes_from_umask(directory: str) -> None:
    """Gives `directory` and everything in it the modes the umask gives new files.

    mkdtemp makes the directory 0700 and safetensors its file 0600, whatever the umask:
    an exported model was readable by its owner only.
    """
    probe = os.path.join(directory, ".umask-probe")
    os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    file_mode = stat.S_IMODE(os.stat(probe).st_mode)  # 0o666 less the umask
    os.remove(probe)
    dir_mode = file_mode | (file_mode & 0o444) >> 2  # searchable wherever readable
    for root, _dirs, files in os.walk(directory):
        os.chmod(root, dir_mode)
        for name in files:
            os.chmod(os.path.join(root, name), file_mode)
