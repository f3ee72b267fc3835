"""The controller's handlers of topic events (part of `KafkaController`).

Who invokes them, and their steps (the event loop in `controller` routes each event here; the
failover reads assignments through `_load_assignments` and `_partition_modification_watch` too):

`_process_topic_change` — TopicChange (the `/brokers/topics` watch): topics gone leave the context;
new topics' assignments are read (each gets a PartitionModifications watch and, if it has none, a
topic id written back as Kafka 2.8+ does) and their partitions created.

`_process_partition_modifications(topic)` — PartitionModifications: a reassignment of the topic may
be ready to finish; partitions added to the assignment are created (not while the topic is being
deleted).

`_on_new_partition_creation` — partitions New, replicas New, partitions Online (state znodes created
with leader = first live replica, ISR = live AR), replicas Online.

`_process_reassignment_request` — AlterPartitionReassignments / ListPartitionReassignments, answered
by the active controller only (the work is `reassignment`'s).

`_process_isr_change_notification` — IsrChangeNotification (leaders wrote
`/isr_change_notification/isr_change_*`): re-read those partitions' states, UpdateMetadata for
them, let reassignments waiting for their ISR finish, delete the notifications.

Concurrency: event task only.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from odradek.controller import events as ev
from odradek.controller.context import TopicPartition
from odradek.controller.partition_state_machine import ElectionStrategy
from odradek.controller.states import PartitionState, ReplicaState
from odradek.controller.term_components import TermComponents
from odradek.errors import NotControllerError
from odradek.protocol.topic_ids import uuid_to_topic_id
from odradek.zk.client import WatchEvent, WatchEventKind
from odradek.zk.errors import BadVersionError

log = logging.getLogger(__name__)


class TopicEventHandlers(TermComponents):
    """New topics and partitions, reassignment requests, and leaders' ISR change notifications."""

    def _partition_modification_watch(self, topic: str) -> Callable[[WatchEvent], None]:
        return self.watch(
            lambda e: (
                ev.PartitionModifications(topic) if e.kind is not WatchEventKind.DELETED else None
            )
        )

    async def _load_assignments(self, assignments: dict[str, Any]) -> list[str]:
        """Put topic assignments into the context; give topics without an id one (as Kafka 2.8+)."""
        context = self.context
        for topic, assignment in assignments.items():
            context.assignments[topic] = {
                p: tuple(a.replicas) for p, a in assignment.partitions.items()
            }
            for p, a in assignment.partitions.items():
                if a.adding_replicas or a.removing_replicas:
                    context.reassignments[(topic, p)] = a
            if assignment.topic_id:
                context.topic_ids[topic] = assignment.topic_id
                continue
            topic_id = uuid_to_topic_id(uuid.uuid4())
            try:
                await self.zk.set_topic_assignment(
                    context.epoch_zk_version,
                    topic,
                    dict(assignment.partitions),
                    topic_id,
                    assignment.zk_version,
                )
                context.topic_ids[topic] = topic_id
            except BadVersionError:
                reread = await self.zk.get_topic_assignments([topic])
                if topic in reread and reread[topic].topic_id:
                    context.topic_ids[topic] = reread[topic].topic_id  # type: ignore[assignment]
        return list(assignments)

    # topics

    async def _process_topic_change(self) -> None:
        context = self.context
        topics = await self.zk.get_all_topics(self.watch(lambda e: ev.TopicChange()))
        new_topics = topics - context.all_topics
        deleted_topics = context.all_topics - topics
        for topic in deleted_topics:
            context.remove_topic(topic)
        if not new_topics:
            return
        assignments = await self.zk.get_topic_assignments(
            new_topics, self._partition_modification_watch
        )
        await self._load_assignments(assignments)
        log.info("new topics: %s", sorted(assignments))
        partitions = [tp for topic in assignments for tp in context.partitions_for_topic(topic)]
        await self._on_new_partition_creation(partitions)

    async def _process_partition_modifications(self, topic: str) -> None:
        context = self.context
        if topic not in context.assignments:
            return
        assignments = await self.zk.get_topic_assignments(
            [topic], self._partition_modification_watch
        )
        assignment = assignments.get(topic)
        if assignment is None:
            return
        existing = context.assignments[topic]
        added = {
            p: tuple(a.replicas) for p, a in assignment.partitions.items() if p not in existing
        }
        if self.reassignment is not None:  # a move of this topic may be ready to finish
            await self._reassignment.maybe_complete(context.partitions_for_topic(topic))
            self._send_batch()
        if not added:
            return
        if context.is_topic_queued_for_deletion(topic):
            log.info("ignoring new partitions of %s: it is being deleted", topic)
            return
        for partition, replicas in added.items():
            context.update_partition_replica_assignment((topic, partition), replicas)
        log.info("new partitions of %s: %s", topic, sorted(added))
        await self._on_new_partition_creation([(topic, p) for p in sorted(added)])

    async def _on_new_partition_creation(self, partitions: list[TopicPartition]) -> None:
        context = self.context
        replicas = context.replicas_for_partition(partitions)
        await self._psm.handle_state_changes(partitions, PartitionState.NewPartition)
        await self._rsm.handle_state_changes(replicas, ReplicaState.NewReplica)
        await self._psm.handle_state_changes(
            partitions, PartitionState.OnlinePartition, ElectionStrategy.OFFLINE
        )
        await self._rsm.handle_state_changes(replicas, ReplicaState.OnlineReplica)
        self._send_batch()

    # partition reassignment requests (answered by the active controller only)

    async def _process_reassignment_request(
        self, event: ev.ApiPartitionReassignment | ev.ListPartitionReassignments
    ) -> None:
        if event.result.done():
            return
        if not self.is_active or self.reassignment is None:
            event.result.set_exception(
                NotControllerError(f"broker {self.broker_id} is not the controller")
            )
            return
        if isinstance(event, ev.ListPartitionReassignments):
            event.result.set_result(self._reassignment.list_reassignments(event.partitions))
            return
        results = await self._reassignment.process_api_reassignment(event.reassignments)
        self._send_batch()
        if not event.result.done():
            event.result.set_result(results)

    # ISR changes made by leaders

    async def _process_isr_change_notification(self) -> None:
        context = self.context
        children = await self.zk.get_isr_change_notifications(
            self.watch(lambda e: ev.IsrChangeNotification())
        )
        if not children:
            return
        partitions = await self.zk.read_isr_change_notifications(children)
        known = [tp for tp in partitions if tp in context.leadership]
        if known:
            context.leadership.update(await self.zk.get_partition_states(known))
            self._batch.add_update_metadata_request_for_brokers(context.live_broker_ids, known)
            self._send_batch()
            if self.reassignment is not None:
                await self._reassignment.maybe_complete(known)
                self._send_batch()
        await self.zk.delete_isr_change_notifications(children, context.epoch_zk_version)
