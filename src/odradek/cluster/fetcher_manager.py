"""The replica fetcher manager: one `ReplicaFetcher` per (leader broker, fetcher index), created as
leadership moves, resized with `num.replica.fetchers`, removed when idle (Kafka's
ReplicaFetcherManager / AbstractFetcherManager; the fetching itself is in `fetcher`).

Concurrency: broker event loop only.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from odradek.cluster.fetcher import (
    EARLIEST_TIMESTAMP,
    LIST_OFFSETS_VERSION,
    FetcherConfig,
    FetchState,
    LeaderAddress,
    ReplicaFetcher,
    TopicPartition,
    log,
)
from odradek.cluster.replication_quota import ReplicationQuotaManager
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class

if TYPE_CHECKING:
    from odradek.cluster.partition import Partition


class ReplicaFetcherManager:
    """Creates fetchers as leadership moves and removes idle ones. Broker event loop only."""

    def __init__(
        self,
        leader_address: LeaderAddress,
        config: FetcherConfig,
        *,
        security: ClientSecurity = PLAINTEXT_CLIENT,
        topic_id_for: Callable[[str], uuid.UUID | None] = lambda _topic: None,
        broker_epoch: Callable[[], int] = lambda: -1,
    ) -> None:
        self.leader_address = leader_address
        self.config = config
        self.security = security
        self.topic_id_for = topic_id_for
        self.broker_epoch = broker_epoch
        self.broker_id = config.broker_id
        self.fetchers: dict[tuple[int, int], ReplicaFetcher] = {}
        self.on_log_start_offset_moved: Callable[[], None] | None = None
        """Set by the replica manager: persists log start offsets (DeleteRecords)."""
        self.throttle: ReplicationQuotaManager | None = None
        """The follower replication throttle (KIP-73), set by the broker."""

    def _fetcher_index(self, key: TopicPartition) -> int:
        return hash(key) % self.config["num.replica.fetchers"]

    def add_partitions(
        self, partitions: list[Partition], live_leaders: dict[int, tuple[str, int]]
    ) -> None:
        for partition in partitions:
            leader = partition.leader_id
            address = live_leaders.get(leader)
            if address is None:
                address = self.leader_address(leader)
                if address is None:
                    log.warning(
                        "%s: leader %d has no known address; not fetching", partition, leader
                    )
                    continue
            key = (partition.topic, partition.partition)
            fetcher_key = (leader, self._fetcher_index(key))
            fetcher = self.fetchers.get(fetcher_key)
            if fetcher is not None and fetcher.address != tuple(address):
                self.fetchers.pop(fetcher_key)
                asyncio.get_running_loop().create_task(fetcher.close())
                fetcher = None
            if fetcher is None:
                fetcher = ReplicaFetcher(self, leader, tuple(address), fetcher_key[1])  # type: ignore[arg-type]
                self.fetchers[fetcher_key] = fetcher
            fetcher.add(partition)

    def remove_partitions(self, keys: list[TopicPartition]) -> None:
        for fetcher in self.fetchers.values():
            for key in keys:
                fetcher.remove(key)
        self._shutdown_idle()

    def resize(self) -> None:
        """`num.replica.fetchers` changed (a dynamic broker config; Kafka's
        resizeFetcherThreadPool): each partition moves to the fetcher its index names now,
        starting there with truncation as a newly added one does; emptied fetchers close."""
        moving: list[tuple[ReplicaFetcher, Partition]] = []
        for fetcher_key, fetcher in list(self.fetchers.items()):
            for key, state in list(fetcher.partitions.items()):
                if (fetcher.leader_id, self._fetcher_index(key)) != fetcher_key:
                    fetcher.remove(key)
                    moving.append((fetcher, state.partition))
        for old, partition in moving:
            fetcher_key = (
                old.leader_id,
                self._fetcher_index((partition.topic, partition.partition)),
            )
            target = self.fetchers.get(fetcher_key)
            if target is None:
                target = ReplicaFetcher(self, old.leader_id, old.address, fetcher_key[1])
                self.fetchers[fetcher_key] = target
            target.add(partition)
        self._shutdown_idle()
        log.info(
            "%d replica fetchers per leader now (%d partitions moved)",
            self.config["num.replica.fetchers"],
            len(moving),
        )

    def _shutdown_idle(self) -> None:
        for fetcher_key, fetcher in list(self.fetchers.items()):
            if not fetcher.partitions:
                del self.fetchers[fetcher_key]
                asyncio.get_running_loop().create_task(fetcher.close())

    def schedule_out_of_range(self, fetcher: ReplicaFetcher, state: FetchState) -> None:
        """Our fetch offset is outside the leader's log: truncate back to its range."""
        asyncio.get_running_loop().create_task(self._handle_out_of_range(fetcher, state))

    async def _handle_out_of_range(self, fetcher: ReplicaFetcher, state: FetchState) -> None:
        try:
            connection = await fetcher._connect()
            cls = request_class(ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION)
            request = build(
                cls,
                {
                    "replica_id": self.broker_id,
                    "isolation_level": 0,
                    "topics": [
                        {
                            "name": state.partition.topic,
                            "partitions": [
                                {
                                    "partition_index": state.partition.partition,
                                    "current_leader_epoch": state.leader_epoch,
                                    "timestamp": EARLIEST_TIMESTAMP,
                                }
                            ],
                        }
                    ],
                },
            )
            response = await connection.send(ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, request)
            item = response.topics[0].partitions[0]
            if item.error_code != ErrorCode.none or not fetcher._current(state):
                fetcher._delay(state)
                return
            leader_start = int(item.offset)
            partition = state.partition
            if partition.log_end_offset < leader_start:
                log.info(
                    "%s: our log ends before the leader's starts (%d); starting over",
                    partition,
                    leader_start,
                )
                partition.log.truncate_fully_and_start_at(leader_start)
                partition.high_watermark = leader_start
                state.truncating = False
        except Exception as e:
            log.info("%s: handling OFFSET_OUT_OF_RANGE failed: %s", state.partition, e)
            fetcher._delay(state)

    async def shutdown(self) -> None:
        fetchers = list(self.fetchers.values())
        self.fetchers.clear()
        for fetcher in fetchers:
            await fetcher.close()
