"""Topics and partitions: assignments (`/brokers/topics/<t>`), partition states (leader, ISR,
epochs) and the ISR change notifications leaders leave for the controller.

See the package docstring for the conventions every class here follows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
    _sequence_number,
)

# Topics and partitions


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    """A partition's assigned replicas (AR), with the replicas being added or removed by an
    in-flight reassignment (KIP-455). Outside a reassignment both extra lists are empty."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """A decoded `/brokers/topics/<topic>`: partition index -> replica assignment."""

    topic: str
    partitions: Mapping[int, ReplicaAssignment]
    zk_version: int
    topic_id: str | None = None


class TopicsZNode:
    @staticmethod
    def path() -> str:
        return "/brokers/topics"


class TopicZNode:
    """`/brokers/topics/<topic>`: the replica assignment of every partition of a topic.

    JSON version 2: `partitions` maps the partition index (as a string) to its replica list;
    `adding_replicas` and `removing_replicas` hold only the partitions being reassigned (both
    always present, possibly empty); `topic_id` appears only when the topic has one (Kafka 2.8+).
    """

    VERSION = 2

    @staticmethod
    def path(topic: str) -> str:
        return f"{TopicsZNode.path()}/{topic}"

    @staticmethod
    def encode(
        assignment: Mapping[int, ReplicaAssignment | Sequence[int]], topic_id: str | None = None
    ) -> bytes:
        partitions: dict[str, list[int]] = {}
        adding: dict[str, list[int]] = {}
        removing: dict[str, list[int]] = {}
        for partition in sorted(assignment):
            value = assignment[partition]
            replicas = (
                value if isinstance(value, ReplicaAssignment) else ReplicaAssignment(tuple(value))
            )
            partitions[str(partition)] = list(replicas.replicas)
            if replicas.adding_replicas:
                adding[str(partition)] = list(replicas.adding_replicas)
            if replicas.removing_replicas:
                removing[str(partition)] = list(replicas.removing_replicas)
        payload: dict[str, Any] = {
            "version": TopicZNode.VERSION,
            "partitions": partitions,
            "adding_replicas": adding,
            "removing_replicas": removing,
        }
        if topic_id is not None:
            payload["topic_id"] = topic_id
        return _dumps(payload)

    @staticmethod
    def decode(topic: str, data: bytes, stat_version: int) -> TopicAssignment:
        where = TopicZNode.path(topic)
        obj = _loads(data, where)
        raw_partitions = _object(obj.get("partitions", {}), "'partitions'", where)
        adding = _object(obj.get("adding_replicas") or {}, "'adding_replicas'", where)
        removing = _object(obj.get("removing_replicas") or {}, "'removing_replicas'", where)
        partitions: dict[int, ReplicaAssignment] = {}
        for key, replicas in raw_partitions.items():
            try:
                partition = int(key)
            except ValueError:
                raise InvalidZNodeDataError(
                    f"{where}: partition key {key!r} is not an integer", path=where
                ) from None
            partitions[partition] = ReplicaAssignment(
                _int_list(replicas, f"replicas of partition {key}", where),
                _int_list(adding.get(key, []), f"adding_replicas of {key}", where),
                _int_list(removing.get(key, []), f"removing_replicas of {key}", where),
            )
        topic_id = obj.get("topic_id")
        if topic_id is not None and not isinstance(topic_id, str):
            raise InvalidZNodeDataError(f"{where}: field 'topic_id' is not a string", path=where)
        return TopicAssignment(topic, partitions, stat_version, topic_id)


class TopicPartitionsZNode:
    @staticmethod
    def path(topic: str) -> str:
        return f"{TopicZNode.path(topic)}/partitions"


class TopicPartitionZNode:
    @staticmethod
    def path(topic: str, partition: int) -> str:
        return f"{TopicPartitionsZNode.path(topic)}/{partition}"


@dataclass(frozen=True, slots=True)
class LeaderIsrAndControllerEpoch:
    """A decoded partition state znode. `zk_version` is what the next conditional write names:
    a leader whose ISR write fails on it has been superseded (a zombie) and must stop leading."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    zk_version: int


_STATE_JSON = '{"controller_epoch":%d,"leader":%d,"version":%d,"leader_epoch":%d,"isr":[%s]}'
_INT_JSON = "%d"


class TopicPartitionStateZNode:
    """`/brokers/topics/<t>/partitions/<p>/state`: leader, leader epoch, ISR, controller epoch.

    Written by the controller on every leader change and by the leader on ISR changes, always
    conditionally on the znode version. JSON version 1; leader is -1 when there is none.
    """

    VERSION = 1

    @staticmethod
    def path(topic: str, partition: int) -> str:
        return f"{TopicPartitionZNode.path(topic, partition)}/state"

    @staticmethod
    def encode(
        *, leader: int, leader_epoch: int, isr: Sequence[int], controller_epoch: int
    ) -> bytes:
        # Formatted directly (a controller writes one per partition it moves: json.dumps of the
        # dict cost ~4 times as much); the same bytes as _dumps of the fields in this order.
        return (
            _STATE_JSON
            % (
                controller_epoch,
                leader,
                TopicPartitionStateZNode.VERSION,
                leader_epoch,
                ",".join([_INT_JSON % replica for replica in isr]),
            )
        ).encode()

    @staticmethod
    def decode(
        data: bytes, stat_version: int, where: str = "partition state"
    ) -> LeaderIsrAndControllerEpoch:
        obj = _loads(data, where)
        # The common case checked in one pass (a failover decodes one state per partition);
        # anything unusual goes through the field-by-field checks for its error message.
        leader = obj.get("leader")
        leader_epoch = obj.get("leader_epoch")
        isr = obj.get("isr")
        controller_epoch = obj.get("controller_epoch")
        if (
            type(leader) is int
            and type(leader_epoch) is int
            and type(controller_epoch) is int
            and type(isr) is list
            and all(type(replica) is int for replica in isr)
        ):
            return LeaderIsrAndControllerEpoch(
                leader=leader,
                leader_epoch=leader_epoch,
                isr=tuple(isr),
                controller_epoch=controller_epoch,
                zk_version=stat_version,
            )
        return LeaderIsrAndControllerEpoch(
            leader=_int(obj, "leader", where),
            leader_epoch=_int(obj, "leader_epoch", where),
            isr=_int_list(_field(obj, "isr", where), "'isr'", where),
            controller_epoch=_int(obj, "controller_epoch", where),
            zk_version=stat_version,
        )


# ---------------------------------------------------------------------------------------------
# Notifications (persistent sequential children that the controller consumes and deletes)


@dataclass(frozen=True, slots=True)
class IsrChangeNotification:
    partitions: frozenset[TopicPartition]
    zk_version: int


class IsrChangeNotificationZNode:
    """`/isr_change_notification`: parent of the leaders' ISR change notifications."""

    @staticmethod
    def path() -> str:
        return "/isr_change_notification"


class IsrChangeNotificationSequenceZNode:
    """`/isr_change_notification/isr_change_<seq>`: partitions whose ISR a leader changed.

    Created persistent-sequential (ZooKeeper appends a 10-digit counter to the prefix); JSON
    `{"version":1,"partitions":[{"topic":..,"partition":..},..]}`.
    """

    PREFIX = "isr_change_"

    @staticmethod
    def path(sequence_number: str = "") -> str:
        """The child's path; with no sequence number, the prefix to create a sequential node."""
        return f"{IsrChangeNotificationZNode.path()}/{IsrChangeNotificationSequenceZNode.PREFIX}{sequence_number}"

    @staticmethod
    def sequence_number(child: str) -> str:
        return _sequence_number(child, IsrChangeNotificationSequenceZNode.PREFIX)

    @staticmethod
    def encode(partitions: Iterable[TopicPartition]) -> bytes:
        return _dumps({"version": 1, "partitions": _partition_list(partitions)})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> IsrChangeNotification:
        obj = _loads(data, IsrChangeNotificationZNode.path())
        return IsrChangeNotification(
            _decode_partition_list(obj, IsrChangeNotificationZNode.path()), stat_version
        )
