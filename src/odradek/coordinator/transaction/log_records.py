"""The records of `__transaction_state`: Kafka's TransactionLogKey and TransactionLogValue, and the
transaction markers (control records) the coordinator has written to data partitions.

Schemas (Kafka 3.9's `transaction-coordinator/src/main/resources/common/message/`):

    TransactionLogKey   v0:   int16 version, TransactionalId string (int16 length + UTF-8)
    TransactionLogValue v0:   int16 version, ProducerId int64, ProducerEpoch int16,
                              TransactionTimeoutMs int32, TransactionStatus int8,
                              TransactionPartitions nullable array (int32 count, -1 for null) of
                              { Topic string, PartitionIds array of int32 },
                              TransactionLastUpdateTimestampMs int64,
                              TransactionStartTimestampMs int64
    TransactionLogValue v1:   the same fields in flexible encoding: compact strings and arrays
                              (unsigned varint length + 1, 0 for null) and an empty tagged-field
                              section after each struct

Kafka 3.9 in ZooKeeper mode writes value version 0 (version 1 only once `transaction.version` 2
is finalised, which needs KRaft) and reads both; so does this module. The value of an Empty
transaction has null partitions. A null value (tombstone) deletes the transactional id (written
when it expires).

Transaction markers (Kafka's EndTransactionMarker): a control batch (attributes transactional |
control) with the producer's id and epoch, base sequence -1 and one record whose key is int16
version 0 + int16 type (0 ABORT, 1 COMMIT) and whose value is int16 version 0 + int32
coordinator epoch.

Nothing here does I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from odradek.coordinator.record_fields import RecordReader, write_uvarint
from odradek.coordinator.transaction.metadata import (
    NO_PRODUCER_EPOCH,
    TopicPartition,
    TransactionState,
    TxnTransitMetadata,
)
from odradek.errors import CorruptRecordError
from odradek.protocol.record_batch import (
    BatchHeader,
    CompressionType,
    build_batch,
    decode_records,
)

TRANSACTION_STATE_TOPIC = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSION = 0

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_VALUE_HEAD = struct.Struct(">qhib")  # producer id, epoch, timeout, status
_MARKER_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")

CONTROL_ABORT = 0
CONTROL_COMMIT = 1


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_status: int
    transaction_partitions: tuple[tuple[str, tuple[int, ...]], ...] | None
    transaction_last_update_timestamp_ms: int
    transaction_start_timestamp_ms: int


# -- keys --------------------------------------------------------------------------------------


def encode_key(transactional_id: str) -> bytes:
    data = transactional_id.encode("utf-8")
    return _INT16.pack(KEY_VERSION) + _INT16.pack(len(data)) + data


def decode_key(data: bytes) -> str | None:
    """The transactional id of a key; None for a key version Kafka 3.9 does not write (Kafka
    skips those as unknown keys)."""
    reader = _Reader(data)
    version = reader.fixed(_INT16)
    if version != KEY_VERSION:
        return None
    transactional_id = reader.string(flexible=False, nullable=False)
    reader.end("TransactionLogKey")
    return str(transactional_id)


# -- values ------------------------------------------------------------------------------------


def _write_string(out: bytearray, text: str, flexible: bool) -> None:
    data = text.encode("utf-8")
    if flexible:
        write_uvarint(out, len(data) + 1)
    else:
        out += _INT16.pack(len(data))
    out += data


def _write_count(out: bytearray, count: int | None, flexible: bool) -> None:
    if flexible:
        write_uvarint(out, 0 if count is None else count + 1)
    else:
        out += _INT32.pack(-1 if count is None else count)


def encode_value(value: TransactionLogValue, version: int = VALUE_VERSION) -> bytes:
    if version not in (0, 1):
        raise CorruptRecordError(f"TransactionLogValue has no version {version}")
    flexible = version >= 1
    out = bytearray(_INT16.pack(version))
    out += _VALUE_HEAD.pack(
        value.producer_id,
        value.producer_epoch,
        value.transaction_timeout_ms,
        value.transaction_status,
    )
    partitions = value.transaction_partitions
    _write_count(out, None if partitions is None else len(partitions), flexible)
    for topic, ids in partitions or ():
        _write_string(out, topic, flexible)
        _write_count(out, len(ids), flexible)
        for partition in ids:
            out += _INT32.pack(partition)
        if flexible:
            out.append(0)
    out += _INT64.pack(value.transaction_last_update_timestamp_ms)
    out += _INT64.pack(value.transaction_start_timestamp_ms)
    if flexible:
        out.append(0)
    return bytes(out)


class _Reader(RecordReader):
    __slots__ = ()

    OVERRUN = "a transaction log field runs past the end of the record"

    def count(self, flexible: bool) -> int:
        return self.uvarint() - 1 if flexible else self.fixed(_INT32)

    def string(self, flexible: bool, nullable: bool) -> str | None:
        length = self.uvarint() - 1 if flexible else self.fixed(_INT16)
        if length < 0:
            if nullable and length == -1:
                return None
            raise CorruptRecordError(f"invalid string length {length}")
        try:
            return self.take(length).decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptRecordError("a transaction log string is not UTF-8") from None


def decode_value(data: bytes) -> TransactionLogValue:
    reader = _Reader(bytes(data))
    version = reader.fixed(_INT16)
    if version not in (0, 1):
        raise CorruptRecordError(f"TransactionLogValue version {version} is not one Kafka writes")
    flexible = version >= 1
    producer_id, epoch, timeout_ms, status = _VALUE_HEAD.unpack(reader.take(_VALUE_HEAD.size))
    count = reader.count(flexible)
    partitions: tuple[tuple[str, tuple[int, ...]], ...] | None
    if count < -1:
        raise CorruptRecordError(f"invalid partition count {count}")
    if count == -1:
        partitions = None
    else:
        entries = []
        for _ in range(count):
            topic = reader.string(flexible, nullable=False)
            ids_count = reader.count(flexible)
            if ids_count < 0:
                raise CorruptRecordError("a null partition id array")
            ids = tuple(reader.fixed(_INT32) for _ in range(ids_count))
            if flexible:
                reader.skip_tagged_fields()
            entries.append((str(topic), ids))
        partitions = tuple(entries)
    last_update = reader.fixed(_INT64)
    start = reader.fixed(_INT64)
    if flexible:
        reader.skip_tagged_fields()
    reader.end("TransactionLogValue")
    return TransactionLogValue(
        producer_id, epoch, timeout_ms, status, partitions, last_update, start
    )


def value_for(target: TxnTransitMetadata) -> bytes:
    """The value Kafka writes for a transition (partitions grouped by topic; null when Empty)."""
    partitions: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    if target.state is not TransactionState.EMPTY:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(target.partitions):
            by_topic.setdefault(topic, []).append(partition)
        partitions = tuple((topic, tuple(ids)) for topic, ids in by_topic.items())
    return encode_value(
        TransactionLogValue(
            target.producer_id,
            target.producer_epoch,
            target.txn_timeout_ms,
            int(target.state),
            partitions,
            target.txn_last_update_timestamp,
            target.txn_start_timestamp,
        )
    )


def transit_from_value(value: TransactionLogValue) -> TxnTransitMetadata:
    """A loaded value as a transition target (last producer id and epoch are not stored)."""
    try:
        state = TransactionState(value.transaction_status)
    except ValueError:
        raise CorruptRecordError(f"unknown transaction state {value.transaction_status}") from None
    partitions: set[TopicPartition] = set()
    if state is not TransactionState.EMPTY:
        for topic, ids in value.transaction_partitions or ():
            partitions.update((topic, partition) for partition in ids)
    return TxnTransitMetadata(
        value.producer_id,
        -1,
        value.producer_epoch,
        NO_PRODUCER_EPOCH,
        value.transaction_timeout_ms,
        state,
        frozenset(partitions),
        value.transaction_start_timestamp_ms,
        value.transaction_last_update_timestamp_ms,
    )


def transaction_record(
    transactional_id: str, target: TxnTransitMetadata | None, now_ms: int
) -> bytes:
    """One uncompressed batch (Kafka enforces compression none) holding the id's record; a
    tombstone when `target` is None."""
    value = None if target is None else value_for(target)
    return build_batch([(encode_key(transactional_id), value, (), now_ms)])


def replay(
    batches: Iterable[tuple[BatchHeader, bytes]], into: dict[str, TxnTransitMetadata]
) -> int:
    """Apply the records of `__transaction_state` batches in offset order to `into` (the last
    record of each id wins, a tombstone deletes it); the number of records applied."""
    applied = 0
    for header, data in batches:
        if header.is_control:
            continue
        for record in decode_records(data):
            if record.key is None:
                raise CorruptRecordError("a transaction log record without a key")
            transactional_id = decode_key(record.key)
            if transactional_id is None:
                continue
            if record.value is None:
                into.pop(transactional_id, None)
            else:
                into[transactional_id] = transit_from_value(decode_value(record.value))
            applied += 1
    return applied


# -- transaction markers -------------------------------------------------------------------------


def build_marker_batch(
    producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, now_ms: int
) -> bytes:
    """A control batch holding one COMMIT or ABORT marker for the producer."""
    key = _MARKER_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    return build_batch(
        [(key, value, (), now_ms)],
        compression=CompressionType.NONE,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        is_control=True,
    )


def marker_type(batch: bytes | memoryview) -> int | None:
    """CONTROL_COMMIT or CONTROL_ABORT for a control batch's first record; None if its key is
    not a transaction marker (Kafka has other control types, e.g. KRaft's)."""
    records = decode_records(batch)
    if not records or records[0].key is None or len(records[0].key) != _MARKER_KEY.size:
        return None
    version, kind = _MARKER_KEY.unpack(records[0].key)
    if version != 0 or kind not in (CONTROL_ABORT, CONTROL_COMMIT):
        return None
    return kind
