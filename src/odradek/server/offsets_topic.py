"""The broker's side of `__consumer_offsets`: the group coordinator's narrow view of the replica
manager (`ReplicaManagerOffsetsLog`), the topic's creation on first use, and the leadership
changes that make the coordinator load or unload a partition.

Creation (Kafka's createInternalTopic, ZooKeeper mode). The first FindCoordinator that finds no
offsets topic starts creating it, with `offsets.topic.num.partitions` partitions,
`offsets.topic.replication.factor` replicas each and the topic configs `cleanup.policy=compact`
and `segment.bytes=offsets.topic.segment.bytes`; the request is answered COORDINATOR_NOT_AVAILABLE,
and clients retry. As in Kafka since 0.11, the topic is not created while fewer brokers are alive
than the replication factor (a single broker therefore needs
`offsets.topic.replication.factor=1`; `odradek cluster up` sets it to the number of brokers, up to
3): it would otherwise be created under-replicated for good.

Leadership (Kafka's onLeadershipChange): after a LeaderAndIsr, each offsets partition this broker
now leads is loaded (`GroupMetadataManager.on_elected` with the leader epoch), each it now follows
is unloaded; a StopReplica unloads too.

Concurrency: event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from odradek.coordinator.group.metadata_manager import AppendResult, GroupMetadataManager
from odradek.coordinator.group.placement import OFFSETS_TOPIC
from odradek.server.internal_topic import InternalTopicCreator, ReplicaManagerInternalLog

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ReplicaManager


class ReplicaManagerOffsetsLog(ReplicaManagerInternalLog[AppendResult]):
    """`metadata_manager.OffsetsLog` over the replica manager's `__consumer_offsets` partitions."""

    def __init__(self, replica_manager: Callable[[], ReplicaManager]) -> None:
        super().__init__(OFFSETS_TOPIC, replica_manager, AppendResult)


class OffsetsTopicCreator(InternalTopicCreator):
    """Creates `__consumer_offsets` on first use (module docstring); one attempt at a time."""

    topic = OFFSETS_TOPIC
    partitions_setting = "offsets.topic.num.partitions"
    replication_setting = "offsets.topic.replication.factor"
    advice = " (set it to the number of brokers on a smaller cluster)"

    def topic_configs(self, replication: int) -> dict[str, str]:
        return {
            "cleanup.policy": "compact",
            "segment.bytes": str(self.config["offsets.topic.segment.bytes"]),
        }


def on_leadership_change(
    manager: GroupMetadataManager,
    led: Iterable[tuple[str, int, int]],
    followed: Iterable[tuple[str, int]],
) -> None:
    """Tell the coordinator's store which offsets partitions it now leads (topic, partition,
    leader epoch) and which it follows or stopped."""
    for topic, partition, epoch in led:
        if topic == OFFSETS_TOPIC:
            manager.on_elected(partition, epoch)
    for topic, partition in followed:
        if topic == OFFSETS_TOPIC:
            manager.on_resigned(partition)
