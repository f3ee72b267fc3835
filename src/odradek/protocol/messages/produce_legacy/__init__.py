"""Produce (api key 0) versions 0-2, which Kafka 4 (and so kio) dropped.

Why define them: librdkafka before 2.11 (Debian's kcat has 2.0.2) enables its gzip and snappy codecs
only if the broker advertises Produce v0, even though it then sends v3+ requests. Kafka 2.x/3.x
advertised Produce from v0, so we do too. The request is v3 without `transactional_id`; the response
gained `throttle_time_ms` in v1 and `log_append_time_ms` in v2. All three are non-flexible
(request header v1, response header v0). A v0-v2 request carries message sets of magic 0 or 1, which
this broker does not store: the record batch validation answers CORRUPT_MESSAGE for them.

Follows `ProduceRequest.json` / `ProduceResponse.json` of Apache Kafka 3.x.
"""

import datetime
from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.types import TopicName
from kio.static.constants import EntityType
from kio.static.primitive import Records, TZAware, i16, i32, i32Timedelta, i64


def _request_classes(version: int) -> tuple[type, type, type]:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class PartitionProduceData:
        __type__: ClassVar = EntityType.nested
        __version__: ClassVar[i16] = i16(version)
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = i16(0)
        __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
        index: i32 = field(metadata={"kafka_type": "int32"})
        records: Records | None = field(metadata={"kafka_type": "records"})

    @dataclass(frozen=True, slots=True, kw_only=True)
    class TopicProduceData:
        __type__: ClassVar = EntityType.nested
        __version__: ClassVar[i16] = i16(version)
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = i16(0)
        __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
        name: TopicName = field(metadata={"kafka_type": "string"})
        partition_data: tuple[PartitionProduceData, ...]

    @dataclass(frozen=True, slots=True, kw_only=True)
    class ProduceRequest:
        __type__: ClassVar = EntityType.request
        __version__: ClassVar[i16] = i16(version)
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = i16(0)
        __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
        acks: i16 = field(metadata={"kafka_type": "int16"})
        timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
        topic_data: tuple[TopicProduceData, ...]

        @property
        def transactional_id(self) -> None:
            return None

    for cls in (PartitionProduceData, TopicProduceData, ProduceRequest):
        cls.__qualname__ = cls.__name__
    return PartitionProduceData, TopicProduceData, ProduceRequest


def _response_classes(version: int) -> tuple[type, type, type]:
    if version >= 2:

        @dataclass(frozen=True, slots=True, kw_only=True)
        class PartitionProduceResponse:
            __type__: ClassVar = EntityType.nested
            __version__: ClassVar[i16] = i16(version)
            __flexible__: ClassVar[bool] = False
            __api_key__: ClassVar[i16] = i16(0)
            __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
            index: i32 = field(metadata={"kafka_type": "int32"})
            error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
            base_offset: i64 = field(metadata={"kafka_type": "int64"})
            log_append_time: TZAware | None = field(
                metadata={"kafka_type": "datetime_i64"}, default=None
            )

    else:

        @dataclass(frozen=True, slots=True, kw_only=True)
        class PartitionProduceResponse:  # type: ignore[no-redef]
            __type__: ClassVar = EntityType.nested
            __version__: ClassVar[i16] = i16(version)
            __flexible__: ClassVar[bool] = False
            __api_key__: ClassVar[i16] = i16(0)
            __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
            index: i32 = field(metadata={"kafka_type": "int32"})
            error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
            base_offset: i64 = field(metadata={"kafka_type": "int64"})

    @dataclass(frozen=True, slots=True, kw_only=True)
    class TopicProduceResponse:
        __type__: ClassVar = EntityType.nested
        __version__: ClassVar[i16] = i16(version)
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = i16(0)
        __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
        name: TopicName = field(metadata={"kafka_type": "string"})
        partition_responses: tuple[PartitionProduceResponse, ...]

    if version >= 1:

        @dataclass(frozen=True, slots=True, kw_only=True)
        class ProduceResponse:
            __type__: ClassVar = EntityType.response
            __version__: ClassVar[i16] = i16(version)
            __flexible__: ClassVar[bool] = False
            __api_key__: ClassVar[i16] = i16(0)
            __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
            responses: tuple[TopicProduceResponse, ...]
            throttle_time: i32Timedelta = field(
                metadata={"kafka_type": "timedelta_i32"}, default=datetime.timedelta(0)
            )

    else:

        @dataclass(frozen=True, slots=True, kw_only=True)
        class ProduceResponse:  # type: ignore[no-redef]
            __type__: ClassVar = EntityType.response
            __version__: ClassVar[i16] = i16(version)
            __flexible__: ClassVar[bool] = False
            __api_key__: ClassVar[i16] = i16(0)
            __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
            responses: tuple[TopicProduceResponse, ...]

    for cls in (PartitionProduceResponse, TopicProduceResponse, ProduceResponse):
        cls.__qualname__ = cls.__name__
    return PartitionProduceResponse, TopicProduceResponse, ProduceResponse


PRODUCE_LEGACY: dict[int, tuple[type, type]] = {
    version: (_request_classes(version)[2], _response_classes(version)[2]) for version in (0, 1, 2)
}
"""version -> (request class, response class) for Produce v0-v2."""
