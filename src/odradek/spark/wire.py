"""A blocking connection to one broker with requests pipelined: what the fast paths of the data
source (`spark.fetch`, `spark.produce`) send their requests over.

Kafka answers a connection's requests in order, so responses are matched to requests by a FIFO of
correlation ids; anything unexpected (a closed socket, a response too large or out of order, a
timeout) raises `WireError`, after which the connection is unusable: the fast paths then hand
over to a confluent-kafka client. PLAINTEXT only (no TLS, no SASL).

Responses are received into one buffer the connection keeps and reuses (grown when a response
does not fit): a Fetch answer holds tens of MB, and a fresh buffer of that size per response, plus
a copy of it into `bytes`, cost the reader more than decoding the records. `receive_frame` hands
out a read-only view of that buffer, valid until the next receive; `receive` (small answers, such
as Produce responses) decodes the entity from a copy.

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
        self._size = bytearray(4)
        self._buffer = bytearray()

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

    def _read_into(self, buffer: bytearray, n: int) -> None:
        """Fill the first `n` bytes of `buffer` from the socket."""
        view = memoryview(buffer)
        got = 0
        try:
            while got < n:
                k = self.sock.recv_into(view[got:n], n - got)
                if k == 0:
                    raise WireError("connection closed")
                got += k
        except OSError as e:
            raise WireError(f"receiving: {e}") from None
        finally:
            view.release()

    def _next_frame(self) -> int:
        """Receive the next response frame into the buffer; its size."""
        if not self.pending:
            raise WireError("no request in flight")
        self._read_into(self._size, 4)
        (size,) = _SIZE.unpack(self._size)
        if size < 4 or size > self.max_response:
            raise WireError(f"response of {size} bytes")
        if len(self._buffer) < size:
            # A new buffer rather than a resize: views of the old one may still be held. Room to
            # spare, as the next answer of a full fetch is a little larger or smaller.
            grown = max(size + (size >> 3), 2 * len(self._buffer))
            self._buffer = bytearray(min(grown, self.max_response))
        self._read_into(self._buffer, size)
        return size

    def receive_frame(self) -> memoryview:
        """The response to the oldest request in flight, after its correlation id: a read-only
        view of the connection's receive buffer, overwritten by the next receive."""
        size = self._next_frame()
        (correlation,) = _SIZE.unpack_from(self._buffer, 0)
        if correlation != self.pending.popleft():
            raise WireError("correlation id out of order")
        return memoryview(self._buffer)[4:size].toreadonly()

    def receive(self) -> Any:
        """The decoded response to the oldest request in flight."""
        size = self._next_frame()
        try:
            correlation, response = decode_response(
                self.api_key, self.version, bytes(memoryview(self._buffer)[:size])
            )
        except ProtocolError as e:
            raise WireError(f"undecodable response: {e}") from None
        if correlation != self.pending.popleft():
            raise WireError("correlation id out of order")
        return response

    def set_timeout(self, timeout_s: float) -> None:
        self.sock.settimeout(timeout_s)

    def close(self) -> None:
        self.sock.close()
