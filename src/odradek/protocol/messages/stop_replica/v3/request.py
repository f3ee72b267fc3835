"""StopReplica request, version 3 (api key 5): the controller tells a broker to stop a replica.

Follows ``StopReplicaRequest.json`` of Apache Kafka 3.2 (valid versions 0-3, flexible from 2).
Version 3 is unchanged in later 3.x releases, which only add version 4 (``IsKRaftController``).
Flexible: request header v2, compact strings and arrays, an (always empty) tagged-field section
after every struct. Version 3 moved the delete flag from the request to each partition and added the
partition's leader epoch (KIP-570).

Sent when a replica goes OfflineReplica (controlled shutdown of a follower, reassignment removing
it) or ReplicaDeletionStarted (topic deletion, reassignment). Fields, in wire order, and what they
mean for a ZooKeeper-mode controller:

``controller_id``, ``controller_epoch``
    The sending controller and its ``/controller_epoch``; a broker that has seen a higher epoch
    refuses the request with STALE_CONTROLLER_EPOCH.
``broker_epoch``
    The receiving broker's registration czxid as the controller knows it (STALE_BROKER_EPOCH if it
    belongs to an earlier registration); -1 means "do not check".
``topic_states[]``
    ``topic_name`` and its ``partition_states[]``:

    ``partition_index``
        The partition.
    ``leader_epoch``
        The partition's current leader epoch. The broker refuses with FENCED_LEADER_EPOCH if it
        already knows a newer one (a delayed request from before a re-election). -2 (the epoch the
        controller uses while deleting a topic) and -1 (no epoch) skip that check.
    ``delete_partition``
        True: stop the replica and delete its log (topic deletion, replica removed by a
        reassignment). False: only stop fetching and leading, keeping the log (replica goes
        offline).
"""

from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.types import BrokerId, TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i64


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReplicaPartitionState:
    """One partition to stop."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(5)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    """The partition index."""
    leader_epoch: i32 = field(metadata={"kafka_type": "int32"}, default=i32(-1))
    """The partition's leader epoch; -2 while deleting, -1 for none."""
    delete_partition: bool = field(metadata={"kafka_type": "bool"})
    """Whether to delete the replica's log as well."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReplicaTopicState:
    """The partitions of one topic to stop."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(5)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    topic_name: TopicName = field(metadata={"kafka_type": "string"})
    """The topic name."""
    partition_states: tuple[StopReplicaPartitionState, ...]
    """Each partition."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReplicaRequest:
    """StopReplica v3: sent by the controller to a broker hosting the listed replicas."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(5)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    controller_id: BrokerId = field(metadata={"kafka_type": "int32"})
    """The controller's broker id."""
    controller_epoch: i32 = field(metadata={"kafka_type": "int32"})
    """The controller epoch."""
    broker_epoch: i64 = field(metadata={"kafka_type": "int64"}, default=i64(-1))
    """The receiving broker's epoch, or -1."""
    topic_states: tuple[StopReplicaTopicState, ...]
    """Each topic."""
