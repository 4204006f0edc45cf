"""The steps of `beam_records`' pipeline (see its docstring): Apache Beam transforms over the
tool's own reader (`create_pretraining_data.source_documents`) and per-chunk code
(`chunk_pipeline.ChunkProcessor`). Imports apache_beam: only `.venv-beam` has it."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import operator
import os
import re
from typing import Any

import apache_beam as beam

from data_pipelines import chunk_pipeline, corpora, instances, pretraining_records, tfrecord_files
from data_pipelines import create_pretraining_data as tool
from data_pipelines.pretraining_options import Options

# An input error raised in a worker reaches this process inside the runner's error text;
# marked so, it is raised here again as the tool raises it (its type, its one line).
_MARK = re.compile(r"beam_records input error \[(\w+)\]: (.*?) \[end of message\]")
_KINDS = {
    "UndecodableInputError": corpora.UndecodableInputError,
    "FileNotFoundError": FileNotFoundError,
    "KeyError": KeyError,
    "ValueError": ValueError,
}


class _MarkedInputError(RuntimeError):
    """An input error of a worker, its type and message marked for the driver."""


@contextlib.contextmanager
def _marked_input_errors():
    try:
        yield
    except (ValueError, FileNotFoundError, KeyError) as error:
        kind = next(name for name, cls in _KINDS.items() if isinstance(error, cls))
        message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        raise _MarkedInputError(
            f"beam_records input error [{kind}]: {message} [end of message]"
        ) from error


def input_error_in(error: BaseException) -> Exception | None:
    """The worker's input error that `error` (the runner's) carries, rebuilt; else None."""
    match = _MARK.search(str(error))
    if match is None:
        return None
    return _KINDS[match.group(1)](match.group(2))


def chunk_of(position: int, total: int, per_chunk: int) -> int:
    """The chunk of the document at `position` of `total`: `iter_chunks`' grouping."""
    last_joins = total % per_chunk == 1 and total > per_chunk
    if last_joins and position == total - 1:
        return total // per_chunk - 1
    return position // per_chunk


class _ReadSource(beam.DoFn):
    """(source index, source, TFDS part) -> (source index, n, document) for each document,
    and its (source index, documents, ReadStats) to the "counts" output."""

    def __init__(self, options: Options):
        self.options = options

    def process(self, element):
        index, source, part = element
        stats = corpora.ReadStats()
        split = None
        if part is not None:
            import tensorflow_datasets as tfds

            split = tfds.even_splits(self.options.tfds_split, part[1])[part[0]]
        count = 0
        with _marked_input_errors():
            for document in tool.source_documents(self.options, source, stats, split):
                yield index, count, document
                count += 1
        if part is not None and part[0] > 0:
            stats.files -= 1  # a dataset counts once, in its first part
        yield beam.pvalue.TaggedOutput("counts", (index, count, stats))


def _offsets(counts: list[tuple[int, int]]) -> tuple[dict[int, int], int]:
    """{key: where its items start in the whole}, and the total, from (key, count) pairs."""
    offsets, total = {}, 0
    for key, count in sorted(counts, key=operator.itemgetter(0)):
        offsets[key] = total
        total += count
    return offsets, total


def _key_by_chunk(element, layout, per_chunk: int):
    index, number, document = element
    offsets, total = layout
    position = offsets[index] + number
    return chunk_of(position, total, per_chunk), (position, document)


class _MakeChunk(beam.DoFn):
    """(chunk index, its documents) -> (chunk index, framed records), and (chunk index,
    records, InstanceStats, masking counts) to the "stats" output."""

    def __init__(self, options: Options, tokenizer: Any):
        self.options = options
        self.tokenizer = tokenizer
        self._processor = None

    def setup(self):
        # One core per worker process, as the tool's workers: the processes are the parallelism.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self._processor = chunk_pipeline.ChunkProcessor(
            self.options, self.tokenizer, pretraining_records.MASK_BATCH
        )

    def process(self, element):
        index, members = element
        documents = [d for _, d in sorted(members, key=operator.itemgetter(0))]
        with _marked_input_errors():
            chunk = self._processor(index, documents)
        yield index, chunk.framed
        stats = (index, len(chunk.framed), chunk.stats, dict(chunk.masking_counts))
        yield beam.pvalue.TaggedOutput("stats", stats)


def _shard_pieces(element, layout, num_shards: int):
    """A chunk's records -> (shard, (chunk index, their bytes, count)) per shard they go to."""
    index, framed = element
    start = layout[0][index]
    for residue in range(min(num_shards, len(framed))):
        piece = framed[residue::num_shards]
        yield (start + residue) % num_shards, (index, b"".join(piece), len(piece))


class _WriteShard(beam.DoFn):
    """(shard, its pieces) -> the shard's temporary written in chunk order; (shard, records)."""

    def __init__(self, shard_paths: list[str], temporaries: list[str]):
        self.shard_paths = shard_paths
        self.temporaries = temporaries

    def process(self, element):
        shard, pieces = element
        pieces = sorted(pieces, key=operator.itemgetter(0))
        path, temporary = self.shard_paths[shard], self.temporaries[shard]
        with tfrecord_files.open_for_writing(path, temporary) as f:
            for _, data, _ in pieces:
                f.write(data)
        yield shard, sum(count for _, _, count in pieces)


class _SumChunkStats(beam.CombineFn):
    """The chunks' (count, InstanceStats, masking counts), summed (their order does not matter)."""

    def create_accumulator(self):
        return 0, instances.InstanceStats(), collections.Counter()

    def add_input(self, accumulator, element):
        chunks, totals, masking = accumulator
        _, _, stats, counts = element
        totals.merge(stats)
        masking.update(counts)
        return chunks + 1, totals, masking

    def merge_accumulators(self, accumulators):
        chunks, totals, masking = self.create_accumulator()
        for more, stats, counts in accumulators:
            chunks += more
            totals.merge(stats)
            masking.update(counts)
        return chunks, totals, masking

    def extract_output(self, accumulator):
        return accumulator


def _write_summary(_, read_counts, chunk_totals, shard_counts, path: str) -> None:
    """What the driver's stats need, as JSON: the sources' read stats merged in input order
    (the longest line's tie goes to the first, as in the tool), the chunks' sums, the shards'
    record counts."""
    read = corpora.ReadStats()
    for _, _, stats in sorted(read_counts, key=operator.itemgetter(0)):
        read.merge(stats)
    chunks, totals, masking = chunk_totals
    summary = {
        "read": dataclasses.asdict(read),
        "totals": dataclasses.asdict(totals),
        "masking": dict(masking),
        "chunks": chunks,
        "records_per_shard": dict(shard_counts),
    }
    _write_text(path, json.dumps(summary))


def _write_text(path: str, text: str) -> None:
    if "://" in path:
        import tensorflow as tf

        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)
        return
    with open(path, "w") as f:
        f.write(text)


def build(pipeline: beam.Pipeline, options: Options, tokenizer: Any, plan: Any) -> None:
    """The pipeline's steps (see `beam_records`' docstring) applied to `pipeline`, for a
    `beam_records.Plan`."""
    read = (
        pipeline
        | "Sources" >> beam.Create(plan.sources, reshuffle=True)
        | "Read" >> beam.ParDo(_ReadSource(options)).with_outputs("counts", main="documents")
    )
    read_counts = read.counts | "ReadCounts" >> beam.combiners.ToList()
    document_layout = read_counts | "DocumentLayout" >> beam.Map(
        lambda counts: _offsets([(i, n) for i, n, _ in counts])
    )
    chunks = (
        read.documents
        | "KeyByChunk"
        >> beam.Map(
            _key_by_chunk, beam.pvalue.AsSingleton(document_layout), options.documents_per_chunk
        )
        | "GroupChunks" >> beam.GroupByKey()
        | "MakeChunk"
        >> beam.ParDo(_MakeChunk(options, tokenizer)).with_outputs("stats", main="records")
    )
    record_layout = (
        chunks.stats
        | "ChunkCounts" >> beam.Map(lambda s: (s[0], s[1]))
        | "ChunkCountList" >> beam.combiners.ToList()
        | "RecordLayout" >> beam.Map(_offsets)
    )
    shard_counts = (
        chunks.records
        | "ShardPieces"
        >> beam.FlatMap(
            _shard_pieces, beam.pvalue.AsSingleton(record_layout), len(plan.shard_paths)
        )
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShard" >> beam.ParDo(_WriteShard(plan.shard_paths, plan.temporaries))
        | "ShardCounts" >> beam.combiners.ToList()
    )
    chunk_totals = chunks.stats | "SumChunkStats" >> beam.CombineGlobally(_SumChunkStats())
    _ = (
        pipeline
        | "Once" >> beam.Create([None])
        | "WriteSummary"
        >> beam.Map(
            _write_summary,
            beam.pvalue.AsSingleton(read_counts),
            beam.pvalue.AsSingleton(chunk_totals),
            beam.pvalue.AsSingleton(shard_counts),
            plan.summary_path,
        )
    )
