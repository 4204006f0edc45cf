"""One stream of the pretraining input: its files, their order, shuffling, batches, parsing.

`data_pipelines.input_pipeline` deals the input files into streams and joins the streams'
batches into each process's; this module reads one stream. Per stream, epoch after epoch:

1. its files in an order shuffled per (seed, epoch, stream);
2. read in groups of `cycle_length` consecutive files, the files of a group interleaved
   record by record (round robin), the groups one after another;
3. that record sequence cut into windows of `shuffle_buffer` records, each window shuffled
   with a stateless seed of (seed, epoch, stream, window);
4. batches of B / V records, the last partial batch of the stream's epoch dropped;
5. parsing, and in dynamic mode masking with a stateless seed of (seed, epoch, stream,
   batch in epoch), so every epoch sees new masks and a resumed run the same ones;
6. int32 ids/masks/positions/labels and float32 weights, prefetched.

A stream's **position** is `(epoch, batch_in_epoch)` (`StreamIterator.position`). Starting at
one does not replay the epoch: the records before the position's window are skipped by the
files' record counts (`record_counts`: the stats JSON `create_pretraining_data` writes beside
its shards, else counted once), whole groups without opening their files and the current
group's files by their consumed prefixes (`skip_records`; read raw, not parsed); then that one
window is read and shuffled again. The work is at most one group and one window wherever in
the epoch the position is.

A damaged record (tf.data's `DataLossError`, which names only a byte offset) is raised as
`DamagedRecordError`, naming the file and the record (`damaged_record_error`).

Static mode reads masked records (`records.MASKED`: ours or the original BERT tool's);
dynamic mode reads unmasked records (`records.UNMASKED`) and makes the targets: masks, or
with `next_token_targets` (the "ltr" objective, a left-to-right LM) the next token of every
real position (deterministic, no token masked).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from data_pipelines import masking, paths, records, tfrecord_files, tfrecord_framing

# Salts that keep the seeds of different random choices apart.
_FILE_ORDER_SALT = 1
_SHUFFLE_SALT = 2
_MASK_SALT = 3

# Keys carried along each batch so the iterator knows its position; stripped before yield.
_EPOCH_KEY = "_epoch"
_BATCH_KEY = "_batch_in_epoch"


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
    framing (`tfrecord_framing.count_records`: record lengths, the data seeked over; compressed
    files are read), and a warning says how long that took.
    """
    counts: dict[str, int] = {}
    for directory in sorted({os.path.dirname(f) for f in files}):
        for stats_path in sorted(paths.glob_in(directory, "*" + tfrecord_files.STATS_SUFFIX)):
            stats = tfrecord_files.read_stats(stats_path)
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
                counts[path] = tfrecord_framing.count_records(path)
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


# tf.data traces every function it maps through AutoGraph, which rewrites the function's
# Python source (an AST pass) to turn control flow on tensors into graph ops: ~4 s of CPU in
# each process that builds a pipeline, spent on functions whose Python branches and loops all
# run on Python values (config fields, tuples) and so trace to the same graph without it. A
# branch on a tensor added later fails at trace time ("using a tf.Tensor as a Python bool"),
# never silently.
_graph_as_written = tf.autograph.experimental.do_not_convert


def _file_order(spec: PipelineSpec, stream: int, epoch) -> tf.Tensor:
    """The stream's files in the order of `epoch` (eager or in a graph)."""
    files = spec.stream_files(stream)
    order_seed = masking.example_seed(spec.seed, _FILE_ORDER_SALT, epoch, stream)
    scores = tf.random.stateless_uniform([len(files)], order_seed, alg=masking.RNG_ALG)
    return tf.gather(tf.constant(files, tf.string), tf.argsort(scores, stable=True))


def _group_records(spec: PipelineSpec, paths, offsets) -> tf.data.Dataset:
    """One group: its files from their offsets, interleaved record by record."""
    return tf.data.Dataset.from_tensor_slices((paths, offsets)).interleave(
        _graph_as_written(
            lambda path, offset: tf.data.TFRecordDataset(
                path, compression_type=spec.compression or ""
            ).skip(offset)
        ),
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
        .flat_map(
            _graph_as_written(
                lambda group: _group_records(spec, group, tf.zeros(tf.shape(group), tf.int64))
            )
        )
    )


def _stream_batches(
    spec: PipelineSpec, stream: int, epoch, serialized: tf.data.Dataset, start: int = 0
) -> tf.data.Dataset:
    """Steps 3-6 of one epoch of a stream whose records `serialized` begin at the window
    holding record `start * stream_batch`, the batches from `start` on."""
    window, offset = divmod(start * spec.stream_batch, spec.shuffle_buffer)

    @_graph_as_written
    def shuffle(index, records_of_window):
        seed = masking.example_seed(spec.seed, _SHUFFLE_SALT, epoch, stream, index)
        return tf.random.experimental.stateless_shuffle(
            records_of_window, seed, alg=masking.RNG_ALG
        )

    windows = serialized.batch(spec.shuffle_buffer).enumerate(start=window).map(shuffle)
    examples = windows.unbatch().skip(offset)
    batches = examples.batch(spec.stream_batch, drop_remainder=True)
    return batches.enumerate(start=start).map(
        _graph_as_written(lambda index, batch: _parse_batch(spec, stream, batch, epoch, index)),
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
        _graph_as_written(
            lambda e: _stream_batches(
                spec, stream, e, _whole_groups(spec, _file_order(spec, stream, e))
            )
        )
    )
    options = tf.data.Options()
    options.deterministic = True
    return first.concatenate(later).prefetch(tf.data.AUTOTUNE).with_options(options)


class DamagedRecordError(tf.errors.DataLossError):
    """tf.data's DataLossError ("truncated record at 47107") with the file that holds the
    damaged record, and the record where it is known; `path` is that file (None when none
    of the stream's files could be named)."""

    def __init__(self, message: str, path: str | None):
        super().__init__(None, None, message)
        self.path = path


def damaged_record_error(
    spec: PipelineSpec, stream: int, error: tf.errors.DataLossError
) -> DamagedRecordError:
    """The file (and record) of `stream` that tf.data's `error` comes from.

    tf.data names only a byte offset, of any file of an interleaved group: each of the
    stream's files is checked at that offset (`tfrecord_framing.find_damage`: the framing up
    to it; compressed files, whose offsets are of the decompressed bytes, are read).
    """
    reported = error.message.split("}}")[-1].split("[Op:")[0].strip()
    match = re.search(r"(?:truncated|corrupted) record at (\d+)", reported)
    for path in spec.stream_files(stream) if match else ():
        found = _damage_in(spec, path, int(match.group(1)), match.group(0))
        if found:
            return DamagedRecordError(f"{path}: {found} (tf.data: {reported})", path)
    files = spec.stream_files(stream)
    named = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    checked = "; none of them is damaged there now (changed since?)" if match else ""
    return DamagedRecordError(
        f"a damaged record in one of stream {stream}'s files {named} (tf.data: {reported})"
        f"{checked}",
        None,
    )


def _damage_in(spec: PipelineSpec, path: str, offset: int, reported: str) -> str | None:
    if not spec.compression:
        return tfrecord_framing.find_damage(path, offset)
    try:  # read whole: the only way to the decompressed bytes at `offset`
        dataset = tf.data.TFRecordDataset(path, compression_type=spec.compression)
        dataset.reduce(np.int64(0), lambda n, _: n + 1)
    except tf.errors.DataLossError as error:
        if re.search(re.escape(reported) + r"\b", error.message):
            return f"the record at byte {offset} of its decompressed bytes is damaged"
    return None


class StreamIterator:
    """One stream's numpy batches (`stream_batch` rows), knowing its position.

    Raises `DamagedRecordError`, naming the file, where tf.data meets a damaged record.
    """

    def __init__(self, spec: PipelineSpec, stream: int, position: dict[str, Any], counts=None):
        self.spec = spec
        self.stream = stream
        self._position = {k: int(position[k]) for k in ("epoch", "batch_in_epoch")}
        self.dataset = build_stream(spec, stream, self._position, counts)
        self._batches = self.dataset.as_numpy_iterator()

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        try:
            batch = next(self._batches)
        except tf.errors.DataLossError as error:
            raise damaged_record_error(self.spec, self.stream, error) from error
        epoch = int(batch.pop(_EPOCH_KEY))
        index = int(batch.pop(_BATCH_KEY))
        self._position = {"epoch": epoch, "batch_in_epoch": index + 1}
        return batch

    @property
    def position(self) -> dict[str, int]:
        """Where its next batch starts."""
        return dict(self._position)
