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

The entry types and the checks of one append (`ProducerStateEntry`, `ProducerAppendInfo`, ...)
live in `producer_entry` and are re-exported here.

Concurrency: event-loop thread only, owned by one `Log`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from odradek.errors import InvalidRecordError, InvalidTxnStateError
from odradek.log.producer_entry import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    INT32_MAX,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NUM_BATCHES_TO_RETAIN,
    AppendOrigin,
    BatchMetadata,
    CompletedTxn,
    EndTransactionMarker,
    ProducerAppendInfo,
    ProducerStateEntry,
    TxnMetadata,
    decrement_sequence,
    increment_sequence,
    last_sequence,
    read_end_txn_marker,
)
from odradek.log.producer_snapshot import (
    CorruptSnapshotError,
    SnapshotEntry,
    list_snapshots,
    read_snapshot,
    write_snapshot,
)
from odradek.protocol.record_batch import BatchHeader

log = logging.getLogger(__name__)

__all__ = [  # the entry types are re-exported: callers import the producer state from here
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "INT32_MAX",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NUM_BATCHES_TO_RETAIN",
    "AppendOrigin",
    "BatchMetadata",
    "CompletedTxn",
    "EndTransactionMarker",
    "ProducerAppendInfo",
    "ProducerStateEntry",
    "ProducerStateManager",
    "TxnMetadata",
    "decrement_sequence",
    "increment_sequence",
    "last_sequence",
    "read_end_txn_marker",
]


# -- the manager ----------------------------------------------------------------------------------


class ProducerStateManager:
    """The producer state of one partition and its snapshot files (module docstring)."""

    def __init__(
        self,
        directory: Path,
        where: str,
        producer_id_expiration_ms: int,
        listing: Mapping[str, os.DirEntry[str]] | None = None,
    ) -> None:
        """`listing`: the directory's entries, when the caller has read them."""
        self._dir = directory
        self.where = where
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.producers: dict[int, ProducerStateEntry] = {}
        self.ongoing_txns: dict[int, TxnMetadata] = {}
        """Open transactions by first offset."""
        self.unreplicated_txns: dict[int, TxnMetadata] = {}
        """Completed transactions whose marker is not yet below the high watermark."""
        self._snapshots: dict[int, Path] = list_snapshots(directory, listing)
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
        if not self.ongoing_txns and not self.unreplicated_txns:
            return None
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
        if not self.unreplicated_txns:  # every read asks for the LSO; nearly always none
            return
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
