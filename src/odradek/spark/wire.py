"""A blocking connection to one broker with requests pipelined: what the fast paths of the data
source (`spark.fetch`, `spark.produce`) send their requests over.

Kafka answers a connection's requests in order, so responses are matched to requests by a FIFO of
correlation ids; anything unexpected (a closed socket, a response too large or out of order, a
timeout) raises `WireError`, after which the connection is unusable: the fast paths then hand
over to a confluent-kafka client. PLAINTEXT only (no TLS, no SASL).

Concurrency: one task thread.
"""

from __future__ import annotations

import socket
import struct
from collections import deque
from typing import Any

from odradek.protocol.codec import ProtocolError, decode_response, encode_request

__all__ = ["BrokerSocket", "WireError"]

_SIZE = struct.Struct(">i")


class WireError(Exception):
    """The connection failed or answered something unexpected; it is unusable now."""


class BrokerSocket:
    """Requests of one API and version to one broker, several in flight."""

    def __init__(
        self,
        host: str,
        port: int,
        timeout_s: float,
        api_key: int,
        version: int,
        client_id: str,
        max_response: int,
    ) -> None:
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as e:
            raise WireError(f"connecting to {host}:{port}: {e}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.api_key = api_key
        self.version = version
        self.client_id = client_id
        self.max_response = max_response
        self.correlation = 0
        self.pending: deque[int] = deque()

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def send(self, request: Any) -> None:
        self.correlation += 1
        frame = encode_request(
            self.api_key, self.version, self.correlation, self.client_id, request
        )
        try:
            self.sock.sendall(frame)
        except OSError as e:
            raise WireError(f"sending: {e}") from None
        self.pending.append(self.correlation)

    def _exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        try:
            while got < n:
                k = self.sock.recv_into(view[got:], n - got)
                if k == 0:
                    raise WireError("connection closed")
                got += k
        except OSError as e:
            raise WireError(f"receiving: {e}") from None
        return buf

    def receive(self) -> Any:
        """The response to the oldest request in flight."""
        if not self.pending:
            raise WireError("no request in flight")
        (size,) = _SIZE.unpack(self._exactly(4))
        if size < 4 or size > self.max_response:
            raise WireError(f"response of {size} bytes")
        try:
            correlation, response = decode_response(
                self.api_key, self.version, bytes(self._exactly(size))
            )
        except ProtocolError as e:
            raise WireError(f"undecodable response: {e}") from None
        if correlation != self.pending.popleft():
            raise WireError("correlation id out of order")
        return response

    def close(self) -> None:
        self.sock.close()
