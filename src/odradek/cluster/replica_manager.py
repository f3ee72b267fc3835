"""The replica manager: every partition this broker hosts, and the operations on them.

It applies the controller's LeaderAndIsr and StopReplica requests (who leads, who follows, what to
delete), appends produce requests (waiting for acks=all in the delayed-produce "purgatory": futures on
each partition's high watermark), serves fetches from consumers and followers (long-polling in the
delayed-fetch purgatory: futures woken by appends and HW moves, never by polling), moves partitions
between replica fetchers when leadership moves, and runs the periodic work Kafka's ReplicaManager does:
ISR shrink checks, ISR change notifications for the controller, and the high watermark checkpoint.
DeleteRecords moves a leader's log start offset and waits (up to the request's timeout) until the
ISR followers report the new start in their fetches; every move of a log start offset, on the
leader or on a follower, is written to the log directory's `log-start-offset-checkpoint` at once
(`on_log_start_offset_moved`), so that a broker killed right after does not serve deleted records
again when it restarts.

LeaderAndIsr and StopReplica are applied in `replica_roles` (a base of `ReplicaManager`).

Concurrency: every method runs on the broker's event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from odradek.cluster.append_queue import AppendQueue
from odradek.cluster.broker_topic_stats import BrokerTopicStats
from odradek.cluster.delete_records import delete_records
from odradek.cluster.partition import DataWaitable, Partition, ReadResult
from odradek.cluster.partition_isr import IsrWriter
from odradek.cluster.replica_roles import ReplicaRoleChanges
from odradek.cluster.replication_quota import ReplicationQuotaManager
from odradek.errors import (
    KafkaError,
    KafkaStorageError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from odradek.log.checkpoints import read_offset_checkpoint, write_offset_checkpoint
from odradek.log.fd_limit import is_descriptor_exhaustion
from odradek.log.partition_metadata import read_partition_topic_id as read_partition_topic_id
from odradek.log.validator import NeedsWorkerThread

log = logging.getLogger(__name__)


HIGH_WATERMARK_CHECKPOINT = "replication-offset-checkpoint"
ISR_CHANGE_PROPAGATION_INTERVAL = 0.25  # seconds between checks for ISR changes to publish
ISR_CHANGE_PROPAGATION_BLACKOUT = 0.5  # wait this long after the last change to batch more changes
ISR_CHANGE_PROPAGATION_MAX_DELAY = 5.0

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class ProduceResult:
    error: KafkaError | None = None
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1


@dataclass(slots=True)
class FetchPartitionRequest:
    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int | None = None
    log_start_offset: int = -1
    """A follower's own log start offset, as its fetch reports it (-1 from consumers)."""
    last_fetched_epoch: int = -1
    read_committed: bool = False
    """A consumer with isolation_level=read_committed: reads end at the last stable offset."""


FollowerStateUpdate = Callable[[TopicPartition, int, int, int, bool], bool]
"""(partition, fetch offset, log start offset, leader LEO, diverging epoch) -> may this follower
fetch update the follower's state (LEO, ISR, HW)? Asked after the read succeeded; the server passes
the broker-epoch and offset checks of `odradek.security.controller_requests`."""


@dataclass(slots=True)
class FetchPartitionResult:
    error: KafkaError | None = None
    read: ReadResult | None = None


@dataclass(slots=True)
class _IsrChanges:
    partitions: set[TopicPartition] = field(default_factory=set)
    last_change: float = 0.0
    last_propagation: float = 0.0


class ReplicaManager(ReplicaRoleChanges):
    """All partitions hosted here. Event-loop thread only."""

    def __init__(
        self,
        broker_id: int,
        log_manager: Any,
        metadata_cache: Any,
        log_config_for: Callable[[str], Any],
        min_insync_replicas_for: Callable[[str], int],
        isr_writer: IsrWriter,
        publish_isr_changes: Callable[[list[TopicPartition]], Awaitable[None]],
        replica_lag_time_max_ms: int,
        fetcher_manager: Any = None,
    ) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.metadata_cache = metadata_cache
        self._log_config_for = log_config_for
        self._min_insync_replicas_for = min_insync_replicas_for
        self._isr_writer = isr_writer
        self._publish_isr_changes = publish_isr_changes
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.fetcher_manager = fetcher_manager
        self.leader_throttle: ReplicationQuotaManager | None = None
        """The leader replication throttle (KIP-73; `odradek.cluster.replication_quota`): a
        follower fetch gets no records for a throttled, out-of-sync replica while it is over."""
        self.partitions: dict[TopicPartition, Partition] = {}
        # Partitions whose log directory failed (KIP-112; see `log_dir_failure`): every request
        # for them gets KAFKA_STORAGE_ERROR until the broker restarts.
        self.offline_partitions: set[TopicPartition] = set()
        # Topic ids as LeaderAndIsr states them (ZooKeeper's base64 form): followers name
        # partitions by topic id in Fetch v13+.
        self.topic_ids: dict[str, str] = {}
        self.controller_epoch = -1
        self._isr_changes = _IsrChanges()
        # BrokerTopicMetrics and the ISR meters (read by the metrics scrape).
        self.broker_topic_stats = BrokerTopicStats()
        self._high_watermarks: dict[TopicPartition, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.append_queue = AppendQueue()
        if fetcher_manager is not None:
            fetcher_manager.on_log_start_offset_moved = self.on_log_start_offset_moved

    # start-up and shutdown

    def load_high_watermarks(self, log_dirs: Iterable[Path]) -> None:
        """Read each directory's HW checkpoint. An unreadable one is logged and ignored (Kafka
        takes the directory offline instead): HWs then start at 0 and the leaders re-derive them,
        which costs consumers a moment of availability but no data."""
        for log_dir in log_dirs:
            path = Path(log_dir) / HIGH_WATERMARK_CHECKPOINT
            try:
                self._high_watermarks.update(read_offset_checkpoint(path))
            except KafkaStorageError as e:
                log.warning("%s; high watermarks of %s start at 0", e, log_dir)

    def start_background_tasks(self, high_watermark_checkpoint_interval_ms: int) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._isr_expiration_loop()))
        self._tasks.append(loop.create_task(self._isr_change_propagation_loop()))
        self._tasks.append(
            loop.create_task(self._checkpoint_loop(high_watermark_checkpoint_interval_ms / 1000))
        )

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.fetcher_manager is not None:
            await self.fetcher_manager.shutdown()
        self.append_queue.shutdown()
        for partition in self.partitions.values():
            partition.make_offline()
        self.checkpoint_high_watermarks()

    # partitions

    def get_partition(self, topic: str, partition: int) -> Partition | None:
        return self.partitions.get((topic, partition))

    def _partition_or_error(self, topic: str, partition: int) -> Partition:
        if (topic, partition) in self.offline_partitions:
            raise KafkaStorageError(f"{topic}-{partition} is in an offline log directory")
        hosted = self.partitions.get((topic, partition))
        if hosted is not None and hosted.log is not None:
            return hosted
        if self.metadata_cache.get_partition(topic, partition) is not None:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} does not host {topic}-{partition}"
            )
        raise UnknownTopicOrPartitionError(f"unknown partition {topic}-{partition}")

    def leader_partition(self, topic: str, partition: int) -> Partition:
        hosted = self._partition_or_error(topic, partition)
        if not hosted.is_leader:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {topic}-{partition}"
            )
        return hosted

    def _get_or_create_partition(self, topic: str, partition: int, is_new: bool) -> Partition:
        key = (topic, partition)
        if key in self.offline_partitions:
            raise KafkaStorageError(f"{topic}-{partition} is in an offline log directory")
        hosted = self.partitions.get(key)
        if hosted is None:
            log_ = self.log_manager.get_or_create_log(
                topic, partition, self._log_config_for(topic), is_new=is_new
            )
            hosted = Partition(
                topic,
                partition,
                self.broker_id,
                log_,
                self._isr_writer,
                self._record_isr_change,
                lambda: self._min_insync_replicas_for(topic),
                self.replica_lag_time_max_ms,
                stats=self.broker_topic_stats,
            )
            checkpointed = self._high_watermarks.get(key, 0)
            hosted.high_watermark = max(0, min(checkpointed, hosted.log_end_offset))
            self.partitions[key] = hosted
        return hosted

    # produce

    def append_records(
        self,
        entries: dict[TopicPartition, bytes],
        required_acks: int,
        timeout_ms: int,
        origin: Any = None,
    ) -> dict[TopicPartition, ProduceResult] | Awaitable[dict[TopicPartition, ProduceResult]]:
        """Append each partition's records; with acks=all, return an awaitable of the results.

        The appends happen synchronously, in the order the requests arrived, and only the wait
        for the high watermark is asynchronous; except that records too large to validate on the
        event loop are validated on a worker thread first (see `append_queue`), and later appends
        to the same partition queue behind them. Then the result is awaitable too.
        """
        now_ms = int(time.time() * 1000)
        results: dict[TopicPartition, ProduceResult] = {}
        waits: dict[TopicPartition, asyncio.Future[None]] = {}
        deferred: dict[TopicPartition, asyncio.Future[tuple[ProduceResult, Any]]] = {}
        queue = self.append_queue
        for key, records in entries.items():
            if queue.busy(key):
                deferred[key] = self._defer_append(key, records, required_acks, now_ms, origin)
                continue
            try:
                partition = self.leader_partition(*key)
                info = partition.append_records_to_leader(
                    records, required_acks, now_ms, budget=queue.inline_budget, origin=origin
                )
            except NeedsWorkerThread:
                deferred[key] = self._defer_append(key, records, required_acks, now_ms, origin)
                continue
            except KafkaError as e:
                self.broker_topic_stats.record_failed_produce(key[0])
                results[key] = ProduceResult(error=e)
                continue
            self.broker_topic_stats.record_append(key[0], info.record_count, info.size)
            results[key], wait = self._appended(partition, info, required_acks)
            if wait is not None:
                waits[key] = wait
        if deferred:
            return asyncio.ensure_future(
                self._complete_deferred(results, waits, deferred, timeout_ms / 1000)
            )
        if not waits:
            return results
        return self._wait_for_acks(results, waits, timeout_ms / 1000)

    @staticmethod
    def _appended(
        partition: Partition, info: Any, required_acks: int
    ) -> tuple[ProduceResult, asyncio.Future[None] | None]:
        result = ProduceResult(
            base_offset=info.first_offset,
            log_append_time=info.log_append_time,
            log_start_offset=partition.log_start_offset,
        )
        if required_acks != -1:
            return result, None
        return result, partition.wait_for_high_watermark(info.last_offset + 1)

    def _defer_append(
        self,
        key: TopicPartition,
        records: bytes,
        required_acks: int,
        now_ms: int,
        origin: Any = None,
    ) -> asyncio.Future[tuple[ProduceResult, Any]]:
        async def append(previous: asyncio.Future[Any] | None) -> tuple[ProduceResult, Any]:
            try:
                config = self.leader_partition(*key).log.config
                validated = await self.append_queue.validate(
                    records, config, now_ms, f"{key[0]}-{key[1]}"
                )
                await self.append_queue.after(previous)
                partition = self.leader_partition(*key)
                info = partition.append_records_to_leader(
                    records, required_acks, now_ms, validated=validated, origin=origin
                )
            except KafkaError as e:
                self.broker_topic_stats.record_failed_produce(key[0])
                return ProduceResult(error=e), None
            self.broker_topic_stats.record_append(key[0], info.record_count, info.size)
            return self._appended(partition, info, required_acks)

        return self.append_queue.defer(key, append)

    async def _complete_deferred(
        self,
        results: dict[TopicPartition, ProduceResult],
        waits: dict[TopicPartition, asyncio.Future[None]],
        deferred: dict[TopicPartition, asyncio.Future[tuple[ProduceResult, Any]]],
        timeout: float,
    ) -> dict[TopicPartition, ProduceResult]:
        for key, task in deferred.items():
            results[key], wait = await task
            if wait is not None:
                waits[key] = wait
        if not waits:
            return results
        return await self._wait_for_acks(results, waits, timeout)

    async def _wait_for_acks(
        self,
        results: dict[TopicPartition, ProduceResult],
        waits: dict[TopicPartition, asyncio.Future[None]],
        timeout: float,
    ) -> dict[TopicPartition, ProduceResult]:
        await asyncio.wait(waits.values(), timeout=timeout)
        for key, future in waits.items():
            if not future.done():
                future.cancel()
                results[key] = ProduceResult(
                    error=RequestTimedOutError(f"{key[0]}-{key[1]}: acks=all not reached in time")
                )
            elif future.exception() is not None:
                error = future.exception()
                results[key] = ProduceResult(
                    error=error if isinstance(error, KafkaError) else KafkaError(str(error))
                )
        return results

    # DeleteRecords

    def log_start_moved(self, topic: str, index: int) -> None:
        """Retention moved a log's start offset: followers' sessions marking it quiet read it."""
        partition = self.partitions.get((topic, index))
        if partition is not None:
            partition.wake_quiet()

    def on_log_start_offset_moved(self) -> None:
        """Persist the log start offsets now (DeleteRecords moved one, here or on the leader)."""
        try:
            self.log_manager.checkpoint_recovery_points_and_start_offsets()
        except (OSError, KafkaError) as e:
            log.error("cannot write the log start offset checkpoint: %s", e)

    def delete_records(
        self, offsets: dict[TopicPartition, int], timeout_ms: int
    ) -> Awaitable[dict[TopicPartition, tuple[int, KafkaError | None]]]:
        """DeleteRecords: per partition, (low watermark, error); see `delete_records`."""
        return delete_records(self, offsets, timeout_ms)

    # fetch

    def _read_all(
        self,
        requests: list[FetchPartitionRequest],
        replica_id: int,
        max_bytes: int,
        now: float,
        follower_update: FollowerStateUpdate | None = None,
        zero_copy: bool = False,
    ) -> tuple[dict[TopicPartition, FetchPartitionResult], int]:
        from_follower = replica_id >= 0
        throttle = self.leader_throttle if from_follower else None
        if throttle is not None and not throttle.enabled:
            throttle = None
        results: dict[TopicPartition, FetchPartitionResult] = {}
        remaining = max_bytes
        total = 0
        for request in requests:
            key = (request.topic, request.partition)
            try:
                partition = self.leader_partition(request.topic, request.partition)
                read = partition.read_records(
                    request.fetch_offset,
                    min(request.max_bytes, remaining),
                    from_follower=from_follower,
                    current_leader_epoch=request.current_leader_epoch,
                    min_one_batch=total == 0,
                    read_committed=request.read_committed,
                    zero_copy=zero_copy,
                )
                # The follower's LEO is its fetch offset only once the read there succeeded (so
                # the offset is within [log start, LEO]) and no diverging epoch says it must
                # truncate first; before, a fetch at any offset counted (issue 14).
                if from_follower and (
                    follower_update is None
                    or follower_update(
                        key,
                        request.fetch_offset,
                        read.log_start_offset,
                        read.log_end_offset,
                        partition.diverges(request),
                    )
                ):
                    partition.update_follower_fetch_state(
                        replica_id, request.fetch_offset, now, request.log_start_offset
                    )
            except KafkaError as e:
                results[key] = FetchPartitionResult(error=e)
                continue
            if (
                throttle is not None
                and replica_id not in partition.isr
                and throttle.is_throttled(request.topic, request.partition)
                and throttle.is_quota_exceeded()
            ):
                read = read._replace(records=b"")  # KIP-73: held back this round
            size = len(read.records)
            total += size
            remaining = max(0, remaining - size)
            results[key] = FetchPartitionResult(read=read)
        return results, total

    def fetch_messages(
        self,
        requests: list[FetchPartitionRequest],
        replica_id: int,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        follower_update: FollowerStateUpdate | None = None,
        zero_copy: bool = False,
        watch_only: Sequence[DataWaitable] = (),
        read_on_wake: Callable[[], list[FetchPartitionRequest]] | None = None,
    ) -> (
        dict[TopicPartition, FetchPartitionResult]
        | Awaitable[dict[TopicPartition, FetchPartitionResult]]
    ):
        """Read from the leaders' logs; long-poll (delayed fetch) until min_bytes or max_wait.
        With `zero_copy`, records come as ranges of segment files (`FileRecords`).

        `watch_only`: what else wakes the delayed fetch (a follower's fetch session, for the
        partitions it did not read now: nothing in them changed since its last answer); if it
        does, `read_on_wake` gives what to read with the others."""
        results, total = self._read_all(
            requests, replica_id, max_bytes, time.monotonic(), follower_update, zero_copy
        )
        errors = any(r.error is not None for r in results.values())
        if max_wait_ms <= 0 or total >= min_bytes or errors or not (requests or watch_only):
            return results
        return self._delayed_fetch(
            requests,
            replica_id,
            max_wait_ms / 1000,
            min_bytes,
            max_bytes,
            follower_update,
            zero_copy,
            results,
            watch_only,
            read_on_wake,
        )

    async def _delayed_fetch(
        self,
        requests: list[FetchPartitionRequest],
        replica_id: int,
        max_wait: float,
        min_bytes: int,
        max_bytes: int,
        follower_update: FollowerStateUpdate | None = None,
        zero_copy: bool = False,
        first_results: dict[TopicPartition, FetchPartitionResult] | None = None,
        watch_only: Sequence[DataWaitable] = (),
        read_on_wake: Callable[[], list[FetchPartitionRequest]] | None = None,
    ) -> dict[TopicPartition, FetchPartitionResult]:
        """Wait for data. A wait that ends by its timeout with no partition having been woken
        (nothing appended, no HW moved) answers with the first read's results rather than read
        every partition again: they cannot have changed, and an idle follower of thousands of
        partitions would otherwise read them all twice per fetch."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            watched: list[DataWaitable] = [
                p
                for r in requests
                if (p := self.partitions.get((r.topic, r.partition))) is not None
            ]
            watched.extend(watch_only)
            for partition in watched:
                partition.register_data_waiter(waiter)
            try:
                async with asyncio.timeout(max(0.0, deadline - loop.time())):  # not wait_for (3.11)
                    await waiter
            except TimeoutError:
                pass
            finally:
                for partition in watched:
                    partition.unregister_data_waiter(waiter)
            woken = waiter.done() and not waiter.cancelled()
            if not woken and first_results is not None:
                return first_results
            first_results = None
            if watch_only:  # woken: every partition is read from now on
                watch_only = ()
                if read_on_wake is not None:
                    requests = [*requests, *read_on_wake()]
            results, total = self._read_all(
                requests, replica_id, max_bytes, time.monotonic(), follower_update, zero_copy
            )
            errors = any(r.error is not None for r in results.values())
            if total >= min_bytes or errors or loop.time() >= deadline:
                return results

    # ISR maintenance

    def _record_isr_change(self, topic: str, partition: int) -> None:
        self._isr_changes.partitions.add((topic, partition))
        self._isr_changes.last_change = time.monotonic()

    async def _isr_expiration_loop(self) -> None:
        interval = max(0.05, self.replica_lag_time_max_ms / 2000)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for partition in list(self.partitions.values()):
                if partition.is_leader:
                    try:
                        partition.maybe_shrink_isr(now)
                    except Exception:
                        log.exception("%s: ISR shrink check failed", partition)

    async def _isr_change_propagation_loop(self) -> None:
        """Publish ISR changes as /isr_change_notification entries, batched as Kafka does."""
        changes = self._isr_changes
        while True:
            await asyncio.sleep(ISR_CHANGE_PROPAGATION_INTERVAL)
            if not changes.partitions:
                continue
            now = time.monotonic()
            if (
                now - changes.last_change < ISR_CHANGE_PROPAGATION_BLACKOUT
                and now - changes.last_propagation < ISR_CHANGE_PROPAGATION_MAX_DELAY
            ):
                continue
            batch = sorted(changes.partitions)
            changes.partitions.clear()
            changes.last_propagation = now
            try:
                await self._publish_isr_changes(batch)
            except Exception as e:
                log.warning("could not publish ISR changes (%s); will retry", e)
                changes.partitions.update(batch)

    # high watermark checkpoint

    def checkpoint_high_watermarks(self) -> None:
        by_parent: dict[str, dict[TopicPartition, int]] = {}
        for key, partition in self.partitions.items():
            if partition.log is None:
                continue
            parent = os.path.dirname(partition.log.dir)  # cheaper than a Path per partition
            by_parent.setdefault(parent, {})[key] = partition.high_watermark
        by_dir = {Path(parent): offsets for parent, offsets in by_parent.items()}
        for log_dir in self.log_manager.live_log_dirs:
            offsets = by_dir.get(Path(log_dir), {})
            try:
                write_offset_checkpoint(Path(log_dir) / HIGH_WATERMARK_CHECKPOINT, offsets)
            except KafkaStorageError as e:
                # An I/O error takes the directory offline (KIP-112), like any other of its files;
                # running out of file descriptors does not (the next checkpoint retries).
                if is_descriptor_exhaustion(e):
                    log.error("high watermark checkpoint of %s not written: %s", log_dir, e)
                else:
                    self.log_manager.failure_channel.maybe_add_offline_log_dir(log_dir, str(e))

    async def _checkpoint_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.checkpoint_high_watermarks()
