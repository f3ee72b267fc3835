"""The leader's check of a produce request's records before they are appended (Kafka's LogValidator).

The broker stores batches as producers send them and consumers parse whatever it stores, so a batch
that is wrong inside (a record count that does not match the records, a record whose length does
not match its fields, a compressed payload that does not decompress to exactly its records) must
be refused here: once stored, it stops every consumer that reaches it. The checks, in the order
they are made, and the error code of each (Kafka 3.9's where Kafka answers sensibly; see
tests/integration/test_kafka_differential.py for both brokers' answers to each case):

| check                                                                     | error code              |
|---------------------------------------------------------------------------|-------------------------|
| a trailing batch header with batchLength < 14, or a whole one < 49        | CORRUPT_MESSAGE         |
| no complete batch at all; more than one batch (v2: one per partition)     | INVALID_RECORD          |
| baseOffset != 0 (a producer never assigns offsets)                        | INVALID_RECORD          |
| the batch is larger than the topic's max.message.bytes                    | MESSAGE_TOO_LARGE       |
| magic 0 or 1 (legacy formats are not supported)                           | INVALID_RECORD          |
| any other magic than 2                                                    | CORRUPT_MESSAGE         |
| CRC32C mismatch                                                           | CORRUPT_MESSAGE         |
| unknown compression codec (5-7)                                           | CORRUPT_MESSAGE (1)     |
| recordsCount < 1, lastOffsetDelta != recordsCount - 1                     | INVALID_RECORD          |
| a control batch; a producer id without a base sequence                    | INVALID_RECORD          |
| the payload does not decompress                                           | CORRUPT_MESSAGE (1)     |
| it decompresses to more than the decompression limit                      | MESSAGE_TOO_LARGE (2)   |
| malformed records (`odradek.protocol.records`)                            | INVALID_RECORD (3)      |
| CreateTime topic: a record timestamp outside [now - before, now + after]  | INVALID_TIMESTAMP (4)   |
| LogAppendTime topic: the producer set the LogAppendTime bit               | INVALID_TIMESTAMP (4)   |
| compacted topic (cleanup.policy has compact): a record without a key      | INVALID_RECORD (5)      |

(1) Kafka 3.9 answers UNKNOWN_SERVER_ERROR: an internal exception escapes its validator.
(2) Kafka has no limit; see `decompressed_limit` in `LogConfig`. A Java producer answers
    MESSAGE_TOO_LARGE by splitting the batch and sending the halves.
(3) Kafka refuses the same structural errors with INVALID_RECORD, but stores some malformed
    records that its consumers then cannot read (key or value lengths below -1, offset deltas
    other than 0, 1, 2, ..., a compressed batch whose last record claims more bytes than there
    are); those are refused here too, with the same code.
(4) With `record_errors`: each offending record's index and why, as Kafka fills them (the first
    1000 of them: Kafka lists every one, which for a batch of millions of tiny records would be
    hundreds of megabytes of response).
(5) Kafka's message for each ("Compacted topic cannot accept message without key in topic
    partition <topic>-<partition>.") in `record_errors`; a record without a key is reported for
    that instead of its timestamp, and when some other record's timestamp is wrong the whole
    batch is INVALID_TIMESTAMP with both kinds listed, as in Kafka's LogValidator.

Recompression. When the topic's compression.type names a codec (`uncompressed`, `gzip`, `snappy`,
`lz4`, `zstd`; `producer` keeps the producer's) and the batch uses another, the result carries the
batch to store instead: the same header and records, stored with the topic's codec (Kafka
rebuilds such a batch too; offsets are then assigned to it as to any other). The recompressed
batch must still fit max.message.bytes (MESSAGE_TOO_LARGE). Compressing costs more than walking:
on the event loop only `RECOMPRESS_INLINE_BYTES` of records are recompressed, larger batches go
to a worker thread (`NeedsWorkerThread`) like large validations.

A batch that passes may still need its header corrected, as Kafka corrects it: on a CreateTime
topic maxTimestamp is set to the largest record timestamp and the LogAppendTime bit cleared (the
result says so; `Log.append_as_leader` patches the header and its CRC). A partial batch after the
complete one (fewer bytes than its batchLength) is dropped, as Kafka drops it.

Cost. Everything above except decompression and the record walk is a header unpack and a CRC.
`bench/validation_cost.py` measures what the rest costs a producer by running brokers with
ODRADEK_BENCH_SKIP_RECORD_VALIDATION=1 in their environment, which skips decompression and the
record walk (and so must never be set anywhere else).
The walk is native (one pass, no Python per record). Both run on the calling thread only up to
`budget` bytes of records: past that `NeedsWorkerThread` is raised before any large work is done,
and the caller (the replica manager) runs the validation again on a worker thread with no budget.
Decompression and the walk release the GIL there.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
from dataclasses import dataclass

from odradek.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
)
from odradek.log.config import LogConfig
from odradek.protocol.compression import (
    DecompressedTooLargeError,
    decompress_bounded,
    trim_scratch,
)
from odradek.protocol.record_batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    NO_TIMESTAMP,
    BatchHeader,
    CompressionType,
    TimestampType,
    compute_crc,
    read_header,
    rebuild_batch,
)
from odradek.protocol.records import OUTSIDE_LIMIT, ScanResult, scan_records

_BATCH_LENGTH = struct.Struct(">i")
_BATCH_LENGTH_POS = 8
_HEADER_UP_TO_MAGIC = 17
"""Bytes Kafka needs to look at a batch (offset, length, epoch, magic): a shorter tail is ignored."""
_MIN_RECORD_OVERHEAD = 14
"""Kafka's smallest legal batchLength (the v0 record overhead), checked before the magic is known."""
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

TIMESTAMP_ERROR = "One or more records have been rejected due to invalid timestamp"

RECOMPRESS_INLINE_BYTES = 128 * 1024
"""Bytes of records recompressed on the event loop (compression.type); more go to a worker."""

_TARGET_CODECS = {
    "uncompressed": CompressionType.NONE,
    "gzip": CompressionType.GZIP,
    "snappy": CompressionType.SNAPPY,
    "lz4": CompressionType.LZ4,
    "zstd": CompressionType.ZSTD,
}

_SKIP_RECORDS = os.environ.get("ODRADEK_BENCH_SKIP_RECORD_VALIDATION") == "1"
if _SKIP_RECORDS:
    logging.getLogger(__name__).warning(
        "ODRADEK_BENCH_SKIP_RECORD_VALIDATION=1: records are NOT validated (benchmarks only)"
    )


class NeedsWorkerThread(Exception):
    """Validation would take more than the caller's inline budget: run it again off the loop."""


@dataclass(frozen=True, slots=True)
class ValidatedRecords:
    """A produce request's records that passed validation, and what the append must fix."""

    header: BatchHeader
    size: int
    """Bytes to append: the batch, without a dropped partial tail."""
    max_timestamp: int
    """The largest record timestamp (CreateTime), to store in the header."""
    fix_create_time: bool
    """The header's maxTimestamp or LogAppendTime bit must be corrected (CreateTime topic)."""
    batch: bytes | bytearray | None = None
    """The batch to store instead of the producer's (recompressed for the topic's
    compression.type; `header` and `size` describe it), or None."""


def _single_batch(buf: bytes | bytearray | memoryview) -> BatchHeader:
    n = len(buf)
    position = 0
    headers: list[BatchHeader] = []
    while n - position >= _HEADER_UP_TO_MAGIC:
        (batch_length,) = _BATCH_LENGTH.unpack_from(buf, position + _BATCH_LENGTH_POS)
        if batch_length < _MIN_RECORD_OVERHEAD:
            raise CorruptRecordError(
                f"batch at position {position} has batchLength {batch_length}, less than the "
                f"minimum {_MIN_RECORD_OVERHEAD}"
            )
        if position + LOG_OVERHEAD + batch_length > n:
            break  # a partial batch at the end: ignored, as Kafka ignores it
        if batch_length < _MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"batch at position {position} has batchLength {batch_length}, smaller than a "
                f"batch header ({_MIN_BATCH_LENGTH})"
            )
        headers.append(read_header(buf, position))
        position += LOG_OVERHEAD + batch_length
        if len(headers) > 1:
            break  # one too many already: do not parse what may be millions more
    if not headers:
        raise InvalidRecordError("the records hold no complete record batch")
    if len(headers) > 1:
        raise InvalidRecordError(
            "the records hold more than one batch; a produce request carries one batch per "
            "partition"
        )
    return headers[0]


def _check_header(
    buf: bytes | bytearray | memoryview,
    header: BatchHeader,
    config: LogConfig,
    allow_control: bool = False,
) -> None:
    if header.base_offset != 0:
        raise InvalidRecordError(f"a producer's batch has baseOffset 0, not {header.base_offset}")
    if header.size > config.max_message_bytes:
        raise RecordTooLargeError(
            f"batch of {header.size} bytes exceeds max.message.bytes {config.max_message_bytes}"
        )
    if header.magic in (0, 1):
        raise InvalidRecordError(f"message format v{header.magic} is not supported: only v2")
    if header.magic != MAGIC_V2:
        raise CorruptRecordError(f"Invalid magic found in record: {header.magic}")
    crc = compute_crc(buf, header)
    if crc != header.crc:
        raise CorruptRecordError(
            f"batch fails its CRC: stored {header.crc:#010x}, computed {crc:#010x}"
        )
    if header.compression > CompressionType.ZSTD:
        raise CorruptRecordError(f"unknown compression codec {header.compression}")
    if header.records_count < 1:
        raise InvalidRecordError(f"invalid recordsCount {header.records_count}")
    if header.last_offset_delta != header.records_count - 1:
        raise InvalidRecordError(
            f"lastOffsetDelta {header.last_offset_delta} does not match recordsCount "
            f"{header.records_count}"
        )
    if header.is_control:
        if not allow_control:
            raise InvalidRecordError("clients may not write control batches")
    elif header.producer_id >= 0 and header.base_sequence < 0:
        raise InvalidRecordError(
            f"batch of producer id {header.producer_id} has no sequence number "
            f"({header.base_sequence})"
        )


def _timestamp_error(records_errors: list[tuple[int, str]]) -> InvalidTimestampError:
    error = InvalidTimestampError(TIMESTAMP_ERROR)
    error.record_errors = tuple(records_errors)
    return error


def target_codec(config: LogConfig, source: int) -> int:
    """The codec a batch compressed with `source` is stored with on this topic."""
    return _TARGET_CODECS.get(config.compression_type, source)


def validate_produce_records(
    records: bytes | bytearray | memoryview,
    config: LogConfig,
    now_ms: int,
    budget: int | None = None,
    partition_name: str = "",
    *,
    allow_control: bool = False,
) -> ValidatedRecords:
    """Check a produce request's records for one partition (module docstring); raise the
    KafkaError of the first problem, or NeedsWorkerThread when `budget` (bytes of records to
    walk on this thread, None = unlimited) would be exceeded. `partition_name`
    (`<topic>-<partition>`) goes into the messages that name it, as Kafka's do. `allow_control`
    lets a transaction coordinator's marker batches through (never a client's)."""
    header = _single_batch(records)
    _check_header(records, header, config, allow_control)
    target = target_codec(config, header.compression)
    if _SKIP_RECORDS and target == header.compression:
        return ValidatedRecords(header, header.size, header.max_timestamp, False)
    payload = memoryview(records)[HEADER_SIZE : header.size]
    limit = config.decompressed_limit
    try:
        if header.compression != CompressionType.NONE:
            payload = _decompress(payload, header, limit, budget)
        elif budget is not None and len(payload) > budget:
            raise NeedsWorkerThread()
        recompress = target != header.compression
        if recompress and budget is not None and len(payload) > RECOMPRESS_INLINE_BYTES:
            raise NeedsWorkerThread()
        validated = _check_records(payload, header, config, now_ms, partition_name)
        if recompress:
            validated = _recompress(records, header, payload, target, validated, config)
        return validated
    finally:
        payload.release()
        trim_scratch()


def _recompress(
    records: bytes | bytearray | memoryview,
    header: BatchHeader,
    payload: memoryview,
    target: int,
    validated: ValidatedRecords,
    config: LogConfig,
) -> ValidatedRecords:
    batch = rebuild_batch(records, header, payload, CompressionType(target))
    if len(batch) > config.max_message_bytes:
        raise RecordTooLargeError(
            f"batch of {len(batch)} bytes once recompressed for compression.type "
            f"{config.compression_type} exceeds max.message.bytes {config.max_message_bytes}"
        )
    return dataclasses.replace(validated, header=read_header(batch), size=len(batch), batch=batch)


def _decompress(
    payload: memoryview, header: BatchHeader, limit: int, budget: int | None
) -> memoryview:
    """The decompressed records, at most min(limit, budget) bytes of them.

    When the output does not fit, what did fit is walked as a prefix first: garbage (a bomb of
    zeros, say) is then refused as malformed records, as Kafka's streaming reader refuses it, and
    only well-formed records that are too many are MESSAGE_TOO_LARGE (or sent to a worker thread
    when it is only the budget that is exceeded)."""
    inline_limit = limit if budget is None else min(limit, budget)
    try:
        return decompress_bounded(header.compression, payload, inline_limit)
    except DecompressedTooLargeError as e:
        if e.prefix is not None:
            try:
                scan_records(e.prefix, header.records_count, header.base_timestamp, prefix=True)
            finally:
                e.prefix.release()
        if inline_limit < limit:
            raise NeedsWorkerThread() from None
        raise


def _check_records(
    payload: memoryview,
    header: BatchHeader,
    config: LogConfig,
    now_ms: int,
    partition_name: str,
) -> ValidatedRecords:
    count, base = header.records_count, header.base_timestamp
    claims_append_time = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    keys = config.compact
    if config.uses_log_append_time:
        scan = scan_records(payload, count, base, require_keys=keys)
        timestamp_errors = []
        if claims_append_time:
            timestamp_errors = [
                (i, "Producer should not set timestamp type to LogAppendTime.")
                for i in range(min(count, OUTSIDE_LIMIT))
            ]
        _refuse(scan, timestamp_errors, partition_name)
        return ValidatedRecords(header, header.size, header.max_timestamp, False)
    lower = now_ms - config.effective_timestamp_before_max_ms
    upper = now_ms + config.effective_timestamp_after_max_ms
    if claims_append_time:
        # Kafka reads every record of such a batch as having the batch's maxTimestamp.
        scan = scan_records(payload, count, base, require_keys=keys)
        max_timestamp = header.max_timestamp
        timestamp_errors = []
        if max_timestamp != NO_TIMESTAMP and not lower <= max_timestamp <= upper:
            every = [(i, max_timestamp) for i in range(min(count, OUTSIDE_LIMIT))]
            timestamp_errors = _range_errors(every, lower, upper)
        _refuse(scan, timestamp_errors, partition_name)
        return ValidatedRecords(header, header.size, max_timestamp, True)
    scan = scan_records(payload, count, base, lower, upper, require_keys=keys)
    _refuse(scan, _range_errors(scan.outside, lower, upper), partition_name)
    return ValidatedRecords(
        header, header.size, scan.max_timestamp, scan.max_timestamp != header.max_timestamp
    )


def _refuse(scan: ScanResult, timestamp_errors: list[tuple[int, str]], partition_name: str) -> None:
    """Raise Kafka's error for the records missing a key (compacted topics) and the records
    with a wrong timestamp, if any (module docstring, notes 4 and 5)."""
    keyless = set(scan.keyless)
    timestamp_errors = [(i, m) for i, m in timestamp_errors if i not in keyless]
    if not scan.keyless and not timestamp_errors:
        return
    message = (
        f"Compacted topic cannot accept message without key in topic partition {partition_name}."
    )
    key_errors = [(i, message) for i in scan.keyless]
    if timestamp_errors:
        raise _timestamp_error(sorted(key_errors + timestamp_errors)[:OUTSIDE_LIMIT])
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in key_errors[:3])
    error = InvalidRecordError(
        f"One or more records have been rejected due to {scan.keyless_count} record errors in "
        f"total, and only showing the first three errors at most: [{shown}]"
    )
    error.record_errors = tuple(key_errors)
    raise error


def _range_errors(
    outside: list[tuple[int, int]] | tuple[tuple[int, int], ...], lower: int, upper: int
) -> list[tuple[int, str]]:
    return [
        (
            i,
            f"Timestamp {timestamp} of message with offset {i} is out of range. "
            f"The timestamp should be within [{lower}, {upper}]",
        )
        for i, timestamp in outside
    ]
