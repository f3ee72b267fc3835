"""What `__consumer_offsets` and `__transaction_state` share on the broker's side: a
coordinator's view of its internal topic's partitions on the replica manager
(`ReplicaManagerInternalLog`), and the topic's creation on first use (`InternalTopicCreator`,
Kafka's createInternalTopic in ZooKeeper mode).

Creation: the first FindCoordinator that finds no such topic starts creating it with the
partition count and replication factor of the topic's broker settings, and is answered
COORDINATOR_NOT_AVAILABLE; clients retry. As in Kafka since 0.11, the topic is not created while
fewer brokers are alive than its replication factor (it would otherwise be under-replicated for
good); that is logged at most once every 30 s, since every FindCoordinator asks. One attempt runs
at a time.

Concurrency: event-loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from kio.schema.errors import ErrorCode

from odradek.errors import KafkaError, NotLeaderOrFollowerError, TopicAlreadyExistsError
from odradek.log.producer_state import AppendOrigin
from odradek.zk.errors import ZkError

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ProduceResult, ReplicaManager
    from odradek.server.admin.manager import AdminManager
    from odradek.server.config import KafkaConfig

log = logging.getLogger(__name__)

WARN_INTERVAL_S = 30.0

R = TypeVar("R")


class ReplicaManagerInternalLog(Generic[R]):
    """One internal topic's partitions as this broker hosts them, for its coordinator: appends
    (the coordinator's own writes, Kafka's AppendOrigin.COORDINATOR: transactional offset
    commits carry a producer id whose sequences the coordinator does not number), and reads of
    the partitions it leads. `result` makes the coordinator's append result of an error code and
    a base offset."""

    def __init__(
        self,
        topic: str,
        replica_manager: Callable[[], ReplicaManager],
        result: Callable[[ErrorCode, int], R],
    ) -> None:
        self.topic = topic
        self._replica_manager = replica_manager
        self._result = result

    @property
    def replica_manager(self) -> ReplicaManager:
        return self._replica_manager()

    def _append_result(self, result: ProduceResult) -> R:
        if result.error is not None:
            return self._result(ErrorCode(result.error.code), -1)
        return self._result(ErrorCode.none, result.base_offset)

    def append(
        self, partition: int, records: bytes, required_acks: int, timeout_ms: int
    ) -> R | Awaitable[R]:
        key = (self.topic, partition)
        results = self.replica_manager.append_records(
            {key: records}, required_acks, timeout_ms, origin=AppendOrigin.COORDINATOR
        )
        if isinstance(results, dict):
            return self._append_result(results[key])

        async def wait() -> R:
            return self._append_result((await results)[key])

        return wait()

    def _log(self, partition: int) -> Any:
        hosted = self.replica_manager.get_partition(self.topic, partition)
        if hosted is None or hosted.log is None or not hosted.is_leader:
            raise NotLeaderOrFollowerError(f"{self.topic}-{partition} is not led here")
        return hosted.log

    def read(self, partition: int, offset: int, max_bytes: int) -> bytes:
        return bytes(self._log(partition).read(offset, max_bytes, None, True))

    def log_start_offset(self, partition: int) -> int:
        return int(self._log(partition).log_start_offset)

    def log_end_offset(self, partition: int) -> int:
        return int(self._log(partition).log_end_offset)


class InternalTopicCreator:
    """Creates an internal topic on first use (module docstring). Subclasses name the topic,
    its settings and its topic configs."""

    topic = ""
    partitions_setting = ""
    replication_setting = ""
    advice = ""
    """Appended to the log line when too few brokers are alive."""

    def __init__(self, config: KafkaConfig, admin: AdminManager, alive_brokers: Any) -> None:
        self.config = config
        self.admin = admin
        self._alive_brokers = alive_brokers
        self._creating: asyncio.Task[None] | None = None
        self._warned_at = -WARN_INTERVAL_S

    def topic_configs(self, replication: int) -> dict[str, str]:
        raise NotImplementedError

    def ensure(self) -> None:
        if self._creating is not None and not self._creating.done():
            return
        replication = self.config[self.replication_setting]
        alive = len(list(self._alive_brokers()))
        if alive < replication:
            now = time.monotonic()
            if now - self._warned_at >= WARN_INTERVAL_S:
                self._warned_at = now
                log.error(
                    "not creating %s: %d brokers are alive, %s is %d%s",
                    self.topic,
                    alive,
                    self.replication_setting,
                    replication,
                    self.advice,
                )
            return
        self._creating = asyncio.get_running_loop().create_task(self._create(replication))

    async def _create(self, replication: int) -> None:
        try:
            creation = await self.admin.prepare_topic(
                self.topic,
                self.config[self.partitions_setting],
                replication,
                None,
                self.topic_configs(replication),
            )
            await self.admin.create_topic(creation)
            log.info("created %s", self.topic)
        except TopicAlreadyExistsError:
            pass
        except (KafkaError, ZkError) as e:
            log.warning("creating %s failed (%s); the next FindCoordinator retries", self.topic, e)
