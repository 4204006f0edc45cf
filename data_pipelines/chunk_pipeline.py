"""The chunks of `create_pretraining_data`, in two stages, in this process or in a pool.

Pairing (sentence splitting, tokenization, the instance algorithm and padding) draws from
the chunk's one random stream, so it is one task. Encoding (masking, serialisation and
framing) is independent per part of `pretraining_records.MASK_BATCH` instances, so a
chunk's parts are separate tasks: with workers, the pairing of one chunk overlaps the
encoding of others and the work divides evenly between the workers even when a corpus has
only a few chunks. The main process only reads, dispatches and writes.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Iterable, Iterator
from concurrent import futures
from typing import Any

# No TensorFlow import here (see create_pretraining_data's docstring).
from data_pipelines import (
    corpora,
    instances,
    pretraining_records,
    single_segments,
    tfrecord_framing,
)
from data_pipelines.pretraining_options import Options


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
        """Stage 1: chunk `index`'s documents -> its padded instances (sentence pairs, or
        single segments without `next_sentence`)."""
        options = self.options
        stats = instances.InstanceStats()
        if not options.next_sentence:
            chunk = self._tokenize(self._split(documents), stats, options.max_seq_length - 2)
            return PairedChunk(index, self._single_segments(index, chunk, stats), stats)
        chunk = self._tokenize(self._split(documents), stats, options.max_seq_length - 3)
        if len(chunk.documents) < 2:
            raise ValueError(
                f"chunk {index} of {options.input_file or options.corpus} has "
                f"{len(chunk.documents)} non-empty document(s): next sentence prediction "
                "needs at least 2 (separate documents with blank lines, or make single "
                "segments without it: --nonext_sentence)"
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

    def _single_segments(
        self, index: int, chunk: instances.TokenizedChunk, stats: instances.InstanceStats
    ) -> instances.InstanceBatch:
        options = self.options
        pieces = single_segments.create_chunk_instances(
            chunk.documents,
            instances.chunk_rng(options.random_seed, index),
            max_seq_length=options.max_seq_length,
            short_seq_prob=options.short_seq_prob,
            dupe_factor=options.dupe_factor,
            stats=stats,
        )
        return single_segments.assemble(
            chunk,
            pieces,
            options.max_seq_length,
            cls_id=self.tokenizer.cls_id,
            sep_id=self.tokenizer.sep_id,
        )

    def encode(
        self, index: int, part_index: int, part: instances.InstanceBatch
    ) -> tuple[list[bytes], collections.Counter]:
        """Stage 2: one part of chunk `index` -> its framed records and masking counts."""
        counts: collections.Counter = collections.Counter()
        records = self._encoder.encode_part(part, index, part_index, counts)
        return tfrecord_framing.frame_records(records), counts

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
    # A worker leaves the run's signals to the main process, whatever handlers it inherited
    # from a fork: Ctrl-C (sent to the whole process group) is the main process's to handle,
    # and SIGTERM ends a worker at once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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


def iter_chunk_records(
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
    # concurrent.futures, not multiprocessing.Pool: a worker that dies (the OOM killer, a
    # stray SIGKILL) fails every pending task with BrokenProcessPool, where a Pool would
    # wait for its results forever.
    pool = futures.ProcessPoolExecutor(
        options.num_workers,
        mp_context=multiprocessing.get_context(start),
        initializer=_init_worker,
        initargs=(options, tokenizer, part_size),
    )
    pairing: collections.deque = collections.deque()  # stage-1 futures, chunk order
    encoding: collections.deque = collections.deque()  # (PickledParts, stage-2 futures)

    def dispatch_parts() -> None:
        paired = pairing.popleft().result()
        tasks = [
            pool.submit(_encode_in_worker, paired.index, i, part)
            for i, part in enumerate(paired.parts)
        ]
        paired.parts = []  # the workers have them now
        encoding.append((paired, tasks))

    def advance() -> Iterator[ChunkRecords]:
        """Hands a paired chunk on to the encoders, or yields the oldest encoded one."""
        while True:
            if pairing and (pairing[0].done() or not encoding):
                dispatch_parts()  # as soon as possible: it gives the workers work
                return
            paired, tasks = encoding[0]
            if all(task.done() for task in tasks):
                encoding.popleft()
                yield _join_parts(paired, (task.result() for task in tasks))
                return
            waiting = [task for task in tasks if not task.done()]
            futures.wait(waiting + list(pairing)[:1], return_when=futures.FIRST_COMPLETED)

    try:
        # At most two chunks in flight per worker (pairing or encoding), so memory stays
        # bounded whatever the corpus size.
        for index, chunk in enumerate(chunks):
            pairing.append(pool.submit(_pair_in_worker, index, chunk))
            while len(pairing) + len(encoding) > 2 * options.num_workers:
                yield from advance()
        while pairing or encoding:
            yield from advance()
    except futures.process.BrokenProcessPool as error:
        raise RuntimeError(
            "a create_pretraining_data worker process died before finishing its chunk "
            "(killed by a signal, or by the out-of-memory killer: try fewer --num_workers or "
            "a smaller --documents_per_chunk)"
        ) from error
    finally:
        # On an error (or SIGTERM, Ctrl-C) the queued tasks are dropped and the running ones
        # end on their own: no worker is left waiting for work that never comes.
        pool.shutdown(wait=True, cancel_futures=True)
