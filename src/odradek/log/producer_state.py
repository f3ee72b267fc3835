"""Per-partition producer state (Kafka's ProducerStateManager, ProducerStateEntry, ProducerAppendInfo).

For every producer id that wrote to the partition, the state keeps its epoch, the sequence
numbers and offsets of its last 5 batches, the coordinator epoch of its last transaction marker,
the first offset of its open transaction and its last timestamp. The leader checks each
idempotent batch against it before appending (`Log.append_as_leader`); followers and log
recovery apply the same batches without the checks, so that a new leader knows every producer.
Everything is read from the v2 batch header (producer id, epoch, base sequence, last offset
delta, attributes); only a control batch's single marker record is parsed.

The leader's rules for a data batch of producer P with epoch E and sequences [s, s+n] (Kafka 3.9):

| situation                                                              | outcome                          |
|------------------------------------------------------------------------|----------------------------------|
| P's current epoch is E and one of its last 5 batches has exactly [s, s+n] | duplicate: answered with that batch's offsets, nothing appended |
| E is older than P's current epoch                                      | INVALID_PRODUCER_EPOCH           |
| E is newer (KIP-360 epoch bump, or a new producer session): s must be 0 | else OUT_OF_ORDER_SEQUENCE_NUMBER (unless P had no epoch yet) |
| same epoch: s must follow P's last sequence (s = last + 1, or 0 after 2^31-1) | else OUT_OF_ORDER_SEQUENCE_NUMBER |
| P is unknown (never seen, expired, or its data deleted)                | accepted with any sequence       |
| P has an open transaction and the batch is not transactional           | INVALID_TXN_STATE                |

Kafka 3.9 no longer answers UNKNOWN_PRODUCER_ID to Produce (since KIP-360, Kafka 2.5): an
unknown producer is accepted with whatever sequence it sends, because the usual cause is that
retention or DeleteRecords removed its last batches. Followers and recovery (origin REPLICATION)
only log an older epoch and never check sequences.

Transactions: a transactional data batch of a producer with no open transaction opens one at its
first offset (`ongoing_txns`, which gives `first_undecided_offset`); a COMMIT/ABORT control batch
closes it (a `CompletedTxn` that `complete_txn` moves to `unreplicated_txns` until the high
watermark passes the marker). `first_unstable_offset` is the smallest first offset of both: the
last stable offset (LSO) and the aborted transaction index build on these.

Snapshots (`producer_snapshot`): the state is written at each segment roll (named by the new
segment's base offset) and at clean shutdown (at the log end offset), and loaded from the newest
snapshot at or below the log end, replaying batch headers after it (`Log` does the replay). A
producer whose last write is older than `producer.id.expiration.ms` and that has no open
transaction is forgotten by `remove_expired_producers` (and not loaded from snapshots).

Concurrency: event-loop thread only, owned by one `Log`.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from odradek.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from odradek.log.producer_snapshot import (
    CorruptSnapshotError,
    SnapshotEntry,
    list_snapshots,
    read_snapshot,
    write_snapshot,
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


# -- the manager ----------------------------------------------------------------------------------


class ProducerStateManager:
    """The producer state of one partition and its snapshot files (module docstring)."""

    def __init__(self, directory: Path, where: str, producer_id_expiration_ms: int) -> None:
        self._dir = directory
        self.where = where
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.producers: dict[int, ProducerStateEntry] = {}
        self.ongoing_txns: dict[int, TxnMetadata] = {}
        """Open transactions by first offset."""
        self.unreplicated_txns: dict[int, TxnMetadata] = {}
        """Completed transactions whose marker is not yet below the high watermark."""
        self._snapshots: dict[int, Path] = list_snapshots(directory)
        self.map_end_offset = 0
        """The offset up to which the state has seen the log (exclusive)."""
        self._last_snap_offset = 0

    # -- reading ----------------------------------------------------------------------------------

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self.producers.get(producer_id)

    @property
    def is_empty(self) -> bool:
        return not self.producers and not self.unreplicated_txns

    def first_undecided_offset(self) -> int | None:
        return min(self.ongoing_txns) if self.ongoing_txns else None

    def first_unstable_offset(self) -> int | None:
        """The first offset of a transaction still open, or closed by a marker not yet below
        the high watermark; None when there is none (then LSO = HW)."""
        candidates = []
        if self.ongoing_txns:
            candidates.append(min(self.ongoing_txns))
        if self.unreplicated_txns:
            candidates.append(min(self.unreplicated_txns))
        return min(candidates) if candidates else None

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """The LSO once `completed` is complete: the first offset of the next open transaction
        of another producer, or the offset after the marker."""
        for first_offset in sorted(self.ongoing_txns):
            if self.ongoing_txns[first_offset].producer_id != completed.producer_id:
                return first_offset
        return completed.last_offset + 1

    # -- updating ---------------------------------------------------------------------------------

    def prepare_update(self, producer_id: int, origin: AppendOrigin) -> ProducerAppendInfo:
        current = self.producers.get(producer_id) or ProducerStateEntry(producer_id)
        return ProducerAppendInfo(producer_id, current, origin, self.where)

    def update(self, append_info: ProducerAppendInfo) -> None:
        if append_info.producer_id == NO_PRODUCER_ID:
            raise InvalidRecordError(f"{self.where}: producer id -1 in a producer state update")
        updated = append_info.to_entry()
        current = self.producers.get(append_info.producer_id)
        if current is not None:
            current.update(updated)
        else:
            self.producers[append_info.producer_id] = updated
        for txn in append_info.started_transactions:
            self.ongoing_txns[txn.first_offset] = txn

    def complete_txn(self, completed: CompletedTxn) -> None:
        txn = self.ongoing_txns.pop(completed.first_offset, None)
        if txn is None:
            raise InvalidTxnStateError(
                f"{self.where}: transaction {completed} completed but was never started"
            )
        txn.last_offset = completed.last_offset
        self.unreplicated_txns[completed.first_offset] = txn

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        self._remove_unreplicated_transactions(high_watermark)

    def _remove_unreplicated_transactions(self, offset: int) -> None:
        for first_offset in [
            k for k, txn in self.unreplicated_txns.items() if 0 <= txn.last_offset < offset
        ]:
            del self.unreplicated_txns[first_offset]

    def update_map_end_offset(self, offset: int) -> None:
        self.map_end_offset = offset

    def apply_batches(
        self,
        headers: Iterable[BatchHeader],
        origin: AppendOrigin,
        markers: dict[int, tuple[EndTransactionMarker, int] | None] | None = None,
    ) -> tuple[dict[int, ProducerAppendInfo], list[CompletedTxn]]:
        """Check (per `origin`) and collect what appending `headers` does to the state, without
        changing it; `markers` gives each control batch's marker by base offset. Raises the
        first check's error. Apply the result with `commit` once the batches are written."""
        infos: dict[int, ProducerAppendInfo] = {}
        completed: list[CompletedTxn] = []
        for header in headers:
            producer_id = header.producer_id
            if producer_id < 0:
                continue
            info = infos.get(producer_id)
            if info is None:
                info = infos[producer_id] = self.prepare_update(producer_id, origin)
            marker = markers.get(header.base_offset) if markers and header.is_control else None
            done = info.append(header, marker)
            if done is not None:
                completed.append(done)
        return infos, completed

    def commit(
        self, infos: dict[int, ProducerAppendInfo], completed: list[CompletedTxn], end_offset: int
    ) -> None:
        for info in infos.values():
            self.update(info)
        for txn in completed:
            self.complete_txn(txn)
        self.map_end_offset = end_offset

    def remove_expired_producers(self, now_ms: int) -> int:
        """Forget producers idle for producer.id.expiration.ms with no open transaction."""
        expired = [pid for pid, e in self.producers.items() if self._is_expired(now_ms, e)]
        for producer_id in expired:
            del self.producers[producer_id]
        return len(expired)

    def _is_expired(self, now_ms: int, entry: ProducerStateEntry) -> bool:
        return (
            entry.current_txn_first_offset < 0
            and now_ms - entry.last_timestamp >= self.producer_id_expiration_ms
        )

    # -- snapshots --------------------------------------------------------------------------------

    @property
    def snapshot_offsets(self) -> list[int]:
        return sorted(self._snapshots)

    def latest_snapshot_offset(self) -> int | None:
        return max(self._snapshots) if self._snapshots else None

    def take_snapshot(self) -> Path | None:
        """Write the state at `map_end_offset`, unless a snapshot there (or later) exists."""
        if self.map_end_offset <= self._last_snap_offset:
            return None
        offset = self.map_end_offset
        entries = [
            SnapshotEntry(
                pid,
                e.producer_epoch,
                e.last_seq,
                e.last_data_offset,
                e.last_offset_delta,
                e.last_timestamp,
                e.coordinator_epoch,
                e.current_txn_first_offset,
            )
            for pid, e in self.producers.items()
        ]
        path = write_snapshot(self._dir, offset, entries, sync=bool(entries))
        self._snapshots[offset] = path
        self._last_snap_offset = offset
        log.debug(
            "%s: producer snapshot at offset %d, %d producers", self.where, offset, len(entries)
        )
        return path

    def _remove_snapshot(self, offset: int) -> None:
        path = self._snapshots.pop(offset, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def delete_snapshots_before(self, offset: int) -> None:
        for snapshot_offset in [o for o in self._snapshots if o < offset]:
            self._remove_snapshot(snapshot_offset)

    def remove_stray_snapshots(self, segment_base_offsets: Iterable[int]) -> None:
        """Delete snapshots that match no segment, except the newest if it is above every segment
        (the snapshot a clean shutdown wrote at the log end)."""
        bases = set(segment_base_offsets)
        strays = sorted(o for o in self._snapshots if o not in bases)
        if not strays:
            return
        keep = strays[-1] if bases and strays[-1] > max(bases) else None
        for offset in strays:
            if offset != keep:
                self._remove_snapshot(offset)

    def _load_producer_entry(self, entry: ProducerStateEntry) -> None:
        self.producers[entry.producer_id] = entry
        if entry.current_txn_first_offset >= 0:
            self.ongoing_txns[entry.current_txn_first_offset] = TxnMetadata(
                entry.producer_id, entry.current_txn_first_offset
            )

    def _load_from_snapshot(self, log_start_offset: int, now_ms: int) -> None:
        while self._snapshots:
            offset = max(self._snapshots)
            try:
                entries = read_snapshot(self._snapshots[offset])
            except CorruptSnapshotError as e:
                log.warning("%s: %s; trying an older snapshot", self.where, e)
                self._remove_snapshot(offset)
                continue
            for s in entries:
                batches = (
                    [BatchMetadata(s.last_sequence, s.last_offset, s.offset_delta, s.timestamp)]
                    if s.last_offset >= 0
                    else []
                )
                entry = ProducerStateEntry(
                    s.producer_id,
                    s.producer_epoch,
                    s.coordinator_epoch,
                    s.timestamp,
                    s.current_txn_first_offset,
                    batches,
                )
                if not self._is_expired(now_ms, entry):
                    self._load_producer_entry(entry)
            self._last_snap_offset = self.map_end_offset = offset
            return
        self._last_snap_offset = self.map_end_offset = log_start_offset

    def truncate_and_reload(self, log_start_offset: int, log_end_offset: int, now_ms: int) -> None:
        """Drop snapshots outside (log start, log end] and, unless the state is exactly at the
        log end already, reload from the newest remaining snapshot; the caller replays the log
        from `map_end_offset` to `log_end_offset`."""
        for offset in list(self._snapshots):
            if offset > log_end_offset or offset <= log_start_offset:
                self._remove_snapshot(offset)
        if log_end_offset != self.map_end_offset:
            self.producers.clear()
            self.ongoing_txns.clear()
            self.unreplicated_txns.clear()
            self._load_from_snapshot(log_start_offset, now_ms)
        else:
            self.on_log_start_offset_incremented(log_start_offset)

    def on_log_start_offset_incremented(self, log_start_offset: int) -> None:
        self._remove_unreplicated_transactions(log_start_offset)
        if self.map_end_offset < log_start_offset:
            self.map_end_offset = log_start_offset
        latest = self.latest_snapshot_offset()
        self._last_snap_offset = latest if latest is not None else log_start_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.producers.clear()
        self.ongoing_txns.clear()
        self.unreplicated_txns.clear()
        for snapshot_offset in list(self._snapshots):
            self._remove_snapshot(snapshot_offset)
        self._last_snap_offset = 0
        self.map_end_offset = offset
