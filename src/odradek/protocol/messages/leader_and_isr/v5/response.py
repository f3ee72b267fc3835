"""LeaderAndIsr response, version 5 (api key 4): per-partition outcome of a LeaderAndIsr request.

Follows ``LeaderAndIsrResponse.json`` of Apache Kafka 3.2 (valid versions 0-6, flexible from 4;
versions 5 and 6 have the same fields, and later 3.x releases leave them unchanged). Flexible:
response header v1, compact arrays, and an (always empty) tagged-field section after every struct.
Version 5 groups partitions by topic id instead of naming the topic in each partition (KIP-516).

The broker answers the controller; the controller's channel manager hands the response to the
controller's event queue. Fields, in wire order, and what they mean for a ZooKeeper-mode controller:

``error_code``
    Error for the whole request: NONE, STALE_CONTROLLER_EPOCH (the request came from a deposed
    controller) or STALE_BROKER_EPOCH (it was meant for an earlier registration of this broker).
    With a top-level error no partition was changed and ``topics`` may be empty.
``topics[]``
    One entry per topic in the request:

    ``topic_id``
        The topic id from the request (``None`` for the zero UUID).
    ``partition_errors[]``
        ``partition_index`` and ``error_code`` of each partition: NONE when the broker now leads
        or follows it as told; STALE_CONTROLLER_EPOCH when the partition state's leader epoch was
        not newer than the broker's; KAFKA_STORAGE_ERROR when the replica's log directory is
        offline, which makes the controller mark that replica offline; INCONSISTENT_TOPIC_ID when
        the local log belongs to a different topic id.
"""

import uuid
from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.response_header.v1.header import ResponseHeader
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrPartitionError:
    """The outcome for one partition."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(5)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(4)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    """The partition index."""
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    """The partition's error, or NONE."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrTopicError:
    """The outcomes for the partitions of one topic."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(5)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(4)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    topic_id: uuid.UUID | None = field(metadata={"kafka_type": "uuid"})
    """The topic id; ``None`` is the zero UUID."""
    partition_errors: tuple[LeaderAndIsrPartitionError, ...]
    """Each partition."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrResponse:
    """LeaderAndIsr v5 response: sent by a broker back to the controller."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(5)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(4)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    """The error for the whole request, or NONE."""
    topics: tuple[LeaderAndIsrTopicError, ...]
    """Each topic."""
