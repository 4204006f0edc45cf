"""TFRecord framing without TensorFlow: records framed with masked CRC-32C, and a file's
framing read back (its record count, whether it begins like a TFRecord file, which record is
damaged at an offset).

`create_pretraining_data` writes its records without importing TensorFlow (the import
alone costs each process several CPU seconds). A TFRecord file is a sequence of

    uint64 length (little-endian) | uint32 masked_crc32c(length bytes) |
    data | uint32 masked_crc32c(data)

where `masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xA282EAD8 (mod 2^32)` with
`c = crc32c(x)` (CRC-32C, the Castagnoli polynomial). The CRC itself comes from
`google-crc32c`, Google's C (SSE4.2 / ARMv8 accelerated) implementation; this module only
adds TFRecord's masking and framing. The tests compare the framed bytes with
`tf.io.TFRecordWriter`'s and read the files back with `tf.data`.

Files go into place through `tfrecord_files.TFRecordShardWriter` (whole shard sets, atomically).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence

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


# ----------------------------------------------------------------------------- reading


def count_records(path: str) -> int:
    """Records in an uncompressed TFRecord file, from its framing alone: each record's
    length is read and its data and CRCs are seeked over, never read or checked.

    Raises:
        ValueError: the file ends inside a record (truncated).
    """
    f, size = _open_with_size(path)
    count = position = 0
    with f:
        while position < size:
            header = f.read(8)
            if len(header) < 8:
                break
            # uint64 length, uint32 CRC of it, the data, uint32 CRC of the data.
            position += 8 + 4 + struct.unpack("<Q", header)[0] + 4
            if position > size:  # not records, or cut short: no seek past the end
                break
            f.seek(position)
            count += 1
    if position != size:
        raise ValueError(f"{path}: truncated TFRecord file (a record runs past its end)")
    return count


def _open_with_size(path: str):
    if "://" in path:  # gs://...: through tf.io.gfile (TensorFlow only for URLs)
        import tensorflow as tf

        return tf.io.gfile.GFile(path, "rb"), tf.io.gfile.stat(path).length
    return open(path, "rb"), os.path.getsize(path)


def check_framing(path: str, compression: str | None = None) -> None:
    """Refuses a file that does not begin like a TFRecord file: one read of its first bytes.

    An empty file passes (no records); otherwise the first record's header (its length and
    that length's CRC) must check out and, uncompressed, the record must fit in the file.

    Args:
        path: the file.
        compression: None, "GZIP" or "ZLIB": the first bytes are decompressed first.

    Raises:
        ValueError: naming `path` and what its first bytes are not.
    """
    f, size = _open_with_size(path)
    with f:
        head = f.read(12 if not compression else 1 << 16)
    if size == 0:
        return
    kind = "a TFRecord file" if not compression else f"a {compression}-compressed TFRecord file"
    if compression:
        try:  # wbits 31: a gzip header; 15: a zlib header
            head = zlib.decompressobj(31 if compression == "GZIP" else 15).decompress(head, 12)
        except zlib.error as error:
            raise ValueError(f"{path}: not {kind} ({error})") from None
    if len(head) < 12 or struct.pack("<I", masked_crc32c(head[:8])) != head[8:12]:
        raise ValueError(
            f"{path}: not {kind} (its first bytes are not a record header: a length and its "
            f"CRC); give only record files in the pattern"
        )
    length = struct.unpack("<Q", head[:8])[0]
    if not compression and 16 + length > size:
        raise ValueError(
            f"{path}: truncated TFRecord file (its first record needs {16 + length} bytes, "
            f"the file has {size})"
        )


def find_damage(path: str, offset: int) -> str | None:
    """Which record of the uncompressed TFRecord file `path` is damaged at `offset`, or None.

    tf.data's `DataLossError` names only a byte offset ("truncated record at 47107",
    "corrupted record at 2413"): the record's start when its header is damaged or the file
    ends inside it, its data's start (12 bytes on) when the data's CRC fails. The file's
    framing is walked up to `offset` (lengths only), and the record there checked.

    Returns:
        "record N (byte B): what is wrong with it", or None when no record of `path` starting
        at `offset` or `offset - 12` is damaged.
    """
    f, size = _open_with_size(path)
    index = position = 0
    with f:
        while position <= offset and position < size:
            f.seek(position)
            header = f.read(12)
            where = f"record {index} (byte {position})"
            if len(header) < 12:  # the file ends inside a header: the last record
                truncated = position == offset
                return f"{where} is truncated: the file ends in its header" if truncated else None
            length = struct.unpack("<Q", header[:8])[0]
            if position in (offset, offset - 12):
                if struct.pack("<I", masked_crc32c(header[:8])) != header[8:]:
                    return f"{where} is corrupted: its length's CRC does not match"
                if position + 16 + length > size:
                    return (
                        f"{where} is truncated: it needs {16 + length} bytes, the file ends "
                        f"{size - position} bytes after its start"
                    )
                data = f.read(length + 4)
                if struct.pack("<I", masked_crc32c(data[:length])) != data[length:]:
                    return f"{where} is corrupted: its data's CRC does not match"
            position += 16 + length
            index += 1
    return None
