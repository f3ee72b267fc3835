"""Admin requests the controller acts on: topic deletions, partition reassignments and
preferred-replica elections under `/admin`.

See the package docstring for the conventions every class here follows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from odradek.zk.errors import InvalidZNodeDataError
from odradek.zk.znodes._common import (
    TopicPartition,
    _decode_partition_list,
    _dumps,
    _field,
    _int,
    _int_list,
    _loads,
    _object,
    _partition_list,
    _str,
)

# Admin requests


class AdminZNode:
    @staticmethod
    def path() -> str:
        return "/admin"


class DeleteTopicsZNode:
    """`/admin/delete_topics`: parent of the topics queued for deletion."""

    @staticmethod
    def path() -> str:
        return f"{AdminZNode.path()}/delete_topics"


class DeleteTopicsTopicZNode:
    """`/admin/delete_topics/<topic>`: the topic is queued for deletion. Its payload is empty:
    the znode's existence is the request."""

    @staticmethod
    def path(topic: str) -> str:
        return f"{DeleteTopicsZNode.path()}/{topic}"

    @staticmethod
    def encode() -> bytes:
        return b""


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    replicas: Mapping[TopicPartition, tuple[int, ...]]
    zk_version: int


class ReassignPartitionsZNode:
    """`/admin/reassign_partitions`: the legacy (pre-KIP-455) reassignment request.

    JSON `{"version":1,"partitions":[{"topic":..,"partition":..,"replicas":[..]},..]}`: the target
    replica list (RAR) of each partition. The controller removes partitions as they complete and
    deletes the znode when none are left.
    """

    @staticmethod
    def path() -> str:
        return f"{AdminZNode.path()}/reassign_partitions"

    @staticmethod
    def encode(reassignment: Mapping[TopicPartition, Sequence[int]]) -> bytes:
        partitions = [
            {"topic": tp.topic, "partition": tp.partition, "replicas": list(replicas)}
            for tp, replicas in reassignment.items()
        ]
        return _dumps({"version": 1, "partitions": partitions})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> PartitionReassignment:
        where = ReassignPartitionsZNode.path()
        obj = _loads(data, where)
        entries = _field(obj, "partitions", where)
        if not isinstance(entries, list):
            raise InvalidZNodeDataError(f"{where}: 'partitions' is not a list", path=where)
        replicas: dict[TopicPartition, tuple[int, ...]] = {}
        for entry in entries:
            entry = _object(entry, "a partitions entry", where)
            tp = TopicPartition(_str(entry, "topic", where), _int(entry, "partition", where))
            replicas[tp] = _int_list(_field(entry, "replicas", where), "'replicas'", where)
        return PartitionReassignment(replicas, stat_version)


@dataclass(frozen=True, slots=True)
class PreferredReplicaElection:
    partitions: frozenset[TopicPartition]
    zk_version: int


class PreferredReplicaElectionZNode:
    """`/admin/preferred_replica_election`: partitions whose preferred replica (the first of AR)
    should become leader. JSON `{"version":1,"partitions":[{"topic":..,"partition":..},..]}`."""

    @staticmethod
    def path() -> str:
        return f"{AdminZNode.path()}/preferred_replica_election"

    @staticmethod
    def encode(partitions: Iterable[TopicPartition]) -> bytes:
        return _dumps({"version": 1, "partitions": _partition_list(partitions)})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> PreferredReplicaElection:
        obj = _loads(data, PreferredReplicaElectionZNode.path())
        partitions = _decode_partition_list(obj, PreferredReplicaElectionZNode.path())
        return PreferredReplicaElection(partitions, stat_version)
