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
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

from data_pipelines import (
    corpora,
    instances,
    paths,
    tfrecord_files,
)
from data_pipelines import create_pretraining_data as tool
from data_pipelines.pretraining_options import Options

log = logging.getLogger(__name__)


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


# ----------------------------------------------------------------------------------------
# The driver.


def describe(options: Options, beam_args: list[str], tfds_parts: int) -> dict[str, Any]:
    """The job a run would submit, touching no file: its runner, pipeline options, steps,
    inputs and outputs (`--dry_run`; needs no cloud account)."""
    options.validate()
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from data_pipelines import beam_pipeline

    plan = Plan([], tfrecord_files.shard_paths(options.output_file, options.num_output_shards),
                [], "")  # fmt: skip
    pipeline_options = PipelineOptions(beam_args).get_all_options(drop_default=True)
    # The graph is built on a runner that needs nothing installed; it is never run.
    pipeline = beam.Pipeline(runner="DirectRunner", options=PipelineOptions([]))
    try:
        beam_pipeline.build(pipeline, options, None, plan)
    finally:  # a pipeline makes a temporary directory when built and removes it only when run
        shutil.rmtree(pipeline.local_tempdir, ignore_errors=True)
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
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from data_pipelines import beam_pipeline, tokenization

    options.validate()
    tool.check_outputs_are_not_inputs(options)
    started = time.perf_counter()
    tokenizer = tokenization.load_tokenizer(options.vocab_file, do_lower_case=options.do_lower_case)
    plan = make_plan(options, tfds_parts)
    made: list[str] = []  # output directories this run made: removed again if it fails
    for directory in sorted({os.path.dirname(p) for p in plan.shard_paths}):
        tfrecord_files.remove_stale_temporaries(directory or ".")
        made += paths.make_directories(directory)
    try:
        tool.check_writable(plan.shard_paths[0] + tfrecord_files.STATS_SUFFIX)
        if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
            beam_args = [*beam_args, "--default_sdk_harness_log_level=WARNING"]
        with private_tempdir():
            pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
            beam_pipeline.build(pipeline, options, tokenizer, plan)
            try:
                state = pipeline.run().wait_until_finish()
            except Exception as error:  # noqa: BLE001 - re-raised, as the tool's error if one
                rebuilt = beam_pipeline.input_error_in(error)
                if rebuilt is None:
                    raise
                raise rebuilt from None
        if state not in (None, "DONE"):
            raise RuntimeError(f"the Beam pipeline ended {state}")
        summary = json.loads(_read_text(plan.summary_path))
        if summary["chunks"] == 0:
            raise ValueError(f"no documents in the input {options.input_file or options.corpus}")
        counts = [summary["records_per_shard"].get(str(s), 0) for s in range(len(plan.shard_paths))]
        # Fewer records than shards: one shard each, as the tool's writer caps them (record g
        # went to shard g, so the first shards' pieces are that set's, renamed).
        shard_paths = tfrecord_files.capped_shard_paths(
            options.output_file, len(plan.shard_paths), sum(counts)
        ) or plan.shard_paths  # fmt: skip
        temporaries, counts = plan.temporaries[: len(shard_paths)], counts[: len(shard_paths)]
        for shard, count in enumerate(counts):
            if not count:  # a shard no record went to: empty, as the tool leaves it
                with tfrecord_files.open_for_writing(shard_paths[shard], temporaries[shard]):
                    pass
        tfrecord_files.publish_shard_set(temporaries, shard_paths)
    except BaseException:
        for temporary in [*plan.temporaries, plan.summary_path]:
            with contextlib.suppress(Exception):
                tfrecord_files._remove(temporary)
        paths.remove_empty_directories(made)
        raise
    finally:
        with contextlib.suppress(Exception):
            tfrecord_files._remove(plan.summary_path)
    seconds = time.perf_counter() - started
    read = corpora.ReadStats(**summary["read"])
    totals = instances.InstanceStats(**summary["totals"])
    masking = collections.Counter(summary["masking"])
    stats = tool.run_stats(
        options, shard_paths, counts, read, totals, masking, summary["chunks"], seconds
    )
    tool.write_json_atomically(shard_paths[0] + tfrecord_files.STATS_SUFFIX, stats)
    named = tool.named_outputs(shard_paths)
    log.info("wrote %d instances to %s in %.1f s", totals.instances, named, seconds)
    return stats


@contextlib.contextmanager
def private_tempdir():
    """Beam's runner and its worker processes make directories in TMPDIR (`beam-temp*`, `tmp*`,
    `beam-requirements-cache`) and leave them after every run: inside this block they are
    made in one directory of this run's, which is removed when the block ends, whether the
    pipeline succeeded or failed."""
    directory = tempfile.mkdtemp(prefix="beam_records-")
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = directory  # the workers inherit the variable
    try:
        yield directory
    finally:
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
        shutil.rmtree(directory, ignore_errors=True)


# ----------------------------------------------------------------------------------------
# Command line.


def split_argv(argv: list[str], ours) -> tuple[list[str], list[str]]:
    """(the flags `ours` defines, with argv[0]; Beam's pipeline options). A flag neither
    defines is an error naming it."""
    known: set[str] | None = None
    mine, theirs = argv[:1], []
    ours = {*ours, *HELP_FLAGS}  # cli.run defines them: --help works without apache-beam
    for arg in argv[1:]:
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        bare = name[2:] if name.startswith("no") else name
        if not name or name in ours or bare in ours:
            mine.append(arg)
            continue
        if known is None:
            known = _beam_option_names()
        if name in known:
            theirs.append(arg)
        else:
            raise SystemExit(
                f"beam_records: unknown flag --{name} (neither create_pretraining_data's nor "
                "an Apache Beam pipeline option; Beam's take the form --name=value)"
            )
    return mine, theirs


def _beam_option_names() -> set[str]:
    try:
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:
        raise SystemExit(
            "beam_records: Beam's pipeline options need apache-beam, which only .venv-beam "
            "has: make beam-venv, then .venv-beam/bin/python -m data_pipelines.beam_records"
        ) from None
    return set(PipelineOptions([]).get_all_options().keys())


HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml")
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
    tool.unwind_on_sigterm()  # so that SIGTERM too removes what the run made
    try:
        stats = beam_records(options, _BEAM_ARGS, f.tfds_parts)
    except tool.Terminated:
        sys.stderr.write(
            f"beam_records: stopped by SIGTERM before it finished; its temporary files and "
            f"directories are removed ({options.output_file})\n"
        )
        sys.exit(128 + signal.SIGTERM)  # the shell's code for a process SIGTERM ended
    except (corpora.UndecodableInputError, VocabError, paths.OutputIsInputError) as error:
        raise SystemExit(f"beam_records: {error}") from None
    except (ValueError, OSError) as error:  # a flag out of range, an input without
        # documents, a chunk that cannot pair, an output that cannot be written
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
