"""What the log cleaner does with producer state and transactions (Kafka's
CleanedTransactionMetadata and the batch retention rules of LogCleaner.cleanInto).

Before a cleaning maps its dirty section, the cleaner thread walks the batch headers of every
segment it may clean, oldest first, with the log's aborted transactions (from the `.txnindex`
files, taken on the event loop with the job) and the last record of each live producer (from the
producer state, likewise), and turns what it sees into per-batch actions for the native passes
(`BatchDecisions`, keyed by batch base offset):

* a transactional data batch of an aborted transaction: DISCARD_RECORDS. The offset map never
  takes its keys (nor those of any control batch), so an aborted record can neither stay visible
  nor make the cleaner drop the committed value of its key;
* a transaction marker (control batch) may go once no batch of its transaction was met before it
  in the walk (an ABORT marker: since the aborted transaction's first offset; a COMMIT marker:
  since the producer's previous marker). The first cleaning that finds it so gives it a delete
  horizon (SET_HORIZON: now + delete.retention.ms, as for tombstones); a cleaning at or after that
  horizon removes it (DISCARD_RECORDS). Until then it stays, so a consumer that read the data
  still meets the marker;
* the last batch of each live producer (the batch holding its last data offset; when it has
  none, its last marker of its current epoch): RETAIN_EMPTY. The batch may lose records like any
  other, but its header stays (an empty batch when every record went: Kafka's behaviour), so its
  sequence numbers and epoch survive, and a retry of that batch after a restart whose producer
  state is rebuilt from the log is still recognised as a duplicate;
* committed transactional and non-transactional records are compacted like any others.

The cleaned segments' `.txnindex` hold the aborted transactions whose ABORT marker stays because
some of their batches were still in the log when the cleaning started (`kept_aborted`), each in
the cleaned segment holding its marker; the next cleaning, finding no batch of it left, drops the
entry and gives the marker its horizon.

Concurrency: `plan_transactions` and `scan_segment` run on a cleaner thread, on the job's
snapshot and descriptors of its own; `last_records_of_active_producers` runs on the event loop.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from odradek.errors import CorruptRecordError, InvalidRecordError
from odradek.log.producer_entry import CONTROL_ABORT, CONTROL_COMMIT, read_end_txn_marker
from odradek.log.producer_state import ProducerStateManager
from odradek.log.transaction_index import AbortedTxn
from odradek.protocol.compaction import (
    DISCARD_RECORDS,
    RETAIN_EMPTY,
    SET_HORIZON,
    BatchDecisions,
    delete_horizon,
)
from odradek.protocol.record_batch import HEADER_SIZE, BatchHeader, read_header

NO_PRODUCER_ID = -1
_SCAN_CHUNK = 256 * 1024
_EMPTY_CONTROL = -1
"""Control type of a control batch without records (a marker emptied by an earlier cleaning)."""
_UNKNOWN_CONTROL = -2


@dataclass(frozen=True, slots=True)
class LastRecord:
    """A live producer's last data offset (None when it has none) and epoch (Kafka's
    LastRecord)."""

    last_data_offset: int | None
    producer_epoch: int


def last_records_of_active_producers(state: ProducerStateManager) -> dict[int, LastRecord]:
    """Event loop: the live producers of a log, as the cleaner needs them."""
    records = {}
    for producer_id, entry in state.producers.items():
        offset = entry.last_data_offset
        records[producer_id] = LastRecord(offset if offset >= 0 else None, entry.producer_epoch)
    return records


class _AbortedInProgress:
    __slots__ = ("observed", "txn")

    def __init__(self, txn: AbortedTxn) -> None:
        self.txn = txn
        self.observed = False


class CleanedTransactionMetadata:
    """Which transactions are open at the point the walk has reached (module docstring)."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._pending = [(t.first_offset, i, t) for i, t in enumerate(sorted(set(aborted)))]
        heapq.heapify(self._pending)
        self._aborted: dict[int, _AbortedInProgress] = {}
        self._committed: set[int] = set()
        self.kept_aborted: list[AbortedTxn] = []

    def _reach(self, offset: int) -> None:
        while self._pending and self._pending[0][0] <= offset:
            _, _, txn = heapq.heappop(self._pending)
            self._aborted.setdefault(txn.producer_id, _AbortedInProgress(txn))

    def on_data_batch(self, header: BatchHeader) -> bool:
        """A data batch: True when it belongs to an aborted transaction (its records go)."""
        self._reach(header.last_offset)
        if not header.is_transactional:
            return False
        aborted = self._aborted.get(header.producer_id)
        if aborted is not None:
            aborted.observed = True
            return True
        self._committed.add(header.producer_id)
        return False

    def on_control_batch(self, header: BatchHeader, control_type: int) -> bool:
        """A control batch: True when its transaction has no batch left (the marker may go)."""
        self._reach(header.last_offset)
        if control_type == _EMPTY_CONTROL:
            return True
        producer_id = header.producer_id
        if control_type == CONTROL_ABORT:
            aborted = self._aborted.pop(producer_id, None)
            if aborted is not None and aborted.observed:
                self.kept_aborted.append(aborted.txn)
                return False
            return True
        if control_type == CONTROL_COMMIT:
            if producer_id in self._committed:
                self._committed.discard(producer_id)
                return False
            return True
        return False


@dataclass(slots=True)
class TransactionPlan:
    """The walk's outcome: per-batch actions and the aborted transactions whose index entries
    stay."""

    decisions: BatchDecisions = field(default_factory=BatchDecisions)
    kept_aborted: list[AbortedTxn] = field(default_factory=list)

    def index_entries(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The kept entries whose marker lies in [start_offset, end_offset)."""
        return [t for t in self.kept_aborted if start_offset <= t.last_offset < end_offset]


def batch_action(
    header: BatchHeader,
    control_type: int | None,
    metadata: CleanedTransactionMetadata,
    active: Mapping[int, LastRecord],
    now_ms: int,
) -> int:
    """The action bits for one batch, in log order (module docstring)."""
    horizon: int | None = None
    if control_type is not None:
        can_discard = metadata.on_control_batch(header, control_type)
        horizon = delete_horizon(header)
        discard_records = can_discard and horizon is not None and horizon <= now_ms
    else:
        can_discard = discard_records = metadata.on_data_batch(header)
    action = 0
    if header.producer_id != NO_PRODUCER_ID:
        last = active.get(header.producer_id)
        if last is not None and (
            header.last_offset == last.last_data_offset
            if last.last_data_offset is not None
            else control_type is not None and header.producer_epoch == last.producer_epoch
        ):
            action |= RETAIN_EMPTY
    if discard_records:
        action |= DISCARD_RECORDS
    if can_discard and control_type is not None and horizon is None:
        action |= SET_HORIZON
    return action


def plan_transactions(
    batches: Iterable[tuple[BatchHeader, int | None]],
    aborted: Iterable[AbortedTxn],
    active: Mapping[int, LastRecord],
    now_ms: int,
) -> TransactionPlan:
    """Walk `batches` (header and control type, None for data batches) in log order."""
    metadata = CleanedTransactionMetadata(aborted)
    plan = TransactionPlan()
    for header, control_type in batches:
        if header.producer_id == NO_PRODUCER_ID and control_type is None:
            continue  # neither idempotent, transactional nor a marker: compaction alone
        action = batch_action(header, control_type, metadata, active, now_ms)
        if action:
            plan.decisions.set(header.base_offset, action)
    plan.kept_aborted = metadata.kept_aborted
    return plan


def control_type_of(batch: bytes | memoryview, header: BatchHeader) -> int:
    """The control record type of a control batch (`batch` from its first byte)."""
    try:
        found = read_end_txn_marker(bytes(batch), header)
    except InvalidRecordError:
        return _UNKNOWN_CONTROL
    return _EMPTY_CONTROL if found is None else found[0].control_type


def scan_segment(
    pread: Callable[[int, int], bytes], size: int, name: str
) -> Iterator[tuple[BatchHeader, int | None]]:
    """The batches of a sealed segment of `size` bytes, read with `pread(length, position)`
    (which returns exactly `length` bytes or raises): each header with its control type (None
    for a data batch). Raises CorruptRecordError on a batch that does not fit."""
    position = 0
    while position < size:
        chunk = pread(min(_SCAN_CHUNK, size - position), position)
        offset = 0
        while len(chunk) - offset >= HEADER_SIZE:
            header = read_header(chunk, offset)
            batch_size = header.size
            if header.batch_length < HEADER_SIZE - 12 or position + offset + batch_size > size:
                raise CorruptRecordError(
                    f"{name} position {position + offset}: a batch of {batch_size} bytes where "
                    f"{size - position - offset} remain"
                )
            control_type = None
            if header.is_control:
                if offset + batch_size <= len(chunk):
                    batch: bytes | memoryview = memoryview(chunk)[offset : offset + batch_size]
                else:
                    batch = pread(batch_size, position + offset)
                control_type = control_type_of(batch, header)
            yield header, control_type
            offset += batch_size
        if offset == 0 and len(chunk) < HEADER_SIZE:
            raise CorruptRecordError(f"{name} position {position}: a torn batch header")
        position += offset
