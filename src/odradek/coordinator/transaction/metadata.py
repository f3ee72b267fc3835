"""A transactional id's state: Kafka's transaction state machine (TransactionMetadata.scala).

States and the states each may be entered from (valid transitions are data: `VALID_PREVIOUS`):

| state             | id | entered from                          | by                                  |
|-------------------|----|---------------------------------------|-------------------------------------|
| Empty             | 0  | Empty, CompleteCommit, CompleteAbort   | InitProducerId (epoch bump)         |
| Ongoing           | 1  | Ongoing, Empty, CompleteCommit, CompleteAbort | AddPartitionsToTxn / AddOffsetsToTxn |
| PrepareCommit     | 2  | Ongoing                               | EndTxn(commit)                      |
| PrepareAbort      | 3  | Ongoing, PrepareEpochFence            | EndTxn(abort), timeout, fencing     |
| CompleteCommit    | 4  | PrepareCommit                         | every marker written                |
| CompleteAbort     | 5  | PrepareAbort                          | every marker written                |
| Dead              | 6  | Empty, CompleteCommit, CompleteAbort   | transactional.id.expiration.ms      |
| PrepareEpochFence | 7  | Ongoing                               | InitProducerId or a timeout meets an Ongoing transaction (never stored: it becomes PrepareAbort with the bumped epoch) |

A change is made in two steps, as in Kafka: `prepare_*` checks the transition and returns the
target (`TxnTransitMetadata`) while recording it as the *pending* state (a second change is refused
with CONCURRENT_TRANSACTIONS meanwhile); the coordinator appends the target to
`__transaction_state`, and only once that append is committed calls `complete_transition`, which
checks the target once more and installs it. A failed append calls `abort_transition` and leaves
the metadata as it was.

Invalid transitions are bugs, never client errors: they raise `InvariantError`.

Nothing here does I/O. Concurrency: event-loop thread only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from odradek.errors import InvariantError

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767


class TransactionState(enum.IntEnum):
    """Kafka's TransactionState, with its ids (the `TransactionStatus` byte of the log value)."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name Kafka's tools print and ListTransactions filters on ("PrepareCommit")."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def expiration_allowed(self) -> bool:
        return self in (
            TransactionState.EMPTY,
            TransactionState.COMPLETE_COMMIT,
            TransactionState.COMPLETE_ABORT,
        )

    @classmethod
    def from_name(cls, name: str) -> TransactionState | None:
        for state in cls:
            if state.kafka_name == name:
                return state
        return None


S = TransactionState
VALID_PREVIOUS: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}

TopicPartition = tuple[str, int]


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka rotates the producer id once the epoch reaches Short.MaxValue - 1."""
    return epoch >= MAX_EPOCH - 1


@dataclass(frozen=True, slots=True)
class TxnTransitMetadata:
    """The target of a prepared transition: what is written to the log, then installed."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    txn_start_timestamp: int
    txn_last_update_timestamp: int


class EpochFenced(Exception):
    """`prepare_increment_producer_epoch` found the producer's expected epoch stale."""


@dataclass(slots=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    last_producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    txn_timeout_ms: int = 60_000
    state: TransactionState = TransactionState.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    txn_start_timestamp: int = -1
    txn_last_update_timestamp: int = -1
    pending_state: TransactionState | None = None
    has_failed_epoch_fence: bool = False
    """A fence's append failed: the epoch in memory was bumped but never returned, so the next
    fence does not bump it again."""

    # -- queries ----------------------------------------------------------------------------------

    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending_state is not None

    @property
    def has_pending_transaction(self) -> bool:
        return self.state in (S.ONGOING, S.PREPARE_ABORT, S.PREPARE_COMMIT)

    @property
    def epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    # -- preparing transitions ------------------------------------------------------------------

    def _prepare(
        self,
        state: TransactionState,
        producer_id: int,
        epoch: int,
        last_epoch: int,
        timeout_ms: int,
        partitions: frozenset[TopicPartition],
        start_timestamp: int,
        update_timestamp: int,
    ) -> TxnTransitMetadata:
        if self.pending_state is not None:
            raise InvariantError(
                f"{self.transactional_id}: preparing {state.kafka_name} while "
                f"{self.pending_state.kafka_name} is pending"
            )
        if producer_id < 0:
            raise InvariantError(f"{self.transactional_id}: illegal producer id {producer_id}")
        if state is not S.DEAD and epoch < 0:
            raise InvariantError(f"{self.transactional_id}: illegal producer epoch {epoch}")
        if self.state not in VALID_PREVIOUS[state]:
            raise InvariantError(
                f"{self.transactional_id}: {self.state.kafka_name} -> {state.kafka_name} "
                "is not a valid transition"
            )
        self.pending_state = state
        return TxnTransitMetadata(
            producer_id,
            self.producer_id,
            epoch,
            last_epoch,
            timeout_ms,
            state,
            partitions,
            start_timestamp,
            update_timestamp,
        )

    def prepare_fence_producer_epoch(self) -> TxnTransitMetadata:
        """Ongoing -> PrepareEpochFence with the epoch bumped (once: not again after a failed
        fence), to abort the transaction of a producer being replaced or timed out."""
        if self.producer_epoch >= MAX_EPOCH:
            raise InvariantError(f"{self.transactional_id}: cannot fence epoch {MAX_EPOCH}")
        epoch = self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(
            S.PREPARE_EPOCH_FENCE,
            self.producer_id,
            epoch,
            NO_PRODUCER_EPOCH,
            self.txn_timeout_ms,
            frozenset(self.partitions),
            self.txn_start_timestamp,
            self.txn_last_update_timestamp,
        )

    def prepare_increment_producer_epoch(
        self, timeout_ms: int, expected_epoch: int | None, now_ms: int
    ) -> TxnTransitMetadata:
        """-> Empty with the next epoch (InitProducerId). With an expected epoch (KIP-360: a
        producer recovering from an error): bump if it is current, answer the current epoch again
        if it is the previous one (a retried call), otherwise `EpochFenced`."""
        if self.epoch_exhausted:
            raise InvariantError(f"{self.transactional_id}: producer epochs exhausted")
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epoch, last_epoch = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last_epoch = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            raise EpochFenced(
                f"expected epoch {expected_epoch} is neither the current epoch "
                f"{self.producer_epoch} nor the previous one {self.last_producer_epoch}"
            )
        return self._prepare(
            S.EMPTY, self.producer_id, epoch, last_epoch, timeout_ms, frozenset(), -1, now_ms
        )

    def prepare_producer_id_rotation(
        self, producer_id: int, timeout_ms: int, now_ms: int, record_last_epoch: bool
    ) -> TxnTransitMetadata:
        """-> Empty with a new producer id at epoch 0 (the old id's epochs are exhausted)."""
        if self.has_pending_transaction:
            raise InvariantError(f"{self.transactional_id}: rotating the id of a pending txn")
        return self._prepare(
            S.EMPTY,
            producer_id,
            0,
            self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
            timeout_ms,
            frozenset(),
            -1,
            now_ms,
        )

    def prepare_add_partitions(self, added: set[TopicPartition], now_ms: int) -> TxnTransitMetadata:
        start = (
            now_ms
            if self.state in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT)
            else self.txn_start_timestamp
        )
        return self._prepare(
            S.ONGOING,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.txn_timeout_ms,
            frozenset(self.partitions | added),
            start,
            now_ms,
        )

    def prepare_abort_or_commit(self, state: TransactionState, now_ms: int) -> TxnTransitMetadata:
        return self._prepare(
            state,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.txn_timeout_ms,
            frozenset(self.partitions),
            self.txn_start_timestamp,
            now_ms,
        )

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        state = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        self.has_failed_epoch_fence = False
        return self._prepare(
            state,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.txn_timeout_ms,
            frozenset(),
            self.txn_start_timestamp,
            now_ms,
        )

    def prepare_dead(self) -> TxnTransitMetadata:
        return self._prepare(
            S.DEAD,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.txn_timeout_ms,
            frozenset(),
            self.txn_start_timestamp,
            self.txn_last_update_timestamp,
        )

    # -- completing ------------------------------------------------------------------------------

    def abort_transition(self) -> None:
        """The prepared target was not written: forget it."""
        self.pending_state = None

    def complete_transition(self, target: TxnTransitMetadata) -> None:
        """Install `target`, whose record is now committed in the log (Kafka's four checks)."""
        to_state = self.pending_state
        if to_state is None or to_state is not target.state:
            raise InvariantError(
                f"{self.transactional_id}: cannot install {target}: it is not the pending "
                f"transition ({self.pending_state})"
            )
        same_producer = (
            target.producer_epoch == self.producer_epoch and target.producer_id == self.producer_id
        )
        if to_state is S.EMPTY:
            bumped = target.producer_epoch == self.producer_epoch + 1 or (
                target.producer_epoch == 0 and target.producer_id != self.producer_id
            )
            if (
                (target.producer_epoch != self.producer_epoch and not bumped)
                or target.partitions
                or target.txn_start_timestamp != -1
            ):
                self._fail(target, "not an epoch bump to an empty transaction")
            self.txn_timeout_ms = target.txn_timeout_ms
            self.producer_epoch = target.producer_epoch
            self.last_producer_epoch = target.last_producer_epoch
            self.producer_id = target.producer_id
            self.last_producer_id = target.last_producer_id
        elif to_state is S.ONGOING:
            if (
                not same_producer
                or not self.partitions <= target.partitions
                or self.txn_timeout_ms != target.txn_timeout_ms
            ):
                self._fail(target, "partitions may only be added")
            self.txn_start_timestamp = target.txn_start_timestamp
            self.partitions |= target.partitions
        elif to_state in (S.PREPARE_ABORT, S.PREPARE_COMMIT):
            if (
                not same_producer
                or self.partitions != target.partitions
                or self.txn_timeout_ms != target.txn_timeout_ms
                or self.txn_start_timestamp != target.txn_start_timestamp
            ):
                self._fail(target, "the transaction changed while it was ending")
        elif to_state in (S.COMPLETE_ABORT, S.COMPLETE_COMMIT):
            if (
                not same_producer
                or self.txn_timeout_ms != target.txn_timeout_ms
                or target.txn_start_timestamp == -1
            ):
                self._fail(target, "the completed transaction is not this one")
            self.txn_start_timestamp = target.txn_start_timestamp
            self.partitions.clear()
        else:
            # PrepareEpochFence becomes PrepareAbort before anything is written; a Dead
            # metadata is removed from the cache, never installed.
            self._fail(target, f"{to_state.kafka_name} is never installed")
        self.txn_last_update_timestamp = target.txn_last_update_timestamp
        self.pending_state = None
        self.state = to_state

    def _fail(self, target: TxnTransitMetadata, why: str) -> None:
        raise InvariantError(f"{self.transactional_id}: cannot install {target}: {why}")

    @classmethod
    def from_transit(cls, transactional_id: str, target: TxnTransitMetadata) -> TransactionMetadata:
        """The metadata a loaded log record describes (as Kafka's readTxnRecordValue)."""
        return cls(
            transactional_id,
            target.producer_id,
            NO_PRODUCER_ID,
            target.producer_epoch,
            target.last_producer_epoch,
            target.txn_timeout_ms,
            target.state,
            set(target.partitions) if target.state is not S.EMPTY else set(),
            target.txn_start_timestamp,
            target.txn_last_update_timestamp,
        )
