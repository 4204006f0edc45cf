"""Where a model's files are: the one rule for links inside a model directory, and the one
resolver of a model location that every tool taking a model goes through.

A model directory reads only its own files (`model_file`; the rule is
`data_pipelines.paths.check_inside`'s, which the tokenizers apply too): a file that is a
symlink (or lies under one) is followed when its real path stays inside the directory, or, in a
Hugging Face cache snapshot (`.../models--<name>/snapshots/<rev>/`, whose files are links
to `../../blobs/<hash>`), inside that model's `blobs/`; any other target is refused, naming
the file and where it leads, so that nothing from outside is read into, or copied with, a
model (a `special_tokens_map.json` or `vocab.txt` linked to a stranger's file).

`tokenizer_files` are the tokenizer files of a model directory that travel with its
exports, and `copy_files` copies them (refusing a config file that is not JSON).

`resolve(path)` is the directory (or checkpoint prefix) whose weights a model location
means: a workdir of a fine-tuning run (`<workdir>/checkpoint/`, the params-only Orbax
directory it saves), a sentence-transformers directory (its Transformer module's
directory), a pretraining workdir (its `checkpoints/`), else the path itself (a Hugging
Face directory, a params-only Orbax directory, a Google TF checkpoint, a checkpoint step,
which `readers.detect_format` tells apart). `convert`, `embed`, `extract_features` and
every `init_from` read a model through it (`readers.open_source`, `train_loop`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence

from bert_jax.convert.names import ConversionError
from data_pipelines import paths
from data_pipelines.paths import cache_blobs  # noqa: F401 - the rule's, importable here too

# What a fine-tuning run leaves in its workdir: `finetune_common.save_finetuned`'s directory.
FINETUNED_DIR = "checkpoint"
FINETUNED_FILE = "finetuned.json"


def check_inside(directory: str, path: str, what: str | None = None) -> str:
    """`path` (a file of model directory `directory`), refused unless its real path is
    inside the directory or, for a Hugging Face cache snapshot, inside the model's blobs/
    (`data_pipelines.paths.check_inside`).

    Raises:
      ConversionError: one line naming the file (`what`, default `path`) and its target.
    """
    return paths.check_inside(directory, path, what, error=ConversionError)


def check_index_entry(directory: str, name: object, index: str) -> None:
    """Refuses a weight file an index names outside its model directory (an absolute path,
    `..`, or a symlink out of it, but into a Hugging Face cache's blobs/: `locations`)."""
    if not isinstance(name, str) or not name:
        raise ConversionError(f"{index}: weight_map names {name!r}, not a file name")
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or ".." in parts:
        raise ConversionError(
            f"{index}: weight_map names {name!r}, outside the model directory {directory}; "
            "an index may name only files inside its own directory"
        )
    path = os.path.join(directory, name)
    check_inside(directory, path, f"{index}: weight_map's {name!r} ({path})")


def check_tree(directory: str, path: str) -> None:
    """`check_inside` for `path` and, where it is a directory (an Orbax `params/`), every
    file and directory under it."""
    check_inside(directory, path)
    for parent, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            check_inside(directory, os.path.join(parent, name))


def model_file(directory: str, name: str) -> str | None:
    """`directory/name` if it exists (`check_inside`: never a link out), else None."""
    return paths.model_file(directory, name, error=ConversionError)


def _holds_own_model(path: str) -> bool:
    """Whether directory `path` holds weights itself (any format `detect_format` reads)."""
    from bert_jax import checkpoint_reading

    names = os.listdir(path)
    return (
        os.path.exists(os.path.join(path, "params", "_CHECKPOINT_METADATA"))
        or any(n.startswith("model.safetensors") or n.endswith(".index") for n in names)
        or checkpoint_reading.find_checkpoints(path) is not None
    )


def finetuned_dir(path: str) -> str | None:
    """`path/checkpoint` where `path` is a fine-tuning workdir holding a saved model."""
    nested = os.path.join(path, FINETUNED_DIR)
    if os.path.isfile(os.path.join(nested, FINETUNED_FILE)) or os.path.exists(
        os.path.join(nested, "params", "_CHECKPOINT_METADATA")
    ):
        return nested
    return None


def resolve(path: str | os.PathLike) -> str:
    """The directory (or checkpoint prefix) holding the weights of the model at `path`.

    Every tool that takes a model reads `path` through here, so that the same locations
    work everywhere: a fine-tuning workdir (its `checkpoint/`), a sentence-transformers
    directory (its Transformer module's directory), a pretraining workdir (its
    `checkpoints/`), and as they are a Hugging Face directory, a params-only Orbax
    directory, a TF checkpoint, a checkpoint step directory.

    Raises:
      ConversionError: a directory that holds a model of its own and a fine-tuned one in
        `checkpoint/` (which is meant is not for a tool to guess).
    """
    path = os.fspath(path)
    if "://" in path or not os.path.isdir(path):
        return path
    from bert_jax.convert import sentence_transformers

    settings = sentence_transformers.read_settings(path)
    if settings is not None:
        return settings.model_dir
    if os.path.isfile(os.path.join(path, FINETUNED_FILE)):
        return path  # a fine-tuned checkpoint itself
    nested = finetuned_dir(path)
    if nested is not None:
        if _holds_own_model(path):
            raise ConversionError(
                f"{path}: holds two models, its own and a fine-tuned one in {nested}; give "
                "the one meant (a directory is taken for a model only when it holds one)"
            )
        return nested
    from bert_jax import checkpoint_reading

    found = checkpoint_reading.find_checkpoints(path)  # a pretraining workdir: checkpoints/
    return found[0] if found is not None and found[1] is None else path


# A HF directory's tokenizer beside vocab.txt (ModernBERT's has no vocab.txt): copied as is.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def tokenizer_files(path: str | os.PathLike) -> list[str]:
    """The `TOKENIZER_FILES` in directory `path` (none for a checkpoint prefix or a file)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return []
    return [found for name in TOKENIZER_FILES if (found := model_file(path, name))]


def copy_files(directory: str, vocab_file: str | None, tokenizer: Sequence[str]) -> None:
    """Copies `vocab_file` (a vocab.txt as vocab.txt, a .model under its name, a
    tokenizer.json with its config files) and the `tokenizer` files into `directory`.

    Raises:
      ConversionError: a tokenizer config file (tokenizer_config.json,
        special_tokens_map.json) that is not a JSON object, or one beside a tokenizer.json
        that links out of its directory; nothing is copied then.
    """
    from data_pipelines import tokenization

    copies = tokenization.files_to_copy(vocab_file) if vocab_file else []
    for source, _ in copies:
        if source != vocab_file:  # a tokenizer.json's config files, of its directory
            check_inside(os.path.dirname(vocab_file), source)
    copies += [(path, os.path.basename(path)) for path in tokenizer]
    for source, name in copies:
        if name.endswith(".json") and name != tokenization.HF_NAME:
            _json_object(source)
    for source, name in copies:
        shutil.copyfile(source, os.path.join(directory, name))


def _json_object(path: str) -> dict:
    """The JSON object in `path`; anything else is a ConversionError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        reason = str(error).splitlines()[0]
        raise ConversionError(f"{path}: not valid JSON ({reason})") from None
    if not isinstance(data, dict):
        raise ConversionError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data
