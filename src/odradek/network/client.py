"""A Kafka protocol client connection: what the controller, the replica fetchers and the command-line
tools use to talk to brokers.

One TCP connection, many requests in flight; Kafka answers a connection's requests in order, so the
pending requests are a FIFO matched by correlation id. Any connection failure fails every pending
request with `NetworkError` and the connection is unusable afterwards (callers reconnect).

Security (`ClientSecurity`): on a TLS listener the connection is wrapped in the given SSL context
(the server name checked against the broker's certificate is the host connected to); on a SASL
listener `authenticate(connection)` runs the SASL exchange (SaslHandshake, SaslAuthenticate) right
after connecting, before `connect` returns. `odradek.security.client_config` builds both from Kafka's
client properties (`security.protocol`, `ssl.*`, `sasl.mechanism`, `sasl.jaas.config`).

Concurrency: owned by one event loop; `send` may be called by many tasks of that loop at once.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from odradek.errors import NetworkError, require
from odradek.protocol.codec import ProtocolError, decode_response, encode_request
from odradek.protocol.framing import FrameDecoder, FrameError

MAX_RESPONSE_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How to secure an outgoing connection: TLS context and SASL exchange (both optional)."""

    ssl_context: ssl.SSLContext | None = None
    authenticate: Callable[[BrokerConnection], Awaitable[None]] | None = None
    security_protocol: str = "PLAINTEXT"


PLAINTEXT_CLIENT = ClientSecurity()


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, connection: BrokerConnection) -> None:
        self._connection = connection
        self._decoder = FrameDecoder(MAX_RESPONSE_BYTES)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except FrameError as e:
            self._connection._fail(NetworkError(f"bad frame from {self._connection.address}: {e}"))
            return
        for frame in frames:
            self._connection._on_frame(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connection._fail(
            NetworkError(f"connection to {self._connection.address} closed: {exc or 'EOF'}")
        )


class BrokerConnection:
    """A client connection to one Kafka broker (ours or any other)."""

    def __init__(self, host: str, port: int, client_id: str = "odradek") -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.address = f"{host}:{port}"
        self._transport: asyncio.Transport | None = None
        self._pending: deque[tuple[int, int, int, asyncio.Future[Any]]] = deque()
        self._correlation_ids = itertools.count(1)
        self._error: NetworkError | None = None

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        timeout: float = 10.0,
        client_id: str = "odradek",
        security: ClientSecurity = PLAINTEXT_CLIENT,
    ) -> BrokerConnection:
        connection = cls(host, port, client_id)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):  # not wait_for: it can lose cancellations on 3.11
                if security.ssl_context is None:
                    transport, _ = await loop.create_connection(
                        lambda: _ClientProtocol(connection), host, port
                    )
                else:
                    transport, _ = await loop.create_connection(
                        lambda: _ClientProtocol(connection),
                        host,
                        port,
                        ssl=security.ssl_context,
                        server_hostname=host,
                    )
                connection._transport = transport
                if security.authenticate is not None:
                    await security.authenticate(connection)
        except (TimeoutError, OSError, ssl.SSLError) as e:
            connection._fail(NetworkError(f"cannot connect to {host}:{port}: {e!r}"))
            raise NetworkError(f"cannot connect to {host}:{port}: {e!r}") from None
        except BaseException:
            connection._fail(NetworkError(f"cannot connect to {host}:{port}"))
            raise
        return connection

    @property
    def closed(self) -> bool:
        return self._error is not None or self._transport is None

    async def send(self, api_key: int, version: int, request: Any, timeout: float = 30.0) -> Any:
        """Send one request and wait for its response entity."""
        future = self.send_nowait(api_key, version, request)
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            error = NetworkError(f"request api={api_key} to {self.address} timed out")
            self._fail(error)
            raise error from None

    def send_nowait(self, api_key: int, version: int, request: Any) -> asyncio.Future[Any]:
        if self._error is not None:
            raise self._error
        if self._transport is None:
            raise NetworkError(f"not connected to {self.address}")
        correlation_id = next(self._correlation_ids) & 0x7FFFFFFF
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((correlation_id, api_key, version, future))
        self._transport.write(
            encode_request(api_key, version, correlation_id, self.client_id, request)
        )
        return future

    def send_oneway(self, api_key: int, version: int, request: Any) -> None:
        """Send a request that gets no response (Produce with acks=0)."""
        if self._error is not None:
            raise self._error
        transport = require(self._transport, "the connection's transport")
        correlation_id = next(self._correlation_ids) & 0x7FFFFFFF
        transport.write(encode_request(api_key, version, correlation_id, self.client_id, request))

    def _on_frame(self, frame: bytes) -> None:
        if not self._pending:
            self._fail(NetworkError(f"unexpected response from {self.address}"))
            return
        expected_id, api_key, version, future = self._pending.popleft()
        try:
            correlation_id, response = decode_response(api_key, version, frame)
        except ProtocolError as e:
            if not future.done():
                future.set_exception(NetworkError(str(e)))
            self._fail(NetworkError(f"malformed response from {self.address}: {e}"))
            return
        if correlation_id != expected_id:
            self._fail(NetworkError(f"correlation id {correlation_id} != {expected_id}"))
            return
        if not future.done():
            future.set_result(response)

    def _fail(self, error: NetworkError) -> None:
        if self._error is None:
            self._error = error
        while self._pending:
            *_, future = self._pending.popleft()
            if not future.done():
                future.set_exception(error)
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self._fail(NetworkError(f"connection to {self.address} closed by us"))
