"""The transaction state manager: the transactional ids of the `__transaction_state` partitions
this broker leads, in memory, and their records in those partitions (Kafka's
TransactionStateManager).

Ownership. A transactional id lives in partition `placement.partition_for(id)` of
`__transaction_state` (Java's `String.hashCode`, as for groups); this broker coordinates it only
while it leads that partition:

* `on_elected(partition, epoch)`: the partition is *loading* (requests get
  COORDINATOR_LOAD_IN_PROGRESS) while a task replays it from its log start to its log end offset
  (`log_records.replay`: the last record of each id wins, a tombstone deletes); the ids are then
  installed with the leader epoch as their *coordinator epoch*, and `on_loaded` is told of every
  transaction caught between PrepareCommit/PrepareAbort and its completion, so that its markers
  are written again;
* `on_resigned(partition)`: the load is cancelled, the partition's ids are dropped and requests get
  NOT_COORDINATOR.

Writes (`append_transition`). A prepared transition (`metadata`) is one uncompressed record
appended with acks=all and `transaction.state.log` timeouts; only once it is committed, and only
if the partition is still ours at the same coordinator epoch, is the transition installed. Errors
map to what Kafka answers: UNKNOWN_TOPIC_OR_PARTITION, NOT_ENOUGH_REPLICAS(_AFTER_APPEND) and
REQUEST_TIMED_OUT become COORDINATOR_NOT_AVAILABLE (the client retries), NOT_LEADER_OR_FOLLOWER and
KAFKA_STORAGE_ERROR become NOT_COORDINATOR (it looks the coordinator up again), anything else
UNKNOWN_SERVER_ERROR; a partition that moved away meanwhile is NOT_COORDINATOR.

Expiry (`expire_transactional_ids`): an id whose last update is older than
`transactional.id.expiration.ms` and whose state allows it (Empty, CompleteCommit, CompleteAbort)
is tombstoned and forgotten, as Kafka's removeExpiredTransactionalIds.

Concurrency: event-loop thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.placement import partition_for
from odradek.coordinator.transaction import log_records
from odradek.coordinator.transaction.metadata import (
    TransactionMetadata,
    TransactionState,
    TxnTransitMetadata,
)
from odradek.protocol.record_batch import iter_batches

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: ErrorCode
    base_offset: int = -1


class TransactionLog(Protocol):
    """`__transaction_state`'s partitions as this broker hosts them (the replica manager)."""

    def append(
        self, partition: int, records: bytes, required_acks: int, timeout_ms: int
    ) -> AppendResult | Awaitable[AppendResult]: ...

    def read(self, partition: int, offset: int, max_bytes: int) -> bytes: ...

    def log_start_offset(self, partition: int) -> int: ...

    def log_end_offset(self, partition: int) -> int: ...


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    """The broker's `transaction.*` settings (Kafka's defaults)."""

    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    max_timeout_ms: int = 900_000
    num_partitions: int = 50
    replication_factor: int = 3
    min_insync_replicas: int = 2
    segment_bytes: int = 100 * 1024 * 1024
    load_buffer_size: int = 5 * 1024 * 1024
    abort_timed_out_interval_ms: int = 10_000
    remove_expired_interval_ms: int = 3_600_000
    request_timeout_ms: int = 30_000

    @classmethod
    def from_broker_config(cls, config: Any) -> TransactionConfig:
        return cls(
            transactional_id_expiration_ms=config["transactional.id.expiration.ms"],
            max_timeout_ms=config["transaction.max.timeout.ms"],
            num_partitions=config["transaction.state.log.num.partitions"],
            replication_factor=config["transaction.state.log.replication.factor"],
            min_insync_replicas=config["transaction.state.log.min.isr"],
            segment_bytes=config["transaction.state.log.segment.bytes"],
            load_buffer_size=config["transaction.state.log.load.buffer.size"],
            abort_timed_out_interval_ms=config[
                "transaction.abort.timed.out.transaction.cleanup.interval.ms"
            ],
            remove_expired_interval_ms=config[
                "transaction.remove.expired.transaction.cleanup.interval.ms"
            ],
            request_timeout_ms=config["request.timeout.ms"],
        )


@dataclass(slots=True)
class _Ownership:
    epoch: int
    load: asyncio.Task[None] | None = None
    transactions: dict[str, TransactionMetadata] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CoordinatorEpochAndMetadata:
    coordinator_epoch: int
    metadata: TransactionMetadata


_APPEND_ERRORS = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
}


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class TransactionStateManager:
    def __init__(
        self,
        config: TransactionConfig,
        transaction_log: TransactionLog,
        partition_count: Callable[[], int | None],
        now_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self.config = config
        self.log = transaction_log
        self._partition_count = partition_count
        self.now_ms = now_ms
        self._owned: dict[int, _Ownership] = {}
        self.on_loaded: Callable[[int, int, list[TransactionMetadata]], None] = lambda *_: None
        """Called with (partition, coordinator epoch, transactions stuck in Prepare*)."""

    # -- ownership ---------------------------------------------------------------------------------

    @property
    def partitions(self) -> int:
        count = self._partition_count()
        return count if count else self.config.num_partitions

    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.partitions)

    def owned_partitions(self) -> dict[int, bool]:
        """Partition -> whether it is loaded (False while loading)."""
        return {p: owned.load is None for p, owned in self._owned.items()}

    def coordinator_epoch(self, partition: int) -> int | None:
        """The epoch at which we own `partition` (loaded or loading), None if we do not."""
        owned = self._owned.get(partition)
        return None if owned is None else owned.epoch

    def on_elected(self, partition: int, epoch: int) -> None:
        owned = self._owned.get(partition)
        if owned is not None and owned.epoch >= epoch:
            return
        if owned is not None and owned.load is not None:
            owned.load.cancel()
        owned = self._owned[partition] = _Ownership(epoch)
        owned.load = asyncio.get_running_loop().create_task(self._load(partition, owned))
        log.info("loading transaction state partition %d (coordinator epoch %d)", partition, epoch)

    def on_resigned(self, partition: int) -> None:
        owned = self._owned.pop(partition, None)
        if owned is None:
            return
        if owned.load is not None:
            owned.load.cancel()
        for metadata in owned.transactions.values():
            metadata.abort_transition()
        log.info(
            "unloaded transaction state partition %d: %d transactional ids",
            partition,
            len(owned.transactions),
        )

    async def shutdown(self) -> None:
        tasks = [o.load for o in self._owned.values() if o.load is not None]
        for partition in list(self._owned):
            self.on_resigned(partition)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _load(self, partition: int, owned: _Ownership) -> None:
        started = time.monotonic()
        while True:
            try:
                loaded = await self._replay(partition)
                break
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("loading transaction state partition %d failed; retrying", partition)
                await asyncio.sleep(1.0)
                if self._owned.get(partition) is not owned:
                    return
        if self._owned.get(partition) is not owned:
            return
        stuck = []
        for transactional_id, target in loaded.items():
            metadata = TransactionMetadata.from_transit(transactional_id, target)
            owned.transactions[transactional_id] = metadata
            if metadata.state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
                stuck.append(metadata)
        owned.load = None
        log.info(
            "loaded transaction state partition %d in %.3f s: %d transactional ids, "
            "%d transactions to complete",
            partition,
            time.monotonic() - started,
            len(owned.transactions),
            len(stuck),
        )
        if stuck:
            self.on_loaded(partition, owned.epoch, stuck)

    async def _replay(self, partition: int) -> dict[str, TxnTransitMetadata]:
        loaded: dict[str, TxnTransitMetadata] = {}
        offset = self.log.log_start_offset(partition)
        end = self.log.log_end_offset(partition)
        while offset < end:
            data = self.log.read(partition, offset, self.config.load_buffer_size)
            if not data:
                break
            batches = []
            for header in iter_batches(data):
                start = header.position
                batches.append((header, data[start : start + header.size]))
                offset = header.next_offset
            if not batches:
                break
            log_records.replay(batches, loaded)
            await asyncio.sleep(0)  # let other requests in between chunks
        return loaded

    # -- lookups -----------------------------------------------------------------------------------

    def get_state(
        self, transactional_id: str
    ) -> tuple[ErrorCode, CoordinatorEpochAndMetadata | None]:
        """NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS, or NONE with the id's metadata (None
        if the id is unknown here)."""
        owned = self._owned.get(self.partition_of(transactional_id))
        if owned is None:
            return ErrorCode.not_coordinator, None
        if owned.load is not None:
            return ErrorCode.coordinator_load_in_progress, None
        metadata = owned.transactions.get(transactional_id)
        if metadata is None:
            return ErrorCode.none, None
        return ErrorCode.none, CoordinatorEpochAndMetadata(owned.epoch, metadata)

    def put_if_not_exists(
        self, metadata: TransactionMetadata
    ) -> tuple[ErrorCode, CoordinatorEpochAndMetadata | None]:
        error, existing = self.get_state(metadata.transactional_id)
        if error is not ErrorCode.none or existing is not None:
            return error, existing
        owned = self._owned[self.partition_of(metadata.transactional_id)]
        owned.transactions[metadata.transactional_id] = metadata
        return ErrorCode.none, CoordinatorEpochAndMetadata(owned.epoch, metadata)

    def all_transactions(self) -> Iterator[TransactionMetadata]:
        for owned in self._owned.values():
            if owned.load is None:
                yield from owned.transactions.values()

    def any_loading(self) -> bool:
        return any(o.load is not None for o in self._owned.values())

    def timed_out_transactions(self, now_ms: int) -> list[TransactionMetadata]:
        """Ongoing transactions older than their timeout with no transition pending."""
        return [
            m
            for m in self.all_transactions()
            if m.state is TransactionState.ONGOING
            and not m.pending_transition_in_progress
            and m.txn_start_timestamp + m.txn_timeout_ms < now_ms
        ]

    # -- writes ------------------------------------------------------------------------------------

    async def append_transition(
        self, transactional_id: str, coordinator_epoch: int, target: TxnTransitMetadata
    ) -> ErrorCode:
        """Write `target` to the log and, once committed, install it (module docstring)."""
        records = log_records.transaction_record(transactional_id, target, self.now_ms())
        error = await self._append(transactional_id, records)
        error_now, current = self.get_state(transactional_id)
        if current is None or current.coordinator_epoch != coordinator_epoch:
            # The partition moved (or reloaded) while we wrote: someone else owns the id now.
            return error_now if error_now is not ErrorCode.none else ErrorCode.not_coordinator
        metadata = current.metadata
        if error is not ErrorCode.none:
            metadata.abort_transition()
            return error
        if metadata.pending_state is not target.state:
            return ErrorCode.not_coordinator
        metadata.complete_transition(target)
        return ErrorCode.none

    async def _append(self, transactional_id: str, records: bytes) -> ErrorCode:
        partition = self.partition_of(transactional_id)
        try:
            result = self.log.append(partition, records, -1, self.config.request_timeout_ms)
            if not isinstance(result, AppendResult):
                result = await result
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the replica manager refused: not leader, storage, ...
            code = getattr(e, "code", None)
            error = ErrorCode(code) if code is not None else ErrorCode.unknown_server_error
            return _APPEND_ERRORS.get(error, ErrorCode.unknown_server_error)
        if result.error is ErrorCode.none:
            return ErrorCode.none
        log.info("appending %s's transaction state failed: %s", transactional_id, result.error.name)
        return _APPEND_ERRORS.get(result.error, ErrorCode.unknown_server_error)

    async def expire_transactional_ids(self) -> int:
        """Tombstone and forget ids idle for `transactional.id.expiration.ms`."""
        now = self.now_ms()
        expired = 0
        for partition, owned in list(self._owned.items()):
            if owned.load is not None:
                continue
            for transactional_id, metadata in list(owned.transactions.items()):
                if (
                    not metadata.state.expiration_allowed
                    or metadata.pending_transition_in_progress
                    or metadata.txn_last_update_timestamp
                    + self.config.transactional_id_expiration_ms
                    > now
                ):
                    continue
                metadata.prepare_dead()
                records = log_records.transaction_record(transactional_id, None, now)
                error = await self._append(transactional_id, records)
                if self._owned.get(partition) is not owned:
                    break
                if error is ErrorCode.none and owned.transactions.get(transactional_id) is metadata:
                    del owned.transactions[transactional_id]
                    expired += 1
                    log.info("expired transactional id %s", transactional_id)
                else:
                    metadata.abort_transition()
        return expired
