"""TFRecord files without TensorFlow: masked CRC-32C framing and the atomic sharded writer.

`create_pretraining_data` writes its records without importing TensorFlow (the import
alone costs each process several CPU seconds). A TFRecord file is a sequence of

    uint64 length (little-endian) | uint32 masked_crc32c(length bytes) |
    data | uint32 masked_crc32c(data)

where `masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xA282EAD8 (mod 2^32)` with
`c = crc32c(x)` (CRC-32C, the Castagnoli polynomial). The CRC itself comes from
`google-crc32c`, Google's C (SSE4.2 / ARMv8 accelerated) implementation; this module only
adds TFRecord's masking and framing. The tests compare the framed bytes with
`tf.io.TFRecordWriter`'s and read the files back with `tf.data`.

`TFRecordShardWriter` is the project's one TFRecord writer: it writes uncompressed files
(the input pipeline also reads GZIP/ZLIB files written by other tools).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence

import google_crc32c

# Added after the rotation, so that a CRC of data that embeds CRCs is not degenerate.
_MASK_DELTA = 0xA282EAD8
_UINT32 = 0xFFFFFFFF


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`, as an unsigned 32-bit int."""
    return google_crc32c.value(data)


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`, as an unsigned 32-bit int."""
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & _UINT32) + _MASK_DELTA) & _UINT32


def frame_records(records: Sequence[bytes]) -> list[bytes]:
    """Each record as it appears in a TFRecord file (header, data, footer)."""
    framed = []
    header_crcs: dict[bytes, bytes] = {}  # records of a batch share few lengths
    for record in records:
        header = struct.pack("<Q", len(record))
        header_crc = header_crcs.get(header)
        if header_crc is None:
            header_crc = header_crcs[header] = struct.pack("<I", masked_crc32c(header))
        framed.append(
            b"".join((header, header_crc, record, struct.pack("<I", masked_crc32c(record))))
        )
    return framed


# ----------------------------------------------------------------------------- paths


def shard_paths(output: str | Sequence[str], num_shards: int = 1) -> list[str]:
    """The output paths for `output`.

    Args:
        output: a list of paths (one shard each); or a comma-separated string of paths (the
            original tool's `--output_file`); or one path, which with `num_shards > 1`
            becomes `path-00000-of-0000N` ... (before any `.tfrecord` suffix).
        num_shards: shards to make from a single path.

    Returns:
        One path per shard.
    """
    if isinstance(output, str):
        paths = [p for p in output.split(",") if p]
    else:
        paths = list(output)
    if not paths:
        raise ValueError("no output path given")
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if len(paths) > 1 or num_shards == 1:
        if num_shards not in (1, len(paths)):
            raise ValueError(f"{len(paths)} output paths given but num_shards={num_shards}")
        return paths
    stem, suffix = paths[0], ""
    for ext in (".tfrecord", ".tfrecords", ".tfrec"):
        if stem.endswith(ext):
            stem, suffix = stem[: -len(ext)], ext
    return [f"{stem}-{i:05d}-of-{num_shards:05d}{suffix}" for i in range(num_shards)]


def temporary_path(path: str) -> str:
    """Where `path` is written until it is complete."""
    # A dot prefix and a suffix, so neither `out-*` nor `*.tfrecord` globs pick it up.
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.incomplete-{os.getpid()}")


def _is_url(path: str) -> bool:
    return "://" in path


# ----------------------------------------------------------------------------- writing


class TFRecordShardWriter:
    """Writes records round-robin over shards (or to a chosen shard), atomically.

    Every shard is written under a hidden temporary name and renamed to its final name only
    when `close()` succeeds, so a crashed or interrupted run leaves nothing that looks like
    finished output. Use as a context manager: on an exception inside the `with` block the
    temporaries are deleted. Local paths need no TensorFlow; URLs (`gs://...`) go through
    `tf.io.gfile`.

    Example::

        with TFRecordShardWriter("out/train.tfrecord", num_shards=4) as writer:
            for record in records:
                writer.write(record)
        print(writer.counts)  # records per shard

    Args:
        output_pattern_or_paths: see `shard_paths`.
        num_shards: shards to make from a single path.

    Raises:
        OSError: an output directory cannot be created or written.
    """

    def __init__(self, output_pattern_or_paths: str | Sequence[str], num_shards: int = 1):
        self.paths = shard_paths(output_pattern_or_paths, num_shards)
        if len(set(self.paths)) != len(self.paths):
            raise ValueError(f"duplicate output paths: {self.paths}")
        self.counts = [0] * len(self.paths)
        self._temporary = [temporary_path(p) for p in self.paths]
        self._next_shard = 0
        self._closed = False
        self._files: list = []
        path = self.paths[0]
        try:
            for path, temporary in zip(self.paths, self._temporary, strict=True):
                self._files.append(_open_for_writing(path, temporary))
        except Exception as error:
            self._discard()
            raise OSError(f"cannot open output {path!r} for writing: {error}") from error

    @property
    def total(self) -> int:
        """Records written so far, over all shards."""
        return sum(self.counts)

    def write(self, record: bytes, shard: int | None = None) -> None:
        """Writes one serialised record to `shard`, or to the next shard round-robin."""
        if self._closed:
            raise ValueError("write() on a closed TFRecordShardWriter")
        if shard is None:
            shard = self._next_shard
            self._next_shard = (shard + 1) % len(self._files)
        self._files[shard].write(frame_records([record])[0])
        self.counts[shard] += 1

    def write_framed(self, framed: Iterable[bytes]) -> None:
        """Writes records framed by `frame_records` (in bulk), each to the next shard."""
        if self._closed:
            raise ValueError("write_framed() on a closed TFRecordShardWriter")
        shards = len(self._files)
        if shards == 1:  # one file: a single write of the whole batch
            framed = list(framed)
            self._files[0].write(b"".join(framed))
            self.counts[0] += len(framed)
            return
        for record in framed:
            shard = self._next_shard
            self._next_shard = (shard + 1) % shards
            self._files[shard].write(record)
            self.counts[shard] += 1

    def close(self) -> list[str]:
        """Flushes every shard and renames it to its final name; returns the final paths."""
        if self._closed:
            return self.paths
        self._closed = True
        try:
            for f in self._files:
                f.close()
            for temporary, path in zip(self._temporary, self.paths, strict=True):
                if _is_url(path):
                    import tensorflow as tf

                    tf.io.gfile.rename(temporary, path, overwrite=True)
                else:
                    os.replace(temporary, path)
        except Exception:
            self._discard()
            raise
        return self.paths

    def abort(self) -> None:
        """Closes and deletes every temporary shard; no final file is created."""
        self._closed = True
        self._discard()

    def _discard(self) -> None:
        for f in self._files:
            try:
                f.close()
            except Exception:  # already failing: removing the files matters more
                pass
        for path, temporary in zip(self.paths, self._temporary, strict=False):
            try:
                if _is_url(path):
                    import tensorflow as tf

                    if tf.io.gfile.exists(temporary):
                        tf.io.gfile.remove(temporary)
                elif os.path.exists(temporary):
                    os.remove(temporary)
            except Exception:
                pass

    def __enter__(self) -> TFRecordShardWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _open_for_writing(path: str, temporary: str):
    if _is_url(path):
        import tensorflow as tf

        tf.io.gfile.makedirs(os.path.dirname(path))
        return tf.io.gfile.GFile(temporary, "wb")
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    return open(temporary, "wb")
