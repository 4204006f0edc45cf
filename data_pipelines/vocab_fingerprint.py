"""Which vocabulary records were made with: a fingerprint in their stats JSON, checked by
the runs that read them (`check_records_vocab`).

Records hold token ids, not tokens: read with another vocabulary of the same size they train
without an error, on text that means nothing. `create_pretraining_data` writes
`fingerprint(vocab_file)` into `<first shard>.stats.json` ("vocab"); training, evaluation
and fine-tuning compare it with the vocabulary they are given and refuse another one, naming
both files, unless the config says the change is meant (`data.allow_vocab_change`).
Records whose stats have no fingerprint (made before it existed) are read as before, with a
log line.

The text's normalisation is part of the vocabulary's identity: `fingerprint(vocab_file,
do_lower_case)` adds the casing where the file leaves it to the caller. A WordPiece vocab.txt
with `do_lower_case` lower-cases and strips accents (BERT's rules), so both are recorded; a
sentencepiece `.model` lower-cases only (`str.lower`; its own normalizer is in its bytes); a
tokenizer.json ignores `do_lower_case` (its normalizer, in the hashed bytes, decides), so its
fingerprint records none. Records lower-cased for a cased run (or the reverse) are refused
(`CasingMismatchError`), naming their stats JSON, both casings and the flag that fixes it;
records whose stats predate the casing field are read with a warning.
"""

from __future__ import annotations

import hashlib
import logging
import os

from data_pipelines import paths, tfrecord_files

log = logging.getLogger(__name__)

# Files that hold a tokenizer's vocabulary in a model directory, in the order looked for.
VOCAB_NAMES = ("vocab.txt", "tokenizer.json", "spiece.model", "sentencepiece.model")


class VocabMismatchError(ValueError):
    """Records (or a checkpoint) made with another vocabulary than the run's; names both."""


class CasingMismatchError(VocabMismatchError):
    """Records (or a checkpoint) made with text cased otherwise than the run reads it."""


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


def fingerprint(path: str, do_lower_case: bool | None = None) -> dict:
    """{"file": the vocabulary file, "sha256": of its bytes} (a directory: its vocab file),
    and with `do_lower_case` given, the casing it applies to this file (`normalization`)."""
    path = vocab_path(path)
    with _gfile().GFile(path, "rb") if "://" in path else open(path, "rb") as f:
        data = f.read()
    found = {"file": path, "sha256": hashlib.sha256(data).hexdigest()}
    if do_lower_case is not None:
        found |= normalization(path, data, do_lower_case)
    return found


def normalization(path: str, data: bytes, do_lower_case: bool) -> dict[str, bool]:
    """{"do_lower_case", "strip_accents"} as the tokenizer file at `path` (holding `data`)
    applies them: a vocab.txt strips accents exactly when it lower-cases (BERT's
    BasicTokenizer); a `.model` lower-cases only; a tokenizer.json: {} (its own normalizer,
    part of its bytes, decides and `do_lower_case` is ignored)."""
    from data_pipelines import tokenization

    kind = tokenization.tokenizer_kind(path, data)
    if kind == "hf":
        return {}
    lower = bool(do_lower_case)
    return {"do_lower_case": lower, "strip_accents": lower and kind == "wordpiece"}


def configured_lower_case(path: str) -> bool | None:
    """`do_lower_case` of the tokenizer_config.json in the directory `path` (or beside the
    file `path`); None where there is none, or it does not say.

    Raises:
      paths.LinkOutsideError: the file links out of that directory (`paths.check_inside`).
    """
    if "://" in path:
        return None
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config = paths.model_file(directory, "tokenizer_config.json")
    if config is None or not os.path.isfile(config):
        return None
    import json

    with open(config, encoding="utf-8") as f:
        value = json.load(f).get("do_lower_case")
    return None if value is None else bool(value)


def _casing(found: dict) -> str:
    if not found["do_lower_case"]:
        return "cased (do_lower_case=False)"
    accents = ", accents stripped" if found.get("strip_accents") else ""
    return f"lower-cased{accents} (do_lower_case=True)"


def check_same_casing(made_with: dict | None, now: dict, what: str, fix: str) -> None:
    """Refuses a run whose casing (`now`, a `fingerprint` with casing) is not `made_with`'s.

    Args:
        made_with: the fingerprint `what` was made with; None or without "do_lower_case"
            (made before the casing was recorded): a warning, not checked.
        now: the run's fingerprint; without "do_lower_case" (a tokenizer.json): nothing to
            check beyond its bytes.
        what: what was made, for the message.
        fix: the flag or config key that fixes it, for the message.

    Raises:
        CasingMismatchError: naming `what`, both casings and `fix`.
    """
    if "do_lower_case" not in now or made_with is None:
        return
    if "do_lower_case" not in made_with:
        log.warning(
            "%s: the casing it was made with is not recorded (made before it was): not "
            "checked against this run's, %s", what, _casing(now),
        )  # fmt: skip
        return
    keys = ("do_lower_case", "strip_accents")
    if all(bool(made_with.get(k)) == bool(now.get(k)) for k in keys):
        return
    raise CasingMismatchError(
        f"{what}: made {_casing(made_with)}, but this run reads text {_casing(now)}; "
        f"the same ids would stand for other text. {fix}"
    )


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
    made_with: dict | None,
    vocab_file: str,
    what: str,
    allow_key: str,
    allow: bool,
    do_lower_case: bool | None = None,
    casing_fix: str = "",
) -> None:
    """Refuses `vocab_file` when `made_with` (a `fingerprint`) names another vocabulary, or
    (with `do_lower_case` given) another casing of its text (`check_same_casing`).

    Args:
        made_with: the fingerprint `what` was made with; None: not recorded (log line).
        vocab_file: the vocabulary the run reads `what` with.
        what: what was made with it, for the message ("the records in ...").
        allow_key: the config key that says the change of vocabulary is meant.
        allow: its value: True logs a warning instead of raising.
        do_lower_case: the run's casing; None: not checked.
        casing_fix: what fixes a casing mismatch, for its message.

    Raises:
        VocabMismatchError: naming both vocabulary files and `allow_key`.
        CasingMismatchError: naming both casings and `casing_fix`.
    """
    if made_with is None:
        log.warning("%s: no vocabulary fingerprint saved (made before it was): not checked", what)
        return
    now = fingerprint(vocab_file, do_lower_case)
    if now["sha256"] != made_with.get("sha256"):
        message = (
            f"{what}: made with the vocabulary {made_with.get('file')} (sha256 "
            f"{str(made_with.get('sha256'))[:12]}...), but this run's is {now['file']} (sha256 "
            f"{now['sha256'][:12]}...); the same ids would mean other tokens"
        )
        if not allow:
            raise VocabMismatchError(f"{message}. Set --config.{allow_key}=True if this is meant")
        log.warning("%s (%s=True: going on)", message, allow_key)
    check_same_casing(made_with, now, what, casing_fix)


def records_casing_fix(do_lower_case: bool) -> str:
    """What fixes records cased otherwise than a run with `do_lower_case` reads text."""
    return (
        f"Remake them with create_pretraining_data --do_lower_case={str(do_lower_case).lower()}"
        f", or set --config.data.do_lower_case={not do_lower_case} if the model is meant to "
        "read text so"
    )


def check_records_vocab(
    file_patterns, vocab_file: str, allow: bool = False, do_lower_case: bool | None = None
) -> None:
    """`check_same_vocab` for every record set `file_patterns` match, whose stats JSON names
    the vocabulary it was made with (`data.allow_vocab_change`: `allow`), and with
    `do_lower_case` (`data.do_lower_case`) the casing."""
    for stats_path, made_with in records_fingerprints(file_patterns).items():
        what = f"the records of {stats_path.removesuffix(tfrecord_files.STATS_SUFFIX)}"
        if do_lower_case is not None:
            what += f" (stats {stats_path})"
        fix = "" if do_lower_case is None else records_casing_fix(do_lower_case)
        check_same_vocab(
            made_with, vocab_file, what, "data.allow_vocab_change", allow, do_lower_case, fix
        )
