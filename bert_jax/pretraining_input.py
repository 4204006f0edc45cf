"""The pretraining input of an experiment config: its streams, the data positions a
checkpoint stores, and the data settings those positions are valid for.

`train_input` is the one way a run (and a rollback) makes its training stream, so a resumed
run reads exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import json

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from bert_jax.config import objective


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


def data_identity(config) -> dict:
    """The data settings a saved data position is only valid for."""
    data = config.data
    identity = {
        "train_files": data.train_files,
        "max_seq_length": data.max_seq_length,
        "max_predictions_per_seq": data.max_predictions_per_seq,
        "dynamic_masking": data.dynamic_masking,
        "global_batch_size": config.global_batch_size,
        "seed": config.seed,
    }
    if data.get("pack", False):  # only a packed run names it: unpacked identities stay as saved
        identity["max_instances_per_row"] = data.max_instances_per_row
    if objective(config) != "mlm_nsp":  # likewise: BERT's identities stay as saved
        identity["objective"] = objective(config)
    return identity


def make_input(config, position, *, files, seed, mask_config, num_streams=None):
    from data_pipelines import input_pipeline

    data = config.data
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
    )


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


def masking_config(config, tokenizer):
    if not config.data.dynamic_masking or objective(config) == "ltr":  # "ltr" masks nothing
        return None
    from data_pipelines import masking

    return masking.MaskingConfig(
        vocab_size=tokenizer.vocab_size,
        mask_id=tokenizer.mask_id,
        special_ids=(tokenizer.cls_id, tokenizer.sep_id),
        max_predictions_per_seq=config.data.max_predictions_per_seq,
        masked_lm_prob=config.data.masked_lm_prob,
        whole_word=config.data.whole_word_mask,
    )


def data_position(positions: list[dict]) -> dict:
    """What the input pipeline resumes from, of the positions every process saved: one
    position of every stream, so that any process count can resume it."""
    from data_pipelines import input_pipeline

    return input_pipeline.merge_positions(positions)
