"""LeaderAndIsr request, version 5 (api key 4): the controller tells a broker what to lead and follow.

Follows ``LeaderAndIsrRequest.json`` of Apache Kafka 3.2 (valid versions 0-6, flexible from 4).
Version 5 is unchanged in later 3.x releases, which only add version 7 (``IsKRaftController``) and
rename ``ZkVersion`` to ``PartitionEpoch`` without changing the wire. Flexible: request header v2,
compact strings and arrays, and an (always empty) tagged-field section after every struct.

The controller sends this to every broker in a partition's AR whenever leader, ISR or AR changes
(leader election, broker failure, new topic, reassignment), batched per broker per controller event.
Fields, in wire order, and what they mean for a ZooKeeper-mode controller:

``controller_id``
    Broker id of the active controller sending the request (the ``brokerid`` in ``/controller``).
``controller_epoch``
    Value of ``/controller_epoch`` when the controller won the election. A broker that has already
    seen a higher epoch refuses the whole request with STALE_CONTROLLER_EPOCH (zombie controller).
``broker_epoch``
    The receiving broker's epoch as the controller knows it: the czxid of its
    ``/brokers/ids/<id>`` registration. A request addressed to an older incarnation of the broker is
    refused with STALE_BROKER_EPOCH. -1 means "do not check".
``type``
    0 UNKNOWN (what a plain ZooKeeper controller sends), 1 INCREMENTAL (only the partitions that
    changed), 2 FULL (every partition the broker should host, so it may delete the ones not listed;
    used by Kafka's ZooKeeper-to-KRaft migration). KIP-516.
``topic_states[]``
    One entry per topic with partitions for this broker:

    ``topic_name``
        The topic.
    ``topic_id``
        The topic's UUID from ``/brokers/topics/<topic>`` (KIP-516); ``None`` (the zero UUID on the
        wire) if the topic has none. A broker whose ``partition.metadata`` file records another id
        answers INCONSISTENT_TOPIC_ID.
    ``partition_states[]``
        The leader/ISR state of each partition, see ``LeaderAndIsrPartitionState``:

        ``partition_index``
            The partition number.
        ``controller_epoch``
            Epoch of the controller that last wrote this partition's state znode (from the znode's
            JSON), which may be older than the request's own ``controller_epoch``.
        ``leader``
            Broker id of the leader; -1 when no replica could be elected (offline partition).
        ``leader_epoch``
            Incremented by the controller on every leader change or controller-side ISR shrink. A
            broker applies a partition state only if its leader epoch is newer than the one it has
            and otherwise reports STALE_CONTROLLER_EPOCH for that partition.
        ``isr``
            The in-sync replicas, as in the state znode.
        ``zk_version``
            Version of ``/brokers/topics/<t>/partitions/<p>/state``. The leader makes its ISR writes
            conditional on it, so a zombie leader's write fails.
        ``replicas``
            The assigned replicas (AR) in preference order; the first is the preferred leader.
        ``adding_replicas``
            During a reassignment, RAR - OAR (replicas being added); empty otherwise.
        ``removing_replicas``
            During a reassignment, OAR - RAR (replicas being removed); empty otherwise.
        ``is_new``
            True when the replica is in NewReplica state (topic creation, partition expansion,
            reassignment): the broker may create a fresh log. When false and the log is missing
            (say, its log directory failed) the broker answers KAFKA_STORAGE_ERROR instead of
            silently starting an empty replica.
``live_leaders[]``
    ``broker_id``, ``host_name`` and ``port`` of every leader named in ``topic_states`` (its
    inter-broker listener), so that followers know where to fetch from.
"""

import uuid
from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.types import BrokerId, TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i64


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrPartitionState:
    """The leader/ISR state of one partition, as the controller last wrote it to ZooKeeper."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(5)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(4)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    """The partition index."""
    controller_epoch: i32 = field(metadata={"kafka_type": "int32"})
    """Epoch of the controller that last wrote this partition's state."""
    leader: BrokerId = field(metadata={"kafka_type": "int32"})
    """The leader's broker id, or -1 for none."""
    leader_epoch: i32 = field(metadata={"kafka_type": "int32"})
    """The leader epoch."""
    isr: tuple[BrokerId, ...] = field(metadata={"kafka_type": "int32"})
    """The in-sync replica ids."""
    zk_version: i32 = field(metadata={"kafka_type": "int32"})
    """Version of the partition state znode (``PartitionEpoch`` in later schemas)."""
    replicas: tuple[BrokerId, ...] = field(metadata={"kafka_type": "int32"})
    """The assigned replicas, preferred leader first."""
    adding_replicas: tuple[BrokerId, ...] = field(metadata={"kafka_type": "int32"}, default=())
    """Replicas being added by a reassignment."""
    removing_replicas: tuple[BrokerId, ...] = field(metadata={"kafka_type": "int32"}, default=())
    """Replicas being removed by a reassignment."""
    is_new: bool = field(metadata={"kafka_type": "bool"}, default=False)
    """Whether the replica is new (NewReplica), so that a missing log is expected."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrTopicState:
    """The partition states of one topic."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(5)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(4)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    topic_name: TopicName = field(metadata={"kafka_type": "string"})
    """The topic name."""
    topic_id: uuid.UUID | None = field(metadata={"kafka_type": "uuid"})
    """The topic id; ``None`` is the zero UUID."""
    partition_states: tuple[LeaderAndIsrPartitionState, ...]
    """The state of each partition."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrLiveLeader:
    """Where a leader named in the request can be reached."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(5)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(4)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    broker_id: BrokerId = field(metadata={"kafka_type": "int32"})
    """The leader's broker id."""
    host_name: str = field(metadata={"kafka_type": "string"})
    """The leader's host name."""
    port: i32 = field(metadata={"kafka_type": "int32"})
    """The leader's port."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrRequest:
    """LeaderAndIsr v5: sent by the controller to the brokers that host the listed partitions."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(5)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(4)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    controller_id: BrokerId = field(metadata={"kafka_type": "int32"})
    """The controller's broker id."""
    controller_epoch: i32 = field(metadata={"kafka_type": "int32"})
    """The controller epoch."""
    broker_epoch: i64 = field(metadata={"kafka_type": "int64"}, default=i64(-1))
    """The receiving broker's epoch, or -1."""
    # Named after the schema's ``Type``. It shadows the builtin inside this class body only, so no
    # annotation after it may use ``type[...]``.
    type: i8 = field(metadata={"kafka_type": "int8"})
    """0 unknown, 1 incremental, 2 full."""
    topic_states: tuple[LeaderAndIsrTopicState, ...]
    """Each topic."""
    live_leaders: tuple[LeaderAndIsrLiveLeader, ...]
    """The leaders named in ``topic_states``."""
