"""The group metadata manager (the store on `__consumer_offsets`) over an in-memory offsets log.

What the log holds is the truth: every test that writes reads the partition back with a second
manager, as a new coordinator would after a failover. Covered: commits answered only once
committed and cached only then; the last of two commits of one partition wins whatever order their
appends complete in; metadata and leader epoch survive; group metadata (generation, members,
static members, assignments) survives; tombstones delete; load-in-progress and resignation;
KIP-211 expiry; the ZooKeeper import (once, never over a newer commit, marked only after the
append).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from kio.schema.errors import ErrorCode

from odradek.coordinator.group.coordinator import GroupCoordinator
from odradek.coordinator.group.metadata import GroupConfig, GroupMetadata, GroupState, JoinRequest
from odradek.coordinator.group.metadata_manager import GroupMetadataManager, OffsetConfig
from odradek.coordinator.group.offsets import GroupOffsets, OffsetAndMetadata, expired_offsets
from odradek.zk.errors import ConnectionLossError, SessionExpiredError
from tests.fakes.offsets_log import FakeOffsetsLog

T = TypeVar("T")
GROUP = "group-a"
DAY_MS = 24 * 60 * 60 * 1000


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def run(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(factory())


class Broker:
    """One broker's coordinator and store over a shared offsets log."""

    def __init__(
        self, log: FakeOffsetsLog, clock: Clock, legacy: Any = None, **config: Any
    ) -> None:
        self.manager = GroupMetadataManager(
            OffsetConfig(**config), log, legacy=legacy, clock_ms=clock
        )
        self.coordinator = GroupCoordinator(
            1, GroupConfig(initial_rebalance_delay_ms=0), self.manager, clock_ms=clock
        )
        self.coordinator.active = True
        self.partition = self.manager.partition_of(GROUP)

    async def lead(self, partition: int | None = None, epoch: int = 1) -> None:
        partition = self.partition if partition is None else partition
        self.manager.on_elected(partition, epoch)
        assert self.manager.status(GROUP) is ErrorCode.coordinator_load_in_progress
        for _ in range(100):
            await asyncio.sleep(0)
            if self.manager.owned_partitions().get(partition):
                return
        raise AssertionError("the partition did not load")

    def commit(self, offsets: dict[tuple[str, int], OffsetAndMetadata], group: str = GROUP) -> Any:
        return self.coordinator.commit_offsets(group, "", None, -1, offsets)

    async def fetch(self, group: str = GROUP) -> dict[tuple[str, int], OffsetAndMetadata]:
        error, reading = self.coordinator.fetch_offsets(group, None)
        assert error is ErrorCode.none and reading is not None
        return await reading


async def answered(result: Any) -> dict[tuple[str, int], ErrorCode]:
    return result if isinstance(result, dict) else await result


def test_commits_survive_a_reload_with_metadata_and_leader_epoch() -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        first = Broker(log, clock)
        await first.lead()
        value = OffsetAndMetadata(42, leader_epoch=7, metadata="checkpoint", commit_timestamp=5)
        assert await answered(first.commit({("t", 0): value, ("t", 1): OffsetAndMetadata(9)})) == {
            ("t", 0): ErrorCode.none,
            ("t", 1): ErrorCode.none,
        }
        assert (await first.fetch())[("t", 0)] == value
        second = Broker(log, clock)
        await second.lead(epoch=2)
        loaded = await second.fetch()
        assert loaded[("t", 0)] == value
        assert loaded[("t", 1)].offset == 9
        assert second.coordinator.groups[GROUP].state is GroupState.EMPTY

    run(scenario)


def test_the_last_commit_wins_whatever_order_the_appends_complete_in() -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        broker = Broker(log, clock)
        await broker.lead()
        log.hold()
        earlier = broker.commit({("t", 0): OffsetAndMetadata(10)})
        later = broker.commit({("t", 0): OffsetAndMetadata(20)})
        fetched = broker.coordinator.fetch_offsets(GROUP, [("t", 0)])[1]
        assert fetched is not None
        assert broker.coordinator.groups[GROUP].offsets.get(("t", 0)) is None  # not committed
        log.release(1)  # the later append is committed first
        assert await later == {("t", 0): ErrorCode.none}
        log.release(0)
        assert await earlier == {("t", 0): ErrorCode.none}
        # The fetch pipelined after both waited for them, and sees the last.
        assert (await fetched)[("t", 0)].offset == 20
        reloaded = Broker(log, clock)
        await reloaded.lead(epoch=2)
        assert (await reloaded.fetch())[("t", 0)].offset == 20

    run(scenario)


def test_a_failed_append_changes_nothing_and_maps_the_error() -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        broker = Broker(log, clock)
        await broker.lead()
        await answered(broker.commit({("t", 0): OffsetAndMetadata(5)}))
        for code, answer in [
            (ErrorCode.not_leader_or_follower, ErrorCode.not_coordinator),
            (ErrorCode.not_enough_replicas, ErrorCode.coordinator_not_available),
            (ErrorCode.request_timed_out, ErrorCode.request_timed_out),
            (ErrorCode.record_list_too_large, ErrorCode.invalid_commit_offset_size),
        ]:
            log.fail_with(code)
            assert await answered(broker.commit({("t", 0): OffsetAndMetadata(6)})) == {
                ("t", 0): answer
            }
        log.fail_with(None)
        assert (await broker.fetch())[("t", 0)].offset == 5
        assert not broker.coordinator.groups[GROUP].offsets.pending

    run(scenario)


def join(coordinator: GroupCoordinator, member_id: str = "", instance: str | None = None) -> Any:
    answers: list[Any] = []
    coordinator.join_group(
        JoinRequest(
            group_id=GROUP,
            member_id=member_id,
            group_instance_id=instance,
            protocol_type="consumer",
            protocols=(("range", b"\x00\x01\x00\x00\x00\x01\x00\x01t"),),
            session_timeout_ms=10_000,
            rebalance_timeout_ms=10_000,
            require_known_member_id=instance is None,
            client_id="client",
            client_host="/127.0.0.1",
        ),
        answers.append,
    )
    coordinator.expire_timers()
    return answers


def test_group_metadata_survives_a_failover_with_generation_and_static_members() -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        first = Broker(log, clock)
        await first.lead()
        (joined,) = join(first.coordinator, instance="static-1")
        assert joined.error is ErrorCode.none and joined.generation_id == 1
        member = joined.member_id
        synced: list[Any] = []
        first.coordinator.sync_group(
            GROUP, 1, member, "static-1", "consumer", "range", {member: b"mine"}, synced.append
        )
        assert synced[0].assignment == b"mine"
        first.manager.on_resigned(first.partition)
        second = Broker(log, clock)
        await second.lead(epoch=2)
        group = second.coordinator.groups[GROUP]
        assert (group.state, group.generation_id, group.leader_id) == (
            GroupState.STABLE,
            1,
            member,
        )
        assert group.static_members == {"static-1": member}
        assert group.members[member].assignment == b"mine"
        assert group.subscribed_topics() == frozenset({"t"})
        # The member heartbeats on with its generation; its session timer runs from the load.
        assert second.coordinator.heartbeat(GROUP, member, "static-1", 1) is ErrorCode.none
        # A restarted static member takes its place again without a rebalance; the new member id
        # is stored before it is answered.
        (rejoined,) = join(second.coordinator, instance="static-1")
        assert (rejoined.error, rejoined.generation_id) == (ErrorCode.none, 1)
        third = Broker(log, clock)
        await third.lead(epoch=3)
        assert third.coordinator.groups[GROUP].static_members == {"static-1": rejoined.member_id}

    run(scenario)


def test_storing_the_assignment_fails_then_the_group_rebalances() -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        broker = Broker(log, clock)
        await broker.lead()
        first = join(broker.coordinator)
        (joined,) = join(broker.coordinator, first[0].member_id)
        log.fail_with(ErrorCode.not_enough_replicas)
        synced: list[Any] = []
        broker.coordinator.sync_group(
            GROUP, 1, joined.member_id, None, "consumer", "range", {}, synced.append
        )
        assert synced[0].error is ErrorCode.coordinator_not_available
        assert broker.coordinator.groups[GROUP].state is GroupState.PREPARING_REBALANCE

    run(scenario)


def test_tombstones_delete_groups_and_offsets() -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        broker = Broker(log, clock)
        await broker.lead()
        other = next(
            g
            for g in (f"g{i}" for i in range(1000))
            if broker.manager.partition_of(g) == broker.partition and g != GROUP
        )
        await answered(
            broker.commit({("t", 0): OffsetAndMetadata(1), ("u", 0): OffsetAndMetadata(2)})
        )
        await answered(broker.commit({("t", 0): OffsetAndMetadata(3)}, group=other))
        assert broker.coordinator.delete_offsets(GROUP, [("t", 0)]) == (
            ErrorCode.none,
            {("t", 0): ErrorCode.none},
        )
        assert broker.coordinator.delete_groups([other]) == {other: ErrorCode.none}
        assert broker.coordinator.delete_groups([other]) == {other: ErrorCode.group_id_not_found}
        reloaded = Broker(log, clock)
        await reloaded.lead(epoch=2)
        assert set(await reloaded.fetch()) == {("u", 0)}
        assert other not in reloaded.coordinator.groups
        assert reloaded.coordinator.describe_group(other)[1].state == "Dead"

    run(scenario)


def test_load_in_progress_and_resignation() -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        broker = Broker(log, clock)
        assert broker.commit({("t", 0): OffsetAndMetadata(1)}) == {
            ("t", 0): ErrorCode.not_coordinator
        }
        broker.manager.on_elected(broker.partition, 1)
        assert broker.commit({("t", 0): OffsetAndMetadata(1)}) == {
            ("t", 0): ErrorCode.coordinator_load_in_progress
        }
        assert broker.coordinator.list_groups()[0] is ErrorCode.coordinator_load_in_progress
        await broker.lead()
        await answered(broker.commit({("t", 0): OffsetAndMetadata(1)}))
        broker.manager.on_resigned(broker.partition)
        assert broker.coordinator.fetch_offsets(GROUP, None)[0] is ErrorCode.not_coordinator
        assert GROUP not in broker.coordinator.groups
        # A partition whose log refuses reads (leadership moved again meanwhile) keeps loading,
        # retried, rather than serving groups it could not read.
        log.gone.add(broker.partition)
        broker.manager.on_elected(broker.partition, 3)
        for _ in range(5):
            await asyncio.sleep(0)
        assert broker.manager.status(GROUP) is ErrorCode.coordinator_load_in_progress
        await broker.manager.shutdown()

    run(scenario)


def offsets_with(commit_timestamps: dict[str, int]) -> GroupOffsets:
    offsets = GroupOffsets()
    for topic, timestamp in commit_timestamps.items():
        offsets.load((topic, 0), OffsetAndMetadata(1, commit_timestamp=timestamp), -1)
    return offsets


def test_kip_211_expiry_rules() -> None:
    offsets = offsets_with({"a": 0, "b": 5 * DAY_MS})
    week = 7 * DAY_MS

    def expired(**kwargs: Any) -> list[str]:
        settings = {
            "protocol_type": "consumer",
            "is_empty": False,
            "is_stable": False,
            "state_timestamp_ms": -1,
            "subscribed_topics": None,
            "now_ms": 8 * DAY_MS,
            "retention_ms": week,
            **kwargs,
        }
        return sorted(t for t, _ in expired_offsets(offsets, **settings))

    # Empty: measured from when the group became Empty, for all offsets.
    assert expired(is_empty=True, state_timestamp_ms=2 * DAY_MS) == []
    assert expired(is_empty=True, state_timestamp_ms=DAY_MS) == ["a", "b"]
    # Empty, state time unknown (an old record): from each commit.
    assert expired(is_empty=True) == ["a"]
    # Stable consumer group: only topics nobody subscribes to, from the commit.
    assert expired(is_stable=True, subscribed_topics=frozenset({"a"})) == []
    assert expired(is_stable=True, subscribed_topics=frozenset({"b"})) == ["a"]
    # Stable with unknown subscriptions, or rebalancing: nothing.
    assert expired(is_stable=True) == []
    assert expired() == []
    # No protocol (a simple consumer's commits): from each commit.
    assert expired(protocol_type=None) == ["a"]
    # A commit in flight is never expired; an explicit expire timestamp wins.
    offsets.prepare([("a", 0)])
    assert expired(protocol_type=None) == []
    explicit = GroupOffsets()
    explicit.load(("c", 0), OffsetAndMetadata(1, commit_timestamp=0, expire_timestamp=10), -1)
    assert expired_offsets(
        explicit,
        protocol_type="consumer",
        is_empty=True,
        is_stable=False,
        state_timestamp_ms=9,
        subscribed_topics=None,
        now_ms=10,
        retention_ms=week,
    ) == [("c", 0)]


def test_expiry_tombstones_offsets_and_kills_empty_groups() -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        broker = Broker(log, clock, retention_ms=DAY_MS)
        await broker.lead()
        await answered(broker.commit({("t", 0): OffsetAndMetadata(1, commit_timestamp=clock.now)}))
        clock.now += DAY_MS - 1
        assert broker.manager.expire_offsets(clock.now) == 0
        clock.now += 1
        assert broker.manager.expire_offsets(clock.now) == 1
        assert GROUP not in broker.coordinator.groups
        reloaded = Broker(log, clock)
        await reloaded.lead(epoch=2)
        assert GROUP not in reloaded.coordinator.groups

    run(scenario)


class FakeLegacy:
    """ZooKeeper's old offsets: {group: {tp: offset}}, and the markers set."""

    def __init__(self, offsets: dict[str, dict[tuple[str, int], int]]) -> None:
        self.offsets = offsets
        self.marked: list[str] = []
        self.fail_reads = 0
        self.failure: Exception = ConnectionError("ZooKeeper is away")

    async def unimported_offsets(
        self, partition: int, partition_of: Callable[[str], int]
    ) -> dict[str, dict[tuple[str, int], int]]:
        if self.fail_reads:
            self.fail_reads -= 1
            raise self.failure
        return {
            g: o
            for g, o in self.offsets.items()
            if partition_of(g) == partition and g not in self.marked
        }

    async def mark_imported(self, group_id: str, partition: int) -> None:
        self.marked.append(group_id)


def test_zookeeper_offsets_are_imported_once_and_never_over_a_newer_commit() -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        legacy = FakeLegacy({GROUP: {("t", 0): 100, ("t", 1): 200}})
        plain = Broker(log, clock)
        await plain.lead()
        # A commit in the log (from a coordinator that ran before the import) is newer.
        await answered(plain.commit({("t", 1): OffsetAndMetadata(250)}))
        plain.manager.on_resigned(plain.partition)
        broker = Broker(log, clock, legacy=legacy)
        await broker.lead(epoch=2)
        fetched = await broker.fetch()
        assert {tp: v.offset for tp, v in fetched.items()} == {("t", 0): 100, ("t", 1): 250}
        assert legacy.marked == [GROUP]
        appends = log.appends
        again = Broker(log, clock, legacy=legacy)
        await again.lead(epoch=3)
        assert log.appends == appends  # marked: nothing imported twice
        assert {tp: v.offset for tp, v in (await again.fetch()).items()} == {
            ("t", 0): 100,
            ("t", 1): 250,
        }

    run(scenario)


def test_a_failed_import_keeps_the_partition_loading_and_is_retried() -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        legacy = FakeLegacy({GROUP: {("t", 0): 100}})
        legacy.fail_reads = 1
        broker = Broker(log, clock, legacy=legacy)
        broker.manager.on_elected(broker.partition, 1)
        await asyncio.sleep(0.2)
        assert broker.manager.status(GROUP) is ErrorCode.coordinator_load_in_progress
        await asyncio.sleep(1.2)
        assert broker.manager.status(GROUP) is None
        assert (await broker.fetch())[("t", 0)].offset == 100

    run(scenario)


@pytest.mark.parametrize(
    ("failure", "traceback"),
    [
        (SessionExpiredError("SessionExpiredError at /consumers"), False),
        (ConnectionLossError("ConnectionLossError at /consumers"), False),
        (ValueError("a defect"), True),
    ],
)
def test_a_load_failed_by_zookeeper_logs_one_line_and_others_a_traceback(
    failure: Exception, traceback: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        log, clock = FakeOffsetsLog(), Clock()
        legacy = FakeLegacy({GROUP: {("t", 0): 100}})
        legacy.fail_reads, legacy.failure = 1, failure
        broker = Broker(log, clock, legacy=legacy)
        broker.manager.on_elected(broker.partition, 1)
        await asyncio.sleep(0.2)

    with caplog.at_level(logging.WARNING, logger="odradek.coordinator.group.metadata_manager"):
        run(scenario)
    [record] = [r for r in caplog.records if "will retry" in r.getMessage()]
    assert (record.exc_info is not None) is traceback
    assert str(failure) in record.getMessage() or traceback


def test_an_offsets_only_group_is_listed_empty_without_protocol() -> None:
    group = GroupMetadata("solo")
    group.offsets.load(("t", 0), OffsetAndMetadata(3), 0)
    assert group.overview().state == "Empty" and group.overview().protocol_type == ""
    assert bool(group.offsets)


def test_the_zookeeper_importer_reads_old_znodes_and_marks_groups() -> None:
    from odradek.coordinator.group.placement import partition_for
    from odradek.coordinator.group.zk_import import ZkLegacyOffsets, imported_marker_path
    from odradek.coordinator.group.zk_offsets import ConsumerOffsetZNode
    from tests.fakes.controller_zk import FakeZooKeeper

    async def scenario() -> None:
        tree = FakeZooKeeper()
        zk = tree.client()
        groups = {"g/slash": {("t", 0): 5, ("t", 1): 6}, "plain": {("u", 3): 7}}
        for group, offsets in groups.items():
            for (topic, partition), offset in offsets.items():
                await zk.create(
                    ConsumerOffsetZNode.path(group, topic, partition),
                    ConsumerOffsetZNode.encode(offset),
                    makepath=True,
                )
        await zk.create(ConsumerOffsetZNode.path("junk", "t", 0), b"not a number", makepath=True)
        legacy = ZkLegacyOffsets(zk)  # type: ignore[arg-type]

        def partition_of(group: str) -> int:
            return partition_for(group, 50)

        found: dict[str, Any] = {}
        for partition in {partition_of(g) for g in [*groups, "junk"]}:
            found.update(await legacy.unimported_offsets(partition, partition_of))
        assert found == {**groups, "junk": {}}
        await legacy.mark_imported("g/slash", partition_of("g/slash"))
        assert tree.exists(imported_marker_path("g/slash")) is not None
        assert await legacy.unimported_offsets(partition_of("g/slash"), partition_of) == (
            {"plain": groups["plain"]} if partition_of("plain") == partition_of("g/slash") else {}
        )

    run(scenario)
