"""`cluster/partition.py`'s high-watermark and ISR rules, without sockets or ZooKeeper: a fake log
(only offsets), a fake ISR writer (records each conditional write and answers as told), and an
explicit clock.

The rules (see `odradek.cluster.isr` and the partition's docstring): HW = min LEO over the maximal
ISR, never decreasing; a follower joins the ISR when it reaches the HW and the start of the current
leader epoch, and leaves it when it has not caught up for replica.lag.time.max.ms; every change is
written conditionally and is pending until the write returns; a refused write fences the leader;
acks=all needs min.insync.replicas in the committed ISR.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from odradek.cluster.isr import CommittedIsr, PendingExpandIsr, PendingShrinkIsr
from odradek.cluster.partition import Partition, PartitionStateInfo
from odradek.cluster.partition_isr import IsrUpdate
from odradek.errors import (
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
)

T = TypeVar("T")
LAG_MS = 10_000
LEADER = 1


class FakeEpochCache:
    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []

    def assign(self, leader_epoch: int, start_offset: int) -> None:
        self.entries.append((leader_epoch, start_offset))


class FakeLog:
    """Only what the partition reads: offsets, the epoch cache; an append of n bytes adds n records."""

    def __init__(self, log_end_offset: int = 0) -> None:
        self.log_end_offset = log_end_offset
        self.log_start_offset = 0
        self.closed = False
        self.leader_epoch_cache = FakeEpochCache()
        self.high_watermarks: list[int] = []

    def append_as_leader(
        self, records: bytes, leader_epoch: int, now_ms: int, **validation: Any
    ) -> int:
        self.log_end_offset += len(records)
        return self.log_end_offset

    def truncate_to(self, offset: int) -> None:
        self.log_end_offset = min(self.log_end_offset, offset)

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        return True

    def assign_leader_epoch(self, leader_epoch: int, start_offset: int) -> None:
        self.leader_epoch_cache.assign(leader_epoch, start_offset)

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        self.high_watermarks.append(high_watermark)


class FakeIsrWriter:
    """Records each write; answers `version` (None: the conditional write was refused), after
    `gate` is set when there is one."""

    def __init__(self) -> None:
        self.updates: list[IsrUpdate] = []
        self.version: int | None = 11
        self.gate: asyncio.Event | None = None

    async def __call__(self, update: IsrUpdate) -> int | None:
        self.updates.append(update)
        if self.gate is not None:
            await self.gate.wait()
        return self.version


def run(body: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(body())  # type: ignore[arg-type]


async def settle() -> None:
    """Let the ISR write task run to completion."""
    for _ in range(5):
        await asyncio.sleep(0)


def make_partition(
    replicas: tuple[int, ...] = (1, 2, 3),
    isr: tuple[int, ...] = (1, 2, 3),
    log_end_offset: int = 0,
    min_isr: int = 1,
    leader_epoch: int = 5,
) -> tuple[Partition, FakeLog, FakeIsrWriter, list[tuple[str, int]]]:
    log = FakeLog(log_end_offset)
    writer = FakeIsrWriter()
    changes: list[tuple[str, int]] = []
    partition = Partition(
        "t",
        0,
        LEADER,
        log,
        writer,
        lambda topic, p: changes.append((topic, p)),
        lambda: min_isr,
        LAG_MS,
    )
    partition.make_leader(
        PartitionStateInfo(
            controller_epoch=2,
            leader=LEADER,
            leader_epoch=leader_epoch,
            isr=isr,
            zk_version=10,
            replicas=replicas,
        ),
        now=0.0,
    )
    return partition, log, writer, changes


def append(partition: Partition, records: int, acks: int = 1) -> Any:
    return partition.append_records_to_leader(b"x" * records, acks, 0)


# --- high watermark -----------------------------------------------------------------------------


def test_a_single_replica_leader_commits_on_append() -> None:
    partition, log, _, _ = make_partition(replicas=(1,), isr=(1,))
    append(partition, 3)
    assert (log.log_end_offset, partition.high_watermark) == (3, 3)


def test_hw_is_the_minimum_leo_over_the_isr() -> None:
    partition, log, _, _ = make_partition()
    append(partition, 10)
    assert partition.high_watermark == 0  # no follower has fetched yet
    partition.update_follower_fetch_state(2, 7, now=1.0)
    assert partition.high_watermark == 0  # follower 3 holds it: not heard from yet
    partition.update_follower_fetch_state(3, 4, now=1.0)
    assert partition.high_watermark == 4
    partition.update_follower_fetch_state(3, 10, now=2.0)
    assert partition.high_watermark == 7
    partition.update_follower_fetch_state(2, 10, now=2.0)
    assert partition.high_watermark == 10
    assert log.high_watermarks == [4, 7, 10]  # the log (its producer state) hears of each move


def test_hw_never_decreases() -> None:
    partition, _, _, _ = make_partition()
    append(partition, 10)
    partition.update_follower_fetch_state(2, 10, now=1.0)
    partition.update_follower_fetch_state(3, 10, now=1.0)
    assert partition.high_watermark == 10
    partition.update_follower_fetch_state(3, 6, now=2.0)  # a follower that truncated, say
    assert partition.high_watermark == 10


def test_a_follower_outside_the_isr_does_not_hold_the_hw() -> None:
    partition, _, _, _ = make_partition(isr=(1, 2))
    append(partition, 5)
    partition.update_follower_fetch_state(2, 5, now=1.0)
    assert partition.high_watermark == 5


def test_follower_hw_is_the_leaders_hw_capped_by_its_own_leo_and_never_decreases() -> None:
    log = FakeLog(6)
    partition = Partition("t", 0, 2, log, FakeIsrWriter(), lambda t, p: None, lambda: 1, LAG_MS)
    partition.make_follower(
        PartitionStateInfo(
            controller_epoch=2, leader=1, leader_epoch=5, isr=(1, 2), zk_version=3, replicas=(1, 2)
        )
    )
    partition.update_follower_high_watermark(9)
    assert partition.high_watermark == 6
    partition.update_follower_high_watermark(4)
    assert partition.high_watermark == 6
    partition.truncate_to(5)
    assert partition.high_watermark == 5


# --- ISR expansion --------------------------------------------------------------------------------


def test_a_follower_that_reaches_the_hw_joins_the_isr() -> None:
    async def body() -> None:
        partition, _, writer, changes = make_partition(isr=(1, 2))
        append(partition, 4)
        partition.update_follower_fetch_state(2, 4, now=1.0)
        assert partition.high_watermark == 4
        partition.update_follower_fetch_state(3, 3, now=1.0)
        assert writer.updates == []  # below the HW: not in sync yet
        partition.update_follower_fetch_state(3, 4, now=1.0)
        assert partition.isr_state == PendingExpandIsr(frozenset({1, 2}), 3)
        await settle()
        (update,) = writer.updates
        assert (update.isr, update.zk_version, update.leader_epoch) == ((1, 2, 3), 10, 5)
        assert partition.isr_state == CommittedIsr(frozenset({1, 2, 3}))
        assert partition.partition_epoch == 11
        assert changes == [("t", 0)]

    run(body)


def test_expansion_waits_for_the_start_of_the_leader_epoch() -> None:
    """A follower that only has records of earlier epochs may still diverge: not in sync yet."""
    partition, _, writer, _ = make_partition(isr=(1,), log_end_offset=8)
    # The HW is 8 (RF in sync is 1); the epoch started at 8.
    assert (partition.high_watermark, partition.leader_epoch_start_offset) == (8, 8)

    async def body() -> None:
        partition.update_follower_fetch_state(2, 7, now=1.0)
        await settle()
        assert writer.updates == []
        partition.update_follower_fetch_state(2, 8, now=1.0)
        await settle()
        assert [u.isr for u in writer.updates] == [(1, 2)]

    run(body)


def test_while_an_expansion_is_pending_the_new_member_already_holds_the_hw() -> None:
    async def body() -> None:
        partition, _, writer, _ = make_partition(isr=(1, 2))
        writer.gate = asyncio.Event()
        append(partition, 4)
        partition.update_follower_fetch_state(2, 4, now=1.0)
        partition.update_follower_fetch_state(3, 4, now=1.0)  # expansion starts
        append(partition, 4)  # LEO 8
        partition.update_follower_fetch_state(2, 8, now=2.0)
        assert partition.isr == frozenset({1, 2})  # committed view: not yet
        assert partition.high_watermark == 4  # the maximal ISR includes 3, still at 4
        writer.gate.set()
        await settle()
        partition.update_follower_fetch_state(3, 8, now=2.0)
        assert partition.high_watermark == 8

    run(body)


# --- ISR shrink -----------------------------------------------------------------------------------


def test_a_follower_that_has_not_caught_up_for_the_lag_time_leaves_the_isr() -> None:
    async def body() -> None:
        partition, _, writer, changes = make_partition()
        append(partition, 5)
        partition.update_follower_fetch_state(2, 5, now=1.0)
        partition.update_follower_fetch_state(3, 2, now=1.0)
        assert partition.high_watermark == 2
        partition.maybe_shrink_isr(now=LAG_MS / 1000 - 1)  # within the lag time of make_leader
        assert writer.updates == []
        partition.maybe_shrink_isr(now=LAG_MS / 1000 + 0.5)
        assert partition.isr_state == PendingShrinkIsr(frozenset({1, 2, 3}), frozenset({3}))
        assert partition.high_watermark == 2  # the leaving member holds it until ZooKeeper agrees
        await settle()
        assert [u.isr for u in writer.updates] == [(1, 2)]
        assert partition.isr == frozenset({1, 2})
        assert partition.high_watermark == 5  # released by the committed shrink
        assert changes == [("t", 0)]

    run(body)


def test_caught_up_means_having_what_the_leader_had_at_the_previous_fetch() -> None:
    partition, _, _, _ = make_partition()
    append(partition, 5)
    partition.update_follower_fetch_state(3, 5, now=3.0)  # reaches the LEO: caught up at 3.0
    append(partition, 5)
    partition.update_follower_fetch_state(3, 5, now=8.0)  # behind now, but had all at 3.0
    assert partition.followers[3].last_caught_up_time == 3.0
    partition.update_follower_fetch_state(3, 10, now=9.0)  # what the leader had at 8.0
    assert partition.followers[3].last_caught_up_time == 9.0


def test_only_one_isr_change_at_a_time() -> None:
    async def body() -> None:
        partition, _, writer, _ = make_partition()
        writer.gate = asyncio.Event()
        append(partition, 5)
        partition.maybe_shrink_isr(now=LAG_MS / 1000 + 1)  # 2 and 3 never fetched
        await asyncio.sleep(0)
        assert partition.isr_state.is_pending
        partition.maybe_shrink_isr(now=LAG_MS / 1000 + 2)  # ignored: a change is in flight
        await asyncio.sleep(0)
        assert [u.isr for u in writer.updates] == [(1,)]
        writer.gate.set()
        await settle()
        assert partition.isr == frozenset({1})

    run(body)


# --- zombie leaders and min.insync.replicas -------------------------------------------------------


def test_a_refused_isr_write_fences_the_leader() -> None:
    async def body() -> None:
        partition, _, writer, changes = make_partition()
        writer.version = None  # the controller changed the partition state meanwhile
        append(partition, 5)
        partition.maybe_shrink_isr(now=LAG_MS / 1000 + 1)
        await settle()
        assert partition.fenced
        assert partition.isr_state == CommittedIsr(frozenset({1, 2, 3}))
        assert changes == []
        with pytest.raises(NotLeaderOrFollowerError):
            append(partition, 1)

    run(body)


def test_acks_all_needs_min_insync_replicas_in_the_committed_isr() -> None:
    partition, _, _, _ = make_partition(isr=(1, 2), min_isr=3)
    with pytest.raises(NotEnoughReplicasError):
        append(partition, 1, acks=-1)
    append(partition, 1, acks=1)  # acks=1 does not care


def test_an_acks_all_waiter_completes_when_the_hw_passes_its_offset() -> None:
    async def body() -> None:
        partition, _, _, _ = make_partition(isr=(1, 2), min_isr=2)
        append(partition, 5, acks=-1)
        waiter = partition.wait_for_high_watermark(5)
        partition.update_follower_fetch_state(2, 3, now=1.0)
        assert not waiter.done()
        partition.update_follower_fetch_state(2, 5, now=1.0)
        assert waiter.done() and waiter.exception() is None

    run(body)


def test_an_acks_all_waiter_fails_if_the_isr_shrank_below_the_minimum() -> None:
    async def body() -> None:
        partition, _, _, _ = make_partition(isr=(1, 2), min_isr=2)
        append(partition, 5, acks=-1)
        waiter = partition.wait_for_high_watermark(5)
        partition.maybe_shrink_isr(now=LAG_MS / 1000 + 1)  # 2 never fetched: it leaves
        await settle()
        assert partition.isr == frozenset({1})
        assert waiter.done()
        with pytest.raises(NotEnoughReplicasAfterAppendError):
            waiter.result()

    run(body)


def test_becoming_follower_fails_the_acks_all_waiters() -> None:
    async def body() -> None:
        partition, _, _, _ = make_partition(isr=(1, 2))
        append(partition, 5, acks=-1)
        waiter = partition.wait_for_high_watermark(5)
        partition.make_follower(
            PartitionStateInfo(
                controller_epoch=3,
                leader=2,
                leader_epoch=6,
                isr=(2,),
                zk_version=12,
                replicas=(1, 2),
            )
        )
        with pytest.raises(NotLeaderOrFollowerError):
            waiter.result()

    run(body)
