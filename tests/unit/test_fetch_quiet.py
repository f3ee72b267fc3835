"""Quiet partitions of a follower's fetch session (`server/fetch_quiet.py`,
`PartitionIsr.quiet_follower_token`): which reads an idle follower's fetch may skip, and that
skipping them records the fetch as the read would have.

The partitions are `test_partition`'s (a fake log, an explicit clock); the session is the real
`FetchManager`'s."""

from __future__ import annotations

import asyncio
import random

import pytest

from odradek.cluster.isr import PendingShrinkIsr
from odradek.cluster.partition import Partition, PartitionStateInfo, ReadResult
from odradek.server.fetch_quiet import (
    answered,
    mark_quiet,
    recheck,
    recheck_interval,
    still_quiet,
)
from odradek.server.fetch_session import (
    CachedPartition,
    ContextKind,
    FetchManager,
    FetchSession,
    FetchSessionCache,
    PartitionFetch,
)
from tests.unit.test_partition import LAG_MS, append, make_partition, run, settle

FOLLOWER = 2
BASIS = (7, 7)


def caught_up(offset: int = 5) -> tuple[Partition, object]:
    """A leader with LEO `offset` whose follower 2 and 3 fetched at it (in sync, HW = LEO)."""
    partition, log, _, _ = make_partition()
    append(partition, offset)
    for follower in (2, 3):
        partition.update_follower_fetch_state(follower, offset, now=1.0)
    assert partition.high_watermark == offset
    return partition, log


def test_a_token_only_for_an_in_sync_follower_at_the_leo() -> None:
    partition, _ = caught_up()
    assert partition.quiet_follower_token(FOLLOWER, 5) is not None
    assert partition.quiet_follower_token(FOLLOWER, 4) is None  # not the LEO
    assert partition.quiet_follower_token(9, 5) is None  # not a follower
    partition.fenced = True
    assert partition.quiet_follower_token(FOLLOWER, 5) is None
    partition.fenced = False
    partition.isr_state = PendingShrinkIsr(partition.isr, frozenset({3}))
    assert partition.quiet_follower_token(FOLLOWER, 5) is None  # an ISR change in flight


def test_no_token_before_the_followers_fetch_was_counted() -> None:
    partition, _, _, _ = make_partition()
    append(partition, 5)
    # The follower's state says -1 until a fetch is counted: the read must happen (it moves
    # the HW), so it is never skipped.
    assert partition.quiet_follower_token(FOLLOWER, 5) is None


def test_no_token_for_a_follower_outside_the_isr() -> None:
    partition, _, _, _ = make_partition(isr=(1, 3))
    append(partition, 5)
    partition.update_follower_fetch_state(3, 5, now=1.0)
    partition.followers[FOLLOWER].log_end_offset = 5
    assert partition.quiet_follower_token(FOLLOWER, 5) is None  # the read may expand the ISR


@pytest.mark.parametrize(
    "change",
    ["append", "hw", "log_start", "leader_epoch", "isr", "assignment", "closed", "follower"],
)
def test_anything_a_fetch_depends_on_changes_the_token(change: str) -> None:
    partition, log = caught_up()
    token = partition.quiet_follower_token(FOLLOWER, 5)
    if change == "append":
        append(partition, 1)
    elif change == "hw":
        partition.high_watermark = 4
    elif change == "log_start":
        log.log_start_offset = 2  # type: ignore[attr-defined]
    elif change == "leader_epoch":
        partition.make_leader(PartitionStateInfo(2, 1, 6, (1, 2, 3), 11, (1, 2, 3)), now=2.0)
    elif change == "isr":
        partition.make_leader(PartitionStateInfo(2, 1, 5, (1, 2), 11, (1, 2, 3)), now=2.0)
    elif change == "assignment":
        partition.make_leader(PartitionStateInfo(2, 1, 5, (1, 2, 3), 11, (1, 2, 3, 4)), now=2.0)
    elif change == "closed":
        log.closed = True  # type: ignore[attr-defined]
    elif change == "follower":
        partition.make_follower(PartitionStateInfo(2, 3, 6, (1, 2, 3), 11, (1, 2, 3)))
    after = partition.quiet_follower_token(FOLLOWER, 5)
    assert after != token
    before = partition.followers.get(FOLLOWER)
    seen = before.last_fetch_time if before else None
    assert not partition.refresh_quiet_follower(FOLLOWER, 5, -1, token, now=9.0)  # type: ignore[arg-type]
    if before is not None:
        assert before.last_fetch_time == seen  # nothing recorded


def test_a_refresh_records_the_fetch_so_the_follower_stays_in_sync() -> None:
    async def body() -> None:
        partition, _ = caught_up()
        token = partition.quiet_follower_token(FOLLOWER, 5)
        assert token is not None
        late = 1.0 + LAG_MS / 1000 + 5
        for now in (3.0, late - 1):
            assert partition.refresh_quiet_follower(FOLLOWER, 5, -1, token, now)
        partition.update_follower_fetch_state(3, 5, now=late - 1)
        assert partition.followers[FOLLOWER].last_caught_up_time == late - 1
        partition.maybe_shrink_isr(late)
        assert partition.isr == frozenset({1, 2, 3})  # refreshed, not dropped
        # A follower that stops fetching is refreshed by nothing: it leaves the ISR.
        partition.update_follower_fetch_state(3, 5, now=late + LAG_MS / 1000)
        partition.maybe_shrink_isr(late + LAG_MS / 1000 + 0.5)
        assert isinstance(partition.isr_state, PendingShrinkIsr)
        assert partition.isr_state.out_of_sync_replicas == frozenset({FOLLOWER})
        await settle()

    run(body)


def test_a_refresh_changes_what_a_fetch_at_the_same_offset_would() -> None:
    refreshed, _ = caught_up()
    fetched, _ = caught_up()
    token = refreshed.quiet_follower_token(FOLLOWER, 5)
    assert token is not None
    for now, log_start in ((4.0, -1), (6.5, 0), (9.0, 0)):
        assert refreshed.refresh_quiet_follower(FOLLOWER, 5, log_start, token, now)
        fetched.update_follower_fetch_state(FOLLOWER, 5, now, log_start)
        assert refreshed.followers == fetched.followers
        assert refreshed.isr_state == fetched.isr_state
        assert refreshed.high_watermark == fetched.high_watermark


# -- marks on the session ------------------------------------------------------------------------


def open_session(keys: list[tuple[str, int]]) -> tuple[FetchManager, int, FetchSession]:
    """A follower's session of `keys`, each fetched at 5 with the high watermark 5."""
    manager = FetchManager(FetchSessionCache(10, rng=random.Random(3)), lambda: 0)
    context = manager.new_context(12, 0, 0, True, {k: PartitionFetch(5, 1024) for k in keys}, [])
    session_id, _ = context.respond(dict.fromkeys(keys, (0, 5, 0, False)))
    session = manager.cache.get(session_id)
    assert session is not None
    return manager, session_id, session


def session_with(partition: Partition, offset: int) -> FetchSession:
    manager = FetchManager(FetchSessionCache(10, rng=random.Random(3)), lambda: 0)
    key = ("t", 0)
    context = manager.new_context(12, 0, 0, True, {key: PartitionFetch(offset, 1024)}, [])
    session_id, _ = context.respond({key: (0, partition.high_watermark, 0, False)})
    session = manager.cache.get(session_id)
    assert session is not None
    return session


def read(partition: Partition, records: bytes = b"") -> ReadResult:
    return ReadResult(records, partition.high_watermark, 0, partition.log_end_offset)


def mark(
    session: FetchSession, partition: Partition, outcome: object, counted: bool = True
) -> None:
    mark_quiet(
        session,
        BASIS,
        {("t", 0): outcome},  # type: ignore[dict-item]
        {"t": "t"},
        {("t", 0): partition},
        {("t", 0)} if counted else set(),
        FOLLOWER,
    )


def test_an_empty_read_at_the_leo_is_marked_and_then_skipped() -> None:
    partition, _ = caught_up()
    session = session_with(partition, 5)
    mark(session, partition, read(partition))
    cached = session.partitions[("t", 0)]
    assert cached.quiet is not None and session.quiet_basis == BASIS
    assert still_quiet(cached, partition, FOLLOWER, now=4.0) is partition
    assert partition.followers[FOLLOWER].last_caught_up_time == 4.0
    append(partition, 1)  # new data: read again
    assert still_quiet(cached, partition, FOLLOWER, now=5.0) is None
    assert still_quiet(cached, None, FOLLOWER, now=5.0) is None  # no longer hosted


@pytest.mark.parametrize("why", ["records", "error", "not counted", "stale answer", "behind"])
def test_what_is_not_marked(why: str) -> None:
    partition, _ = caught_up()
    offset = 4 if why == "behind" else 5
    session = session_with(partition, offset)
    outcome: object = read(partition)
    if why == "records":
        outcome = read(partition, b"x")
    elif why == "error":
        from kio.schema.errors import ErrorCode

        outcome = ErrorCode.not_leader_or_follower
    elif why == "stale answer":  # a delayed fetch answers with its first read; HW moved since
        outcome = ReadResult(b"", 4, 0, 5)
    mark(session, partition, outcome, counted=why != "not counted")
    assert session.partitions[("t", 0)].quiet is None


def test_new_fetch_parameters_clear_the_mark() -> None:
    partition, _ = caught_up()
    key = ("t", 0)
    manager, session_id, session = open_session([key])
    mark(session, partition, read(partition))
    assert session.partitions[key].quiet is not None
    context = manager.new_context(12, session_id, 1, True, {key: PartitionFetch(5, 2048)}, [])
    assert context.kind is ContextKind.INCREMENTAL
    assert session.partitions[key].quiet is None


def test_cached_partition_starts_unmarked() -> None:
    assert CachedPartition(PartitionFetch(0, 1)).quiet is None


# -- what an incremental fetch walks -------------------------------------------------------------


def test_the_answer_holds_the_read_partitions_then_those_read_on_wake() -> None:
    names = {"t": "t"}
    read_keys = [("t", 0), ("t", 2), ("t", 5)]
    results = {("t", i): object() for i in (0, 2, 5)}
    assert answered(read_keys, [], results, names) is read_keys  # nothing woke the fetch
    # A change to ("t", 3) and ("t", 1) woke it; ("t", 1) was not read (no longer hosted).
    woken = {**results, ("t", 3): object()}
    assert answered(read_keys, [("t", 3), ("t", 1)], woken, names) == [*read_keys, ("t", 3)]


def test_an_incremental_answer_leaves_out_and_keeps_what_was_not_read() -> None:
    """`respond` walks only the partitions read: one left out (quiet) is not answered and what
    the session remembers of it does not change."""
    manager = FetchManager(FetchSessionCache(10, rng=random.Random(3)), lambda: 0)
    keys = [("t", i) for i in range(3)]
    context = manager.new_context(12, 0, 0, True, {k: PartitionFetch(5, 1024) for k in keys}, [])
    session_id, _ = context.respond(dict.fromkeys(keys, (0, 5, 0, False)))
    session = manager.cache.get(session_id)
    assert session is not None
    context = manager.new_context(12, session_id, 1, True, {}, [])
    assert list(context.partitions) == keys
    # ("t", 1) not read; ("t", 0) has records, ("t", 2) a new high watermark.
    answer = context.respond({("t", 0): (10, 5, 0, False), ("t", 2): (0, 6, 0, False)})
    assert answer == (session_id, [("t", 0), ("t", 2)])
    assert session.partitions[("t", 1)].high_watermark == 5
    assert list(session.partitions) == [("t", 1), ("t", 2), ("t", 0)]  # records: to the end


# -- change notification -------------------------------------------------------------------------


def marked_session() -> tuple[Partition, object, FetchSession]:
    partition, log = caught_up()
    session = session_with(partition, 5)
    mark(session, partition, read(partition))
    assert ("t", 0) not in session.awake  # not walked by the next fetch
    return partition, log, session


@pytest.mark.parametrize("change", ["append", "isr", "role", "fence", "delete_records"])
def test_a_change_to_a_marked_partition_wakes_its_session(change: str) -> None:
    async def body() -> None:
        partition, _, session = marked_session()
        waiter = asyncio.get_running_loop().create_future()
        session.register_data_waiter(waiter)
        if change == "append":
            append(partition, 1)
        elif change == "isr":
            partition.isr_state = PendingShrinkIsr(partition.isr, frozenset({3}))
        elif change == "role":
            partition.make_follower(PartitionStateInfo(2, 3, 6, (1, 2, 3), 11, (1, 2, 3)))
        elif change == "fence":
            partition.fence("test")
        elif change == "delete_records":
            partition.delete_records_on_leader(3)
        cached = session.partitions[("t", 0)]
        assert cached.quiet is None
        assert ("t", 0) in session.awake and session.woken == [("t", 0)]
        assert waiter.done()  # a delayed fetch of the session wakes and reads it
        # Told once: the mark is gone, and so is the partition's watcher.
        append(partition, 1) if change == "append" else partition.wake_quiet()
        assert session.woken == [("t", 0)]

    run(body)


def test_a_wake_for_a_mark_made_since_on_another_partition_is_ignored() -> None:
    """A mark dropped and made again on another partition object (the topic recreated) is not
    dropped by the old partition's change."""
    old, _, session = marked_session()
    new, _ = caught_up()
    cached = session.partitions[("t", 0)]
    session.unmark(("t", 0), cached)
    mark(session, new, read(new))
    old.wake_quiet()
    assert cached.quiet is not None and cached.quiet[0] is new


def test_the_recheck_records_quiet_fetches_and_drops_what_changed_untold() -> None:
    partition, log, session = marked_session()
    follower = partition.followers[FOLLOWER]
    recheck(session, lambda topic: topic, {("t", 0): partition}, FOLLOWER, now=7.0)
    assert follower.last_caught_up_time == 7.0  # still quiet: caught up now
    assert ("t", 0) not in session.awake
    log.log_start_offset = 2  # type: ignore[attr-defined]  # retention: no notification
    recheck(session, lambda topic: topic, {("t", 0): partition}, FOLLOWER, now=8.0)
    assert session.partitions[("t", 0)].quiet is None and ("t", 0) in session.awake
    assert follower.last_caught_up_time == 7.0


def test_the_recheck_comes_well_inside_the_lag_time() -> None:
    assert recheck_interval(30_000) == 5.0
    assert recheck_interval(3_000) == 0.75


def test_marks_of_another_basis_are_all_dropped() -> None:
    _, _, session = marked_session()
    session.unmark_all()
    assert session.partitions[("t", 0)].quiet is None
    assert list(session.awake) == [("t", 0)]


def test_new_parameters_or_a_forgotten_partition_keep_the_walk_in_step() -> None:
    partition, _ = caught_up()
    keys = [("t", 0), ("t", 1)]
    manager, session_id, session = open_session(keys)
    assert list(session.awake) == keys
    mark(session, partition, read(partition))
    assert list(session.awake) == [("t", 1)]
    manager.new_context(12, session_id, 1, True, {("t", 0): PartitionFetch(6, 1024)}, [])
    assert list(session.awake) == [("t", 1), ("t", 0)]
    manager.new_context(12, session_id, 2, True, {}, [("t", 1)])
    assert list(session.awake) == [("t", 0)]


def test_a_dropped_mark_or_a_closed_session_is_no_longer_told() -> None:
    """The partition keeps a session only while the session marks it: a mark dropped by new
    parameters, a forgotten partition or the session's end lets the partition forget it."""
    partition, _ = caught_up()
    key = ("t", 0)
    manager, session_id, session = open_session([key])
    for drop in ("parameters", "forgotten", "closed"):
        mark(session, partition, read(partition))
        assert len(partition._quiet_watchers) == 1
        if drop == "parameters":
            manager.new_context(12, session_id, 1, True, {key: PartitionFetch(5, 2048)}, [])
        elif drop == "forgotten":
            manager.new_context(12, session_id, 2, True, {("t", 1): PartitionFetch(0, 1)}, [key])
            session.partitions[key] = CachedPartition(PartitionFetch(5, 1024))  # back, for the next
        else:
            manager.cache.remove(session_id)
        assert partition._quiet_watchers == {}, drop
