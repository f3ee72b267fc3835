"""StopReplica response, version 3 (api key 5): per-partition outcome of a StopReplica request.

Follows ``StopReplicaResponse.json`` of Apache Kafka 3.2 (valid versions 0-3, flexible from 2),
unchanged in later 3.x releases. Flexible: response header v1, compact strings and arrays, an
(always empty) tagged-field section after every struct. Version 3 may answer FENCED_LEADER_EPOCH.

The broker answers the controller, whose topic deletion manager marks each replica
ReplicaDeletionSuccessful or ReplicaDeletionIneligible from it. Fields, in wire order:

``error_code``
    Error for the whole request: NONE, STALE_CONTROLLER_EPOCH (deposed controller) or
    STALE_BROKER_EPOCH (meant for an earlier registration of this broker); with one, nothing was
    stopped and ``partition_errors`` may be empty.
``partition_errors[]``
    ``topic_name``, ``partition_index`` and ``error_code`` of each partition: NONE when the replica
    was stopped (and its log deleted if asked); FENCED_LEADER_EPOCH when the broker knows a newer
    leader epoch; KAFKA_STORAGE_ERROR when the log directory is offline, so the deletion could not
    happen and the replica becomes ineligible for deletion until its broker returns.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.response_header.v1.header import ResponseHeader
from kio.schema.types import TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReplicaPartitionError:
    """The outcome for one partition."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(5)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    topic_name: TopicName = field(metadata={"kafka_type": "string"})
    """The topic name."""
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    """The partition index."""
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    """The partition's error, or NONE."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReplicaResponse:
    """StopReplica v3 response: sent by a broker back to the controller."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(5)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    """The error for the whole request, or NONE."""
    partition_errors: tuple[StopReplicaPartitionError, ...]
    """Each partition."""
