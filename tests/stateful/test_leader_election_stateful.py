"""Preferred-replica and unclean elections driven through the controller's real event processor,
among every other thing the controller state machine test does (`ControllerMachine`: brokers dying
and returning, leaders changing ISRs, topics created and deleted, controllers moving).

Two rules make preferred elections have something to do: every live follower catches up, and a
broker leading as preferred replica restarts and catches up. Then three rules, one per trigger of
`odradek.controller.elect_leaders`:

* an admin writes `/admin/preferred_replica_election` (some existing partitions, sometimes one
  that does not exist): afterwards the znode is gone, and exactly the partitions whose preferred
  replica was live, in the ZooKeeper ISR and not leading (and not being deleted) are led by it,
  one leader epoch later, with the ISR unchanged; every other partition's state is untouched;
* an admin client's ElectLeaders (PREFERRED or UNCLEAN) event: every partition gets the answer of
  the table in `elect_leaders`, checked against the ZooKeeper state before the request, and an
  elected leader is what ZooKeeper holds afterwards;
* the rebalance timer fires (after the leaders' ISR notifications are delivered, so the
  controller's cache is ZooKeeper's): afterwards no broker whose imbalance is above 10 % has a
  partition its preferred replica could take.

The inherited invariants audit every write and request these rules cause (leader epochs, one
leader per epoch, fenced writes, LeaderAndIsr only with states ZooKeeper held, no refused
transition). An UNCLEAN request may elect outside the ISR: for its partitions the audit is told
so, exactly as for topics created with unclean election enabled.

Scenarios the machine reaches too rarely are pinned step by step at the end: an unclean election
that succeeds (and one that cannot), NOT_CONTROLLER from the standby, a request left in ZooKeeper
when the controller's session expired (the next controller handles it at failover), an unreadable
request (deleted, and the watch still works), and a timer event of an earlier term (ignored).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import precondition, rule
from kio.schema.errors import ErrorCode

from odradek.controller import events as ev
from odradek.controller.context import LeaderAndIsr, TopicPartition
from odradek.controller.elect_leaders import ElectionType, auto_rebalance_candidates
from odradek.errors import KafkaError, NotControllerError
from odradek.zk.znodes import PreferredReplicaElectionZNode
from odradek.zk.znodes import TopicPartition as ZkTopicPartition
from tests.stateful.test_controller_state_machines import ControllerMachine

UNKNOWN_PARTITION: TopicPartition = ("no-such-topic", 0)
IMBALANCE_PERCENTAGE = 10  # the controllers run with the default AutoRebalanceConfig
FOLLOW_UPS = ("later", "zookeeper", "admin client", "timer", "later", "later")


class LeaderElectionMachine(ControllerMachine):
    # helpers

    def _known_partitions(self) -> list[TopicPartition]:
        return sorted(self.admin.partition_states())

    def _assignment(self, tp: TopicPartition) -> tuple[int, ...]:
        return tuple((self.admin.topic_assignment(tp[0]) or {}).get(tp[1], ()))

    def _draw_request(self, data: st.DataObject) -> list[TopicPartition]:
        known = self._known_partitions()
        chosen = data.draw(st.lists(st.sampled_from(known), min_size=1, unique=True), label="tps")
        if data.draw(st.booleans(), label="with an unknown partition"):
            chosen.append(UNKNOWN_PARTITION)
        return chosen

    def _preferred_can_lead(self, tp: TopicPartition, state: LeaderAndIsr) -> bool:
        assignment = self._assignment(tp)
        return bool(assignment) and assignment[0] in self.live() and assignment[0] in state.isr

    def _assert_preferred_elected(self, tp: TopicPartition, before: LeaderAndIsr) -> None:
        after = self.admin.partition_state(tp)
        assert after is not None
        assert after.leader == self._assignment(tp)[0], f"{tp}: {after}"
        assert after.leader_epoch == before.leader_epoch + 1, f"{tp}: {before} -> {after}"
        assert after.isr == before.isr, f"{tp}: ISR {before.isr} -> {after.isr}"

    # rules

    @precondition(lambda self: bool(self.candidates) and bool(self._led_partitions()))
    @rule()
    def followers_catch_up(self) -> None:
        """Every live follower catches up and its leader adds it to the ISR (notifying the
        controller): what makes a returned preferred replica electable again. Without this rule
        a returning broker rejoins ISRs only by chance, and preferred elections would almost
        never have anything to move."""
        live = self.live()
        for tp in self._led_partitions():
            state = self.admin.partition_state(tp)
            assert state is not None
            isr = [r for r in self._assignment(tp) if r in live or r in state.isr]
            if state.leader in isr and sorted(isr) != sorted(state.isr):
                self.admin.leader_update_isr(tp, isr, notify=True)
                self.pending_isr_notifications.discard(tp)
        self.drain()

    def _preferred_leaders(self) -> list[int]:
        live = self.live()
        return sorted(
            {
                state.leader
                for tp, state in self.admin.partition_states().items()
                if state.leader in live and self._assignment(tp)[:1] == (state.leader,)
            }
        )

    @precondition(lambda self: bool(self.candidates) and bool(self._preferred_leaders()))
    @rule(data=st.data())
    def preferred_leader_restarts_and_catches_up(self, data: st.DataObject) -> None:
        """A broker leading partitions as their preferred replica dies (its leaderships move
        away), returns and catches up: the situation preferred elections exist for, in one
        step."""
        broker_id = data.draw(st.sampled_from(self._preferred_leaders()), label="broker")
        self.kill(broker_id)
        self.drain()
        self.register(broker_id)
        self.drain()
        self.followers_catch_up()
        # Elect at once half of the time (other rules may run in between otherwise, and a
        # preferred replica that dies again has nothing to gain).
        every = self._known_partitions()
        trigger = data.draw(st.sampled_from(FOLLOW_UPS), label="then")
        if trigger == "zookeeper":
            self._zookeeper_election(every)
        elif trigger == "admin client":
            self._admin_client_election(every, ElectionType.PREFERRED)
        elif trigger == "timer":
            self._rebalance_timer()

    @precondition(lambda self: bool(self.candidates) and bool(self.admin.partition_states()))
    @rule(data=st.data())
    def admin_requests_preferred_election_in_zookeeper(self, data: st.DataObject) -> None:
        self._zookeeper_election(self._draw_request(data))

    def _zookeeper_election(self, requested: list[TopicPartition]) -> None:
        before = self.admin.partition_states()
        deleting = self.admin.topics_queued_for_deletion()
        path = PreferredReplicaElectionZNode.path()
        payload = PreferredReplicaElectionZNode.encode(ZkTopicPartition(*tp) for tp in requested)
        self.tree.create(path, payload, makepath=True)
        self.drain()
        assert self.tree.exists(path) is None, "the request stayed in ZooKeeper"
        after = self.admin.partition_states()
        for tp in requested:
            if tp not in before:
                continue
            state = before[tp]
            movable = (
                tp[0] not in deleting
                and state.leader != self._assignment(tp)[0]
                and self._preferred_can_lead(tp, state)
            )
            if movable:
                self._assert_preferred_elected(tp, state)
            else:
                assert after.get(tp) == state, f"{tp} changed: {state} -> {after.get(tp)}"
        for tp in set(before) - set(requested):
            assert after.get(tp) == before[tp], f"{tp} was not asked for but changed"

    @precondition(lambda self: bool(self.candidates) and bool(self.admin.partition_states()))
    @rule(data=st.data(), election_type=st.sampled_from(ElectionType))
    def admin_client_elects_leaders(self, data: st.DataObject, election_type: ElectionType) -> None:
        self._admin_client_election(self._draw_request(data), election_type)

    def _admin_client_election(
        self, requested: list[TopicPartition], election_type: ElectionType
    ) -> None:
        self._audit_writes()  # the writes so far under the usual rules
        before = self.admin.partition_states()
        live = self.live()
        deleting = self.admin.topics_queued_for_deletion()
        result: asyncio.Future[Any] = self.loop.create_future()
        self.active.queue.put(
            ev.ReplicaLeaderElection(frozenset(requested), int(election_type), result)
        )
        allowed = {tp[0]: True for tp in requested} if election_type is ElectionType.UNCLEAN else {}
        saved, self.unclean = self.unclean, {**self.unclean, **allowed}
        try:
            self.drain()
            self._audit_writes()
        finally:
            self.unclean = saved
        assert result.done() and result.exception() is None, result
        outcomes: dict[TopicPartition, int | KafkaError] = result.result()
        assert set(outcomes) == set(requested)
        for tp, outcome in outcomes.items():
            self._check_outcome(tp, outcome, election_type, before.get(tp), live, deleting)

    def _check_outcome(
        self,
        tp: TopicPartition,
        outcome: int | KafkaError,
        election_type: ElectionType,
        state: LeaderAndIsr | None,
        live: set[int],
        deleting: set[str],
    ) -> None:
        code = outcome.code if isinstance(outcome, KafkaError) else ErrorCode.none
        if state is None:
            assert code == ErrorCode.unknown_topic_or_partition, (tp, outcome)
            return
        if tp[0] in deleting:
            assert code == ErrorCode.invalid_topic_exception, (tp, outcome)
            return
        assignment = self._assignment(tp)
        if election_type is ElectionType.PREFERRED:
            if state.leader == assignment[0]:
                assert code == ErrorCode.election_not_needed, (tp, outcome)
            elif self._preferred_can_lead(tp, state):
                assert outcome == assignment[0], (tp, outcome)
                self._assert_preferred_elected(tp, state)
            else:
                assert code == ErrorCode.preferred_leader_not_available, (tp, outcome)
            return
        if state.leader in live:
            assert code == ErrorCode.election_not_needed, (tp, outcome)
        elif not set(assignment) & live:
            assert code == ErrorCode.eligible_leaders_not_available, (tp, outcome)
        else:
            in_isr = [r for r in assignment if r in live and r in state.isr]
            expected = in_isr[0] if in_isr else next(r for r in assignment if r in live)
            assert outcome == expected, (tp, outcome, state)
            after = self.admin.partition_state(tp)
            assert after is not None and after.leader == expected
            assert after.leader_epoch == state.leader_epoch + 1

    @precondition(lambda self: bool(self.candidates))
    @rule()
    def leader_rebalance_timer_fires(self) -> None:
        self._rebalance_timer()

    def _rebalance_timer(self) -> None:
        if self.pending_isr_notifications:
            self.deliver_isr_notifications()
        controller = self.active.controller
        self.active.queue.put(
            ev.AutoPreferredReplicaLeaderElection(generation=controller._generation)
        )
        self.drain()
        deleting = self.admin.topics_queued_for_deletion()
        states = self.admin.partition_states()
        assignments = {
            tp: self._assignment(tp)
            for topic in self.zk_topics()
            if topic not in deleting
            for tp in ((topic, p) for p in (self.admin.topic_assignment(topic) or {}))
        }
        leadership = {tp: (s.leader, s.isr) for tp, s in states.items() if tp in assignments}
        left = auto_rebalance_candidates(assignments, leadership, self.live(), IMBALANCE_PERCENTAGE)
        assert left == [], f"still imbalanced after the rebalance: {left}"


LeaderElectionMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLeaderElectionMachine = LeaderElectionMachine.TestCase


# --- scenarios, step by step ----------------------------------------------------------------------


@pytest.fixture
def machine() -> Iterator[LeaderElectionMachine]:
    m = LeaderElectionMachine()
    try:
        yield m
    finally:
        m.teardown()


def _elect(
    machine: LeaderElectionMachine, partitions: set[TopicPartition], election_type: ElectionType
) -> dict[TopicPartition, Any]:
    result: asyncio.Future[Any] = machine.loop.create_future()
    machine.active.queue.put(
        ev.ReplicaLeaderElection(frozenset(partitions), int(election_type), result)
    )
    machine.drain()
    assert result.done()
    return result.result()  # type: ignore[no-any-return]


def _displaced(machine: LeaderElectionMachine) -> None:
    """Brokers 1-3, topic t with partition 0 preferring 1 and partition 1 preferring 2; broker 1
    restarts and catches up, so t-0 is led by 2."""
    machine.start({1, 2, 3})
    machine.admin.create_topic("t", {0: [1, 2, 3], 1: [2, 3, 1]})
    machine.drain()
    machine.kill(1)
    machine.drain()
    machine.register(1)
    machine.drain()
    machine.followers_catch_up()
    state = machine.admin.partition_state(("t", 0))
    assert state is not None and state.leader == 2 and sorted(state.isr) == [1, 2, 3]


def test_unclean_election_elects_a_live_replica_outside_the_isr(
    machine: LeaderElectionMachine,
) -> None:
    machine.start({1, 2})
    machine.admin.create_topic("t", {0: [1, 2]}, config={"unclean.leader.election.enable": "false"})
    machine.drain()
    machine.kill(2)  # out of the ISR
    machine.drain()
    machine.kill(1)  # the last ISR member: offline
    machine.drain()
    machine.register(2)  # back, but not in the ISR: stays offline (unclean election is off)
    machine.drain()
    offline = machine.admin.partition_state(("t", 0))
    assert offline is not None and (offline.leader, offline.isr) == (-1, (1,))

    preferred = _elect(machine, {("t", 0)}, ElectionType.PREFERRED)
    assert preferred[("t", 0)].code == ErrorCode.preferred_leader_not_available
    assert _elect(machine, {("t", 0)}, ElectionType.UNCLEAN) == {("t", 0): 2}
    elected = machine.admin.partition_state(("t", 0))
    assert elected is not None
    assert (elected.leader, elected.isr, elected.leader_epoch) == (
        2,
        (2,),
        offline.leader_epoch + 1,
    )
    again = _elect(machine, {("t", 0)}, ElectionType.UNCLEAN)
    assert again[("t", 0)].code == ErrorCode.election_not_needed


def test_unclean_election_without_a_live_replica_is_not_possible(
    machine: LeaderElectionMachine,
) -> None:
    machine.start({1, 2})
    machine.admin.create_topic("t", {0: [1]})
    machine.drain()
    machine.kill(1)
    machine.drain()
    outcome = _elect(machine, {("t", 0)}, ElectionType.UNCLEAN)[("t", 0)]
    assert outcome.code == ErrorCode.eligible_leaders_not_available


def test_a_broker_that_is_not_the_controller_answers_not_controller(
    machine: LeaderElectionMachine,
) -> None:
    _displaced(machine)
    standby = next(c for c in machine.candidates if c is not machine.active)
    result: asyncio.Future[Any] = machine.loop.create_future()
    standby.queue.put(ev.ReplicaLeaderElection(frozenset({("t", 0)}), 0, result))
    machine.drain()
    assert isinstance(result.exception(), NotControllerError)
    state = machine.admin.partition_state(("t", 0))
    assert state is not None and state.leader == 2


def test_a_request_left_in_zookeeper_is_handled_by_the_next_controller(
    machine: LeaderElectionMachine,
) -> None:
    """The znode is written, and the controller's session expires before it handles the watch:
    the new controller finds the request at failover, elects, and deletes it."""
    _displaced(machine)
    path = PreferredReplicaElectionZNode.path()
    machine.tree.create(
        path, PreferredReplicaElectionZNode.encode([ZkTopicPartition("t", 0)]), makepath=True
    )
    old = machine.active
    assert any(isinstance(e, ev.PreferredReplicaElection) for e in old.queue.events)
    machine.tree.expire_session(old.zk.client.session_id)
    old.queue.preempt_all_and_put(ev.Expire(), old.controller)
    standby = next(c for c in machine.candidates if c is not old)
    machine.drain(first=standby)
    assert machine.active is standby
    assert machine.tree.exists(path) is None
    state = machine.admin.partition_state(("t", 0))
    assert state is not None and state.leader == 1


def test_an_unreadable_request_is_deleted_and_changes_nothing(
    machine: LeaderElectionMachine,
) -> None:
    _displaced(machine)
    before = machine.admin.partition_states()
    path = PreferredReplicaElectionZNode.path()
    machine.tree.create(path, b'{"version":1,"partitions":[{"topic":"t"}]}', makepath=True)
    machine.drain()
    assert machine.tree.exists(path) is None
    assert machine.admin.partition_states() == before
    # and the watch is armed again: the next request works
    machine.tree.create(
        path, PreferredReplicaElectionZNode.encode([ZkTopicPartition("t", 0)]), makepath=True
    )
    machine.drain()
    assert machine.tree.exists(path) is None
    state = machine.admin.partition_state(("t", 0))
    assert state is not None and state.leader == 1


def test_a_timer_event_of_an_earlier_term_is_ignored(machine: LeaderElectionMachine) -> None:
    _displaced(machine)
    controller = machine.active.controller
    machine.active.queue.put(
        ev.AutoPreferredReplicaLeaderElection(generation=controller._generation - 1)
    )
    machine.drain()
    state = machine.admin.partition_state(("t", 0))
    assert state is not None and state.leader == 2
    machine.active.queue.put(
        ev.AutoPreferredReplicaLeaderElection(generation=controller._generation)
    )
    machine.drain()
    state = machine.admin.partition_state(("t", 0))
    assert state is not None and state.leader == 1
