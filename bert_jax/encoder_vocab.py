"""The vocabulary and casing an encoder was made with, read from what its directory saved,
for every tool that tokenizes text for it: fine-tuning (`finetune_common.load_task_model`),
`experiments.embed` and `experiments.extract_features`.

Token ids mean text only under the casing they were made with: a cased encoder fed
lower-cased text (or the reverse) runs without an error and reads other words. So the
casing is taken from the model (`saved_casing`: a fine-tuned checkpoint's finetuned.json, a
tokenizer_config.json, a pretraining checkpoint's saved vocabulary fingerprint), a flag that
says otherwise is refused naming both (`resolve_casing`), and a vocabulary other than the
one the model saved is refused naming both files (`check_model_vocab`). A fine-tuned model
records the casing it was trained with (`with_casing` into finetuned.json, `write_casing`
as a tokenizer_config.json beside its vocabulary).
"""

from __future__ import annotations

import json
import logging
import os

from data_pipelines import paths, vocab_fingerprint

log = logging.getLogger(__name__)

FINETUNED_FILE = "finetuned.json"  # finetune_common.save_finetuned's record


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _train_state_config(path: str) -> dict:
    """The experiment config saved with the newest readable checkpoint `path` names, or {}
    (not a pretraining workdir or checkpoint directory)."""
    if not os.path.isdir(path):
        return {}
    from bert_jax import checkpointing

    found = checkpointing.find_checkpoints(path)
    if found is None:
        return {}
    manager = checkpointing.make_manager(found[0], async_save=False, create=False)
    try:
        return checkpointing.saved_config(manager, found[1]) or {}
    except Exception:  # noqa: BLE001 - an unreadable config: loading the weights says why
        return {}
    finally:
        manager.close()


def saved_casing(path: str) -> tuple[bool | None, str]:
    """(`do_lower_case` the model at `path` was made with, the file that records it), or
    (None, "") where nothing records it (a Google TF checkpoint, a directory without a
    tokenizer_config.json, a checkpoint older than the record).

    Looked for in order: a fine-tuned checkpoint's finetuned.json (`path` or
    `path/checkpoint`), a tokenizer_config.json in the directory (or beside a checkpoint
    prefix), a pretraining checkpoint's saved vocabulary fingerprint, and for a fine-tuned
    checkpoint that records none, the casing of the encoder it started from (`init_from`).
    """
    from bert_jax.convert import locations
    from bert_jax.convert.names import ConversionError

    seen: set[str] = set()
    while path and len(seen) < 8:
        real = os.path.realpath(path)
        if real in seen or "://" in path:
            break
        seen.add(real)
        started_from = None
        for directory in (path, os.path.join(path, "checkpoint")):
            meta_path = locations.model_file(directory, FINETUNED_FILE)  # never a link out
            if meta_path and os.path.isfile(meta_path):
                meta = _read_json(meta_path)
                if isinstance(meta.get("do_lower_case"), bool):
                    return meta["do_lower_case"], meta_path
                path, started_from = directory, meta.get("init_from")
                break
        for candidate in dict.fromkeys([path, _model_dir(path)]):  # a s-t module's folder too
            directory = candidate if os.path.isdir(candidate) else os.path.dirname(candidate)
            where = os.path.join(directory, "tokenizer_config.json")
            try:
                lower = vocab_fingerprint.configured_lower_case(candidate)
            except paths.LinkOutsideError as error:  # a stranger's casing is not the model's
                raise ConversionError(str(error)) from None
            except (ValueError, AttributeError) as error:  # not JSON, or not an object
                raise ValueError(f"{where}: not a JSON object ({error})") from None
            if lower is not None:
                return lower, where
        saved = _train_state_config(path).get("vocab_fingerprint") or {}
        if isinstance(saved.get("do_lower_case"), bool):
            return saved["do_lower_case"], f"the vocabulary fingerprint saved in {path}"
        if not isinstance(started_from, str):
            break
        path = started_from  # a fine-tune records none: its encoder's, as it was refused else
    return None, ""


def _model_dir(path: str) -> str:
    """Where the weights of the model at `path` are (`convert.locations.resolve`: a
    sentence-transformers directory's module folder), else `path`."""
    from bert_jax.convert import locations

    try:
        return locations.resolve(path)
    except ValueError:  # two models in one directory: loading it says so
        return path


def _casing(lower: bool) -> str:
    return "lower-cased (do_lower_case=True)" if lower else "cased (do_lower_case=False)"


def resolve_casing(model: str, given: bool | None, vocab_file: str | None, flag: str) -> bool:
    """The `do_lower_case` a tool reads text for `model` with: `given` (the flag's value) or
    else the model's recorded one (`saved_casing`), else True (BERT's and transformers'
    default). A tokenizer.json normalises by its own rules: `given` or True, unchecked.

    Raises:
        vocab_fingerprint.CasingMismatchError: `given` is not the model's recorded casing;
            names the flag, both casings and the file that records the model's.
    """
    if vocab_file and is_tokenizer_json(vocab_file):
        return True if given is None else bool(given)
    lower, where = saved_casing(model)
    if given is not None and lower is not None and bool(given) != lower:
        raise vocab_fingerprint.CasingMismatchError(
            f"{flag}={given}, but the encoder in {model} was made {_casing(lower)} ({where}): "
            f"its ids would stand for other text. Leave {flag} unset to read text as it was "
            "made"
        )
    if given is not None:
        return bool(given)
    if lower is None:
        log.info("do_lower_case=True: nothing in %s records its casing (set %s if it is "
                 "cased)", model, flag)  # fmt: skip
        return True
    log.info("do_lower_case=%s: the casing %s was made with (%s)", lower, model, where)
    return lower


def is_tokenizer_json(vocab_file: str) -> bool:
    """Whether `vocab_file` (or the vocabulary in the directory it names) is a
    tokenizer.json, whose own normalizer decides the casing."""
    try:
        return os.path.basename(vocab_fingerprint.vocab_path(vocab_file)) == "tokenizer.json"
    except (FileNotFoundError, OSError):
        return False


def saved_fingerprint(model: str) -> dict | None:
    """The vocabulary `model` was made with, as a `vocab_fingerprint.fingerprint`: the one a
    pretraining checkpoint saved, else that of the vocabulary file in its directory (or in
    its `checkpoint/`); None where it has neither."""
    saved = _train_state_config(model).get("vocab_fingerprint")
    if saved:
        return saved
    for directory in (model, os.path.join(model, "checkpoint")):
        if not os.path.isdir(directory):
            continue
        try:
            return vocab_fingerprint.fingerprint(vocab_fingerprint.vocab_path(directory))
        except FileNotFoundError:
            continue
    return None


def check_model_vocab(model: str, vocab_file: str, flag: str = "--vocab_file") -> None:
    """Refuses a `vocab_file` given for `model` that is not the vocabulary the model was made
    with (`saved_fingerprint`): one of the same size reads without an error, and its ids
    mean other tokens.

    Raises:
        vocab_fingerprint.VocabMismatchError: naming both files.
    """
    saved = saved_fingerprint(model)
    if not saved:
        return
    now = vocab_fingerprint.fingerprint(vocab_file)
    if os.path.dirname(os.path.realpath(now["file"])) in {
        os.path.realpath(d) for d in (model, os.path.join(model, "checkpoint"))
    } and not _train_state_config(model):
        return  # a tokenizer file of the model's own directory (tokenizer.json beside vocab.txt)
    if now["sha256"] != saved.get("sha256"):
        raise vocab_fingerprint.VocabMismatchError(
            f"{flag}={vocab_file} is not the vocabulary {model} was made with "
            f"({saved.get('file')}, sha256 {str(saved.get('sha256'))[:12]}... vs "
            f"{now['sha256'][:12]}...): the same ids would mean other tokens. Leave {flag} "
            "unset to read the model's own"
        )


def with_casing(metadata: dict, vocab_file: str | None) -> dict:
    """A fine-tuned model's `metadata` (finetuned.json) with the `do_lower_case` it reads
    text with: its own, else the one recorded for the encoder it started from (`init_from`;
    fine-tuning refuses another)."""
    if isinstance(metadata.get("do_lower_case"), bool) or not metadata.get("init_from"):
        return metadata
    if vocab_file and is_tokenizer_json(vocab_file):
        return metadata  # its own normalizer decides
    lower, _ = saved_casing(metadata["init_from"])
    return metadata if lower is None else {**metadata, "do_lower_case": lower}


def write_casing(directory: str, lower: bool | None) -> None:
    """A tokenizer_config.json saying `lower` in a model `directory` whose vocab.txt or
    .model has none, so that `embed`, `convert` and transformers read text with the casing
    the model was trained with."""
    path = os.path.join(directory, "tokenizer_config.json")
    if not isinstance(lower, bool) or os.path.exists(path):
        return
    if os.path.exists(os.path.join(directory, "tokenizer.json")):
        return  # its own normalizer decides
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"do_lower_case": lower}, f, indent=2)
        f.write("\n")
