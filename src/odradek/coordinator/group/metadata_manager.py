"""The group metadata manager: the groups and offsets of the `__consumer_offsets` partitions this
broker leads, kept in memory and written to those partitions (Kafka's GroupMetadataManager).

Ownership. A group lives in partition `placement.partition_for(group id)`; this broker serves it
only while it leads that partition. The broker reports leadership changes:

* `on_elected(partition, epoch)` (LeaderAndIsr made us leader): the partition is *loading*
  (group requests get COORDINATOR_LOAD_IN_PROGRESS) while a task replays it from its log start
  offset to its log end offset (`log_records.PartitionReplay`: the last record of each key wins,
  tombstones delete), imports the offsets that earlier Odradek versions stored in ZooKeeper
  (`LegacyOffsets`, see `zk_import`), then installs the groups (the coordinator's
  `on_group_loaded` starts their members' session timers) and serves them;
* `on_resigned(partition)` (we follow, or the replica was stopped): the load is cancelled, every
  group of the partition is unloaded (the coordinator's `on_group_unloaded` answers parked
  requests NOT_COORDINATOR) and requests get NOT_COORDINATOR.

A newer epoch supersedes an older one; a load that finds its epoch superseded when it finishes
installs nothing.

Writes. Every store is one record batch appended through the replica manager (`OffsetsLog`):
offset commits and group metadata with `offsets.commit.required.acks` (all) and
`offsets.commit.timeout.ms`, answered only once committed; the cache changes only then, so a
failed or lost append leaves no trace a reader could see. The append itself happens synchronously,
so one connection's requests, dispatched in order, reach the log in order; two commits of one
partition that complete in any order leave the later record's value (`offsets.GroupOffsets`).
Tombstones (DeleteGroups, OffsetDelete, expiry) are appended with acks=1 after the cache forgets
the offsets, as Kafka's cleanupGroupMetadata does; the log cleaner removes tombstones from a
compacted partition after `delete.retention.ms`, and until then a load replays them (a key's
tombstone simply deletes it).

Errors of an append map to what Kafka answers: UNKNOWN_TOPIC_OR_PARTITION and NOT_ENOUGH_REPLICAS
(_AFTER_APPEND) become COORDINATOR_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER and KAFKA_STORAGE_ERROR
become NOT_COORDINATOR (the client looks the coordinator up again), a too-large commit is
INVALID_COMMIT_OFFSET_SIZE; a group store that times out is COORDINATOR_NOT_AVAILABLE.

Expiry: every `offsets.retention.check.interval.ms`, the offsets that KIP-211 says have expired
(`offsets.expired_offsets`) are dropped and tombstoned; an Empty group left with no offsets
becomes Dead and its metadata is tombstoned too.

Concurrency: event-loop thread only. Loads run as tasks that read `offsets.load.buffer.size` bytes
at a time and yield to the loop after decoding every `REPLAY_SLICE_BYTES` of them, so a load of
thousands of groups does not stall the broker's other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kio.schema.errors import ErrorCode

from odradek.coordinator.group import log_records
from odradek.coordinator.group.metadata import GroupMetadata, GroupState
from odradek.coordinator.group.offsets import OffsetAndMetadata, TopicPartition, expired_offsets
from odradek.coordinator.group.placement import partition_for
from odradek.errors import CorruptRecordError, KafkaError
from odradek.zk.errors import ConnectionLossError, SessionExpiredError

log = logging.getLogger(__name__)

T = TypeVar("T")

REPLAY_SLICE_BYTES = 64 * 1024
"""A load decodes this much of a chunk, then yields to the event loop (about 10 ms of work)."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: ErrorCode
    base_offset: int = -1


class OffsetsLog(Protocol):
    """The offsets topic's partitions as this broker hosts them (the replica manager)."""

    def append(
        self, partition: int, records: bytes, required_acks: int, timeout_ms: int
    ) -> AppendResult | Awaitable[AppendResult]:
        """Append as leader; the result (now, or once `required_acks` are reached)."""
        ...

    def read(self, partition: int, offset: int, max_bytes: int) -> bytes:
        """Whole batches from `offset` of the local log, up to its end. KafkaError if gone."""
        ...

    def log_start_offset(self, partition: int) -> int: ...

    def log_end_offset(self, partition: int) -> int: ...


class LegacyOffsets(Protocol):
    """Offsets an earlier Odradek stored in ZooKeeper, to import once (`zk_import`)."""

    async def unimported_offsets(
        self, partition: int, partition_of: Callable[[str], int]
    ) -> dict[str, dict[TopicPartition, int]]: ...

    async def mark_imported(self, group_id: str, partition: int) -> None: ...


@dataclass(frozen=True, slots=True)
class OffsetConfig:
    """The `offsets.*` broker settings (Kafka's defaults)."""

    num_partitions: int = 50
    required_acks: int = -1
    commit_timeout_ms: int = 5000
    retention_ms: int = 7 * 24 * 60 * 60 * 1000
    retention_check_interval_ms: int = 600_000
    load_buffer_size: int = 5 * 1024 * 1024
    compression: int = 0
    metadata_max_bytes: int = 4096

    @classmethod
    def from_broker_config(cls, config: Any) -> OffsetConfig:
        get = config.__getitem__
        return cls(
            num_partitions=int(get("offsets.topic.num.partitions")),
            required_acks=int(get("offsets.commit.required.acks")),
            commit_timeout_ms=int(get("offsets.commit.timeout.ms")),
            retention_ms=int(get("offsets.retention.minutes")) * 60 * 1000,
            retention_check_interval_ms=int(get("offsets.retention.check.interval.ms")),
            load_buffer_size=int(get("offsets.load.buffer.size")),
            compression=int(get("offsets.topic.compression.codec")),
            metadata_max_bytes=int(get("offset.metadata.max.bytes")),
        )


_OFFSET_ERRORS = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.message_too_large: ErrorCode.invalid_commit_offset_size,
    ErrorCode.record_list_too_large: ErrorCode.invalid_commit_offset_size,
    ErrorCode.invalid_fetch_size: ErrorCode.invalid_commit_offset_size,
}
_GROUP_ERRORS = {
    **_OFFSET_ERRORS,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.message_too_large: ErrorCode.unknown_server_error,
    ErrorCode.record_list_too_large: ErrorCode.unknown_server_error,
    ErrorCode.invalid_fetch_size: ErrorCode.unknown_server_error,
}

Listener = Callable[[GroupMetadata], None]


@dataclass(slots=True, eq=False)
class _Ownership:
    epoch: int
    load: asyncio.Task[None] | None = None  # None once loaded


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _ignore(_group: GroupMetadata) -> None:
    pass


class GroupMetadataManager:
    """Groups and offsets of the offsets partitions this broker leads (module docstring).

    Event-loop thread only. `groups` is the coordinator's group table: it holds every group of a
    loaded partition (members, offsets, or both) and groups created by requests since.
    """

    def __init__(
        self,
        config: OffsetConfig,
        offsets_log: OffsetsLog,
        *,
        partition_count: Callable[[], int] | None = None,
        legacy: LegacyOffsets | None = None,
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self.config = config
        self.log = offsets_log
        self._partition_count = partition_count
        self._known_partitions: int | None = None
        self._legacy = legacy
        self.clock_ms = clock_ms
        self.groups: dict[str, GroupMetadata] = {}
        self.pending_txn_offsets: dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]] = {}
        """Transactional offset commits awaiting their marker, by producer id then group (kept
        by `txn_offsets.PendingTxnOffsets`; a load adds those it finds without a marker)."""
        self._owned: dict[int, _Ownership] = {}
        self.on_group_loaded: Listener = _ignore
        self.on_group_unloaded: Listener = _ignore
        self._tasks: set[asyncio.Task[Any]] = set()
        self.loaded_at: dict[int, float] = {}
        """When each partition finished loading (time.monotonic()), for benchmarks and logs."""

    # -- ownership -------------------------------------------------------------------------------

    @property
    def partitions(self) -> int:
        """The offsets topic's partition count: the topic's own once known (remembered, as
        Kafka does: adding partitions to it would move groups), else the configured one."""
        if self._known_partitions is None and self._partition_count is not None:
            count = self._partition_count()
            if count > 0:
                self._known_partitions = count
        return self._known_partitions or self.config.num_partitions

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.partitions)

    def status(self, group_id: str) -> ErrorCode | None:
        """None if this broker serves the group now; else LOAD_IN_PROGRESS or NOT_COORDINATOR."""
        owned = self._owned.get(self.partition_of(group_id))
        if owned is None:
            return ErrorCode.not_coordinator
        if owned.load is not None:
            return ErrorCode.coordinator_load_in_progress
        return None

    @property
    def is_loading(self) -> bool:
        return any(owned.load is not None for owned in self._owned.values())

    def owned_partitions(self) -> dict[int, bool]:
        """Partition -> loaded, for every offsets partition this broker leads."""
        return {p: owned.load is None for p, owned in sorted(self._owned.items())}

    def on_elected(self, partition: int, epoch: int) -> None:
        """We lead `partition` at leader epoch `epoch`: load it (unless already at that epoch)."""
        owned = self._owned.get(partition)
        if owned is not None:
            if owned.epoch >= epoch:
                return
            if owned.load is not None:
                owned.load.cancel()
            owned.epoch = epoch
            if owned.load is None:
                return  # still ours, loaded: nothing moved in between
        owned = self._owned[partition] = _Ownership(epoch)
        owned.load = asyncio.get_running_loop().create_task(self._load(partition, owned))
        log.info("loading offsets partition %d (leader epoch %d)", partition, epoch)

    def on_resigned(self, partition: int) -> None:
        """We no longer lead `partition`: unload its groups."""
        owned = self._owned.pop(partition, None)
        if owned is not None and owned.load is not None:
            owned.load.cancel()
        self.loaded_at.pop(partition, None)
        unloaded = [g for g in self.groups.values() if self.partition_of(g.group_id) == partition]
        for group in unloaded:
            self.on_group_unloaded(group)
            self.groups.pop(group.group_id, None)
        if owned is not None:
            log.info("unloaded offsets partition %d: %d groups", partition, len(unloaded))

    async def shutdown(self) -> None:
        for partition in list(self._owned):
            self.on_resigned(partition)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- loading ---------------------------------------------------------------------------------

    async def _load(self, partition: int, owned: _Ownership) -> None:
        started = time.monotonic()
        try:
            replay = await self._replay(partition)
            imported = await self._import_legacy(partition, replay)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if isinstance(e, ConnectionLossError | SessionExpiredError):
                # ZooKeeper (the legacy offsets' import) is away for a moment: expected under
                # faults, one line rather than a traceback.
                log.warning("loading offsets partition %d failed (%s); will retry", partition, e)
            else:
                log.exception("loading offsets partition %d failed; will retry", partition)
            await asyncio.sleep(1.0)
            if self._owned.get(partition) is owned:
                owned.load = asyncio.get_running_loop().create_task(self._load(partition, owned))
            return
        if self._owned.get(partition) is not owned:
            return
        for producer_id, groups in replay.pending_offsets().items():
            for group_id, offsets in groups.items():
                self.pending_txn_offsets.setdefault(producer_id, {}).setdefault(
                    group_id, {}
                ).update(offsets)
        for group_id, replayed in replay.loaded_groups():
            self._install(group_id, replayed)
        owned.load = None
        self.loaded_at[partition] = time.monotonic()
        log.info(
            "loaded offsets partition %d in %.3f s: %d groups, %d records in %d batches%s",
            partition,
            time.monotonic() - started,
            sum(1 for _ in replay.loaded_groups()),
            replay.records,
            replay.batches,
            f", {imported} offsets imported from ZooKeeper" if imported else "",
        )

    async def _replay(self, partition: int) -> log_records.PartitionReplay:
        start = self.log.log_start_offset(partition)
        end = self.log.log_end_offset(partition)
        replay = log_records.PartitionReplay(next_offset=start)
        offset = start
        while offset < end:
            data = self.log.read(partition, offset, self.config.load_buffer_size)
            if not data:
                break
            for piece in log_records.split_batches(data, REPLAY_SLICE_BYTES):
                try:
                    replay.feed(piece)
                except CorruptRecordError as e:
                    raise CorruptRecordError(
                        f"offsets partition {partition} near {offset}: {e}"
                    ) from e
                await asyncio.sleep(0)  # decoding is Python work: let the loop serve others
            if replay.next_offset <= offset:
                break
            offset = replay.next_offset
        return replay

    async def _import_legacy(self, partition: int, replay: log_records.PartitionReplay) -> int:
        """Offsets of this partition's groups that only ZooKeeper holds (see `zk_import`): each
        is appended as a commit with the time of the import, then its group is marked."""
        if self._legacy is None:
            return 0
        found = await self._legacy.unimported_offsets(partition, self.partition_of)
        imported = 0
        now = self.clock_ms()
        for group_id, offsets in sorted(found.items()):
            replayed = replay.groups.setdefault(group_id, log_records.ReplayedGroup())
            missing = {tp: o for tp, o in sorted(offsets.items()) if tp not in replayed.offsets}
            if missing:
                values = {
                    tp: OffsetAndMetadata(o, commit_timestamp=now) for tp, o in missing.items()
                }
                batch = log_records.build_records(
                    [log_records.offset_commit_entry(group_id, tp, v) for tp, v in values.items()],
                    now,
                    self.config.compression,
                )
                result = await self._append(partition, batch, self.config.required_acks)
                if result.error is not ErrorCode.none:
                    raise KafkaError(
                        f"importing the ZooKeeper offsets of group {group_id}: "
                        f"append failed with {result.error.name}",
                        result.error,
                    )
                for index, (tp, value) in enumerate(values.items()):
                    replayed.offsets[tp] = (value, result.base_offset + index)
                imported += len(values)
                log.info(
                    "imported %d offsets of group %s from ZooKeeper into partition %d",
                    len(values),
                    group_id,
                    partition,
                )
            await self._legacy.mark_imported(group_id, partition)
        return imported

    def _install(self, group_id: str, replayed: log_records.ReplayedGroup) -> None:
        group = log_records.group_from_record(group_id, replayed.metadata)
        for tp, (value, appended_offset) in replayed.offsets.items():
            group.offsets.load(tp, value, appended_offset)
        previous = self.groups.get(group_id)
        if previous is not None:
            self.on_group_unloaded(previous)
        self.groups[group_id] = group
        self.on_group_loaded(group)

    # -- writes ----------------------------------------------------------------------------------

    async def _append(self, partition: int, records: bytes, required_acks: int) -> AppendResult:
        result = self.log.append(partition, records, required_acks, self.config.commit_timeout_ms)
        return result if isinstance(result, AppendResult) else await result

    def _spawn(self, coroutine: Coroutine[object, object, object]) -> asyncio.Task[object]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _append_then(
        self,
        partition: int,
        records: bytes,
        required_acks: int,
        then: Callable[[AppendResult], T],
    ) -> T | asyncio.Task[T]:
        """Append now; `then(result)` synchronously if the log answered at once (tests), else
        from a task, which is returned."""
        try:
            result = self.log.append(
                partition, records, required_acks, self.config.commit_timeout_ms
            )
        except KafkaError as e:
            result = AppendResult(e.code)
        if isinstance(result, AppendResult):
            return then(result)

        async def wait() -> T:
            try:
                outcome = await result
            except KafkaError as e:
                outcome = AppendResult(e.code)
            return then(outcome)

        task: asyncio.Task[T] = asyncio.ensure_future(wait())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def store_group(
        self,
        group: GroupMetadata,
        assignment: Mapping[str, bytes],
        callback: Callable[[ErrorCode], None],
    ) -> None:
        """Append the group's metadata (Kafka's storeGroup); `callback` gets the mapped error."""
        now = self.clock_ms()
        value = log_records.group_record(group, assignment)
        batch = log_records.build_records(
            [log_records.group_metadata_entry(group.group_id, value)], now, self.config.compression
        )

        def then(result: AppendResult) -> None:
            error = result.error
            if error is not ErrorCode.none:
                log.warning(
                    "storing group %s generation %d failed: %s",
                    group.group_id,
                    group.generation_id,
                    error.name,
                )
                error = _GROUP_ERRORS.get(error, ErrorCode.unknown_server_error)
            callback(error)

        self._append_then(self.partition_of(group.group_id), batch, self.config.required_acks, then)

    def store_offsets(
        self, group: GroupMetadata, offsets: Mapping[TopicPartition, OffsetAndMetadata]
    ) -> dict[TopicPartition, ErrorCode] | Awaitable[dict[TopicPartition, ErrorCode]]:
        """Append the commits; the cache takes them once committed. Per partition, NONE or the
        error to answer."""
        items = list(offsets.items())
        if not items:
            return {}
        batch = log_records.build_records(
            [log_records.offset_commit_entry(group.group_id, tp, v) for tp, v in items],
            self.clock_ms(),
            self.config.compression,
        )
        group.offsets.prepare(tp for tp, _ in items)

        def then(result: AppendResult) -> dict[TopicPartition, ErrorCode]:
            ok = result.error is ErrorCode.none
            alive = group.state is not GroupState.DEAD
            for index, (tp, value) in enumerate(items):
                if ok and alive:
                    group.offsets.complete(tp, value, result.base_offset + index)
                else:
                    group.offsets.fail(tp)
            if ok:
                return dict.fromkeys(offsets, ErrorCode.none)
            error = _OFFSET_ERRORS.get(result.error, result.error)
            log.warning("committing offsets of group %s failed: %s", group.group_id, error.name)
            return dict.fromkeys(offsets, error)

        outcome = self._append_then(
            self.partition_of(group.group_id), batch, self.config.required_acks, then
        )
        if not isinstance(outcome, asyncio.Task):
            return outcome
        group.offsets.in_flight.add(outcome)
        outcome.add_done_callback(group.offsets.in_flight.discard)
        # A client that goes away cancels its request, never the write others wait for.
        return asyncio.shield(outcome)

    def write_tombstones(
        self, group_id: str, partitions: Iterable[TopicPartition], group: bool = False
    ) -> None:
        """Append tombstones for the group's `partitions` (and its metadata with `group`), acks=1;
        failures are logged (the next load would bring the offsets back)."""
        entries = [log_records.offset_tombstone(group_id, tp) for tp in partitions]
        if group:
            entries.append(log_records.group_tombstone(group_id))
        if not entries:
            return
        batch = log_records.build_records(entries, self.clock_ms(), self.config.compression)

        def then(result: AppendResult) -> None:
            if result.error is not ErrorCode.none:
                log.warning(
                    "writing %d tombstones of group %s failed: %s",
                    len(entries),
                    group_id,
                    result.error.name,
                )

        self._append_then(self.partition_of(group_id), batch, 1, then)

    # -- reads -----------------------------------------------------------------------------------

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> Awaitable[dict[TopicPartition, OffsetAndMetadata]]:
        """The group's committed offsets (all when `partitions` is None), once every commit of
        the group appended before this call has settled: a client that pipelines commits and
        then a fetch on one connection reads its own commits, as Kafka's in-order processing of
        a connection's requests guarantees."""
        group = self.groups.get(group_id)
        wanted = None if partitions is None else list(partitions)
        earlier = tuple(group.offsets.in_flight) if group is not None else ()

        async def read() -> dict[TopicPartition, OffsetAndMetadata]:
            if earlier:
                await asyncio.wait(earlier)
            current = self.groups.get(group_id)
            if current is None or current.state is GroupState.DEAD:
                return {}
            committed = current.offsets.committed
            keys = committed if wanted is None else [tp for tp in wanted if tp in committed]
            return {tp: committed[tp].value for tp in keys}

        return read()

    # -- expiry ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._spawn(self._expiry_loop())

    async def _expiry_loop(self) -> None:
        interval = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.expire_offsets(self.clock_ms())
            except Exception:
                log.exception("offset expiry failed")

    def expire_offsets(self, now_ms: int) -> int:
        """Drop and tombstone expired offsets; Empty groups left with none become Dead."""
        removed_total = 0
        for group in list(self.groups.values()):
            if self.status(group.group_id) is not None or group.state is GroupState.DEAD:
                continue
            expired = expired_offsets(
                group.offsets,
                protocol_type=group.protocol_type,
                is_empty=group.state is GroupState.EMPTY,
                is_stable=group.state is GroupState.STABLE,
                state_timestamp_ms=group.state_timestamp_ms,
                subscribed_topics=group.subscribed_topics(),
                now_ms=now_ms,
                retention_ms=self.config.retention_ms,
            )
            removed = group.offsets.remove(expired)
            dead = (
                group.state is GroupState.EMPTY
                and not group.offsets
                and not group.members
                and not group.pending_members
            )
            if dead:
                group.transition_to(GroupState.DEAD, now_ms)
                self.groups.pop(group.group_id, None)
                log.info("group %s has no offsets left and is Empty: now Dead", group.group_id)
            if removed or dead:
                self.write_tombstones(group.group_id, removed, group=dead)
            removed_total += len(removed)
        if removed_total:
            log.info("expired %d offsets", removed_total)
        return removed_total

    def delete_group(self, group: GroupMetadata) -> None:
        """A Dead group (DeleteGroups): forget it and tombstone its offsets and metadata."""
        removed = group.offsets.remove_all()
        self.groups.pop(group.group_id, None)
        self.write_tombstones(group.group_id, removed, group=True)

    def delete_offsets(self, group: GroupMetadata, partitions: Iterable[TopicPartition]) -> None:
        """OffsetDelete: forget and tombstone these offsets of the group."""
        removed = group.offsets.remove(list(partitions))
        self.write_tombstones(group.group_id, removed)
