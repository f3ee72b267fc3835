"""The controller's ZooKeeper facade: the reads and fenced writes the controller makes, batched.

Reads of many znodes (every broker registration, topic assignment and partition state at failover) are
issued all at once and awaited together — ZooKeeper answers a session's requests in order, so 100,000
reads cost one round trip plus the server's work rather than 100,000 round trips. Writes of partition
state go through `ZkClient.chunked_multi`: transactions under ZooKeeper's 1 MB request limit, each
first checking the `/controller_epoch` znode version this controller was elected with, all in flight at
once, with a result (or an error) per partition. A failed epoch check raises `ControllerMovedError`:
this controller has been deposed and must resign.

Concurrency: used by the controller's event task only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from odradek.controller.context import LeaderAndIsr, TopicPartition
from odradek.zk.client import WatchCallback, ZkClient
from odradek.zk.errors import (
    BadVersionError,
    InvalidZNodeDataError,
    NodeExistsError,
    NoNodeError,
    ZkError,
)
from odradek.zk.ops import CreateOp, DeleteOp, SetDataOp
from odradek.zk.znodes import (
    BrokerIdsZNode,
    BrokerIdZNode,
    BrokerInfo,
    ControllerEpochZNode,
    ControllerZNode,
    IsrChangeNotificationSequenceZNode,
    IsrChangeNotificationZNode,
    LogDirEventNotificationSequenceZNode,
    LogDirEventNotificationZNode,
    ReplicaAssignment,
    TopicAssignment,
    TopicConfigZNode,
    TopicPartitionStateZNode,
    TopicPartitionsZNode,
    TopicPartitionZNode,
    TopicsZNode,
    TopicZNode,
)

log = logging.getLogger(__name__)

READ_BATCH = 5000  # reads in flight at once (bounded to keep memory and kazoo's queue in check)


async def _gather_bounded(coroutines: Sequence[Any]) -> list[Any]:
    results: list[Any] = []
    for start in range(0, len(coroutines), READ_BATCH):
        results.extend(
            await asyncio.gather(*coroutines[start : start + READ_BATCH], return_exceptions=True)
        )
    return results


def _existing(keys: Sequence[Any], results: Sequence[Any]) -> Iterator[tuple[Any, bytes, Any]]:
    """(key, data, stat) for each read of a batch (`results`, in the order of `keys`) that found
    its znode. A znode deleted since it was listed is left out; any other error is raised."""
    for key, result in zip(keys, results, strict=True):
        if isinstance(result, NoNodeError):
            continue
        if isinstance(result, BaseException):
            raise result
        data, stat = result
        yield key, data, stat


class ControllerZk:
    """Reads and fenced writes of the controller. Controller event task only."""

    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk

    # election

    async def read_controller_id(self, watch: WatchCallback | None = None) -> int:
        """The active controller's broker id, or -1; watches `/controller` for creation/deletion."""
        stat = await self.zk.exists(ControllerZNode.path(), watch)
        if stat is None:
            return -1
        try:
            data, znode = await self.zk.get(ControllerZNode.path())
        except NoNodeError:
            return -1
        return ControllerZNode.decode(data, znode.version).broker_id

    async def own_controller_registration(self, broker_id: int) -> tuple[int, int] | None:
        """(epoch, epoch znode version) if `/controller` names `broker_id` and is an ephemeral of
        this client's current session -- our own registration, created by a request whose
        answer was lost (the client resent it and met NodeExists, or gave up with a lost
        connection) -- else None. Kafka's `checkControllerAndEpoch` accepts it the same way:
        while that znode lives no other broker can have bumped the epoch since."""
        try:
            data, stat = await self.zk.get(ControllerZNode.path())
        except NoNodeError:
            return None
        session = getattr(self.zk, "session_id", None)
        if (
            ControllerZNode.decode(data, stat.version).broker_id != broker_id
            or session is None
            or stat.ephemeralOwner != session
        ):
            return None
        data, stat = await self.zk.get(ControllerEpochZNode.path())
        epoch = ControllerEpochZNode.decode(data, stat.version)
        return epoch.epoch, epoch.zk_version

    async def register_controller_and_increment_epoch(self, broker_id: int) -> tuple[int, int]:
        """Try to become controller: create ephemeral `/controller` and bump `/controller_epoch` in
        one transaction conditional on the epoch's znode version. Returns (epoch, epoch znode
        version); raises NodeExistsError or BadVersionError when another broker won. A resent
        transaction that meets its own first attempt (answer lost) is our win, not a loss."""
        path = ControllerEpochZNode.path()
        try:
            data, stat = await self.zk.get(path)
            current = ControllerEpochZNode.decode(data, stat.version)
        except NoNodeError:
            try:
                await self.zk.create(path, ControllerEpochZNode.encode(0))
            except NodeExistsError:
                pass
            data, stat = await self.zk.get(path)
            current = ControllerEpochZNode.decode(data, stat.version)
        new_epoch = current.epoch + 1
        try:
            results = await self.zk.multi(
                [
                    CreateOp(
                        ControllerZNode.path(), ControllerZNode.encode(broker_id), ephemeral=True
                    ),
                    SetDataOp(path, ControllerEpochZNode.encode(new_epoch), current.zk_version),
                ]
            )
        except (NodeExistsError, BadVersionError):
            ours = await self.own_controller_registration(broker_id)
            if ours is None or ours[0] != new_epoch:
                raise
            return ours
        new_stat = results[1]
        return new_epoch, new_stat.version  # type: ignore[union-attr]

    # brokers

    async def get_all_brokers(self, watch: WatchCallback | None = None) -> dict[int, BrokerInfo]:
        children = await self.zk.get_children(BrokerIdsZNode.path(), watch)
        ids = sorted(int(c) for c in children if c.isdigit())
        results = await _gather_bounded([self.zk.get(BrokerIdZNode.path(i)) for i in ids])
        return {
            broker_id: BrokerIdZNode.decode(broker_id, data, stat.czxid)
            for broker_id, data, stat in _existing(ids, results)
        }

    # topics

    async def get_all_topics(self, watch: WatchCallback | None = None) -> set[str]:
        return set(await self.zk.get_children(TopicsZNode.path(), watch))

    async def get_topic_assignments(
        self, topics: Iterable[str], watch_factory: Any = None
    ) -> dict[str, TopicAssignment]:
        names = sorted(topics)
        results = await _gather_bounded(
            [
                self.zk.get(TopicZNode.path(t), watch_factory(t) if watch_factory else None)
                for t in names
            ]
        )
        return {
            topic: TopicZNode.decode(topic, data, stat.version)
            for topic, data, stat in _existing(names, results)
        }

    async def set_topic_assignment(
        self,
        epoch_zk_version: int,
        topic: str,
        partitions: dict[int, ReplicaAssignment],
        topic_id: str | None,
        expected_version: int,
    ) -> None:
        await self.zk.checked_multi(
            epoch_zk_version,
            [
                SetDataOp(
                    TopicZNode.path(topic),
                    TopicZNode.encode(partitions, topic_id),
                    expected_version,
                )
            ],
        )

    async def get_topic_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str]]:
        names = sorted(topics)
        results = await _gather_bounded([self.zk.get(TopicConfigZNode.path(t)) for t in names])
        configs: dict[str, dict[str, str]] = {}
        for topic, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, NoNodeError):
                    log.warning("cannot read the config of topic %s: %s", topic, result)
                configs[topic] = {}
                continue
            data, stat = result
            configs[topic] = dict(TopicConfigZNode.decode(data, stat.version, topic).config)
        return configs

    # partition states

    async def get_partition_states(
        self,
        partitions: Sequence[TopicPartition],
        modified_zxids: dict[TopicPartition, int] | None = None,
    ) -> dict[TopicPartition, LeaderAndIsr]:
        """The partitions' state znodes (absent ones left out). With `modified_zxids`, also the
        zxid of each znode's last write (its mzxid), put there."""
        results = await self.zk.get_many(
            [TopicPartitionStateZNode.path(t, p) for t, p in partitions]
        )
        states = {}
        for tp, data, stat in _existing(partitions, results):
            states[tp] = TopicPartitionStateZNode.decode(
                data, stat.version, TopicPartitionStateZNode.path(*tp)
            )
            if modified_zxids is not None:
                modified_zxids[tp] = int(stat.mzxid)
        return states

    async def create_partition_states(
        self, epoch_zk_version: int, states: dict[TopicPartition, LeaderAndIsr]
    ) -> dict[TopicPartition, LeaderAndIsr | ZkError]:
        """Create the state znodes of new partitions (their parents first, without fencing: empty
        parents are harmless). Returns the written state with its version (0), or the error."""
        topics = {tp[0] for tp in states}
        parents = [TopicPartitionsZNode.path(t) for t in topics]
        parents += [TopicPartitionZNode.path(*tp) for tp in states]
        await self._create_if_missing(parents)
        return await self._write_states(epoch_zk_version, states, create=True)

    async def _create_if_missing(self, paths: list[str]) -> None:
        ops = [CreateOp(p) for p in paths]
        results = await self.zk.chunked_multi(None, ops)
        for path, result in zip(paths, results, strict=True):
            if isinstance(result, ZkError) and not isinstance(result, NodeExistsError):
                raise result
            del path

    async def update_leader_and_isr(
        self, epoch_zk_version: int, states: dict[TopicPartition, LeaderAndIsr]
    ) -> dict[TopicPartition, LeaderAndIsr | ZkError]:
        """Write new leader/ISR states conditionally on the znode version each carries (the version
        they were read at). Returns each written state with its new version, or the error
        (BadVersionError: someone — the leader, shrinking the ISR — wrote in between)."""
        return await self._write_states(epoch_zk_version, states, create=False)

    async def _write_states(
        self, epoch_zk_version: int, states: dict[TopicPartition, LeaderAndIsr], create: bool
    ) -> dict[TopicPartition, LeaderAndIsr | ZkError]:
        """One fenced, batched write of partition state znodes: creates (new znodes, version 0)
        or conditional sets (on each state's `zk_version`). A result or an error per partition."""
        order = list(states)
        ops: list[CreateOp | SetDataOp] = []
        for tp in order:
            state = states[tp]
            path = TopicPartitionStateZNode.path(*tp)
            data = TopicPartitionStateZNode.encode(
                leader=state.leader,
                leader_epoch=state.leader_epoch,
                isr=state.isr,
                controller_epoch=state.controller_epoch,
            )
            ops.append(CreateOp(path, data) if create else SetDataOp(path, data, state.zk_version))
        results = await self.zk.chunked_multi(epoch_zk_version, ops)
        written: dict[TopicPartition, LeaderAndIsr | ZkError] = {}
        for tp, result in zip(order, results, strict=True):
            if isinstance(result, ZkError):
                written[tp] = result
            else:
                state = states[tp]
                written[tp] = LeaderAndIsr(
                    leader=state.leader,
                    leader_epoch=state.leader_epoch,
                    isr=state.isr,
                    controller_epoch=state.controller_epoch,
                    zk_version=0 if create else result.version,  # type: ignore[union-attr]
                )
        return written

    # ISR change notifications

    async def get_isr_change_notifications(self, watch: WatchCallback | None = None) -> list[str]:
        return sorted(await self.zk.get_children(IsrChangeNotificationZNode.path(), watch))

    async def read_isr_change_notifications(self, children: Sequence[str]) -> set[TopicPartition]:
        paths = [f"{IsrChangeNotificationZNode.path()}/{c}" for c in children]
        results = await _gather_bounded([self.zk.get(p) for p in paths])
        partitions: set[TopicPartition] = set()
        for _path, data, stat in _existing(paths, results):
            notification = IsrChangeNotificationSequenceZNode.decode(data, stat.version)
            partitions.update((tp.topic, tp.partition) for tp in notification.partitions)
        return partitions

    async def delete_isr_change_notifications(
        self, children: Sequence[str], epoch_zk_version: int
    ) -> None:
        await self._delete_notifications(
            IsrChangeNotificationZNode.path(),
            children,
            epoch_zk_version,
            "an ISR change notification",
        )

    # log directory events (KIP-112)

    async def get_log_dir_event_notifications(
        self, watch: WatchCallback | None = None
    ) -> list[str]:
        return sorted(await self.zk.get_children(LogDirEventNotificationZNode.path(), watch))

    async def read_log_dir_event_notifications(self, children: Sequence[str]) -> set[int]:
        """The brokers that reported a failed log directory (undecodable entries are skipped)."""
        paths = [f"{LogDirEventNotificationZNode.path()}/{c}" for c in children]
        results = await _gather_bounded([self.zk.get(p) for p in paths])
        brokers: set[int] = set()
        for path, data, stat in _existing(paths, results):
            try:
                brokers.add(
                    LogDirEventNotificationSequenceZNode.decode(data, stat.version).broker_id
                )
            except InvalidZNodeDataError as e:
                log.warning("ignoring log directory event %s: %s", path, e)
        return brokers

    async def delete_log_dir_event_notifications(
        self, children: Sequence[str], epoch_zk_version: int
    ) -> None:
        await self._delete_notifications(
            LogDirEventNotificationZNode.path(), children, epoch_zk_version, "a log directory event"
        )

    # Sequential notifications (ISR changes, log directory events): a broker creates one as a
    # sequential child; the controller reads the children in order and deletes them once handled,
    # fenced by its epoch (a notification already gone is not an error).

    async def _delete_notifications(
        self, parent: str, children: Sequence[str], epoch_zk_version: int, what: str
    ) -> None:
        paths = [f"{parent}/{c}" for c in children]
        results = await self.zk.chunked_multi(epoch_zk_version, [DeleteOp(p) for p in paths])
        for result in results:
            if isinstance(result, ZkError) and not isinstance(result, NoNodeError):
                log.warning("could not delete %s: %s", what, result)


__all__ = ["BadVersionError", "ControllerZk"]
