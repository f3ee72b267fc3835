"""Fetch sessions (KIP-227): the leader's session cache and contexts, and the fetcher's handler."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from odradek.cluster.fetch_session_handler import FetchSessionHandler, PartitionParams
from odradek.server.fetch_session import (
    EVICTION_MS,
    CachedPartition,
    ContextKind,
    FetchManager,
    FetchSessionCache,
    PartitionFetch,
    next_epoch,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def manager(slots: int = 10) -> tuple[FetchManager, Clock]:
    clock = Clock()
    return FetchManager(FetchSessionCache(slots, rng=random.Random(7)), clock), clock


def fetch(offset: int = 0) -> PartitionFetch:
    return PartitionFetch(offset, 1024)


OK = (0, 10, 0, False)  # (records size, HW, log start, error?)


def open_session(m: FetchManager, partitions: int, follower: bool = False) -> int:
    data = {("t", p): fetch() for p in range(partitions)}
    context = m.new_context(12, 0, 0, follower, data, [])
    session_id, included = context.respond(dict.fromkeys(data, OK))
    assert included == list(data)
    return session_id


def test_next_epoch_wraps_and_final_stays_final() -> None:
    assert next_epoch(0) == 1
    assert next_epoch(0x7FFFFFFF) == 1
    assert next_epoch(-1) == -1


def test_full_then_incremental_answers_only_changes() -> None:
    m, _clock = manager()
    session_id = open_session(m, 3)
    assert session_id != 0
    context = m.new_context(12, session_id, 1, False, {}, [])
    assert context.kind is ContextKind.INCREMENTAL
    assert list(context.partitions) == [("t", 0), ("t", 1), ("t", 2)]
    # Nothing changed: nothing answered.
    assert context.respond(dict.fromkeys(context.partitions, OK)) == (session_id, [])
    # Records, a new HW, a new log start offset and errors are answered.
    context = m.new_context(12, session_id, 2, False, {}, [])
    results = {
        ("t", 0): (5, 10, 0, False),
        ("t", 1): (0, 11, 0, False),
        ("t", 2): (0, -1, -1, True),
    }
    assert context.respond(results) == (session_id, [("t", 0), ("t", 1), ("t", 2)])
    # The partition that returned records moved to the end; the errored one is re-sent once well.
    context = m.new_context(12, session_id, 3, False, {}, [])
    assert list(context.partitions) == [("t", 1), ("t", 2), ("t", 0)]
    results = {("t", 0): OK, ("t", 1): (0, 11, 0, False), ("t", 2): OK}
    assert context.respond(results) == (session_id, [("t", 2)])


def test_incremental_request_updates_adds_and_forgets() -> None:
    m, _clock = manager()
    session_id = open_session(m, 2)
    context = m.new_context(
        12, session_id, 1, False, {("t", 1): fetch(7), ("u", 0): fetch(3)}, [("t", 0)]
    )
    assert context.partitions == {("t", 1): fetch(7), ("u", 0): fetch(3)}
    # Forgetting everything closes the session: the request is answered without one.
    context = m.new_context(12, session_id, 2, False, {}, [("t", 1), ("u", 0)])
    assert context.kind is ContextKind.SESSIONLESS
    assert m.cache.get(session_id) is None


def test_session_errors() -> None:
    m, _clock = manager()
    session_id = open_session(m, 1)
    assert m.new_context(12, session_id + 1, 1, False, {}, []).error == (
        ErrorCode.fetch_session_id_not_found
    )
    assert m.new_context(12, session_id, 5, False, {}, []).error == (
        ErrorCode.invalid_fetch_session_epoch
    )
    assert m.new_context(13, session_id, 1, False, {}, []).error == (
        ErrorCode.fetch_session_topic_id_error
    )
    # Errors do not move the session on: the right epoch still works.
    assert m.new_context(12, session_id, 1, False, {}, []).kind is ContextKind.INCREMENTAL


def test_overtaken_request_answers_invalid_epoch() -> None:
    m, _clock = manager()
    session_id = open_session(m, 1)
    first = m.new_context(12, session_id, 1, False, {}, [])
    second = m.new_context(12, session_id, 2, False, {}, [])
    assert second.respond({("t", 0): OK}) == (session_id, [])
    assert first.respond({("t", 0): OK}) == (0, [])
    assert first.error == ErrorCode.invalid_fetch_session_epoch


def test_full_request_closes_named_session_and_final_epoch_makes_none() -> None:
    m, _clock = manager()
    session_id = open_session(m, 1)
    context = m.new_context(12, session_id, -1, False, {("t", 0): fetch()}, [])
    assert context.kind is ContextKind.SESSIONLESS
    assert context.respond({("t", 0): OK}) == (0, [("t", 0)])
    assert m.cache.get(session_id) is None
    assert m.new_context(6, 0, 0, False, {("t", 0): fetch()}, []).kind is ContextKind.SESSIONLESS


def test_full_cache_no_slot_for_an_equal_young_session() -> None:
    m, _clock = manager(slots=1)
    open_session(m, 5)
    data = {("t", p): fetch() for p in range(5)}
    context = m.new_context(12, 0, 0, False, data, [])
    assert context.respond(dict.fromkeys(data, OK))[0] == 0
    assert len(m.cache) == 1


def test_follower_evicts_young_consumer_session_but_not_another_follower() -> None:
    m, _clock = manager(slots=1)
    consumer = open_session(m, 100)
    follower = open_session(m, 1, follower=True)
    assert follower != 0 and m.cache.get(consumer) is None
    assert open_session(m, 1000, follower=True) == 0  # a young privileged session stays


def test_stale_session_is_evicted_by_anyone() -> None:
    m, clock = manager(slots=1)
    follower = open_session(m, 100, follower=True)
    clock.now += EVICTION_MS + 1
    consumer = open_session(m, 1)
    assert consumer != 0 and m.cache.get(follower) is None


def test_old_session_is_evicted_by_a_larger_one_only() -> None:
    m, clock = manager(slots=1)
    first = open_session(m, 10)
    clock.now += EVICTION_MS + 1
    assert m.new_context(12, first, 1, False, {}, []).kind is ContextKind.INCREMENTAL  # touched
    assert open_session(m, 5) == 0  # smaller: not worth more
    second = open_session(m, 20)
    assert second != 0 and m.cache.get(first) is None
    assert m.cache.evictions == 1


def test_cached_partition_forgets_hw_after_error() -> None:
    cached = CachedPartition(fetch(), 10, 0)
    assert cached.must_respond(0, -1, -1, True)
    assert cached.must_respond(0, 10, 0, False)  # the error cleared: sent again
    assert not cached.must_respond(0, 10, 0, False)


def params(offset: int) -> PartitionParams:
    return PartitionParams(offset, 0, 1024, 3, 2)


def test_handler_sends_full_then_only_changes() -> None:
    handler = FetchSessionHandler()
    first = handler.build({("t", 0): params(0), ("t", 1): params(0)})
    assert first.full and first.session_id == 0 and len(first.to_send) == 2
    handler.handle_response(False, 42)
    second = handler.build({("t", 0): params(5), ("t", 1): params(0)})
    assert (second.session_id, second.epoch) == (42, 1)
    assert second.to_send == {("t", 0): params(5)} and second.to_forget == []
    handler.handle_response(False, 42)
    third = handler.build({("t", 0): params(5)})
    assert third.epoch == 2 and third.to_send == {} and third.to_forget == [("t", 1)]
    handler.handle_response(True, 0)  # an error: start over, closing session 42
    fourth = handler.build({("t", 0): params(5)})
    assert fourth.full and fourth.session_id == 42 and fourth.to_send == {("t", 0): params(5)}
    handler.handle_response(False, 0)  # no slot: full requests again
    assert handler.build({("t", 0): params(5)}).full


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.integers(0, 5), st.integers(0, 3), max_size=6),
            st.dictionaries(st.integers(0, 5), st.integers(0, 3)),
            st.booleans(),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_handler_and_cache_agree_with_full_fetches(
    rounds: list[tuple[dict[int, int], dict[int, int], bool]],
) -> None:
    """Whatever the fetcher wants and the logs hold, an incremental exchange leaves the fetcher
    knowing what a full fetch would have told it (each partition's HW), and the leader reads
    exactly the partitions the fetcher wants, at the offsets it wants."""
    m, _clock = manager()
    handler = FetchSessionHandler()
    known: dict[tuple[str, int], int] = {}
    for wanted_offsets, high_watermarks, drop in rounds:
        wanted = {("t", p): params(o) for p, o in wanted_offsets.items()}
        request = handler.build(wanted)
        data = {k: PartitionFetch(v.fetch_offset, v.max_bytes) for k, v in request.to_send.items()}
        context = m.new_context(
            12, request.session_id, request.epoch, True, data, request.to_forget
        )
        if context.kind is ContextKind.ERROR:
            handler.handle_response(True, 0)
            continue
        if wanted:
            assert {k: v.fetch_offset for k, v in context.partitions.items()} == {
                k: v.fetch_offset for k, v in wanted.items()
            }
        results = {k: (0, high_watermarks.get(k[1], 0), 0, False) for k in context.partitions}
        session_id, included = context.respond(results)
        if drop:  # the response is lost
            handler.reset()
            continue
        handler.handle_response(False, session_id)
        for key in included:
            known[key] = results[key][1]
        for key in wanted:
            assert known.get(key) == results[key][1]
