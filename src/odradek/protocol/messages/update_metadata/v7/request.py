"""UpdateMetadata request, version 7 (api key 6): the controller refreshes a broker's metadata cache.

Follows ``UpdateMetadataRequest.json`` of Apache Kafka 3.2 (valid versions 0-7, flexible from 6).
Version 7 is unchanged in later 3.x releases, which only add version 8 (KRaft controller id and
request type) and rename ``ZkVersion`` to ``PartitionEpoch`` without changing the wire. Flexible:
request header v2, compact strings and arrays, an (always empty) tagged-field section after every
struct.

The controller sends this to every live broker after leaders, ISRs or live brokers change, so that
each broker can answer Metadata requests and route clients to partition leaders. Fields, in wire
order, and what they mean for a ZooKeeper-mode controller:

``controller_id``, ``controller_epoch``
    The sending controller and its ``/controller_epoch``; a broker that has seen a higher epoch
    refuses the request with STALE_CONTROLLER_EPOCH.
``broker_epoch``
    The receiving broker's registration czxid as the controller knows it (STALE_BROKER_EPOCH if it
    belongs to an earlier registration); -1 means "do not check".
``topic_states[]``
    Partitions whose state changed:

    ``topic_name``
        The topic.
    ``topic_id``
        The topic's UUID from ``/brokers/topics/<topic>``; ``None`` is the zero UUID. Metadata
        responses report it to clients.
    ``partition_states[]``
        ``partition_index``; ``controller_epoch`` of the controller that last wrote the state
        znode; ``leader`` (-1 no leader; -2 the topic is being deleted, which tells the broker to
        drop the partition from its cache); ``leader_epoch``; ``isr``; ``zk_version`` (version of
        the partition state znode); ``replicas`` (AR, preferred first); ``offline_replicas``
        (replicas on dead brokers or failed log directories, reported to clients as offline).
``live_brokers[]``
    Every live broker, so the cache can resolve leader ids to addresses:

    ``id``
        The broker id (from ``/brokers/ids/<id>``).
    ``endpoints[]``
        One per listener of the broker: ``port``, ``host``, ``listener`` (the listener name, such
        as ``PLAINTEXT``) and ``security_protocol`` (0 PLAINTEXT, 1 SSL, 2 SASL_PLAINTEXT,
        3 SASL_SSL). Note that ``port`` precedes ``host`` on the wire.
    ``rack``
        The broker's ``broker.rack``, or ``None`` when it has none.
"""

import uuid
from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.types import BrokerId, TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i64


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataPartitionState:
    """The leader/ISR state of one partition, for the metadata cache."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(7)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(6)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    """The partition index."""
    controller_epoch: i32 = field(metadata={"kafka_type": "int32"})
    """Epoch of the controller that last wrote this partition's state."""
    leader: BrokerId = field(metadata={"kafka_type": "int32"})
    """The leader's broker id; -1 none, -2 topic being deleted."""
    leader_epoch: i32 = field(metadata={"kafka_type": "int32"})
    """The leader epoch."""
    isr: tuple[BrokerId, ...] = field(metadata={"kafka_type": "int32"})
    """The in-sync replica ids."""
    zk_version: i32 = field(metadata={"kafka_type": "int32"})
    """Version of the partition state znode (``PartitionEpoch`` in later schemas)."""
    replicas: tuple[BrokerId, ...] = field(metadata={"kafka_type": "int32"})
    """The assigned replicas, preferred leader first."""
    offline_replicas: tuple[BrokerId, ...] = field(metadata={"kafka_type": "int32"}, default=())
    """Replicas that are offline."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataTopicState:
    """The partition states of one topic."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(7)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(6)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    topic_name: TopicName = field(metadata={"kafka_type": "string"})
    """The topic name."""
    topic_id: uuid.UUID | None = field(metadata={"kafka_type": "uuid"})
    """The topic id; ``None`` is the zero UUID."""
    partition_states: tuple[UpdateMetadataPartitionState, ...]
    """The state of each partition."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataEndpoint:
    """One listener of a live broker."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(7)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(6)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    port: i32 = field(metadata={"kafka_type": "int32"})
    """The listener's port."""
    host: str = field(metadata={"kafka_type": "string"})
    """The listener's host name."""
    listener: str = field(metadata={"kafka_type": "string"})
    """The listener name."""
    security_protocol: i16 = field(metadata={"kafka_type": "int16"})
    """The security protocol id (0 PLAINTEXT, 1 SSL, 2 SASL_PLAINTEXT, 3 SASL_SSL)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataBroker:
    """A live broker and its listeners."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(7)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(6)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    id: BrokerId = field(metadata={"kafka_type": "int32"})
    """The broker id."""
    endpoints: tuple[UpdateMetadataEndpoint, ...]
    """The broker's listeners."""
    rack: str | None = field(metadata={"kafka_type": "string"}, default=None)
    """The broker's rack, or ``None``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataRequest:
    """UpdateMetadata v7: sent by the controller to every live broker."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(7)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(6)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    controller_id: BrokerId = field(metadata={"kafka_type": "int32"})
    """The controller's broker id."""
    controller_epoch: i32 = field(metadata={"kafka_type": "int32"})
    """The controller epoch."""
    broker_epoch: i64 = field(metadata={"kafka_type": "int64"}, default=i64(-1))
    """The receiving broker's epoch, or -1."""
    topic_states: tuple[UpdateMetadataTopicState, ...]
    """Each topic with changed partitions."""
    live_brokers: tuple[UpdateMetadataBroker, ...]
    """Every live broker."""
