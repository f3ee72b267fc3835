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

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.metadata_manager import AppendResult, GroupMetadataManager
from odradek.coordinator.group.placement import OFFSETS_TOPIC
from odradek.errors import KafkaError, NotLeaderOrFollowerError, TopicAlreadyExistsError
from odradek.log.producer_state import AppendOrigin
from odradek.zk.errors import ZkError

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ProduceResult, ReplicaManager
    from odradek.server.admin.manager import AdminManager
    from odradek.server.config import KafkaConfig

log = logging.getLogger(__name__)

WARN_INTERVAL_S = 30.0


def _append_result(result: ProduceResult) -> AppendResult:
    if result.error is not None:
        return AppendResult(ErrorCode(result.error.code))
    return AppendResult(ErrorCode.none, result.base_offset)


class ReplicaManagerOffsetsLog:
    """`metadata_manager.OffsetsLog` over the replica manager's `__consumer_offsets` partitions."""

    def __init__(self, replica_manager: Callable[[], ReplicaManager]) -> None:
        self._replica_manager = replica_manager

    @property
    def replica_manager(self) -> ReplicaManager:
        return self._replica_manager()

    def append(
        self, partition: int, records: bytes, required_acks: int, timeout_ms: int
    ) -> AppendResult | Awaitable[AppendResult]:
        key = (OFFSETS_TOPIC, partition)
        # The coordinator's own writes (Kafka's AppendOrigin.COORDINATOR): transactional offset
        # commits carry a producer id whose sequences the coordinator does not number.
        results = self.replica_manager.append_records(
            {key: records}, required_acks, timeout_ms, origin=AppendOrigin.COORDINATOR
        )
        if isinstance(results, dict):
            return _append_result(results[key])

        async def wait() -> AppendResult:
            return _append_result((await results)[key])

        return wait()

    def _log(self, partition: int) -> Any:
        hosted = self.replica_manager.get_partition(OFFSETS_TOPIC, partition)
        if hosted is None or hosted.log is None or not hosted.is_leader:
            raise NotLeaderOrFollowerError(f"{OFFSETS_TOPIC}-{partition} is not led here")
        return hosted.log

    def read(self, partition: int, offset: int, max_bytes: int) -> bytes:
        return bytes(self._log(partition).read(offset, max_bytes, None, True))

    def log_start_offset(self, partition: int) -> int:
        return int(self._log(partition).log_start_offset)

    def log_end_offset(self, partition: int) -> int:
        return int(self._log(partition).log_end_offset)


class OffsetsTopicCreator:
    """Creates `__consumer_offsets` on first use (module docstring); one attempt at a time."""

    def __init__(self, config: KafkaConfig, admin: AdminManager, alive_brokers: Any) -> None:
        self.config = config
        self.admin = admin
        self._alive_brokers = alive_brokers
        self._creating: asyncio.Task[None] | None = None
        self._warned_at = -WARN_INTERVAL_S

    def ensure(self) -> None:
        if self._creating is not None and not self._creating.done():
            return
        replication = self.config["offsets.topic.replication.factor"]
        alive = len(list(self._alive_brokers()))
        if alive < replication:
            now = time.monotonic()
            if now - self._warned_at < WARN_INTERVAL_S:
                return  # every FindCoordinator asks: say it once in a while, not each time
            self._warned_at = now
            log.error(
                "not creating %s: %d brokers are alive, offsets.topic.replication.factor is %d "
                "(set it to the number of brokers on a smaller cluster)",
                OFFSETS_TOPIC,
                alive,
                replication,
            )
            return
        self._creating = asyncio.get_running_loop().create_task(self._create(replication))

    async def _create(self, replication: int) -> None:
        configs = {
            "cleanup.policy": "compact",
            "segment.bytes": str(self.config["offsets.topic.segment.bytes"]),
        }
        try:
            creation = await self.admin.prepare_topic(
                OFFSETS_TOPIC,
                self.config["offsets.topic.num.partitions"],
                replication,
                None,
                configs,
            )
            await self.admin.create_topic(creation)
            log.info("created %s", OFFSETS_TOPIC)
        except TopicAlreadyExistsError:
            pass
        except (KafkaError, ZkError) as e:
            log.warning(
                "creating %s failed (%s); the next FindCoordinator retries", OFFSETS_TOPIC, e
            )


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
