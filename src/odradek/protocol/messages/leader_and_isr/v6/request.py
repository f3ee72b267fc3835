"""LeaderAndIsr request, version 6 (api key 4): version 5 plus each partition's recovery state.

Follows ``LeaderAndIsrRequest.json`` of Apache Kafka 3.2 (valid versions 0-6, flexible from 4).
Version 6 is unchanged in later 3.x releases. Flexible: request header v2, compact strings and
arrays, and an (always empty) tagged-field section after every struct.

Every field means what it means in version 5; see ``odradek.protocol.messages.leader_and_isr.v5.request``
for the full list in wire order. Version 6 adds one field, last in each partition state:

``topic_states[].partition_states[].leader_recovery_state``
    0 RECOVERED, 1 RECOVERING (KIP-704): 1 marks a leader chosen by unclean election that has not
    finished recovering; until it has, the leader must not grow the ISR. A controller that does
    not track recovery sends 0.
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
    __version__: ClassVar[i16] = i16(6)
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
    leader_recovery_state: i8 = field(metadata={"kafka_type": "int8"}, default=i8(0))
    """0 recovered, 1 recovering from an unclean election."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrTopicState:
    """The partition states of one topic."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(6)
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
    __version__: ClassVar[i16] = i16(6)
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
    """LeaderAndIsr v6: sent by the controller to the brokers that host the listed partitions."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(6)
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
