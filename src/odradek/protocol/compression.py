"""Bounded decompression of record batches, for every codec Kafka has.

The broker keeps batches compressed on disk and on the wire; it decompresses one only to look at
its records: to validate a produce request (as Kafka's LogValidator does for v2), to answer a
ListOffsets by timestamp, and in tools. A compressed batch is small on the wire but can claim
gigabytes once decompressed (a "decompression bomb": 1 MB of zstd can hold 30 GB of zeros), so
every decompression here writes into a buffer of a fixed size and fails when the output does not
fit, before it has produced more than that:

* `decompress_bounded(codec, payload, limit)` returns a `memoryview` of the decompressed bytes in
  a per-thread scratch buffer (valid until the next call on the same thread), or raises
  `DecompressedTooLargeError` when the output would exceed `limit` (carrying, for the streaming
  codecs, the first `limit` bytes of output, so that a caller can tell a bomb of garbage from
  well-formed records that are merely too many) and `CorruptRecordError` when the payload is not
  valid for its codec. Call `trim_scratch()` when done with the view.
* `decompress(codec, payload, limit)` is the same returning `bytes` (a copy), for callers that keep
  the result.

The scratch buffer is an anonymous memory map of `limit` bytes: pages the kernel has not been
asked for cost nothing, so a large limit does not mean large memory use. `trim_scratch()` gives
back the pages beyond `RESIDENT_SCRATCH_BYTES` (`MADV_DONTNEED`) after a call that used more, so a
bomb that filled the buffer once does not stay resident.

Formats, as producers write them:

| codec  | on the wire                                                                          |
|--------|--------------------------------------------------------------------------------------|
| gzip   | RFC 1952 gzip (Java's GZIPOutputStream, librdkafka's zlib with gzip headers)         |
| snappy | Java: xerial framing (magic `\\x82SNAPPY\\0`, two int32 versions, then int32-length-  |
|        | prefixed raw snappy blocks); librdkafka: one raw snappy block. Both are accepted.    |
| lz4    | an LZ4 frame (magic 0x184D2204) with independent blocks: Kafka's Java reader refuses |
|        | linked blocks, so such a batch would poison every Java consumer, and is refused here |
| zstd   | zstd frames                                                                          |

Decompression is done by cramjam (Rust), which releases the GIL: callers may run it on a worker
thread while the event loop carries on.
"""

from __future__ import annotations

import mmap
import struct
import threading

import cramjam

from odradek.errors import CorruptRecordError, RecordTooLargeError

GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

RESIDENT_SCRATCH_BYTES = 8 * 1024 * 1024
"""Scratch pages kept after a call: enough for ordinary batches without refaulting pages."""

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16  # magic (8), version (4), compatible version (4)
_INT32 = struct.Struct(">i")
_LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_FLG_VERSION_MASK = 0xC0
_LZ4_FLG_VERSION_01 = 0x40
_LZ4_FLG_BLOCK_INDEPENDENCE = 0x20

# cramjam reports an output buffer that is too small with this message for gzip, lz4, zstd and
# framed snappy (checked by the unit tests, since the version is pinned).
_OUTPUT_FULL = "failed to write whole buffer"


class DecompressedTooLargeError(RecordTooLargeError):
    """A batch whose records, decompressed, exceed the broker's limit (MESSAGE_TOO_LARGE: a Java
    producer answers that code by splitting the batch and sending the halves).

    `prefix` is the output produced before the limit was hit (None when the codec told the size
    up front), in the scratch buffer: valid until the next call on this thread."""

    prefix: memoryview | None = None


class _Scratch(threading.local):
    buffer: mmap.mmap | None = None
    used: int = 0


_scratch = _Scratch()


def _scratch_buffer(size: int) -> mmap.mmap:
    buffer = _scratch.buffer
    if buffer is None or len(buffer) < size:
        if buffer is not None:
            try:
                buffer.close()
            except BufferError:  # a view of it is still alive: the map goes when the view does
                pass
        buffer = _scratch.buffer = mmap.mmap(-1, max(size, 1))
    return buffer


def trim_scratch() -> None:
    """Give back this thread's scratch pages beyond RESIDENT_SCRATCH_BYTES, if it used more."""
    buffer = _scratch.buffer
    if buffer is not None and _scratch.used > RESIDENT_SCRATCH_BYTES:
        page = mmap.PAGESIZE
        start = RESIDENT_SCRATCH_BYTES // page * page
        buffer.madvise(mmap.MADV_DONTNEED, start, len(buffer) - start)
    _scratch.used = 0


def check_lz4_frame(payload: bytes | memoryview) -> None:
    """Refuse what is not an LZ4 frame with independent blocks (module docstring)."""
    if len(payload) < 7 or bytes(payload[:4]) != _LZ4_FRAME_MAGIC:
        raise CorruptRecordError("lz4 payload is not an LZ4 frame")
    flags = payload[4]
    if flags & _LZ4_FLG_VERSION_MASK != _LZ4_FLG_VERSION_01:
        raise CorruptRecordError(f"lz4 frame has an unsupported version (FLG {flags:#04x})")
    if not flags & _LZ4_FLG_BLOCK_INDEPENDENCE:
        raise CorruptRecordError(
            "lz4 frame uses linked blocks, which Kafka's consumers cannot read"
        )


def _too_large(
    codec: int, limit: int, prefix: memoryview | None = None
) -> DecompressedTooLargeError:
    error = DecompressedTooLargeError(
        f"batch decompresses ({_NAMES.get(codec, codec)}) to more than {limit} bytes"
    )
    error.prefix = prefix
    return error


def _corrupt(codec: int, error: Exception) -> CorruptRecordError:
    return CorruptRecordError(f"cannot decompress a {_NAMES.get(codec, codec)} batch: {error}")


_NAMES = {GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}


def _snappy_raw_into(block: bytes | memoryview, out: memoryview, codec: int, limit: int) -> int:
    try:
        size = cramjam.snappy.decompress_raw_len(block)
    except cramjam.DecompressionError as e:
        raise _corrupt(codec, e) from None
    if size > len(out):
        raise _too_large(codec, limit)
    try:
        return int(cramjam.snappy.decompress_raw_into(block, out[:size]))
    except cramjam.DecompressionError as e:
        raise _corrupt(codec, e) from None


def _xerial_into(payload: memoryview, out: memoryview, limit: int, buffer: mmap.mmap) -> int:
    position, written, end = _XERIAL_HEADER_SIZE, 0, len(payload)
    while position < end:
        if position + 4 > end:
            raise CorruptRecordError("snappy (xerial) block length is cut short")
        (length,) = _INT32.unpack_from(payload, position)
        position += 4
        if length < 0 or position + length > end:
            raise CorruptRecordError(f"snappy (xerial) block of {length} bytes runs past the batch")
        try:
            written += _snappy_raw_into(
                payload[position : position + length], out[written:], SNAPPY, limit
            )
        except DecompressedTooLargeError:
            _scratch.used = written
            raise _too_large(SNAPPY, limit, memoryview(buffer)[:written]) from None
        position += length
    return written


_STREAM_DECOMPRESSORS = {
    GZIP: cramjam.gzip.decompress_into,
    LZ4: cramjam.lz4.decompress_into,
    ZSTD: cramjam.zstd.decompress_into,
}


def decompress_bounded(codec: int, payload: bytes | memoryview, limit: int) -> memoryview:
    """Decompress `payload` into this thread's scratch buffer; at most `limit` bytes of output.

    The view is valid until the next call on the same thread. Raises DecompressedTooLargeError,
    CorruptRecordError, or CorruptRecordError for an unknown codec.
    """
    buffer = _scratch_buffer(limit)
    # One spare byte: output that fills `limit` exactly must not look like output that overflowed.
    out = memoryview(buffer)[: limit + 1] if len(buffer) > limit else memoryview(buffer)
    written = 0
    try:
        if codec == SNAPPY:
            view = memoryview(payload)
            if bytes(view[:8]) == _XERIAL_MAGIC:
                written = _xerial_into(view, out[:limit], limit, buffer)
            else:
                written = _snappy_raw_into(view, out[:limit], codec, limit)
        elif codec in _STREAM_DECOMPRESSORS:
            if codec == LZ4:
                check_lz4_frame(payload)
            try:
                written = int(_STREAM_DECOMPRESSORS[codec](payload, out))
            except cramjam.DecompressionError as e:
                if _OUTPUT_FULL in str(e):  # the output filled the buffer, and there is more
                    _scratch.used = len(out)
                    raise _too_large(codec, limit, memoryview(buffer)[:limit]) from None
                raise _corrupt(codec, e) from None
            if written > limit:
                _scratch.used = written
                raise _too_large(codec, limit, memoryview(buffer)[:limit])
        else:
            raise CorruptRecordError(f"unknown compression codec {codec}")
    finally:
        out.release()
    _scratch.used = max(_scratch.used, written)
    return memoryview(buffer)[:written]


def decompress(codec: int, payload: bytes | memoryview, limit: int) -> bytes:
    """`decompress_bounded` as a `bytes` copy the caller may keep."""
    try:
        view = decompress_bounded(codec, payload, limit)
        try:
            return bytes(view)
        finally:
            view.release()
    finally:
        trim_scratch()


# --------------------------------------------------------------------------------------------
# Compression, for tools, tests and benchmarks (the broker never compresses).

_LZ4_FLG = 0x60  # version 01, independent blocks, no checksums, no content size
_LZ4_BD_64KB = 0x40
_LZ4_HEADER_CHECKSUM = 0x82  # (xxh32(FLG, BD) >> 8) & 0xFF for the two bytes above
_LZ4_BLOCK = 64 * 1024
_UINT32_LE = struct.Struct("<I")


def lz4_frame(data: bytes) -> bytes:
    """An LZ4 frame with independent 64 KB blocks: the variant Kafka's Java client writes and
    reads (cramjam's own frame encoder links blocks)."""
    out = bytearray(_LZ4_FRAME_MAGIC + bytes([_LZ4_FLG, _LZ4_BD_64KB, _LZ4_HEADER_CHECKSUM]))
    for start in range(0, len(data), _LZ4_BLOCK):
        chunk = data[start : start + _LZ4_BLOCK]
        block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(block) >= len(chunk):  # incompressible: store it, flagged by the high bit
            out += _UINT32_LE.pack(len(chunk) | 0x80000000) + chunk
        else:
            out += _UINT32_LE.pack(len(block)) + block
    out += b"\0\0\0\0"  # end mark
    return bytes(out)


def compress(codec: int, data: bytes) -> bytes:
    """`data` compressed as Kafka's Java producer would (snappy in xerial framing)."""
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        out = bytearray(_XERIAL_MAGIC + struct.pack(">ii", 1, 1))
        for start in range(0, max(len(data), 1), 32 * 1024):
            block = bytes(cramjam.snappy.compress_raw(data[start : start + 32 * 1024]))
            out += _INT32.pack(len(block)) + block
        return bytes(out)
    if codec == LZ4:
        return lz4_frame(data)
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"cannot compress with codec {codec}")
