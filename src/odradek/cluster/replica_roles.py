"""The controller's role changes applied to this broker's replicas: LeaderAndIsr (who leads, who
follows) and StopReplica (stop fetching and serving, delete the log when asked).

`ReplicaRoleChanges` is a base of `ReplicaManager` (replica_manager.py, Kafka's
`becomeLeaderOrFollower` / `stopReplicas`); it works on the fields `ReplicaManager.__init__` sets,
declared below.

Concurrency: the broker's event loop thread only, like `ReplicaManager`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from odradek.cluster.partition import Partition, PartitionStateInfo
from odradek.errors import (
    KafkaError,
    KafkaStorageError,
    StaleControllerEpochError,
    UnknownTopicOrPartitionError,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class LeaderAndIsrPartition:
    topic: str
    partition: int
    state: PartitionStateInfo
    topic_id: str | None = None


class ReplicaRoleChanges:
    """LeaderAndIsr and StopReplica for `ReplicaManager` (see the module docstring)."""

    # set by ReplicaManager.__init__
    broker_id: int
    log_manager: Any
    fetcher_manager: Any
    partitions: dict[TopicPartition, Partition]
    offline_partitions: set[TopicPartition]
    topic_ids: dict[str, str]
    controller_epoch: int
    _high_watermarks: dict[TopicPartition, int]

    if TYPE_CHECKING:  # defined by ReplicaManager

        def _get_or_create_partition(
            self, topic: str, partition: int, is_new: bool
        ) -> Partition: ...

    # LeaderAndIsr

    def become_leader_or_follower(
        self,
        controller_id: int,
        controller_epoch: int,
        partition_states: list[LeaderAndIsrPartition],
        live_leaders: dict[int, tuple[str, int]],
    ) -> dict[TopicPartition, KafkaError | None]:
        """Apply a LeaderAndIsr request; returns an error (or None) per partition.

        1. Refuse the whole request if it comes from an older controller (STALE_CONTROLLER_EPOCH).
        2. Per partition: ignore a state whose leader epoch is older than ours, or equal with no newer
           znode version (STALE_CONTROLLER_EPOCH for that partition, as Kafka answers); refuse one
           that does not list this broker as a replica (UNKNOWN_TOPIC_OR_PARTITION).
        3. Make leaders first (they stop fetching and start serving), then followers (they stop
           serving, and their fetchers truncate by leader epoch and fetch from the new leader).
        """
        if controller_epoch < self.controller_epoch:
            raise StaleControllerEpochError(
                f"LeaderAndIsr from controller {controller_id} with epoch {controller_epoch} is older"
                f" than the latest epoch {self.controller_epoch}"
            )
        self.controller_epoch = controller_epoch
        results: dict[TopicPartition, KafkaError | None] = {}
        to_lead: list[tuple[Partition, PartitionStateInfo]] = []
        to_follow: list[tuple[Partition, PartitionStateInfo]] = []
        for item in partition_states:
            key = (item.topic, item.partition)
            state = item.state
            if self.broker_id not in state.replicas:
                results[key] = UnknownTopicOrPartitionError(
                    f"broker {self.broker_id} is not a replica"
                )
                continue
            existing = self.partitions.get(key)
            if existing is not None and (
                state.leader_epoch < existing.leader_epoch
                or (
                    state.leader_epoch == existing.leader_epoch
                    and state.zk_version <= existing.partition_epoch
                    # A fenced leader waits for exactly this: the controller restating its role.
                    and not (existing.fenced and state.zk_version == existing.partition_epoch)
                )
            ):
                results[key] = StaleControllerEpochError(
                    f"{item.topic}-{item.partition}: leader epoch {state.leader_epoch} is not newer"
                    f" than {existing.leader_epoch}"
                )
                continue
            try:
                partition = self._get_or_create_partition(item.topic, item.partition, state.is_new)
                if item.topic_id and existing is None:
                    partition.log.record_topic_id(item.topic_id)
            except KafkaError as e:
                results[key] = e
                continue
            if item.topic_id:
                self.topic_ids[item.topic] = item.topic_id
            (to_lead if state.leader == self.broker_id else to_follow).append((partition, state))
            results[key] = None
        self.log_manager.sync_created_logs()
        if to_lead:
            if self.fetcher_manager is not None:
                self.fetcher_manager.remove_partitions([(p.topic, p.partition) for p, _ in to_lead])
            for partition, state in list(to_lead):
                try:
                    partition.make_leader(state)
                except KafkaStorageError as e:
                    results[(partition.topic, partition.partition)] = e
                    to_lead.remove((partition, state))
                    continue
                log.debug(
                    "%s: leader at epoch %d, ISR %s, LEO %d, HW %d",
                    partition,
                    state.leader_epoch,
                    list(state.isr),
                    partition.log_end_offset,
                    partition.high_watermark,
                )
        if to_follow:
            changed = []
            for partition, state in to_follow:
                partition.make_follower(state)
                changed.append(partition)
                # DEBUG, as the leaders' line: at INFO, a failover's thousands of these lines took
                # 15-30% of the request's time (py-spy); the summary below says how many.
                log.debug(
                    "%s: follower of %d at epoch %d", partition, state.leader, state.leader_epoch
                )
            if self.fetcher_manager is not None:
                self.fetcher_manager.remove_partitions([(p.topic, p.partition) for p in changed])
                self.fetcher_manager.add_partitions(
                    [p for p in changed if p.leader_id >= 0], live_leaders
                )
        if to_lead or to_follow:
            log.info(
                "LeaderAndIsr from controller %d (epoch %d): leading %d, following %d partitions",
                controller_id,
                controller_epoch,
                len(to_lead),
                len(to_follow),
            )
        return results

    def stop_replicas(
        self, controller_epoch: int, partitions: list[tuple[str, int, bool]]
    ) -> dict[TopicPartition, KafkaError | None]:
        """Apply StopReplica: stop fetching/serving, and delete the log when asked."""
        if controller_epoch < self.controller_epoch:
            raise StaleControllerEpochError(
                f"StopReplica with controller epoch {controller_epoch} is older than {self.controller_epoch}"
            )
        self.controller_epoch = controller_epoch
        if self.fetcher_manager is not None:
            self.fetcher_manager.remove_partitions([(t, p) for t, p, _ in partitions])
        results: dict[TopicPartition, KafkaError | None] = {}
        for topic, partition_id, delete in partitions:
            key = (topic, partition_id)
            if key in self.offline_partitions:
                results[key] = KafkaStorageError(f"{topic}-{partition_id} is offline")
                continue
            hosted = self.partitions.get(key)
            if hosted is not None:
                hosted.make_offline()
            results[key] = None
            if delete:
                self.partitions.pop(key, None)
                self._high_watermarks.pop(key, None)
                try:
                    self.log_manager.delete_log(topic, partition_id)
                except KafkaStorageError as e:
                    results[key] = e
        return results
