"""The controller's handlers of broker events (part of `KafkaController`).

Who invokes them, and their steps (the event loop in `controller` routes each event here):

`_process_broker_change` — BrokerChange / BrokerModification (the `/brokers/ids` watch): compares the
registered brokers with the context's live brokers; a broker that re-registered with a higher
broker epoch (it bounced faster than its session expired) counts as failed, then started.

`_on_broker_startup(new)` — UpdateMetadata to all live brokers; the new brokers' replicas go
OnlineReplica (they truncate and follow); New/Offline partitions get leaders; topic deletions and
reassignments waiting for these brokers go on.

`_on_broker_failure(dead)` — the partitions they led go Offline and are re-elected at once (live ISR
first; unclean only where the topic allows it); their replicas go OfflineReplica (leaving the ISR);
UpdateMetadata alone if nothing moved.

`on_replicas_become_offline(replicas)` — replicas on dead brokers, or in a failed log directory of
a live broker (KIP-112, `log_dir_events`).

`_process_controlled_shutdown` — a broker's ControlledShutdown request: move leadership of every
partition it leads to another ISR member and take it out of the ISR of the ones it follows; answer
with what it still leads (the broker retries until that is empty).

`_process_broker_response` — StopReplica answers go to topic deletion, LeaderAndIsr answers to the
log directory events (KAFKA_STORAGE_ERROR).

Concurrency: event task only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kio.schema.errors import ErrorCode

from odradek.controller import events as ev
from odradek.controller.context import PartitionReplica, TopicPartition
from odradek.controller.partition_state_machine import ElectionStrategy
from odradek.controller.states import PartitionState, ReplicaState
from odradek.controller.term_components import TermComponents
from odradek.errors import BrokerNotAvailableError, NotControllerError, StaleBrokerEpochError
from odradek.protocol.codec import ApiKey
from odradek.security.controller_requests import validate_controlled_shutdown

log = logging.getLogger(__name__)


class BrokerEventHandlers(TermComponents):
    """Broker start-ups, failures and bounces, controlled shutdown, and broker responses."""

    # brokers

    async def _process_broker_change(self) -> None:
        context = self.context
        current = await self.zk.get_all_brokers(self.watch(lambda e: ev.BrokerChange()))
        previous = context.live_brokers
        new_ids = set(current) - set(previous)
        dead_ids = set(previous) - set(current)
        bounced_ids = {
            b
            for b in set(current) & set(previous)
            if current[b].broker_epoch > previous[b].broker_epoch
        }
        if not (new_ids or dead_ids or bounced_ids):
            # Same brokers; an endpoint or rack may have changed.
            changed = {b for b in current if current[b] != previous.get(b)}
            context.live_brokers = current
            if changed:
                for b in changed:
                    self._channel.add_broker(current[b])
                self._batch.add_update_metadata_request_for_brokers(context.live_broker_ids, None)
                self._send_batch()
            return
        log.info(
            "brokers changed: new %s, dead %s, bounced %s",
            sorted(new_ids),
            sorted(dead_ids),
            sorted(bounced_ids),
        )
        for broker_id in dead_ids | bounced_ids:
            self._channel.remove_broker(broker_id)
        context.live_brokers = {b: info for b, info in current.items() if b not in bounced_ids}
        if bounced_ids:
            await self._on_broker_failure(bounced_ids)
        context.live_brokers = current
        for broker_id in new_ids | bounced_ids:
            self._channel.add_broker(current[broker_id])
        if new_ids:
            await self._on_broker_startup(new_ids)
        if bounced_ids:
            await self._on_broker_startup(bounced_ids)
        if dead_ids:
            await self._on_broker_failure(dead_ids)

    async def _on_unprocessed_restarts(self, written: Mapping[TopicPartition, int]) -> None:
        """At failover: a leader whose registration (broker epoch = its czxid) is newer than the
        last write of the partition state naming it registered again -- a restart, or a new
        session -- after it was given that leadership, and no controller processed that: the
        previous one died first. Its current process never took the leadership at that epoch
        (it may serve a high watermark older than the one clients saw under that same epoch,
        from its checkpoint). Kafka's controller cannot see this at failover.

        Where a live ISR member that did not restart can lead, it does, at a new leader epoch, as a controller
        watching at the time would have done (the restarted broker rejoins the ISR once it has
        caught up); the partition never goes offline. Where no ISR member that did not restart
        is live (the others are dead, or restarted leaders too), it is elected again among the
        live ISR members at a new epoch, the ISR shrunk to them, as an offline election would.
        Where the ISR is the restarted broker alone (a one-broker cluster after a restart)
        nothing changes: it is the only possible leader, its high watermark catches up with its
        log end at once (the ISR is itself), and a second LeaderAndIsr at a new epoch only made clients see
        NOT_LEADER_OR_FOLLOWER for a moment after the restart (the compaction crash tests).
        """
        context = self.context
        restarted: dict[TopicPartition, int] = {
            tp: state.leader
            for tp, state in context.leadership.items()
            if state.leader in context.live_brokers
            and tp in written
            and context.live_brokers[state.leader].broker_epoch > written[tp]
            and not context.is_topic_queued_for_deletion(tp[0])
        }
        if not restarted:
            return
        brokers = set(restarted.values())
        live = context.live_serving_broker_ids
        movable = [
            tp
            for tp, leader in restarted.items()
            if any(
                r not in brokers and r in live and not context.is_replica_on_offline_dir(r, tp)
                for r in context.leadership[tp].isr
            )
        ]
        # No other live ISR member, and the ISR names dead brokers: the restarted leader's high
        # watermark waits for them, so it would serve its checkpointed one until they are
        # dropped. Elected again as for an offline partition (the live ISR members, clean) at a
        # new epoch (found by the soak: HW 8499 served under the epoch clients had seen 8579
        # under). ISR members that live (all of them, after a ZooKeeper outage every broker
        # re-registers) catch up at once: nothing changes for those partitions.
        # The same where every ISR member is a restarted leader (found by the soak, run 13:
        # brokers 2 and 3 both restarted, each the other's only ISR peer; broker 2 kept epoch 8
        # and served its checkpointed HW 5935 after clients had seen 6192). Only an ISR of the
        # restarted leader alone keeps its epoch (below).
        live_ids = context.live_broker_ids
        stranded = [
            tp
            for tp in restarted
            if tp not in movable
            and (
                len(context.leadership[tp].isr) > 1
                or any(r not in live_ids for r in context.leadership[tp].isr)
            )
        ]
        if movable:
            log.info(
                "brokers %s registered after the leaderships they hold were written, unseen by "
                "any controller: %d partitions move to another ISR member at a new leader epoch",
                sorted(brokers),
                len(movable),
            )
            shutting_down = set(context.shutting_down_broker_ids)
            context.shutting_down_broker_ids |= brokers
            try:
                await self._psm.handle_state_changes(
                    movable, PartitionState.OnlinePartition, ElectionStrategy.CONTROLLED_SHUTDOWN
                )
            finally:
                context.shutting_down_broker_ids = shutting_down
            # The restarted brokers learn that they follow now: the election treated them as
            # shutting down and sent them nothing. Every restarted replica of a moved partition,
            # not only its former leader: a restarted follower (it led another partition) left
            # fetching from the old leader at the old epoch is refused for ever and never rejoins
            # the ISR (found by the soak, run 12).
            await self._rsm.handle_state_changes(
                [
                    PartitionReplica(tp[0], tp[1], replica)
                    for tp in movable
                    for replica in context.partition_replica_assignment(tp)
                    if replica in brokers
                ],
                ReplicaState.OnlineReplica,
            )
        if stranded:
            log.info(
                "brokers %s registered after the leaderships they hold were written, unseen by "
                "any controller, with no other live ISR member: %d partitions elected again among "
                "the live ISR members at a new leader epoch",
                sorted(brokers),
                len(stranded),
            )
            await self._psm.handle_state_changes(
                stranded, PartitionState.OnlinePartition, ElectionStrategy.OFFLINE
            )
        self._send_batch()

    async def _on_broker_startup(self, new_ids: set[int]) -> None:
        context = self.context
        context.shutting_down_broker_ids -= new_ids
        self.log_dir_events.on_brokers_restarted(new_ids)
        # 1. everyone learns about the new brokers; the new brokers learn everything
        self._batch.add_update_metadata_request_for_brokers(context.live_broker_ids, None)
        self._send_batch()
        # 2. their replicas go online (LeaderAndIsr: they truncate and follow)
        replicas = [
            r
            for r in context.replicas_on_brokers(new_ids)
            if not context.is_topic_queued_for_deletion(r.topic)
        ]
        await self._rsm.handle_state_changes(replicas, ReplicaState.OnlineReplica)
        # 3. offline partitions with a replica on them may now get a leader
        await self._psm.trigger_online_partition_state_change()
        self._send_batch()
        # 4. topic deletions waiting for these brokers can go on
        await self._topic_deletion.on_brokers_started(new_ids)
        self._send_batch()
        # 5. reassignments waiting for these brokers
        if self.reassignment is not None:
            await self._reassignment.on_brokers_started(new_ids)
            self._send_batch()

    async def _on_broker_failure(self, dead_ids: set[int]) -> None:
        context = self.context
        context.shutting_down_broker_ids -= dead_ids
        self.log_dir_events.on_brokers_restarted(dead_ids)
        replicas = context.replicas_on_brokers(dead_ids)
        await self.on_replicas_become_offline(replicas)
        await self._topic_deletion.on_replicas_offline(replicas)
        self._send_batch()

    async def on_replicas_become_offline(self, replicas: list[PartitionReplica]) -> None:
        """Replicas on dead brokers or failed log directories (KIP-112) go offline."""
        context = self.context
        offline = set(replicas)
        brokers = {r.replica for r in replicas}  # cheap first test: failovers touch 100,000s
        with_offline_leader = [
            tp
            for tp, state in context.leadership.items()
            if state.leader in brokers
            and PartitionReplica(tp[0], tp[1], state.leader) in offline
            and not context.is_topic_queued_for_deletion(tp[0])
        ]
        # 1. partitions whose leader died: Offline, then elect at once
        await self._psm.handle_state_changes(with_offline_leader, PartitionState.OfflinePartition)
        await self._psm.trigger_online_partition_state_change()
        # 2. the dead replicas: Offline (out of the ISR)
        not_deleting = [r for r in replicas if not context.is_topic_queued_for_deletion(r.topic)]
        await self._rsm.handle_state_changes(not_deleting, ReplicaState.OfflineReplica)
        # 3. if no partition changed, the live brokers still need the new broker list
        if not with_offline_leader and not not_deleting:
            self._batch.add_update_metadata_request_for_brokers(context.live_broker_ids, [])

    # controlled shutdown

    async def _process_controlled_shutdown(self, event: ev.ControlledShutdown) -> None:
        if event.result.done():
            return
        if not self.is_active:
            event.result.set_exception(
                NotControllerError(f"broker {self.broker_id} is not the controller")
            )
            return
        context = self.context
        # Only that incarnation of the broker knows its epoch exactly (issue 14: the old check
        # accepted -1 and any epoch not below the current one).
        verdict = validate_controlled_shutdown(
            event.broker_id,
            event.broker_epoch,
            {b: info.broker_epoch for b, info in context.live_brokers.items()},
        )
        if not verdict.accepted:
            log.warning("refused ControlledShutdown: %s", verdict.reason)
            error_class = (
                StaleBrokerEpochError
                if verdict.error == ErrorCode.stale_broker_epoch
                else BrokerNotAvailableError
            )
            event.result.set_exception(error_class(verdict.reason))
            return
        context.shutting_down_broker_ids.add(event.broker_id)
        log.info("controlled shutdown of broker %d", event.broker_id)
        partitions = [
            tp
            for tp in context.partitions_on_broker(event.broker_id)
            if len(context.partition_replica_assignment(tp)) > 1
            and not context.is_topic_queued_for_deletion(tp[0])
            and tp in context.leadership
        ]
        led = [tp for tp in partitions if context.leadership[tp].leader == event.broker_id]
        followed = [tp for tp in partitions if context.leadership[tp].leader != event.broker_id]
        await self._psm.handle_state_changes(
            led, PartitionState.OnlinePartition, ElectionStrategy.CONTROLLED_SHUTDOWN
        )
        await self._rsm.handle_state_changes(
            [PartitionReplica(t, p, event.broker_id) for t, p in followed],
            ReplicaState.OfflineReplica,
        )
        self._send_batch()
        remaining = [
            tp
            for tp in context.partitions_led_by(event.broker_id)
            if len(context.partition_replica_assignment(tp)) > 1
        ]
        if not event.result.done():
            event.result.set_result(remaining)

    # responses

    async def send_leader_and_isr_for_brokers(self, broker_ids: set[int]) -> None:
        """LeaderAndIsr for every replica of `broker_ids` (a log directory event)."""
        replicas = [
            r
            for r in self.context.replicas_on_brokers(broker_ids)
            if not self.context.is_topic_queued_for_deletion(r.topic)
        ]
        await self._rsm.handle_state_changes(replicas, ReplicaState.OnlineReplica)
        self._send_batch()

    async def _process_broker_response(self, event: ev.BrokerResponseReceived) -> None:
        response = event.response
        error_code = getattr(response, "error_code", 0)
        if error_code:
            log.warning(
                "broker %d answered %s with error %s",
                event.broker_id,
                ApiKey(event.api_key).name,
                error_code,
            )
        if event.api_key == ApiKey.STOP_REPLICA and self.topic_deletion is not None:
            self._topic_deletion.on_stop_replica_response_event(event.broker_id, response)
        if event.api_key == ApiKey.LEADER_AND_ISR:
            await self.log_dir_events.on_leader_and_isr_response(event.broker_id, response)
            self._send_batch()
