"""The pretraining input of an experiment config: its streams, the data positions a
checkpoint stores, and the data settings those positions are valid for.

`train_input` is the one way a run (and a rollback) makes its training stream, so a resumed
run reads exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from bert_jax.config import ConfigError, objective


def max_instances_per_row(config: ml_collections.ConfigDict) -> int | None:
    """Instances packed per row (`config.data.pack`), or None for unpacked batches."""
    data = config.data
    return data.max_instances_per_row if data.get("pack", False) else None


# Room for a process's data position in the all-gather: ~40 bytes per stream it reads.
_POSITION_BYTES = 1 << 16


def gather_positions(position: dict) -> list[dict]:
    """Every process's data position (JSON, padded bytes through an all-gather)."""
    if jax.process_count() == 1:
        return [position]
    raw = json.dumps(position).encode()
    if len(raw) > _POSITION_BYTES:
        raise ValueError(f"data position too long to gather: {position}")
    buffer = np.zeros(_POSITION_BYTES, np.uint8)
    buffer[: len(raw)] = np.frombuffer(raw, np.uint8)
    gathered = multihost_utils.process_allgather(buffer)
    return [json.loads(bytes(row).rstrip(b"\0")) for row in np.asarray(gathered)]


class DataChangeError(ConfigError):
    """A workdir resumed with data its saved data position does not describe."""


# How `data_changes` names each key of a data identity: the flag that sets it.
_FLAGS = {
    "files": "data.train_files",
    "train_files": "data.train_files",
    "max_seq_length": "data.max_seq_length",
    "max_predictions_per_seq": "data.max_predictions_per_seq",
    "dynamic_masking": "data.dynamic_masking",
    "masked_lm_prob": "data.masked_lm_prob",
    "whole_word_mask": "data.whole_word_mask",
    "pack": "data.pack",
    "max_instances_per_row": "data.max_instances_per_row",
    "num_streams": "data.num_streams",
    "shuffle_buffer": "data.shuffle_buffer",
    "global_batch_size": "global_batch_size",
    "seed": "seed",
    "objective": "objective",
}


# Keys that mean something only when another is on: a change of the switch names it alone.
_DEPENDS = {
    "masked_lm_prob": "dynamic_masking",
    "whole_word_mask": "dynamic_masking",
    "max_instances_per_row": "pack",
}


def data_identity(config, num_streams: int | None = None) -> dict:
    """The data settings a saved data position is only valid for (JSON), keyed as `_FLAGS`.

    `files` fingerprints what `data.train_files` matches: each file's name and size, in the
    pipeline's order (a moved directory is the same data; records of another length or
    count are not). Masking rate and whole-word masking count only with dynamic masking
    (static records fix them), `max_instances_per_row` only when packing.

    Args:
        config: the experiment config.
        num_streams: the streams the pipeline really deals (a checkpoint stores them);
            None: `config.data.num_streams`, which None leaves to the saved position.
    """
    from data_pipelines import input_pipeline

    data = config.data
    dynamic, packed = data.dynamic_masking, data.get("pack", False)
    files = input_pipeline.list_files(data.train_files)
    sizes = _sizes(files)
    return {
        "train_files": data.train_files,
        "files": [[os.path.basename(f), n] for f, n in zip(files, sizes, strict=True)],
        "max_seq_length": data.max_seq_length,
        "max_predictions_per_seq": data.max_predictions_per_seq,
        "dynamic_masking": dynamic,
        "masked_lm_prob": data.masked_lm_prob if dynamic else None,
        "whole_word_mask": data.whole_word_mask if dynamic else None,
        "pack": packed,
        "max_instances_per_row": data.max_instances_per_row if packed else None,
        "num_streams": num_streams or data.get("num_streams"),
        "shuffle_buffer": data.shuffle_buffer,
        "global_batch_size": config.global_batch_size,
        "seed": config.seed,
        "objective": objective(config),
    }


def _sizes(files: list[str]) -> list[int]:
    import tensorflow as tf

    with concurrent.futures.ThreadPoolExecutor(16) as pool:  # one request each on gs://
        return list(pool.map(lambda f: int(tf.io.gfile.stat(f).length), files))


def data_changes(saved: dict | None, now: dict) -> list[tuple[str, Any, Any]]:
    """Where data identity `now` differs from `saved` (a checkpoint's; None: saved before
    identities were): [(flag, saved value, value now)], in `_FLAGS` order.

    An identity saved before a key existed is compared on the keys it holds (`train_files`
    as the glob string where it has no `files`); absent `objective` and
    `max_instances_per_row` were the defaults of their day ("mlm_nsp", unpacked). A
    `num_streams` of None now takes the saved one, so it is no change. Masking rate and
    slots are not named beside a change of the switch that gives them a meaning.
    """
    if saved is None:
        return []
    saved = {"objective": "mlm_nsp", "max_instances_per_row": None} | saved
    saved.setdefault("pack", saved["max_instances_per_row"] is not None)
    compared = [k for k in _FLAGS if k in saved and k in now]
    if "files" in compared:
        compared.remove("train_files")  # the globs may move; the files they match decide
    changes = []
    for key in compared:
        was, value = saved[key], now[key]
        if key == "num_streams" and value is None:
            continue
        if _DEPENDS.get(key) in compared and saved[_DEPENDS[key]] != now[_DEPENDS[key]]:
            continue  # named as the switch that gives it a meaning
        if key == "files":
            was, value = _files_change(was, value, saved.get("train_files"), now["train_files"])
        elif key == "train_files":  # as `_files_change` shows them
            was, value = repr(was), repr(value)
        if was != value:
            changes.append((_FLAGS[key], was, value))
    return changes


def _files_change(saved: list, now: list, saved_glob, glob) -> tuple[str, str]:
    """Both sides of a change of the files `data.train_files` matches, in a few words: the
    globs, the file counts and the first files that differ (equal strings: no change)."""
    saved, now = [tuple(f) for f in saved], [tuple(f) for f in now]
    if saved == now:
        return "", ""

    def side(glob, files, other):
        differing = [f"{name} ({size} bytes)" for name, size in files if (name, size) not in other]
        shown = ", ".join(differing[:3]) + (", ..." if len(differing) > 3 else "")
        return f"{glob!r} ({len(files)} files{'; ' + shown if shown else ''})"

    return side(saved_glob, saved, set(now)), side(glob, now, set(saved))


def describe_changes(changes: list[tuple[str, Any, Any]]) -> str:
    """'--config.data.max_seq_length: saved 128, now 512; ...'."""
    return "; ".join(
        f"--config.{flag}: saved {was if flag == 'data.train_files' else repr(was)}, "
        f"now {now if flag == 'data.train_files' else repr(now)}"
        for flag, was, now in changes
    )


def check_eval_apart(config) -> None:
    """Refuses `data.train_files` and `data.eval_files` that match the same file (by real
    path: `records/*` matches the held-out records too), naming it, unless
    `data.allow_eval_in_train`: the held-out loss would be measured on training data.

    Raises:
        ConfigError: naming the file and both keys.
    """
    from bert_jax.config import ConfigError
    from data_pipelines import input_pipeline

    data = config.data
    if not data.eval_files or data.get("allow_eval_in_train", False):
        return
    train = {os.path.realpath(f): f for f in input_pipeline.list_files(data.train_files)}
    shared = [f for f in input_pipeline.list_files(data.eval_files) if os.path.realpath(f) in train]
    if shared:
        raise ConfigError(
            f"--config.data.train_files={data.train_files!r} and --config.data.eval_files="
            f"{data.eval_files!r} both match {shared[0]}"
            f"{f' (and {len(shared) - 1} more)' if len(shared) > 1 else ''}: the held-out "
            "records would be trained on. Narrow the patterns, or set "
            "--config.data.allow_eval_in_train=True if this is meant"
        )


def make_input(config, position, *, files, seed, mask_config, num_streams=None):
    """The stream of `files` as `config` reads it, refusing records made with another
    vocabulary than `data.vocab_file` (their stats JSON's fingerprint; unless
    `data.allow_vocab_change`) or cased otherwise than `data.do_lower_case` and, at the first
    batch holding one, an id outside it."""
    from data_pipelines import input_pipeline

    data = config.data
    allow = data.get("allow_vocab_change", False)  # configs older than the key: refused
    patterns = files if isinstance(files, str) else tuple(files)
    _check_records_vocab(patterns, data.vocab_file, allow, data.do_lower_case)
    return input_pipeline.make_pretraining_dataset(
        files,
        num_streams=num_streams,
        global_batch_size=config.global_batch_size,
        max_seq_length=data.max_seq_length,
        max_predictions_per_seq=data.max_predictions_per_seq,
        seed=seed,
        shuffle_buffer=data.shuffle_buffer,
        dynamic_masking=data.dynamic_masking,
        masking_config=mask_config,
        start_position=position,
        max_instances_per_row=max_instances_per_row(config),
        next_token_targets=objective(config) == "ltr",
        vocab_size=_vocab_size(data.vocab_file, data.do_lower_case),
    )


@functools.cache
def _check_records_vocab(files, vocab_file: str, allow: bool, do_lower_case: bool) -> None:
    """Once per run, not at each evaluation (a stats JSON in a bucket is a request)."""
    from data_pipelines import vocab_fingerprint

    vocab_fingerprint.check_records_vocab(files, vocab_file, allow, do_lower_case)


@functools.cache
def _vocab_size(vocab_file: str, do_lower_case: bool) -> int:
    """Tokens in the run's vocabulary: its ids are [0, this) (a rollback asks again)."""
    from data_pipelines.tokenization import load_tokenizer

    return load_tokenizer(vocab_file, do_lower_case=do_lower_case).vocab_size


def train_input(config, position, mask_config):
    """The training stream of `config` from a data position (None: its start)."""
    data = config.data
    return make_input(
        config,
        position,
        files=data.train_files,
        seed=config.seed,
        mask_config=mask_config,
        num_streams=data.get("num_streams"),
    )


# The held-out masking rate of configs without `data.eval_masked_lm_prob`: BERT's 15%, so
# that runs training at another rate (ModernBERT's and MosaicBERT's 30%) stay comparable.
EVAL_MASKED_LM_PROB = 0.15


def masking_config(config, tokenizer, masked_lm_prob: float | None = None):
    """The dynamic masking of `config` (None: static records, or "ltr"), at `masked_lm_prob`
    (None: the training rate, `data.masked_lm_prob`)."""
    if not config.data.dynamic_masking or objective(config) == "ltr":  # "ltr" masks nothing
        return None
    from data_pipelines import masking

    return masking.MaskingConfig(
        vocab_size=tokenizer.vocab_size,
        mask_id=tokenizer.mask_id,
        special_ids=(tokenizer.cls_id, tokenizer.sep_id),
        replacement_ids=tuple(tokenizer.replacement_ids.tolist()),
        max_predictions_per_seq=config.data.max_predictions_per_seq,
        masked_lm_prob=masked_lm_prob or config.data.masked_lm_prob,
        whole_word=config.data.whole_word_mask,
    )


def eval_input(config, tokenizer):
    """The held-out stream of `config` (`data.eval_files`) from its start, masked (dynamic
    masking) at `data.eval_masked_lm_prob` whatever the training rate. The rate is not part
    of `data_identity`: no saved position depends on it."""
    rate = config.data.get("eval_masked_lm_prob") or EVAL_MASKED_LM_PROB
    return make_input(
        config,
        None,
        files=config.data.eval_files,
        seed=0,
        mask_config=masking_config(config, tokenizer, rate),
    )


def data_position(positions: list[dict]) -> dict:
    """What the input pipeline resumes from, of the positions every process saved: one
    position of every stream, so that any process count can resume it."""
    from data_pipelines import input_pipeline

    return input_pipeline.merge_positions(positions)
