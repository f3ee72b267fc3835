"""A zero-copy view of Kafka RecordBatch v2 (magic 2), the unit the broker stores and ships.

Sans-I/O: this module turns bytes into batch headers and checks them; it never touches files or
sockets and imports no asyncio. On the fetch and replication paths the broker treats a batch as an
opaque blob with a header: one `struct` unpack and one CRC32C call per batch, whatever the number
of records. Only the leader's produce path looks inside, once, before storing a batch
(`odradek.log.validator`, with the native record walker of `odradek.protocol.records`), so that
nothing a consumer cannot parse is ever stored; the records are still never re-encoded.

Wire layout of a batch (all integers big-endian), 61 bytes of header followed by the records:

    offset  size  field
         0     8  baseOffset            offset of the first record (assigned by the leader)
         8     4  batchLength           bytes that follow this field (so the batch is 12 + batchLength)
        12     4  partitionLeaderEpoch  leader epoch of the leader that appended it
        16     1  magic                 2 for this format
        17     4  crc                   CRC32C (Castagnoli) of bytes 21 .. end of the batch
        21     2  attributes            bits 0-2 compression, 3 timestamp type, 4 transactional,
                                        5 control
        23     4  lastOffsetDelta       offset of the last record minus baseOffset
        27     8  baseTimestamp         timestamp of the first record
        35     8  maxTimestamp          largest record timestamp (the append time with LogAppendTime)
        43     8  producerId
        51     2  producerEpoch
        53     4  baseSequence
        57     4  recordsCount
        61     .  records (compressed as a whole when the codec is not "none")

baseOffset and partitionLeaderEpoch lie before the CRC-covered range on purpose: the leader patches
them into every batch without recomputing the checksum. maxTimestamp and attributes are covered, so
switching a batch to LogAppendTime means recomputing the CRC.

Each record (inside the possibly compressed records section) is: length varint, attributes int8,
timestampDelta varlong, offsetDelta varint, keyLength varint (-1 = null) + key, valueLength varint
(-1 = null) + value, headerCount varint, then per header keyLength varint + key (UTF-8) and
valueLength varint + value. Varints are zig-zag encoded like protobuf's sint32/sint64. This module
never walks records itself: `odradek.protocol.records` does (natively), for the leader's validation
(`odradek.log.validator`) and for the tool helpers at the bottom of this module (`build_batch`,
`decode_records`); decompression is always bounded (`odradek.protocol.compression`).

`google_crc32c`'s C extension accepts only immutable `bytes`, so the CRC-covered range of each batch is
copied once into a `bytes` object before checksumming; that memcpy is cheap next to the checksum.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator, Sequence
from enum import IntEnum
from typing import NamedTuple

import google_crc32c

from odradek.errors import CorruptRecordError, UnsupportedCompressionTypeError

Buffer = bytes | bytearray | memoryview

HEADER = struct.Struct(">qiibIhiqqqhii")
"""The 61-byte batch header, unpacked in one call."""

HEADER_SIZE = HEADER.size
LOG_OVERHEAD = 12
"""baseOffset + batchLength: the bytes not counted by batchLength."""

MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
"""The smallest batchLength that can hold a header (49); anything smaller is corrupt."""

MAGIC_V2 = 2

_BASE_OFFSET_POS = 0
_LEADER_EPOCH_POS = 12
_MAGIC_POS = 16
_CRC_POS = 17
_ATTRIBUTES_POS = 21
_MAX_TIMESTAMP_POS = 35

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20

NO_TIMESTAMP = -1


class CompressionType(IntEnum):
    """The codec in attributes bits 0-2, numbered as in Kafka."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(IntEnum):
    """attributes bit 3: who set the timestamps, the producer or the broker."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class BatchHeader(NamedTuple):
    """The header of one batch plus where the batch starts in the buffer it was read from."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        """The raw codec number; `CompressionType(h.compression)` when it is known to be valid."""
        return self.attributes & _COMPRESSION_MASK

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & _TIMESTAMP_TYPE_BIT:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)


def read_header(buf: Buffer, position: int = 0) -> BatchHeader:
    """Unpack the header at `position`; the caller guarantees 61 bytes are there."""
    return BatchHeader._make((*HEADER.unpack_from(buf, position), position))


def iter_batches(buf: Buffer, start: int = 0) -> Iterator[BatchHeader]:
    """Yield the headers of consecutive batches in `buf` from `start`, without checking CRCs.

    Stops quietly at a partial tail (fewer bytes left than the next batch needs): fetch responses
    and half-written files end that way. A batchLength too small to hold a header cannot be skipped
    over and raises `CorruptRecordError`.
    """
    end = len(buf)
    position = start
    unpack_from = HEADER.unpack_from
    while position + HEADER_SIZE <= end:
        fields = unpack_from(buf, position)
        batch_length = fields[1]
        if batch_length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"batch at position {position} has batchLength {batch_length} "
                f"(at least {MIN_BATCH_LENGTH} expected)"
            )
        size = LOG_OVERHEAD + batch_length
        if position + size > end:
            return
        yield BatchHeader._make((*fields, position))
        position += size


def compute_crc(buf: Buffer, header: BatchHeader) -> int:
    """CRC32C of the checksummed range of the batch `header` describes."""
    start = header.position + _ATTRIBUTES_POS
    return google_crc32c.value(bytes(buf[start : header.position + header.size]))


def _check_structure(buf: Buffer, header: BatchHeader) -> None:
    """The checks that hold for every stored batch, whoever produced it."""
    if header.magic != MAGIC_V2:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset} has magic {header.magic}; only 2 is supported"
        )
    if header.compression > CompressionType.ZSTD:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset} has unknown compression codec "
            f"{header.compression}"
        )
    if header.last_offset_delta < 0 or header.records_count < 0:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset} has lastOffsetDelta "
            f"{header.last_offset_delta} and recordsCount {header.records_count}"
        )
    crc = compute_crc(buf, header)
    if crc != header.crc:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset} (position {header.position}) fails its CRC: "
            f"stored {header.crc:#010x}, computed {crc:#010x}"
        )


def _complete_batches(buf: Buffer) -> list[BatchHeader]:
    """All batch headers of `buf`, which must hold nothing but complete batches."""
    headers = list(iter_batches(buf))
    consumed = headers[-1].position + headers[-1].size if headers else 0
    if consumed != len(buf):
        raise CorruptRecordError(
            f"records end with {len(buf) - consumed} bytes that are not a complete batch"
        )
    return headers


def validate_replicated_batches(buf: Buffer) -> list[BatchHeader]:
    """Check batches copied from a leader (offsets already assigned); return their headers.

    Structure, magic, codec and CRC are checked as for a producer, but not the size limit or the
    record count rule: the leader accepted these batches under its own (possibly older) config,
    and a follower that refused them would stall replication forever.
    """
    headers = _complete_batches(buf)
    for header in headers:
        _check_structure(buf, header)
    return headers


def validate_stored_batch(buf: Buffer, header: BatchHeader) -> None:
    """Recovery's check of one batch read back from a segment: structure, codec and CRC."""
    _check_structure(buf, header)


def assign_offsets(
    buf: bytearray,
    headers: Sequence[BatchHeader],
    first_offset: int,
    leader_epoch: int,
    log_append_time_ms: int | None = None,
) -> list[BatchHeader]:
    """Stamp offsets and the leader epoch into every batch of `buf`, in place.

    Batches get consecutive offsets starting at `first_offset`. baseOffset and
    partitionLeaderEpoch are outside the CRC, so that part costs two `pack_into` per batch. With
    `log_append_time_ms` (the topic uses message.timestamp.type=LogAppendTime) each batch also gets
    the timestamp-type bit and that maxTimestamp, and its CRC is recomputed. Returns the updated
    headers.
    """
    patched: list[BatchHeader] = []
    next_offset = first_offset
    for header in headers:
        position = header.position
        _INT64.pack_into(buf, position + _BASE_OFFSET_POS, next_offset)
        _INT32.pack_into(buf, position + _LEADER_EPOCH_POS, leader_epoch)
        changes: dict[str, int] = {
            "base_offset": next_offset,
            "partition_leader_epoch": leader_epoch,
        }
        if log_append_time_ms is not None:
            changes.update(_set_log_append_time(buf, header, log_append_time_ms))
        patched.append(header._replace(**changes))
        next_offset += header.last_offset_delta + 1
    return patched


def set_create_time(buf: bytearray, header: BatchHeader, max_timestamp: int) -> BatchHeader:
    """Mark one batch as CreateTime with maxTimestamp `max_timestamp`, recomputing its CRC in
    place: Kafka's correction of a producer's batch whose header disagrees with its records."""
    position = header.position
    attributes = header.attributes & ~_TIMESTAMP_TYPE_BIT
    _INT16.pack_into(buf, position + _ATTRIBUTES_POS, attributes)
    _INT64.pack_into(buf, position + _MAX_TIMESTAMP_POS, max_timestamp)
    crc = compute_crc(buf, header)
    _UINT32.pack_into(buf, position + _CRC_POS, crc)
    return header._replace(attributes=attributes, max_timestamp=max_timestamp, crc=crc)


def set_log_append_time(buf: bytearray, header: BatchHeader, now_ms: int) -> BatchHeader:
    """Mark one batch as LogAppendTime with timestamp `now_ms`, recomputing its CRC in place."""
    return header._replace(**_set_log_append_time(buf, header, now_ms))


def _set_log_append_time(buf: bytearray, header: BatchHeader, now_ms: int) -> dict[str, int]:
    position = header.position
    attributes = header.attributes | _TIMESTAMP_TYPE_BIT
    _INT16.pack_into(buf, position + _ATTRIBUTES_POS, attributes)
    _INT64.pack_into(buf, position + _MAX_TIMESTAMP_POS, now_ms)
    crc = compute_crc(buf, header)
    _UINT32.pack_into(buf, position + _CRC_POS, crc)
    return {"attributes": attributes, "max_timestamp": now_ms, "crc": crc}


def rebuild_batch(
    batch: Buffer, header: BatchHeader, records: Buffer, compression: CompressionType
) -> bytearray:
    """The batch `header` describes (at the start of `batch`) with `records` (its records
    section, decompressed) stored with `compression` instead: the leader's recompression for a
    topic's compression.type. Every header field stays but the codec, batchLength and CRC; the
    records are byte for byte the same once decompressed."""
    from odradek.protocol import compression as codecs

    if compression == CompressionType.NONE:
        payload: Buffer = records
    else:
        payload = codecs.compress(compression, bytes(records))
    out = bytearray(memoryview(batch)[: header.position + HEADER_SIZE][header.position :])
    out += payload
    _INT32.pack_into(out, 8, len(out) - LOG_OVERHEAD)
    _INT16.pack_into(out, _ATTRIBUTES_POS, (header.attributes & ~_COMPRESSION_MASK) | compression)
    _UINT32.pack_into(out, _CRC_POS, google_crc32c.value(bytes(out[_ATTRIBUTES_POS:])))
    return out


# ---------------------------------------------------------------------------------------------
# Record-level helpers for tests, benchmarks and tools. Never used on the broker's hot paths.
# ---------------------------------------------------------------------------------------------

RecordHeaders = Sequence[tuple[str, bytes | None]]


class Record(NamedTuple):
    """One decoded record."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def _write_varint(out: bytearray, value: int) -> None:
    """Zig-zag varint, as Kafka's ByteUtils.writeVarint/writeVarlong."""
    zigzag = (value << 1) ^ (value >> 63)
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(data))
        out += data


def build_batch(
    records: Sequence[tuple[bytes | None, bytes | None, RecordHeaders, int]],
    base_offset: int = 0,
    compression: CompressionType = CompressionType.NONE,
    *,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
) -> bytes:
    """Encode `(key, value, headers, timestamp)` records as one v2 CreateTime batch (a control
    batch, such as a transaction marker, with `is_control`).

    Test and benchmark helper: the broker itself never builds batches. Every codec is supported
    (gzip from the standard library, snappy raw as librdkafka writes it, lz4 frames with
    independent blocks and zstd through `odradek.protocol.compression`).
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    base_timestamp = records[0][3]
    body = bytearray()
    for offset_delta, (key, value, headers, timestamp) in enumerate(records):
        record = bytearray()
        record.append(0)  # record attributes: unused in v2
        _write_varint(record, timestamp - base_timestamp)
        _write_varint(record, offset_delta)
        _write_bytes(record, key)
        _write_bytes(record, value)
        _write_varint(record, len(headers))
        for header_key, header_value in headers:
            _write_bytes(record, header_key.encode())
            _write_bytes(record, header_value)
        _write_varint(body, len(record))
        body += record
    if compression == CompressionType.GZIP:
        payload = gzip.compress(bytes(body))
    elif compression == CompressionType.NONE:
        payload = bytes(body)
    elif compression == CompressionType.SNAPPY:
        import cramjam

        payload = bytes(cramjam.snappy.compress_raw(bytes(body)))
    elif compression in (CompressionType.LZ4, CompressionType.ZSTD):
        from odradek.protocol import compression as codecs

        payload = codecs.compress(compression, bytes(body))
    else:
        raise UnsupportedCompressionTypeError(f"build_batch cannot compress with {compression}")
    attributes = (
        int(compression)
        | (_TRANSACTIONAL_BIT if is_transactional else 0)
        | (_CONTROL_BIT if is_control else 0)
    )
    batch = bytearray(HEADER_SIZE) + payload
    HEADER.pack_into(
        batch,
        0,
        base_offset,
        len(batch) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC_V2,
        0,
        attributes,
        len(records) - 1,
        base_timestamp,
        max(record[3] for record in records),
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    crc = google_crc32c.value(bytes(batch[_ATTRIBUTES_POS:]))
    _UINT32.pack_into(batch, _CRC_POS, crc)
    return bytes(batch)


TOOLS_DECOMPRESSED_LIMIT = 100 * 1024 * 1024
"""How far the tool helpers decompress a batch (the broker's default limit; see LogConfig)."""


def decompress(compression: int, payload: bytes, limit: int = TOOLS_DECOMPRESSED_LIMIT) -> bytes:
    """The records section of a compressed batch (bounded: see `odradek.protocol.compression`)."""
    from odradek.protocol import compression as codecs

    if compression not in (
        CompressionType.GZIP,
        CompressionType.SNAPPY,
        CompressionType.LZ4,
        CompressionType.ZSTD,
    ):
        raise UnsupportedCompressionTypeError(f"unknown compression codec {compression}")
    return codecs.decompress(compression, payload, limit)


def decode_records(batch: Buffer, limit: int = TOOLS_DECOMPRESSED_LIMIT) -> list[Record]:
    """Decode the records of the single batch at the start of `batch` (tests and tools only).

    With LogAppendTime every record reports the batch's maxTimestamp, as Kafka's consumers do.
    Decompresses every codec Kafka has, to at most `limit` bytes; malformed records raise
    InvalidRecordError (the rules of `odradek.protocol.records`).
    """
    from odradek.protocol.records import index_records

    if len(batch) < HEADER_SIZE:
        raise CorruptRecordError("buffer shorter than a batch header")
    header = read_header(batch)
    if header.size > len(batch):
        raise CorruptRecordError("buffer shorter than the batch it starts")
    payload: Buffer = memoryview(batch)[HEADER_SIZE : header.size]
    if header.compression != CompressionType.NONE:
        payload = decompress(header.compression, bytes(payload), limit)
    log_append_time = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    records: list[Record] = []
    for layout in index_records(payload, header.records_count, header.base_timestamp, stored=True):
        headers: list[tuple[str, bytes | None]] = []
        position = layout.headers_position
        for _ in range(layout.header_count):
            key, position = _sized_field(payload, position)
            value, position = _sized_field(payload, position)
            headers.append(((key or b"").decode(errors="replace"), value))
        records.append(
            Record(
                header.base_offset + layout.offset_delta,
                header.max_timestamp if log_append_time else layout.timestamp,
                _field(payload, layout.key_position, layout.key_length),
                _field(payload, layout.value_position, layout.value_length),
                headers,
            )
        )
    return records


def _field(payload: Buffer, position: int, length: int) -> bytes | None:
    return None if length < 0 else bytes(payload[position : position + length])


def _sized_field(payload: Buffer, position: int) -> tuple[bytes | None, int]:
    """A varint-length-prefixed field the walker has already validated."""
    raw, shift = 0, 0
    while True:
        byte = payload[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    length = (raw >> 1) ^ -(raw & 1)
    if length < 0:
        return None, position
    return bytes(payload[position : position + length]), position + length


def find_timestamp_in_batch(
    batch: Buffer,
    target_timestamp: int,
    min_offset: int = 0,
    limit: int = TOOLS_DECOMPRESSED_LIMIT,
) -> tuple[int, int] | None:
    """The first record of `batch` at or after `min_offset` with timestamp >= target, as
    (offset, timestamp); None when the records show there is none.

    ListOffsets helper (not a hot path). The caller already knows the batch's maxTimestamp is
    >= target. CreateTime batches are searched record by record (decompressed, to at most
    `limit` bytes, if need be), as Kafka does, by the native walker: no Python per record. LogAppendTime batches (every record has the batch timestamp) answer at batch
    granularity: the batch's base offset and maxTimestamp.
    """
    header = read_header(batch)
    if header.timestamp_type != TimestampType.CREATE_TIME:
        return max(header.base_offset, min_offset), header.max_timestamp
    from odradek.protocol import compression
    from odradek.protocol.records import find_timestamp

    payload: Buffer = memoryview(batch)[HEADER_SIZE : header.size]
    try:
        if header.compression != CompressionType.NONE:
            payload = compression.decompress_bounded(header.compression, payload, limit)
        found = find_timestamp(
            payload,
            header.records_count,
            header.base_timestamp,
            target_timestamp,
            min_offset - header.base_offset,
        )
    finally:
        if isinstance(payload, memoryview):
            payload.release()
        compression.trim_scratch()
    return None if found is None else (header.base_offset + found[0], found[1])
