"""The partition state machine (Kafka's ZkPartitionStateMachine).

States and valid transitions are data in `odradek.controller.states` (with the side effects of each
transition listed there). This module applies a batch of transitions:

1. split the batch into valid and invalid transitions; log and refuse the invalid ones;
2. NewPartition / OfflinePartition / NonExistentPartition: record the state;
3. OnlinePartition from NewPartition: leader = first live replica of AR, ISR = live replicas of AR,
   partition state znodes created in batched transactions fenced by the controller epoch;
4. OnlinePartition from Online/Offline: elect with the given strategy (offline — unclean only where the
   topic allows it —, unclean — the offline rule with unclean allowed, an operator's request —,
   reassigned, preferred replica, controlled shutdown), write the new leader/ISR conditionally on
   each znode's version in batched fenced transactions, re-reading and retrying the partitions
   whose version moved (the leader shrank or grew the ISR meanwhile);
5. queue LeaderAndIsr for the partition's live replicas and UpdateMetadata for every live broker in
   the event's request batch (sent once, per broker, when the event is done).

Each call returns a result per partition (`LeaderAndIsr` or the exception) so one partition's failure
does not fail the batch. Concurrency: controller event task only.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Iterable

from odradek.controller.channel_manager import ControllerBrokerRequestBatch
from odradek.controller.context import ControllerContext, LeaderAndIsr, TopicPartition
from odradek.controller.controller_zk import ControllerZk
from odradek.controller.election_algorithms import (
    elect_controlled_shutdown_leader,
    elect_offline_partition_leader,
    elect_preferred_replica_leader,
    elect_reassigned_partition_leader,
    new_partition_leader_and_isr,
)
from odradek.controller.reassignment_plan import target_replicas
from odradek.controller.states import (
    PartitionState,
    StateChangeLogger,
    format_partition,
    split_valid_transitions,
)
from odradek.controller.stats import ControllerStats
from odradek.errors import OdradekError
from odradek.zk.errors import BadVersionError, NodeExistsError, ZkError

log = logging.getLogger(__name__)

MAX_WRITE_ATTEMPTS = 10


class ElectionStrategy(enum.Enum):
    OFFLINE = "offline"
    REASSIGNMENT = "reassignment"
    PREFERRED_REPLICA = "preferred"
    CONTROLLED_SHUTDOWN = "controlled-shutdown"
    # The offline rule with unclean election allowed whatever the topic says: an operator's
    # ElectLeaders(UNCLEAN) request (Kafka's OfflinePartitionLeaderElectionStrategy(allowUnclean)).
    UNCLEAN = "unclean"


class StateChangeFailedError(OdradekError):
    pass


class NoEligibleLeaderError(StateChangeFailedError):
    pass


PartitionResult = dict[TopicPartition, LeaderAndIsr | Exception]


class PartitionStateMachine:
    def __init__(
        self,
        context: ControllerContext,
        zk: ControllerZk,
        batch: ControllerBrokerRequestBatch,
        state_change_logger: StateChangeLogger,
        unclean_leader_election_enabled: Callable[[Iterable[str]], Awaitable[dict[str, bool]]],
    ) -> None:
        self.context = context
        self.zk = zk
        self.batch = batch
        self.state_change_logger = state_change_logger
        self._unclean_enabled = unclean_leader_election_enabled
        self.stats: ControllerStats | None = None  # counts unclean elections when set

    def state(self, tp: TopicPartition) -> PartitionState:
        return self.context.partition_states.get(tp, PartitionState.NonExistentPartition)

    def initialize_states(self) -> None:
        """At failover: Online if the leader is live, Offline if it has a leader state otherwise,
        New if it never had one."""
        context = self.context
        for tp in context.all_partitions():
            state = context.leadership.get(tp)
            if state is None:
                context.partition_states[tp] = PartitionState.NewPartition
            elif context.is_replica_online(state.leader, include_shutting_down=True):
                context.partition_states[tp] = PartitionState.OnlinePartition
            else:
                context.partition_states[tp] = PartitionState.OfflinePartition

    async def trigger_online_partition_state_change(
        self, topics: Iterable[str] | None = None
    ) -> PartitionResult:
        """Elect leaders for every New/Offline partition (not of topics being deleted)."""
        context = self.context
        candidates = [
            tp
            for tp in context.partitions_in_states(
                PartitionState.NewPartition, PartitionState.OfflinePartition
            )
            if not context.is_topic_queued_for_deletion(tp[0])
            and (topics is None or tp[0] in topics)
        ]
        return await self.handle_state_changes(
            candidates, PartitionState.OnlinePartition, ElectionStrategy.OFFLINE
        )

    def _transition(
        self, tp: TopicPartition, target: PartitionState, state: LeaderAndIsr | None = None
    ) -> None:
        previous = self.state(tp)
        self.context.partition_states[tp] = target
        self.state_change_logger.partition_transition(
            self.context.epoch,
            tp[0],
            tp[1],
            previous,
            target,
            leader=state.leader if state else None,
            isr=state.isr if state else None,
            leader_epoch=state.leader_epoch if state else None,
        )

    async def handle_state_changes(
        self,
        partitions: Iterable[TopicPartition],
        target: PartitionState,
        strategy: ElectionStrategy | None = None,
    ) -> PartitionResult:
        try:
            return await self._handle_state_changes(partitions, target, strategy)
        finally:
            self.state_change_logger.flush()  # the batch's lines, written together

    async def _handle_state_changes(
        self,
        partitions: Iterable[TopicPartition],
        target: PartitionState,
        strategy: ElectionStrategy | None = None,
    ) -> PartitionResult:
        partitions = list(partitions)
        if not partitions:
            return {}
        valid, invalid = split_valid_transitions(partitions, self.state, target)
        results: PartitionResult = {}
        for tp in invalid:
            self.state_change_logger.invalid_transition(
                self.context.epoch, format_partition(*tp), self.state(tp), target
            )
            results[tp] = StateChangeFailedError(f"invalid transition {self.state(tp)} -> {target}")
        if target in (
            PartitionState.NewPartition,
            PartitionState.OfflinePartition,
            PartitionState.NonExistentPartition,
        ):
            for tp in valid:
                self._transition(tp, target)
            if target is PartitionState.NonExistentPartition:
                for tp in valid:
                    self.context.partition_states.pop(tp, None)
            return results
        new = [tp for tp in valid if self.state(tp) is PartitionState.NewPartition]
        existing = [tp for tp in valid if self.state(tp) is not PartitionState.NewPartition]
        if new:
            results.update(await self._initialize_leader_and_isr(new))
        if existing:
            results.update(
                await self._elect_leaders(existing, strategy or ElectionStrategy.OFFLINE)
            )
        return results

    # NewPartition -> OnlinePartition

    async def _initialize_leader_and_isr(self, partitions: list[TopicPartition]) -> PartitionResult:
        context = self.context
        results: PartitionResult = {}
        to_create: dict[TopicPartition, LeaderAndIsr] = {}
        for tp in partitions:
            assignment = context.partition_replica_assignment(tp)
            decision = new_partition_leader_and_isr(assignment, context.live_serving_broker_ids)
            if decision is None:
                decision = new_partition_leader_and_isr(assignment, context.live_broker_ids)
            if decision is None:
                log.warning(
                    "%s: no live replica among %s; it stays NewPartition",
                    format_partition(*tp),
                    assignment,
                )
                results[tp] = NoEligibleLeaderError(f"no live replica among {list(assignment)}")
                continue
            to_create[tp] = LeaderAndIsr(decision.leader, 0, tuple(decision.isr), context.epoch, 0)
        if not to_create:
            return results
        written = await self.zk.create_partition_states(context.epoch_zk_version, to_create)
        existing_to_adopt = [tp for tp, r in written.items() if isinstance(r, NodeExistsError)]
        if existing_to_adopt:
            # A previous controller created them before it died: adopt what ZooKeeper holds.
            adopted = await self.zk.get_partition_states(existing_to_adopt)
            for tp in existing_to_adopt:
                if tp in adopted:
                    written[tp] = adopted[tp]
        adopted_offline: list[TopicPartition] = []
        for tp, result in written.items():
            if isinstance(result, ZkError):
                results[tp] = result
                continue
            context.leadership[tp] = result
            if tp in existing_to_adopt and result.leader not in context.live_brokers:
                adopted_offline.append(tp)
                continue
            self.batch.add_leader_and_isr_request_for_brokers(
                [r for r in context.partition_replica_assignment(tp) if r in context.live_brokers],
                tp,
                result,
                context.partition_replica_assignment(tp),
                is_new=True,
            )
            self._transition(tp, PartitionState.OnlinePartition, result)
            results[tp] = result
        if adopted_offline:
            # The adopted state names a dead leader: the partition is offline and needs an election.
            for tp in adopted_offline:
                self._transition(tp, PartitionState.OfflinePartition)
            results.update(await self._elect_leaders(adopted_offline, ElectionStrategy.OFFLINE))
        return results

    # Online/Offline -> OnlinePartition

    async def _elect_leaders(
        self, partitions: list[TopicPartition], strategy: ElectionStrategy
    ) -> PartitionResult:
        context = self.context
        results: PartitionResult = {}
        # Leaders change ISRs in ZooKeeper themselves and tell the controller later (batched ISR
        # change notifications): elect from what ZooKeeper holds now, as Kafka's
        # doElectLeaderForPartitions does, never from the cached ISR alone.
        known = [tp for tp in partitions if tp in context.leadership]
        if known:
            context.leadership.update(await self.zk.get_partition_states(known))
        remaining = [tp for tp in partitions if tp in context.leadership]
        for tp in partitions:
            if tp not in context.leadership:
                results[tp] = StateChangeFailedError("no leader state in ZooKeeper")
        for _attempt in range(MAX_WRITE_ATTEMPTS):
            if not remaining:
                break
            decisions, failed = await self._decide(remaining, strategy)
            results.update(failed)
            if not decisions:
                break
            written = await self.zk.update_leader_and_isr(context.epoch_zk_version, decisions)
            retry = []
            for tp, result in written.items():
                if isinstance(result, BadVersionError):
                    retry.append(tp)
                elif isinstance(result, ZkError):
                    results[tp] = result
                else:
                    context.leadership[tp] = result
                    self.batch.unsent_writes[tp] = result
                    self._send_leader_and_isr(tp, result, strategy)
                    self._transition(tp, PartitionState.OnlinePartition, result)
                    results[tp] = result
            if retry:
                fresh = await self.zk.get_partition_states(retry)
                context.leadership.update(fresh)
            remaining = retry
        for tp in remaining:
            results.setdefault(tp, StateChangeFailedError("partition state kept changing; gave up"))
        return results

    async def _decide(
        self, partitions: list[TopicPartition], strategy: ElectionStrategy
    ) -> tuple[dict[TopicPartition, LeaderAndIsr], PartitionResult]:
        context = self.context
        live = context.live_serving_broker_ids
        decisions: dict[TopicPartition, LeaderAndIsr] = {}
        failed: PartitionResult = {}
        unclean_topics: dict[str, bool] = {}
        offline_rule = strategy in (ElectionStrategy.OFFLINE, ElectionStrategy.UNCLEAN)
        if strategy is ElectionStrategy.OFFLINE:
            needs_unclean = {
                tp[0]
                for tp in partitions
                if not any(
                    r in live and not context.is_replica_on_offline_dir(r, tp)
                    for r in context.leadership[tp].isr
                )
            }
            if needs_unclean:
                unclean_topics = await self._unclean_enabled(needs_unclean)
        all_live = live
        for tp in partitions:
            current = context.leadership[tp]
            assignment = context.partition_replica_assignment(tp)
            # A replica in a failed log directory cannot lead though its broker lives (KIP-112).
            live = all_live - context.brokers_with_offline_replica(tp)
            if offline_rule:
                decision = elect_offline_partition_leader(
                    assignment,
                    current.isr,
                    live,
                    strategy is ElectionStrategy.UNCLEAN or unclean_topics.get(tp[0], False),
                )
                if decision is not None and decision.unclean:
                    if self.stats is not None:
                        self.stats.unclean_leader_elections += 1
                    log.warning(
                        "%s: unclean leader election: %d becomes leader though it was not in ISR %s",
                        format_partition(*tp),
                        decision.leader,
                        list(current.isr),
                    )
            elif strategy is ElectionStrategy.REASSIGNMENT:
                target = target_replicas(context.full_replica_assignment(tp))
                decision = elect_reassigned_partition_leader(target, current.isr, live)
            elif strategy is ElectionStrategy.PREFERRED_REPLICA:
                decision = elect_preferred_replica_leader(assignment, current.isr, live)
            else:
                decision = elect_controlled_shutdown_leader(
                    assignment,
                    current.isr,
                    context.live_broker_ids - context.brokers_with_offline_replica(tp),
                    context.shutting_down_broker_ids,
                )
            if decision is None:
                failed[tp] = NoEligibleLeaderError(
                    f"no eligible leader for {format_partition(*tp)} (AR {list(assignment)},"
                    f" ISR {list(current.isr)}, live {sorted(live)})"
                )
                continue
            # The constructor, not dataclasses.replace: ten times cheaper, once per partition.
            decisions[tp] = LeaderAndIsr(
                leader=decision.leader,
                leader_epoch=current.leader_epoch + 1,
                isr=tuple(decision.isr),
                controller_epoch=context.epoch,
                zk_version=current.zk_version,
            )
        return decisions, failed

    def _send_leader_and_isr(
        self, tp: TopicPartition, state: LeaderAndIsr, strategy: ElectionStrategy
    ) -> None:
        context = self.context
        assignment = context.partition_replica_assignment(tp)
        recipients = [r for r in assignment if r in context.live_brokers]
        if strategy is ElectionStrategy.CONTROLLED_SHUTDOWN:
            recipients = [r for r in recipients if r not in context.shutting_down_broker_ids]
        self.batch.add_leader_and_isr_request_for_brokers(
            recipients, tp, state, assignment, is_new=False
        )
