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

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.coordinator.transaction.coordinator import TransactionCoordinator
from odradek.coordinator.transaction.log_records import TRANSACTION_STATE_TOPIC
from odradek.coordinator.transaction.state_manager import AppendResult
from odradek.errors import KafkaError, NotLeaderOrFollowerError, TopicAlreadyExistsError
from odradek.log.producer_state import AppendOrigin
from odradek.zk.errors import ZkError

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ProduceResult, ReplicaManager
    from odradek.server.admin.manager import AdminManager
    from odradek.server.config import KafkaConfig
    from odradek.server.metadata_cache import MetadataCache

log = logging.getLogger(__name__)

WARN_INTERVAL_S = 30.0


def _append_result(result: ProduceResult) -> AppendResult:
    if result.error is not None:
        return AppendResult(ErrorCode(result.error.code))
    return AppendResult(ErrorCode.none, result.base_offset)


class ReplicaManagerTransactionLog:
    """`state_manager.TransactionLog` over the replica manager's `__transaction_state`."""

    def __init__(self, replica_manager: Callable[[], ReplicaManager]) -> None:
        self._replica_manager = replica_manager

    def append(
        self, partition: int, records: bytes, required_acks: int, timeout_ms: int
    ) -> AppendResult | Awaitable[AppendResult]:
        key = (TRANSACTION_STATE_TOPIC, partition)
        results = self._replica_manager().append_records(
            {key: records}, required_acks, timeout_ms, origin=AppendOrigin.COORDINATOR
        )
        if isinstance(results, dict):
            return _append_result(results[key])

        async def wait() -> AppendResult:
            return _append_result((await results)[key])

        return wait()

    def _log(self, partition: int) -> Any:
        hosted = self._replica_manager().get_partition(TRANSACTION_STATE_TOPIC, partition)
        if hosted is None or hosted.log is None or not hosted.is_leader:
            raise NotLeaderOrFollowerError(f"{TRANSACTION_STATE_TOPIC}-{partition} is not led here")
        return hosted.log

    def read(self, partition: int, offset: int, max_bytes: int) -> bytes:
        return bytes(self._log(partition).read(offset, max_bytes, None, True))

    def log_start_offset(self, partition: int) -> int:
        return int(self._log(partition).log_start_offset)

    def log_end_offset(self, partition: int) -> int:
        return int(self._log(partition).log_end_offset)


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


class TransactionTopicCreator:
    """Creates `__transaction_state` on first use (module docstring); one attempt at a time."""

    def __init__(self, config: KafkaConfig, admin: AdminManager, alive_brokers: Any) -> None:
        self.config = config
        self.admin = admin
        self._alive_brokers = alive_brokers
        self._creating: asyncio.Task[None] | None = None
        self._warned_at = -WARN_INTERVAL_S

    def ensure(self) -> None:
        if self._creating is not None and not self._creating.done():
            return
        replication = self.config["transaction.state.log.replication.factor"]
        alive = len(list(self._alive_brokers()))
        if alive < replication:
            now = time.monotonic()
            if now - self._warned_at >= WARN_INTERVAL_S:
                self._warned_at = now
                log.error(
                    "not creating %s: %d brokers are alive, "
                    "transaction.state.log.replication.factor is %d",
                    TRANSACTION_STATE_TOPIC,
                    alive,
                    replication,
                )
            return
        self._creating = asyncio.get_running_loop().create_task(self._create(replication))

    async def _create(self, replication: int) -> None:
        configs = {
            "cleanup.policy": "compact",
            "unclean.leader.election.enable": "false",
            "min.insync.replicas": str(
                min(self.config["transaction.state.log.min.isr"], replication)
            ),
            "segment.bytes": str(self.config["transaction.state.log.segment.bytes"]),
        }
        try:
            creation = await self.admin.prepare_topic(
                TRANSACTION_STATE_TOPIC,
                self.config["transaction.state.log.num.partitions"],
                replication,
                None,
                configs,
            )
            await self.admin.create_topic(creation)
            log.info("created %s", TRANSACTION_STATE_TOPIC)
        except TopicAlreadyExistsError:
            pass
        except (KafkaError, ZkError) as e:
            log.warning(
                "creating %s failed (%s); the next FindCoordinator retries",
                TRANSACTION_STATE_TOPIC,
                e,
            )


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
