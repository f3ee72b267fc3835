"""The transaction coordinator: the API-facing layer of Kafka's TransactionCoordinator.

It validates a request, finds the transactional id's metadata (`state_manager`), prepares the
transition (`metadata`), has it written to `__transaction_state` and answers. The flows:

* **InitProducerId** with a transactional id. A new id gets a producer id (`ProducerIdGenerator`,
  ZooKeeper blocks) and epoch 0. A known id in Empty/CompleteCommit/CompleteAbort gets its epoch
  bumped (which fences every older producer of the id: their writes and EndTxn now fail with
  PRODUCER_FENCED / INVALID_PRODUCER_EPOCH), or a new producer id once the epoch is exhausted.
  KIP-360: a request carrying its current producer id and epoch recovers that producer (bump), a
  retry of a bump that succeeded gets the same epoch again, a stale one PRODUCER_FENCED. An id with
  an Ongoing transaction has that transaction aborted under a bumped epoch (PrepareEpochFence ->
  PrepareAbort) and is answered CONCURRENT_TRANSACTIONS; the client retries and gets the epoch
  after that. Prepare* states answer CONCURRENT_TRANSACTIONS.
* **AddPartitionsToTxn / AddOffsetsToTxn** (the latter adds the group's `__consumer_offsets`
  partition): checks producer id and epoch, moves to Ongoing with the partitions added.
* **EndTxn**: Ongoing -> PrepareCommit/PrepareAbort, written; the client is answered as soon as
  that is written; then the marker sender writes the markers and CompleteCommit/CompleteAbort is
  written. A retried EndTxn of a completed transaction is answered NONE; one that meets the
  transaction still ending is CONCURRENT_TRANSACTIONS; the wrong result is INVALID_TXN_STATE.
* **Timeouts** (every `transaction.abort.timed.out.transaction.cleanup.interval.ms`): an Ongoing
  transaction older than its timeout is aborted under a bumped epoch (the producer is fenced, as
  in Kafka).
* **Expiry** (every `transaction.remove.expired.transaction.cleanup.interval.ms`): idle ids are
  tombstoned (`state_manager.expire_transactional_ids`).

Concurrency: event-loop thread only; every decision is made before the first await of a flow,
and a transition in flight (pending state) makes concurrent requests CONCURRENT_TRANSACTIONS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from kio.schema.errors import ErrorCode

from odradek.coordinator.transaction.marker_channel import (
    PendingMarkers,
    TransactionMarkerChannelManager,
)
from odradek.coordinator.transaction.metadata import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    EpochFenced,
    TopicPartition,
    TransactionMetadata,
    TransactionState,
    TxnTransitMetadata,
    is_epoch_exhausted,
)
from odradek.coordinator.transaction.state_manager import (
    TransactionConfig,
    TransactionStateManager,
)
from odradek.errors import InvariantError

log = logging.getLogger(__name__)

S = TransactionState
COMPLETE_RETRY_S = 0.5


class ProducerIdGenerator(Protocol):
    async def generate_producer_id(self) -> int: ...


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


class TransactionCoordinator:
    def __init__(
        self,
        broker_id: int,
        state_manager: TransactionStateManager,
        markers: TransactionMarkerChannelManager,
        producer_ids: ProducerIdGenerator,
    ) -> None:
        self.broker_id = broker_id
        self.manager = state_manager
        self.markers = markers
        self.producer_ids = producer_ids
        self._tasks: list[asyncio.Task[None]] = []
        self.active = False
        state_manager.on_loaded = self._on_partition_loaded

    @property
    def config(self) -> TransactionConfig:
        return self.manager.config

    # -- life cycle --------------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._abort_timed_out_loop()))
        self._tasks.append(loop.create_task(self._expire_loop()))
        self.active = True

    async def shutdown(self) -> None:
        self.active = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.markers.shutdown()
        await self.manager.shutdown()

    def on_elected(self, partition: int, epoch: int) -> None:
        """We lead `__transaction_state` partition `partition` at leader epoch `epoch`
        (LeaderAndIsr). Called on the event loop by `server.transaction_topic`.

        1. A newer epoch than ours (or a partition we did not own) is an election, as Kafka's
           onElection: drop the markers still under way for the partition, then reload it; the
           load sends again the markers of every transaction it finds in Prepare*.
        2. The same epoch again is no election but a restatement: a leader fenced when its
           ZooKeeper session expired is told its unchanged role by the next controller. Nothing
           is reloaded, so the marker tasks under way must go on: cancelling them left each such
           transaction in PrepareCommit/PrepareAbort for ever (its producer answered
           CONCURRENT_TRANSACTIONS, the partitions still without its marker holding their LSO).
        """
        current = self.manager.coordinator_epoch(partition)
        if current is not None and current >= epoch:
            return
        self.markers.remove_markers_for_partition(partition)
        self.manager.on_elected(partition, epoch)

    def on_resigned(self, partition: int) -> None:
        self.manager.on_resigned(partition)
        self.markers.remove_markers_for_partition(partition)

    def _on_partition_loaded(
        self, partition: int, coordinator_epoch: int, stuck: list[TransactionMetadata]
    ) -> None:
        """Transactions found in PrepareCommit/PrepareAbort: write their markers again."""
        for metadata in stuck:
            target = metadata.prepare_complete(self.manager.now_ms())
            self._send_markers(partition, coordinator_epoch, metadata, target)

    # -- InitProducerId ----------------------------------------------------------------------------

    async def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected: tuple[int, int] | None = None,
    ) -> InitProducerIdResult:
        """The transactional path of InitProducerId (module docstring); `expected` is the
        request's (producer id, epoch) when it carries one (KIP-360)."""
        if not transactional_id:
            return InitProducerIdResult(ErrorCode.invalid_request)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return InitProducerIdResult(ErrorCode.invalid_transaction_timeout)
        error, found = self.manager.get_state(transactional_id)
        if error is not ErrorCode.none:
            return InitProducerIdResult(error)
        if found is None:
            try:
                producer_id = await self.producer_ids.generate_producer_id()
            except Exception as e:
                log.warning("no producer id for %s: %s", transactional_id, e)
                code = getattr(e, "code", None)
                return InitProducerIdResult(
                    ErrorCode(code) if code is not None else ErrorCode.coordinator_not_available
                )
            created = TransactionMetadata(
                transactional_id,
                producer_id,
                txn_timeout_ms=timeout_ms,
                txn_last_update_timestamp=self.manager.now_ms(),
            )
            error, found = self.manager.put_if_not_exists(created)
            if found is None:
                return InitProducerIdResult(error)
        metadata = found.metadata
        coordinator_epoch = found.coordinator_epoch

        if metadata.pending_transition_in_progress:
            return InitProducerIdResult(ErrorCode.concurrent_transactions)
        if expected is not None and not (
            metadata.producer_epoch == NO_PRODUCER_EPOCH
            or expected[0] == metadata.producer_id
            or (expected[0] == metadata.last_producer_id and is_epoch_exhausted(expected[1]))
        ):
            return InitProducerIdResult(ErrorCode.producer_fenced)
        state = metadata.state
        if state in (S.PREPARE_ABORT, S.PREPARE_COMMIT):
            return InitProducerIdResult(ErrorCode.concurrent_transactions)
        if state is S.ONGOING:
            fence = metadata.prepare_fence_producer_epoch()
            error = await self._end_transaction(
                transactional_id, fence.producer_id, fence.producer_epoch, False, from_client=False
            )
            return InitProducerIdResult(
                error if error is not ErrorCode.none else ErrorCode.concurrent_transactions
            )
        if state not in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT):
            raise InvariantError(f"{transactional_id} in {state.kafka_name}")
        now = self.manager.now_ms()
        if metadata.epoch_exhausted and (
            expected is None or expected[1] == metadata.producer_epoch
        ):
            try:
                producer_id = await self.producer_ids.generate_producer_id()
            except Exception as e:
                log.warning("no producer id for %s: %s", transactional_id, e)
                return InitProducerIdResult(ErrorCode.coordinator_not_available)
            if metadata.pending_transition_in_progress:
                return InitProducerIdResult(ErrorCode.concurrent_transactions)
            target = metadata.prepare_producer_id_rotation(
                producer_id, timeout_ms, now, expected is not None
            )
        else:
            try:
                target = metadata.prepare_increment_producer_epoch(
                    timeout_ms, None if expected is None else expected[1], now
                )
            except EpochFenced as e:
                log.info("InitProducerId of %s fenced: %s", transactional_id, e)
                return InitProducerIdResult(ErrorCode.producer_fenced)
        error = await self.manager.append_transition(transactional_id, coordinator_epoch, target)
        if error is not ErrorCode.none:
            return InitProducerIdResult(error)
        log.info(
            "initialized transactional id %s with producer id %d epoch %d",
            transactional_id,
            target.producer_id,
            target.producer_epoch,
        )
        return InitProducerIdResult(ErrorCode.none, target.producer_id, target.producer_epoch)

    # -- AddPartitionsToTxn, AddOffsetsToTxn -------------------------------------------------------

    def _check_producer(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> tuple[ErrorCode, TransactionMetadata | None, int]:
        if not transactional_id:
            return ErrorCode.invalid_request, None, -1
        error, found = self.manager.get_state(transactional_id)
        if error is not ErrorCode.none:
            return error, None, -1
        if found is None or found.metadata.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping, None, -1
        if found.metadata.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced, None, -1
        return ErrorCode.none, found.metadata, found.coordinator_epoch

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> ErrorCode:
        added = set(partitions)
        error, metadata, coordinator_epoch = self._check_producer(
            transactional_id, producer_id, producer_epoch
        )
        if metadata is None:
            return error
        if metadata.pending_transition_in_progress or metadata.state in (
            S.PREPARE_COMMIT,
            S.PREPARE_ABORT,
        ):
            return ErrorCode.concurrent_transactions
        if metadata.state is S.ONGOING and added <= metadata.partitions:
            return ErrorCode.none
        target = metadata.prepare_add_partitions(added, self.manager.now_ms())
        return await self.manager.append_transition(transactional_id, coordinator_epoch, target)

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn v4 `verify_only`: whether each partition is in the transaction."""
        wanted = list(partitions)
        error, metadata, _ = self._check_producer(transactional_id, producer_id, producer_epoch)
        if metadata is not None and metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            error = ErrorCode.concurrent_transactions
        if metadata is None or error is not ErrorCode.none:
            return {tp: error for tp in wanted}
        return {
            tp: ErrorCode.none if tp in metadata.partitions else ErrorCode.transaction_abortable
            for tp in wanted
        }

    # -- EndTxn --------------------------------------------------------------------------------------

    async def end_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> ErrorCode:
        return await self._end_transaction(
            transactional_id, producer_id, producer_epoch, commit, from_client=True
        )

    async def _end_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        from_client: bool,
    ) -> ErrorCode:
        if not transactional_id:
            return ErrorCode.invalid_request
        error, found = self.manager.get_state(transactional_id)
        if error is not ErrorCode.none:
            return error
        if found is None or found.metadata.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        metadata, coordinator_epoch = found.metadata, found.coordinator_epoch
        if (from_client and producer_epoch != metadata.producer_epoch) or (
            producer_epoch < metadata.producer_epoch
        ):
            return ErrorCode.producer_fenced
        fencing = metadata.pending_state is S.PREPARE_EPOCH_FENCE
        if metadata.pending_transition_in_progress and not fencing:
            return ErrorCode.concurrent_transactions
        state = metadata.state
        if state is S.ONGOING:
            next_state = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
            if fencing:
                if next_state is not S.PREPARE_ABORT:
                    raise InvariantError("an epoch fence always aborts")
                # The fence's bumped epoch is the one the abort (and its markers) carry.
                metadata.pending_state = None
                metadata.producer_epoch = producer_epoch
                metadata.last_producer_epoch = NO_PRODUCER_EPOCH
            target = metadata.prepare_abort_or_commit(next_state, self.manager.now_ms())
        elif state is S.COMPLETE_COMMIT:
            return ErrorCode.none if commit else ErrorCode.invalid_txn_state
        elif state is S.COMPLETE_ABORT:
            return ErrorCode.invalid_txn_state if commit else ErrorCode.none
        elif state is S.PREPARE_COMMIT:
            return ErrorCode.concurrent_transactions if commit else ErrorCode.invalid_txn_state
        elif state is S.PREPARE_ABORT:
            return ErrorCode.invalid_txn_state if commit else ErrorCode.concurrent_transactions
        else:
            return ErrorCode.invalid_txn_state
        error = await self.manager.append_transition(transactional_id, coordinator_epoch, target)
        if error is not ErrorCode.none:
            if fencing:
                metadata.has_failed_epoch_fence = True
            return error
        error, found = self.manager.get_state(transactional_id)
        if found is None or found.coordinator_epoch != coordinator_epoch:
            return ErrorCode.not_coordinator
        metadata = found.metadata
        if metadata.pending_transition_in_progress:
            return ErrorCode.concurrent_transactions
        if metadata.state is not target.state:
            return ErrorCode.invalid_txn_state
        complete = metadata.prepare_complete(self.manager.now_ms())
        self._send_markers(
            self.manager.partition_of(transactional_id), coordinator_epoch, metadata, complete
        )
        return ErrorCode.none

    def _send_markers(
        self,
        txn_partition: int,
        coordinator_epoch: int,
        metadata: TransactionMetadata,
        complete: TxnTransitMetadata,
    ) -> None:
        commit = complete.state is S.COMPLETE_COMMIT

        async def write_complete(pending: PendingMarkers) -> None:
            await self._write_complete(pending, metadata, complete)

        self.markers.add_markers_to_send(
            txn_partition, coordinator_epoch, commit, metadata, write_complete
        )

    async def _write_complete(
        self, pending: PendingMarkers, metadata: TransactionMetadata, target: TxnTransitMetadata
    ) -> None:
        """Every marker is written: record the transaction complete (retrying while the log is
        unavailable; giving up if the partition moved, the next coordinator redoes it)."""
        transactional_id = pending.transactional_id
        while True:
            error = await self.manager.append_transition(
                transactional_id, pending.coordinator_epoch, target
            )
            if error is ErrorCode.none:
                log.info(
                    "completed transaction of %s (%s)",
                    transactional_id,
                    "commit" if pending.commit else "abort",
                )
                return
            _, found = self.manager.get_state(transactional_id)
            if (
                found is None
                or found.coordinator_epoch != pending.coordinator_epoch
                or found.metadata is not metadata
            ):
                return
            log.info("recording %s complete failed (%s); retrying", transactional_id, error.name)
            await asyncio.sleep(COMPLETE_RETRY_S)
            if metadata.pending_state is None:
                metadata.pending_state = target.state

    # -- timeouts and expiry -----------------------------------------------------------------------

    async def abort_timed_out_transactions(self) -> int:
        aborted = 0
        for metadata in self.manager.timed_out_transactions(self.manager.now_ms()):
            if metadata.pending_transition_in_progress or metadata.state is not S.ONGOING:
                continue
            fence = metadata.prepare_fence_producer_epoch()
            error = await self._end_transaction(
                metadata.transactional_id,
                fence.producer_id,
                fence.producer_epoch,
                False,
                from_client=False,
            )
            if error is ErrorCode.none:
                aborted += 1
                log.info(
                    "aborted the timed-out transaction of %s (producer id %d, epoch now %d)",
                    metadata.transactional_id,
                    fence.producer_id,
                    fence.producer_epoch,
                )
            else:
                log.info(
                    "aborting %s's timed-out transaction: %s", metadata.transactional_id, error.name
                )
                if metadata.pending_state is S.PREPARE_EPOCH_FENCE:
                    metadata.abort_transition()
        return aborted

    async def _abort_timed_out_loop(self) -> None:
        interval = self.config.abort_timed_out_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.abort_timed_out_transactions()
            except Exception:
                log.exception("aborting timed-out transactions failed")

    async def _expire_loop(self) -> None:
        interval = self.config.remove_expired_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.manager.expire_transactional_ids()
            except Exception:
                log.exception("expiring transactional ids failed")

    # -- operator views ----------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> tuple[ErrorCode, TransactionMetadata | None]:
        if not transactional_id:
            return ErrorCode.invalid_request, None
        error, found = self.manager.get_state(transactional_id)
        if error is not ErrorCode.none:
            return error, None
        if found is None or found.metadata.state is S.DEAD:
            return ErrorCode.transactional_id_not_found, None
        return ErrorCode.none, found.metadata

    def list_transactions(
        self, producer_ids: set[int], states: set[str], min_duration_ms: int = -1
    ) -> tuple[ErrorCode, list[TransactionMetadata]]:
        if self.manager.any_loading():
            return ErrorCode.coordinator_load_in_progress, []
        now = self.manager.now_ms()
        listed = []
        for metadata in self.manager.all_transactions():
            if metadata.state is S.DEAD:
                continue
            if producer_ids and metadata.producer_id not in producer_ids:
                continue
            if states and metadata.state.kafka_name not in states:
                continue
            if min_duration_ms >= 0 and (
                metadata.state is not S.ONGOING
                or now - metadata.txn_start_timestamp < min_duration_ms
            ):
                continue
            listed.append(metadata)
        return ErrorCode.none, listed
