"""Request and response codecs: headers, message lookup by (api key, version), encode and decode.

Sans-I/O: bytes in, entities out, and back. Used by the broker's connections (decode requests, encode
responses) and by the broker's own client (controller, replica fetchers, command-line tools).

Header rules (KIP-482): a request uses header v2 (v1 plus tagged fields) when its API version is
flexible, v1 otherwise; a response uses header v1 (correlation id plus tagged fields) when flexible, v0
otherwise — except ApiVersions, whose response header is always v0 so that a client can read the answer
to a version it guessed wrong.

Message classes come from kio, except the four ZooKeeper-era inter-broker APIs that kio does not carry
(LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown), which `odradek.protocol.messages`
defines in kio's style.
"""

from __future__ import annotations

import enum
import io
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from odradek.errors import OdradekError
from odradek.protocol.frame_check import check_lengths


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    STOP_REPLICA = 5
    UPDATE_METADATA = 6
    CONTROLLED_SHUTDOWN = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66


class ProtocolError(OdradekError):
    """A request or response that cannot be parsed; the connection must be closed."""


class UnknownApiError(ProtocolError):
    pass


_HEADER_PREFIX = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length
_CORRELATION_ID = struct.Struct(">i")
_REQUEST_HEADER_V1 = struct.Struct(">hhih")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # bytes of the header, where the body starts

    @property
    def flexible(self) -> bool:
        return is_flexible(self.api_key, self.api_version)


@cache
def request_class(api_key: int, version: int) -> type:
    """The request dataclass for (api_key, version); raises UnknownApiError."""
    from odradek.protocol.messages import EXTRA_CLIENT_MESSAGES, INTERBROKER_MESSAGES

    if api_key in INTERBROKER_MESSAGES:
        try:
            return INTERBROKER_MESSAGES[api_key][version][0]
        except KeyError:
            raise UnknownApiError(f"api {api_key} has no version {version}") from None
    extra = EXTRA_CLIENT_MESSAGES.get(api_key, {}).get(version)
    if extra is not None:
        return extra[0]
    try:
        return load_request_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity) as e:
        raise UnknownApiError(f"api {api_key} version {version} is unknown") from e


@cache
def response_class(api_key: int, version: int) -> type:
    from odradek.protocol.messages import EXTRA_CLIENT_MESSAGES, INTERBROKER_MESSAGES

    if api_key in INTERBROKER_MESSAGES:
        try:
            return INTERBROKER_MESSAGES[api_key][version][1]
        except KeyError:
            raise UnknownApiError(f"api {api_key} has no version {version}") from None
    extra = EXTRA_CLIENT_MESSAGES.get(api_key, {}).get(version)
    if extra is not None:
        return extra[1]
    try:
        return load_response_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity) as e:
        raise UnknownApiError(f"api {api_key} version {version} is unknown") from e


@cache
def is_flexible(api_key: int, version: int) -> bool:
    return bool(request_class(api_key, version).__flexible__)


@cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


def _read_uvarint(data: bytes, position: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if position >= len(data):
            raise ProtocolError("truncated varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 28:
            raise ProtocolError("varint too long")


def _skip_tagged_fields(data: bytes, position: int) -> int:
    count, position = _read_uvarint(data, position)
    for _ in range(count):
        _tag, position = _read_uvarint(data, position)
        size, position = _read_uvarint(data, position)
        position += size
    if position > len(data):
        raise ProtocolError("truncated tagged fields")
    return position


def parse_request_header(frame: bytes) -> RequestHeader:
    """Parse a request header (v1 or v2, chosen by the API version's flexibility).

    Raises UnknownApiError for an api key / version pair that no schema describes (the caller decides
    whether that deserves an UNSUPPORTED_VERSION answer or a closed connection) and ProtocolError for
    bytes that are not a header at all.
    """
    if len(frame) < _HEADER_PREFIX.size:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a header")
    api_key, api_version, correlation_id, client_id_length = _HEADER_PREFIX.unpack_from(frame, 0)
    position = _HEADER_PREFIX.size
    client_id: str | None = None
    if client_id_length >= 0:
        end = position + client_id_length
        if end > len(frame):
            raise ProtocolError("truncated client id")
        try:
            client_id = frame[position:end].decode()
        except UnicodeDecodeError as e:
            raise ProtocolError("client id is not UTF-8") from e
        position = end
    elif client_id_length != -1:
        raise ProtocolError(f"invalid client id length {client_id_length}")
    header = RequestHeader(api_key, api_version, correlation_id, client_id, position)
    try:
        flexible = is_flexible(api_key, api_version)
    except UnknownApiError:
        # Still return what we parsed: ApiVersions of an unknown version is answered, not dropped.
        return header
    if flexible:
        position = _skip_tagged_fields(frame, position)
        header = RequestHeader(api_key, api_version, correlation_id, client_id, position)
    return header


def decode_request_body(header: RequestHeader, frame: bytes) -> Any:
    """Decode the body of a request whose header was parsed; ProtocolError on malformed bytes.

    Every length in the body is checked first (`frame_check`): kio's native reader would
    otherwise allocate for an array's declared length before reading it, and a huge one aborts
    the process."""
    cls = request_class(header.api_key, header.api_version)
    try:
        check_lengths(frame, header.size, cls)
    except ValueError as e:
        raise ProtocolError(f"malformed {cls.__name__} v{header.api_version}: {e}") from None
    try:
        entity, _size = _reader(cls)(frame, header.size)
    except (ValueError, TypeError, IndexError, OverflowError, UnicodeDecodeError) as e:
        raise ProtocolError(f"malformed {cls.__name__} v{header.api_version}: {e}") from e
    except Exception as e:  # kio's native reader raises its own types; translate them here
        raise ProtocolError(f"malformed {cls.__name__} v{header.api_version}: {e!r}") from e
    return entity


@dataclass(frozen=True, slots=True)
class PreEncoded:
    """A response body encoded ahead of time (memoised Metadata responses)."""

    body: bytes


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """A request entity sent with a body encoded ahead of time: the controller encodes one
    UpdateMetadata body for every broker and changes only each one's broker epoch in it. Reading
    an attribute reads the entity's."""

    entity: Any
    body: bytes

    def __getattr__(self, name: str) -> Any:
        if name in ("entity", "body"):  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.entity, name)


def encode_body(response: Any) -> PreEncoded:
    buffer = io.BytesIO()
    _writer(type(response))(buffer, response)
    return PreEncoded(buffer.getvalue())


def encode_response(header: RequestHeader, response: Any) -> bytes:
    """Encode a response entity for `header`'s request, framed (size prefix included)."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    buffer.write(_CORRELATION_ID.pack(header.correlation_id))
    if header.api_key != ApiKey.API_VERSIONS and is_flexible(header.api_key, header.api_version):
        buffer.write(b"\0")  # no tagged fields in the response header
    if isinstance(response, PreEncoded):
        buffer.write(response.body)
    else:
        _writer(type(response))(buffer, response)
    data = buffer.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    del data
    return buffer.getvalue()


def encode_request(
    api_key: int, version: int, correlation_id: int, client_id: str | None, request: Any
) -> bytes:
    """Encode a request entity with its header, framed."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    if client_id is None:
        buffer.write(_REQUEST_HEADER_V1.pack(api_key, version, correlation_id, -1))
    else:
        raw = client_id.encode()
        buffer.write(_REQUEST_HEADER_V1.pack(api_key, version, correlation_id, len(raw)))
        buffer.write(raw)
    if is_flexible(api_key, version):
        buffer.write(b"\0")
    if isinstance(request, EncodedRequest):
        buffer.write(request.body)
    else:
        _writer(type(request))(buffer, request)
    data = buffer.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    del data
    return buffer.getvalue()


def decode_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """Decode a response frame (without its size prefix) → (correlation id, entity)."""
    if len(frame) < 4:
        raise ProtocolError("response shorter than a header")
    (correlation_id,) = _CORRELATION_ID.unpack_from(frame, 0)
    position = 4
    if api_key != ApiKey.API_VERSIONS and is_flexible(api_key, version):
        position = _skip_tagged_fields(frame, position)
    cls = response_class(api_key, version)
    try:
        entity, _size = _reader(cls)(frame, position)
    except Exception as e:
        raise ProtocolError(f"malformed {cls.__name__} v{version}: {e!r}") from e
    return correlation_id, entity
