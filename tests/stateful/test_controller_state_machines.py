"""The controller's two state machines driven through its real event processor by hypothesis.

Two controller candidates (`KafkaController`, each with its own session on one in-memory ZooKeeper)
and up to five brokers. The rules play everyone but the controller, by changing ZooKeeper as they
would and then letting the controllers handle whatever their watches queued:

* admins create topics (random partitions, RF and unclean-election config, with or without a topic
  id), add partitions, and queue topics for deletion;
* brokers register, die, bounce (re-register with a new epoch before the controller looks), shut
  down cleanly (ControlledShutdown, retried as a broker does, then deregister), and answer the
  controller's requests in order (StopReplica with or without errors);
* leaders shrink or expand their ISR with a conditional write, notifying the controller at once or
  later (so that the controller's own writes race them and must retry on BadVersion);
* the active controller's session expires, or it is deposed while it still has an event to handle
  (its writes must be fenced by `/controller_epoch`).

Watches are the only way the controllers hear of changes (the fake ZooKeeper fires them), so a lost
watch shows up as a broken invariant. After every step, with every queue drained, the invariants
below are checked against the active controller and the fake ZooKeeper, and every partition state
write and request since the previous step is audited.

Known controller bugs the machine found are pinned by strict-xfail scenarios at the end of this
file (and in tests/unit/test_state_machines.py); until they are fixed the machine tolerates exactly
their symptoms (see the class attributes of `ControllerMachine`).

Run: `.venv/bin/pytest tests/stateful/test_controller_state_machines.py`. A failure prints the
shortest step sequence hypothesis found; `--hypothesis-seed=N` repeats a run.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from unittest import mock

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kio.schema.errors import ErrorCode

from odradek.controller import events as ev
from odradek.controller import failover as failover_module
from odradek.controller.channel_manager import LEADER_DURING_DELETE
from odradek.controller.context import PartitionReplica, TopicPartition
from odradek.controller.controller import KafkaController
from odradek.controller.states import STATE_CHANGE_LOGGER_NAME, PartitionState, ReplicaState
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey
from odradek.protocol.messages import (
    LeaderAndIsrResponseV5,
    StopReplicaResponseV3,
    UpdateMetadataResponseV7,
)
from odradek.protocol.topic_ids import uuid_to_topic_id
from odradek.zk.errors import ConnectionLossError, ControllerMovedError
from odradek.zk.znodes import BrokerIdsZNode, ControllerEpochZNode, ControllerZNode
from tests.fakes.channel import RecordingChannelManager, SentRequest
from tests.fakes.controller_zk import (
    FakeControllerZk,
    FakeZooKeeper,
    PartitionStateWrite,
    decode_partition_state_write,
)

T = TypeVar("T")

BROKER_IDS = (1, 2, 3, 4, 5)
CANDIDATE_IDS = (101, 102)
TOPIC_NAMES = ("alpha", "beta", "gamma", "delta")
UNCLEAN_CONFIG = "unclean.leader.election.enable"
MAX_EVENTS_PER_STEP = 1_000
SHUTDOWN_RETRIES = 3  # as a broker's controlled.shutdown.max.retries
# Controller moves per example: enough for failover after failover, few enough to stay fast.
MAX_CONTROLLER_MOVES = 12


class InlineEventQueue:
    """Stands in for `ControllerEventManager`: the controller's `put` lands here, and the test
    processes the events one at a time, in order, when it drains the queues."""

    def __init__(self) -> None:
        self.events: deque[Any] = deque()

    def put(self, event: Any) -> None:
        self.events.append(event)

    def put_threadsafe(self, event: Any) -> None:
        self.events.append(event)

    def preempt_all_and_put(self, event: Any, processor: KafkaController) -> None:
        """What `ControllerEventManager.clear_and_put` does on a session expiry."""
        while self.events:
            processor.preempt(self.events.popleft())
        self.events.append(event)


@dataclass
class Candidate:
    """A broker's controller component with its own ZooKeeper session and event queue."""

    broker_id: int
    zk: FakeControllerZk
    controller: KafkaController
    queue: InlineEventQueue


@dataclass
class ChannelRecord:
    """A channel created by a failover, with the epoch its controller was elected with."""

    owner: int
    epoch: int
    channel: RecordingChannelManager
    audited: int = 0


class StateChangeErrors(logging.Handler):
    """Collects the ERROR lines of the `state.change` logger: refused transitions."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@dataclass
class History:
    """What the audit of ZooKeeper's write log has learned so far."""

    audited_writes: int = 0
    epoch: int = 0  # /controller_epoch as of the last audited write
    last_state: dict[TopicPartition, Any] = field(default_factory=dict)
    ever_held: dict[TopicPartition, set[tuple[int, int, tuple[int, ...], int]]] = field(
        default_factory=dict
    )
    leader_of_epoch: dict[TopicPartition, dict[int, int]] = field(default_factory=dict)


class ControllerMachine(RuleBasedStateMachine):
    # Switches for the known-bug tolerances this test once needed; the bugs are fixed and each has
    # a regression test at the end of this file, so every check is on.
    CHECK_DELETION_ACKS = True
    KNOWN_REFUSED_TRANSITIONS: tuple[tuple[str, str], ...] = ()
    TOLERATE_STALE_CACHE_DECISIONS = False

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tree = FakeZooKeeper()
        self.admin = FakeControllerZk(self.tree)  # brokers', admins' and leaders' writes
        self.candidates: list[Candidate] = []
        self.channels: list[ChannelRecord] = []
        self.unclean: dict[str, bool] = {}
        self.pending_isr_notifications: set[TopicPartition] = set()
        self.stale_cache_ok: set[TopicPartition] = set()
        self.decided_on_stale_cache: set[TopicPartition] = set()
        self.acknowledged_deletions: set[tuple[str, int, int]] = set()
        self.history = History()
        self.topic_counter = 0
        self.controller_moves = 0
        self.replicas_of_dead: set[PartitionReplica] = set()
        self.state_errors = StateChangeErrors()
        logging.getLogger(STATE_CHANGE_LOGGER_NAME).addHandler(self.state_errors)
        self._patch = mock.patch.object(
            failover_module, "ControllerChannelManager", self._new_channel
        )
        self._patch.start()

    def teardown(self) -> None:
        self._patch.stop()
        logging.getLogger(STATE_CHANGE_LOGGER_NAME).removeHandler(self.state_errors)
        pending = asyncio.all_tasks(self.loop)
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    # plumbing

    def _new_channel(
        self, controller_id: int, request_timeout: float, *_listener_and_security: Any
    ) -> RecordingChannelManager:
        channel = RecordingChannelManager(controller_id, request_timeout)
        owner = next(c for c in self.candidates if c.broker_id == controller_id)
        self.channels.append(ChannelRecord(controller_id, owner.controller.context.epoch, channel))
        return channel

    def run(self, coroutine: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coroutine)

    async def _process(self, candidate: Candidate, event: Any) -> None:
        """One event, as the event manager runs it; only a fenced write or a lost connection
        (injected) may fail (and must be handled by `on_error`): any other exception fails the
        test."""
        try:
            await candidate.controller.process(event)
        except (ControllerMovedError, ConnectionLossError) as error:
            await candidate.controller.on_error(event, error)

    def drain(self, first: Candidate | None = None) -> None:
        """Process queued events until every queue is empty; `first`'s queue has priority."""
        order = list(self.candidates)
        if first is not None:
            order.remove(first)
            order.insert(0, first)
        for _ in range(MAX_EVENTS_PER_STEP):
            busy = next((c for c in order if c.queue.events), None)
            if busy is None:
                return
            self.decided_on_stale_cache |= self.stale_cache_ok
            self.run(self._process(busy, busy.queue.events.popleft()))
        raise AssertionError(f"the controllers still had events after {MAX_EVENTS_PER_STEP}")

    @property
    def active(self) -> Candidate:
        active = [c for c in self.candidates if c.controller.is_active]
        assert len(active) == 1, f"{len(active)} active controllers"
        return active[0]

    def active_channel(self) -> RecordingChannelManager:
        controller = self.active.controller
        assert isinstance(controller.channel, RecordingChannelManager)
        return controller.channel

    def kill(self, broker_id: int) -> None:
        """A broker's session ends. Its replicas the controller knows of must not stay online."""
        if self.candidates:
            context = self.active.controller.context
            self.replicas_of_dead.update(context.replicas_on_brokers({broker_id}))
        self.admin.deregister_broker(broker_id)

    def register(self, broker_id: int) -> None:
        self.replicas_of_dead = {r for r in self.replicas_of_dead if r.replica != broker_id}
        self.admin.register_broker(broker_id)

    def live(self) -> set[int]:
        return self.admin.registered_broker_ids()

    def dead(self) -> set[int]:
        return set(BROKER_IDS) - self.live()

    def zk_topics(self) -> set[str]:
        return self.admin.topics()

    def deletable_topics(self) -> list[str]:
        return sorted(self.zk_topics() - self.admin.topics_queued_for_deletion())

    # set-up

    @initialize(live=st.sets(st.sampled_from(BROKER_IDS), min_size=1), data=st.data())
    def start_cluster(self, live: set[int], data: st.DataObject) -> None:
        """Brokers, both candidates (the first to handle its Startup wins), one or two topics."""
        self.start(live)
        for _ in range(data.draw(st.integers(1, 2), label="initial topics")):
            self._create_topic(data)

    def start(self, live: set[int]) -> None:
        for broker_id in sorted(live):
            self.register(broker_id)
        for broker_id in CANDIDATE_IDS:
            zk = FakeControllerZk(self.tree)
            controller = KafkaController(
                broker_id,
                zk.client,  # type: ignore[arg-type]
                request_timeout=30.0,
                unclean_leader_election_default=False,
                delete_topic_enable=True,
                register_broker=_nothing,
            )
            queue = InlineEventQueue()
            controller.event_manager = queue  # type: ignore[assignment]
            queue.put(ev.Startup())
            self.candidates.append(Candidate(broker_id, zk, controller, queue))
        self.drain()

    def _create_topic(self, data: st.DataObject) -> None:
        free = sorted(set(TOPIC_NAMES) - self.zk_topics() - self.admin.topics_queued_for_deletion())
        live = sorted(self.live())
        if not free or not live:
            return
        topic = data.draw(st.sampled_from(free), label="topic")
        partitions = data.draw(st.integers(1, 3), label="partitions")
        rf = data.draw(st.integers(1, min(3, len(live))), label="rf")
        assignment = {
            p: tuple(data.draw(st.permutations(live), label=f"replicas of {p}")[:rf])
            for p in range(partitions)
        }
        unclean = data.draw(st.booleans(), label="unclean")
        with_id = data.draw(st.booleans(), label="with topic id")
        if data.draw(st.booleans(), label="a broker dies before the controller sees the topic"):
            self.kill(data.draw(st.sampled_from(live), label="broker"))
        self.replicas_of_dead = {r for r in self.replicas_of_dead if r.topic != topic}
        self.decided_on_stale_cache = {tp for tp in self.decided_on_stale_cache if tp[0] != topic}
        self.topic_counter += 1
        topic_id = uuid_to_topic_id(uuid.UUID(int=self.topic_counter)) if with_id else None
        self.unclean[topic] = unclean
        self.acknowledged_deletions = {r for r in self.acknowledged_deletions if r[0] != topic}
        self.admin.create_topic(
            topic,
            assignment,
            config={UNCLEAN_CONFIG: "true" if unclean else "false"},
            topic_id=topic_id,
        )
        self.drain()

    # admins

    @precondition(lambda self: bool(self.live()) and len(self.zk_topics()) < len(TOPIC_NAMES))
    @rule(data=st.data())
    def create_topic(self, data: st.DataObject) -> None:
        self._create_topic(data)

    @precondition(lambda self: bool(self.live()) and bool(self.deletable_topics()))
    @rule(data=st.data())
    def add_partitions(self, data: st.DataObject) -> None:
        topic = data.draw(st.sampled_from(self.deletable_topics()), label="topic")
        current = self.admin.topic_assignment(topic)
        assert current is not None
        live = sorted(self.live())
        rf = min(len(current[0]), len(live))
        count = data.draw(st.integers(1, 2), label="new partitions")
        added = {
            p: tuple(data.draw(st.permutations(live), label=f"replicas of {p}")[:rf])
            for p in range(len(current), len(current) + count)
        }
        self.admin.add_partitions(topic, added)
        self.drain()

    @precondition(lambda self: bool(self.deletable_topics()))
    @rule(data=st.data())
    def delete_topic(self, data: st.DataObject) -> None:
        topic = data.draw(st.sampled_from(self.deletable_topics()), label="topic")
        self.admin.request_topic_deletion(topic)
        self.drain()

    # brokers

    @precondition(lambda self: bool(self.live()))
    @rule(data=st.data())
    def kill_broker(self, data: st.DataObject) -> None:
        broker_id = data.draw(st.sampled_from(sorted(self.live())), label="broker")
        self.kill(broker_id)
        self.drain()

    @precondition(lambda self: bool(self.dead()))
    @rule(data=st.data())
    def start_broker(self, data: st.DataObject) -> None:
        broker_id = data.draw(st.sampled_from(sorted(self.dead())), label="broker")
        self.register(broker_id)
        self.drain()

    @precondition(lambda self: bool(self.live()))
    @rule(data=st.data())
    def bounce_broker(self, data: st.DataObject) -> None:
        """The broker restarts before the controller handles the change: same id, new epoch."""
        broker_id = data.draw(st.sampled_from(sorted(self.live())), label="broker")
        self.kill(broker_id)
        self.register(broker_id)
        self.drain()

    @precondition(lambda self: bool(self.live()))
    @rule(data=st.data())
    def controlled_shutdown(self, data: st.DataObject) -> None:
        """ControlledShutdown, retried while the broker still leads something, then the broker
        stops (deregisters) whatever the answer, as Kafka's broker does."""
        broker_id = data.draw(st.sampled_from(sorted(self.live())), label="broker")
        self._controlled_shutdown(broker_id)

    def _controlled_shutdown(self, broker_id: int) -> None:
        candidate = self.active
        broker_epoch = candidate.controller.context.broker_epoch(broker_id)
        for _ in range(SHUTDOWN_RETRIES):
            result: asyncio.Future[Any] = self.loop.create_future()
            candidate.queue.put(ev.ControlledShutdown(broker_id, broker_epoch, result))
            self.drain()
            assert result.done(), "ControlledShutdown was never answered"
            assert result.exception() is None, f"ControlledShutdown failed: {result.exception()}"
            if not result.result():
                break
        self.kill(broker_id)
        self.drain()

    @precondition(lambda self: bool(self._brokers_with_pending_requests()))
    @rule(data=st.data())
    def broker_answers(self, data: st.DataObject) -> None:
        """One broker answers its oldest requests, in order, up to and including the first
        StopReplica; a StopReplica with deletion may fail for some partitions."""
        channel = self.active_channel()
        broker_id = data.draw(
            st.sampled_from(self._brokers_with_pending_requests()), label="broker"
        )
        while channel.pending(broker_id):
            request = channel.pending(broker_id)[0]
            failing: set[TopicPartition] = set()
            if request.api_key == ApiKey.STOP_REPLICA:
                partitions = sorted(_stop_replica_partitions(request))
                if partitions:
                    failing = data.draw(st.sets(st.sampled_from(partitions)), label="failing")
            self.answer_next(broker_id, failing)
            if request.api_key == ApiKey.STOP_REPLICA:
                break

    def answer_next(self, broker_id: int, failing: set[TopicPartition] | None = None) -> None:
        """The broker answers its oldest request (StopReplica partitions in `failing` with
        KAFKA_STORAGE_ERROR); the controllers handle the response."""
        channel = self.active_channel()
        request = channel.pending(broker_id)[0]
        failing = failing or set()
        if request.api_key == ApiKey.STOP_REPLICA:
            for tp, delete in _stop_replica_partitions(request).items():
                if delete and tp not in failing:
                    self.acknowledged_deletions.add((*tp, broker_id))
        channel.answer_next(broker_id, lambda r: _response(r, failing))
        self.drain()

    def answer_through_next_stop_replica(self, broker_id: int) -> None:
        channel = self.active_channel()
        while channel.pending(broker_id):
            api_key = channel.pending(broker_id)[0].api_key
            self.answer_next(broker_id)
            if api_key == ApiKey.STOP_REPLICA:
                return
        raise AssertionError(f"broker {broker_id} had no StopReplica to answer")

    def _brokers_with_pending_requests(self) -> list[int]:
        if not self.candidates:
            return []
        channel = self.active_channel()
        return sorted({r.broker_id for r in channel.pending()} & self.live())

    # leaders

    def _led_partitions(self) -> list[TopicPartition]:
        live = self.live()
        deleting = self.admin.topics_queued_for_deletion()
        return sorted(
            tp
            for tp, state in self.admin.partition_states().items()
            if state.leader in live and tp[0] not in deleting
        )

    def _leader_changes_isr(self, data: st.DataObject, notify: bool) -> TopicPartition | None:
        """A leader shrinks or expands its ISR (conditional write) and notifies the controller
        now or later. Only live replicas can rejoin; any follower can be dropped."""
        tp = data.draw(st.sampled_from(self._led_partitions()), label="partition")
        state = self.admin.partition_state(tp)
        assignment = self.admin.topic_assignment(tp[0])
        assert state is not None and assignment is not None
        live = self.live()
        followers = [
            r for r in assignment[tp[1]] if r != state.leader and (r in state.isr or r in live)
        ]
        chosen = data.draw(
            st.sets(st.sampled_from(followers)) if followers else st.just(set()), label="ISR"
        )
        isr = [state.leader, *(r for r in followers if r in chosen)]
        if sorted(isr) == sorted(state.isr):
            return None
        self.admin.leader_update_isr(tp, isr, notify=notify)
        if notify:
            self.stale_cache_ok.discard(tp)
        else:
            self.pending_isr_notifications.add(tp)
            self.stale_cache_ok.add(tp)
        return tp

    @precondition(lambda self: bool(self._led_partitions()))
    @rule(data=st.data(), notify=st.booleans())
    def leader_changes_isr(self, data: st.DataObject, notify: bool) -> None:
        self._leader_changes_isr(data, notify)
        self.drain()

    @precondition(lambda self: bool(self._led_partitions()))
    @rule(data=st.data(), clean=st.booleans())
    def isr_change_races_the_controller(self, data: st.DataObject, clean: bool) -> None:
        """A leader changes the ISR and, before its notification, a replica of that partition
        shuts down (cleanly or not): the controller's write names a stale version and must
        retry on a fresh read."""
        tp = self._leader_changes_isr(data, notify=False)
        if tp is None:
            return
        assignment = self.admin.topic_assignment(tp[0]) or {}
        victims = sorted(set(assignment.get(tp[1], ())) & self.live())
        broker_id = data.draw(st.sampled_from(victims), label="broker")
        if clean:
            self._controlled_shutdown(broker_id)
        else:
            self.kill(broker_id)
            self.drain()

    @precondition(lambda self: bool(self.pending_isr_notifications))
    @rule()
    def deliver_isr_notifications(self) -> None:
        self.admin.notify_isr_change(sorted(self.pending_isr_notifications))
        self.pending_isr_notifications.clear()
        self.stale_cache_ok.clear()
        self.drain()

    # controllers

    @precondition(lambda self: self.controller_moves < MAX_CONTROLLER_MOVES)
    @rule(data=st.data())
    def controller_session_expires(self, data: st.DataObject) -> None:
        """ZooKeeper expires the active controller's session: `/controller` goes, the other
        candidate hears of it; the old one resigns, reconnects and re-registers."""
        self.controller_moves += 1
        old = self.active
        self.tree.expire_session(old.zk.client.session_id)
        old.queue.preempt_all_and_put(ev.Expire(), old.controller)
        first = data.draw(st.sampled_from(self.candidates), label="first to act")
        self.drain(first=first)
        old.zk.client.renew()
        old.queue.put(ev.RegisterBrokerAndReelect())
        self.drain()

    @precondition(lambda self: bool(self.live()) and self.controller_moves < MAX_CONTROLLER_MOVES)
    @rule(data=st.data())
    def controller_deposed_while_busy(self, data: st.DataObject) -> None:
        """A broker dies and, before the active controller handles it, an operator deletes
        `/controller`: the other candidate wins and handles everything first, then the old one
        handles its stale BrokerChange, whose writes must be fenced, and resigns."""
        self.controller_moves += 1
        old = self.active
        broker_id = data.draw(st.sampled_from(sorted(self.live())), label="broker")
        self.kill(broker_id)
        self.tree.delete(ControllerZNode.path())
        standby = next(c for c in self.candidates if c is not old)
        self.drain(first=standby)
        assert not old.controller.is_active

    # invariants

    @invariant()
    def one_controller_with_the_current_epoch(self) -> None:
        if not self.candidates:
            return
        context = self.active.controller.context
        epoch, epoch_zk_version = self.admin.controller_epoch()
        assert (context.epoch, context.epoch_zk_version) == (epoch, epoch_zk_version)
        assert self.admin.controller_id() == self.active.broker_id

    @invariant()
    def context_mirrors_zookeeper(self) -> None:
        """Live brokers, assignments and the leader/ISR cache equal what ZooKeeper holds (except
        partitions whose leader's ISR change has not been notified yet)."""
        if not self.candidates:
            return
        context = self.active.controller.context
        assert set(context.live_brokers) == self.live()
        for broker_id, info in context.live_brokers.items():
            assert info.broker_epoch == self.tree.get(f"/brokers/ids/{broker_id}")[1].czxid
        zk_assignments = {t: self.admin.topic_assignment(t) for t in self.zk_topics()}
        assert context.assignments == zk_assignments
        zk_states = self.admin.partition_states()
        for tp in list(self.stale_cache_ok):
            if context.leadership.get(tp) == zk_states.get(tp):
                self.stale_cache_ok.discard(tp)
        for tp in set(zk_states) | set(context.leadership):
            if tp in self.stale_cache_ok:
                continue
            assert context.leadership.get(tp) == zk_states.get(tp), f"cache of {tp}"

    @invariant()
    def online_partitions_have_a_live_leader_in_their_isr(self) -> None:
        if not self.candidates:
            return
        context = self.active.controller.context
        live = self.live()
        for tp in context.partitions_in_states(PartitionState.OnlinePartition):
            state = context.leadership[tp]
            assert state.leader in live, f"{tp} is online with dead leader {state.leader}"
            assert state.leader in state.isr, f"{tp}: leader {state.leader} not in {state.isr}"

    @invariant()
    def replica_states_agree_with_brokers_and_partitions(self) -> None:
        """Replicas the controller knew when their broker died are not OnlineReplica (replicas
        of partitions created on a dead broker are, as in Kafka); every replica of an
        OnlinePartition on a live broker is OnlineReplica or NewReplica."""
        if not self.candidates:
            return
        context = self.active.controller.context
        live = self.live()
        for replica in self.replicas_of_dead:
            state = context.replica_states.get(replica)
            assert state is not ReplicaState.OnlineReplica, f"{replica} of a dead broker"
        for tp in context.partitions_in_states(PartitionState.OnlinePartition):
            for broker_id in context.partition_replica_assignment(tp):
                if broker_id in live:
                    state = context.replica_states.get(PartitionReplica(*tp, broker_id))
                    assert state in (ReplicaState.OnlineReplica, ReplicaState.NewReplica), (
                        f"replica {broker_id} of online {tp} is {state}"
                    )

    def _exempt(self, tp: TopicPartition) -> bool:
        return self.TOLERATE_STALE_CACHE_DECISIONS and tp in self.decided_on_stale_cache

    @invariant()
    def offline_replicas_are_out_of_the_isr(self) -> None:
        """The OfflineReplica transition took the replica out of the ISR in ZooKeeper, unless it
        was the last member."""
        if not self.candidates:
            return
        context = self.active.controller.context
        zk_states = self.admin.partition_states()
        for replica, state in context.replica_states.items():
            zk_state = zk_states.get(replica.topic_partition)
            if self._exempt(replica.topic_partition):
                continue
            if state is ReplicaState.OfflineReplica and zk_state is not None:
                assert replica.replica not in zk_state.isr or zk_state.isr == (replica.replica,), (
                    f"offline {replica} still in ISR {zk_state.isr}"
                )

    @invariant()
    def partitions_that_can_be_led_are_online(self) -> None:
        """A New or Offline partition (of a topic not being deleted) has no replica that could
        lead it: for New, no live assigned replica; for Offline, no live replica in AR and the
        ISR (or, with unclean election on, no live replica in AR at all)."""
        if not self.candidates:
            return
        context = self.active.controller.context
        live = self.live()
        zk_states = self.admin.partition_states()
        for tp, state in context.partition_states.items():
            if context.is_topic_queued_for_deletion(tp[0]):
                continue
            assignment = context.partition_replica_assignment(tp)
            if state is PartitionState.NewPartition:
                assert not set(assignment) & live, f"new {tp} has live replicas {assignment}"
            elif state is PartitionState.OfflinePartition:
                zk_state = zk_states[tp]
                eligible = set(assignment) & live
                if not self.unclean.get(tp[0], False):
                    eligible &= set(zk_state.isr)
                assert not eligible, f"offline {tp} could be led by {sorted(eligible)}"

    @invariant()
    def zookeeper_partition_states_are_well_formed(self) -> None:
        for tp, state in self.admin.partition_states().items():
            assignment = self.admin.topic_assignment(tp[0]) or {}
            replicas = assignment.get(tp[1], ())
            assert state.isr, f"{tp} has an empty ISR"
            assert set(state.isr) <= set(replicas), f"{tp}: ISR {state.isr} not in AR {replicas}"
            assert state.leader == -1 or state.leader in replicas, f"{tp}: leader not in AR"

    @invariant()
    def every_partition_state_write_is_legal(self) -> None:
        """Audit the writes since the last step: leader epochs never decrease and each has one
        leader, the ISR is never empty and holds the leader, a fenced write carries the epoch of
        the controller that passed the fence, and with unclean election off a new leader comes
        from the previous ISR."""
        self._audit_writes()

    def _audit_writes(self) -> None:
        history = self.history
        writes = self.tree.writes[history.audited_writes :]
        history.audited_writes += len(writes)
        for write in writes:
            if write.path == ControllerEpochZNode.path() and write.after is not None:
                history.epoch = ControllerEpochZNode.decode(write.after, write.version).epoch
                continue
            decoded = decode_partition_state_write(write)
            if decoded is not None:
                self._audit_state_write(decoded)

    def _audit_state_write(self, write: PartitionStateWrite) -> None:
        history = self.history
        tp, before, after = write.tp, write.before, write.after
        if after is None:  # the topic was deleted: a new one may reuse the name
            history.last_state.pop(tp, None)
            history.leader_of_epoch.pop(tp, None)
            return
        assert after.isr, f"{tp}: empty ISR written"
        assert after.leader == -1 or after.leader in after.isr, f"{tp}: leader outside the ISR"
        history.ever_held.setdefault(tp, set()).add(
            (after.leader, after.leader_epoch, after.isr, after.zk_version)
        )
        if after.leader != -1:
            leaders = history.leader_of_epoch.setdefault(tp, {})
            leader = leaders.setdefault(after.leader_epoch, after.leader)
            assert leader == after.leader, (
                f"{tp}: leader epoch {after.leader_epoch} had leader {leader}, now {after.leader}"
            )
        if write.by_controller:
            assert after.controller_epoch == history.epoch, (
                f"{tp} written with controller epoch {after.controller_epoch}, "
                f"fence at {history.epoch}"
            )
        if before is not None:
            assert after.leader_epoch >= before.leader_epoch, f"{tp}: leader epoch went down"
            new_leader = after.leader not in (-1, before.leader)
            if new_leader and not self.unclean.get(tp[0], False):
                assert after.leader in before.isr, (
                    f"{tp}: unclean election of {after.leader} (ISR was {before.isr})"
                )
        history.last_state[tp] = after

    @invariant()
    def every_request_carries_its_controllers_epoch(self) -> None:
        """Every request a channel carried names the epoch its controller was elected with (the
        active one's is the current epoch); LeaderAndIsr and UpdateMetadata only tell brokers
        leader/ISR states that ZooKeeper held; no request went to a broker without a sender."""
        self._audit_writes()  # so that `ever_held` knows this step's writes
        current_epoch, _ = self.admin.controller_epoch()
        for record in self.channels:
            new: list[SentRequest] = record.channel.sent[record.audited :]
            record.audited = len(record.channel.sent)
            assert record.channel.dropped == [], "request to a broker without a sender"
            for request in new:
                assert request.controller_epoch == record.epoch
            for api_key in (ApiKey.LEADER_AND_ISR, ApiKey.UPDATE_METADATA):
                for entry in RecordingChannelManager._iter_partitions(
                    [r for r in new if r.api_key == api_key]
                ):
                    state = entry.state
                    if int(state.leader) == LEADER_DURING_DELETE:
                        continue
                    held = (
                        int(state.leader),
                        int(state.leader_epoch),
                        tuple(int(r) for r in state.isr),
                        int(state.zk_version),
                    )
                    assert held in self.history.ever_held.get(entry.tp, set()), (
                        f"{ApiKey(api_key).name} told broker {entry.broker_id} {held} for "
                        f"{entry.tp}, a state ZooKeeper never held"
                    )
        if self.candidates:
            active = self.active.broker_id
            assert any(r.owner == active and r.epoch == current_epoch for r in self.channels)

    @invariant()
    def deletion_succeeds_only_for_acknowledged_replicas(self) -> None:
        """ReplicaDeletionSuccessful means the broker answered a StopReplica with deletion for
        that replica without an error."""
        if not self.candidates or not self.CHECK_DELETION_ACKS:
            return
        context = self.active.controller.context
        for replica, state in context.replica_states.items():
            if state is ReplicaState.ReplicaDeletionSuccessful:
                key = (replica.topic, replica.partition, replica.replica)
                assert key in self.acknowledged_deletions, f"{replica} deleted without an answer"

    @invariant()
    def no_transition_was_refused(self) -> None:
        """The callbacks only ask for valid transitions: a refused one (an ERROR on the
        state-change log) means the controller's bookkeeping and its callbacks disagree. The
        refusals of known topic-deletion bugs are tolerated (see KNOWN_REFUSED_TRANSITIONS)."""
        errors, self.state_errors.messages = self.state_errors.messages, []
        unexpected = [
            m
            for m in errors
            if not any(f" from {a} to {b}:" in m for a, b in self.KNOWN_REFUSED_TRANSITIONS)
        ]
        assert unexpected == []


async def _nothing() -> None:
    return None


def _stop_replica_partitions(request: SentRequest) -> dict[TopicPartition, bool]:
    return {
        (topic_state.topic_name, int(state.partition_index)): bool(state.delete_partition)
        for topic_state in request.request.topic_states
        for state in topic_state.partition_states
    }


def _response(request: SentRequest, failing: set[TopicPartition]) -> Any:
    """A broker's answer: success, except KAFKA_STORAGE_ERROR for `failing` StopReplica parts."""
    if request.api_key == ApiKey.STOP_REPLICA:
        return build(
            StopReplicaResponseV3,
            {
                "error_code": ErrorCode.none,
                "partition_errors": [
                    {
                        "topic_name": tp[0],
                        "partition_index": tp[1],
                        "error_code": (
                            ErrorCode.kafka_storage_error if tp in failing else ErrorCode.none
                        ),
                    }
                    for tp in _stop_replica_partitions(request)
                ],
            },
        )
    if request.api_key == ApiKey.LEADER_AND_ISR:
        return build(LeaderAndIsrResponseV5, {"error_code": ErrorCode.none, "topics": []})
    return build(UpdateMetadataResponseV7, {"error_code": ErrorCode.none})


ControllerMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestControllerStateMachines = ControllerMachine.TestCase


# --- known bugs, found by the machine above, pinned as deterministic scenarios --------------------


@pytest.fixture
def cluster() -> Iterator[ControllerMachine]:
    machine = ControllerMachine()
    try:
        yield machine
    finally:
        machine.teardown()


def _replica_state(cluster: ControllerMachine, topic: str, broker_id: int) -> Any:
    return cluster.active.controller.context.replica_states.get(
        PartitionReplica(topic, 0, broker_id)
    )


def test_stop_replica_answer_completes_only_the_replicas_it_names(
    cluster: ControllerMachine,
) -> None:
    cluster.start({1, 2})
    cluster.admin.create_topic("first", {0: [1]})
    cluster.admin.create_topic("second", {0: [1]})
    cluster.drain()
    cluster.admin.request_topic_deletion("first")
    cluster.drain()
    cluster.admin.request_topic_deletion("second")
    cluster.drain()
    cluster.answer_through_next_stop_replica(1)  # it names first-0 only
    assert "first" not in cluster.zk_topics()
    assert "second" in cluster.zk_topics()
    assert _replica_state(cluster, "second", 1) is ReplicaState.ReplicaDeletionStarted


def test_deletion_resumed_after_a_broker_returns_repeats_no_transition(
    cluster: ControllerMachine,
) -> None:
    cluster.start({1, 2})
    cluster.admin.create_topic("doomed", {0: [1, 2]})
    cluster.drain()
    cluster.kill(2)
    cluster.drain()
    cluster.admin.request_topic_deletion("doomed")
    cluster.drain()
    cluster.answer_through_next_stop_replica(1)
    assert _replica_state(cluster, "doomed", 1) is ReplicaState.ReplicaDeletionSuccessful
    assert _replica_state(cluster, "doomed", 2) is ReplicaState.ReplicaDeletionIneligible
    cluster.state_errors.messages.clear()
    cluster.register(2)
    cluster.drain()
    assert cluster.state_errors.messages == []
    assert _replica_state(cluster, "doomed", 2) is ReplicaState.ReplicaDeletionStarted


def test_broker_death_during_deletion_refuses_no_transition(cluster: ControllerMachine) -> None:
    cluster.start({1, 2})
    cluster.admin.create_topic("doomed", {0: [1, 2]})
    cluster.drain()
    cluster.admin.request_topic_deletion("doomed")
    cluster.drain()
    assert _replica_state(cluster, "doomed", 1) is ReplicaState.ReplicaDeletionStarted
    cluster.state_errors.messages.clear()
    cluster.kill(1)
    cluster.drain()
    assert _replica_state(cluster, "doomed", 1) is ReplicaState.ReplicaDeletionIneligible
    assert cluster.state_errors.messages == []


def test_deletion_restarted_after_a_retry_repeats_no_transition(
    cluster: ControllerMachine,
) -> None:
    cluster.start({1, 2})
    cluster.admin.create_topic("doomed", {0: [1], 1: [2]})
    cluster.drain()
    cluster.kill(1)
    cluster.drain()
    cluster.admin.request_topic_deletion("doomed")
    cluster.drain()
    cluster.kill(2)
    cluster.drain()
    cluster.register(2)  # its ineligible replica is retried
    cluster.drain()
    cluster.state_errors.messages.clear()
    cluster.answer_through_next_stop_replica(2)
    context = cluster.active.controller.context
    assert context.replica_states[PartitionReplica("doomed", 1, 2)] is (
        ReplicaState.ReplicaDeletionSuccessful
    )
    assert context.replica_states[PartitionReplica("doomed", 0, 1)] is (
        ReplicaState.ReplicaDeletionIneligible
    )
    assert cluster.state_errors.messages == []


def test_controller_watch_does_not_multiply_with_each_controller_move(
    cluster: ControllerMachine,
) -> None:
    cluster.start({1})
    for _ in range(5):
        cluster.tree.delete(ControllerZNode.path())
        cluster.drain()
    for candidate in cluster.candidates:
        session = candidate.zk.client.session_id
        assert cluster.tree.watch_count(session, ControllerZNode.path()) <= 1


def _leaderships_sent(
    cluster: ControllerMachine, broker_id: int, tp: TopicPartition
) -> list[tuple[int, int]]:
    """(leader, leader epoch) of every LeaderAndIsr entry for `tp` the active controller's
    channel sent to `broker_id`, in order."""
    requests = [
        r
        for r in cluster.active_channel().sent
        if r.api_key == ApiKey.LEADER_AND_ISR and r.broker_id == broker_id
    ]
    return [
        (int(e.state.leader), int(e.state.leader_epoch))
        for e in RecordingChannelManager._iter_partitions(requests)
        if e.tp == tp
    ]


def test_a_leader_that_restarted_unseen_gets_a_new_epoch_at_failover(
    cluster: ControllerMachine,
) -> None:
    """Found by the soak: the leader was SIGKILLed and restarted within its session timeout, and
    the controller died before it handled the change. The next controller saw the restarted
    broker as live and its leadership as valid, and sent it LeaderAndIsr at the same leader epoch
    -- so the new process served a high watermark older (from its checkpoint) than the one
    clients had seen under that epoch (Kafka's controller does the same). Now another ISR member
    leads at a new epoch, as if a controller had seen the bounce."""
    cluster.start({1, 2, 3})
    cluster.admin.create_topic("t", {0: [1, 2, 3]})
    cluster.drain()
    before = cluster.admin.partition_states()[("t", 0)]
    assert before.leader == 1
    old = cluster.active
    cluster.tree.expire_session(old.zk.client.session_id)  # its watches go with it
    cluster.kill(1)
    cluster.register(1)  # a new process, a new broker epoch; no controller watching
    old.queue.preempt_all_and_put(ev.Expire(), old.controller)
    standby = next(c for c in cluster.candidates if c is not old)
    cluster.drain(first=standby)
    after = cluster.admin.partition_states()[("t", 0)]
    assert cluster.active is standby
    assert after.leader_epoch > before.leader_epoch
    assert after.leader in (2, 3)
    assert sorted(after.isr) == [2, 3]  # back in once it has caught up with the new leader
    # The new process never heard that it leads at the old epoch (soak run 7, round 5: the
    # failover's first LeaderAndIsr went out before the move and it served its checkpointed HW).
    assert (1, before.leader_epoch) not in _leaderships_sent(cluster, 1, ("t", 0))


def test_a_sole_replica_that_restarted_unseen_keeps_its_leadership_as_it_was(
    cluster: ControllerMachine, caplog: pytest.LogCaptureFixture
) -> None:
    """The same with no other ISR member (a one-broker cluster restarted): it is the only
    possible leader, so nothing changes and the partition never goes offline (a first attempt
    handled such leaders as failed then started, and clients saw every partition offline for a
    moment; a second gave them a new epoch in place, and clients saw NOT_LEADER_OR_FOLLOWER
    right after the restart)."""
    cluster.start({1, 2, 3})
    cluster.admin.create_topic("t", {0: [1], 1: [2]})
    cluster.drain()
    before = cluster.admin.partition_states()
    old = cluster.active
    cluster.tree.expire_session(old.zk.client.session_id)
    cluster.kill(1)
    cluster.register(1)
    caplog.set_level(logging.INFO, STATE_CHANGE_LOGGER_NAME)
    old.queue.preempt_all_and_put(ev.Expire(), old.controller)
    standby = next(c for c in cluster.candidates if c is not old)
    cluster.drain(first=standby)
    assert cluster.active is standby
    assert cluster.admin.partition_states() == before
    assert standby.controller.context.partition_states[("t", 0)] is PartitionState.OnlinePartition
    transitions = [r.getMessage() for r in caplog.records if r.name == STATE_CHANGE_LOGGER_NAME]
    assert not [line for line in transitions if "OfflinePartition" in line]


def test_a_restarted_leader_whose_other_isr_members_died_gets_a_new_epoch_at_failover(
    cluster: ControllerMachine,
) -> None:
    """Found by the soak (round seed 436106114): the leader restarted unseen while the other ISR
    members were dead, so it stayed leader at the same epoch and served its checkpointed HW
    (8499) until the dead members left the ISR, below the 8579 clients had seen under that
    epoch. Now it is elected again at a new epoch with the live ISR members (itself)."""
    cluster.start({1, 2, 3})
    cluster.admin.create_topic("t", {0: [1, 2, 3]})
    cluster.drain()
    before = cluster.admin.partition_states()[("t", 0)]
    assert before.leader == 1 and sorted(before.isr) == [1, 2, 3]
    old = cluster.active
    cluster.tree.expire_session(old.zk.client.session_id)
    cluster.kill(2)
    cluster.kill(3)
    cluster.kill(1)
    cluster.register(1)
    old.queue.preempt_all_and_put(ev.Expire(), old.controller)
    standby = next(c for c in cluster.candidates if c is not old)
    cluster.drain(first=standby)
    after = cluster.admin.partition_states()[("t", 0)]
    assert cluster.active is standby
    assert after.leader == 1
    assert after.leader_epoch > before.leader_epoch
    assert list(after.isr) == [1]
    assert _leaderships_sent(cluster, 1, ("t", 0)) == [(1, after.leader_epoch)]


def test_a_broker_change_cut_short_by_a_lost_connection_runs_again(
    cluster: ControllerMachine,
) -> None:
    """Found by the soak (seed 526470687's family): a ZooKeeper quorum lost for longer than the
    session timeout failed the controller's read of /brokers/ids with ConnectionLossError (the
    session survived: a new quorum leader renews every session). The BrokerChange was dropped
    and, with it, the watch it would have set again: the controller never saw another broker
    register, and a restarted broker stayed out of every ISR. Now the event runs again."""
    cluster.start({1, 2})
    cluster.drain()
    active = cluster.active
    active.zk.client.lose_connection_on_children.add(BrokerIdsZNode.path())
    cluster.register(3)
    cluster.drain()
    assert active.zk.client.lose_connection_on_children == set()  # the loss happened
    assert cluster.active is active
    assert 3 in active.controller.context.live_brokers
    cluster.register(4)  # the watch was set again
    cluster.drain()
    assert 4 in active.controller.context.live_brokers


def test_a_plain_failover_keeps_every_leader_epoch(cluster: ControllerMachine) -> None:
    cluster.start({1, 2, 3})
    cluster.admin.create_topic("t", {0: [1, 2, 3], 1: [2, 3, 1]})
    cluster.drain()
    cluster.register(4)  # registered after the partitions were written, leads none of them
    cluster.drain()
    before = cluster.admin.partition_states()
    old = cluster.active
    cluster.tree.expire_session(old.zk.client.session_id)
    old.queue.preempt_all_and_put(ev.Expire(), old.controller)
    standby = next(c for c in cluster.candidates if c is not old)
    cluster.drain(first=standby)
    assert cluster.active is standby
    assert cluster.admin.partition_states() == before


def _fail_over_after_unseen_restarts(cluster: ControllerMachine, brokers: list[int]) -> Any:
    """The active controller dies; `brokers` restart (new processes, new broker epochs) while no
    controller watches; a standby takes over. Returns the standby."""
    old = cluster.active
    cluster.tree.expire_session(old.zk.client.session_id)
    for broker in brokers:
        cluster.kill(broker)
    for broker in brokers:
        cluster.register(broker)
    old.queue.preempt_all_and_put(ev.Expire(), old.controller)
    standby = next(c for c in cluster.candidates if c is not old)
    cluster.drain(first=standby)
    return standby


def test_restarted_followers_learn_the_new_leader_of_a_partition_moved_at_failover(
    cluster: ControllerMachine,
) -> None:
    """Found by the soak (run 12, round seed 1887379399): brokers 1 and 3 both restarted unseen,
    each leading a partition and following the other's. At failover both partitions moved to
    broker 2 at a new epoch, the restarted brokers out of the ISR (the election treats them as
    shutting down, so it sends them nothing). Only each partition's former leader was then told
    its new role: broker 1, a follower of the partition broker 3 had led, kept fetching from
    broker 3 at the old epoch, was refused NOT_LEADER_OR_FOLLOWER for ever, and never rejoined
    the ISR. Every restarted replica of a moved partition must hear of its new leader."""
    cluster.start({1, 2, 3})
    cluster.admin.create_topic("t", {0: [1, 2, 3], 1: [3, 1, 2]})
    cluster.drain()
    before = cluster.admin.partition_states()
    assert before[("t", 0)].leader == 1 and before[("t", 1)].leader == 3
    standby = _fail_over_after_unseen_restarts(cluster, [1, 3])
    after = cluster.admin.partition_states()
    assert cluster.active is standby
    for tp in (("t", 0), ("t", 1)):
        assert after[tp].leader == 2
        assert after[tp].leader_epoch > before[tp].leader_epoch
        for broker in (1, 3):
            sent = _leaderships_sent(cluster, broker, tp)
            assert sent and sent[-1] == (2, after[tp].leader_epoch), (tp, broker, sent)


@pytest.mark.parametrize("lost", ["resend", "lose"])
def test_a_controller_registration_whose_answer_was_lost_still_takes_over(
    cluster: ControllerMachine, lost: str
) -> None:
    """Found by the soak (run 13): the standby's registration as controller landed while the
    connection dropped. Its client resent it and met NodeExists (or gave up with a lost
    connection); the standby then read `/controller`, found its own id and counted itself
    active without taking over: no watches, no state, and no other broker could be elected.
    New topics got no leaders for minutes. Now a registration of our own session is ours."""
    cluster.start({1, 2, 3})
    cluster.drain()
    old = cluster.active
    standby = next(c for c in cluster.candidates if c is not old)
    standby.zk.client.next_multi_answer_lost = lost
    cluster.tree.expire_session(old.zk.client.session_id)
    old.queue.preempt_all_and_put(ev.Expire(), old.controller)
    cluster.drain(first=standby)
    assert standby.zk.client.next_multi_answer_lost is None  # the loss happened
    assert cluster.active is standby
    assert standby.controller.channel is not None  # it took over
    cluster.admin.create_topic("t", {0: [1, 2, 3]})
    cluster.drain()
    assert cluster.admin.partition_states()[("t", 0)].leader == 1


def test_restarted_leaders_of_each_others_isr_get_new_epochs_at_failover(
    cluster: ControllerMachine,
) -> None:
    """Found by the soak (run 13, round seed 1119462789, `monotonic_hw_and_epochs`): brokers 2 and
    3 restarted unseen, each leading partitions whose whole ISR was the two of them. With no
    other ISR member to move to, and no dead one, the failover kept broker 2's leadership at
    epoch 8, and its new process served its checkpointed HW 5935 after clients had seen 6192
    under that epoch. Now such a partition is elected again among its live ISR members at a
    new epoch, as when the ISR names dead brokers."""
    cluster.start({1, 2, 3})
    cluster.admin.create_topic("t", {0: [1, 2], 1: [2, 1]})
    cluster.drain()
    before = cluster.admin.partition_states()
    assert before[("t", 0)].leader == 1 and before[("t", 1)].leader == 2
    standby = _fail_over_after_unseen_restarts(cluster, [1, 2])
    after = cluster.admin.partition_states()
    assert cluster.active is standby
    for tp in (("t", 0), ("t", 1)):
        assert after[tp].leader_epoch > before[tp].leader_epoch, tp
        assert sorted(after[tp].isr) == [1, 2]
        leader = after[tp].leader
        # The new process never heard that it leads at the old epoch.
        assert (before[tp].leader, before[tp].leader_epoch) not in _leaderships_sent(
            cluster, before[tp].leader, tp
        )
        assert _leaderships_sent(cluster, leader, tp)[-1] == (leader, after[tp].leader_epoch)
