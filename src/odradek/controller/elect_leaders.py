"""Replica leader elections on demand: preferred-replica and unclean elections, and the automatic
leader rebalance (Kafka's `onReplicaElection`, `processReplicaLeaderElection` and
`checkAndTriggerAutoLeaderRebalance` in ZooKeeper mode).

Leaders drift away from the preferred replica (the first of AR, which the assignment algorithm
spread evenly over the brokers) whenever a broker dies or shuts down: its partitions get other
leaders, and when it returns it only follows. Three triggers move leadership back, all ending in
the same controller step, an OnlinePartition -> OnlinePartition transition with the preferred
replica election strategy (LeaderAndIsr to the live replicas, UpdateMetadata to every live broker,
leader epoch + 1, ISR unchanged):

* **ZooKeeper** (`ZK_TRIGGERED`): an admin writes `/admin/preferred_replica_election`
  (`{"version":1,"partitions":[{"topic":..,"partition":..}]}`). The controller watches the path
  (existence, so that creation fires) from failover on, also handles a znode left by a previous
  controller, and deletes it — fenced by the controller epoch — once the elections are done, even
  if some failed, so that the next request can be written.
* **ElectLeaders API** (`ADMIN_CLIENT`, key 43): the request handler asks the active controller
  and gets one outcome per partition (the new leader, or the error Kafka answers); other brokers
  answer NOT_CONTROLLER. The UNCLEAN election type exists only here: partitions without a live
  leader get the first live ISR member, or else the first live replica even outside the ISR
  (whatever the topic's `unclean.leader.election.enable`: the operator asked for it).
* **Auto rebalance** (`AUTO_TRIGGERED`, `auto.leader.rebalance.enable`): every
  `leader.imbalance.check.interval.seconds` (the first check 5 s after failover, as Kafka) a timer
  enqueues `AutoPreferredReplicaLeaderElection`; the controller computes for each broker the
  share of the partitions it is preferred for that another broker leads, and where that share is
  above `leader.imbalance.per.broker.percentage` elects the preferred replica of those partitions
  that can take it (alive, in the ISR) and are neither being deleted nor reassigned.

Per-partition outcomes of a requested election (ZooKeeper or API), as Kafka answers them:

| partition | outcome |
|---|---|
| not in the cluster | UNKNOWN_TOPIC_OR_PARTITION |
| topic queued for deletion | INVALID_TOPIC_EXCEPTION |
| PREFERRED, the preferred replica already leads | ELECTION_NOT_NEEDED |
| PREFERRED, preferred replica dead, shutting down or out of the ISR | PREFERRED_LEADER_NOT_AVAILABLE |
| UNCLEAN, a live leader already leads | ELECTION_NOT_NEEDED |
| UNCLEAN, no live replica at all | ELIGIBLE_LEADERS_NOT_AVAILABLE |
| elected | the new leader's id |

The decisions (which partitions to elect, the imbalance per broker) are pure functions with their
own tests; `ReplicaLeaderElection` only moves data between them, the context and the partition
state machine, which it reaches through `ElectionClient` (the controller: its term, a watch for
the current term, the event queue, and an election run by the partition state machine). Concurrency: everything here runs on the controller's event task, except the
timer's callback, which only enqueues an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from kio.schema.errors import ErrorCode

from odradek.controller import events as ev
from odradek.controller.context import ControllerContext, LeaderAndIsr, TopicPartition
from odradek.controller.election_algorithms import (
    NO_LEADER,
    preferred_replica_partition_leader_election,
)
from odradek.controller.partition_state_machine import ElectionStrategy, StateChangeFailedError
from odradek.errors import KafkaError, NotControllerError
from odradek.zk.client import WatchEvent, ZkClient
from odradek.zk.errors import ControllerMovedError, InvalidZNodeDataError, NoNodeError
from odradek.zk.ops import DeleteOp
from odradek.zk.znodes import PreferredReplicaElectionZNode

log = logging.getLogger(__name__)

FIRST_AUTO_REBALANCE_DELAY_S = 5.0
"""Kafka checks the leader balance 5 s after a controller failover, then every interval."""


class ElectionType(enum.IntEnum):
    """ElectLeaders' `election_type` (KIP-460)."""

    PREFERRED = 0
    UNCLEAN = 1


class ElectionTrigger(enum.Enum):
    ADMIN_CLIENT = "admin client"
    ZK_TRIGGERED = "ZooKeeper"
    AUTO_TRIGGERED = "auto rebalance"


ElectionOutcome: TypeAlias = int | KafkaError
"""The new leader of a partition, or why it got none."""


@dataclass(frozen=True, slots=True)
class AutoRebalanceConfig:
    """`auto.leader.rebalance.enable`, `leader.imbalance.per.broker.percentage` and
    `leader.imbalance.check.interval.seconds`."""

    enabled: bool = False
    imbalance_percentage: int = 10
    check_interval_s: float = 300.0


# --- pure decisions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ElectionPlan:
    """A requested election split as Kafka splits it: only `electable` goes to the state machine;
    every other partition already has its answer."""

    electable: list[TopicPartition] = field(default_factory=list)
    not_needed: list[TopicPartition] = field(default_factory=list)
    being_deleted: list[TopicPartition] = field(default_factory=list)
    unknown: list[TopicPartition] = field(default_factory=list)

    def answered(self) -> dict[TopicPartition, KafkaError]:
        """The outcome of every partition that needs no election."""
        outcomes: dict[TopicPartition, KafkaError] = {}
        for tp in self.not_needed:
            outcomes[tp] = KafkaError(
                "the leader is already the one asked for", ErrorCode.election_not_needed
            )
        for tp in self.being_deleted:
            outcomes[tp] = KafkaError(
                "the topic is being deleted", ErrorCode.invalid_topic_exception
            )
        for tp in self.unknown:
            outcomes[tp] = KafkaError(
                "the partition does not exist", ErrorCode.unknown_topic_or_partition
            )
        return outcomes


def plan_election(
    requested: Iterable[TopicPartition],
    election_type: ElectionType,
    assignments: Mapping[TopicPartition, Sequence[int]],
    leaders: Mapping[TopicPartition, int],
    live: Collection[int],
    deleting_topics: Collection[str],
) -> ElectionPlan:
    """Which of `requested` need an election of `election_type`.

    `assignments` is AR of every partition of the cluster, `leaders` the current leader of those
    with a leader/ISR state, `live` the registered brokers. PREFERRED needs an election unless the
    preferred replica (first of AR) already leads; UNCLEAN only when the leader is none or dead.
    Whether the election can succeed is not decided here: the state machine reads the ISR from
    ZooKeeper and answers PREFERRED_LEADER_NOT_AVAILABLE / ELIGIBLE_LEADERS_NOT_AVAILABLE.
    """
    plan = ElectionPlan()
    for tp in sorted(set(requested)):
        assignment = assignments.get(tp)
        if not assignment:
            plan.unknown.append(tp)
        elif tp[0] in deleting_topics:
            plan.being_deleted.append(tp)
        else:
            leader = leaders.get(tp, NO_LEADER)
            if election_type is ElectionType.PREFERRED:
                needed = leader != assignment[0]
            else:
                needed = leader == NO_LEADER or leader not in live
            (plan.electable if needed else plan.not_needed).append(tp)
    return plan


@dataclass(frozen=True, slots=True)
class BrokerLeaderImbalance:
    """The partitions whose preferred replica is `broker_id`, and those of them another broker
    leads. `ratio` is what Kafka compares with `leader.imbalance.per.broker.percentage`."""

    broker_id: int
    preferred: int
    not_led: tuple[TopicPartition, ...]

    @property
    def ratio(self) -> float:
        return len(self.not_led) / self.preferred if self.preferred else 0.0


def leader_imbalance(
    assignments: Mapping[TopicPartition, Sequence[int]], leaders: Mapping[TopicPartition, int]
) -> dict[int, BrokerLeaderImbalance]:
    """Per preferred broker, how many partitions it should lead and which it does not.

    A partition without a leader/ISR state yet (not in `leaders`) counts as preferred but not as
    misled, as in Kafka: there is no leadership to move back. A leaderless partition (-1) is
    misled: its preferred replica does not lead it.
    """
    preferred: dict[int, list[TopicPartition]] = defaultdict(list)
    for tp, assignment in assignments.items():
        if assignment:
            preferred[assignment[0]].append(tp)
    result = {}
    for broker_id, partitions in preferred.items():
        not_led = tuple(
            sorted(tp for tp in partitions if tp in leaders and leaders[tp] != broker_id)
        )
        result[broker_id] = BrokerLeaderImbalance(broker_id, len(partitions), not_led)
    return result


def auto_rebalance_candidates(
    assignments: Mapping[TopicPartition, Sequence[int]],
    leadership: Mapping[TopicPartition, tuple[int, Sequence[int]]],
    live: Collection[int],
    imbalance_percentage: int,
    excluded: Collection[TopicPartition] = (),
) -> list[TopicPartition]:
    """The partitions the automatic rebalance elects the preferred replica of.

    `assignments` are the partitions taking part (the caller leaves out topics being deleted, so
    that they count in no ratio), `leadership` their (leader, ISR), `live` the brokers that may
    lead (registered and not shutting down). For each broker whose imbalance ratio is strictly
    above `imbalance_percentage` %, its misled partitions are candidates when the preferred
    replica is live and in the ISR (the election would otherwise fail) and the partition is not in
    `excluded` (being reassigned: the reassignment decides its leader). Sorted.
    """
    leaders = {tp: state[0] for tp, state in leadership.items()}
    threshold = imbalance_percentage / 100
    candidates = []
    for imbalance in leader_imbalance(assignments, leaders).values():
        if imbalance.ratio <= threshold:
            continue
        for tp in imbalance.not_led:
            if tp in excluded:
                continue
            isr = leadership[tp][1]
            if preferred_replica_partition_leader_election(assignments[tp], isr, live) is not None:
                candidates.append(tp)
    return sorted(candidates)


def outcome_of(result: LeaderAndIsr | Exception, election_type: ElectionType) -> ElectionOutcome:
    """The state machine's result for one partition as the answer Kafka gives.

    A refused election (no eligible leader, an invalid transition) is PREFERRED_LEADER_NOT_AVAILABLE
    or ELIGIBLE_LEADERS_NOT_AVAILABLE by election type; Kafka errors keep their code; anything else
    (a ZooKeeper error) is UNKNOWN_SERVER_ERROR.
    """
    if isinstance(result, LeaderAndIsr):
        return result.leader
    if isinstance(result, StateChangeFailedError):
        code = (
            ErrorCode.preferred_leader_not_available
            if election_type is ElectionType.PREFERRED
            else ErrorCode.eligible_leaders_not_available
        )
        return KafkaError(str(result), code)
    if isinstance(result, KafkaError):
        return result
    return KafkaError(str(result), ErrorCode.unknown_server_error)


# --- the timer ------------------------------------------------------------------------------------


class AutoRebalanceTimer:
    """Enqueues `AutoPreferredReplicaLeaderElection` after a delay; at most one pending.

    Event-loop thread only. The event carries the controller term it was scheduled in, so that an
    event already queued when the controller resigned is ignored in a later term (which has its own
    timer).
    """

    def __init__(self, enqueue: Callable[[Any], None]) -> None:
        self._enqueue = enqueue
        self._handle: asyncio.TimerHandle | None = None

    @property
    def scheduled(self) -> bool:
        return self._handle is not None

    def schedule(self, delay_s: float, generation: int) -> None:
        self.cancel()

        def fire() -> None:
            self._handle = None
            self._enqueue(ev.AutoPreferredReplicaLeaderElection(generation=generation))

        self._handle = asyncio.get_running_loop().call_later(delay_s, fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


# --- the controller step --------------------------------------------------------------------------


class ElectionClient(Protocol):
    """What the elections need from the controller."""

    @property
    def broker_id(self) -> int: ...

    @property
    def is_active(self) -> bool: ...

    @property
    def term(self) -> int:
        """Changes at every failover and resignation: events of an earlier term are stale."""
        ...

    def put(self, event: Any) -> None:
        """Enqueue a controller event."""

    def watch(self, make_event: Callable[[WatchEvent], Any]) -> Callable[[WatchEvent], None]:
        """A watch callback that enqueues `make_event(event)`, in the current term only."""
        ...

    async def elect_with_strategy(
        self, partitions: Sequence[TopicPartition], strategy: ElectionStrategy
    ) -> Mapping[TopicPartition, LeaderAndIsr | Exception]:
        """OnlinePartition -> OnlinePartition for `partitions` with `strategy`; each result."""
        ...


class ReplicaLeaderElection:
    """The controller's replica leader elections. One per controller component (it outlives
    terms); controller event task only."""

    def __init__(
        self,
        context: ControllerContext,
        zk: ZkClient,
        client: ElectionClient,
        auto_rebalance: AutoRebalanceConfig,
    ) -> None:
        self.context = context
        self.zk = zk
        self.client = client
        self.auto_rebalance = auto_rebalance
        self.timer = AutoRebalanceTimer(client.put)
        self._znode_watch: Callable[..., None] | None = None
        self.auto_rebalances = 0

    # lifecycle

    async def on_controller_failover(self) -> None:
        """Watch `/admin/preferred_replica_election`, act on a request left there, and start the
        rebalance timer. One watch callable per term, so that re-arming it never adds a watcher."""
        self._znode_watch = self.client.watch(lambda e: ev.PreferredReplicaElection())
        await self.process_preferred_replica_election_znode()
        if self.auto_rebalance.enabled:
            self.timer.schedule(FIRST_AUTO_REBALANCE_DELAY_S, self.client.term)

    def on_controller_resignation(self) -> None:
        self.timer.cancel()
        self._znode_watch = None

    # the three triggers

    async def process_preferred_replica_election_znode(self) -> None:
        """The PreferredReplicaElection event: re-arm the watch; if the znode exists, elect the
        preferred replica of the partitions it lists, then delete it (fenced)."""
        zk = self.zk
        path = PreferredReplicaElectionZNode.path()
        if await zk.exists(path, self._znode_watch) is None:
            return
        try:
            data, stat = await zk.get(path)
        except NoNodeError:
            return
        try:
            requested = {
                (tp.topic, tp.partition)
                for tp in PreferredReplicaElectionZNode.decode(data, stat.version).partitions
            }
        except InvalidZNodeDataError as e:
            # Left in place it would block every later request (the znode is the request).
            log.warning("deleting an unreadable preferred replica election request: %s", e)
            await self._delete_znode()
            return
        try:
            await self.elect(requested, ElectionType.PREFERRED, ElectionTrigger.ZK_TRIGGERED)
        finally:
            await self._delete_znode()

    async def process_admin_request(self, event: ev.ReplicaLeaderElection) -> None:
        """The ElectLeaders request's event: outcomes per partition into `event.result`."""
        if event.result.done():
            return
        if not self.client.is_active:
            event.result.set_exception(
                NotControllerError(f"broker {self.client.broker_id} is not the controller")
            )
            return
        outcomes = await self.elect(
            event.partitions, ElectionType(event.election_type), ElectionTrigger.ADMIN_CLIENT
        )
        if not event.result.done():
            event.result.set_result(outcomes)

    async def process_auto_rebalance(self, event: ev.AutoPreferredReplicaLeaderElection) -> None:
        """The timer's event: check the balance, elect where needed, schedule the next check."""
        if event.generation != self.client.term or not self.client.is_active:
            return
        try:
            await self.check_and_trigger_auto_leader_rebalance()
        finally:
            if (
                self.auto_rebalance.enabled
                and self.client.is_active
                and event.generation == self.client.term
            ):
                self.timer.schedule(self.auto_rebalance.check_interval_s, event.generation)

    async def check_and_trigger_auto_leader_rebalance(self) -> list[TopicPartition]:
        context = self.context
        assignments = {
            tp: context.partition_replica_assignment(tp)
            for tp in context.all_partitions()
            if not context.is_topic_queued_for_deletion(tp[0])
        }
        leadership = {
            tp: (state.leader, state.isr)
            for tp, state in context.leadership.items()
            if tp in assignments
        }
        candidates = auto_rebalance_candidates(
            assignments,
            leadership,
            context.live_serving_broker_ids,
            self.auto_rebalance.imbalance_percentage,
            excluded=context.partitions_being_reassigned(),
        )
        if candidates:
            log.info(
                "leader imbalance above the threshold: electing preferred leaders of %s", candidates
            )
            self.auto_rebalances += 1
            await self.elect(candidates, ElectionType.PREFERRED, ElectionTrigger.AUTO_TRIGGERED)
        return candidates

    # the common step

    async def elect(
        self,
        requested: Iterable[TopicPartition],
        election_type: ElectionType,
        trigger: ElectionTrigger,
    ) -> dict[TopicPartition, ElectionOutcome]:
        """Plan and run the elections of `requested`; the outcome of every partition.

        ControllerMovedError propagates (the controller resigns); the caller's waiter is failed by
        the controller's error handling.
        """
        context = self.context
        assignments = {
            tp: context.partition_replica_assignment(tp) for tp in context.all_partitions()
        }
        leaders = {tp: state.leader for tp, state in context.leadership.items()}
        plan = plan_election(
            requested,
            election_type,
            assignments,
            leaders,
            context.live_broker_ids,
            context.topics_to_be_deleted,
        )
        for tp in plan.unknown:
            log.info(
                "skipping %s leader election of %s-%d (%s): no such partition",
                election_type.name,
                tp[0],
                tp[1],
                trigger.value,
            )
        if plan.being_deleted:
            log.warning(
                "skipping %s leader election of %s (%s): topics being deleted",
                election_type.name,
                plan.being_deleted,
                trigger.value,
            )
        outcomes: dict[TopicPartition, ElectionOutcome] = dict(plan.answered())
        if plan.electable:
            log.info(
                "%s leader election of %s triggered by %s",
                election_type.name,
                plan.electable,
                trigger.value,
            )
            strategy = (
                ElectionStrategy.PREFERRED_REPLICA
                if election_type is ElectionType.PREFERRED
                else ElectionStrategy.UNCLEAN
            )
            results = await self.client.elect_with_strategy(plan.electable, strategy)
            for tp in plan.electable:
                outcome = outcome_of(
                    results.get(tp, StateChangeFailedError("no result")), election_type
                )
                if isinstance(outcome, KafkaError) and trigger is not ElectionTrigger.ADMIN_CLIENT:
                    log.warning(
                        "%s leader election of %s-%d failed: %s",
                        election_type.name,
                        tp[0],
                        tp[1],
                        outcome,
                    )
                outcomes[tp] = outcome
        return outcomes

    async def _delete_znode(self) -> None:
        """Remove the request, fenced by the controller epoch: a deposed controller must not
        delete a request its successor has not seen."""
        with contextlib.suppress(NoNodeError):
            await self.zk.checked_multi(
                self.context.epoch_zk_version, [DeleteOp(PreferredReplicaElectionZNode.path())]
            )


def fail_waiter(event: Any, error: BaseException | None) -> None:
    """Answer an ElectLeaders waiter whose event will not complete: NOT_CONTROLLER when the
    controller resigned or moved (the client looks for the new one), else the error's code."""
    if not isinstance(event, ev.ReplicaLeaderElection) or event.result.done():
        return
    if error is None or isinstance(error, ControllerMovedError | NotControllerError):
        event.result.set_exception(NotControllerError("the controller moved"))
    elif isinstance(error, KafkaError):
        event.result.set_exception(error)
    else:
        event.result.set_exception(KafkaError(f"leader election failed: {error}"))
