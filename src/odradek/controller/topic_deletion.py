"""Topic deletion (Kafka's TopicDeletionManager), driven by `/admin/delete_topics/<topic>`.

An admin (DeleteTopics on any broker, or a direct write) creates `/admin/delete_topics/<topic>`; the
controller's TopicDeletion event queues the topic. Deleting it then takes these steps, each invoked by
the controller's event task:

1. Queue: topics that do not exist, or all topics when `delete.topic.enable` is false, just have their
   znode removed.
2. Start (`_start_deletion`): every broker gets UpdateMetadata with leader -2 for the topic's partitions
   (clients stop using it); the partitions go Offline then NonExistent; the replicas go Offline, then
   ReplicaDeletionStarted, which sends StopReplica(delete=true) to their brokers.
3. Responses (`on_stop_replica_response`): a replica whose broker answered without error is
   ReplicaDeletionSuccessful; an error, or a broker that is down, makes it ReplicaDeletionIneligible,
   and the topic waits; ineligible replicas are retried when their broker starts again.
4. Complete (`_complete_deletion`): once every replica is ReplicaDeletionSuccessful, the replicas go
   NonExistent and ZooKeeper loses `/brokers/topics/<t>` (with its partition states),
   `/config/topics/<t>` and `/admin/delete_topics/<t>` — in that order, so that a controller crash in
   between leaves the deletion marker and the next controller finishes the job.

The manager sees the controller only through `DeletionClient` (as Kafka's TopicDeletionManager
does): enqueue an event, and queue UpdateMetadata for the live brokers. The context, the two state
machines and the ZooKeeper client are handed to it when the controller builds it at failover.

Concurrency: controller event task only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from odradek.controller import events as ev
from odradek.controller.context import ControllerContext, PartitionReplica, TopicPartition
from odradek.controller.partition_state_machine import PartitionStateMachine
from odradek.controller.replica_state_machine import ReplicaStateMachine
from odradek.controller.states import PartitionState, ReplicaState
from odradek.zk.client import ZkClient
from odradek.zk.errors import NoNodeError, ZkError
from odradek.zk.znodes import (
    DeleteTopicsTopicZNode,
    DeleteTopicsZNode,
    TopicConfigZNode,
    TopicZNode,
)

log = logging.getLogger(__name__)


class DeletionClient(Protocol):
    """What topic deletion needs from the controller (Kafka's DeletionClient)."""

    def put(self, event: Any) -> None:
        """Enqueue a controller event."""

    def send_update_metadata(self, partitions: Iterable[TopicPartition] | None) -> None:
        """Queue UpdateMetadata for every live broker (None: every partition)."""


class TopicDeletionManager:
    """Deletes the topics queued under `/admin/delete_topics`; built at each failover."""

    def __init__(
        self,
        context: ControllerContext,
        zk: ZkClient,
        replica_state_machine: ReplicaStateMachine,
        partition_state_machine: PartitionStateMachine,
        client: DeletionClient,
        delete_topic_enable: bool,
    ) -> None:
        self.context = context
        self.zk = zk
        self.replicas = replica_state_machine
        self.partitions = partition_state_machine
        self.client = client
        self.enabled = delete_topic_enable

    async def process_topic_deletion_event(self, watch: Callable[..., None]) -> None:
        zk = self.zk
        try:
            queued = set(await zk.get_children(DeleteTopicsZNode.path(), watch))
        except NoNodeError:
            return
        context = self.context
        unknown = {t for t in queued if t not in context.assignments}
        for topic in unknown if self.enabled else queued:
            await self._delete_marker(topic)
        if not self.enabled:
            if queued:
                log.info("delete.topic.enable is false: ignoring deletion of %s", sorted(queued))
            return
        wanted = queued - unknown
        new = wanted - context.topics_to_be_deleted
        if new:
            log.info("topics queued for deletion: %s", sorted(new))
            context.topics_to_be_deleted.update(new)
        await self.resume()

    async def _delete_marker(self, topic: str) -> None:
        try:
            await self.zk.delete(DeleteTopicsTopicZNode.path(topic))
        except NoNodeError:
            pass

    async def on_brokers_started(self, broker_ids: set[int]) -> None:
        # Topics with ineligible replicas on these brokers stay marked: resume() retries just
        # those replicas (_retry_ineligible) rather than starting the whole deletion again.
        await self.resume()

    async def on_replicas_offline(self, replicas: list[PartitionReplica]) -> None:
        context = self.context
        # Deletion cannot finish on a dead broker: replicas still waiting for (or not yet sent)
        # StopReplica fail straight to ReplicaDeletionIneligible, as Kafka's failReplicaDeletion.
        failed = [
            r
            for r in replicas
            if context.is_topic_queued_for_deletion(r.topic)
            and context.replica_states.get(r)
            in (ReplicaState.ReplicaDeletionStarted, ReplicaState.OfflineReplica)
        ]
        if not failed:
            return
        await self.replicas.handle_state_changes(failed, ReplicaState.ReplicaDeletionIneligible)
        context.topics_ineligible_for_deletion.update(r.topic for r in failed)

    def on_stop_replica_response_event(self, broker_id: int, answer: Any) -> None:
        """A StopReplica answer (`StopReplicaAnswer`): queue the outcome of its deletions."""
        deleted = getattr(answer, "deleted_partitions", frozenset())
        if not deleted:
            return
        if answer.error_code:
            errors = {tp: answer.error_code for tp in deleted}
        else:
            errors = {tp: 0 for tp in deleted}
            for e in getattr(answer.response, "partition_errors", ()):
                key = (e.topic_name, e.partition_index)
                if key in errors:
                    errors[key] = int(e.error_code)
        self.client.put(ev.TopicDeletionStopReplicaResponseReceived(broker_id, errors))

    async def on_stop_replica_response(
        self, broker_id: int, errors: dict[tuple[str, int], int]
    ) -> None:
        """Only the replicas this answer deleted (or failed to delete) change state."""
        context = self.context
        machine = self.replicas
        started = [
            replica
            for topic, partition in errors
            if context.replica_states.get(replica := PartitionReplica(topic, partition, broker_id))
            is ReplicaState.ReplicaDeletionStarted
            and context.is_topic_queued_for_deletion(topic)
        ]
        failed = [r for r in started if errors[r.topic_partition] != 0]
        succeeded = [r for r in started if errors[r.topic_partition] == 0]
        if failed:
            await machine.handle_state_changes(failed, ReplicaState.ReplicaDeletionIneligible)
            context.topics_ineligible_for_deletion.update(r.topic for r in failed)
        await machine.handle_state_changes(succeeded, ReplicaState.ReplicaDeletionSuccessful)
        await self.resume()

    async def resume(self) -> None:
        context = self.context
        for topic in sorted(context.topics_to_be_deleted):
            if context.topic_being_reassigned(topic):
                continue  # deletion waits for the move to finish (Kafka marks it ineligible)
            if context.are_all_replicas_in_state(topic, ReplicaState.ReplicaDeletionSuccessful):
                await self._complete_deletion(topic)
            elif context.is_any_replica_in_state(topic, ReplicaState.ReplicaDeletionStarted):
                continue  # waiting for StopReplica answers
            elif topic in context.topics_ineligible_for_deletion:
                await self._retry_ineligible(topic)
            else:
                await self._start_deletion(topic)

    async def _retry_ineligible(self, topic: str) -> None:
        context = self.context
        machine = self.replicas
        ineligible = [
            r
            for r in context.replicas_in_state(topic, ReplicaState.ReplicaDeletionIneligible)
            if r.replica in context.live_brokers
        ]
        if not ineligible:
            return
        if not any(
            r.replica not in context.live_brokers
            for r in context.replicas_in_state(topic, ReplicaState.ReplicaDeletionIneligible)
        ):
            context.topics_ineligible_for_deletion.discard(topic)
        await machine.handle_state_changes(ineligible, ReplicaState.OfflineReplica)
        await machine.handle_state_changes(ineligible, ReplicaState.ReplicaDeletionStarted)

    async def _start_deletion(self, topic: str) -> None:
        context = self.context
        partitions = context.partitions_for_topic(topic)
        log.info("starting deletion of topic %s (%d partitions)", topic, len(partitions))
        # 1. everybody stops using it (UpdateMetadata with leader -2 for topics being deleted)
        self.client.send_update_metadata(partitions)
        # 2. partitions Offline then NonExistent (only those not there yet: this step may repeat)
        existing = [
            tp
            for tp in partitions
            if context.partition_states.get(tp, PartitionState.NonExistentPartition)
            is not PartitionState.NonExistentPartition
        ]
        await self.partitions.handle_state_changes(existing, PartitionState.OfflinePartition)
        await self.partitions.handle_state_changes(existing, PartitionState.NonExistentPartition)
        # 3. replicas: dead brokers' ineligible; live ones Offline, then DeletionStarted;
        #    replicas already deleted are left alone
        replicas = [
            r
            for r in context.replicas_for_partition(partitions)
            if context.replica_states.get(r) is not ReplicaState.ReplicaDeletionSuccessful
        ]
        dead = [r for r in replicas if r.replica not in context.live_brokers]
        live = [r for r in replicas if r.replica in context.live_brokers]
        await self.replicas.handle_state_changes(dead, ReplicaState.OfflineReplica)
        await self.replicas.handle_state_changes(dead, ReplicaState.ReplicaDeletionIneligible)
        if dead:
            context.topics_ineligible_for_deletion.add(topic)
        await self.replicas.handle_state_changes(live, ReplicaState.OfflineReplica)
        await self.replicas.handle_state_changes(live, ReplicaState.ReplicaDeletionStarted)

    async def _complete_deletion(self, topic: str) -> None:
        context = self.context
        machine = self.replicas
        replicas = context.replicas_in_state(topic, ReplicaState.ReplicaDeletionSuccessful)
        await machine.handle_state_changes(replicas, ReplicaState.NonExistentReplica)
        zk = self.zk
        for path, recursive in (
            (TopicZNode.path(topic), True),
            (TopicConfigZNode.path(topic), False),
            (DeleteTopicsTopicZNode.path(topic), False),
        ):
            try:
                await zk.delete(path, recursive=recursive)
            except NoNodeError:
                pass
            except ZkError as e:
                log.warning("deleting %s failed: %s", path, e)
        context.topics_to_be_deleted.discard(topic)
        context.topics_ineligible_for_deletion.discard(topic)
        context.remove_topic(topic)
        log.info("deletion of topic %s completed", topic)
