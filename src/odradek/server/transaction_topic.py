"""The broker's side of `__transaction_state`: the transaction coordinator's view of the replica
manager (`ReplicaManagerTransactionLog`), the topic's creation on first use, the leadership
changes that load or unload its partitions, and the marker sender's view of the metadata cache.

Creation (Kafka's createInternalTopic): the first FindCoordinator with key type TRANSACTION that
finds no such topic creates it with `transaction.state.log.num.partitions` (50) partitions of
`transaction.state.log.replication.factor` (3) replicas and the topic configs Kafka sets:
`cleanup.policy=compact`, `unclean.leader.election.enable=false` (Kafka also sets
`compression.type=uncompressed`, a topic config Odradek does not have: its records are never
compressed),
`min.insync.replicas=transaction.state.log.min.isr` (2) and
`segment.bytes=transaction.state.log.segment.bytes` (100 MiB). As for `__consumer_offsets`, it is
not created while fewer brokers are alive than the replication factor (`odradek cluster up` sets
the factor to the number of brokers, up to 3).

Leadership: after a LeaderAndIsr each `__transaction_state` partition this broker now leads is
loaded (`TransactionCoordinator.on_elected` with the leader epoch as coordinator epoch) and each it
now follows, or stopped (StopReplica), is unloaded.

Concurrency: event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from odradek.coordinator.transaction.coordinator import TransactionCoordinator
from odradek.coordinator.transaction.log_records import TRANSACTION_STATE_TOPIC
from odradek.coordinator.transaction.state_manager import AppendResult
from odradek.server.internal_topic import InternalTopicCreator, ReplicaManagerInternalLog

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ReplicaManager
    from odradek.server.config import KafkaConfig
    from odradek.server.metadata_cache import MetadataCache


class ReplicaManagerTransactionLog(ReplicaManagerInternalLog[AppendResult]):
    """`state_manager.TransactionLog` over the replica manager's `__transaction_state`."""

    def __init__(self, replica_manager: Callable[[], ReplicaManager]) -> None:
        super().__init__(TRANSACTION_STATE_TOPIC, replica_manager, AppendResult)


class CacheMarkerMetadata:
    """`marker_channel.MarkerMetadata` over the broker's metadata cache (inter-broker listener)."""

    def __init__(self, cache: MetadataCache) -> None:
        self.cache = cache

    def leader_of(self, topic: str, partition: int) -> tuple[int, str, int] | None:
        state = self.cache.get_partition(topic, partition)
        if state is None or state.leader < 0:
            return None
        endpoint = self.cache.get_broker(state.leader)
        if endpoint is None:
            return None
        return endpoint.id, endpoint.host, endpoint.port

    def topic_exists(self, topic: str) -> bool:
        return bool(self.cache.contains_topic(topic))


class TransactionTopicCreator(InternalTopicCreator):
    """Creates `__transaction_state` on first use (module docstring); one attempt at a time."""

    topic = TRANSACTION_STATE_TOPIC
    partitions_setting = "transaction.state.log.num.partitions"
    replication_setting = "transaction.state.log.replication.factor"

    def topic_configs(self, replication: int) -> dict[str, str]:
        return {
            "cleanup.policy": "compact",
            "unclean.leader.election.enable": "false",
            "min.insync.replicas": str(
                min(self.config["transaction.state.log.min.isr"], replication)
            ),
            "segment.bytes": str(self.config["transaction.state.log.segment.bytes"]),
        }


def on_leadership_change(
    coordinator: TransactionCoordinator | None,
    led: Iterable[tuple[str, int, int]],
    followed: Iterable[tuple[str, int]],
) -> None:
    """Load the `__transaction_state` partitions we now lead, unload those we do not."""
    if coordinator is None:
        return
    for topic, partition, epoch in led:
        if topic == TRANSACTION_STATE_TOPIC:
            coordinator.on_elected(partition, epoch)
    for topic, partition in followed:
        if topic == TRANSACTION_STATE_TOPIC:
            coordinator.on_resigned(partition)


def build_transaction_coordinator(
    broker_id: int,
    config: KafkaConfig,
    replica_manager: Callable[[], ReplicaManager],
    cache: MetadataCache,
    producer_ids: Any,
    security: Any,
) -> TransactionCoordinator:
    """The transaction coordinator with its store on `__transaction_state` and its marker
    sender (which reaches partition leaders on the inter-broker listener)."""
    from odradek.coordinator.transaction.marker_channel import TransactionMarkerChannelManager
    from odradek.coordinator.transaction.state_manager import (
        TransactionConfig,
        TransactionStateManager,
    )

    manager = TransactionStateManager(
        TransactionConfig.from_broker_config(config),
        ReplicaManagerTransactionLog(replica_manager),
        partition_count=lambda: cache.partition_count(TRANSACTION_STATE_TOPIC),
    )
    markers = TransactionMarkerChannelManager(CacheMarkerMetadata(cache), security)
    return TransactionCoordinator(broker_id, manager, markers, producer_ids)
