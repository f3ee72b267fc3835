"""Hand-made record batches, valid and malformed, byte by byte.

`odradek.protocol.record_batch.build_batch` only makes valid batches. The differential test
against Kafka, the broker-level tests and the fuzzer need batches that are wrong in one precise
way and right in every other (above all a correct CRC, so that the broker has to look inside the
records to notice), so this module builds the bytes field by field:

* `RawRecord` is one record's fields; `encode_record` writes them in the v2 layout (module
  docstring of `record_batch`), and every field can be overridden with raw bytes.
* `raw_batch` wraps a records section (compressed or not) in a 61-byte header whose fields all
  default to what a producer writes, and computes the CRC last unless told not to.
* `CASES` is the catalogue the differential test sends to both brokers: a name, the batch and
  the topic it needs (CreateTime with KIP-937 bounds, or LogAppendTime).

Compression here is the clients' own: gzip from the standard library, snappy in the xerial framing
Kafka's Java producer writes and raw as librdkafka writes, lz4 frames with independent blocks (the
only kind Kafka's Java reader accepts), zstd frames.

`cases()` is the catalogue of small cases, `bomb_cases()` the decompression bombs (built on
demand: they take seconds); each case carries Odradek's expected answer and Kafka 3.9's where it
differs, with the reason.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import cramjam
import google_crc32c

from odradek.protocol import compression
from odradek.protocol.record_batch import HEADER, HEADER_SIZE, LOG_OVERHEAD, CompressionType

BASE_TIMESTAMP = 1_700_000_000_000
"""A fixed CreateTime (2023-11-14): far enough in the past that the KIP-937 topics of the
differential test refuse it, while topics with the default bounds accept it."""


def varint(value: int) -> bytes:
    """Zig-zag varint/varlong as Kafka writes it (any size; callers pick values that fit)."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def sized(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


@dataclass(frozen=True)
class RawRecord:
    """One record's fields; a `*_raw` field replaces the encoding of its field verbatim."""

    key: bytes | None = b"k"
    value: bytes | None = b"v"
    headers: Sequence[tuple[bytes | None, bytes | None]] = ()
    offset_delta: int = 0
    timestamp_delta: int = 0
    attributes: int = 0
    timestamp_raw: bytes | None = None
    offset_raw: bytes | None = None
    key_raw: bytes | None = None
    value_raw: bytes | None = None
    headers_raw: bytes | None = None
    length_adjust: int = 0
    """Added to the record's length varint (the body stays as encoded)."""
    length_raw: bytes | None = None


def encode_record(record: RawRecord) -> bytes:
    body = bytearray([record.attributes & 0xFF])
    body += record.timestamp_raw or varint(record.timestamp_delta)
    body += record.offset_raw or varint(record.offset_delta)
    body += record.key_raw if record.key_raw is not None else sized(record.key)
    body += record.value_raw if record.value_raw is not None else sized(record.value)
    if record.headers_raw is not None:
        body += record.headers_raw
    else:
        body += varint(len(record.headers))
        for header_key, header_value in record.headers:
            body += sized(header_key) + sized(header_value)
    length = record.length_raw or varint(len(body) + record.length_adjust)
    return length + bytes(body)


def records_section(records: Sequence[RawRecord]) -> bytes:
    return b"".join(encode_record(r) for r in records)


def numbered(count: int, **fields: object) -> list[RawRecord]:
    """`count` records with offset deltas 0..count-1 (and any other fields given)."""
    return [
        replace(RawRecord(value=f"value-{i}".encode()), offset_delta=i, **fields)  # type: ignore[arg-type]
        for i in range(count)
    ]


def xerial_snappy(data: bytes, block: int = 32 * 1024) -> bytes:
    """Snappy in the xerial framing of Kafka's Java client: magic, version 1, compatible
    version 1, then (4-byte length, raw snappy block) pairs."""
    out = bytearray(b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
    for start in range(0, max(len(data), 1), block):
        chunk = bytes(cramjam.snappy.compress_raw(data[start : start + block]))
        out += struct.pack(">i", len(chunk)) + chunk
    return bytes(out)


COMPRESSORS: dict[int, Callable[[bytes], bytes]] = {
    CompressionType.NONE: lambda data: data,
    CompressionType.GZIP: lambda data: gzip.compress(data, compresslevel=6),
    CompressionType.SNAPPY: xerial_snappy,
    CompressionType.LZ4: lambda data: compression.compress(CompressionType.LZ4, data),
    CompressionType.ZSTD: lambda data: compression.compress(CompressionType.ZSTD, data),
}


def raw_batch(
    payload: bytes,
    *,
    records_count: int,
    last_offset_delta: int | None = None,
    attributes: int = 0,
    magic: int = 2,
    base_offset: int = 0,
    base_timestamp: int = BASE_TIMESTAMP,
    max_timestamp: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    batch_length_adjust: int = 0,
    crc: int | None = None,
) -> bytes:
    """A batch header around `payload` (already compressed if `attributes` says so).

    The CRC is computed over the final bytes unless `crc` is given; `batch_length_adjust` is
    added to the batchLength field after everything else, so the CRC stays right."""
    last = records_count - 1 if last_offset_delta is None else last_offset_delta
    batch = bytearray(HEADER_SIZE) + payload
    HEADER.pack_into(
        batch,
        0,
        base_offset,
        len(batch) - LOG_OVERHEAD + batch_length_adjust,
        partition_leader_epoch,
        magic,
        0,
        attributes,
        last,
        base_timestamp,
        base_timestamp if max_timestamp is None else max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records_count,
    )
    value = google_crc32c.value(bytes(batch[21:])) if crc is None else crc
    struct.pack_into(">I", batch, 17, value)
    return bytes(batch)


def batch_of(
    records: Sequence[RawRecord],
    *,
    compression: int = CompressionType.NONE,
    records_count: int | None = None,
    tail: bytes = b"",
    **header: int,
) -> bytes:
    """A batch holding `records` (plus `tail` bytes after them, before compression)."""
    section = records_section(records) + tail
    payload = COMPRESSORS[compression](section) if compression else section
    count = len(records) if records_count is None else records_count
    attributes = header.pop("attributes", 0) | compression
    max_timestamp = header.pop(
        "max_timestamp",
        header.get("base_timestamp", BASE_TIMESTAMP)
        + max((r.timestamp_delta for r in records), default=0),
    )
    return raw_batch(
        payload,
        records_count=count,
        attributes=attributes,
        max_timestamp=max_timestamp,
        **header,
    )


# ------------------------------------------------------------------------------------------
# The catalogue

# Why Odradek answers differently from Kafka 3.9 (each confirmed against a real Kafka 3.9.1 broker
# by tests/integration/test_kafka_differential.py):
STORES_UNREADABLE = (
    "Kafka stores this batch, but its records cannot be read back correctly: librdkafka fails on "
    "a length below -1 and positions itself by offset deltas, skipping or repeating records"
)
INTERNAL_ERROR = (
    "Kafka answers UNKNOWN_SERVER_ERROR: an internal exception escapes its log validator"
)
VARINT_RANGE = (
    "Kafka drops the bits beyond 32 that librdkafka keeps: the two would read different values"
)
NO_LIMIT = (
    "Kafka does not bound decompression: it accepts (and decompresses on every read) records "
    "beyond socket.request.max.bytes, where Odradek stops"
)


@dataclass(frozen=True)
class Case:
    """One produce the differential test sends to both brokers.

    `topic` is "create" (CreateTime, default timestamp bounds), "bounded" (CreateTime with
    message.timestamp.before/after.max.ms of one hour) or "append" (LogAppendTime). `records` is
    what goes into the partition's records field. `expected` is Odradek's answer (an ErrorCode
    name, "none" when the batch is stored); `kafka` is Kafka 3.9's when it differs, and `why`
    says why Odradek does not follow it."""

    name: str
    records: bytes
    expected: str
    topic: str = "create"
    kafka: str | None = None
    why: str = ""

    @property
    def kafka_expected(self) -> str:
        return self.kafka if self.kafka is not None else self.expected


def _now_relative(now_ms: int, records: int = 3, delta_ms: int = 0) -> bytes:
    return batch_of(numbered(records), base_timestamp=now_ms + delta_ms)


CODECS = (CompressionType.GZIP, CompressionType.SNAPPY, CompressionType.LZ4, CompressionType.ZSTD)
INVALID = "invalid_record"
CORRUPT = "corrupt_message"
OK = "none"


def cases(now_ms: int) -> list[Case]:
    """Every small case; `now_ms` anchors the timestamps that must be in range."""
    three = numbered(3)
    out: list[Case] = [
        Case("valid", batch_of(three), OK),
        Case(
            "valid with headers and nulls",
            batch_of(
                [
                    RawRecord(key=None, value=None, headers=[(b"h", None), (b"h2", b"x")]),
                    RawRecord(key=b"", value=b"", offset_delta=1, headers=[(b"", b"")]),
                ]
            ),
            OK,
        ),
    ]
    for codec in CODECS:
        name = CompressionType(codec).name.lower()
        out += [
            Case(f"valid {name}", batch_of(numbered(50), compression=codec), OK),
            Case(
                f"{name}: recordsCount above the records",
                batch_of(three, compression=codec, records_count=4, last_offset_delta=3),
                INVALID,
            ),
            Case(
                f"{name}: recordsCount below the records",
                batch_of(three, compression=codec, records_count=2, last_offset_delta=1),
                INVALID,
            ),
            Case(
                f"{name}: trailing bytes after the last record",
                batch_of(three, compression=codec, tail=b"\x00\x01\x02"),
                INVALID,
            ),
            Case(
                f"{name}: last record's length past the end",
                batch_of(
                    [*numbered(2), RawRecord(offset_delta=2, length_adjust=5)], compression=codec
                ),
                INVALID,
                kafka=OK,
                why="Kafka stores it; a Java consumer then fails with 'the record payload reached "
                "EOF'",
            ),
            Case(
                f"{name}: payload is not {name}",
                raw_batch(b"\x01\x02garbage-payload" * 4, records_count=3, attributes=codec),
                CORRUPT,
                kafka="unknown_server_error",
                why=INTERNAL_ERROR,
            ),
            Case(
                f"{name}: payload cut short",
                raw_batch(
                    COMPRESSORS[codec](records_section(numbered(50)))[:-7],
                    records_count=50,
                    attributes=codec,
                ),
                CORRUPT,
                kafka="unknown_server_error",
                why=INTERNAL_ERROR,
            ),
            Case(
                f"{name}: offset deltas not sequential",
                batch_of(
                    [replace(r, offset_delta=2 * i) for i, r in enumerate(three)],
                    compression=codec,
                ),
                INVALID,
                kafka="unknown_server_error",
                why=INTERNAL_ERROR,
            ),
        ]
    out += [
        Case(
            "raw snappy (librdkafka's framing)",
            raw_batch(
                bytes(cramjam.snappy.compress_raw(records_section(three))),
                records_count=3,
                attributes=CompressionType.SNAPPY,
            ),
            OK,
        ),
        Case(
            "lz4 with linked blocks",
            raw_batch(
                bytes(cramjam.lz4.compress(records_section(numbered(50)))),
                records_count=50,
                attributes=CompressionType.LZ4,
            ),
            CORRUPT,
            kafka="unknown_server_error",
            why=INTERNAL_ERROR + " (its lz4 reader supports independent blocks only)",
        ),
        Case(
            "bad CRC", raw_batch(records_section(three), records_count=3, crc=0x12345678), CORRUPT
        ),
        Case("magic 0", batch_of(three, magic=0), INVALID),
        Case("magic 1", batch_of(three, magic=1), INVALID),
        Case("magic 3", batch_of(three, magic=3), CORRUPT),
        Case("magic -1", batch_of(three, magic=-1), CORRUPT),
        Case(
            "compression codec 5",
            batch_of(three, attributes=5),
            CORRUPT,
            kafka="unknown_server_error",
            why=INTERNAL_ERROR,
        ),
        Case(
            "compression codec 7",
            batch_of(three, attributes=7),
            CORRUPT,
            kafka="unknown_server_error",
            why=INTERNAL_ERROR,
        ),
        Case("control batch", batch_of(three, attributes=0x20), INVALID),
        Case(
            "transactional without a transactional id",
            batch_of(three, attributes=0x10, producer_id=9, producer_epoch=0, base_sequence=0),
            "transactional_id_authorization_failed",
        ),
        Case(
            "producer id without sequence",
            batch_of(three, producer_id=7, producer_epoch=0),
            INVALID,
        ),
        Case("base offset 5", batch_of(three, base_offset=5), INVALID),
        Case("attributes: unknown high bits", batch_of(three, attributes=0x4000), OK),
        Case("recordsCount 0", batch_of([], records_count=0, last_offset_delta=0), INVALID),
        Case(
            "recordsCount above the records",
            batch_of(three, records_count=4, last_offset_delta=3),
            INVALID,
        ),
        Case(
            "recordsCount below the records",
            batch_of(three, records_count=2, last_offset_delta=1),
            INVALID,
        ),
        Case(
            "recordsCount negative", batch_of(three, records_count=-1, last_offset_delta=2), INVALID
        ),
        Case(
            "lastOffsetDelta above recordsCount - 1", batch_of(three, last_offset_delta=5), INVALID
        ),
        Case(
            "lastOffsetDelta below recordsCount - 1", batch_of(three, last_offset_delta=1), INVALID
        ),
        Case("lastOffsetDelta negative", batch_of(three, last_offset_delta=-1), INVALID),
        Case("trailing bytes after the last record", batch_of(three, tail=b"\x00\x00"), INVALID),
        Case(
            "record length too long",
            batch_of([*numbered(2), RawRecord(offset_delta=2, length_adjust=3)]),
            INVALID,
        ),
        Case(
            "record length too short",
            batch_of([RawRecord(length_adjust=-1), *numbered(2)[1:]]),
            INVALID,
        ),
        Case("record length negative", batch_of([RawRecord(length_raw=varint(-5))]), INVALID),
        Case("record length zero", batch_of([RawRecord(length_raw=varint(0))]), INVALID),
        Case(
            "record length varint of 6 bytes",
            batch_of([RawRecord(length_raw=b"\x80\x80\x80\x80\x80\x00")]),
            INVALID,
            kafka="unknown_server_error",
            why=INTERNAL_ERROR,
        ),
        Case(
            "timestamp delta varlong of 11 bytes",
            batch_of([RawRecord(timestamp_raw=b"\x80" * 10 + b"\x00")]),
            INVALID,
        ),
        Case(
            "key length varint of 6 bytes",
            batch_of([RawRecord(key_raw=b"\x80\x80\x80\x80\x80\x00")]),
            INVALID,
        ),
        Case(
            "offset delta varint with bits beyond 32",
            batch_of([RawRecord(offset_raw=b"\x80\x80\x80\x80\x10")]),
            INVALID,
            kafka=OK,
            why=VARINT_RANGE,
        ),
        Case(
            "key length past the record", batch_of([RawRecord(key_raw=varint(40) + b"k")]), INVALID
        ),
        Case(
            "key length -2",
            batch_of([RawRecord(key_raw=varint(-2))]),
            INVALID,
            kafka=OK,
            why=STORES_UNREADABLE,
        ),
        Case(
            "value length past the record",
            batch_of([RawRecord(value_raw=varint(99) + b"v")]),
            INVALID,
        ),
        Case(
            "value length -7",
            batch_of([RawRecord(value_raw=varint(-7))]),
            INVALID,
            kafka=OK,
            why=STORES_UNREADABLE,
        ),
        Case("header count negative", batch_of([RawRecord(headers_raw=varint(-1))]), INVALID),
        Case("header count huge", batch_of([RawRecord(headers_raw=varint(1_000_000))]), INVALID),
        Case(
            "header count above the headers",
            batch_of([RawRecord(headers_raw=varint(2) + sized(b"h") + sized(b"v"))]),
            INVALID,
        ),
        Case(
            "header key null",
            batch_of([RawRecord(headers_raw=varint(1) + varint(-1) + sized(b"v"))]),
            INVALID,
        ),
        Case(
            "header key not UTF-8",
            batch_of([RawRecord(headers=[(b"\xff\xfe", b"v")])]),
            INVALID,
            kafka=OK,
            why="Kafka stores it; confluent-kafka's Python consumer then fails on the record "
            "(SystemError from Message.headers())",
        ),
        Case(
            "header key of 4-byte UTF-8",
            batch_of([RawRecord(headers=[("\U0001f600-é".encode(), b"v")])]),
            OK,
        ),
        Case("header value null", batch_of([RawRecord(headers=[(b"h", None)])]), OK),
        Case(
            "header value length -2",
            batch_of([RawRecord(headers_raw=varint(1) + sized(b"h") + varint(-2))]),
            INVALID,
            kafka=OK,
            why=STORES_UNREADABLE,
        ),
        Case(
            "header value length past the record",
            batch_of([RawRecord(headers_raw=varint(1) + sized(b"h") + varint(50))]),
            INVALID,
        ),
        Case(
            "offset deltas not sequential",
            batch_of([replace(r, offset_delta=2 * i) for i, r in enumerate(three)]),
            INVALID,
            kafka=OK,
            why=STORES_UNREADABLE,
        ),
        Case(
            "offset deltas repeated",
            batch_of([replace(r, offset_delta=0) for r in three]),
            INVALID,
            kafka=OK,
            why=STORES_UNREADABLE,
        ),
        Case(
            "offset delta negative",
            batch_of([RawRecord(offset_delta=-1)]),
            INVALID,
            kafka=OK,
            why=STORES_UNREADABLE,
        ),
        Case("record attributes set", batch_of([RawRecord(attributes=0x7F)]), OK),
        Case(
            "maxTimestamp below the records' largest",
            batch_of(numbered(3, timestamp_delta=50), max_timestamp=BASE_TIMESTAMP),
            OK,
        ),
        Case(
            "maxTimestamp above the records' largest",
            batch_of(three, max_timestamp=BASE_TIMESTAMP + 999_999),
            OK,
        ),
        Case("batchLength longer than the bytes", batch_of(three, batch_length_adjust=10), INVALID),
        Case(
            "batchLength shorter than the bytes", batch_of(three, batch_length_adjust=-10), CORRUPT
        ),
        Case(
            "batchLength below a header",
            raw_batch(b"", records_count=0, batch_length_adjust=-20),
            CORRUPT,
        ),
        Case("two batches", batch_of(three) + batch_of(three), INVALID),
        Case(
            "a valid batch, then one with a bad CRC",
            batch_of(three) + raw_batch(records_section(three), records_count=3, crc=1),
            INVALID,
        ),
        Case("empty records", b"", INVALID),
        Case("a partial batch after a whole one", batch_of(three) + batch_of(three)[:30], OK),
        Case("10 stray bytes after a whole batch", batch_of(three) + b"\x01" * 10, OK),
        Case("20 zero bytes after a whole batch", batch_of(three) + b"\x00" * 20, CORRUPT),
        Case(
            "timestamps years old on a bounded topic",
            batch_of(three),
            "invalid_timestamp",
            topic="bounded",
        ),
        Case("timestamps now on a bounded topic", _now_relative(now_ms), OK, topic="bounded"),
        Case(
            "timestamps two hours ahead on a bounded topic",
            _now_relative(now_ms, delta_ms=2 * 3600 * 1000),
            "invalid_timestamp",
            topic="bounded",
        ),
        Case(
            "one record of three out of bounds",
            batch_of(
                [
                    replace(r, timestamp_delta=(0 if i != 1 else -3 * 3600 * 1000))
                    for i, r in enumerate(numbered(3))
                ],
                base_timestamp=now_ms,
            ),
            "invalid_timestamp",
            topic="bounded",
        ),
        Case(
            "timestamp -1 on a bounded topic",
            batch_of(numbered(1), base_timestamp=-1, max_timestamp=-1),
            OK,
            topic="bounded",
        ),
        Case("LogAppendTime bit from a producer", batch_of(three, attributes=0x08), OK),
        Case(
            "LogAppendTime bit on a LogAppendTime topic",
            batch_of(three, attributes=0x08),
            "invalid_timestamp",
            topic="append",
        ),
        Case("old timestamps on a LogAppendTime topic", batch_of(three), OK, topic="append"),
        Case(
            "too large for max.message.bytes",
            batch_of([RawRecord(value=b"x" * 1_100_000)]),
            "message_too_large",
        ),
    ]
    return out


BOMB_NAMES = (
    "gzip bomb of zeros",
    "lz4 bomb of zeros",
    "zstd bomb of zeros",
    "snappy bomb of zeros",
    "zstd: one well-formed record of 150 MB",
    "zstd: an honest batch of 20 MB",
)
"""The names `bomb_cases()` returns, in order: tests parametrize over them without building them."""

BOMB_BYTES = 150 * 1024 * 1024
"""More than the default decompression limit (socket.request.max.bytes, 100 MB)."""


def bomb_cases() -> list[Case]:
    """Decompression bombs and an honest large batch (slow to build: a few seconds)."""
    zeros = bytes(BOMB_BYTES)
    out = [
        Case(
            f"{CompressionType(codec).name.lower()} bomb of zeros",
            raw_batch(COMPRESSORS[codec](zeros), records_count=1000, attributes=codec),
            INVALID,
        )
        for codec in (CompressionType.GZIP, CompressionType.LZ4, CompressionType.ZSTD)
    ]
    # Snappy cannot expand 1 MB past about 21 MB: its bomb fits the limit and is garbage.
    out.append(
        Case(
            "snappy bomb of zeros",
            raw_batch(
                COMPRESSORS[CompressionType.SNAPPY](zeros[: 20 * 1024 * 1024]),
                records_count=1000,
                attributes=CompressionType.SNAPPY,
            ),
            INVALID,
        )
    )
    del zeros
    big_value = bytes(BOMB_BYTES)
    out.append(
        Case(
            "zstd: one well-formed record of 150 MB",
            batch_of([RawRecord(value=big_value)], compression=CompressionType.ZSTD),
            "message_too_large",
            kafka=OK,
            why=NO_LIMIT,
        )
    )
    del big_value
    line = b"an honest, highly compressible log line, much like the one before it " * 14
    honest = [RawRecord(key=str(i).encode(), value=line, offset_delta=i) for i in range(20_000)]
    out.append(
        Case(
            "zstd: an honest batch of 20 MB",
            batch_of(honest, compression=CompressionType.ZSTD),
            OK,
        )
    )
    if tuple(case.name for case in out) != BOMB_NAMES:
        raise ValueError("BOMB_NAMES is out of date")
    return out
