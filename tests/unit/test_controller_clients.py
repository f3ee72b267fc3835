"""The controller's managers driven through fakes of their client Protocols, without a controller:
`ReplicaLeaderElection` with a fake `ElectionClient`, `TopicDeletionManager`'s StopReplica answers
with a fake `DeletionClient`. The fakes record what the manager asked for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from odradek.controller import events as ev
from odradek.controller.context import ControllerContext, LeaderAndIsr, TopicPartition
from odradek.controller.elect_leaders import (
    AutoRebalanceConfig,
    ElectionType,
    ReplicaLeaderElection,
)
from odradek.controller.partition_state_machine import ElectionStrategy
from odradek.controller.topic_deletion import TopicDeletionManager
from odradek.errors import KafkaError, NotControllerError
from odradek.zk.client import WatchEvent
from odradek.zk.znodes import BrokerInfo
from tests.fakes.controller_zk import FakeZooKeeper


class FakeElectionClient:
    """An ElectionClient: elections succeed with leader = first replica of AR unless `refuse`."""

    def __init__(self, context: ControllerContext, active: bool = True) -> None:
        self.context = context
        self.broker_id = 7
        self.is_active = active
        self.term = 3
        self.events: list[Any] = []
        self.watches = 0
        self.elections: list[tuple[list[TopicPartition], ElectionStrategy]] = []
        self.refuse: set[TopicPartition] = set()

    def put(self, event: Any) -> None:
        self.events.append(event)

    def watch(self, make_event: Callable[[WatchEvent], Any]) -> Callable[[WatchEvent], None]:
        self.watches += 1
        return lambda e: self.put(make_event(e))

    async def elect_with_strategy(
        self, partitions: Sequence[TopicPartition], strategy: ElectionStrategy
    ) -> Mapping[TopicPartition, LeaderAndIsr | Exception]:
        self.elections.append((list(partitions), strategy))
        results: dict[TopicPartition, LeaderAndIsr | Exception] = {}
        for tp in partitions:
            if tp in self.refuse:
                results[tp] = KafkaError("refused")
                continue
            state = self.context.leadership[tp]
            preferred = self.context.assignments[tp[0]][tp[1]][0]
            results[tp] = LeaderAndIsr(preferred, state.leader_epoch + 1, state.isr, 1, 1)
        return results


def context_with(
    partitions: dict[TopicPartition, tuple[tuple[int, ...], int]],
) -> ControllerContext:
    """A context with AR and current leader per partition (ISR = AR)."""
    context = ControllerContext()
    context.live_brokers = {b: BrokerInfo(b, "h", 9092, (), None, b) for b in (1, 2)}
    for (topic, partition), (replicas, leader) in partitions.items():
        context.assignments.setdefault(topic, {})[partition] = replicas
        context.leadership[(topic, partition)] = LeaderAndIsr(leader, 4, replicas, 1, 0)
    return context


def election(context: ControllerContext, client: FakeElectionClient) -> ReplicaLeaderElection:
    return ReplicaLeaderElection(
        context, FakeZooKeeper().client(), client, AutoRebalanceConfig(enabled=True)
    )


def test_only_partitions_that_need_it_reach_the_state_machine() -> None:
    context = context_with({("t", 0): ((1, 2), 2), ("t", 1): ((1, 2), 1)})
    client = FakeElectionClient(context)
    outcomes = asyncio.run(
        election(context, client).elect(
            [("t", 0), ("t", 1), ("t", 9)], ElectionType.PREFERRED, _admin()
        )
    )
    assert client.elections == [([("t", 0)], ElectionStrategy.PREFERRED_REPLICA)]
    assert outcomes[("t", 0)] == 1
    assert isinstance(outcomes[("t", 1)], KafkaError)  # ELECTION_NOT_NEEDED
    assert isinstance(outcomes[("t", 9)], KafkaError)  # UNKNOWN_TOPIC_OR_PARTITION


def test_an_admin_request_to_a_broker_that_is_not_the_controller() -> None:
    async def body() -> None:
        context = context_with({("t", 0): ((1, 2), 2)})
        client = FakeElectionClient(context, active=False)
        result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await election(context, client).process_admin_request(
            ev.ReplicaLeaderElection(frozenset({("t", 0)}), 0, result)
        )
        with pytest.raises(NotControllerError, match="broker 7"):
            result.result()
        assert client.elections == []

    asyncio.run(body())


def test_a_rebalance_event_of_an_earlier_term_is_ignored() -> None:
    async def body() -> None:
        context = context_with({("t", 0): ((1, 2), 2)})
        client = FakeElectionClient(context)
        manager = election(context, client)
        await manager.process_auto_rebalance(ev.AutoPreferredReplicaLeaderElection(generation=2))
        assert client.elections == []
        await manager.process_auto_rebalance(ev.AutoPreferredReplicaLeaderElection(generation=3))
        assert client.elections == [([("t", 0)], ElectionStrategy.PREFERRED_REPLICA)]
        assert manager.timer.scheduled  # the next check, in this term
        manager.on_controller_resignation()

    asyncio.run(body())


def test_failover_watches_the_election_znode_through_the_client() -> None:
    async def body() -> None:
        context = context_with({})
        client = FakeElectionClient(context)
        manager = election(context, client)
        await manager.on_controller_failover()
        assert client.watches == 1
        assert manager.timer.scheduled
        manager.on_controller_resignation()
        assert not manager.timer.scheduled

    asyncio.run(body())


class FakeDeletionClient:
    def __init__(self) -> None:
        self.events: list[Any] = []
        self.metadata_updates: list[Any] = []

    def put(self, event: Any) -> None:
        self.events.append(event)

    def send_update_metadata(self, partitions: Any) -> None:
        self.metadata_updates.append(partitions)


class StopReplicaAnswer:
    def __init__(self, deleted: frozenset[TopicPartition], error_code: int, errors: Any) -> None:
        self.deleted_partitions = deleted
        self.error_code = error_code
        self.response = type("Response", (), {"partition_errors": errors})()


def test_a_stop_replica_answer_becomes_one_event_with_each_partitions_outcome() -> None:
    client = FakeDeletionClient()
    manager = TopicDeletionManager(
        ControllerContext(),
        FakeZooKeeper().client(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]  # not reached by this path
        None,  # type: ignore[arg-type]
        client,
        delete_topic_enable=True,
    )
    error = type("E", (), {"topic_name": "t", "partition_index": 1, "error_code": 56})()
    manager.on_stop_replica_response_event(
        3, StopReplicaAnswer(frozenset({("t", 0), ("t", 1)}), 0, [error])
    )
    assert client.events == [
        ev.TopicDeletionStopReplicaResponseReceived(3, {("t", 0): 0, ("t", 1): 56})
    ]
    manager.on_stop_replica_response_event(3, StopReplicaAnswer(frozenset(), 0, []))
    assert len(client.events) == 1  # nothing deleted: no event


def _admin() -> Any:
    from odradek.controller.elect_leaders import ElectionTrigger

    return ElectionTrigger.ADMIN_CLIENT
