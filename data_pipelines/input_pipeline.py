"""The pretraining input pipeline: per-host, deterministic, resumable tf.data.

Per host (JAX process) the stream is, epoch after epoch:

1. this host's files: the sorted union of the file patterns, every `process_count`-th file
   starting at `process_index` (file-level sharding, so hosts read disjoint data);
2. the files in an order shuffled per epoch, read interleaved, record by record;
3. a shuffle buffer, seeded per (seed, epoch, host);
4. per-host batches of `global_batch_size / process_count`, the last partial batch of each
   epoch dropped;
5. parsing, and in dynamic mode masking with a stateless seed derived from
   (seed, epoch, host, batch in epoch), so every epoch sees new masks and a resumed run
   sees the same masks as an uninterrupted one;
6. int32 ids/masks/positions/labels and float32 weights, prefetched.

Every random choice is a pure function of `seed` and the epoch, so the stream is fixed by
its arguments. Its **position** is `(epoch, batch_in_epoch)`: restoring from a saved
position re-reads only the records of the current epoch before the position (cheaply,
before parsing) and then yields exactly the batches the uninterrupted run would have.
Positions are per host: in a multi-host run each process saves its own.

Static mode reads masked records (`records.MASKED`: ours or the original BERT tool's);
dynamic mode reads unmasked records (`records.UNMASKED`) and makes the targets: masks, or
with `next_token_targets` (the "ltr" objective, a left-to-right LM) the next token of every
real position (`next_token_targets`, deterministic, no token masked). Either can be packed
(`max_instances_per_row`): the (masked) instances of this stream, in its order, are packed
into batches of as many rows by `data_pipelines.packing`, whose position adds the instances
of the current batch already packed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from data_pipelines import masking, packing, records, tfrecord_files

# Salts that keep the seeds of different random choices apart.
_FILE_ORDER_SALT = 1
_SHUFFLE_SALT = 2
_MASK_SALT = 3

# Keys carried along each batch so the iterator knows its position; stripped before yield.
_EPOCH_KEY = "_epoch"
_BATCH_KEY = "_batch_in_epoch"


def list_files(file_patterns: str | Sequence[str]) -> list[str]:
    """Sorted, de-duplicated files matching comma-separated patterns or a list of them.

    A writer's hidden temporaries (`tfrecord_files.is_temporary`, which `tf.io.gfile.glob`
    matches with `dir/*`) are never input.

    Raises:
        FileNotFoundError: a pattern matches no file.
        ValueError: a file belongs to a shard set whose writer is renaming it into place,
            or was killed while doing so (`tfrecord_files.check_shard_set`).
    """
    if isinstance(file_patterns, str):
        file_patterns = [file_patterns]
    patterns = [p for entry in file_patterns for p in entry.split(",") if p]
    if not patterns:
        raise FileNotFoundError("no input file pattern given")
    files = set()
    for pattern in patterns:
        matched = [f for f in tf.io.gfile.glob(pattern) if not tfrecord_files.is_temporary(f)]
        if not matched:
            raise FileNotFoundError(f"input pattern {pattern!r} matches no file")
        files.update(matched)
    tfrecord_files.check_shard_set(sorted(files))
    return sorted(files)


def host_files(files: Sequence[str], process_index: int, process_count: int) -> list[str]:
    """The files process `process_index` of `process_count` reads.

    Raises:
        ValueError: fewer files than processes (a host would get no data; write at least
            as many shards as hosts, e.g. `--num_output_shards`).
    """
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if len(files) < process_count:
        raise ValueError(
            f"{len(files)} input files for {process_count} processes: every host needs at "
            f"least one file; write at least {process_count} shards"
        )
    return list(files[process_index::process_count])


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """Everything that fixes the stream; saved with the position to catch mismatches."""

    files: tuple[str, ...]  # this host's files, in global sorted order
    per_host_batch: int
    max_seq_length: int
    max_predictions_per_seq: int
    seed: int
    process_index: int
    process_count: int
    shuffle_buffer: int
    cycle_length: int
    masking: masking.MaskingConfig | None  # None: static (pre-masked records) or next_token
    compression: str | None
    next_token: bool = False  # unmasked records, next-token targets (the "ltr" objective)

    @property
    def unmasked(self) -> bool:
        """Reads unmasked records (dynamic masking or next-token targets)."""
        return self.masking is not None or self.next_token


def initial_position() -> dict[str, int]:
    """The position of a fresh run: the first batch of epoch 0."""
    return {"epoch": 0, "batch_in_epoch": 0}


def _seed_int64(seed: tf.Tensor) -> tf.Tensor:
    """A scalar int64 (for `Dataset.shuffle`) drawn from a stateless seed."""
    return tf.random.stateless_uniform(
        [], seed, minval=None, maxval=None, dtype=tf.int64, alg=masking.RNG_ALG
    )


def _records_of_epoch(spec: PipelineSpec, epoch: tf.Tensor) -> tf.data.Dataset:
    """This host's serialised records of one epoch, shuffled, as (record,) elements."""
    order_seed = masking.example_seed(spec.seed, _FILE_ORDER_SALT, epoch, spec.process_index)
    scores = tf.random.stateless_uniform([len(spec.files)], order_seed, alg=masking.RNG_ALG)
    order = tf.argsort(scores, stable=True)
    files = tf.gather(tf.constant(spec.files, tf.string), order)
    serialized = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=spec.compression or ""),
        cycle_length=min(spec.cycle_length, len(spec.files)),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    shuffle_seed = masking.example_seed(spec.seed, _SHUFFLE_SALT, epoch, spec.process_index)
    return serialized.shuffle(
        spec.shuffle_buffer, seed=_seed_int64(shuffle_seed), reshuffle_each_iteration=False
    )


def next_token_targets(features: dict, max_predictions_per_seq: int) -> dict:
    """The left-to-right LM's targets for a batch of parsed unmasked records ("ltr").

    Position t predicts token t + 1, for every t whose next token is real: the prediction
    slots are the T positions themselves, `masked_lm_positions` = 0..T-1, `masked_lm_ids` the
    input shifted left by one, `masked_lm_weights` 1 where a real next token exists (so
    [SEP] is predicted, nothing after it). The input is not masked: causal attention
    (`BertConfig.causal`) keeps each position from seeing its target.

    Args:
        features: `records.UNMASKED` features, (N, T) each (next_sentence_labels (N, 1)).
        max_predictions_per_seq: P, which must be T (one slot per position).

    Returns:
        The features of a masked record (`records.MASKED`), with P = T.
    """
    ids, mask = features["input_ids"], features["input_mask"]  # (N, T) int64
    length = ids.shape[-1]
    if max_predictions_per_seq != length:
        raise ValueError(
            f"next-token targets need max_predictions_per_seq == max_seq_length (one slot per "
            f"position), got {max_predictions_per_seq} and {length}"
        )
    has_next = tf.pad(mask[:, 1:], [[0, 0], [0, 1]]) > 0  # (N, T): position t+1 is real
    weights = tf.cast(has_next, tf.float32)
    positions = tf.broadcast_to(tf.range(length, dtype=ids.dtype), tf.shape(ids))
    zero = tf.zeros_like(ids)
    return {
        "input_ids": ids,
        "input_mask": mask,
        "segment_ids": features["segment_ids"],
        "masked_lm_positions": tf.where(has_next, positions, zero),
        "masked_lm_ids": tf.where(has_next, tf.pad(ids[:, 1:], [[0, 0], [0, 1]]), zero),
        "masked_lm_weights": weights,
        "next_sentence_labels": features["next_sentence_labels"],
    }


def _parse_batch(spec: PipelineSpec, serialized: tf.Tensor, epoch, batch_in_epoch) -> dict:
    if spec.next_token:
        unmasked = records.parse(serialized, records.UNMASKED, max_seq_length=spec.max_seq_length)
        features = next_token_targets(unmasked, spec.max_predictions_per_seq)
    elif spec.masking is None:
        features = records.parse(
            serialized,
            records.MASKED,
            max_seq_length=spec.max_seq_length,
            max_predictions_per_seq=spec.max_predictions_per_seq,
        )
    else:
        unmasked = records.parse(serialized, records.UNMASKED, max_seq_length=spec.max_seq_length)
        seed = masking.example_seed(
            spec.seed, _MASK_SALT, epoch, spec.process_index, batch_in_epoch
        )
        features = masking.mask_features(unmasked, seed, spec.masking)
    layout = records.batch_spec(
        spec.per_host_batch, spec.max_seq_length, spec.max_predictions_per_seq
    )
    # int32 ids, masks, positions and labels for JAX; next_sentence_labels (B, 1) -> (B,).
    batch = {
        k: tf.reshape(tf.cast(features[k], dtype), shape) for k, (shape, dtype) in layout.items()
    }
    batch[_EPOCH_KEY] = epoch
    batch[_BATCH_KEY] = batch_in_epoch
    return batch


def build_dataset(spec: PipelineSpec, position: dict[str, int]) -> tf.data.Dataset:
    """The endless per-host batch stream of `spec`, starting at `position`."""
    start_epoch = int(position["epoch"])
    start_batch = int(position["batch_in_epoch"])
    if start_epoch < 0 or start_batch < 0:
        raise ValueError(f"bad data position {position}")

    def epoch_batches(epoch: tf.Tensor) -> tf.data.Dataset:
        # Only the first epoch of a resumed run starts mid-way; skipping raw records before
        # parsing keeps resuming cheap.
        first = tf.cast(tf.equal(epoch, start_epoch), tf.int64)
        skip_batches = first * start_batch
        examples = _records_of_epoch(spec, epoch).skip(skip_batches * spec.per_host_batch)
        batches = examples.batch(spec.per_host_batch, drop_remainder=True)
        return batches.enumerate(start=skip_batches).map(
            lambda index, serialized: _parse_batch(spec, serialized, epoch, index),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )

    epochs = tf.data.Dataset.range(start_epoch, np.iinfo(np.int64).max)
    dataset = epochs.flat_map(epoch_batches).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = True
    return dataset.with_options(options)


class PretrainingIterator:
    """Yields per-host numpy batches and knows the position to resume from.

    Each batch is a dict: `input_ids input_mask segment_ids` int32 (B, T),
    `masked_lm_positions masked_lm_ids` int32 (B, P), `masked_lm_weights` float32 (B, P),
    `next_sentence_labels` int32 (B,), with B = global_batch_size / process_count; ready for
    `jax.make_array_from_process_local_data`.
    """

    def __init__(self, spec: PipelineSpec, position: dict[str, Any] | None = None):
        self.spec = spec
        position = dict(initial_position() if position is None else position)
        _check_position(spec, position)
        self._position = {
            "epoch": int(position["epoch"]),
            "batch_in_epoch": int(position["batch_in_epoch"]),
        }
        self.dataset = build_dataset(spec, self._position)
        self._batches = self.dataset.as_numpy_iterator()

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._batches)
        epoch = int(batch.pop(_EPOCH_KEY))
        index = int(batch.pop(_BATCH_KEY))
        self._position = {"epoch": epoch, "batch_in_epoch": index + 1}
        return batch

    @property
    def position(self) -> dict[str, Any]:
        """JSON-serialisable position after the last batch returned; save it per process."""
        return {
            **self._position,
            "process_index": self.spec.process_index,
            "process_count": self.spec.process_count,
            "seed": self.spec.seed,
            "per_host_batch": self.spec.per_host_batch,
            "num_host_files": len(self.spec.files),
            "dynamic_masking": self.spec.unmasked,
            # Only next-token streams name it: the positions of the others stay as they were.
            **({"next_token": True} if self.spec.next_token else {}),
        }


def _check_position(spec: PipelineSpec, position: dict[str, Any]) -> None:
    """Refuses a position saved by a differently configured pipeline."""
    expected = {
        "process_index": spec.process_index,
        "process_count": spec.process_count,
        "seed": spec.seed,
        "per_host_batch": spec.per_host_batch,
        "num_host_files": len(spec.files),
        "dynamic_masking": spec.unmasked,
    }
    mismatched = {
        key: (position[key], value)
        for key, value in expected.items()
        if key in position and position[key] != value
    }
    # A saved position (it names dynamic_masking) without the key is not a next-token one's.
    if "dynamic_masking" in position and position.get("next_token", False) != spec.next_token:
        mismatched["next_token"] = (position.get("next_token", False), spec.next_token)
    if mismatched:
        details = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in mismatched.items())
        raise ValueError(f"data position does not belong to this pipeline ({details})")
    for key in ("epoch", "batch_in_epoch"):
        if not isinstance(position.get(key), (int, np.integer)) or position[key] < 0:
            raise ValueError(f"data position needs a non-negative integer {key!r}: {position}")


def _check_records(spec: PipelineSpec) -> None:
    """Reads at most one batch of records: the schema must match, and a batch must fill."""
    if not spec.unmasked:
        feature_spec = records.feature_spec(
            records.MASKED, spec.max_seq_length, spec.max_predictions_per_seq
        )
        kind = (
            f"masked records (max_seq_length={spec.max_seq_length}, "
            f"max_predictions_per_seq={spec.max_predictions_per_seq})"
        )
    else:
        feature_spec = records.feature_spec(records.UNMASKED, spec.max_seq_length)
        kind = f"unmasked records (max_seq_length={spec.max_seq_length})"
    count = 0
    for path in spec.files:
        dataset = tf.data.TFRecordDataset(path, compression_type=spec.compression or "")
        try:
            for record in dataset.take(spec.per_host_batch - count):
                if count == 0:
                    tf.io.parse_single_example(record, feature_spec)
                count += 1
        except tf.errors.OpError as error:
            raise ValueError(
                f"{path}: not readable as {kind}: {error.message.splitlines()[0]}"
            ) from error
        if count >= spec.per_host_batch:
            return
    raise ValueError(
        f"process {spec.process_index} has {count} records in {len(spec.files)} files, "
        f"fewer than one per-host batch of {spec.per_host_batch}: {list(spec.files)}"
    )


def make_pretraining_dataset(
    file_patterns: str | Sequence[str],
    *,
    global_batch_size: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    seed: int,
    process_index: int | None = None,
    process_count: int | None = None,
    shuffle_buffer: int = 10_000,
    cycle_length: int = 8,
    dynamic_masking: bool = False,
    masking_config: masking.MaskingConfig | None = None,
    start_position: dict[str, Any] | None = None,
    compression: str | None = None,
    max_instances_per_row: int | None = None,
    next_token_targets: bool = False,
) -> PretrainingIterator | packing.PackedIterator:
    """The training input for this host, as an endless iterator of numpy batches.

    Args:
        file_patterns: TFRecord files: globs, comma-separated or a list.
        global_batch_size: examples per step over all hosts.
        max_seq_length: T, the records' token length.
        max_predictions_per_seq: P, the records' (or dynamic masking's) prediction slots.
        seed: fixes file order, shuffling and dynamic masks.
        process_index: this host; default `jax.process_index()`.
        process_count: hosts; default `jax.process_count()`.
        shuffle_buffer: records in the shuffle buffer.
        cycle_length: files read concurrently (interleaved) per host.
        dynamic_masking: read unmasked records and make the targets here: masks drawn anew
            each epoch, or with `next_token_targets` the next tokens.
        masking_config: the masking parameters; required with `dynamic_masking`, unless
            `next_token_targets`.
        start_position: a saved `PretrainingIterator.position` to resume from.
        compression: None, "GZIP" or "ZLIB", as the files were written.
        max_instances_per_row: pack up to this many instances into each row (None: one
            instance per row, the records as they are).
        next_token_targets: a left-to-right LM's targets (`next_token_targets`) instead of
            masks: needs `dynamic_masking`, no `masking_config`, and P == T.

    Returns:
        A `PretrainingIterator` (a `packing.PackedIterator` when packing); save its
        `position` with each checkpoint.

    Raises:
        FileNotFoundError: a pattern matches nothing.
        ValueError: batch not divisible by hosts, fewer files than hosts, records that do
            not match the lengths, too few records for one batch, or a foreign position.
    """
    if process_index is None or process_count is None:
        import jax  # only for the defaults: the pipeline itself is pure tf.data

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if global_batch_size < 1 or global_batch_size % process_count:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not a positive multiple of the "
            f"process count {process_count}"
        )
    if next_token_targets:
        if not dynamic_masking or masking_config is not None:
            raise ValueError(
                "next_token_targets reads unmasked records: give dynamic_masking=True and no "
                "masking_config"
            )
        if max_predictions_per_seq != max_seq_length:
            raise ValueError(
                f"next_token_targets needs max_predictions_per_seq == max_seq_length (one "
                f"slot per position), got {max_predictions_per_seq} and {max_seq_length}"
            )
    elif dynamic_masking != (masking_config is not None):
        raise ValueError("give masking_config exactly when dynamic_masking=True")
    if masking_config is not None and (
        masking_config.max_predictions_per_seq != max_predictions_per_seq
    ):
        raise ValueError(
            f"masking_config.max_predictions_per_seq={masking_config.max_predictions_per_seq}"
            f" differs from max_predictions_per_seq={max_predictions_per_seq}"
        )
    if shuffle_buffer < 1 or cycle_length < 1:
        raise ValueError(f"shuffle_buffer={shuffle_buffer}, cycle_length={cycle_length}: need >= 1")
    all_files = list_files(file_patterns)
    files = host_files(all_files, process_index, process_count)
    spec = PipelineSpec(
        files=tuple(files),
        per_host_batch=global_batch_size // process_count,
        max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq,
        seed=seed,
        process_index=process_index,
        process_count=process_count,
        shuffle_buffer=shuffle_buffer,
        cycle_length=cycle_length,
        masking=masking_config,
        compression=compression,
        next_token=next_token_targets,
    )
    _check_records(spec)
    if max_instances_per_row is None:
        if start_position is not None and "max_instances_per_row" in start_position:
            raise ValueError(
                f"data position {start_position} is a packed stream's; this one is not packed"
            )
        return PretrainingIterator(spec, start_position)
    return packing.PackedIterator(
        lambda position: PretrainingIterator(spec, position),
        num_rows=spec.per_host_batch,
        max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq,
        max_instances_per_row=max_instances_per_row,
        position=start_position,
    )
