"""The controller's side of failed log directories (KIP-112, ZooKeeper mode).

A broker whose log directory failed writes `/log_dir_event_notification/log_dir_event_<seq>`
(`{"version":1,"broker":<id>,"event":1}`). The controller does not learn *which* replicas failed
from it; it asks, as Kafka does:

1. `LogDirEventNotification` (the watch fired): read and delete every notification, then move every
   replica of the live brokers named in them to OnlineReplica, which sends each broker a
   LeaderAndIsr for all its replicas (Kafka's onBrokerLogDirFailure);
2. `on_leader_and_isr_response` (every LeaderAndIsr answer, from this path or any other — so a
   broker that restarted with a failed directory, or a controller failover, is covered too): the
   partitions answered with KAFKA_STORAGE_ERROR are that broker's offline replicas; those not
   known yet are recorded in the context (`replicas_on_offline_dirs`) and go through
   `on_replicas_become_offline`: partitions they led get a new leader from the other live ISR
   members (elections skip replicas on offline directories), the replicas leave the ISR
   (OfflineReplica), and every broker gets UpdateMetadata listing them in `offline_replicas`.

A broker that restarts or dies forgets its offline replicas (`on_brokers_restarted`): after a
restart its directories are loaded afresh and its LeaderAndIsr answers say again what is offline.

At failover the notifications left behind are deleted: the failover's LeaderAndIsr to every broker
reveals the offline replicas anyway (Kafka deletes them the same way).

Concurrency: controller event task only, like every controller manager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.controller.context import ControllerContext, PartitionReplica, TopicPartition
from odradek.controller.controller_zk import ControllerZk
from odradek.protocol.topic_ids import topic_id_to_uuid
from odradek.zk.client import WatchCallback

log = logging.getLogger(__name__)


class LogDirEventClient(Protocol):
    """What this manager needs from the controller."""

    async def on_replicas_become_offline(self, replicas: list[PartitionReplica]) -> None: ...

    async def send_leader_and_isr_for_brokers(self, broker_ids: set[int]) -> None: ...


def storage_error_partitions(
    response: Any, topic_of_id: Callable[[Any], str | None]
) -> list[TopicPartition]:
    """The partitions a LeaderAndIsr answer reports with KAFKA_STORAGE_ERROR."""
    if int(getattr(response, "error_code", 0)) != 0:
        return []
    found: list[TopicPartition] = []
    for topic in getattr(response, "topics", ()):
        name = topic_of_id(topic.topic_id)
        if name is None:
            continue
        for partition in topic.partition_errors:
            if partition.error_code == ErrorCode.kafka_storage_error:
                found.append((name, int(partition.partition_index)))
    return found


class LogDirEventManager:
    """KIP-112 on the controller (protocol in the module docstring). Event task only."""

    def __init__(
        self, context: ControllerContext, zk: ControllerZk, client: LogDirEventClient
    ) -> None:
        self.context = context
        self.zk = zk
        self.client = client

    async def on_controller_failover(self, watch: WatchCallback) -> None:
        children = await self.zk.get_log_dir_event_notifications(watch)
        if children:
            await self.zk.delete_log_dir_event_notifications(
                children, self.context.epoch_zk_version
            )

    async def process_notifications(self, watch: WatchCallback) -> None:
        """Step 1: the brokers named in the notifications get LeaderAndIsr for all replicas."""
        context = self.context
        children = await self.zk.get_log_dir_event_notifications(watch)
        if not children:
            return
        brokers = await self.zk.read_log_dir_event_notifications(children)
        await self.zk.delete_log_dir_event_notifications(children, context.epoch_zk_version)
        live = brokers & context.live_broker_ids
        if live:
            log.info("brokers %s report failed log directories", sorted(live))
            await self.client.send_leader_and_isr_for_brokers(live)

    async def on_leader_and_isr_response(self, broker_id: int, response: Any) -> None:
        """Step 2: mark the replicas answered with KAFKA_STORAGE_ERROR offline."""
        context = self.context
        if broker_id not in context.live_brokers:
            return
        ids = {topic_id_to_uuid(tid): topic for topic, tid in context.topic_ids.items()}
        failed = storage_error_partitions(response, ids.get)
        if not failed:
            return
        known = context.replicas_on_offline_dirs.setdefault(broker_id, set())
        new = [tp for tp in failed if tp not in known and tp[0] in context.assignments]
        if not new:
            return
        known.update(new)
        log.warning(
            "broker %d has %d replicas in failed log directories: %s",
            broker_id,
            len(new),
            ", ".join(f"{t}-{p}" for t, p in sorted(new)[:10]),
        )
        await self.client.on_replicas_become_offline(
            [PartitionReplica(t, p, broker_id) for t, p in new]
        )

    def on_brokers_restarted(self, broker_ids: Iterable[int]) -> None:
        """A broker that started or died no longer has the offline replicas it had."""
        for broker_id in broker_ids:
            self.context.replicas_on_offline_dirs.pop(broker_id, None)
