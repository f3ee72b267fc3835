"""Admin operations on ZooKeeper made by any broker for a client (Kafka's AdminZkClient/AdminManager).

Creating a topic writes its config (`/config/topics/<t>`) first and then its assignment
(`/brokers/topics/<t>`, with a new topic id): the controller watches `/brokers/topics` and does the
rest (partition state znodes, leaders, LeaderAndIsr). Writing the config first means no broker can
create the topic's logs before its config is there. Deleting a topic creates
`/admin/delete_topics/<t>`; the controller deletes it.

Replicas are placed over the brokers registered in ZooKeeper at that moment (with their racks), by
`odradek.controller.assignment`.

Concurrency: the broker's event loop.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from odradek.controller.assignment import (
    BrokerMetadata,
    assign_replicas_for_added_partitions,
    assign_replicas_to_brokers,
    validate_manual_assignment,
)
from odradek.errors import (
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    KafkaError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from odradek.protocol.topic_ids import uuid_to_topic_id
from odradek.server.admin.topics import collides, validate_topic_configs, validate_topic_name
from odradek.zk.client import ZkClient
from odradek.zk.errors import BadVersionError, NodeExistsError, NoNodeError
from odradek.zk.znodes import (
    BrokerIdsZNode,
    BrokerIdZNode,
    ConfigChangeNotificationSequenceZNode,
    DeleteTopicsTopicZNode,
    ReplicaAssignment,
    TopicAssignment,
    TopicConfigZNode,
    TopicsZNode,
    TopicZNode,
)

log = logging.getLogger(__name__)


MAX_ASSIGNED_REPLICAS = 150_000
"""Replicas per topic: about 900 KB of assignment JSON at 6 bytes a replica, under ZooKeeper's 1 MB."""


def _require_legal_name(name: str) -> None:
    """A name that breaks Kafka's topic name rules names no topic (and may not even make a valid
    znode path: ZooKeeper refuses "." or a NUL, and "/" would reach another znode)."""
    try:
        validate_topic_name(name)
    except InvalidTopicError:
        raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist") from None


class ConcurrentAssignmentChange(KafkaError):
    """The topic's assignment znode changed between our read and our conditional write."""


@dataclass(frozen=True, slots=True)
class TopicCreation:
    name: str
    assignment: dict[int, list[int]]
    configs: dict[str, str]
    topic_id: str


class AdminManager:
    def __init__(
        self, zk: ZkClient, default_partitions: int, default_replication_factor: int
    ) -> None:
        self.zk = zk
        self.default_partitions = default_partitions
        self.default_replication_factor = default_replication_factor

    async def registered_brokers(self) -> list[BrokerMetadata]:
        children = await self.zk.get_children(BrokerIdsZNode.path())
        brokers = []
        for child in sorted(children, key=lambda c: int(c) if c.isdigit() else -1):
            if not child.isdigit():
                continue
            try:
                data, stat = await self.zk.get(BrokerIdZNode.path(int(child)))
            except NoNodeError:
                continue
            info = BrokerIdZNode.decode(int(child), data, stat.czxid)
            brokers.append(BrokerMetadata(info.id, info.rack))
        return brokers

    async def prepare_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        manual_assignment: Mapping[int, list[int]] | None,
        configs: Mapping[str, str | None],
    ) -> TopicCreation:
        """Validate a creation and compute its assignment, without writing anything."""
        validate_topic_name(name)
        existing = set(await self.zk.get_children(TopicsZNode.path()))
        if name in existing:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        for other in existing:
            if collides(name, other):
                raise InvalidTopicError(
                    f"topic {name!r} collides with existing topic {other!r} ('.' and '_' are equivalent)"
                )
        if await self.zk.exists(DeleteTopicsTopicZNode.path(name)) is not None:
            raise TopicAlreadyExistsError(f"topic {name!r} is marked for deletion")
        normalised = validate_topic_configs(configs)
        brokers = await self.registered_brokers()
        if manual_assignment:
            assignment = {int(p): list(r) for p, r in manual_assignment.items()}
            validate_manual_assignment(assignment, [b.id for b in brokers])
        else:
            partitions = self.default_partitions if num_partitions == -1 else num_partitions
            factor = (
                self.default_replication_factor if replication_factor == -1 else replication_factor
            )
            if partitions <= 0:
                raise InvalidPartitionsError(
                    f"number of partitions must be at least 1, not {partitions}"
                )
            if factor <= 0:
                raise InvalidReplicationFactorError(
                    f"replication factor must be at least 1, not {factor}"
                )
            if partitions * factor > MAX_ASSIGNED_REPLICAS:
                # The assignment JSON must fit in one znode (ZooKeeper's 1 MB jute.maxbuffer); also,
                # computing millions of replicas would stall this broker's event loop.
                raise InvalidPartitionsError(
                    f"{partitions} partitions x {factor} replicas is more than the"
                    f" {MAX_ASSIGNED_REPLICAS} replicas one topic's assignment znode can hold"
                )
            if factor > len(brokers):
                raise InvalidReplicationFactorError(
                    f"replication factor {factor} is larger than the {len(brokers)} available brokers"
                )
            assignment = assign_replicas_to_brokers(partitions, factor, brokers)
        return TopicCreation(name, assignment, normalised, uuid_to_topic_id(uuid.uuid4()))

    async def create_topic(self, creation: TopicCreation) -> None:
        """Write config then assignment; TopicAlreadyExistsError if someone else was first."""
        config_path = TopicConfigZNode.path(creation.name)
        config_data = TopicConfigZNode.encode(creation.configs)
        try:
            await self.zk.create(config_path, config_data, makepath=True)
        except NodeExistsError:
            await self.zk.set(config_path, config_data)
        try:
            await self.zk.create(
                TopicZNode.path(creation.name),
                TopicZNode.encode(creation.assignment, creation.topic_id),
                makepath=True,
            )
        except NodeExistsError:
            raise TopicAlreadyExistsError(f"topic {creation.name!r} already exists") from None
        log.info(
            "created topic %s with %d partitions: %s",
            creation.name,
            len(creation.assignment),
            creation.assignment if len(creation.assignment) <= 16 else "...",
        )

    async def topic_assignment(self, name: str) -> TopicAssignment:
        _require_legal_name(name)
        try:
            data, stat = await self.zk.get(TopicZNode.path(name))
        except NoNodeError:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist") from None
        return TopicZNode.decode(name, data, stat.version)

    async def prepare_partitions(
        self, name: str, count: int, manual: list[list[int]] | None
    ) -> tuple[TopicAssignment, dict[int, list[int]]]:
        """Validate a CreatePartitions and compute the new partitions' replicas (nothing written)."""
        current = await self.topic_assignment(name)
        existing = len(current.partitions)
        if count <= existing:
            raise InvalidPartitionsError(
                f"topic {name!r} has {existing} partitions; the new count must be larger, not {count}"
            )
        replication_factor = len(next(iter(current.partitions.values())).replicas)
        if count * replication_factor > MAX_ASSIGNED_REPLICAS:
            # As for CreateTopics: the assignment must fit one znode, and computing millions of
            # replicas would stall this broker's event loop (the fuzzer asked for 134 million).
            raise InvalidPartitionsError(
                f"{count} partitions x {replication_factor} replicas is more than the"
                f" {MAX_ASSIGNED_REPLICAS} replicas one topic's assignment znode can hold"
            )
        brokers = await self.registered_brokers()
        if manual:
            if len(manual) != count - existing:
                raise InvalidReplicaAssignmentError(
                    f"{len(manual)} assignments given for {count - existing} new partitions"
                )
            added = {existing + i: list(replicas) for i, replicas in enumerate(manual)}
            validate_manual_assignment(
                added,
                [b.id for b in brokers],
                expected_replication_factor=replication_factor,
                first_partition_id=existing,
            )
        else:
            added = assign_replicas_for_added_partitions(
                {p: list(a.replicas) for p, a in current.partitions.items()}, count, brokers
            )
        return current, added

    async def add_partitions(self, current: TopicAssignment, added: dict[int, list[int]]) -> None:
        """Write the grown assignment, conditional on the version read (the controller watches it)."""
        partitions: dict[int, ReplicaAssignment | list[int]] = dict(current.partitions)
        partitions.update(added)
        try:
            await self.zk.set(
                TopicZNode.path(current.topic),
                TopicZNode.encode(partitions, current.topic_id),
                current.zk_version,
            )
        except BadVersionError:
            raise ConcurrentAssignmentChange(
                f"the assignment of {current.topic!r} changed meanwhile"
            ) from None

    async def require_topic(self, name: str) -> None:
        """UnknownTopicOrPartitionError unless the topic's assignment znode exists (a stat: its
        data, every partition's replicas, is not read)."""
        _require_legal_name(name)
        if await self.zk.exists(TopicZNode.path(name)) is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

    async def topic_config(self, name: str) -> dict[str, str]:
        _require_legal_name(name)
        try:
            data, stat = await self.zk.get(TopicConfigZNode.path(name))
        except NoNodeError:
            return {}
        return dict(TopicConfigZNode.decode(data, stat.version, name).config)

    async def set_topic_config(self, name: str, config: dict[str, str]) -> None:
        """Replace a topic's overrides and notify every broker (`/config/changes`)."""
        _require_legal_name(name)
        if await self.zk.exists(TopicZNode.path(name)) is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        normalised = validate_topic_configs(config)
        path = TopicConfigZNode.path(name)
        data = TopicConfigZNode.encode(normalised)
        try:
            await self.zk.set(path, data)
        except NoNodeError:
            await self.zk.create(path, data, makepath=True)
        await self.zk.create(
            ConfigChangeNotificationSequenceZNode.path(),
            ConfigChangeNotificationSequenceZNode.encode("topics", name),
            sequence=True,
            makepath=True,
        )
        log.info("config of topic %s set to %s", name, normalised)

    async def delete_topic(self, name: str) -> None:
        _require_legal_name(name)
        if await self.zk.exists(TopicZNode.path(name)) is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        try:
            await self.zk.create(DeleteTopicsTopicZNode.path(name), b"", makepath=True)
        except NodeExistsError:
            pass  # already queued
