"""Partition reassignment (Kafka's KafkaController.onPartitionReassignment, KIP-455 version).

Names: ORS = original replicas, TRS = target replicas, RS = ORS + TRS (the full set while moving),
AR = TRS - ORS (adding), RR = ORS - TRS (removing). The pure rules are in `reassignment_plan`.

`on_partition_reassignment(tp, assignment)` is invoked, always on the controller's event task:

1. by an AlterPartitionReassignments request (`process_api_reassignment`);
2. by `/admin/reassign_partitions` being created or changed (`process_zk_reassignment`);
3. when the ISR of a moving partition changes: its state znode's watch, an ISR change
   notification, or a change to its topic's assignment znode (`maybe_complete`);
4. when a broker hosting a target replica starts (`on_brokers_started`);
5. at controller failover, for every partition whose assignment znode has adding or removing
   replicas and every entry of `/admin/reassign_partitions` (`initialize`).

Its steps, in an order that a controller crash between any two of them can recover from:

  U1. write RS, AR, RR to the topic's assignment znode (ZooKeeper first: a new controller resumes
      from it); U2. the same in the controller's context; U3. stop and delete the replicas a
      superseded reassignment (or a cancellation) was adding and the new one does not want.

  Phase A, while some TRS member is not in the ISR:
  A1. bump the leader epoch (conditional write of the partition state) and send LeaderAndIsr with
      RS to every replica of RS, so the leader tracks the new replicas and lets them join the ISR;
  A2. the AR replicas go NewReplica: their brokers create the log and fetch from the leader.

  Phase B, once TRS is a subset of the ISR:
  B1. AR replicas go OnlineReplica; B2. RS = TRS in the context;
  B3. if the leader is not in TRS or not live, elect one from TRS (the reassigned-partition rule:
      first live TRS member in the ISR); otherwise bump the leader epoch so that the leader learns
      RS = TRS. No TRS member can lead: stop here, the move stays in progress and is retried;
  B4. RR replicas go OfflineReplica (out of the ISR in ZooKeeper; StopReplica);
  B5. RR replicas go ReplicaDeletionStarted (StopReplica with delete: their brokers delete the
      partition directory), then ReplicaDeletionSuccessful and NonExistentReplica;
  B6. write RS = TRS, AR = RR = [] to the assignment znode — last, since until then it is the only
      durable record of ORS;
  B7. remove the partition from `/admin/reassign_partitions` (deleting the znode when empty);
  B8. UpdateMetadata for the partition to every live broker; resume topic deletions it held up.

A topic queued for deletion is not reassigned (UNKNOWN_TOPIC_OR_PARTITION), and a topic with a
partition moving is not deleted until the move is over (`TopicDeletionManager.resume`).

The manager sees the controller only through `ReassignmentClient`: arm a watch for the current
term, queue LeaderAndIsr and UpdateMetadata requests, resume topic deletions. The context, the two
state machines and the ZooKeeper clients are handed to it when the controller builds it at failover.

Concurrency: controller event task only. Requests to brokers go into the event's batch, sent by the
controller when the event is done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.controller import events as ev
from odradek.controller.context import (
    ControllerContext,
    LeaderAndIsr,
    PartitionReplica,
    TopicPartition,
)
from odradek.controller.controller_zk import ControllerZk
from odradek.controller.partition_state_machine import ElectionStrategy, PartitionStateMachine
from odradek.controller.reassignment_plan import (
    build_reassignment,
    is_reassignment_complete,
    leader_needs_election,
    origin_replicas,
    replicas_to_stop,
    target_replicas,
    validate_new_replicas_live,
    validate_target_replicas,
)
from odradek.controller.reassignment_zk import ReassignmentZk
from odradek.controller.replica_state_machine import ReplicaStateMachine
from odradek.controller.states import PartitionState, ReplicaState
from odradek.errors import KafkaError, UnknownTopicOrPartitionError
from odradek.zk.client import WatchEvent, ZkClient
from odradek.zk.errors import BadVersionError, ControllerMovedError, ZkError
from odradek.zk.znodes import ReplicaAssignment, TopicPartitionStateZNode

log = logging.getLogger(__name__)

MAX_WRITE_ATTEMPTS = 10

ReassignmentResults = dict[TopicPartition, KafkaError | None]


def no_reassignment_in_progress(tp: TopicPartition) -> KafkaError:
    return KafkaError(
        f"no reassignment of {tp[0]}-{tp[1]} is in progress", ErrorCode.no_reassignment_in_progress
    )


class ReassignmentClient(Protocol):
    """What partition reassignment needs from the controller."""

    def watch(self, make_event: Callable[[WatchEvent], Any]) -> Callable[[WatchEvent], None]:
        """A watch callback that enqueues `make_event(event)`, in the current term only."""
        ...

    def send_update_metadata(self, partitions: Iterable[TopicPartition] | None) -> None:
        """Queue UpdateMetadata for every live broker (None: every partition)."""

    def send_leader_and_isr(
        self,
        broker_ids: Iterable[int],
        tp: TopicPartition,
        leader_and_isr: LeaderAndIsr,
        replicas: Sequence[int],
        is_new: bool,
    ) -> None:
        """Queue LeaderAndIsr for `tp` to `broker_ids`."""

    async def resume_topic_deletions(self) -> None:
        """Let topic deletions that waited for a reassignment go on."""


class PartitionReassignmentManager:
    """The reassignment half of the controller; built at each failover. Event task only."""

    def __init__(
        self,
        context: ControllerContext,
        zk_client: ZkClient,
        controller_zk: ControllerZk,
        replica_state_machine: ReplicaStateMachine,
        partition_state_machine: PartitionStateMachine,
        client: ReassignmentClient,
    ) -> None:
        self.context = context
        self.zk_client = zk_client
        self.controller_zk = controller_zk
        self.zk = ReassignmentZk(zk_client)
        self.replicas = replica_state_machine
        self.partitions = partition_state_machine
        self.client = client
        # One watcher callable per partition state znode: kazoo keeps watchers in a set per path,
        # so re-arming with the same callable never multiplies the events.
        self._isr_watchers: dict[TopicPartition, Callable[[WatchEvent], None]] = {}
        self._znode_watcher = client.watch(lambda e: ev.PartitionReassignment())

    # --- triggers -----------------------------------------------------------------------------

    async def initialize(self) -> None:
        """At failover: `/admin/reassign_partitions` first (it supersedes an API reassignment of
        the same partition), then every other partition whose assignment znode says it is moving."""
        resumed = await self.process_zk_reassignment(resume_unchanged=True)
        for tp in sorted(self.context.partitions_being_reassigned() - resumed):
            assignment = self.context.full_replica_assignment(tp)
            log.info("resuming the reassignment of %s-%d: %s", *tp, assignment)
            await self._trigger({tp: assignment}, resume=True)

    async def process_zk_reassignment(self, resume_unchanged: bool = False) -> set[TopicPartition]:
        """Start the moves `/admin/reassign_partitions` asks for and re-arm its watch; entries
        that cannot start are removed from it. Returns the partitions started (or resumed).

        A later change to the znode (the controller's own removals included) must not restart the
        moves already under way to the same target, hence `resume_unchanged` (failover only).
        """
        context = self.context
        requested = await self.zk.read_reassign_partitions(self._znode_watcher)
        if not requested:
            return set()
        results: ReassignmentResults = {}
        to_start: dict[TopicPartition, ReplicaAssignment] = {}
        for tp, target in sorted(requested.items()):
            current = context.full_replica_assignment(tp)
            if (
                not resume_unchanged
                and tp in context.reassignments
                and target_replicas(current) == tuple(target)
            ):
                continue
            try:
                validate_target_replicas(target)
            except KafkaError as e:
                results[tp] = e
                continue
            built = build_reassignment(current, target)
            if built is None:  # unreachable with a target; kept for the type checker
                results[tp] = no_reassignment_in_progress(tp)
                continue
            to_start[tp] = built
        results.update(await self._trigger(to_start))
        failed = {tp: e for tp, e in results.items() if e is not None}
        if failed:
            log.warning(
                "%d reassignments in %s refused: %s",
                len(failed),
                "/admin/reassign_partitions",
                {f"{t}-{p}": str(e) for (t, p), e in sorted(failed.items())},
            )
            await self.zk.remove_from_reassign_partitions(
                context.epoch_zk_version, lambda tp, _replicas: tp in failed
            )
        return {tp for tp, e in results.items() if e is None}

    async def process_api_reassignment(
        self, reassignments: Mapping[TopicPartition, Sequence[int] | None]
    ) -> ReassignmentResults:
        """AlterPartitionReassignments: validate each partition's target, then start (or cancel,
        for None) the valid ones. The latest request wins over `/admin/reassign_partitions`."""
        context = self.context
        results: ReassignmentResults = {}
        to_start: dict[TopicPartition, ReplicaAssignment] = {}
        for tp, target in reassignments.items():
            if not context.partition_replica_assignment(tp) or context.is_topic_queued_for_deletion(
                tp[0]
            ):
                results[tp] = UnknownTopicOrPartitionError(
                    f"partition {tp[0]}-{tp[1]} does not exist"
                )
                continue
            current = context.full_replica_assignment(tp)
            try:
                if target is not None:
                    validate_target_replicas(target)
                    validate_new_replicas_live(current, target, context.live_broker_ids)
            except KafkaError as e:
                results[tp] = e
                continue
            built = build_reassignment(current, target)
            if built is None:
                results[tp] = no_reassignment_in_progress(tp)
                continue
            to_start[tp] = built
        if to_start:
            await self.zk.remove_from_reassign_partitions(
                context.epoch_zk_version, lambda tp, _replicas: tp in to_start
            )
        results.update(await self._trigger(to_start))
        return results

    def list_reassignments(
        self, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, ReplicaAssignment]:
        """ListPartitionReassignments: the full assignment of each (requested) moving partition."""
        context = self.context
        wanted = context.partitions_being_reassigned() if partitions is None else set(partitions)
        return {tp: context.reassignments[tp] for tp in sorted(wanted & set(context.reassignments))}

    async def maybe_complete(self, partitions: Iterable[TopicPartition]) -> None:
        """The ISR (or the assignment) of these partitions changed: finish the moves whose target
        replicas have all joined the ISR."""
        for tp in sorted(set(partitions) & self.context.partitions_being_reassigned()):
            assignment = self.context.full_replica_assignment(tp)
            state = await self._read_state(tp)
            if state is None:
                continue
            if is_reassignment_complete(assignment, state.isr):
                log.info(
                    "target replicas %s of %s-%d are all in the ISR %s",
                    list(target_replicas(assignment)),
                    *tp,
                    list(state.isr),
                )
                await self._trigger({tp: assignment}, resume=True)
            else:
                await self._watch_isr(tp)

    async def on_brokers_started(self, broker_ids: set[int]) -> None:
        """A broker hosting a target replica came (back): restart those moves (Kafka's
        onBrokerStartup), so that its new replicas are told to fetch."""
        context = self.context
        restart = {
            tp: assignment
            for tp, assignment in sorted(context.reassignments.items())
            if broker_ids & set(target_replicas(assignment))
        }
        if restart:
            await self._trigger(restart, resume=True)

    # --- the algorithm ----------------------------------------------------------------------

    async def _trigger(
        self, reassignments: Mapping[TopicPartition, ReplicaAssignment], resume: bool = False
    ) -> ReassignmentResults:
        """Run `on_partition_reassignment` for each partition; one partition's failure is its own
        result, except a deposed controller, which stops everything.

        A topic queued for deletion starts no new move, but a move already under way (`resume`)
        goes on to its end: the deletion waits for it, and would wait forever otherwise.
        """
        context = self.context
        results: ReassignmentResults = {}
        for tp, assignment in reassignments.items():
            if (not resume and context.is_topic_queued_for_deletion(tp[0])) or not (
                context.partition_replica_assignment(tp)
            ):
                results[tp] = UnknownTopicOrPartitionError(
                    f"partition {tp[0]}-{tp[1]} does not exist"
                )
                continue
            try:
                await self.on_partition_reassignment(tp, assignment)
                results[tp] = None
            except (ControllerMovedError, asyncio.CancelledError):
                raise
            except (ZkError, KafkaError) as e:
                log.error("reassignment of %s-%d failed: %s", *tp, e)
                results[tp] = KafkaError(str(e), ErrorCode.unknown_server_error)
        return results

    async def on_partition_reassignment(
        self, tp: TopicPartition, assignment: ReplicaAssignment
    ) -> None:
        """Start, advance or finish the move of `tp` to `assignment` (steps in the docstring)."""
        context = self.context
        rsm = self.replicas
        await self._update_current_reassignment(tp, assignment)
        state = await self._read_state(tp)
        if state is None:
            log.warning("%s-%d has no partition state yet; the move waits for a leader", *tp)
            return
        adding = [PartitionReplica(tp[0], tp[1], r) for r in assignment.adding_replicas]
        if not is_reassignment_complete(assignment, state.isr):
            # A1, A2
            await self._bump_leader_epoch_and_send(tp, assignment)
            await rsm.handle_state_changes(
                [r for r in adding if rsm.state(r) is ReplicaState.NonExistentReplica],
                ReplicaState.NewReplica,
            )
            log.info(
                "reassignment of %s-%d under way: RS %s, adding %s, removing %s, ISR %s",
                *tp,
                list(assignment.replicas),
                list(assignment.adding_replicas),
                list(assignment.removing_replicas),
                list(state.isr),
            )
            await self._watch_isr(tp)
            return
        # B1, B2
        await rsm.handle_state_changes(adding, ReplicaState.OnlineReplica)
        completed = ReplicaAssignment(target_replicas(assignment))
        context.update_full_replica_assignment(tp, completed)
        # B3
        if not await self._move_leader_if_required(tp, completed):
            context.update_full_replica_assignment(tp, assignment)
            log.warning(
                "no replica of %s can lead %s-%d yet; the reassignment stays in progress",
                list(completed.replicas),
                *tp,
            )
            await self._watch_isr(tp)
            return
        # B4, B5
        await self._stop_removed_replicas(tp, assignment.removing_replicas)
        # B6
        await self.zk.update_partition_assignments(
            context.epoch_zk_version, tp[0], {tp[1]: completed}
        )
        # B7
        await self.zk.remove_from_reassign_partitions(
            context.epoch_zk_version,
            lambda entry, replicas: entry == tp and tuple(replicas) == completed.replicas,
        )
        context.reassignments.pop(tp, None)
        self._isr_watchers.pop(tp, None)
        # B8
        self.client.send_update_metadata([tp])
        log.info("reassignment of %s-%d completed: replicas %s", *tp, list(completed.replicas))
        if context.is_topic_queued_for_deletion(tp[0]):
            await self.client.resume_topic_deletions()

    async def _update_current_reassignment(
        self, tp: TopicPartition, assignment: ReplicaAssignment
    ) -> None:
        """U1-U3: ZooKeeper, then memory, then stop what a superseded move was adding."""
        context = self.context
        current = context.full_replica_assignment(tp)
        if current == assignment:
            return
        log.info("assignment of %s-%d: %s -> %s", *tp, current, assignment)
        await self.zk.update_partition_assignments(
            context.epoch_zk_version, tp[0], {tp[1]: assignment}
        )
        context.update_full_replica_assignment(tp, assignment)
        unneeded = replicas_to_stop(current.replicas, assignment.replicas)
        if unneeded:
            await self._stop_removed_replicas(tp, unneeded)

    async def _move_leader_if_required(
        self, tp: TopicPartition, completed: ReplicaAssignment
    ) -> bool:
        """B3. False when the leader had to move and no target replica could take over."""
        context = self.context
        state = context.leadership.get(tp)
        if state is None:
            return False
        if not leader_needs_election(completed.replicas, state.leader, context.live_broker_ids):
            return await self._bump_leader_epoch_and_send(tp, completed)
        psm = self.partitions
        if psm.state(tp) not in (PartitionState.OnlinePartition, PartitionState.OfflinePartition):
            return False
        result = await psm.handle_state_changes(
            [tp], PartitionState.OnlinePartition, ElectionStrategy.REASSIGNMENT
        )
        outcome = result.get(tp)
        if isinstance(outcome, ControllerMovedError):
            raise outcome
        return outcome is not None and not isinstance(outcome, Exception)

    async def _stop_removed_replicas(self, tp: TopicPartition, removed: Iterable[int]) -> None:
        """B4, B5: out of the ISR and stopped, then deleted from their brokers' disks."""
        rsm = self.replicas
        replicas = [PartitionReplica(tp[0], tp[1], r) for r in removed]
        if not replicas:
            return
        await rsm.handle_state_changes(replicas, ReplicaState.OfflineReplica)
        await rsm.handle_state_changes(replicas, ReplicaState.ReplicaDeletionStarted)
        await rsm.handle_state_changes(replicas, ReplicaState.ReplicaDeletionSuccessful)
        await rsm.handle_state_changes(replicas, ReplicaState.NonExistentReplica)

    async def _bump_leader_epoch_and_send(
        self, tp: TopicPartition, assignment: ReplicaAssignment
    ) -> bool:
        """A1 (and B3 when the leader stays): leader and ISR unchanged, leader epoch + 1, written
        conditionally on the state znode's version (re-read and retried when the leader changed
        the ISR meanwhile); LeaderAndIsr with RS to ORS and (as new replicas) to AR."""
        context = self.context
        for _attempt in range(MAX_WRITE_ATTEMPTS):
            current = await self._read_state(tp)
            if current is None:
                return False
            if current.controller_epoch > context.epoch:
                raise ControllerMovedError(
                    f"the state of {tp[0]}-{tp[1]} was written by controller epoch"
                    f" {current.controller_epoch}, newer than ours ({context.epoch})"
                )
            bumped = replace(
                current, leader_epoch=current.leader_epoch + 1, controller_epoch=context.epoch
            )
            written = (
                await self.controller_zk.update_leader_and_isr(
                    context.epoch_zk_version, {tp: bumped}
                )
            )[tp]
            if isinstance(written, BadVersionError):
                continue
            if isinstance(written, ZkError):
                raise written
            context.leadership[tp] = written
            self.client.send_leader_and_isr(
                origin_replicas(assignment), tp, written, assignment.replicas, is_new=False
            )
            self.client.send_leader_and_isr(
                assignment.adding_replicas, tp, written, assignment.replicas, is_new=True
            )
            return True
        log.error("the state of %s-%d kept changing; could not bump its leader epoch", *tp)
        return False

    async def _read_state(self, tp: TopicPartition) -> LeaderAndIsr | None:
        """The partition state as ZooKeeper holds it now (leaders change the ISR themselves and
        tell the controller later), cached in the context."""
        states = await self.controller_zk.get_partition_states([tp])
        state = states.get(tp)
        if state is not None:
            self.context.leadership[tp] = state
        return state

    async def _watch_isr(self, tp: TopicPartition) -> None:
        """Watch the state znode of a moving partition (Kafka's PartitionReassignmentIsrChange
        handler): the leader writing a grown ISR is what completes a move."""
        watcher = self._isr_watchers.get(tp)
        if watcher is None:
            topic, partition = tp
            watcher = self.client.watch(
                lambda e: ev.PartitionReassignmentIsrChange(topic, partition)
            )
            self._isr_watchers[tp] = watcher
        await self.zk_client.exists(TopicPartitionStateZNode.path(*tp), watcher)
