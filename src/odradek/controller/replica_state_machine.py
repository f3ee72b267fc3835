"""The replica state machine (Kafka's ZkReplicaStateMachine).

States, valid transitions and their side effects are listed in `odradek.controller.states`. This module
applies a batch of transitions, refusing and logging invalid ones:

- NewReplica: LeaderAndIsr (is_new) to the replica's broker if the partition has a leader state;
  a replica the current state names as leader cannot be new.
- OnlineReplica: from NewReplica, add it to the assignment if missing; otherwise, if the partition has
  a leader state, LeaderAndIsr to the replica's broker (UpdateMetadata to all goes with it).
- OfflineReplica: StopReplica (no delete) to its broker if alive; remove it from the ISR of its
  partitions in ZooKeeper (batched, conditional, retried on version races); send the shrunk state to
  the remaining live replicas (unless the topic is being deleted) and UpdateMetadata to all.
- ReplicaDeletionStarted: StopReplica with delete to its broker.
- ReplicaDeletionIneligible, ReplicaDeletionSuccessful: state only.
- NonExistentReplica: drop it from the assignment and forget its state.

Concurrency: controller event task only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from odradek.controller.channel_manager import ControllerBrokerRequestBatch
from odradek.controller.context import (
    ControllerContext,
    LeaderAndIsr,
    PartitionReplica,
    TopicPartition,
)
from odradek.controller.controller_zk import ControllerZk
from odradek.controller.election_algorithms import remove_replica_from_isr
from odradek.controller.states import (
    ReplicaState,
    StateChangeLogger,
    format_replica,
    split_valid_transitions,
)
from odradek.zk.errors import BadVersionError, ZkError

log = logging.getLogger(__name__)

MAX_WRITE_ATTEMPTS = 10


class ReplicaStateMachine:
    def __init__(
        self,
        context: ControllerContext,
        zk: ControllerZk,
        batch: ControllerBrokerRequestBatch,
        state_change_logger: StateChangeLogger,
    ) -> None:
        self.context = context
        self.zk = zk
        self.batch = batch
        self.state_change_logger = state_change_logger

    def state(self, replica: PartitionReplica) -> ReplicaState:
        return self.context.replica_states.get(replica, ReplicaState.NonExistentReplica)

    def initialize_states(self) -> None:
        """At failover: Online if the replica's broker is live, ReplicaDeletionIneligible otherwise
        (as Kafka: an offline replica of a partition may still be deleted later)."""
        context = self.context
        for topic, partitions in context.assignments.items():
            for partition, replicas in partitions.items():
                for replica in replicas:
                    key = PartitionReplica(topic, partition, replica)
                    context.replica_states[key] = (
                        ReplicaState.OnlineReplica
                        if context.is_replica_online(replica, include_shutting_down=True)
                        else ReplicaState.ReplicaDeletionIneligible
                    )

    def _transition(self, replica: PartitionReplica, target: ReplicaState) -> None:
        previous = self.state(replica)
        self.context.replica_states[replica] = target
        self.state_change_logger.replica_transition(
            self.context.epoch, replica.topic, replica.partition, replica.replica, previous, target
        )

    async def handle_state_changes(
        self, replicas: Iterable[PartitionReplica], target: ReplicaState
    ) -> None:
        try:
            await self._handle_state_changes(replicas, target)
        finally:
            self.state_change_logger.flush()  # the batch's lines, written together

    async def _handle_state_changes(
        self, replicas: Iterable[PartitionReplica], target: ReplicaState
    ) -> None:
        replicas = list(replicas)
        if not replicas:
            return
        valid, invalid = split_valid_transitions(replicas, self.state, target)
        for replica in invalid:
            self.state_change_logger.invalid_transition(
                self.context.epoch,
                format_replica(replica.topic, replica.partition, replica.replica),
                self.state(replica),
                target,
            )
        if not valid:
            return
        handler = {
            ReplicaState.NewReplica: self._to_new,
            ReplicaState.OnlineReplica: self._to_online,
            ReplicaState.OfflineReplica: self._to_offline,
            ReplicaState.ReplicaDeletionStarted: self._to_deletion_started,
        }.get(target)
        if handler is not None:
            await handler(valid)
        elif target is ReplicaState.NonExistentReplica:
            for replica in valid:
                tp = replica.topic_partition
                assignment = self.context.partition_replica_assignment(tp)
                if replica.replica in assignment:
                    self.context.update_partition_replica_assignment(
                        tp, [r for r in assignment if r != replica.replica]
                    )
                self._transition(replica, target)
                self.context.replica_states.pop(replica, None)
        else:
            for replica in valid:
                self._transition(replica, target)

    async def _to_new(self, replicas: list[PartitionReplica]) -> None:
        context = self.context
        for replica in replicas:
            tp = replica.topic_partition
            state = context.leadership.get(tp)
            if state is not None:
                if state.leader == replica.replica:
                    log.error("%s is the leader and cannot become NewReplica", replica)
                    continue
                self.batch.add_leader_and_isr_request_for_brokers(
                    [replica.replica],
                    tp,
                    state,
                    context.partition_replica_assignment(tp),
                    is_new=True,
                )
            self._transition(replica, ReplicaState.NewReplica)

    async def _to_online(self, replicas: list[PartitionReplica]) -> None:
        context = self.context
        for replica in replicas:
            tp = replica.topic_partition
            if self.state(replica) is ReplicaState.NewReplica:
                assignment = context.partition_replica_assignment(tp)
                if replica.replica not in assignment:
                    context.update_partition_replica_assignment(tp, [*assignment, replica.replica])
            else:
                state = context.leadership.get(tp)
                if state is not None:
                    self.batch.add_leader_and_isr_request_for_brokers(
                        [replica.replica],
                        tp,
                        state,
                        context.partition_replica_assignment(tp),
                        is_new=False,
                    )
            self._transition(replica, ReplicaState.OnlineReplica)

    async def _to_offline(self, replicas: list[PartitionReplica]) -> None:
        context = self.context
        by_broker: dict[int, list[PartitionReplica]] = {}
        for replica in replicas:
            by_broker.setdefault(replica.replica, []).append(replica)
            if replica.replica in context.live_brokers:
                self.batch.add_stop_replica_request_for_brokers(
                    [replica.replica], replica.topic_partition, delete=False
                )
        for broker_id, broker_replicas in by_broker.items():
            partitions = [r.topic_partition for r in broker_replicas]
            updated = await self.remove_replicas_from_isr(broker_id, partitions)
            for tp, state in updated.items():
                if not context.is_topic_queued_for_deletion(tp[0]):
                    assignment = context.partition_replica_assignment(tp)
                    recipients = [
                        r for r in assignment if r != broker_id and r in context.live_brokers
                    ]
                    self.batch.add_leader_and_isr_request_for_brokers(
                        recipients, tp, state, assignment, is_new=False
                    )
            self.batch.add_update_metadata_request_for_brokers(context.live_broker_ids, partitions)
            for replica in broker_replicas:
                self._transition(replica, ReplicaState.OfflineReplica)

    async def _to_deletion_started(self, replicas: list[PartitionReplica]) -> None:
        for replica in replicas:
            self.batch.add_stop_replica_request_for_brokers(
                [replica.replica], replica.topic_partition, delete=True
            )
            self._transition(replica, ReplicaState.ReplicaDeletionStarted)

    async def remove_replicas_from_isr(
        self, replica_id: int, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, LeaderAndIsr]:
        """Shrink the ISR (and drop the leadership) of `replica_id` in ZooKeeper, with version
        races retried on fresh reads. Returns the state of each partition written now, and of
        each led partition whose ISR already lacked the replica, for the caller to restate to
        its replicas (Kafka's doRemoveReplicasFromIsr returns both): the removal may have landed
        before a lost connection, and its leader, whose own ISR write then failed on the
        version, waits fenced for exactly this LeaderAndIsr."""
        context = self.context
        done: dict[TopicPartition, LeaderAndIsr] = {}
        # Leaders may have changed these ISRs (re-added the replica, say) without the controller
        # hearing yet: decide from ZooKeeper, as Kafka's doRemoveReplicasFromIsr does -- except
        # for states this controller wrote in the current, unsent batch (an election of this
        # event: a broker failure elects, then removes the dead replicas), which nobody can
        # have changed since (`ControllerBrokerRequestBatch.unsent_writes`).
        unsent = self.batch.unsent_writes
        stale = [
            tp
            for tp in partitions
            if tp in context.leadership and unsent.get(tp) is not context.leadership[tp]
        ]
        if stale:
            context.leadership.update(await self.zk.get_partition_states(stale))
        remaining = [tp for tp in partitions if tp in context.leadership]
        for _attempt in range(MAX_WRITE_ATTEMPTS):
            updates: dict[TopicPartition, LeaderAndIsr] = {}
            for tp in remaining:
                current = context.leadership[tp]
                if replica_id not in current.isr and current.leader != replica_id:
                    if current.leader >= 0:
                        done[tp] = current
                    continue
                leader, isr = remove_replica_from_isr(current.leader, current.isr, replica_id)
                if current.leader == replica_id and leader == current.leader:
                    leader = -1
                updates[tp] = LeaderAndIsr(
                    leader=leader,
                    leader_epoch=current.leader_epoch + 1,
                    isr=tuple(isr),
                    controller_epoch=context.epoch,
                    zk_version=current.zk_version,
                )
            if not updates:
                break
            written = await self.zk.update_leader_and_isr(context.epoch_zk_version, updates)
            retry = []
            for tp, result in written.items():
                if isinstance(result, BadVersionError):
                    retry.append(tp)
                elif isinstance(result, ZkError):
                    log.warning(
                        "could not remove %d from the ISR of %s: %s", replica_id, tp, result
                    )
                else:
                    context.leadership[tp] = result
                    self.batch.unsent_writes[tp] = result
                    done[tp] = result
            if not retry:
                break
            context.leadership.update(await self.zk.get_partition_states(retry))
            remaining = retry
        return done
