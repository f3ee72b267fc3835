"""LeaderAndIsr response, version 6 (api key 4): the same fields as version 5.

Follows ``LeaderAndIsrResponse.json`` of Apache Kafka 3.2 (valid versions 0-6, flexible from 4),
unchanged in later 3.x releases. Version 6 exists only to answer a version 6 request; every field
means what it means in version 5, see ``odradek.protocol.messages.leader_and_isr.v5.response``:
``error_code`` (whole request), then ``topics[]`` of ``topic_id`` and ``partition_errors[]``
(``partition_index``, ``error_code``). Flexible: response header v1.
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
    __version__: ClassVar[i16] = i16(6)
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
    __version__: ClassVar[i16] = i16(6)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(4)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    topic_id: uuid.UUID | None = field(metadata={"kafka_type": "uuid"})
    """The topic id; ``None`` is the zero UUID."""
    partition_errors: tuple[LeaderAndIsrPartitionError, ...]
    """Each partition."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrResponse:
    """LeaderAndIsr v6 response: sent by a broker back to the controller."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(6)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(4)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    """The error for the whole request, or NONE."""
    topics: tuple[LeaderAndIsrTopicError, ...]
    """Each topic."""
