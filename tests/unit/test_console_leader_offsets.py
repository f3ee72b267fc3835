"""The topic page's high watermarks (`odradek.console.leader_offsets`) without a cluster: the
request and answer of one leader, the ask-again rule against a fake cluster whose leaders have
moved since the caller's snapshot, and the page asking for its own partitions at the snapshot's
leaders and showing each one's error (tests/integration/test_console.py asks real brokers)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode
from starlette.testclient import TestClient

from odradek.admin.client import KafkaResponseError
from odradek.console.app import ConsoleSettings, create_app
from odradek.console.leader_offsets import (
    LeaderOffsets,
    LeaderTimedOutError,
    LeaderUnreachableError,
    NoLeaderError,
    list_offsets_request,
    read_answer,
    should_ask_again,
)
from odradek.errors import OdradekError
from tests.unit.test_console_views import raw, snapshot_of

TopicPartition = tuple[str, int]


def answer(*partitions: tuple[str, int, int, int]) -> SimpleNamespace:
    """A ListOffsets response of (topic, partition, error code, offset) rows."""
    topics: dict[str, list[SimpleNamespace]] = {}
    for topic, index, code, offset in partitions:
        topics.setdefault(topic, []).append(
            SimpleNamespace(partition_index=index, error_code=code, offset=offset)
        )
    return SimpleNamespace(
        topics=[SimpleNamespace(name=t, partitions=ps) for t, ps in topics.items()]
    )


def test_the_request_asks_each_partitions_latest_offset_by_topic() -> None:
    values = list_offsets_request([("b", 1), ("a", 3), ("b", 0)])
    assert values["isolation_level"] == 0 and values["replica_id"] == -1
    assert values["topics"] == [
        {
            "name": "a",
            "partitions": [{"partition_index": 3, "current_leader_epoch": -1, "timestamp": -1}],
        },
        {
            "name": "b",
            "partitions": [
                {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1},
                {"partition_index": 1, "current_leader_epoch": -1, "timestamp": -1},
            ],
        },
    ]


def test_an_answer_gives_each_partition_its_offset_or_error() -> None:
    asked = [("t", 0), ("t", 1), ("t", 2)]
    got = read_answer(2, asked, answer(("t", 0, 0, 42), ("t", 1, 6, -1)))
    assert got[("t", 0)] == 42
    moved = got[("t", 1)]
    assert isinstance(moved, KafkaResponseError) and moved.code is ErrorCode.not_leader_or_follower
    assert str(moved) == "NOT_LEADER_OR_FOLLOWER: from broker 2"
    missing = got[("t", 2)]  # a broker that leaves a partition out of its answer
    assert isinstance(missing, KafkaResponseError) and "did not answer for it" in str(missing)


def test_which_results_ask_for_the_leader_again() -> None:
    assert should_ask_again(KafkaResponseError(ErrorCode.not_leader_or_follower, None))
    assert should_ask_again(KafkaResponseError(ErrorCode.unknown_topic_or_partition, None))
    assert should_ask_again(KafkaResponseError(ErrorCode.fenced_leader_epoch, None))
    assert should_ask_again(NoLeaderError("no leader"))
    assert should_ask_again(LeaderUnreachableError("broker 2 unreachable"))
    assert not should_ask_again(KafkaResponseError(ErrorCode.topic_authorization_failed, None))
    assert not should_ask_again(7)


class FakeZooKeeper:
    """`CurrentLeaders`: the leaders the state znodes name now."""

    def __init__(self, leaders: dict[TopicPartition, int]) -> None:
        self.now = leaders
        self.asked: list[list[TopicPartition]] = []

    async def leaders(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        self.asked.append(list(partitions))
        return {key: self.now[key] for key in partitions if key in self.now}


class FakeCluster(LeaderOffsets):
    """Brokers answering ListOffsets as Kafka's do: the offset where they lead the partition,
    NOT_LEADER_OR_FOLLOWER where they only follow it; `down` brokers cannot be reached."""

    def __init__(
        self,
        zookeeper: FakeZooKeeper,
        leading: dict[TopicPartition, int],
        ends: dict[TopicPartition, int],
        down: frozenset[int] = frozenset(),
        hung: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__("127.0.0.1:1", zookeeper)
        self.leading, self.ends, self.down, self.hung = leading, ends, down, hung
        self.requests: list[tuple[int, list[TopicPartition]]] = []
        self.addresses_asked = 0

    async def to_broker(self, broker_id: int, api_key: int, version: int, values: Any) -> Any:
        partitions = [
            (t["name"], p["partition_index"]) for t in values["topics"] for p in t["partitions"]
        ]
        self.requests.append((broker_id, partitions))
        if broker_id in self.hung:
            raise LeaderTimedOutError(f"broker {broker_id}: no answer in 5 s")
        if broker_id in self.down:
            raise LeaderUnreachableError(f"broker {broker_id} unreachable: refused")
        return answer(
            *(
                (t, p, 0, self.ends[(t, p)])
                if self.leading.get((t, p)) == broker_id
                else (t, p, 6, -1)
                for t, p in partitions
            )
        )

    async def _forget_addresses(self) -> None:
        self.addresses_asked += 1


def test_one_request_per_leader_and_nothing_else_when_the_snapshot_is_current() -> None:
    leaders = {("t", p): 1 + p % 3 for p in range(9)}
    cluster = FakeCluster(FakeZooKeeper(leaders), leaders, {key: key[1] * 10 for key in leaders})
    got = asyncio.run(cluster.high_watermarks(leaders))
    assert got == {key: key[1] * 10 for key in leaders}
    assert sorted(b for b, _ in cluster.requests) == [1, 2, 3]
    assert cluster.current_leaders.asked == []  # type: ignore[attr-defined]


def test_a_leader_moved_since_the_snapshot_is_asked_again_at_the_new_leader() -> None:
    snapshot = {("t", 0): 1, ("t", 1): 2, ("t", 2): -1}
    now = {("t", 0): 3, ("t", 1): 2, ("t", 2): 1}  # 0 moved to 3; 2 got a leader
    zookeeper = FakeZooKeeper(now)
    cluster = FakeCluster(zookeeper, now, {("t", 0): 5, ("t", 1): 6, ("t", 2): 7})
    got = asyncio.run(cluster.high_watermarks(snapshot))
    assert got == {("t", 0): 5, ("t", 1): 6, ("t", 2): 7}
    assert zookeeper.asked == [[("t", 0), ("t", 2)]]  # only those, once
    assert cluster.addresses_asked == 0


def test_what_still_fails_after_one_more_try_is_that_partitions_error_alone() -> None:
    snapshot = {("t", 0): 1, ("t", 1): 2, ("t", 2): 3}
    # Partition 0's leader moved to 2 in ZooKeeper, but broker 2 has not heard yet; partition 2's
    # leader is down (and ZooKeeper still names it).
    zookeeper = FakeZooKeeper({("t", 0): 2, ("t", 1): 2, ("t", 2): 3})
    cluster = FakeCluster(
        zookeeper,
        {("t", 1): 2},
        {("t", 0): 5, ("t", 1): 6, ("t", 2): 7},
        down=frozenset({3}),
    )
    got = asyncio.run(cluster.high_watermarks(snapshot))
    assert got[("t", 1)] == 6
    assert str(got[("t", 0)]) == "NOT_LEADER_OR_FOLLOWER: from broker 2"
    assert str(got[("t", 2)]) == "broker 3 unreachable: refused"
    assert cluster.addresses_asked == 1  # a connection failed: the addresses are asked again
    assert zookeeper.asked == [[("t", 0), ("t", 2)]]  # one more try, not a loop
    assert [b for b, _ in cluster.requests] == [1, 2, 3, 2, 3]


def test_a_leader_that_does_not_answer_is_asked_again_only_if_another_leads_now() -> None:
    snapshot = {("t", 0): 3, ("t", 1): 3}
    # Broker 3 hangs; ZooKeeper has moved partition 1 to broker 1 already, not partition 0.
    zookeeper = FakeZooKeeper({("t", 0): 3, ("t", 1): 1})
    cluster = FakeCluster(zookeeper, {("t", 1): 1}, {("t", 0): 5, ("t", 1): 6}, hung=frozenset({3}))
    got = asyncio.run(cluster.high_watermarks(snapshot))
    assert got[("t", 1)] == 6
    assert str(got[("t", 0)]) == "broker 3: no answer in 5 s"
    assert [b for b, _ in cluster.requests] == [3, 1]  # broker 3 once: the page waits once


def test_a_partition_without_a_leader_anywhere_says_so() -> None:
    zookeeper = FakeZooKeeper({("t", 0): -1})  # and ("t", 1) has no state znode
    cluster = FakeCluster(zookeeper, {}, {})
    got = asyncio.run(cluster.high_watermarks({("t", 0): -1, ("t", 1): -1}))
    assert {str(v) for v in got.values()} == {"no leader"}
    assert cluster.requests == []


# -- the topic page ---------------------------------------------------------------------------


class FakeViewOfZooKeeper:
    last_error = None

    async def current(self) -> Any:
        return snapshot_of(
            {
                "orders": [
                    raw(0, [1, 2], 1, [1, 2]),
                    raw(1, [2, 3], 2, [2, 3]),
                    raw(2, [4, 1], 4, [4]),  # led by a dead broker: asked with no leader
                ]
                + [raw(p, [3], 3, [3]) for p in range(3, 150)]
            }
        )

    refresh = current

    def recent_changes(self, topic: str | None = None, limit: int = 20) -> list[Any]:
        return []


class FakeLeaderOffsets:
    def __init__(self) -> None:
        self.asked: list[dict[TopicPartition, int]] = []

    async def high_watermarks(
        self, leaders: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int | OdradekError]:
        self.asked.append(dict(leaders))
        results: dict[TopicPartition, int | OdradekError] = {key: 1000 + key[1] for key in leaders}
        results[("orders", 1)] = KafkaResponseError(
            ErrorCode.not_leader_or_follower, "from broker 3"
        )
        results[("orders", 2)] = NoLeaderError("no leader")
        return results


class NoMetrics:
    enabled = False

    async def topic_logs(self, topic: str, partitions: Any, wait_s: Any = None) -> Any:
        return {}, []


class FakeKafka:
    def topic_configs(self, topic: str) -> list[Any]:
        return []


def test_the_topic_page_asks_the_snapshots_leaders_of_its_partitions_only() -> None:
    app = create_app(ConsoleSettings("127.0.0.1:1", "127.0.0.1:1"))
    state = app.state.console
    state.zk, state.metrics, state.kafka = FakeViewOfZooKeeper(), NoMetrics(), FakeKafka()
    state.leader_offsets = offsets = FakeLeaderOffsets()
    text = TestClient(app).get("/topics/orders").text
    (asked,) = offsets.asked
    assert sorted(asked) == [("orders", p) for p in range(100)]  # the page's 100, no more
    assert asked[("orders", 0)] == 1 and asked[("orders", 1)] == 2
    assert asked[("orders", 2)] == -1  # the snapshot's leader is dead
    assert partition_cell(text, 0) == '<td class="num">1000</td>'
    assert partition_cell(text, 1) == (
        '<td class="num bad" title="NOT_LEADER_OR_FOLLOWER: from broker 3">'
        "NOT_LEADER_OR_FOLLOWER</td>"
    )
    assert partition_cell(text, 2) == '<td class="num bad" title="no leader">no leader</td>'
    assert "ListOffsets: 2 of 100 partition(s) without a high watermark" in text
    page2 = TestClient(app).get("/topics/orders/partitions?page=2").text
    assert sorted(offsets.asked[1]) == [("orders", p) for p in range(100, 150)]
    assert partition_cell(page2, 149) == '<td class="num">1149</td>'


def partition_cell(text: str, partition: int) -> str:
    """The high watermark cell (the sixth) of a partition's row."""
    row = re.search(rf'<tr data-partition="{partition}">(.*?)</tr>', text, re.S)
    assert row is not None, text[:3000]
    return re.findall(r"<td[^>]*>.*?</td>", row.group(1), re.S)[5]
