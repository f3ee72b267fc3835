"""ControlledShutdown response, version 3 (api key 7): the partitions the broker still leads.

Follows ``ControlledShutdownResponse.json`` of Apache Kafka 3.2 (valid versions 0-3, flexible from
3), unchanged in later 3.x releases. Flexible: response header v1, compact strings and arrays, an
(always empty) tagged-field section after every struct.

The controller answers the shutting-down broker. Fields, in wire order:

``error_code``
    NONE when the controller processed the request; NOT_CONTROLLER when the receiver is not the
    active controller (the broker looks the controller up again and retries); STALE_BROKER_EPOCH
    when the request came from an earlier registration of the broker.
``remaining_partitions[]``
    ``topic_name`` and ``partition_index`` of each partition the broker still leads because no
    other ISR member could take over. The broker retries (up to ``controlled.shutdown.max.retries``)
    until this list is empty, then shuts down anyway.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.response_header.v1.header import ResponseHeader
from kio.schema.types import TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32


@dataclass(frozen=True, slots=True, kw_only=True)
class RemainingPartition:
    """A partition the shutting-down broker still leads."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(7)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    topic_name: TopicName = field(metadata={"kafka_type": "string"})
    """The topic name."""
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    """The partition index."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlledShutdownResponse:
    """ControlledShutdown v3 response: sent by the controller back to the broker."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(7)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    """The error, or NONE."""
    remaining_partitions: tuple[RemainingPartition, ...]
    """The partitions the broker still leads."""
