"""The replica and partition state machines against the in-memory ZooKeeper and a recording channel.

First every (from, to) pair of both machines: refused pairs leave the state alone and write an ERROR
line to the `state.change` log, valid pairs apply. Then the side effects the state module documents,
one test each: NewPartition -> OnlinePartition (state znode created, LeaderAndIsr is_new to the live
replicas, UpdateMetadata to every live broker), OfflinePartition -> OnlinePartition with the offline
strategy (the seed's rows, unclean election only where the topic allows it), OnlineReplica ->
OfflineReplica (ISR shrink, StopReplica without delete), version races retried on a fresh read, and a
deposed controller fenced with ControllerMovedError. Last, the fakes' own strictness.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import pytest

from odradek.controller.channel_manager import ControllerBrokerRequestBatch
from odradek.controller.context import ControllerContext, LeaderAndIsr, PartitionReplica
from odradek.controller.partition_state_machine import (
    ElectionStrategy,
    NoEligibleLeaderError,
    PartitionStateMachine,
    StateChangeFailedError,
)
from odradek.controller.replica_state_machine import ReplicaStateMachine
from odradek.controller.states import (
    STATE_CHANGE_LOGGER_NAME,
    PartitionState,
    ReplicaState,
    StateChangeLogger,
)
from odradek.controller.stats import ControllerStats
from odradek.protocol.codec import ApiKey
from odradek.zk.errors import (
    BadVersionError,
    ControllerMovedError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from odradek.zk.ops import CreateOp, SetDataOp
from odradek.zk.znodes import BrokerInfo, TopicPartitionStateZNode
from tests.fakes.channel import ChannelClosedError, RecordingChannelManager
from tests.fakes.controller_zk import FakeControllerZk, FakeZooKeeper

R = ReplicaState
P = PartitionState
T = TypeVar("T")

CONTROLLER_ID = 100
TOPIC = "events"
TP = (TOPIC, 0)
UNCLEAN_CONFIG = "unclean.leader.election.enable"


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(coroutine, 10)

    return asyncio.run(main())


class StateChangeRecords(logging.Handler):
    """Collects the `state.change` logger's records (caplog would miss them if another test turned
    propagation off, as `attach_state_change_log_file` does)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@pytest.fixture
def state_log() -> Iterator[StateChangeRecords]:
    logger = logging.getLogger(STATE_CHANGE_LOGGER_NAME)
    handler = StateChangeRecords()
    saved_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # replica transitions are DEBUG lines (Kafka: TRACE)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved_level)


class Harness:
    """A controller's context, both state machines, the fake ZooKeeper and a recording channel,
    wired as `KafkaController._on_controller_failover` wires them."""

    def __init__(self, live: Iterable[int] = (1, 2, 3, 4, 5), elections: int = 1) -> None:
        self.zk = FakeControllerZk()
        self.brokers: dict[int, BrokerInfo] = {b: self.zk.register_broker(b) for b in live}
        for _ in range(elections):
            epoch, epoch_zk_version = self.zk.elect_controller(CONTROLLER_ID)
        self.context = ControllerContext(epoch=epoch, epoch_zk_version=epoch_zk_version)
        self.context.live_brokers = dict(self.brokers)
        self.channel = RecordingChannelManager(CONTROLLER_ID, 30.0)
        for info in self.brokers.values():
            self.channel.add_broker(info)
        self.batch = ControllerBrokerRequestBatch(
            self.context, self.channel, CONTROLLER_ID, lambda *_: None
        )
        logger = StateChangeLogger(CONTROLLER_ID)
        self.replicas = ReplicaStateMachine(self.context, self.zk, self.batch, logger)
        self.partitions = PartitionStateMachine(
            self.context, self.zk, self.batch, logger, self._unclean_enabled
        )

    async def _unclean_enabled(self, topics: Iterable[str]) -> dict[str, bool]:
        configs = await self.zk.get_topic_configs(topics)
        return {t: c.get(UNCLEAN_CONFIG, "false") == "true" for t, c in configs.items()}

    def add_topic(
        self, topic: str, assignment: dict[int, Sequence[int]], *, unclean: bool = False
    ) -> None:
        self.zk.create_topic(
            topic, assignment, config={UNCLEAN_CONFIG: "true" if unclean else "false"}
        )
        for partition, replicas in assignment.items():
            self.context.update_partition_replica_assignment((topic, partition), replicas)

    def seed_partition(
        self,
        tp: tuple[str, int],
        *,
        leader: int,
        isr: Sequence[int],
        leader_epoch: int = 5,
        controller_epoch: int | None = None,
        state: PartitionState = P.OnlinePartition,
        replica_state: ReplicaState | None = R.OnlineReplica,
    ) -> LeaderAndIsr:
        """A partition as an earlier controller left it: state znode, cache, machine states."""
        written = self.zk.write_partition_state(
            tp,
            leader=leader,
            leader_epoch=leader_epoch,
            isr=isr,
            controller_epoch=self.context.epoch if controller_epoch is None else controller_epoch,
        )
        self.context.leadership[tp] = written
        self.context.partition_states[tp] = state
        if replica_state is not None:
            for replica in self.context.partition_replica_assignment(tp):
                self.context.replica_states[PartitionReplica(*tp, replica)] = replica_state
        return written

    def kill(self, broker_id: int) -> None:
        self.zk.deregister_broker(broker_id)
        del self.context.live_brokers[broker_id]
        self.channel.remove_broker(broker_id)

    def send(self) -> None:
        self.batch.send_requests_to_brokers(self.context.epoch)

    def writes_since(self, mark: int) -> list[Any]:
        return self.zk.tree.writes[mark:]


def replica_state(h: Harness, replica: PartitionReplica) -> ReplicaState:
    return h.context.replica_states.get(replica, R.NonExistentReplica)


def partition_state(h: Harness, tp: tuple[str, int]) -> PartitionState:
    return h.context.partition_states.get(tp, P.NonExistentPartition)


def assert_nothing_sent(h: Harness) -> None:
    h.send()
    assert h.channel.sent == []
    assert h.channel.dropped == []


# --- every pair of the replica state machine -----------------------------------------------------

REPLICA_PAIRS = list(itertools.product(ReplicaState, ReplicaState))


def _replica_harness(from_state: ReplicaState) -> tuple[Harness, PartitionReplica]:
    """t-0 with AR [1, 2, 3], led by 1; the replica under test is 2 (a follower: a leader may
    not become NewReplica), put in `from_state`."""
    h = Harness()
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    h.seed_partition(TP, leader=1, isr=[1, 2, 3])
    replica = PartitionReplica(TOPIC, 0, 2)
    if from_state is R.NonExistentReplica:
        del h.context.replica_states[replica]
    else:
        h.context.replica_states[replica] = from_state
    return h, replica


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    [p for p in REPLICA_PAIRS if p[0] not in p[1].valid_previous_states],
    ids=lambda s: str(s),
)
def test_invalid_replica_transition_is_refused_and_logged(
    from_state: ReplicaState, to_state: ReplicaState, state_log: StateChangeRecords
) -> None:
    h, replica = _replica_harness(from_state)
    mark = len(h.zk.tree.writes)
    run(h.replicas.handle_state_changes([replica], to_state))
    assert replica_state(h, replica) is from_state
    errors = state_log.at(logging.ERROR)
    assert len(errors) == 1
    assert "[Topic=events,Partition=0,Replica=2]" in errors[0]
    assert f"from {from_state} to {to_state}" in errors[0]
    assert state_log.at(logging.INFO) == []
    assert h.writes_since(mark) == []
    assert_nothing_sent(h)


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    [p for p in REPLICA_PAIRS if p[0] in p[1].valid_previous_states],
    ids=lambda s: str(s),
)
def test_valid_replica_transition_is_applied_and_logged(
    from_state: ReplicaState, to_state: ReplicaState, state_log: StateChangeRecords
) -> None:
    h, replica = _replica_harness(from_state)
    run(h.replicas.handle_state_changes([replica], to_state))
    if to_state is R.NonExistentReplica:
        assert replica not in h.context.replica_states
        assert 2 not in h.context.partition_replica_assignment(TP)
    else:
        assert h.context.replica_states[replica] is to_state
    assert state_log.at(logging.ERROR) == []
    assert state_log.at(logging.INFO) == []
    lines = state_log.at(logging.DEBUG)
    assert len(lines) == 1
    assert f"from {from_state} to {to_state}" in lines[0]


# --- every pair of the partition state machine ---------------------------------------------------

PARTITION_PAIRS = list(itertools.product(PartitionState, PartitionState))


def _partition_harness(from_state: PartitionState) -> Harness:
    """t-0 with AR [1, 2, 3], all live. New and NonExistent partitions have no state znode yet;
    Online and Offline ones are led by 1 with the full ISR."""
    h = Harness()
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    if from_state in (P.OnlinePartition, P.OfflinePartition):
        h.seed_partition(TP, leader=1, isr=[1, 2, 3], state=from_state)
    elif from_state is P.NewPartition:
        h.context.partition_states[TP] = P.NewPartition
    return h


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    [p for p in PARTITION_PAIRS if p[0] not in p[1].valid_previous_states],
    ids=lambda s: str(s),
)
def test_invalid_partition_transition_is_refused_and_logged(
    from_state: PartitionState, to_state: PartitionState, state_log: StateChangeRecords
) -> None:
    h = _partition_harness(from_state)
    mark = len(h.zk.tree.writes)
    results = run(h.partitions.handle_state_changes([TP], to_state, ElectionStrategy.OFFLINE))
    assert partition_state(h, TP) is from_state
    assert isinstance(results[TP], StateChangeFailedError)
    errors = state_log.at(logging.ERROR)
    assert len(errors) == 1
    assert f"{TOPIC}-0 from {from_state} to {to_state}" in errors[0]
    assert state_log.at(logging.INFO) == []
    assert h.writes_since(mark) == []
    assert_nothing_sent(h)


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    [p for p in PARTITION_PAIRS if p[0] in p[1].valid_previous_states],
    ids=lambda s: str(s),
)
def test_valid_partition_transition_is_applied_and_logged(
    from_state: PartitionState, to_state: PartitionState, state_log: StateChangeRecords
) -> None:
    h = _partition_harness(from_state)
    results = run(h.partitions.handle_state_changes([TP], to_state, ElectionStrategy.OFFLINE))
    if to_state is P.NonExistentPartition:
        assert TP not in h.context.partition_states
    else:
        assert h.context.partition_states[TP] is to_state
    if to_state is P.OnlinePartition:
        assert isinstance(results[TP], LeaderAndIsr)
        assert h.zk.partition_state(TP) == h.context.leadership[TP] == results[TP]
    else:
        assert TP not in results
    assert state_log.at(logging.ERROR) == []
    infos = state_log.at(logging.INFO)
    assert len(infos) == 1
    assert f"{TOPIC}-0 from {from_state} to {to_state}" in infos[0]


def test_a_batch_applies_the_valid_items_and_refuses_the_others(
    state_log: StateChangeRecords,
) -> None:
    h = Harness()
    h.add_topic(TOPIC, {0: [1, 2, 3], 1: [2, 3, 1]})
    h.seed_partition(TP, leader=1, isr=[1, 2, 3], state=P.OnlinePartition)
    h.context.partition_states[(TOPIC, 1)] = P.NonExistentPartition
    results = run(h.partitions.handle_state_changes([TP, (TOPIC, 1)], P.OfflinePartition))
    assert h.context.partition_states[TP] is P.OfflinePartition
    assert h.context.partition_states[(TOPIC, 1)] is P.NonExistentPartition
    assert isinstance(results[(TOPIC, 1)], StateChangeFailedError)
    assert len(state_log.at(logging.ERROR)) == 1
    assert len(state_log.at(logging.INFO)) == 1


# --- NewPartition -> OnlinePartition -------------------------------------------------------------


def test_new_partition_online_creates_state_with_first_live_replica_and_live_isr(
    state_log: StateChangeRecords,
) -> None:
    h = Harness(live=[1, 2, 4], elections=3)
    h.add_topic(TOPIC, {0: [3, 1, 2]})  # broker 3 is not registered
    h.context.partition_states[TP] = P.NewPartition
    mark = len(h.zk.tree.writes)

    results = run(h.partitions.handle_state_changes([TP], P.OnlinePartition))

    expected = LeaderAndIsr(1, 0, (1, 2), h.context.epoch, 0)
    assert h.context.epoch == 3
    assert results[TP] == expected
    assert h.zk.partition_state(TP) == expected
    assert h.context.leadership[TP] == expected
    assert h.context.partition_states[TP] is P.OnlinePartition
    state_writes = h.zk.partition_state_writes(mark)
    assert [(w.before, w.after, w.by_controller) for w in state_writes] == [(None, expected, True)]
    assert any("with leader=1, leader_epoch=0, isr=[1, 2]" in m for m in state_log.at(logging.INFO))

    h.send()
    leader_and_isr = h.channel.partitions(ApiKey.LEADER_AND_ISR)
    assert sorted(e.broker_id for e in leader_and_isr) == [1, 2]
    for entry in leader_and_isr:
        assert entry.tp == TP
        assert entry.request_controller_epoch == 3
        assert entry.state.is_new is True
        assert (entry.state.leader, list(entry.state.isr)) == (1, [1, 2])
        assert list(entry.state.replicas) == [3, 1, 2]
        assert entry.state.leader_epoch == 0
    metadata = h.channel.partitions(ApiKey.UPDATE_METADATA)
    assert sorted(e.broker_id for e in metadata) == [1, 2, 4]
    for entry in metadata:
        assert entry.tp == TP
        assert entry.state.leader == 1
        assert list(entry.state.offline_replicas) == [3]
        assert entry.request_controller_epoch == 3
    assert h.channel.requests(ApiKey.STOP_REPLICA) == []


def test_new_partition_without_a_live_replica_stays_new() -> None:
    h = Harness(live=[1, 2])
    h.add_topic(TOPIC, {0: [6, 7]})
    h.context.partition_states[TP] = P.NewPartition
    results = run(h.partitions.handle_state_changes([TP], P.OnlinePartition))
    assert isinstance(results[TP], NoEligibleLeaderError)
    assert h.context.partition_states[TP] is P.NewPartition
    assert h.zk.partition_state(TP) is None
    assert TP not in h.context.leadership
    assert_nothing_sent(h)


def test_new_partition_prefers_replicas_not_shutting_down() -> None:
    h = Harness(live=[1, 2, 3])
    h.context.shutting_down_broker_ids.add(1)
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    h.context.partition_states[TP] = P.NewPartition
    results = run(h.partitions.handle_state_changes([TP], P.OnlinePartition))
    assert isinstance(results[TP], LeaderAndIsr)
    assert results[TP].leader == 2
    assert results[TP].isr == (2, 3)


def test_new_partition_adopts_an_existing_state_znode_whose_leader_is_live() -> None:
    """A state znode that already exists (NodeExistsError) is adopted when it names a live leader
    in its ISR: the partition is online with that state, and nothing is overwritten."""
    h = Harness(live=[1, 2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    existing = h.zk.write_partition_state(
        TP, leader=2, leader_epoch=4, isr=[2, 3], controller_epoch=1
    )
    h.context.partition_states[TP] = P.NewPartition
    results = run(h.partitions.handle_state_changes([TP], P.OnlinePartition))
    assert results[TP] == existing
    assert h.zk.partition_state(TP) == existing
    assert h.context.leadership[TP] == existing
    assert h.context.partition_states[TP] is P.OnlinePartition


@pytest.mark.parametrize(
    ("existing_isr", "expected"),
    [
        pytest.param([9], None, id="no-live-isr-member-stays-offline"),
        pytest.param([9, 2], (2, (2,)), id="live-isr-member-elected"),
    ],
)
def test_new_partition_with_an_existing_state_naming_a_dead_leader_is_elected_offline(
    existing_isr: list[int], expected: tuple[int, tuple[int, ...]] | None
) -> None:
    """An adopted state whose leader is dead makes the partition offline and goes through the
    offline election: it never goes online with a dead leader."""
    h = Harness(live=[1, 2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    existing = h.zk.write_partition_state(
        TP, leader=9, leader_epoch=4, isr=existing_isr, controller_epoch=1
    )
    h.context.partition_states[TP] = P.NewPartition
    results = run(h.partitions.handle_state_changes([TP], P.OnlinePartition))
    h.send()
    if expected is None:
        assert isinstance(results[TP], NoEligibleLeaderError)
        assert h.context.partition_states[TP] is P.OfflinePartition
        assert h.zk.partition_state(TP) == existing
        assert h.channel.requests(ApiKey.LEADER_AND_ISR) == []
        return
    assert isinstance(results[TP], LeaderAndIsr)
    assert (results[TP].leader, results[TP].isr) == expected
    assert results[TP].leader_epoch == 5
    assert h.zk.partition_state(TP) == results[TP] == h.context.leadership[TP]
    assert h.context.partition_states[TP] is P.OnlinePartition


# --- OfflinePartition -> OnlinePartition, offline strategy (the seed's rows) ---------------------

SEED_ROWS = [
    # live brokers, unclean enabled for the topic, expected (leader, ISR) or None
    pytest.param([2, 3, 5], False, (2, (2, 3)), id="isr-member-live"),
    pytest.param([2, 3, 5], True, (2, (2, 3)), id="isr-member-live-unclean-allowed"),
    pytest.param([4, 6, 7], True, (4, (4,)), id="no-isr-member-unclean"),
    pytest.param([4, 6, 7], False, None, id="no-isr-member-clean"),
]


@pytest.mark.parametrize(("live", "unclean", "expected"), SEED_ROWS)
def test_offline_partition_election_follows_the_seed_rows(
    live: list[int], unclean: bool, expected: tuple[int, tuple[int, ...]] | None
) -> None:
    h = Harness(live=live, elections=2)
    h.add_topic(TOPIC, {0: [1, 2, 3, 4, 5]}, unclean=unclean)
    before = h.seed_partition(
        TP,
        leader=1,
        isr=[1, 2, 3],
        leader_epoch=7,
        controller_epoch=1,
        state=P.OfflinePartition,
    )
    mark = len(h.zk.tree.writes)
    h.partitions.stats = stats = ControllerStats()

    results = run(
        h.partitions.handle_state_changes([TP], P.OnlinePartition, ElectionStrategy.OFFLINE)
    )
    h.send()
    # UncleanLeaderElectionsPerSec: only the row that elects outside the ISR [1, 2, 3].
    unclean_elected = expected is not None and expected[0] not in (1, 2, 3)
    assert stats.unclean_leader_elections == int(unclean_elected)

    if expected is None:
        assert isinstance(results[TP], NoEligibleLeaderError)
        assert h.context.partition_states[TP] is P.OfflinePartition
        assert h.zk.partition_state(TP) == before == h.context.leadership[TP]
        assert h.writes_since(mark) == []
        assert h.channel.requests(ApiKey.LEADER_AND_ISR) == []
        return
    leader, isr = expected
    after = LeaderAndIsr(leader, 8, isr, h.context.epoch, before.zk_version + 1)
    assert h.context.epoch == 2
    assert results[TP] == after
    assert h.zk.partition_state(TP) == after
    assert h.context.leadership[TP] == after
    assert h.context.partition_states[TP] is P.OnlinePartition
    assert [w.by_controller for w in h.zk.partition_state_writes(mark)] == [True]
    leader_and_isr = h.channel.partitions(ApiKey.LEADER_AND_ISR)
    assert sorted(e.broker_id for e in leader_and_isr) == sorted(
        r for r in [1, 2, 3, 4, 5] if r in live
    )
    for entry in leader_and_isr:
        assert (entry.state.leader, tuple(entry.state.isr)) == (leader, isr)
        assert entry.state.leader_epoch == 8
        assert entry.state.is_new is False
    assert h.channel.brokers_sent(ApiKey.UPDATE_METADATA) == set(live)


def test_offline_election_for_many_partitions_keeps_per_partition_results() -> None:
    h = Harness(live=[2, 3])
    h.add_topic(TOPIC, {0: [1, 2], 1: [1, 4], 2: [3, 1]})
    for partition, isr in ((0, [1, 2]), (1, [1, 4]), (2, [1, 3])):
        h.seed_partition((TOPIC, partition), leader=1, isr=isr, state=P.OfflinePartition)
    results = run(
        h.partitions.handle_state_changes(
            [(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)], P.OnlinePartition, ElectionStrategy.OFFLINE
        )
    )
    assert results[(TOPIC, 0)].leader == 2  # type: ignore[union-attr]
    assert isinstance(results[(TOPIC, 1)], NoEligibleLeaderError)
    assert results[(TOPIC, 2)].leader == 3  # type: ignore[union-attr]
    assert h.context.partition_states[(TOPIC, 1)] is P.OfflinePartition
    assert h.context.partition_states[(TOPIC, 0)] is P.OnlinePartition


# --- OnlineReplica -> OfflineReplica -------------------------------------------------------------

OFFLINE_REPLICA_ROWS = [
    # leader, ISR, replica going offline, is its broker live, expected (leader, ISR) or None
    pytest.param(1, [1, 2, 3], 2, True, (1, (1, 3)), id="follower-live-broker"),
    pytest.param(1, [1, 2, 3], 2, False, (1, (1, 3)), id="follower-dead-broker"),
    pytest.param(1, [1, 2, 3], 1, False, (-1, (2, 3)), id="leader"),
    pytest.param(2, [2], 2, False, (-1, (2,)), id="last-isr-member-stays"),
    pytest.param(1, [1, 3], 2, True, None, id="not-in-isr"),
]


@pytest.mark.parametrize(("leader", "isr", "replica", "live", "expected"), OFFLINE_REPLICA_ROWS)
def test_replica_offline_shrinks_isr_and_stops_the_replica(
    leader: int,
    isr: list[int],
    replica: int,
    live: bool,
    expected: tuple[int, tuple[int, ...]] | None,
) -> None:
    h = Harness(live=[1, 2, 3, 4])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    before = h.seed_partition(TP, leader=leader, isr=isr, leader_epoch=3)
    if not live:
        h.kill(replica)
    target = PartitionReplica(TOPIC, 0, replica)

    run(h.replicas.handle_state_changes([target], R.OfflineReplica))
    h.send()

    assert h.context.replica_states[target] is R.OfflineReplica
    if expected is None:
        # Nothing to write; the state as it is goes to the other replicas (as Kafka restates it).
        assert h.zk.partition_state(TP) == before == h.context.leadership[TP]
        expected = (before.leader, before.isr)
    else:
        new_leader, new_isr = expected
        after = LeaderAndIsr(new_leader, 4, new_isr, h.context.epoch, before.zk_version + 1)
        assert h.zk.partition_state(TP) == after
        assert h.context.leadership[TP] == after
    recipients = {e.broker_id for e in h.channel.partitions(ApiKey.LEADER_AND_ISR)}
    assert recipients == {r for r in (1, 2, 3) if r != replica and r in h.context.live_brokers}
    for entry in h.channel.partitions(ApiKey.LEADER_AND_ISR):
        assert (entry.state.leader, tuple(entry.state.isr)) == expected
    stops = h.channel.partitions(ApiKey.STOP_REPLICA)
    if live:
        assert [(e.broker_id, e.tp, e.state.delete_partition) for e in stops] == [
            (replica, TP, False)
        ]
    else:
        assert stops == []
    assert h.channel.brokers_sent(ApiKey.UPDATE_METADATA) == set(h.context.live_brokers)


def test_soak_a_removal_that_landed_before_a_lost_connection_is_restated_to_the_leader() -> None:
    """Soak run 7, round 4: during a ZooKeeper outage the controller's removal of broker 3 from
    the ISR landed (leader epoch 4) but its answer was lost, and the event ran again once
    connected. The leader, broker 1, still at epoch 3, had its own ISR write refused on the
    version and stopped accepting writes until the controller restated its role; the re-run
    found 3 already out of the ISR, wrote nothing and sent nothing, so the partition took no
    write for four minutes. The re-run must restate the state ZooKeeper holds to the leader."""
    h = Harness(live=[1, 2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    h.seed_partition(TP, leader=1, isr=[1, 2, 3], leader_epoch=3)
    h.zk.write_partition_state(
        TP, leader=1, leader_epoch=4, isr=[1, 2], controller_epoch=h.context.epoch
    )
    landed = h.zk.partition_state(TP)
    h.kill(3)

    run(h.replicas.handle_state_changes([PartitionReplica(TOPIC, 0, 3)], R.OfflineReplica))
    h.send()

    assert h.zk.partition_state(TP) == landed  # nothing written again
    sent = {e.broker_id: e.state for e in h.channel.partitions(ApiKey.LEADER_AND_ISR)}
    assert set(sent) == {1, 2}
    assert all((s.leader, s.leader_epoch, tuple(s.isr)) == (1, 4, (1, 2)) for s in sent.values())
    assert all(s.zk_version == landed.zk_version for s in sent.values())


def test_replicas_of_a_topic_being_deleted_get_no_leader_and_isr() -> None:
    h = Harness(live=[1, 2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    h.seed_partition(TP, leader=1, isr=[1, 2, 3])
    h.context.topics_to_be_deleted.add(TOPIC)
    run(h.replicas.handle_state_changes([PartitionReplica(TOPIC, 0, 2)], R.OfflineReplica))
    h.send()
    assert h.channel.requests(ApiKey.LEADER_AND_ISR) == []
    assert h.zk.partition_state(TP).isr == (1, 3)  # type: ignore[union-attr]


# --- version races -------------------------------------------------------------------------------


def test_election_retries_a_version_race_on_a_fresh_read() -> None:
    """Broker 1's last ISR shrink (to [1, 3]) lands after the controller cached [1, 2, 3]: the
    controller's first write fails on the version, and the retry elects from the fresh ISR (3, not
    2, which is no longer in sync)."""
    h = Harness(live=[2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    before = h.seed_partition(TP, leader=1, isr=[1, 2, 3], state=P.OfflinePartition)
    h.zk.tree.on_next_fenced_write(lambda: h.zk.leader_update_isr(TP, [1, 3], notify=False))
    transactions = h.zk.tree.fenced_transactions

    results = run(h.partitions.handle_state_changes([TP], P.OnlinePartition))

    assert h.zk.tree.fenced_transactions - transactions == 2
    after = LeaderAndIsr(3, before.leader_epoch + 1, (3,), h.context.epoch, before.zk_version + 2)
    assert results[TP] == after
    assert h.zk.partition_state(TP) == after == h.context.leadership[TP]
    assert h.context.partition_states[TP] is P.OnlinePartition


def test_isr_removal_retries_a_version_race_on_a_fresh_read() -> None:
    """The leader drops 2 from the ISR while the controller removes 3: the controller's stale
    write would put 2 back; its retry on the fresh state leaves the ISR [1]."""
    h = Harness(live=[1, 2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    before = h.seed_partition(TP, leader=1, isr=[1, 2, 3])
    h.zk.tree.on_next_fenced_write(lambda: h.zk.leader_update_isr(TP, [1, 3], notify=False))

    run(h.replicas.handle_state_changes([PartitionReplica(TOPIC, 0, 3)], R.OfflineReplica))

    after = LeaderAndIsr(1, before.leader_epoch + 1, (1,), h.context.epoch, before.zk_version + 2)
    assert h.zk.partition_state(TP) == after == h.context.leadership[TP]


def test_new_partition_race_with_another_writer_keeps_what_zookeeper_holds() -> None:
    h = Harness(live=[1, 2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    h.context.partition_states[TP] = P.NewPartition
    h.zk.tree.on_next_fenced_write(
        lambda: h.zk.write_partition_state(
            TP, leader=2, leader_epoch=0, isr=[2, 3], controller_epoch=h.context.epoch
        )
    )
    results = run(h.partitions.handle_state_changes([TP], P.OnlinePartition))
    assert results[TP] == h.zk.partition_state(TP) == h.context.leadership[TP]
    assert results[TP].leader == 2  # type: ignore[union-attr]


# --- decisions must read ZooKeeper, not the cache ----------------------------------------------


def test_isr_removal_reads_zookeeper_not_the_cache() -> None:
    """The leader added 2 back to the ISR and its notification has not arrived: the cache says
    [1], ZooKeeper says [1, 2]. Broker 2 dies: it must leave the ISR that ZooKeeper holds."""
    h = Harness(live=[1, 2])
    h.add_topic(TOPIC, {0: [1, 2]})
    h.seed_partition(TP, leader=1, isr=[1])
    h.zk.leader_update_isr(TP, [1, 2], notify=False)
    h.kill(2)
    run(h.replicas.handle_state_changes([PartitionReplica(TOPIC, 0, 2)], R.OfflineReplica))
    assert h.zk.partition_state(TP).isr == (1,)  # type: ignore[union-attr]


def test_election_reads_zookeeper_not_the_cache() -> None:
    """Same race as above, then the leader 1 dies: ZooKeeper's ISR [1, 2] has a live member, 2,
    so a clean election must make it leader although the cache's ISR [1] has none."""
    h = Harness(live=[1, 2])
    h.add_topic(TOPIC, {0: [1, 2]})
    h.seed_partition(TP, leader=1, isr=[1], state=P.OfflinePartition)
    h.zk.leader_update_isr(TP, [1, 2], notify=False)
    h.kill(1)
    results = run(h.partitions.handle_state_changes([TP], P.OnlinePartition))
    assert isinstance(results[TP], LeaderAndIsr)
    assert results[TP].leader == 2
    assert h.context.partition_states[TP] is P.OnlinePartition


# --- a deposed controller ------------------------------------------------------------------------


def test_deposed_controller_cannot_create_partition_states() -> None:
    h = Harness(live=[1, 2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    h.context.partition_states[TP] = P.NewPartition
    h.zk.elect_controller(7)
    with pytest.raises(ControllerMovedError):
        run(h.partitions.handle_state_changes([TP], P.OnlinePartition))
    assert h.zk.partition_state(TP) is None
    assert h.context.partition_states[TP] is P.NewPartition
    assert TP not in h.context.leadership


def test_deposed_controller_cannot_elect_leaders() -> None:
    h = Harness(live=[2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    before = h.seed_partition(TP, leader=1, isr=[1, 2, 3], state=P.OfflinePartition)
    h.zk.elect_controller(7)
    with pytest.raises(ControllerMovedError):
        run(h.partitions.handle_state_changes([TP], P.OnlinePartition))
    assert h.zk.partition_state(TP) == before
    assert h.context.partition_states[TP] is P.OfflinePartition


def test_deposed_controller_cannot_shrink_isr() -> None:
    h = Harness(live=[1, 2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    before = h.seed_partition(TP, leader=1, isr=[1, 2, 3])
    h.zk.elect_controller(7)
    with pytest.raises(ControllerMovedError):
        run(h.replicas.handle_state_changes([PartitionReplica(TOPIC, 0, 2)], R.OfflineReplica))
    assert h.zk.partition_state(TP) == before


def test_controller_deposed_between_its_read_and_its_write_is_fenced() -> None:
    h = Harness(live=[2, 3])
    h.add_topic(TOPIC, {0: [1, 2, 3]})
    before = h.seed_partition(TP, leader=1, isr=[1, 2, 3], state=P.OfflinePartition)
    h.zk.tree.on_next_fenced_write(lambda: h.zk.elect_controller(7))
    with pytest.raises(ControllerMovedError):
        run(h.partitions.handle_state_changes([TP], P.OnlinePartition))
    assert h.zk.partition_state(TP) == before
    assert h.zk.controller_id() == 7


# --- the fakes themselves ------------------------------------------------------------------------


def test_fake_conditional_write_with_a_stale_version_is_a_bad_version_result() -> None:
    zk = FakeControllerZk()
    epoch, version = zk.elect_controller(1)
    state = zk.write_partition_state(TP, leader=1, leader_epoch=0, isr=[1], controller_epoch=epoch)
    zk.leader_update_isr(TP, [1], notify=False)  # bumps the version
    results = run(zk.update_leader_and_isr(version, {TP: state}))
    assert isinstance(results[TP], BadVersionError)
    assert zk.partition_state(TP).zk_version == state.zk_version + 1  # type: ignore[union-attr]


def test_fake_fenced_write_after_a_new_election_raises_controller_moved() -> None:
    zk = FakeControllerZk()
    _, version = zk.elect_controller(1)
    state = zk.write_partition_state(TP, leader=1, leader_epoch=0, isr=[1], controller_epoch=1)
    zk.elect_controller(2)
    mark = len(zk.tree.writes)
    with pytest.raises(ControllerMovedError):
        run(zk.update_leader_and_isr(version, {TP: state}))
    assert zk.tree.writes[mark:] == []


def test_fake_creating_an_existing_state_znode_is_a_node_exists_result() -> None:
    zk = FakeControllerZk()
    epoch, version = zk.elect_controller(1)
    state = zk.write_partition_state(TP, leader=1, leader_epoch=0, isr=[1], controller_epoch=epoch)
    other = (TOPIC, 1)
    new_state = LeaderAndIsr(2, 0, (2,), epoch, 0)
    results = run(zk.create_partition_states(version, {TP: new_state, other: new_state}))
    assert isinstance(results[TP], NodeExistsError)
    assert results[other] == new_state
    assert zk.partition_state(TP) == state


def test_fake_multi_is_all_or_nothing_and_versions_count_sets() -> None:
    tree = FakeZooKeeper(standard_paths=False)
    tree.create("/a", b"1")
    with pytest.raises(BadVersionError):
        tree.multi([SetDataOp("/a", b"2", 0), CreateOp("/b"), SetDataOp("/a", b"3", 0)])
    assert tree.exists("/b") is None
    assert tree.get("/a")[0] == b"1"
    tree.multi([SetDataOp("/a", b"2", 0), SetDataOp("/a", b"3", 1)])
    assert tree.get("/a")[1].version == 2
    with pytest.raises(NoNodeError):
        tree.create("/x/y")
    assert tree.create("/seq-", sequence=True) == "/seq-0000000001"  # root has one child


def test_fake_watches_are_one_shot_and_die_with_their_session() -> None:
    tree = FakeZooKeeper(standard_paths=False)
    tree.create("/parent")
    watcher, other = tree.client(), tree.client()
    seen: list[tuple[str, str | None]] = []
    run(watcher.get_children("/parent", lambda e: seen.append((e.kind.name, e.path))))
    run(watcher.exists("/parent/child", lambda e: seen.append((e.kind.name, e.path))))
    run(other.create("/parent/child", ephemeral=True))
    tree.create("/parent/second")
    assert seen == [("CREATED", "/parent/child"), ("CHILD", "/parent")]
    run(watcher.get("/parent/child", lambda e: seen.append((e.kind.name, e.path))))
    tree.expire_session(watcher.session_id)
    tree.expire_session(other.session_id)  # deletes the ephemeral; the expired watch stays silent
    assert tree.exists("/parent/child") is None
    assert len(seen) == 2
    with pytest.raises(SessionExpiredError):
        run(watcher.get("/parent"))


def test_fake_state_path_helpers_see_only_state_znodes() -> None:
    zk = FakeControllerZk()
    zk.create_topic(TOPIC, {0: [1]})
    zk.write_partition_state(TP, leader=1, leader_epoch=0, isr=[1], controller_epoch=1)
    assert set(zk.partition_states()) == {TP}
    assert zk.tree.exists(TopicPartitionStateZNode.path(*TP)) is not None


def test_recording_channel_refuses_sends_after_shutdown_and_keeps_drops() -> None:
    h = Harness(live=[1, 2])
    h.channel.send(9, ApiKey.UPDATE_METADATA, 7, object(), None)
    assert len(h.channel.dropped) == 1
    run(h.channel.shutdown())
    with pytest.raises(ChannelClosedError):
        h.channel.send(1, ApiKey.UPDATE_METADATA, 7, object(), None)
