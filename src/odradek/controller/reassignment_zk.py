"""The ZooKeeper reads and fenced writes of partition reassignment.

Two znodes:

* `/admin/reassign_partitions` (`ReassignPartitionsZNode`): the legacy trigger, written by tools
  (kafka-reassign-partitions.sh --zookeeper, or any client of ZooKeeper). The controller watches it
  with `exists` (which fires on creation, change and deletion alike), removes each partition from it
  when that partition's move completes or is refused, and deletes it when it is empty.
* `/brokers/topics/<topic>` (`TopicZNode`): RS, adding and removing replicas of each partition.
  The controller rewrites one partition's entry at a time, read-modify-write conditional on the znode
  version, so that a concurrent CreatePartitions (which writes the same znode, conditionally too) is
  never overwritten with the controller's older copy.

Every write is a transaction that first checks `/controller_epoch` (`ZkClient.checked_multi`): a
deposed controller's write fails with ControllerMovedError and changes nothing.

Concurrency: the controller's event task only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from odradek.controller.context import TopicPartition
from odradek.zk.client import WatchCallback, ZkClient
from odradek.zk.errors import BadVersionError, InvalidZNodeDataError, NoNodeError
from odradek.zk.ops import DeleteOp, SetDataOp
from odradek.zk.znodes import (
    ReassignPartitionsZNode,
    ReplicaAssignment,
    TopicZNode,
)
from odradek.zk.znodes import TopicPartition as ZkTopicPartition

log = logging.getLogger(__name__)

MAX_WRITE_ATTEMPTS = 10


class ReassignmentZk:
    """Controller event task only."""

    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk

    async def read_reassign_partitions(
        self, watch: WatchCallback | None = None
    ) -> dict[TopicPartition, tuple[int, ...]] | None:
        """The requested target replicas, or None if the znode does not exist. The watch (set with
        `exists`, so it is armed even while the znode is absent) fires on any change to it.

        A payload that is not Kafka's JSON is logged and read as empty, as Kafka does: the znode
        stays until an operator removes it.
        """
        path = ReassignPartitionsZNode.path()
        if await self.zk.exists(path, watch) is None:
            return None
        try:
            data, stat = await self.zk.get(path)
        except NoNodeError:
            return None
        try:
            decoded = ReassignPartitionsZNode.decode(data, stat.version)
        except InvalidZNodeDataError as e:
            log.warning("ignoring %s: %s", path, e)
            return {}
        return {(tp.topic, tp.partition): tuple(r) for tp, r in decoded.replicas.items()}

    async def remove_from_reassign_partitions(
        self,
        epoch_zk_version: int,
        should_remove: Callable[[TopicPartition, tuple[int, ...]], bool],
    ) -> None:
        """Drop the entries `should_remove` selects from `/admin/reassign_partitions`, deleting the
        znode when none are left. Conditional on the version read; retried when a tool wrote in
        between."""
        path = ReassignPartitionsZNode.path()
        for _attempt in range(MAX_WRITE_ATTEMPTS):
            try:
                data, stat = await self.zk.get(path)
            except NoNodeError:
                return
            try:
                current = ReassignPartitionsZNode.decode(data, stat.version).replicas
            except InvalidZNodeDataError:
                return
            remaining = {
                tp: replicas
                for tp, replicas in current.items()
                if not should_remove((tp.topic, tp.partition), tuple(replicas))
            }
            if len(remaining) == len(current):
                return
            op: DeleteOp | SetDataOp
            if remaining:
                op = SetDataOp(path, ReassignPartitionsZNode.encode(remaining), stat.version)
            else:
                op = DeleteOp(path, stat.version)
            try:
                await self.zk.checked_multi(epoch_zk_version, [op])
            except (BadVersionError, NoNodeError):
                continue
            log.info(
                "%s: %d partitions left",
                path if remaining else f"deleted {path}",
                len(remaining),
            )
            return
        log.warning("%s kept changing; gave up removing completed partitions", path)

    async def update_partition_assignments(
        self,
        epoch_zk_version: int,
        topic: str,
        partitions: Mapping[int, ReplicaAssignment],
    ) -> None:
        """Set the given partitions' entries of `/brokers/topics/<topic>` (RS, adding, removing),
        leaving every other partition as ZooKeeper holds it. NoNodeError if the topic is gone."""
        path = TopicZNode.path(topic)
        for _attempt in range(MAX_WRITE_ATTEMPTS):
            data, stat = await self.zk.get(path)
            current = TopicZNode.decode(topic, data, stat.version)
            updated: dict[int, ReplicaAssignment] = dict(current.partitions)
            updated.update(partitions)
            encoded = TopicZNode.encode(updated, current.topic_id)
            try:
                await self.zk.checked_multi(
                    epoch_zk_version, [SetDataOp(path, encoded, stat.version)]
                )
            except BadVersionError:
                continue
            return
        raise BadVersionError(f"{path} kept changing; could not update its assignment", path=path)


def encode_reassignment(entries: Mapping[TopicPartition, Sequence[int]]) -> bytes:
    """The `/admin/reassign_partitions` payload for (topic, partition) -> target replicas."""
    return ReassignPartitionsZNode.encode(
        {ZkTopicPartition(t, p): list(r) for (t, p), r in entries.items()}
    )
