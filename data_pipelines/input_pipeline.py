"""The pretraining input pipeline: deterministic, resumable, elastic tf.data.

**Streams.** The sorted input files are dealt round-robin into `num_streams` streams
(stream v reads files v, v + V, v + 2V, ...). Each global batch holds B / V consecutive rows
from every stream, stream 0's first, and process p of N reads the streams
[p V / N, (p + 1) V / N). The global batch of every step is therefore the same whatever the
number of processes, so a run moves between slice sizes (any N dividing V) mid-epoch: each
stream goes on from its own position, and over the epoch every record is consumed once.

Per stream, epoch after epoch:

1. its files in an order shuffled per (seed, epoch, stream);
2. read in groups of `cycle_length` consecutive files, the files of a group interleaved
   record by record (round robin), the groups one after another;
3. that record sequence cut into windows of `shuffle_buffer` records, each window shuffled
   with a stateless seed of (seed, epoch, stream, window);
4. batches of B / V records, the last partial batch of the stream's epoch dropped;
5. parsing, and in dynamic mode masking with a stateless seed of (seed, epoch, stream,
   batch in epoch), so every epoch sees new masks and a resumed run the same ones;
6. int32 ids/masks/positions/labels and float32 weights, prefetched.

A stream's **position** is `(epoch, batch_in_epoch)`; a process's position holds those of
its streams (`PretrainingIterator.position`) and `merge_positions` joins every process's into
one that any process count can resume from. Restoring does not replay the epoch: the
records before the position's window are skipped by the files' record counts (the stats JSON
`create_pretraining_data` writes beside its shards, else counted once), whole groups without
opening their files and the current group's files by their consumed prefixes (read raw, not
parsed); then that one window is read and shuffled again. The work is at most one group and
one window wherever in the epoch the position is.

Static mode reads masked records (`records.MASKED`: ours or the original BERT tool's);
dynamic mode reads unmasked records (`records.UNMASKED`) and makes the targets: masks, or
with `next_token_targets` (the "ltr" objective, a left-to-right LM) the next token of every
real position (`next_token_targets`, deterministic, no token masked). Either can be packed
(`max_instances_per_row`): each stream's instances, in its order, are packed into its rows
by `data_pipelines.packing`, whose position adds the instances of the current batch already
packed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

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


def process_streams(num_streams: int, process_index: int, process_count: int) -> range:
    """The streams process `process_index` of `process_count` reads.

    Raises:
        ValueError: `num_streams` is not a multiple of `process_count`.
    """
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if num_streams < 1 or num_streams % process_count:
        raise ValueError(
            f"the data is dealt into num_streams={num_streams} streams, which "
            f"{process_count} processes cannot share evenly: run on a process count that "
            f"divides {num_streams}, or start runs with config.data.num_streams set to a "
            f"multiple of every process count they may move to"
        )
    share = num_streams // process_count
    return range(process_index * share, (process_index + 1) * share)


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """Everything that fixes the streams; saved with the position to catch mismatches."""

    files: tuple[str, ...]  # every input file, sorted
    num_streams: int
    stream_batch: int  # rows of each global batch from each stream: B / num_streams
    max_seq_length: int
    max_predictions_per_seq: int
    seed: int
    shuffle_buffer: int  # records per shuffled window
    cycle_length: int  # files per interleaved group
    masking: masking.MaskingConfig | None  # None: static (pre-masked records) or next_token
    compression: str | None
    next_token: bool = False  # unmasked records, next-token targets (the "ltr" objective)

    @property
    def unmasked(self) -> bool:
        """Reads unmasked records (dynamic masking or next-token targets)."""
        return self.masking is not None or self.next_token

    def stream_files(self, stream: int) -> tuple[str, ...]:
        """The files of `stream`, in sorted order."""
        return self.files[stream :: self.num_streams]

    def identity(self) -> dict[str, Any]:
        """What a saved position must agree with (JSON)."""
        return {
            "num_streams": self.num_streams,
            "stream_batch": self.stream_batch,
            "seed": self.seed,
            "num_files": len(self.files),
            "shuffle_buffer": self.shuffle_buffer,
            "cycle_length": self.cycle_length,
            "dynamic_masking": self.unmasked,
            # Only next-token streams name it.
            **({"next_token": True} if self.next_token else {}),
        }


def initial_position() -> dict[str, int]:
    """A stream's position at the start of a run: the first batch of epoch 0."""
    return {"epoch": 0, "batch_in_epoch": 0}


def record_counts(files: Sequence[str], compression: str | None = None) -> dict[str, int]:
    """Records per file: from the stats JSONs beside them (`records_per_file`), else counted.

    `create_pretraining_data` writes `<first shard>.stats.json` with every shard's count;
    the records of files without one (e.g. the original BERT tool's) are counted from their
    framing (`tfrecord_files.count_records`: record lengths, the data seeked over; compressed
    files are read), and a warning says how long that took.
    """
    counts: dict[str, int] = {}
    for directory in sorted({os.path.dirname(f) for f in files}):
        for stats_path in sorted(tf.io.gfile.glob(os.path.join(directory, "*.stats.json"))):
            with tf.io.gfile.GFile(stats_path) as f:
                stats = json.load(f)
            if "records_per_file" not in stats:
                continue
            named = zip(stats["output_files"], stats["records_per_file"], strict=True)
            for path, count in named:
                counts[os.path.join(directory, os.path.basename(path))] = int(count)
    missing = [f for f in files if f not in counts]
    if missing:
        start = time.perf_counter()
        for path in missing:
            if compression:  # compressed framing has no lengths to seek by: read it
                dataset = tf.data.TFRecordDataset(path, compression_type=compression)
                counts[path] = int(dataset.reduce(np.int64(0), lambda n, _: n + 1))
            else:
                counts[path] = tfrecord_files.count_records(path)
        logging.warning(
            "counted the records of %d files without a stats JSON in %.1f s (first: %s)",
            len(missing),
            time.perf_counter() - start,
            missing[0],
        )
    return {f: counts[f] for f in files}


def skip_records(
    order: Sequence[str], counts: dict[str, int], cycle_length: int, skip: int
) -> tuple[list[tuple[str, int]], list[str]]:
    """Where a stream's epoch stands after its first `skip` records (steps 1-2 of the
    module docstring), from the files' record counts alone.

    Args:
        order: the epoch's files in their shuffled order.
        counts: records per file.
        cycle_length: files per interleaved group.
        skip: records already read.

    Returns:
        (current, rest): the current group's unfinished files with the records each has
        read, in the order the round robin visits them next; and the files of the
        untouched groups after it.
    """
    for start in range(0, len(order), cycle_length):
        group = order[start : start + cycle_length]
        size = sum(counts[f] for f in group)
        if skip >= size:
            skip -= size
            continue
        active = [[f, 0, counts[f]] for f in group if counts[f]]  # path, read, left
        while skip:
            fewest = min(left for _, _, left in active)
            if skip >= fewest * len(active):  # whole rounds until the shortest file ends
                for entry in active:
                    entry[1] += fewest
                    entry[2] -= fewest
                skip -= fewest * len(active)
            else:  # whole rounds, then the first `extra` files once more
                rounds, extra = divmod(skip, len(active))
                for i, entry in enumerate(active):
                    entry[1] += rounds + (i < extra)
                    entry[2] -= rounds + (i < extra)
                active = active[extra:] + active[:extra]
                skip = 0
            active = [entry for entry in active if entry[2]]
        return [(f, read) for f, read, _ in active], list(order[start + cycle_length :])
    return [], []


def _file_order(spec: PipelineSpec, stream: int, epoch) -> tf.Tensor:
    """The stream's files in the order of `epoch` (eager or in a graph)."""
    files = spec.stream_files(stream)
    order_seed = masking.example_seed(spec.seed, _FILE_ORDER_SALT, epoch, stream)
    scores = tf.random.stateless_uniform([len(files)], order_seed, alg=masking.RNG_ALG)
    return tf.gather(tf.constant(files, tf.string), tf.argsort(scores, stable=True))


def _group_records(spec: PipelineSpec, paths, offsets) -> tf.data.Dataset:
    """One group: its files from their offsets, interleaved record by record."""
    return tf.data.Dataset.from_tensor_slices((paths, offsets)).interleave(
        lambda path, offset: tf.data.TFRecordDataset(
            path, compression_type=spec.compression or ""
        ).skip(offset),
        cycle_length=spec.cycle_length,
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def _whole_groups(spec: PipelineSpec, paths: tf.Tensor) -> tf.data.Dataset:
    """Files in groups of `cycle_length`, each group read whole, one after another."""
    return (
        tf.data.Dataset.from_tensor_slices(paths)
        .batch(spec.cycle_length)
        .flat_map(lambda group: _group_records(spec, group, tf.zeros(tf.shape(group), tf.int64)))
    )


def _stream_batches(
    spec: PipelineSpec, stream: int, epoch, serialized: tf.data.Dataset, start: int = 0
) -> tf.data.Dataset:
    """Steps 3-6 of one epoch of a stream whose records `serialized` begin at the window
    holding record `start * stream_batch`, the batches from `start` on."""
    window, offset = divmod(start * spec.stream_batch, spec.shuffle_buffer)

    def shuffle(index, records_of_window):
        seed = masking.example_seed(spec.seed, _SHUFFLE_SALT, epoch, stream, index)
        return tf.random.experimental.stateless_shuffle(
            records_of_window, seed, alg=masking.RNG_ALG
        )

    windows = serialized.batch(spec.shuffle_buffer).enumerate(start=window).map(shuffle)
    examples = windows.unbatch().skip(offset)
    batches = examples.batch(spec.stream_batch, drop_remainder=True)
    return batches.enumerate(start=start).map(
        lambda index, batch: _parse_batch(spec, stream, batch, epoch, index),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
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


def _parse_batch(spec: PipelineSpec, stream: int, serialized, epoch, batch_in_epoch) -> dict:
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
        seed = masking.example_seed(spec.seed, _MASK_SALT, epoch, stream, batch_in_epoch)
        features = masking.mask_features(unmasked, seed, spec.masking)
    layout = records.batch_spec(
        spec.stream_batch, spec.max_seq_length, spec.max_predictions_per_seq
    )
    # int32 ids, masks, positions and labels for JAX; next_sentence_labels (B, 1) -> (B,).
    batch = {
        k: tf.reshape(tf.cast(features[k], dtype), shape) for k, (shape, dtype) in layout.items()
    }
    batch[_EPOCH_KEY] = tf.cast(epoch, tf.int64)
    batch[_BATCH_KEY] = batch_in_epoch
    return batch


def build_stream(
    spec: PipelineSpec, stream: int, position: dict[str, int], counts=None
) -> tf.data.Dataset:
    """The endless batch stream of `stream`, starting at its `position`.

    Args:
        counts: a callable returning the records per file (`record_counts`); called only
            when the position is past the epoch's first window.
    """
    epoch, start = int(position["epoch"]), int(position["batch_in_epoch"])
    window = start * spec.stream_batch // spec.shuffle_buffer
    if window:  # skip what comes before the position's window, by the files' counts
        order = [path.decode() for path in _file_order(spec, stream, epoch).numpy()]
        current, rest = skip_records(
            order, counts(), spec.cycle_length, window * spec.shuffle_buffer
        )
        paths = tf.constant([path for path, _ in current], tf.string)
        offsets = tf.constant([read for _, read in current], tf.int64)
        serialized = _group_records(spec, paths, offsets).concatenate(
            _whole_groups(spec, tf.constant(rest, tf.string))
        )
    else:
        serialized = _whole_groups(spec, _file_order(spec, stream, epoch))
    first = _stream_batches(spec, stream, epoch, serialized, start)
    later = tf.data.Dataset.range(epoch + 1, np.iinfo(np.int64).max).flat_map(
        lambda e: _stream_batches(
            spec, stream, e, _whole_groups(spec, _file_order(spec, stream, e))
        )
    )
    options = tf.data.Options()
    options.deterministic = True
    return first.concatenate(later).prefetch(tf.data.AUTOTUNE).with_options(options)


class StreamIterator:
    """One stream's numpy batches (`stream_batch` rows), knowing its position."""

    def __init__(self, spec: PipelineSpec, stream: int, position: dict[str, Any], counts=None):
        self.stream = stream
        self._position = {k: int(position[k]) for k in ("epoch", "batch_in_epoch")}
        self.dataset = build_stream(spec, stream, self._position, counts)
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
    def position(self) -> dict[str, int]:
        """Where its next batch starts."""
        return dict(self._position)


class PretrainingIterator:
    """Yields per-process numpy batches and knows the position to resume from.

    Each batch is a dict: `input_ids input_mask segment_ids` int32 (B, T),
    `masked_lm_positions masked_lm_ids` int32 (B, P), `masked_lm_weights` float32 (B, P),
    `next_sentence_labels` int32 (B,) (packed: `records.PACKED_BATCH`), with
    B = global_batch_size / process_count: the rows of this process's streams, in stream
    order; ready for `jax.make_array_from_process_local_data`.
    """

    def __init__(
        self,
        spec: PipelineSpec,
        streams: Sequence[int],
        position: dict[str, Any] | None = None,
        max_instances_per_row: int | None = None,
    ):
        self.spec = spec
        self.streams = list(streams)
        self.max_instances_per_row = max_instances_per_row
        saved = {} if position is None else position["streams"]
        counts = functools.cache(lambda: record_counts(spec.files, spec.compression))

        def stream_iterator(stream: int):
            start = saved.get(str(stream))
            if max_instances_per_row is None:
                return StreamIterator(spec, stream, start or initial_position(), counts)
            return packing.PackedIterator(
                lambda at: StreamIterator(spec, stream, at or initial_position(), counts),
                num_rows=spec.stream_batch,
                max_seq_length=spec.max_seq_length,
                max_predictions_per_seq=spec.max_predictions_per_seq,
                max_instances_per_row=max_instances_per_row,
                position=start,
            )

        self._iterators = [stream_iterator(stream) for stream in self.streams]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        parts = [next(iterator) for iterator in self._iterators]
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}

    @property
    def position(self) -> dict[str, Any]:
        """JSON-serialisable position after the last batch returned: this process's streams.
        Save every process's; `merge_positions` joins them for a resume on any process count."""
        packed = self.max_instances_per_row
        streams = zip(self.streams, self._iterators, strict=True)
        return {
            **self.spec.identity(),
            **({"max_instances_per_row": packed} if packed is not None else {}),
            "streams": {str(s): iterator.position for s, iterator in streams},
        }


def _from_per_host(position: dict[str, Any]) -> dict[str, Any]:
    """A position saved before streams (one stream per host, `process_index` of
    `process_count`) in today's layout, marked `per_host`."""
    stream = {k: position[k] for k in ("epoch", "batch_in_epoch", "instance_in_batch")
              if k in position}  # fmt: skip
    identity = {
        "num_streams": position.get("process_count", 1),
        "stream_batch": position.get("per_host_batch"),
        "seed": position.get("seed"),
        "dynamic_masking": position.get("dynamic_masking"),
        "next_token": position.get("next_token"),
        "max_instances_per_row": position.get("max_instances_per_row"),
    }
    converted = {k: v for k, v in identity.items() if v is not None}
    return converted | {
        "per_host": True,
        "streams": {str(position.get("process_index", 0)): stream},
    }


def merge_positions(positions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One position holding every stream's, from the positions each process saved.

    Raises:
        ValueError: the positions disagree on what they belong to, or name a stream twice.
    """
    merged: dict[str, Any] = {}
    streams: dict[str, Any] = {}
    for i, position in enumerate(positions):
        if "streams" not in position:
            position = _from_per_host(position)
        identity = {k: v for k, v in position.items() if k != "streams"}
        if merged and identity != merged:
            raise ValueError(
                f"the data positions of processes 0 and {i} disagree: {merged} vs {identity}"
            )
        merged = identity
        twice = set(streams) & set(position["streams"])
        if twice:
            raise ValueError(f"data positions name streams {sorted(twice)} twice")
        streams.update(position["streams"])
    return merged | {"streams": streams}


def _check_position(
    spec: PipelineSpec, position: dict[str, Any], streams: Sequence[int], packed: int | None
) -> None:
    """Refuses a position saved by a differently configured pipeline, or lacking a stream."""
    expected = spec.identity()
    mismatched = {
        key: (position[key], value)
        for key, value in expected.items()
        if key in position and position[key] != value
    }
    if position.get("next_token", False) != spec.next_token:
        mismatched["next_token"] = (position.get("next_token", False), spec.next_token)
    if position.get("max_instances_per_row") != packed:
        mismatched["max_instances_per_row"] = (position.get("max_instances_per_row"), packed)
    if mismatched:
        details = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in mismatched.items())
        raise ValueError(f"data position does not belong to this pipeline ({details})")
    for stream in streams:
        saved = position["streams"].get(str(stream))
        if saved is None:
            raise ValueError(
                f"data position has no position for stream {stream} (it holds streams "
                f"{sorted(position['streams'], key=int)}): pass every process's position "
                f"(merge_positions)"
            )
        for key in ("epoch", "batch_in_epoch"):
            if not isinstance(saved.get(key), (int, np.integer)) or saved[key] < 0:
                raise ValueError(
                    f"data position of stream {stream} needs a non-negative integer {key!r}: "
                    f"{saved}"
                )
    if position.get("per_host"):
        logging.warning(
            "data position saved by the per-host pipeline (before streams): the run goes on "
            "at the same batch count of the same epoch, but this epoch's remaining records "
            "are drawn afresh (some may repeat, some be missed until the next epoch)"
        )


def _check_records(spec: PipelineSpec, streams: Sequence[int]) -> None:
    """Reads at most one batch of records per stream: the schema must match, and a batch
    must fill."""
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
    for stream in streams:
        files = spec.stream_files(stream)
        count = 0
        for path in files:
            dataset = tf.data.TFRecordDataset(path, compression_type=spec.compression or "")
            try:
                for record in dataset.take(spec.stream_batch - count):
                    if count == 0:
                        tf.io.parse_single_example(record, feature_spec)
                    count += 1
            except tf.errors.OpError as error:
                raise ValueError(
                    f"{path}: not readable as {kind}: {error.message.splitlines()[0]}"
                ) from error
            if count >= spec.stream_batch:
                break
        else:
            raise ValueError(
                f"stream {stream} of {spec.num_streams} has {count} records in {len(files)} "
                f"files, fewer than its share of a batch ({spec.stream_batch}): {list(files)}"
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
    num_streams: int | None = None,
    shuffle_buffer: int = 10_000,
    cycle_length: int = 8,
    dynamic_masking: bool = False,
    masking_config: masking.MaskingConfig | None = None,
    start_position: dict[str, Any] | None = None,
    compression: str | None = None,
    max_instances_per_row: int | None = None,
    next_token_targets: bool = False,
) -> PretrainingIterator:
    """The training input for this process, as an endless iterator of numpy batches.

    Args:
        file_patterns: TFRecord files: globs, comma-separated or a list.
        global_batch_size: examples per step over all processes.
        max_seq_length: T, the records' token length.
        max_predictions_per_seq: P, the records' (or dynamic masking's) prediction slots.
        seed: fixes file order, shuffling and dynamic masks.
        process_index: this process; default `jax.process_index()`.
        process_count: processes; default `jax.process_count()`.
        num_streams: streams the files are dealt into (a multiple of every process count
            the run may move to); None: the saved position's, else one per process.
        shuffle_buffer: records per shuffled window (per stream).
        cycle_length: files per interleaved group (per stream).
        dynamic_masking: read unmasked records and make the targets here: masks drawn anew
            each epoch, or with `next_token_targets` the next tokens.
        masking_config: the masking parameters; required with `dynamic_masking`, unless
            `next_token_targets`.
        start_position: a saved `PretrainingIterator.position` to resume from, or
            `merge_positions` of every process's (needed when the process count changed).
        compression: None, "GZIP" or "ZLIB", as the files were written.
        max_instances_per_row: pack up to this many instances into each row (None: one
            instance per row, the records as they are).
        next_token_targets: a left-to-right LM's targets (`next_token_targets`) instead of
            masks: needs `dynamic_masking`, no `masking_config`, and P == T.

    Returns:
        A `PretrainingIterator`; save its `position` with each checkpoint.

    Raises:
        FileNotFoundError: a pattern matches nothing.
        ValueError: streams not divisible by processes, batch not divisible by streams,
            fewer files than streams, records that do not match the lengths, too few
            records for a stream's share of one batch, or a foreign position.
    """
    if process_index is None or process_count is None:
        import jax  # only for the defaults: the pipeline itself is pure tf.data

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if start_position is not None and "streams" not in start_position:
        start_position = merge_positions([start_position])
    if num_streams is None:
        num_streams = process_count if start_position is None else start_position["num_streams"]
    streams = process_streams(num_streams, process_index, process_count)
    if global_batch_size < 1 or global_batch_size % num_streams:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not a positive multiple of the "
            f"{num_streams} data streams (num_streams; one per process by default)"
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
    files = list_files(file_patterns)
    if len(files) < num_streams:
        raise ValueError(
            f"{len(files)} input files for {num_streams} data streams (num_streams; one per "
            f"process by default): every stream needs at least one file; write at least "
            f"{num_streams} shards"
        )
    spec = PipelineSpec(
        files=tuple(files),
        num_streams=num_streams,
        stream_batch=global_batch_size // num_streams,
        max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq,
        seed=seed,
        shuffle_buffer=shuffle_buffer,
        cycle_length=cycle_length,
        masking=masking_config,
        compression=compression,
        next_token=next_token_targets,
    )
    if start_position is not None:
        _check_position(spec, start_position, streams, max_instances_per_row)
    _check_records(spec, streams)
    return PretrainingIterator(spec, streams, start_position, max_instances_per_row)
