"""The pretraining input pipeline: deterministic, resumable, elastic tf.data.

**Streams.** The sorted input files are dealt round-robin into `num_streams` streams
(stream v reads files v, v + V, v + 2V, ...). Each global batch holds B / V consecutive rows
from every stream, stream 0's first, and process p of N reads the streams
[p V / N, (p + 1) V / N). The global batch of every step is therefore the same whatever the
number of processes, so a run moves between slice sizes (any N dividing V) mid-epoch: each
stream goes on from its own position, and over the epoch every record is consumed once.
How one stream reads, shuffles, batches, parses and masks its records, and resumes from its
position without replaying the epoch, is `data_pipelines.input_streams`.

A stream's **position** is `(epoch, batch_in_epoch)`; a process's position holds those of
its streams (`PretrainingIterator.position`) and `merge_positions` joins every process's into
one that any process count can resume from.

Static mode reads masked records (`records.MASKED`: ours or the original BERT tool's);
dynamic mode reads unmasked records (`records.UNMASKED`) and makes the targets: masks, or
with `next_token_targets` (the "ltr" objective, a left-to-right LM) the next token of every
real position (`input_streams.next_token_targets`, deterministic, no token masked). Either can
be packed (`max_instances_per_row`): each stream's instances, in its order, are packed into its
rows by `data_pipelines.packing`, whose position adds the instances of the current batch
already packed.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from data_pipelines import masking, packing, paths, records, tfrecord_files, tfrecord_framing
from data_pipelines.input_streams import (
    PipelineSpec,
    StreamIterator,
    initial_position,
    record_counts,
)


def list_files(file_patterns: str | Sequence[str]) -> list[str]:
    """Sorted, de-duplicated files matching comma-separated patterns or a list of them.

    A writer's hidden temporaries (`tfrecord_files.is_temporary`, which `tf.io.gfile.glob`
    matches with `dir/*`) are never input, nor the stats JSON `create_pretraining_data`
    writes beside its shards (`dir/train-*` matches `train-00000-of-00004.tfrecord.stats.json`):
    a log line names those skipped.

    Raises:
        FileNotFoundError: a pattern matches no file (or only stats JSONs).
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
        # A pattern that names an existing file (or a directory of that very name, brackets
        # and all) is taken literally.
        found = paths.literal_or_glob(pattern, tf.io.gfile.glob)
        matched = [f for f in found if not tfrecord_files.is_temporary(f)]
        # The stats JSONs are skipped here by name rather than renamed where no pattern
        # reaches them: the directories already written (ours, and `make demo`'s) keep
        # `<first shard>.stats.json`, which readers of the stats look up beside the shard;
        # any other file that is not records is refused by `check_record_files`.
        sidecars = [f for f in matched if tfrecord_files.is_sidecar(f)]
        if sidecars:
            logging.info(
                "input pattern %r: skipped %s (create_pretraining_data's stats, not records)",
                pattern,
                ", ".join(sidecars),
            )
        matched = [f for f in matched if f not in sidecars]
        if not matched:
            only = " but stats JSONs" if sidecars else ""
            raise FileNotFoundError(f"input pattern {pattern!r} matches no file{only}")
        files.update(matched)
    tfrecord_files.check_shard_set(sorted(files))
    return sorted(files)


def check_record_files(
    files: Sequence[str], compression: str | None, patterns: str | Sequence[str]
) -> None:
    """Refuses a file that does not begin like a TFRecord file before any is read
    (`tfrecord_framing.check_framing`: one small read per file, in parallel for buckets).

    Raises:
        ValueError: naming the first such file and the patterns that matched it.
    """
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(tfrecord_framing.check_framing, f, compression) for f in files]
    for future in futures:
        if future.exception() is not None:
            raise ValueError(
                f"{future.exception()}; it matches the input pattern {patterns!r}"
            ) from future.exception()


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
        vocab_size: int | None = None,
    ):
        self.spec = spec
        self.streams = list(streams)
        self.vocab_size = vocab_size  # ids at or past it are refused (`_check_ids`)
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
        if self.vocab_size is not None:
            for stream, iterator, part in zip(self.streams, self._iterators, parts, strict=True):
                _check_ids(part, self.vocab_size, self.spec, stream, iterator.position)
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


class TokenIdError(ValueError):
    """A batch with a token id or masked-LM target outside [0, vocab size)."""


# The id fields of a batch; the gather that embeds them clamps an id past the table, so one
# out of range shows up only later, as a non-finite loss.
_ID_FIELDS = {"input_ids": "token id", "masked_lm_ids": "masked-LM target id"}


def _check_ids(batch, vocab_size: int, spec: PipelineSpec, stream: int, position) -> None:
    """Raises `TokenIdError` at the first batch holding an id outside [0, vocab_size),
    naming the id, the field, the stream's files and the batch's place in them."""
    for field, what in _ID_FIELDS.items():
        ids = batch.get(field)
        if ids is None or ids.size == 0:
            continue
        low, high = int(ids.min()), int(ids.max())
        if low >= 0 and high < vocab_size:
            continue
        bad = high if high >= vocab_size else low
        files = spec.stream_files(stream)
        named = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise TokenIdError(
            f"{what} {bad} outside the vocabulary's [0, {vocab_size}) in data stream "
            f"{stream}'s batch that ends at epoch {position.get('epoch')}, batch_in_epoch "
            f"{position.get('batch_in_epoch')} (reading {named}): records made with another "
            "vocabulary?"
        )


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
    short = {}  # stream -> (records, files): fewer records than its share of a batch
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
            short[stream] = (count, files)
    if short:
        stream, (count, files) = min(short.items(), key=lambda item: item[1][0])
        fits = count * spec.num_streams  # the largest batch every short stream fills
        advice = f"set --config.global_batch_size to at most {fits}" if fits else "use other files"
        raise ValueError(
            f"--config.global_batch_size={spec.stream_batch * spec.num_streams} takes "
            f"{spec.stream_batch} records per batch from each of the {spec.num_streams} data "
            f"streams, but stream {stream} has {count} records in its {len(files)} files, "
            f"fewer than its share of a batch ({spec.stream_batch}): {advice} (a multiple of "
            f"{spec.num_streams}), or write more records: {list(files)}"
        )


def _stream_layout(
    num_streams: int | None,
    process_index: int | None,
    process_count: int | None,
    start_position: dict[str, Any] | None,
) -> tuple[int, range]:
    """The number of streams and the ones this process reads; None arguments take jax's
    process index and count and the saved position's stream count (else one per process)."""
    if process_index is None or process_count is None:
        import jax  # only for the defaults: the pipeline itself is pure tf.data

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if num_streams is None:
        num_streams = process_count if start_position is None else start_position["num_streams"]
    return num_streams, process_streams(num_streams, process_index, process_count)


def _check_arguments(
    *,
    global_batch_size: int,
    num_streams: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    dynamic_masking: bool,
    masking_config: masking.MaskingConfig | None,
    next_token_targets: bool,
    shuffle_buffer: int,
    cycle_length: int,
) -> None:
    """Refuses a batch the streams cannot share and a targets setting that contradicts
    itself, before any file is opened."""
    if global_batch_size < 1 or global_batch_size % num_streams:
        raise ValueError(
            f"--config.global_batch_size {global_batch_size} is not a positive multiple of the "
            f"{num_streams} data streams (--config.data.num_streams; one per process by "
            f"default): use a multiple of {num_streams}"
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


def _input_files(
    file_patterns: str | Sequence[str], compression: str | None, num_streams: int, starting: bool
) -> list[str]:
    """The sorted input files, at least one per stream; at a run's start (`starting`) each
    is checked to be readable as TFRecords."""
    files = list_files(file_patterns)
    if starting:
        # At a run's start only: a resume opens no file before its position's group (see
        # input_streams), its files were checked when the run began, and a file added
        # since changes num_files, which `_check_position` refuses.
        check_record_files(files, compression, file_patterns)
    if len(files) < num_streams:
        raise ValueError(
            f"{len(files)} input files for {num_streams} data streams (--config.data.num_streams;"
            f" one per process by default): every stream needs at least one file; write at least "
            f"{num_streams} shards"
        )
    return files


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
    vocab_size: int | None = None,
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
        vocab_size: the vocabulary's size: a batch holding an id outside [0, vocab_size)
            raises `TokenIdError` naming it (None: not checked).

    Returns:
        A `PretrainingIterator`; save its `position` with each checkpoint.

    Raises:
        FileNotFoundError: a pattern matches nothing.
        ValueError: streams not divisible by processes, batch not divisible by streams,
            fewer files than streams, records that do not match the lengths, too few
            records for a stream's share of one batch, or a foreign position.
    """
    if start_position is not None and "streams" not in start_position:
        start_position = merge_positions([start_position])
    num_streams, streams = _stream_layout(num_streams, process_index, process_count, start_position)
    _check_arguments(
        global_batch_size=global_batch_size,
        num_streams=num_streams,
        max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq,
        dynamic_masking=dynamic_masking,
        masking_config=masking_config,
        next_token_targets=next_token_targets,
        shuffle_buffer=shuffle_buffer,
        cycle_length=cycle_length,
    )
    files = _input_files(file_patterns, compression, num_streams, start_position is None)
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
    return PretrainingIterator(spec, streams, start_position, max_instances_per_row, vocab_size)
