r"""`create_pretraining_data`'s records, made by an Apache Beam pipeline (Dataflow, Flink, Spark).

The same flags as `create_pretraining_data`, plus Beam's pipeline options (`--runner`,
`--direct_num_workers`, `--direct_running_mode`, Dataflow's `--project`, `--region`,
`--temp_location`, `--sdk_container_image` or `--requirements_file`), and the same output:
the sharded TFRecords and the stats JSON beside the first shard, byte for byte, for a seed.
It runs from its own virtualenv, `.venv-beam` (`make beam-venv`: apache-beam 2.77.0 needs
protobuf < 7, which the main .venv's sentencepiece cannot import under); see
docs/data_at_scale.md.

The pipeline, and why its records are the tool's:

1. read: each source of `create_pretraining_data.iter_sources` (an input file, an embedded
   corpus, or one of `--tfds_parts` parts of a TFDS split) is one task, which numbers its
   documents (`create_pretraining_data.source_documents`, the tool's reader).
2. chunk: the sources' document counts (a side input) give each document its place in the
   input and so its chunk, by `create_pretraining_data.iter_chunks`' rule
   (`--documents_per_chunk` documents in a row; a last chunk of one document joins the one
   before). A chunk's documents are grouped, put in order and made into framed records by
   `chunk_pipeline.ChunkProcessor`, the multi-process tool's per-chunk code: chunk `k`
   draws from the stream seeded by (`--random_seed`, `k`) wherever it runs.
3. shard: the chunks' record counts (a side input) give each record its place `g` in the
   tool's output order; it goes to shard `g mod N`, as the tool's round-robin writer puts
   it. Each shard's pieces are written in chunk order to the shard's hidden temporary.
4. this process renames the set into place (`tfrecord_files.publish_shard_set`: all or none)
   and writes the stats JSON (`create_pretraining_data.run_stats`).

Input errors inside the pipeline (text that is not UTF-8, a chunk without two documents)
fail it with the tool's one-line message, naming the file; nothing is left under the
output names.

Example (2 local processes):

    .venv-beam/bin/python -m data_pipelines.beam_records \
        --input_file=corpus/*.txt --output_file=out/train.tfrecord --vocab_file=vocab.txt \
        --num_output_shards=8 --runner=DirectRunner --direct_num_workers=2 \
        --direct_running_mode=multi_processing
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import operator
import os
import re
import sys
import time
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from data_pipelines import (
    chunk_pipeline,
    corpora,
    instances,
    paths,
    pretraining_records,
    tfrecord_files,
)
from data_pipelines import create_pretraining_data as tool
from data_pipelines.pretraining_options import Options

log = logging.getLogger(__name__)

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


def _input_error_in(error: BaseException) -> Exception | None:
    """The worker's input error that `error` (the runner's) carries, rebuilt; else None."""
    match = _MARK.search(str(error))
    if match is None:
        return None
    return _KINDS[match.group(1)](match.group(2))


# ----------------------------------------------------------------------------------------
# The pipeline's steps.


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


def _read_text(path: str) -> str:
    if "://" in path:
        import tensorflow as tf

        with tf.io.gfile.GFile(path) as f:
            return f.read()
    with open(path) as f:
        return f.read()


@dataclasses.dataclass
class Plan:
    """What one run reads and writes: its sources, shards and their temporaries."""

    sources: list[tuple[int, tuple[str, str], tuple[int, int] | None]]
    shard_paths: list[str]
    temporaries: list[str]
    summary_path: str


def make_plan(options: Options, tfds_parts: int) -> Plan:
    """The sources (each pattern expanded; a TFDS split in `tfds_parts` parts) and outputs."""
    sources = []
    for source in tool.iter_sources(options):
        parts = [(i, tfds_parts) for i in range(tfds_parts)] if source[0] == "tfds" else [None]
        sources += [(len(sources) + i, source, part) for i, part in enumerate(parts)]
    shard_paths = tfrecord_files.shard_paths(options.output_file, options.num_output_shards)
    if len(set(shard_paths)) != len(shard_paths):
        raise ValueError(f"duplicate output paths: {shard_paths}")
    temporaries = [tfrecord_files.temporary_path(p) for p in shard_paths]
    summary = tfrecord_files.temporary_path(shard_paths[0] + ".beam-summary.json")
    return Plan(sources, shard_paths, temporaries, summary)


def build(pipeline: beam.Pipeline, options: Options, tokenizer: Any, plan: Plan) -> None:
    """The pipeline's steps (see the module docstring), applied to `pipeline`."""
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


# ----------------------------------------------------------------------------------------
# The driver.


def describe(options: Options, beam_args: list[str], tfds_parts: int) -> dict[str, Any]:
    """The job a run would submit, touching no file: its runner, pipeline options, steps,
    inputs and outputs (`--dry_run`; needs no cloud account)."""
    options.validate()
    plan = Plan([], tfrecord_files.shard_paths(options.output_file, options.num_output_shards),
                [], "")  # fmt: skip
    pipeline_options = PipelineOptions(beam_args).get_all_options(drop_default=True)
    # The graph is built on a runner that needs nothing installed; it is never run.
    pipeline = beam.Pipeline(runner="DirectRunner", options=PipelineOptions([]))
    build(pipeline, options, None, plan)
    return {
        "runner": pipeline_options.get("runner") or "DirectRunner",
        "pipeline_options": pipeline_options,
        "steps": [t.full_label for t in pipeline.transforms_stack[0].parts],
        "input": options.input_file or f"corpus:{options.corpus}",
        "tfds_parts": tfds_parts,
        "output_files": {"first": plan.shard_paths[0], "shards": len(plan.shard_paths)},
        "stats_file": plan.shard_paths[0] + tfrecord_files.STATS_SUFFIX,
        "options": dataclasses.asdict(options),
    }


def beam_records(options: Options, beam_args: list[str], tfds_parts: int = 32) -> dict[str, Any]:
    """Runs the pipeline and writes the records and the stats JSON, as the tool does.

    Checks the flags, the vocabulary, the input patterns and that the output can be written
    before the pipeline starts. On failure nothing is left under the output names.

    Returns:
        The stats (also written to `<first output file>.stats.json`).

    Raises:
        What `create_pretraining_data.create_pretraining_data` raises for the same input,
        with the same messages.
    """
    from data_pipelines import tokenization

    options.validate()
    tool.check_outputs_are_not_inputs(options)
    started = time.perf_counter()
    tokenizer = tokenization.load_tokenizer(options.vocab_file, do_lower_case=options.do_lower_case)
    plan = make_plan(options, tfds_parts)
    stats_path = plan.shard_paths[0] + tfrecord_files.STATS_SUFFIX
    for directory in sorted({os.path.dirname(p) for p in plan.shard_paths}):
        tfrecord_files.remove_stale_temporaries(directory or ".")
        if "://" not in directory:
            os.makedirs(directory or ".", exist_ok=True)
    tool.check_writable(stats_path)
    try:
        if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
            beam_args = [*beam_args, "--default_sdk_harness_log_level=WARNING"]
        pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
        build(pipeline, options, tokenizer, plan)
        try:
            state = pipeline.run().wait_until_finish()
        except Exception as error:  # noqa: BLE001 - re-raised, as the tool's error if it is one
            rebuilt = _input_error_in(error)
            if rebuilt is None:
                raise
            raise rebuilt from None
        if state not in (None, "DONE"):
            raise RuntimeError(f"the Beam pipeline ended {state}")
        summary = json.loads(_read_text(plan.summary_path))
        if summary["chunks"] == 0:
            raise ValueError(f"no documents in the input {options.input_file or options.corpus}")
        counts = [summary["records_per_shard"].get(str(s), 0) for s in range(len(plan.shard_paths))]
        for shard, count in enumerate(counts):
            if not count:  # a shard no record went to: empty, as the tool leaves it
                with tfrecord_files.open_for_writing(
                    plan.shard_paths[shard], plan.temporaries[shard]
                ):
                    pass
        tfrecord_files.publish_shard_set(plan.temporaries, plan.shard_paths)
    except BaseException:
        for temporary in plan.temporaries:
            with contextlib.suppress(Exception):
                tfrecord_files._remove(temporary)
        raise
    finally:
        with contextlib.suppress(Exception):
            tfrecord_files._remove(plan.summary_path)
    seconds = time.perf_counter() - started
    read = corpora.ReadStats(**summary["read"])
    totals = instances.InstanceStats(**summary["totals"])
    masking = collections.Counter(summary["masking"])
    stats = tool.run_stats(
        options, plan.shard_paths, counts, read, totals, masking, summary["chunks"], seconds
    )
    tool.write_json_atomically(stats_path, stats)
    log.info("wrote %d instances to %s in %.1f s", totals.instances, plan.shard_paths, seconds)
    return stats


# ----------------------------------------------------------------------------------------
# Command line.


def split_argv(argv: list[str], ours) -> tuple[list[str], list[str]]:
    """(the flags `ours` defines, with argv[0]; Beam's pipeline options). A flag neither
    defines is an error naming it."""
    known = set(PipelineOptions([]).get_all_options().keys())
    mine, theirs = argv[:1], []
    for arg in argv[1:]:
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        bare = name[2:] if name.startswith("no") else name
        if not name or name in ours or bare in ours:
            mine.append(arg)
        elif name in known:
            theirs.append(arg)
        else:
            raise SystemExit(
                f"beam_records: unknown flag --{name} (neither create_pretraining_data's nor "
                "an Apache Beam pipeline option; Beam's take the form --name=value)"
            )
    return mine, theirs


_BEAM_ARGS: list[str] = []


def main(argv: list[str]) -> None:
    """Entry point: flags to `Options`, then `beam_records` (or `describe` with --dry_run)."""
    del argv
    from absl import flags

    from data_pipelines import cli
    from data_pipelines.tokenization import VocabError

    f = flags.FLAGS
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cli.progress_logging(__name__, tool.__name__)
    logging.getLogger("apache_beam").setLevel(logging.WARNING)  # its workers' every step
    options = tool.options_from_flags(f)
    if f.dry_run:
        print(json.dumps(describe(options, _BEAM_ARGS, f.tfds_parts), indent=2))
        return
    try:
        stats = beam_records(options, _BEAM_ARGS, f.tfds_parts)
    except (corpora.UndecodableInputError, VocabError, paths.OutputIsInputError) as error:
        raise SystemExit(f"beam_records: {error}") from None
    except ValueError as error:  # an input without documents, a chunk that cannot pair
        raise SystemExit(f"beam_records: {error}") from None
    print(json.dumps({k: stats[k] for k in ("documents", "instances", "nsp", "masking")}))


def define_flags() -> None:
    """The tool's flags, and this one's own."""
    from absl import flags

    from data_pipelines import pretraining_flags

    pretraining_flags.define_flags()
    flags.DEFINE_integer(
        "tfds_parts", 32, "Parts a tfds: input is read in, in parallel (the records do not "
        "depend on it)."
    )  # fmt: skip
    flags.DEFINE_bool(
        "dry_run", False, "Print the job (runner, pipeline options, steps, outputs) as JSON "
        "and run nothing: no file is read, no cloud account needed."
    )  # fmt: skip
    flags.mark_flags_as_required(["output_file", "vocab_file"])


def run_cli() -> None:
    """Beam's pipeline options taken out of the command line, then `main`."""
    from absl import flags

    from data_pipelines import cli

    sys.argv, _BEAM_ARGS[:] = split_argv(sys.argv, set(flags.FLAGS))
    cli.run(main)


if __name__ == "__main__":
    from absl import flags

    # Through the module's own name: the pipeline's steps must be importable by the workers
    # (a class of __main__ is not).
    from data_pipelines import beam_records, pretraining_flags

    beam_records.define_flags()
    flags.adopt_module_key_flags(pretraining_flags)  # --help lists them
    flags.adopt_module_key_flags(beam_records)
    beam_records.run_cli()
