"""Which vocabulary records were made with: a fingerprint in their stats JSON, checked by
the runs that read them (`check_records_vocab`).

Records hold token ids, not tokens: read with another vocabulary of the same size they train
without an error, on text that means nothing. `create_pretraining_data` writes
`fingerprint(vocab_file)` into `<first shard>.stats.json` ("vocab"); training, evaluation
and fine-tuning compare it with the vocabulary they are given and refuse another one, naming
both files, unless the config says the change is meant (`data.allow_vocab_change`).
Records whose stats have no fingerprint (made before it existed) are read as before, with a
log line.
"""

from __future__ import annotations

import hashlib
import logging
import os

from data_pipelines import tfrecord_files

log = logging.getLogger(__name__)

# Files that hold a tokenizer's vocabulary in a model directory, in the order looked for.
VOCAB_NAMES = ("vocab.txt", "tokenizer.json", "spiece.model", "sentencepiece.model")


class VocabMismatchError(ValueError):
    """Records (or a checkpoint) made with another vocabulary than the run's; names both."""


def _gfile():
    # TensorFlow for URLs only (gs://): create_pretraining_data never imports it otherwise.
    import tensorflow as tf

    return tf.io.gfile


def vocab_path(path: str) -> str:
    """`path`, or for a directory the vocabulary file in it (`VOCAB_NAMES`)."""
    url = "://" in path
    if not (_gfile().isdir(path) if url else os.path.isdir(path)):
        return path
    for name in VOCAB_NAMES:
        found = os.path.join(path, name)
        if _gfile().exists(found) if url else os.path.exists(found):
            return found
    raise FileNotFoundError(f"{path}: no vocabulary file in it ({', '.join(VOCAB_NAMES)})")


def fingerprint(path: str) -> dict[str, str]:
    """{"file": the vocabulary file, "sha256": of its bytes} (a directory: its vocab file)."""
    path = vocab_path(path)
    digest = hashlib.sha256()
    with _gfile().GFile(path, "rb") if "://" in path else open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return {"file": path, "sha256": digest.hexdigest()}


def records_fingerprints(file_patterns) -> dict[str, dict | None]:
    """{stats JSON: its "vocab" fingerprint, or None when it has none} of the record sets
    whose files `file_patterns` match: every file's own set, found by its name in the stats
    (`tfrecord_files.stats_of`), not only the set of each directory's first shard. Files that
    no stats JSON names (the original tool's records) are named in a warning: their
    vocabulary cannot be checked."""
    from data_pipelines import input_pipeline

    files = input_pipeline.list_files(file_patterns)
    stats, unnamed = tfrecord_files.stats_of(files)
    if unnamed:
        log.warning(
            "%d record file(s) with no stats JSON naming them (%s%s): the vocabulary they were "
            "made with is not known, not checked",
            len(unnamed),
            ", ".join(unnamed[:3]),
            ", ..." if len(unnamed) > 3 else "",
        )
    return {path: contents.get("vocab") for path, contents in stats.items()}


def check_same_vocab(
    made_with: dict | None, vocab_file: str, what: str, allow_key: str, allow: bool
) -> None:
    """Refuses `vocab_file` when `made_with` (a `fingerprint`) names another vocabulary.

    Args:
        made_with: the fingerprint `what` was made with; None: not recorded (log line).
        vocab_file: the vocabulary the run reads `what` with.
        what: what was made with it, for the message ("the records in ...").
        allow_key: the config key that says the change is meant.
        allow: its value: True logs a warning instead of raising.

    Raises:
        VocabMismatchError: naming both vocabulary files and `allow_key`.
    """
    if made_with is None:
        log.warning("%s: no vocabulary fingerprint saved (made before it was): not checked", what)
        return
    now = fingerprint(vocab_file)
    if now["sha256"] == made_with.get("sha256"):
        return
    message = (
        f"{what}: made with the vocabulary {made_with.get('file')} (sha256 "
        f"{str(made_with.get('sha256'))[:12]}...), but this run's is {now['file']} (sha256 "
        f"{now['sha256'][:12]}...); the same ids would mean other tokens"
    )
    if allow:
        log.warning("%s (%s=True: going on)", message, allow_key)
        return
    raise VocabMismatchError(f"{message}. Set --config.{allow_key}=True if this is meant")


def check_records_vocab(file_patterns, vocab_file: str, allow: bool = False) -> None:
    """`check_same_vocab` for every record set `file_patterns` match, whose stats JSON names
    the vocabulary it was made with (`data.allow_vocab_change`: `allow`)."""
    for stats_path, made_with in records_fingerprints(file_patterns).items():
        what = f"the records of {stats_path.removesuffix(tfrecord_files.STATS_SUFFIX)}"
        check_same_vocab(made_with, vocab_file, what, "data.allow_vocab_change", allow)
