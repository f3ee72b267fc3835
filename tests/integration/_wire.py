"""Raw Kafka protocol over a blocking socket, for tests that need to control every byte.

Client libraries validate, retry and hide what a broker actually answered; these helpers do none
of that. `WireConnection` writes exactly the bytes it is given (well-formed requests encoded by
`odradek.protocol.codec`, or anything a fuzzer makes up) and reads framed responses back, so a
test can tell "the broker answered CORRUPT_MESSAGE" from "the broker closed the connection" from
"the broker said nothing".

Framing reminder (see `odradek.protocol.framing`): every request and response is a 4-byte
big-endian size followed by that many bytes; a request body starts with the header `api_key int16,
api_version int16, correlation_id int32, client_id nullable string` (plus tagged fields for
flexible versions), a response body with `correlation_id int32`.

Concurrency: a `WireConnection` belongs to the thread that opened it. Every wait is bounded by a
socket timeout (a deadline), never a sleep.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.protocol.build import build
from odradek.protocol.codec import (
    ApiKey,
    decode_response,
    encode_request,
    is_flexible,
    request_class,
)

SIZE = struct.Struct(">i")
HEADER_PREFIX = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length

PRODUCE_VERSION = 8
FETCH_VERSION = 11
LIST_OFFSETS_VERSION = 5
METADATA_VERSION = 9
API_VERSIONS_VERSION = 3
EARLIEST = -2
LATEST = -1
DEFAULT_TIMEOUT_S = 15.0
CLIENT_ID = "wire-test"


class ConnectionClosed(Exception):
    """The broker closed the connection (EOF or reset) before a whole frame arrived."""


class NoAnswer(Exception):
    """Nothing (or only part of a frame) arrived before the deadline."""


class WireConnection:
    """One TCP connection to a broker, driven byte by byte (see the module docstring)."""

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float = DEFAULT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """With `ssl_context`, the connection is TLS (the handshake happens here; a refused
        client certificate may only show on the first read, as TLS 1.3 reports it)."""
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self._correlation_id = 0

    @classmethod
    def to(
        cls,
        bootstrap: str,
        timeout: float = DEFAULT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> WireConnection:
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        return cls(host, int(port), timeout, ssl_context)

    def __enter__(self) -> WireConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- bytes --------------------------------------------------------------------------------

    def send_bytes(self, data: bytes) -> bool:
        """Write `data`; False if the broker had already closed the connection."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            return False
        return True

    def _read_exactly(self, count: int, deadline: float) -> bytes:
        chunks = bytearray()
        while len(chunks) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoAnswer(f"{len(chunks)} of {count} bytes arrived before the deadline")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(count - len(chunks))
            except TimeoutError:
                raise NoAnswer(
                    f"{len(chunks)} of {count} bytes arrived before the deadline"
                ) from None
            except ConnectionResetError:
                raise ConnectionClosed("connection reset by the broker") from None
            except ssl.SSLError as e:  # a TLS alert: the broker refused our certificate
                raise ConnectionClosed(f"TLS error: {e}") from None
            if not chunk:
                raise ConnectionClosed(f"EOF after {len(chunks)} of {count} bytes")
            chunks += chunk
        return bytes(chunks)

    def read_frame(self, timeout: float = DEFAULT_TIMEOUT_S) -> bytes:
        """The next response frame without its size prefix; ConnectionClosed or NoAnswer."""
        deadline = time.monotonic() + timeout
        (size,) = SIZE.unpack(self._read_exactly(4, deadline))
        if size < 4:
            raise AssertionError(f"the broker sent a frame of {size} bytes")
        return self._read_exactly(size, deadline)

    def wait_closed(self, timeout: float = DEFAULT_TIMEOUT_S) -> list[bytes]:
        """Read until the broker closes the connection; returns the frames that came first.

        NoAnswer if the connection is still open at the deadline."""
        frames = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                frames.append(self.read_frame(max(0.0, deadline - time.monotonic())))
            except ConnectionClosed:
                return frames

    # -- requests -----------------------------------------------------------------------------

    def next_correlation_id(self) -> int:
        self._correlation_id += 1
        return self._correlation_id

    def encode(self, api_key: int, version: int, values: dict[str, Any]) -> tuple[int, bytes]:
        """A framed request (and its correlation id) built from plain values."""
        correlation_id = self.next_correlation_id()
        request = build(request_class(api_key, version), values)
        return correlation_id, encode_request(
            api_key, version, correlation_id, "wire-test", request
        )

    def request(
        self,
        api_key: int,
        version: int,
        values: dict[str, Any],
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> Any:
        """Send one request and return the decoded response entity."""
        correlation_id, data = self.encode(api_key, version, values)
        if not self.send_bytes(data):
            raise ConnectionClosed("the broker closed the connection before the request")
        return self.read_response(api_key, version, correlation_id, timeout)

    def read_response(
        self, api_key: int, version: int, correlation_id: int, timeout: float = DEFAULT_TIMEOUT_S
    ) -> Any:
        frame = self.read_frame(timeout)
        got, response = decode_response(api_key, version, frame)
        if got != correlation_id:
            raise AssertionError(f"correlation id {got} answers request {correlation_id}")
        return response


# ---------------------------------------------------------------------------------------------
# The requests the tests send


def request_frame(api_key: int, version: int, correlation_id: int, values: dict[str, Any]) -> bytes:
    """A framed, well-formed request built from plain values (client id CLIENT_ID)."""
    request = build(request_class(api_key, version), values)
    return encode_request(api_key, version, correlation_id, CLIENT_ID, request)


def body_start(api_key: int, version: int) -> int:
    """Where the body begins in a `request_frame` (size prefix included): after the header's
    fixed part, the client id and, for flexible versions, the empty tagged fields."""
    return (
        SIZE.size
        + HEADER_PREFIX.size
        + len(CLIENT_ID)
        + (1 if is_flexible(api_key, version) else 0)
    )


def produce_values(topic: str, partition: int, records: bytes, acks: int = 1) -> dict[str, Any]:
    return {
        "transactional_id": None,
        "acks": acks,
        "timeout": 10_000,
        "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": records}]}
        ],
    }


@dataclass(frozen=True)
class ProduceAnswer:
    error_code: ErrorCode
    base_offset: int
    error_message: str | None


def produce(
    connection: WireConnection, topic: str, partition: int, records: bytes, acks: int = 1
) -> ProduceAnswer:
    """Produce `records` (raw RecordBatch bytes) and return the partition's answer."""
    response = connection.request(
        ApiKey.PRODUCE, PRODUCE_VERSION, produce_values(topic, partition, records, acks)
    )
    (topic_response,) = response.responses
    (answer,) = topic_response.partition_responses
    return ProduceAnswer(ErrorCode(answer.error_code), answer.base_offset, answer.error_message)


@dataclass(frozen=True)
class FetchAnswer:
    error_code: ErrorCode
    high_watermark: int
    log_start_offset: int
    records: bytes


def fetch(
    connection: WireConnection, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20
) -> FetchAnswer:
    """One consumer fetch that does not wait for data (max_wait 0)."""
    response = connection.request(
        ApiKey.FETCH,
        FETCH_VERSION,
        {
            "replica_id": -1,
            "max_wait": 0,
            "min_bytes": 0,
            "max_bytes": max_bytes,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": partition,
                            "current_leader_epoch": -1,
                            "fetch_offset": offset,
                            "log_start_offset": -1,
                            "partition_max_bytes": max_bytes,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )
    (topic_response,) = response.responses
    (answer,) = topic_response.partitions
    return FetchAnswer(
        ErrorCode(answer.error_code),
        answer.high_watermark,
        answer.log_start_offset,
        bytes(answer.records or b""),
    )


def list_offset(connection: WireConnection, topic: str, partition: int, timestamp: int) -> int:
    """ListOffsets for one partition (EARLIEST, LATEST or a timestamp); the offset, or raises
    AssertionError naming the error code."""
    response = connection.request(
        ApiKey.LIST_OFFSETS,
        LIST_OFFSETS_VERSION,
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": partition,
                            "current_leader_epoch": -1,
                            "timestamp": timestamp,
                        }
                    ],
                }
            ],
        },
    )
    (answer,) = response.topics[0].partitions
    if answer.error_code != ErrorCode.none:
        raise AssertionError(f"ListOffsets {topic}-{partition}: {ErrorCode(answer.error_code)!r}")
    return int(answer.offset)


def cluster_view(bootstrap: str) -> tuple[int, set[int]]:
    """(controller id, broker ids) as one broker's Metadata answers them."""
    with WireConnection.to(bootstrap) as connection:
        response = connection.request(
            ApiKey.METADATA, METADATA_VERSION, {"topics": [], "allow_auto_topic_creation": False}
        )
    return int(response.controller_id), {int(b.node_id) for b in response.brokers}


def log_end_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    """The partition's latest offset (high watermark) as one broker answers it."""
    with WireConnection.to(bootstrap) as connection:
        return list_offset(connection, topic, partition, LATEST)


def raw_request_frame(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    """A framed request with a v1 header (no tagged fields) and `body` as given: how a test
    names an API or version the broker does not implement, which the codec cannot encode."""
    header = HEADER_PREFIX.pack(api_key, version, correlation_id, -1)
    return SIZE.pack(len(header) + len(body)) + header + body
