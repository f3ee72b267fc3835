"""The transaction coordinator with its real marker sender (`coordinator.transaction.marker_channel`)
over scripted partition leaders: a transaction in PrepareCommit/PrepareAbort is completed only once
every partition has its marker, and nothing but a reload at a newer coordinator epoch may stop the
sending.

* a leadership restated at the same epoch (a `__transaction_state` leader fenced when its ZooKeeper
  session expired, told its unchanged role by the next controller) keeps the markers under way and
  the recording of the completion: cancelling them left the transaction in PrepareCommit for ever
  (the fault suite's zookeeper-unreachable run: a committed transaction's record invisible, the LSO
  one below the HW, the transactional producer stuck on CONCURRENT_TRANSACTIONS);
* an election at a newer epoch drops them and the reload sends them again, at the new epoch;
* NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT, an unreachable broker, no known
  leader, a leader that moves and an unexpected failure are all retried until the marker is in.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from odradek.coordinator.transaction import coordinator as coordinator_module
from odradek.coordinator.transaction import marker_channel
from odradek.coordinator.transaction.coordinator import TransactionCoordinator
from odradek.coordinator.transaction.marker_channel import TransactionMarkerChannelManager
from odradek.coordinator.transaction.metadata import TransactionState
from odradek.coordinator.transaction.state_manager import TransactionConfig, TransactionStateManager
from tests.unit.test_transaction_coordinator import FakeLog, Ids

S = TransactionState
TopicPartition = tuple[str, int]


class Cluster:
    """The partition leaders as the marker sender sees them: the metadata cache's answer
    (`leaders`, None for a partition without a known leader) and what each leader answers
    WriteTxnMarkers (`script`: per partition, the errors of its next attempts, then NONE; an
    exception in it is a broker that cannot be reached)."""

    def __init__(self, leaders: dict[TopicPartition, int | None]) -> None:
        self.leaders = leaders
        self.script: dict[TopicPartition, list[ErrorCode | Exception]] = {}
        self.written: list[tuple[TopicPartition, int, bool, int]] = []
        """(partition, leader, commit, coordinator epoch) of every marker answered NONE."""
        self.metadata_failures = 0
        self.attempts: Counter[TopicPartition] = Counter()

    # MarkerMetadata

    def leader_of(self, topic: str, partition: int) -> tuple[int, str, int] | None:
        if self.metadata_failures:
            self.metadata_failures -= 1
            raise RuntimeError("metadata cache hiccup")
        leader = self.leaders.get((topic, partition))
        return None if leader is None else (leader, "localhost", 9000 + leader)

    def topic_exists(self, topic: str) -> bool:
        return True


class FakeConnection:
    """A `BrokerConnection` to broker `broker_id` that answers from the cluster's script."""

    def __init__(self, cluster: Cluster, broker_id: int, port: int) -> None:
        self.cluster = cluster
        self.broker_id = broker_id
        self.port = port
        self.closed = False

    def close(self) -> None:
        self.closed = True

    async def send(self, api_key: Any, version: int, request: Any, timeout: float) -> Any:
        await asyncio.sleep(0)
        markers = []
        for marker in request.markers:
            topics = []
            for topic in marker.topics:
                results = []
                for index in topic.partition_indexes:
                    key = (topic.name, int(index))
                    self.cluster.attempts[key] += 1
                    script = self.cluster.script.get(key) or []
                    outcome = script.pop(0) if script else ErrorCode.none
                    if isinstance(outcome, Exception):
                        raise outcome
                    if self.cluster.leaders.get(key) != self.broker_id:
                        outcome = ErrorCode.not_leader_or_follower
                    if outcome is ErrorCode.none:
                        self.cluster.written.append(
                            (
                                key,
                                self.broker_id,
                                bool(marker.transaction_result),
                                int(marker.coordinator_epoch),
                            )
                        )
                    results.append(SimpleNamespace(partition_index=index, error_code=outcome))
                topics.append(SimpleNamespace(name=topic.name, partitions=results))
            markers.append(SimpleNamespace(producer_id=marker.producer_id, topics=topics))
        return SimpleNamespace(markers=markers)


class ScriptedMarkers(TransactionMarkerChannelManager):
    """The real sender, its connections to leaders replaced by the cluster's."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster, None)  # type: ignore[arg-type]
        self.cluster = cluster

    async def _connection(self, broker_id: int, host: str, port: int) -> Any:
        connection = self._connections.get(broker_id)
        if connection is None or connection.closed:
            connection = FakeConnection(self.cluster, broker_id, port)
            self._connections[broker_id] = connection  # type: ignore[assignment]
        return connection


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(marker_channel, "RETRY_BACKOFF_S", 0.001)
    monkeypatch.setattr(coordinator_module, "COMPLETE_RETRY_S", 0.001)


def make(cluster: Cluster) -> TransactionCoordinator:
    manager = TransactionStateManager(
        TransactionConfig(num_partitions=1), FakeLog(), lambda: 1, now_ms=lambda: 1_000_000
    )
    return TransactionCoordinator(1, manager, ScriptedMarkers(cluster), Ids())


async def _elect(coordinator: TransactionCoordinator, epoch: int) -> None:
    coordinator.on_elected(0, epoch)
    await _until(lambda: coordinator.manager.owned_partitions().get(0) is True, "loaded")


async def _until(condition: Callable[[], bool], what: str, seconds: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never {what}")
        await asyncio.sleep(0.001)


def _state(coordinator: TransactionCoordinator) -> TransactionState:
    found = coordinator.manager.get_state("t")[1]
    assert found is not None
    return found.metadata.state


async def _prepare_commit(
    coordinator: TransactionCoordinator, partitions: list[TopicPartition]
) -> None:
    init = await coordinator.init_producer_id("t", 60000)
    pid, epoch = init.producer_id, init.producer_epoch
    assert await coordinator.add_partitions("t", pid, epoch, partitions) is ErrorCode.none
    assert await coordinator.end_transaction("t", pid, epoch, True) is ErrorCode.none
    assert _state(coordinator) is S.PREPARE_COMMIT


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_restated_leadership_keeps_the_markers_going() -> None:
    async def scenario() -> None:
        cluster = Cluster({("a", 0): 2, ("a", 1): None})  # a-1's leader fenced: none known
        c = make(cluster)
        await _elect(c, 5)
        await _prepare_commit(c, [("a", 0), ("a", 1)])
        await _until(lambda: len(cluster.written) == 1, "wrote a-0's marker")
        # Our session expired and came back: the next controller restates our role, same epoch.
        c.on_elected(0, 5)
        assert c.manager.owned_partitions() == {0: True}
        cluster.leaders[("a", 1)] = 3  # a-1 led again
        await _until(lambda: _state(c) is S.COMPLETE_COMMIT, "completed the commit")
        assert [(tp, commit, epoch) for tp, _, commit, epoch in cluster.written] == [
            (("a", 0), True, 5),
            (("a", 1), True, 5),
        ]
        await c.shutdown()

    run(scenario)


def test_restated_leadership_keeps_recording_the_completion() -> None:
    async def scenario() -> None:
        cluster = Cluster({("a", 0): 2})
        c = make(cluster)
        transaction_log = c.manager.log
        assert isinstance(transaction_log, FakeLog)
        await _elect(c, 5)
        await _prepare_commit(c, [("a", 0)])
        # Fenced: the markers are in, but CompleteCommit cannot be written until restated.
        transaction_log.fail_with = ErrorCode.not_leader_or_follower
        await _until(lambda: len(cluster.written) == 1, "wrote a-0's marker")
        await asyncio.sleep(0.01)
        c.on_elected(0, 5)
        transaction_log.fail_with = None
        await _until(lambda: _state(c) is S.COMPLETE_COMMIT, "completed the commit")
        await c.shutdown()

    run(scenario)


def test_newer_epoch_reloads_and_sends_the_markers_again() -> None:
    async def scenario() -> None:
        cluster = Cluster({("a", 0): 2, ("a", 1): None})
        c = make(cluster)
        await _elect(c, 5)
        await _prepare_commit(c, [("a", 0), ("a", 1)])
        await _until(lambda: len(cluster.written) == 1, "wrote a-0's marker")
        await _elect(c, 6)  # leader again at a newer epoch: the log is the truth
        cluster.leaders[("a", 1)] = 3
        await _until(lambda: _state(c) is S.COMPLETE_COMMIT, "completed the commit")
        assert {(tp, epoch) for tp, _, _, epoch in cluster.written[1:]} == {
            (("a", 0), 6),
            (("a", 1), 6),
        }
        await c.shutdown()

    run(scenario)


def test_every_marker_error_is_retried_until_written() -> None:
    async def scenario() -> None:
        cluster = Cluster({("a", 0): 2, ("a", 1): 2, ("b", 0): None})
        cluster.script[("a", 0)] = [
            ErrorCode.not_leader_or_follower,
            ErrorCode.not_enough_replicas,
            ErrorCode.request_timed_out,
            ErrorCode.unknown_topic_or_partition,
        ]
        cluster.script[("a", 1)] = [ConnectionError("broker 2 unreachable")]
        cluster.metadata_failures = 1
        c = make(cluster)
        await _elect(c, 0)
        await _prepare_commit(c, [("a", 0), ("a", 1), ("b", 0)])
        await _until(lambda: {tp for tp, *_ in cluster.written} == {("a", 0), ("a", 1)}, "wrote")
        assert _state(c) is S.PREPARE_COMMIT  # b-0 still has no leader
        # b-0's leader appears, but has already lost it; the cache then names the new one.
        cluster.script[("b", 0)] = [ErrorCode.not_leader_or_follower] * 1000
        cluster.leaders[("b", 0)] = 2
        await _until(lambda: cluster.attempts[("b", 0)] >= 2, "asked broker 2")
        assert _state(c) is S.PREPARE_COMMIT
        cluster.script[("b", 0)] = []
        cluster.leaders[("b", 0)] = 3
        await _until(lambda: _state(c) is S.COMPLETE_COMMIT, "completed the commit")
        assert cluster.written[-1][:2] == (("b", 0), 3)
        assert len(cluster.written) == 3
        assert c.markers.pending() == []
        await c.shutdown()

    run(scenario)
