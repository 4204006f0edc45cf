r"""Raw text to BERT pretraining TFRecords: the original tool's flags, streamed and parallel.

Accepts the flags of google-research/bert's `create_pretraining_data.py` and writes the
same records (`input_ids input_mask segment_ids masked_lm_positions masked_lm_ids
masked_lm_weights next_sentence_labels`), with the same instance algorithm
(`data_pipelines.instances`) and the same masking rules (`data_pipelines.masking_rules`).

Differences from the original, for corpora that do not fit in memory and for speed:

* The corpus streams through in chunks of `--documents_per_chunk` documents. Documents
  are shuffled, "random next" sentences drawn and instances shuffled within a chunk,
  so memory does not grow with the corpus (see `instances` for why that is sound).
* Chunks are tokenized in batches by the Rust tokenizer and processed by
  `--num_workers` processes: a chunk's pairing is one task, the masking and encoding of
  each part of its instances another (see `chunk_pipeline`). Chunk `k`
  draws from a random stream seeded by (`--random_seed`, `k`), the masks of its part `j`
  from a numpy generator seeded by (`--random_seed`, `k`, `j`), and records are written
  in order, so the output is byte-identical for a seed whatever the number of workers.
* `--masking=dynamic` writes unmasked instances (with `word_starts`) for masking on the
  fly in the input pipeline; `--masking=static` (default) writes masked records like the
  original, `--dupe_factor` differently masked passes.
* `--next_sentence=false` writes single-segment instances `[CLS] text [SEP]` of contiguous
  text from one document instead of sentence pairs (`data_pipelines.single_segments`), for
  the objectives without next sentence prediction (`bert_jax.train`: "mlm", and "ltr" with
  `--masking=dynamic`). The records keep the original schema (next_sentence_labels 0).
* Nothing here imports TensorFlow (unless an input or output is a URL or a TFDS dataset):
  static masks come from `numpy_masking` (the masking rules, numpy's draws, on every path) and
  records are framed by `tfrecord_files`, so neither the main process nor a worker pays
  TensorFlow's import (several CPU seconds each).

A stats JSON is written next to the (first) output file: `<output_file>.stats.json`
(the input pipeline skips it where a shard pattern such as `out/train-*` matches it).

Example:

    python -m data_pipelines.create_pretraining_data \
        --input_file=corpus/*.txt --output_file=out/train.tfrecord \
        --vocab_file=vocab.txt --do_lower_case --max_seq_length=128 \
        --max_predictions_per_seq=20 --dupe_factor=5 --num_workers=8 --num_output_shards=8
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

# No TensorFlow import here: see the module docstring.
from data_pipelines import (
    chunk_pipeline,
    corpora,
    embedded_corpora,
    instances,
    paths,
    tfrecord_files,
    vocab_fingerprint,
)
from data_pipelines.pretraining_flags import (  # noqa: F401 - callers import them from here
    default_dupe_factor,
    options_from_flags,
    resolve_do_lower_case,
)
from data_pipelines.pretraining_flags import define_flags as _define_flags
from data_pipelines.pretraining_options import Options  # callers import Options from here

log = logging.getLogger(__name__)

_TFDS_PREFIX = "tfds:"


# ----------------------------------------------------------------------------------------
# Reading and chunking (main process).


def iter_sources(options: Options) -> Iterator[tuple[str, str]]:
    """The input's sources in reading order: ("corpus", name), ("tfds", name) or ("file",
    path), each --input_file pattern expanded when it is reached (`beam_records` reads each
    source as one task, in parallel, and orders their documents as these are ordered).

    Raises:
        FileNotFoundError: a pattern matches nothing (naming it).
    """
    if options.corpus in ("shakespeare", "peoples_daily"):
        yield "corpus", options.corpus
        return
    patterns = [p.strip() for p in options.input_file.split(",") if p.strip()]
    for pattern in patterns:
        if pattern.startswith(_TFDS_PREFIX):
            yield "tfds", pattern[len(_TFDS_PREFIX) :]
        else:
            for path in corpora.expand_input_patterns(pattern):
                yield "file", path


def source_documents(
    options: Options,
    source: tuple[str, str],
    stats: corpora.ReadStats,
    tfds_split: str | None = None,
) -> Iterator[corpora.Document]:
    """The documents of one source of `iter_sources`, in order (paragraphs marked
    `needs_split`); a TFDS source reads `tfds_split` (a part of --tfds_split) when given."""
    kind, name = source
    if kind == "corpus" and name == "shakespeare":
        # Sentence splitting (pysbd, slow) happens in the workers.
        yield from embedded_corpora.shakespeare_documents(split_sentences=False)
    elif kind == "corpus":
        yield from embedded_corpora.peoples_daily_documents()
    elif kind == "tfds":
        yield from corpora.tfds_documents(
            name,
            stats,
            split=tfds_split or options.tfds_split,
            data_dir=options.tfds_data_dir or None,
            text_key=options.tfds_text_key,
        )
    else:
        yield from corpora.read_documents(
            [name],
            stats,
            word_boundary_files=options.word_boundary_files,
            lines_are_paragraphs=options.split_sentences,
            max_undecodable_fraction=options.max_undecodable_fraction,
        )


def iter_documents(options: Options, stats: corpora.ReadStats) -> Iterator[corpora.Document]:
    """The documents of the input, in order (paragraphs marked `needs_split`)."""
    for source in iter_sources(options):
        yield from source_documents(options, source, stats)


def iter_chunks(
    documents: Iterable[corpora.Document], documents_per_chunk: int
) -> Iterator[list[corpora.Document]]:
    """Groups documents into chunks; a last chunk of one document joins the one before.

    (A lone document could not draw a "random next" B from another document.) Holds at
    most two chunks at a time.
    """
    held: list[corpora.Document] | None = None
    current: list[corpora.Document] = []
    for document in documents:
        current.append(document)
        if len(current) == documents_per_chunk:
            if held is not None:
                yield held
            held, current = current, []
    if held is not None and len(current) == 1:
        held.extend(current)
        current = []
    if held is not None:
        yield held
    if current:
        yield current


def check_outputs_are_not_inputs(options: Options) -> None:
    """Refuses output shards (or their stats JSON) that are an input file, the vocabulary
    or a word segmentation file, by real path (`paths.check_not_an_input`), or a directory.

    Raises:
        paths.OutputIsInputError: naming the output and the input.
        IsADirectoryError: naming the output.
    """
    inputs = [options.vocab_file]
    for pattern in (p.strip() for p in options.input_file.split(",")):
        if not pattern or pattern.startswith(_TFDS_PREFIX):
            continue
        try:
            files = corpora.expand_input_patterns(pattern)
        except FileNotFoundError:  # said when the input is read
            files = []
        inputs += [pattern, *files]
        if options.word_boundary_files:
            inputs += [f + corpora.WORDS_SUFFIX for f in files]
    outputs = tfrecord_files.shard_paths(options.output_file, options.num_output_shards)
    for output in [*outputs, outputs[0] + tfrecord_files.STATS_SUFFIX]:
        paths.check_not_an_input(output, inputs)
        if "://" not in output and os.path.isdir(output):  # else refused only after the run
            raise IsADirectoryError(
                f"--output_file: {output} is a directory; name the file to write in it "
                f"(e.g. {os.path.join(output, 'train.tfrecord')})"
            )


def create_pretraining_data(options: Options) -> dict[str, Any]:
    """Runs the whole conversion and writes the records and the stats JSON.

    Checks the flags, the vocabulary and that the output can be written before reading
    any input. On failure nothing is left under the output names.

    Returns:
        The stats (also written to `<first output file>.stats.json`).

    Raises:
        ValueError: bad flags, a vocabulary without [CLS]/[SEP]/[MASK], or a corpus with
            fewer than two documents.
        corpora.UndecodableInputError: an input file is mostly not UTF-8 text (more than
            `max_undecodable_fraction` of its lines); a file with fewer gets a warning.
        OSError: the output cannot be written.
        FileNotFoundError: an input pattern matches nothing.
    """
    from tqdm import tqdm

    from data_pipelines import tokenization

    options.validate()
    check_outputs_are_not_inputs(options)  # before any input is read
    started = time.perf_counter()
    # Fails early on a bad vocabulary (before any output is opened or input read).
    tokenizer = tokenization.load_tokenizer(options.vocab_file, do_lower_case=options.do_lower_case)
    read_stats = corpora.ReadStats()
    totals = instances.InstanceStats()
    masking_counts: collections.Counter = collections.Counter()
    chunks_done = 0
    with tfrecord_files.TFRecordShardWriter(
        options.output_file, options.num_output_shards
    ) as writer:
        stats_path = writer.paths[0] + tfrecord_files.STATS_SUFFIX
        check_writable(stats_path)
        documents = iter_documents(options, read_stats)
        chunks = iter_chunks(documents, options.documents_per_chunk)
        records = chunk_pipeline.iter_chunk_records(options, chunks, tokenizer)
        # Both closed on failure too: the progress bar so that an error message starts on a
        # line of its own, the records so that their workers stop before the error is shown.
        with (
            contextlib.closing(records),
            tqdm(
                desc="create_pretraining_data", unit="doc", disable=not options.show_progress
            ) as progress,
        ):
            for chunk in records:
                writer.write_framed(chunk.framed)
                totals.merge(chunk.stats)
                masking_counts.update(chunk.masking_counts)
                chunks_done += 1
                progress.update(chunk.stats.documents + chunk.stats.empty_documents)
                progress.set_postfix(instances=totals.instances)
        if chunks_done == 0:
            raise ValueError(f"no documents in the input {options.input_file or options.corpus}")
        writer.cap_shards()  # fewer instances than --num_output_shards: no empty shard
    stats_path = writer.paths[0] + tfrecord_files.STATS_SUFFIX
    seconds = time.perf_counter() - started
    stats = run_stats(
        options, writer.paths, writer.counts, read_stats, totals, masking_counts, chunks_done,
        seconds,
    )  # fmt: skip
    write_json_atomically(stats_path, stats)
    log.info(
        "wrote %d instances to %s in %.1f s", totals.instances, named_outputs(writer.paths), seconds
    )
    return stats


def named_outputs(output_files: list[str]) -> str:
    """The output files for a log line: the first and how many (thousands of shards)."""
    more = len(output_files) - 1
    return output_files[0] + (f" and {more} more shard{'s' * (more > 1)}" if more else "")


def run_stats(
    options: Options,
    output_files: list[str],
    records_per_file: list[int],
    read_stats: corpora.ReadStats,
    totals: instances.InstanceStats,
    masking_counts: collections.Counter,
    chunks: int,
    seconds: float,
) -> dict[str, Any]:
    """The stats JSON of a finished run (the vocabulary fingerprint included), and the warning
    about overlong sentences; shared with `beam_records`, so both write the same stats."""
    stats = _stats_dict(
        options, output_files, records_per_file, read_stats, totals, masking_counts, chunks,
        seconds,
    )  # fmt: skip
    # Which vocabulary the ids are of, and how the text was cased for it (tokenizer.json:
    # its own normalizer, in its bytes): the runs that read the records check both.
    stats["vocab"] = vocab_fingerprint.fingerprint(options.vocab_file, options.do_lower_case)
    _warn_of_few_instances(options, output_files, records_per_file)
    if totals.overlong_sentences:
        room = options.max_seq_length - (3 if options.next_sentence else 2)
        done = (
            f"the instances holding them were cut, {totals.truncated_tokens} tokens in all"
            if totals.truncated_tokens
            else "no token was cut (the segments around them took the cut)"
        )
        log.warning(
            "%d sentences (lines) have more tokens than an instance holds (%d): %s (see the "
            "stats' truncation); the longest line is %s (%d bytes)",
            totals.overlong_sentences, room, done,
            read_stats.longest_line or "in a non-text input", read_stats.longest_line_bytes,
        )  # fmt: skip
    return stats


def _warn_of_few_instances(
    options: Options, output_files: list[str], records_per_file: list[int]
) -> None:
    """Says where there were fewer instances than output shards: --num_output_shards capped
    (`TFRecordShardWriter.cap_shards`), or the listed --output_file names left empty."""
    instances_made = sum(records_per_file)
    if not instances_made:
        log.warning("no instance was made from %s: wrote %s, empty",
                    options.input_file or options.corpus, named_outputs(output_files))  # fmt: skip
    elif len(output_files) < options.num_output_shards:
        log.warning(
            "--num_output_shards=%d is more than the %d instances made: wrote %d shard(s) of "
            "one instance each (%s), as --num_output_shards=%d does, instead of %d empty ones",
            options.num_output_shards, instances_made, len(output_files),
            named_outputs(output_files), len(output_files),
            options.num_output_shards - instances_made,
        )  # fmt: skip
    elif len(output_files) > 1 and not all(records_per_file):
        empty = [p for p, n in zip(output_files, records_per_file, strict=True) if not n]
        log.warning(
            "--output_file names %d files but %d instances were made: %d of them empty (%s)",
            len(output_files), instances_made, len(empty), ", ".join(empty),
        )  # fmt: skip


def check_writable(path: str) -> None:
    """Raises OSError (naming `path`) when the stats file cannot be written there."""
    # A hidden temporary's name, which no shard pattern matches and a later run removes if
    # this one is killed before it does.
    probe = tfrecord_files.temporary_path(path)
    try:
        if "://" in path:  # gs://...: through tf.io.gfile (TensorFlow only for URLs)
            import tensorflow as tf

            with tf.io.gfile.GFile(probe, "w") as f:
                f.write("probe")  # GFile creates the file at its first write
            tf.io.gfile.remove(probe)
            return
        with open(probe, "w"):
            pass
        os.remove(probe)
    except Exception as error:  # tf.errors.OpError is not an OSError
        raise OSError(f"cannot write the stats file {path}: {error}") from error


def write_json_atomically(path: str, data: dict[str, Any]) -> None:
    """Writes under a temporary name, then renames: a reader never sees half a file."""
    temporary = tfrecord_files.temporary_path(path)  # hidden; removed by a later run if left
    text = json.dumps(data, indent=2) + "\n"
    if "://" in path:
        import tensorflow as tf

        with tf.io.gfile.GFile(temporary, "w") as f:
            f.write(text)
        tf.io.gfile.rename(temporary, path, overwrite=True)
        return
    with open(temporary, "w") as f:
        f.write(text)
    os.replace(temporary, path)


def _fraction(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def _stats_dict(
    options: Options,
    output_files: list[str],
    records_per_file: list[int],
    read: corpora.ReadStats,
    totals: instances.InstanceStats,
    masking: collections.Counter[str],
    chunks: int,
    seconds: float,
) -> dict[str, Any]:
    masked = masking["masked_tokens"]
    return {
        "output_files": output_files,
        "records_per_file": records_per_file,
        "inputs": {
            "files": read.files,
            "empty_files_skipped": read.empty_files,
            "lines": read.lines,
            "lines_with_bad_bytes": read.lines_with_bad_bytes,
            "replaced_chars": read.replaced_chars,
            "longest_line": {"at": read.longest_line, "bytes": read.longest_line_bytes},
        },
        "documents": totals.documents,
        "empty_documents_skipped": totals.empty_documents,
        "one_sentence_documents": totals.one_sentence_documents,
        "sentences": totals.sentences,
        "tokens": totals.tokens,
        "overlong_sentences": totals.overlong_sentences,
        "chunks": chunks,
        "instances": totals.instances,
        "instance_tokens": totals.instance_tokens,
        # Sentence pairs with NSP labels, or single segments [CLS] text [SEP] (no "nsp" below).
        "next_sentence": options.next_sentence,
        "nsp": None
        if not options.next_sentence
        else {
            "is_next": totals.instances - totals.random_next,
            "random_next": totals.random_next,
            "is_next_fraction": _fraction(totals.instances - totals.random_next, totals.instances),
            # Single-sentence pairs must take a random B; the others flip a fair coin.
            "forced_random_next": totals.forced_random_next,
            "is_next_fraction_of_coin_flips": _fraction(
                totals.instances - totals.random_next,
                totals.instances - totals.forced_random_next,
            ),
        },
        "truncation": {
            "instances": totals.truncated_instances,
            "tokens_removed": totals.truncated_tokens,
            # What tokens_removed is a part of: the instances' tokens before truncation. Not
            # `tokens` above: a sentence counts each time an instance uses it (each of
            # dupe_factor passes, and as another document's random B segment).
            "tokens_before_truncation": totals.instance_tokens
            - (3 if options.next_sentence else 2) * totals.instances
            + totals.truncated_tokens,
        },
        "masking": None
        if options.masking == "dynamic"
        else {
            "eligible_tokens": masking["eligible_tokens"],
            "masked_tokens": masked,
            "masked_fraction": _fraction(masked, masking["eligible_tokens"]),
            "mask_token": masking["mask_token"],
            "random_token": masking["random_token"],
            "unchanged": masking["unchanged"],
            "mask_token_fraction": _fraction(masking["mask_token"], masked),
            "random_token_fraction": _fraction(masking["random_token"], masked),
            "unchanged_fraction": _fraction(masking["unchanged"], masked),
        },
        "timing": {
            "seconds": round(seconds, 3),
            "instances_per_second": round(totals.instances / seconds, 1) if seconds else None,
        },
        "options": dataclasses.asdict(options),
    }


# ----------------------------------------------------------------------------------------
# Command line.


class Terminated(BaseException):
    """SIGTERM arrived; a BaseException like KeyboardInterrupt, so no `except Exception`
    swallows it on the way out."""


def unwind_on_sigterm() -> None:
    """Makes SIGTERM (a preempted VM's notice, `kill`) unwind the run as Ctrl-C does: the
    shard writer's `with` block then removes its temporaries (by default SIGTERM ends the
    process at once, leaving them; a later run removes them, but it may never come).
    `beam_records` too: its temporaries and Beam's temporary directories."""
    main_pid = os.getpid()

    def handler(signum, frame):
        if os.getpid() != main_pid:  # a forked worker: end as SIGTERM's default would
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        signal.signal(signum, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str]) -> None:
    """Entry point: flags to `Options`, then `create_pretraining_data`."""
    del argv
    from absl import flags

    unwind_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    options = options_from_flags(flags.FLAGS)
    from data_pipelines.tokenization import VocabError

    try:
        stats = create_pretraining_data(options)
    except (corpora.UndecodableInputError, VocabError, paths.OutputIsInputError) as error:
        # Not a bug to trace: one line naming the file (no output was written).
        raise SystemExit(f"create_pretraining_data: {error}") from None
    except (ValueError, OSError) as error:
        # A flag out of range, an input without documents (or too few to pair), an output
        # that cannot be written: one line naming it, as beam_records says them.
        raise SystemExit(f"create_pretraining_data: {error}") from None
    except Terminated:
        sys.stderr.write(
            f"create_pretraining_data: stopped by SIGTERM before it finished; its temporary "
            f"files are removed ({options.output_file})\n"
        )
        sys.exit(128 + signal.SIGTERM)  # the shell's code for a process SIGTERM ended
    print(json.dumps({k: stats[k] for k in ("documents", "instances", "nsp", "masking")}))


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli, pretraining_flags

    _define_flags()
    flags.adopt_module_key_flags(pretraining_flags)  # --help lists them
    flags.mark_flags_as_required(["output_file", "vocab_file"])
    cli.run(main)
