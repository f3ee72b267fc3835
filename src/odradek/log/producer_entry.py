"""One producer's state on a partition and the changes an append makes to it (Kafka's
ProducerStateEntry, BatchMetadata, ProducerAppendInfo), and the end-transaction marker of a
control batch. The rules they apply are listed in `odradek.log.producer_state`, whose
`ProducerStateManager` holds one entry per producer id.

Pure data and checks: no I/O. Event-loop thread only, like the manager that owns them.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from odradek.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from odradek.protocol.record_batch import HEADER_SIZE, BatchHeader

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NUM_BATCHES_TO_RETAIN = 5
INT32_MAX = 2**31 - 1

CONTROL_ABORT = 0
CONTROL_COMMIT = 1


class AppendOrigin(enum.Enum):
    """Who appends: a client through Produce (full checks), a follower or recovery replaying the
    leader's batches (no sequence checks), or a coordinator (markers, no sequences)."""

    CLIENT = "client"
    REPLICATION = "replication"
    COORDINATOR = "coordinator"


def increment_sequence(sequence: int, increment: int) -> int:
    """`sequence + increment` wrapping from 2^31-1 to 0, as producers number their records."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def decrement_sequence(sequence: int, decrement: int) -> int:
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


def last_sequence(header: BatchHeader) -> int:
    if header.base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return increment_sequence(header.base_sequence, header.last_offset_delta)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One of a producer's last batches: its last sequence and offset, and its size in offsets."""

    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


class ProducerStateEntry:
    """What the partition knows of one producer id."""

    __slots__ = (
        "batches",
        "coordinator_epoch",
        "current_txn_first_offset",
        "last_timestamp",
        "producer_epoch",
        "producer_id",
    )

    def __init__(
        self,
        producer_id: int,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        coordinator_epoch: int = -1,
        last_timestamp: int = -1,
        current_txn_first_offset: int = -1,
        batches: Iterable[BatchMetadata] = (),
    ) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.coordinator_epoch = coordinator_epoch
        self.last_timestamp = last_timestamp
        self.current_txn_first_offset = current_txn_first_offset
        """First offset of the producer's open transaction; -1 when it has none."""
        self.batches: deque[BatchMetadata] = deque(batches, maxlen=NUM_BATCHES_TO_RETAIN)

    def copy(self) -> ProducerStateEntry:
        return ProducerStateEntry(
            self.producer_id,
            self.producer_epoch,
            self.coordinator_epoch,
            self.last_timestamp,
            self.current_txn_first_offset,
            self.batches,
        )

    @property
    def is_empty(self) -> bool:
        return not self.batches

    @property
    def first_seq(self) -> int:
        return self.batches[0].first_seq if self.batches else NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    @property
    def last_offset_delta(self) -> int:
        return self.batches[-1].offset_delta if self.batches else 0

    def maybe_update_producer_epoch(self, producer_epoch: int) -> bool:
        """A new epoch forgets the batches of the old one (their sequences start over)."""
        if self.producer_epoch != producer_epoch:
            self.batches.clear()
            self.producer_epoch = producer_epoch
            return True
        return False

    def add_batch(
        self,
        producer_epoch: int,
        last_seq: int,
        last_offset: int,
        offset_delta: int,
        timestamp: int,
    ) -> None:
        self.maybe_update_producer_epoch(producer_epoch)
        self.batches.append(BatchMetadata(last_seq, last_offset, offset_delta, timestamp))
        self.last_timestamp = timestamp

    def update(self, next_entry: ProducerStateEntry) -> None:
        """Take over what an append (`ProducerAppendInfo`) made of this entry."""
        self.maybe_update_producer_epoch(next_entry.producer_epoch)
        self.batches.extend(next_entry.batches)
        self.coordinator_epoch = next_entry.coordinator_epoch
        self.current_txn_first_offset = next_entry.current_txn_first_offset
        self.last_timestamp = next_entry.last_timestamp

    def find_duplicate_batch(
        self, producer_epoch: int, first_seq: int, last_seq: int
    ) -> BatchMetadata | None:
        if producer_epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.last_seq == last_seq and batch.first_seq == first_seq:
                return batch
        return None

    def __repr__(self) -> str:
        return (
            f"ProducerStateEntry(producer_id={self.producer_id}, epoch={self.producer_epoch}, "
            f"coordinator_epoch={self.coordinator_epoch}, txn_first_offset="
            f"{self.current_txn_first_offset}, last_timestamp={self.last_timestamp}, "
            f"batches={list(self.batches)})"
        )


@dataclass(slots=True)
class TxnMetadata:
    """A transaction seen on this partition: its producer, first offset, and (once its marker
    is written) the marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int = -1


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction closed by a marker at `last_offset` (`is_aborted`: an ABORT marker)."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


@dataclass(frozen=True, slots=True)
class EndTransactionMarker:
    """The record of a control batch: COMMIT (1) or ABORT (0), and the coordinator's epoch."""

    control_type: int
    coordinator_epoch: int


class ProducerAppendInfo:
    """The changes one append makes to one producer's state, checked as they are collected and
    applied to the manager (`ProducerStateManager.update`) only once the append has been written."""

    __slots__ = ("_current", "_updated", "_where", "origin", "producer_id", "started_transactions")

    def __init__(
        self, producer_id: int, current: ProducerStateEntry, origin: AppendOrigin, where: str
    ) -> None:
        self.producer_id = producer_id
        self.origin = origin
        self._current = current
        self._updated = ProducerStateEntry(
            producer_id,
            current.producer_epoch,
            current.coordinator_epoch,
            current.last_timestamp,
            current.current_txn_first_offset,
        )
        self.started_transactions: list[TxnMetadata] = []
        self._where = where

    def to_entry(self) -> ProducerStateEntry:
        return self._updated

    def _check_producer_epoch(self, producer_epoch: int, offset: int) -> None:
        if producer_epoch < self._updated.producer_epoch:
            message = (
                f"epoch of producer {self.producer_id} at offset {offset} in {self._where} is "
                f"{producer_epoch}, older than the last seen epoch {self._updated.producer_epoch}"
            )
            if self.origin is AppendOrigin.REPLICATION:
                log.warning("%s", message)
            else:
                raise InvalidProducerEpochError(message)

    def _check_sequence(self, producer_epoch: int, first_seq: int, offset: int) -> None:
        updated, current = self._updated, self._current
        if producer_epoch != updated.producer_epoch:
            if first_seq != 0 and updated.producer_epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"invalid sequence number for new epoch of producer {self.producer_id} at "
                    f"offset {offset} in {self._where}: {producer_epoch} (request epoch), "
                    f"{first_seq} (seq. number), {updated.producer_epoch} (current epoch)"
                )
            return
        if not updated.is_empty:
            current_last_seq = updated.last_seq
        elif producer_epoch == current.producer_epoch:
            current_last_seq = current.last_seq
        else:
            current_last_seq = NO_SEQUENCE
        # No current epoch: the producer's data is gone (retention, DeleteRecords): any sequence.
        if current.producer_epoch == NO_PRODUCER_EPOCH:
            return
        if not (
            first_seq == current_last_seq + 1 or (first_seq == 0 and current_last_seq == INT32_MAX)
        ):
            raise OutOfOrderSequenceError(
                f"out of order sequence number for producer {self.producer_id} at offset "
                f"{offset} in {self._where}: {first_seq} (incoming seq. number), "
                f"{current_last_seq} (current end sequence number)"
            )

    def append_data_batch(
        self,
        producer_epoch: int,
        first_seq: int,
        last_seq: int,
        last_timestamp: int,
        first_offset: int,
        last_offset: int,
        is_transactional: bool,
    ) -> None:
        self._check_producer_epoch(producer_epoch, first_offset)
        if self.origin is AppendOrigin.CLIENT:
            self._check_sequence(producer_epoch, first_seq, first_offset)
        updated = self._updated
        updated.add_batch(
            producer_epoch, last_seq, last_offset, last_offset - first_offset, last_timestamp
        )
        if updated.current_txn_first_offset >= 0 and not is_transactional:
            raise InvalidTxnStateError(
                f"expected a transactional write from producer {self.producer_id} at offset "
                f"{first_offset} in {self._where}"
            )
        if updated.current_txn_first_offset < 0 and is_transactional:
            updated.current_txn_first_offset = first_offset
            self.started_transactions.append(TxnMetadata(self.producer_id, first_offset))

    def append_end_txn_marker(
        self, marker: EndTransactionMarker, producer_epoch: int, offset: int, timestamp: int
    ) -> CompletedTxn | None:
        self._check_producer_epoch(producer_epoch, offset)
        updated = self._updated
        if updated.coordinator_epoch > marker.coordinator_epoch:
            message = (
                f"invalid coordinator epoch for producer {self.producer_id} at offset {offset} "
                f"in {self._where}: {marker.coordinator_epoch} (zombie), "
                f"{updated.coordinator_epoch} (current)"
            )
            if self.origin is AppendOrigin.REPLICATION:
                log.info("%s", message)
            else:
                raise TransactionCoordinatorFencedError(message)
        completed = None
        if updated.current_txn_first_offset >= 0:
            completed = CompletedTxn(
                self.producer_id,
                updated.current_txn_first_offset,
                offset,
                marker.control_type == CONTROL_ABORT,
            )
        updated.maybe_update_producer_epoch(producer_epoch)
        updated.coordinator_epoch = marker.coordinator_epoch
        updated.current_txn_first_offset = -1
        updated.last_timestamp = timestamp
        return completed

    def append(
        self, header: BatchHeader, marker: tuple[EndTransactionMarker, int] | None = None
    ) -> CompletedTxn | None:
        """Apply one batch (with its decoded marker and timestamp when it is a control batch)."""
        if header.is_control:
            if marker is None:
                return None  # an empty control batch: its transaction was cleaned away
            end_marker, timestamp = marker
            return self.append_end_txn_marker(
                end_marker, header.producer_epoch, header.base_offset, timestamp
            )
        self.append_data_batch(
            header.producer_epoch,
            header.base_sequence,
            last_sequence(header),
            header.max_timestamp,
            header.base_offset,
            header.base_offset + header.last_offset_delta,
            header.is_transactional,
        )
        return None


# -- control records ------------------------------------------------------------------------------


def _varint(buf: bytes, position: int) -> tuple[int, int]:
    """A zig-zag varint (Kafka's records use them) at `position`: (value, next position)."""
    shift = raw = 0
    while True:
        if position >= len(buf) or shift > 63:
            raise InvalidRecordError("control record: truncated varint")
        byte = buf[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7


def read_end_txn_marker(
    batch: bytes, header: BatchHeader
) -> tuple[EndTransactionMarker, int] | None:
    """The marker and timestamp of the control batch `batch` (the whole batch, from its first
    byte), or None when it holds no record. Control batches are never compressed."""
    if header.records_count < 1:
        return None
    try:
        position = HEADER_SIZE
        _length, position = _varint(batch, position)
        position += 1  # attributes
        timestamp_delta, position = _varint(batch, position)
        _offset_delta, position = _varint(batch, position)
        key_length, position = _varint(batch, position)
        if key_length < 4:
            raise InvalidRecordError(f"control record key of {key_length} bytes")
        control_type = int.from_bytes(batch[position + 2 : position + 4], "big", signed=True)
        position += key_length
        value_length, position = _varint(batch, position)
        if value_length < 6 or position + 6 > len(batch):
            raise InvalidRecordError(f"end transaction marker value of {value_length} bytes")
        coordinator_epoch = int.from_bytes(batch[position + 2 : position + 6], "big", signed=True)
    except IndexError:
        raise InvalidRecordError("truncated control record") from None
    if control_type not in (CONTROL_ABORT, CONTROL_COMMIT):
        raise InvalidRecordError(f"control record of unknown type {control_type}")
    return (
        EndTransactionMarker(control_type, coordinator_epoch),
        header.base_timestamp + timestamp_delta,
    )
