"""A replica fetcher whose leader refuses a partition: it asks again after
`replica.fetch.backoff.ms`, never in a tight loop, and says so in the log once per error (a soak
round once ended with a follower that never rejoined the ISR and nothing in either log to say
why)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from odradek.cluster.fetcher import ReplicaFetcher

BACKOFF_MS = 100


class Manager:
    broker_id = 2
    security = None
    throttle = None

    def __init__(self) -> None:
        self.config = {
            "replica.fetch.backoff.ms": BACKOFF_MS,
            "replica.socket.timeout.ms": 1000,
            "replica.fetch.wait.max.ms": 500,
            "replica.fetch.max.bytes": 1 << 20,
        }

    def broker_epoch(self) -> int:
        return 7

    def topic_id_for(self, topic: str) -> None:
        return None  # the fetch itself is not what these tests look at


class RefusingLeader:
    """A connection whose leader answers OffsetsForLeaderEpoch with FENCED_LEADER_EPOCH, the
    first `refusals` times (all of them by default), then with the follower's own epoch."""

    closed = False

    def __init__(self, refusals: int = 1_000_000) -> None:
        self.asked = 0
        self.refusals = refusals

    async def send(self, api_key: int, version: int, request: Any, timeout: float = 30) -> Any:
        self.asked += 1
        refused = self.asked <= self.refusals
        partitions = [
            SimpleNamespace(
                partition=p.partition,
                error_code=ErrorCode.fenced_leader_epoch if refused else ErrorCode.none,
                leader_epoch=-1 if refused else 13,
                end_offset=-1 if refused else 100,
            )
            for t in request.topics
            for p in t.partitions
        ]
        return SimpleNamespace(topics=[SimpleNamespace(topic="t", partitions=partitions)])

    def close(self) -> None:
        self.closed = True


def follower_partition() -> Any:
    log = SimpleNamespace(leader_epoch_cache=SimpleNamespace(latest_epoch=13), log_end_offset=100)
    return SimpleNamespace(
        topic="t", partition=0, leader_epoch=13, log=log, high_watermark=90, log_end_offset=100
    )


def test_a_refused_truncation_is_retried_after_the_backoff_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="odradek.cluster.fetcher")
    leader = asyncio.run(run_against_a_refusing_leader())
    # About one request per backoff (5 or 6 here); a tight loop sends thousands.
    assert 2 <= leader.asked <= 10, leader.asked
    refusals = [r for r in caplog.records if "fenced_leader_epoch" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]
    assert "OffsetsForLeaderEpoch" in refusals[0].getMessage()


async def run_against_a_refusing_leader(refusals: int = 1_000_000) -> RefusingLeader:
    fetcher = ReplicaFetcher(Manager(), 1, ("127.0.0.1", 9), 0)  # type: ignore[arg-type]
    leader = RefusingLeader(refusals)
    fetcher._connection = leader  # type: ignore[assignment]
    try:
        fetcher.add(follower_partition())  # type: ignore[arg-type]
        await asyncio.sleep(5 * BACKOFF_MS / 1000)
    finally:
        await fetcher.close()
    return leader


def test_a_partition_the_leader_answers_again_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="odradek.cluster.fetcher")
    leader = asyncio.run(run_against_a_refusing_leader(refusals=2))
    assert leader.asked == 3  # two refusals, then the truncation completes
    lines = [r.getMessage() for r in caplog.records]
    again = [line for line in lines if "answers again" in line]
    assert len(again) == 1 and "fenced_leader_epoch" in again[0], lines


def test_many_partitions_refused_alike_are_one_line_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A leader refusing a dozen partitions in one answer (say, a new topic it has not heard of
    yet) gives one line naming the first few, not a line per partition; and one when it
    answers them again."""
    caplog.set_level(logging.INFO, logger="odradek.cluster.fetcher")

    async def run() -> RefusingLeader:
        fetcher = ReplicaFetcher(Manager(), 1, ("127.0.0.1", 9), 0)  # type: ignore[arg-type]
        leader = RefusingLeader(refusals=1)
        fetcher._connection = leader  # type: ignore[assignment]
        try:
            for index in range(12):
                partition = follower_partition()
                partition.partition = index
                fetcher.add(partition)  # type: ignore[arg-type]
            await asyncio.sleep(5 * BACKOFF_MS / 1000)
        finally:
            await fetcher.close()
        return leader

    asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records]
    refused = [line for line in lines if "retrying after backoff" in line]
    again = [line for line in lines if "answers again" in line]
    assert refused == [
        "OffsetsForLeaderEpoch answered fenced_leader_epoch by leader 1 for 12 partitions "
        "(t-0, t-1, t-2, t-3, t-4 and 7 more); retrying after backoff"
    ], lines
    assert len(again) == 1, lines
    assert again[0].startswith("leader 1 answers again for 12 partitions (t-0, t-1, t-2, t-3, t-4")
    assert again[0].endswith("of fenced_leader_epoch"), again
