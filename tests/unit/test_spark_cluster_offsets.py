"""`ClusterOffsets.list_offsets` with an admin client whose answers never come: the driver's
view of the cluster gives up on those partitions within its deadline (a streaming query would
otherwise stall in planning), retries them, and still returns the offsets that did come."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from confluent_kafka import TopicPartition as RdTopicPartition

from odradek.errors import RequestTimedOutError
from odradek.spark.clients import ClusterOffsets
from odradek.spark.offsets import TopicPartition


class _Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class SilentForSome:
    """An AdminClient stand-in: `list_offsets` answers offset 42 for every partition except
    those in `silent`, whose futures never complete."""

    def __init__(self, silent: set[int]) -> None:
        self.silent = silent
        self.requests: list[list[int]] = []

    def list_offsets(self, request: dict[RdTopicPartition, Any], **_: Any) -> dict[Any, Future]:
        self.requests.append(sorted(tp.partition for tp in request))
        futures: dict[Any, Future] = {}
        for tp in request:
            future: Future = Future()
            if tp.partition not in self.silent:
                future.set_result(_Answer(42))
            futures[tp] = future
        return futures


class _ViewOf(ClusterOffsets):
    """The view with the stand-in as its client, every time it asks for one (after a failure
    the view drops its client and creates a new one)."""

    def __init__(self, admin: SilentForSome) -> None:
        super().__init__("127.0.0.1:1", {}, retries=1, retry_interval_s=0, answer_timeout_s=0.2)
        self.stand_in = admin

    @property
    def admin(self) -> Any:
        return self.stand_in


def test_partitions_whose_answer_never_comes_fail_within_the_deadline_and_are_retried() -> None:
    admin = SilentForSome(silent={1, 2})
    view = _ViewOf(admin)
    partitions = [TopicPartition("t", p) for p in range(3)]

    started = time.monotonic()
    result = view.list_offsets(partitions, "latest")
    elapsed = time.monotonic() - started

    assert result.offsets == {TopicPartition("t", 0): 42}
    assert set(result.failed) == {TopicPartition("t", 1), TopicPartition("t", 2)}
    assert all(isinstance(e, RequestTimedOutError) for e in result.failed.values())
    assert "no answer within" in str(result.failed[TopicPartition("t", 1)])
    # One deadline per request, not one per partition; asked once more (retries=1).
    assert admin.requests == [[0, 1, 2], [1, 2]]
    assert elapsed < 10  # generous: two 0.2 s deadlines, never an unbounded wait
