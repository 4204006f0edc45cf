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
  each part of its instances another (see "One chunk, in two stages" below). Chunk `k`
  draws from a random stream seeded by (`--random_seed`, `k`), the masks of its part `j`
  from a numpy generator seeded by (`--random_seed`, `k`, `j`), and records are written
  in order, so the output is byte-identical for a seed whatever the number of workers.
* `--masking=dynamic` writes unmasked instances (with `word_starts`) for masking on the
  fly in the input pipeline; `--masking=static` (default) writes masked records like the
  original, `--dupe_factor` differently masked passes.
* Nothing here imports TensorFlow (unless an input or output is a URL or a TFDS dataset):
  static masks come from `numpy_masking` (the masking rules, numpy's draws, on every path) and
  records are framed by `tfrecord_files`, so neither the main process nor a worker pays
  TensorFlow's import (several CPU seconds each).

A stats JSON is written next to the (first) output file: `<output_file>.stats.json`.

Example:

    python -m data_pipelines.create_pretraining_data \
        --input_file=corpus/*.txt --output_file=out/train.tfrecord \
        --vocab_file=vocab.txt --do_lower_case --max_seq_length=128 \
        --max_predictions_per_seq=20 --dupe_factor=5 --num_workers=8 --num_output_shards=8
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import multiprocessing
import os
import pickle
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

# No TensorFlow import here: see the module docstring.
from data_pipelines import corpora, instances, pretraining_records, tfrecord_files

log = logging.getLogger(__name__)

CORPORA = ("shakespeare", "peoples_daily")
_TFDS_PREFIX = "tfds:"


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything that decides the output (picklable, sent to the worker processes)."""

    input_file: str  # comma-separated files/globs, or "tfds:NAME" entries
    output_file: str  # comma-separated output files (records go round-robin)
    vocab_file: str  # WordPiece vocab.txt or sentencepiece .model
    do_lower_case: bool = True  # lower-case (and strip accents) before WordPiece
    do_whole_word_mask: bool = False  # mask whole words instead of single pieces
    max_seq_length: int = 128  # [CLS] A [SEP] B [SEP] at most this long
    max_predictions_per_seq: int = 20  # masked positions per instance at most
    random_seed: int = 12345  # seeds instance creation and masking
    dupe_factor: int = 10  # passes over the corpus (with different masks)
    masked_lm_prob: float = 0.15  # fraction of tokens to predict
    short_seq_prob: float = 0.1  # probability of a shorter target length
    num_output_shards: int = 1  # shards made from a single --output_file
    num_workers: int = 1  # processes over chunks; 1 works in this process
    masking: str = "static"  # "static": masked records; "dynamic": unmasked + word_starts
    corpus: str = ""  # an embedded corpus instead of --input_file
    documents_per_chunk: int = 256  # documents shuffled/paired together
    split_sentences: bool = False  # input lines are paragraphs: split them with pysbd
    language: str = "en"  # pysbd language for sentence splitting
    word_boundary_files: bool = False  # read word segmentations from <input>.words
    max_undecodable_fraction: float = 0.5  # refuse a file with more of its lines not UTF-8
    tfds_data_dir: str = ""  # data_dir of "tfds:" inputs
    tfds_split: str = "train"  # split of "tfds:" inputs
    tfds_text_key: str = "text"  # text feature of "tfds:" inputs
    show_progress: bool = True  # tqdm progress bar

    def validate(self) -> None:
        """Raises ValueError naming the flag of any value out of range."""
        checks = [
            (self.max_seq_length >= 5, "--max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP])"),
            (self.max_predictions_per_seq >= 1, "--max_predictions_per_seq must be >= 1"),
            (self.dupe_factor >= 1, "--dupe_factor must be >= 1"),
            (0.0 < self.masked_lm_prob <= 1.0, "--masked_lm_prob must be in (0, 1]"),
            (0.0 <= self.short_seq_prob <= 1.0, "--short_seq_prob must be in [0, 1]"),
            (self.num_workers >= 1, "--num_workers must be >= 1"),
            (self.num_output_shards >= 1, "--num_output_shards must be >= 1"),
            (self.documents_per_chunk >= 2, "--documents_per_chunk must be >= 2"),
            (
                0.0 <= self.max_undecodable_fraction <= 1.0,
                "--max_undecodable_fraction must be in [0, 1]",
            ),
            (self.masking in ("static", "dynamic"), "--masking must be static or dynamic"),
            (self.corpus in ("", *CORPORA), f"--corpus must be one of {CORPORA}"),
            (bool(self.corpus) != bool(self.input_file), "give --input_file or --corpus"),
            (bool(self.output_file), "--output_file is required"),
            (bool(self.vocab_file), "--vocab_file is required"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


# ----------------------------------------------------------------------------------------
# Reading and chunking (main process).


def iter_documents(options: Options, stats: corpora.ReadStats) -> Iterator[corpora.Document]:
    """The documents of the input, in order (paragraphs marked `needs_split`)."""
    if options.corpus == "shakespeare":
        # Sentence splitting (pysbd, slow) happens in the workers.
        yield from corpora.shakespeare_documents(split_sentences=False)
        return
    if options.corpus == "peoples_daily":
        yield from corpora.peoples_daily_documents()
        return
    patterns = [p.strip() for p in options.input_file.split(",") if p.strip()]
    for pattern in patterns:
        if pattern.startswith(_TFDS_PREFIX):
            yield from corpora.tfds_documents(
                pattern[len(_TFDS_PREFIX) :],
                stats,
                split=options.tfds_split,
                data_dir=options.tfds_data_dir or None,
                text_key=options.tfds_text_key,
            )
        else:
            yield from corpora.read_documents(
                corpora.expand_input_patterns(pattern),
                stats,
                word_boundary_files=options.word_boundary_files,
                lines_are_paragraphs=options.split_sentences,
                max_undecodable_fraction=options.max_undecodable_fraction,
            )


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


# ----------------------------------------------------------------------------------------
# One chunk, in two stages. Pairing (sentence splitting, tokenization, the instance
# algorithm and padding) draws from the chunk's one random stream, so it is one task.
# Encoding (masking, serialisation and framing) is independent per part of
# `pretraining_records.MASK_BATCH` instances, so a chunk's parts are separate tasks: with
# workers, the pairing of one chunk overlaps the encoding of others and the work divides
# evenly between the workers even when a corpus has only a few chunks. The main process
# only reads, dispatches and writes.


@dataclasses.dataclass
class PairedChunk:
    """A chunk's instances, padded, before masking."""

    index: int
    batch: instances.InstanceBatch
    stats: instances.InstanceStats


@dataclasses.dataclass
class ChunkRecords:
    """The records of one chunk, in order, framed for a TFRecord file, with their counts."""

    index: int
    framed: list[bytes]
    stats: instances.InstanceStats
    masking_counts: collections.Counter


class ChunkProcessor:
    """Sentence splitting, tokenization, pairing, masking and serialisation of chunks.

    Args:
        options: the run's options.
        tokenizer: from `data_pipelines.tokenization.load_tokenizer`.
        part_size: instances per encoding part (each part draws its own masks).
    """

    def __init__(self, options: Options, tokenizer: Any, part_size: int):
        self.options = options
        self.tokenizer = tokenizer
        self.part_size = part_size
        self._tokenize = instances.DocumentTokenizer(tokenizer)
        self._encoder = pretraining_records.RecordEncoder(
            tokenizer,
            random_seed=options.random_seed,
            static_masking=options.masking == "static",
            max_predictions_per_seq=options.max_predictions_per_seq,
            masked_lm_prob=options.masked_lm_prob,
            whole_word=options.do_whole_word_mask,
        )
        self._splitter: Any = None

    def _split(self, documents: list[corpora.Document]) -> list[corpora.Document]:
        if not any(d.needs_split for d in documents):
            return documents
        if self._splitter is None:
            self._splitter = corpora.make_sentence_splitter(self.options.language)
        return [
            corpora.split_document(d, self._splitter) if d.needs_split else d for d in documents
        ]

    def pair(self, index: int, documents: list[corpora.Document]) -> PairedChunk:
        """Stage 1: chunk `index`'s documents -> its padded instances."""
        options = self.options
        stats = instances.InstanceStats()
        chunk = self._tokenize(self._split(documents), stats, options.max_seq_length - 3)
        if len(chunk.documents) < 2:
            raise ValueError(
                f"chunk {index} has {len(chunk.documents)} non-empty document(s): next "
                "sentence prediction needs at least 2 (separate documents with blank lines)"
            )
        pairs = instances.create_chunk_instances(
            chunk.documents,
            instances.chunk_rng(options.random_seed, index),
            max_seq_length=options.max_seq_length,
            short_seq_prob=options.short_seq_prob,
            dupe_factor=options.dupe_factor,
            stats=stats,
        )
        batch = instances.assemble(
            chunk,
            pairs,
            options.max_seq_length,
            cls_id=self.tokenizer.cls_id,
            sep_id=self.tokenizer.sep_id,
        )
        return PairedChunk(index, batch, stats)

    def encode(
        self, index: int, part_index: int, part: instances.InstanceBatch
    ) -> tuple[list[bytes], collections.Counter]:
        """Stage 2: one part of chunk `index` -> its framed records and masking counts."""
        counts: collections.Counter = collections.Counter()
        records = self._encoder.encode_part(part, index, part_index, counts)
        return tfrecord_files.frame_records(records), counts

    def __call__(self, index: int, documents: list[corpora.Document]) -> ChunkRecords:
        """Both stages in this process."""
        paired = self.pair(index, documents)
        parts = paired.batch.split(self.part_size)
        return _join_parts(paired, [self.encode(index, i, part) for i, part in enumerate(parts)])


def _join_parts(
    paired: PairedChunk | PickledParts, parts: Iterable[tuple[list[bytes], collections.Counter]]
) -> ChunkRecords:
    framed: list[bytes] = []
    counts: collections.Counter = collections.Counter()
    for part_framed, part_counts in parts:
        framed.extend(part_framed)
        counts.update(part_counts)
    return ChunkRecords(paired.index, framed, paired.stats, counts)


@dataclasses.dataclass
class PickledParts:
    """A worker's paired chunk as its parts, each pickled (see `_pair_in_worker`)."""

    index: int
    parts: list[bytes]
    stats: instances.InstanceStats


# The processor of a worker process, made once by the pool initializer (the standard
# multiprocessing pattern: the tokenizer is not sent again with every task).
_worker_processor: ChunkProcessor | None = None


def _init_worker(options: Options, tokenizer: Any, part_size: int) -> None:
    global _worker_processor
    # One core per worker: the workers are the parallelism.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_processor = ChunkProcessor(options, tokenizer, part_size)


def _pair_in_worker(index: int, documents: list[corpora.Document]) -> PickledParts:
    """Stage 1 in a worker. The parts travel on to stage 2 through the main process, which
    only forwards them: pickled here, they cost it a copy of bytes, not an unpickling and a
    pickling of arrays (CPU the main process would take from the workers)."""
    assert _worker_processor is not None, "worker not initialised"
    paired = _worker_processor.pair(index, documents)
    parts = paired.batch.split(_worker_processor.part_size)
    parts = [pickle.dumps(part, pickle.HIGHEST_PROTOCOL) for part in parts]
    return PickledParts(index, parts, paired.stats)


def _encode_in_worker(
    index: int, part_index: int, part: bytes
) -> tuple[list[bytes], collections.Counter]:
    """Stage 2 in a worker, on a part pickled by `_pair_in_worker`."""
    assert _worker_processor is not None, "worker not initialised"
    return _worker_processor.encode(index, part_index, pickle.loads(part))


# ----------------------------------------------------------------------------------------
# The whole run.


def _iter_chunk_records(
    options: Options, chunks: Iterable[list[corpora.Document]], tokenizer: Any
) -> Iterator[ChunkRecords]:
    """Chunk records in chunk order, made here or by a bounded pool of workers."""
    # Read here and handed to the workers (a spawned worker re-imports the modules).
    part_size = pretraining_records.MASK_BATCH
    if options.num_workers == 1:
        processor = ChunkProcessor(options, tokenizer, part_size)
        for index, chunk in enumerate(chunks):
            yield processor(index, chunk)
        return
    # fork (workers start at once and inherit the built tokenizer) unless TensorFlow is
    # loaded (a TFDS input), whose threads do not survive a fork. This process never
    # encodes with the Rust tokenizer when it has workers, so its thread pool is not
    # started before the fork.
    start = "spawn" if "tensorflow" in sys.modules else "fork"
    context = multiprocessing.get_context(start)
    initargs = (options, tokenizer, part_size)
    with context.Pool(options.num_workers, _init_worker, initargs) as pool:
        pairing: collections.deque = collections.deque()  # stage-1 results, chunk order
        encoding: collections.deque = collections.deque()  # (PickledParts, stage-2 results)

        def dispatch_parts() -> None:
            paired = pairing.popleft().get()
            tasks = [
                pool.apply_async(_encode_in_worker, (paired.index, i, part))
                for i, part in enumerate(paired.parts)
            ]
            paired.parts = []  # the workers have them now
            encoding.append((paired, tasks))

        def advance() -> Iterator[ChunkRecords]:
            """Hands a paired chunk on to the encoders, or yields the oldest encoded one."""
            while True:
                if pairing and (pairing[0].ready() or not encoding):
                    dispatch_parts()  # as soon as possible: it gives the workers work
                    return
                paired, tasks = encoding[0]
                if all(task.ready() for task in tasks):
                    encoding.popleft()
                    yield _join_parts(paired, (task.get() for task in tasks))
                    return
                next(task for task in tasks if not task.ready()).wait(0.01)

        # At most two chunks in flight per worker (pairing or encoding), so memory stays
        # bounded whatever the corpus size.
        for index, chunk in enumerate(chunks):
            pairing.append(pool.apply_async(_pair_in_worker, (index, chunk)))
            while len(pairing) + len(encoding) > 2 * options.num_workers:
                yield from advance()
        while pairing or encoding:
            yield from advance()


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
        stats_path = writer.paths[0] + ".stats.json"
        _check_writable(stats_path)
        documents = iter_documents(options, read_stats)
        chunks = iter_chunks(documents, options.documents_per_chunk)
        # Closed on failure too, so that an error message starts on a line of its own.
        with tqdm(
            desc="create_pretraining_data", unit="doc", disable=not options.show_progress
        ) as progress:
            for chunk in _iter_chunk_records(options, chunks, tokenizer):
                writer.write_framed(chunk.framed)
                totals.merge(chunk.stats)
                masking_counts.update(chunk.masking_counts)
                chunks_done += 1
                progress.update(chunk.stats.documents + chunk.stats.empty_documents)
                progress.set_postfix(instances=totals.instances)
        if chunks_done == 0:
            raise ValueError(f"no documents in the input {options.input_file or options.corpus}")
    seconds = time.perf_counter() - started
    stats = _stats_dict(options, writer, read_stats, totals, masking_counts, chunks_done, seconds)
    _write_json_atomically(stats_path, stats)
    log.info("wrote %d instances to %s in %.1f s", totals.instances, writer.paths, seconds)
    return stats


def _check_writable(path: str) -> None:
    try:
        if "://" in path:  # gs://...: through tf.io.gfile (TensorFlow only for URLs)
            import tensorflow as tf

            with tf.io.gfile.GFile(path + ".probe", "w") as f:
                f.write("probe")  # GFile creates the file at its first write
            tf.io.gfile.remove(path + ".probe")
            return
        with open(path + ".probe", "w"):
            pass
        os.remove(path + ".probe")
    except Exception as error:  # tf.errors.OpError is not an OSError
        raise OSError(f"cannot write the stats file {path}: {error}") from error


def _write_json_atomically(path: str, data: dict[str, Any]) -> None:
    """Writes under a temporary name, then renames: a reader never sees half a file."""
    temporary = path + ".incomplete"
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
    writer: Any,
    read: corpora.ReadStats,
    totals: instances.InstanceStats,
    masking: collections.Counter[str],
    chunks: int,
    seconds: float,
) -> dict[str, Any]:
    masked = masking["masked_tokens"]
    return {
        "output_files": writer.paths,
        "records_per_file": writer.counts,
        "inputs": {
            "files": read.files,
            "empty_files_skipped": read.empty_files,
            "lines": read.lines,
            "lines_with_bad_bytes": read.lines_with_bad_bytes,
            "replaced_chars": read.replaced_chars,
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
        "nsp": {
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


def _define_flags() -> None:
    from absl import flags

    defaults = Options(input_file="", output_file="", vocab_file="")
    flags.DEFINE_string(
        "input_file",
        None,
        "Input text files: comma-separated files or globs "
        "(plain or .gz), or tfds:NAME for a TFDS text dataset.",
    )
    flags.DEFINE_string("output_file", None, "Output TFRecord file(s), comma-separated.")
    flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt or sentencepiece .model.")
    flags.DEFINE_bool("do_lower_case", defaults.do_lower_case, "Lower-case the input.")
    flags.DEFINE_bool(
        "do_whole_word_mask",
        defaults.do_whole_word_mask,
        "Mask whole words rather than single WordPieces.",
    )
    flags.DEFINE_integer("max_seq_length", defaults.max_seq_length, "Maximum sequence length.")
    flags.DEFINE_integer(
        "max_predictions_per_seq",
        defaults.max_predictions_per_seq,
        "Maximum number of masked LM predictions per sequence.",
    )
    flags.DEFINE_integer("random_seed", defaults.random_seed, "Random seed for data generation.")
    flags.DEFINE_integer(
        "dupe_factor", defaults.dupe_factor, "Passes over the input (with different masks)."
    )
    flags.DEFINE_float("masked_lm_prob", defaults.masked_lm_prob, "Masked LM probability.")
    flags.DEFINE_float(
        "short_seq_prob",
        defaults.short_seq_prob,
        "Probability of sequences shorter than the maximum length.",
    )
    flags.DEFINE_integer(
        "num_output_shards",
        defaults.num_output_shards,
        "Shards to write when one --output_file is given.",
    )
    flags.DEFINE_integer(
        "num_workers", defaults.num_workers, "Worker processes (the output does not depend on it)."
    )
    flags.DEFINE_enum(
        "masking",
        defaults.masking,
        ["static", "dynamic"],
        "static: masked records (original format); dynamic: unmasked records "
        "with word_starts, masked by the input pipeline each epoch.",
    )
    flags.DEFINE_enum(
        "corpus",
        None,
        list(CORPORA),
        "An embedded corpus instead of --input_file (Chinese word boundaries included).",
    )
    flags.DEFINE_integer(
        "documents_per_chunk",
        defaults.documents_per_chunk,
        "Documents shuffled and paired together; bounds memory.",
    )
    flags.DEFINE_bool(
        "split_sentences",
        defaults.split_sentences,
        "Input lines are paragraphs: split them into sentences (pysbd).",
    )
    flags.DEFINE_string("language", defaults.language, "pysbd language for sentence splitting.")
    flags.DEFINE_bool(
        "word_boundary_files",
        defaults.word_boundary_files,
        "Read word segmentations from <input_file>.words (see prepare_corpus).",
    )
    flags.DEFINE_float(
        "max_undecodable_fraction",
        defaults.max_undecodable_fraction,
        "Refuse an input file when more than this fraction of its non-blank lines are not "
        "UTF-8 text (a binary file, another encoding); fewer get a warning naming the file.",
    )
    flags.DEFINE_string("tfds_data_dir", None, "data_dir for tfds: inputs.")
    flags.DEFINE_string("tfds_split", defaults.tfds_split, "Split of tfds: inputs.")
    flags.DEFINE_string("tfds_text_key", defaults.tfds_text_key, "Text feature of tfds: inputs.")


def main(argv: list[str]) -> None:
    """Entry point: flags to `Options`, then `create_pretraining_data`."""
    del argv
    from absl import flags

    f = flags.FLAGS
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    options = Options(
        input_file=f.input_file or "",
        output_file=f.output_file,
        vocab_file=f.vocab_file,
        do_lower_case=f.do_lower_case,
        do_whole_word_mask=f.do_whole_word_mask,
        max_seq_length=f.max_seq_length,
        max_predictions_per_seq=f.max_predictions_per_seq,
        random_seed=f.random_seed,
        dupe_factor=f.dupe_factor,
        masked_lm_prob=f.masked_lm_prob,
        short_seq_prob=f.short_seq_prob,
        num_output_shards=f.num_output_shards,
        num_workers=f.num_workers,
        masking=f.masking,
        corpus=f.corpus or "",
        documents_per_chunk=f.documents_per_chunk,
        split_sentences=f.split_sentences,
        language=f.language,
        word_boundary_files=f.word_boundary_files,
        max_undecodable_fraction=f.max_undecodable_fraction,
        tfds_data_dir=f.tfds_data_dir or "",
        tfds_split=f.tfds_split,
        tfds_text_key=f.tfds_text_key,
    )
    try:
        stats = create_pretraining_data(options)
    except corpora.UndecodableInputError as error:
        # Not a bug to trace: one line naming the file (no output was written).
        raise SystemExit(f"create_pretraining_data: {error}") from None
    print(json.dumps({k: stats[k] for k in ("documents", "instances", "nsp", "masking")}))


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli

    _define_flags()
    flags.mark_flags_as_required(["output_file", "vocab_file"])
    cli.run(main)
