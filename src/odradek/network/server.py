"""The broker's socket server: accepts connections, turns frames into requests, answers in order.

Each connection is an `asyncio.Protocol`; bytes go through the sans-I/O `FrameDecoder` and request
codec (`odradek.protocol`). Requests are handed to the dispatcher in the order they arrive, synchronously,
so that whatever a handler does before its first `await` (appending a produce request to the log, say)
happens in request order. A handler may answer at once or return an awaitable (a delayed produce
waiting for acks=all, a fetch long-polling for data); responses are written strictly in request order,
as Kafka clients require, while later requests keep being processed — pipelining without reordering.

A frame that is too large, a header or body that cannot be parsed, or a request the dispatcher rejects
as malformed closes that one connection with a log line; every other connection is unaffected.

Concurrency: everything here runs on the broker's event loop thread.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import inspect
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from odradek.errors import OperatorError, require
from odradek.network.request_context import ANONYMOUS, RequestContext
from odradek.protocol.codec import (
    ProtocolError,
    RequestHeader,
    encode_response,
    parse_request_header,
)
from odradek.protocol.framing import FrameDecoder, FrameError

log = logging.getLogger(__name__)

NO_RESPONSE = object()
"""Returned by a handler for requests that get no response (Produce with acks=0)."""

MAX_IN_FLIGHT_PER_CONNECTION = 64
"""Requests read but not yet answered before the connection stops reading (back-pressure)."""


class ConnectionState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


Dispatch = Callable[[RequestContext, bytes], Any]
"""(request context, frame) -> response entity | awaitable of one | NO_RESPONSE.

Raises ProtocolError for a request that must close the connection."""


class ClientConnection(asyncio.Protocol):
    """One client connection. Owned by the event loop thread."""

    def __init__(self, server: SocketServer) -> None:
        self._server = server
        self._decoder = FrameDecoder(server.max_request_bytes)
        self._pending: deque[tuple[RequestHeader, Any]] = deque()
        self._transport: asyncio.Transport | None = None
        self._reading_paused = False
        self._writing_paused = False
        self.state = ConnectionState.OPEN
        self.peer: str = "?"
        self.client_host: str = "?"
        # Who the client is: every request of this connection carries it in its context.
        self.principal: str = ANONYMOUS

    # asyncio.Protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.client_host = str(peer[0]) if peer else "?"
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = ConnectionState.CLOSED
        self._server.connections.discard(self)
        for _header, result in self._pending:
            if isinstance(result, asyncio.Future):
                result.cancel()
        self._pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.state is not ConnectionState.OPEN:
            return
        try:
            frames = self._decoder.feed(data)
        except FrameError as e:
            self.close(f"invalid frame: {e}")
            return
        for frame in frames:
            if self.state is not ConnectionState.OPEN:
                return
            self._handle(frame)
        self._update_reading()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    # request handling

    def _handle(self, frame: bytes) -> None:
        try:
            header = parse_request_header(frame)
            context = RequestContext(header, self.peer, self.client_host, self.principal)
            result = self._server.dispatch(context, frame)
        except ProtocolError as e:
            self.close(f"malformed request: {e}")
            return
        except Exception:
            log.exception("unexpected error handling a request from %s; closing it", self.peer)
            self.close("internal error")
            return
        if result is NO_RESPONSE:
            return
        if inspect.isawaitable(result):
            future = asyncio.ensure_future(result)
            future.add_done_callback(self._on_response_ready)
            result = future
        self._pending.append((header, result))
        self._write_ready_responses()

    def _on_response_ready(self, _future: asyncio.Future[Any]) -> None:
        if self.state is ConnectionState.OPEN:
            self._write_ready_responses()
            self._update_reading()

    def _write_ready_responses(self) -> None:
        pending = self._pending
        while pending:
            header, result = pending[0]
            if isinstance(result, asyncio.Future):
                if not result.done():
                    return
                if result.cancelled():
                    pending.popleft()
                    self.close("request handling was cancelled")
                    return
                error = result.exception()
                if error is not None:
                    pending.popleft()
                    if isinstance(error, ProtocolError):
                        self.close(f"malformed request: {error}")
                    else:
                        log.error(
                            "error handling api %d from %s; closing it",
                            header.api_key,
                            self.peer,
                            exc_info=error,
                        )
                        self.close("internal error")
                    return
                response = result.result()
            else:
                response = result
            pending.popleft()
            if response is NO_RESPONSE:
                continue
            try:
                data = encode_response(header, response)
            except Exception:
                log.exception("cannot encode the response to api %d; closing", header.api_key)
                self.close("response encoding failed")
                return
            require(self._transport, "the connection's transport").write(data)

    def _update_reading(self) -> None:
        if self._transport is None or self.state is not ConnectionState.OPEN:
            return
        should_pause = self._writing_paused or len(self._pending) >= MAX_IN_FLIGHT_PER_CONNECTION
        if should_pause and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            self._transport.resume_reading()
            self._reading_paused = False

    def close(self, reason: str) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        if reason:
            log.warning("closing connection from %s: %s", self.peer, reason)
        self.state = ConnectionState.CLOSED
        if self._transport is not None:
            self._transport.abort()


class SocketServer:
    """Listens on one address and dispatches requests of every connection to `dispatch`."""

    def __init__(self, host: str, port: int, dispatch: Dispatch, max_request_bytes: int) -> None:
        self.host = host
        self.port = port
        self.dispatch = dispatch
        self.max_request_bytes = max_request_bytes
        self.connections: set[ClientConnection] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: ClientConnection(self),
                self.host,
                self.port,
                reuse_address=True,
                backlog=1024,
            )
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise OperatorError(
                    f"cannot listen on {self.host}:{self.port}: the port is in use"
                ) from None
            raise OperatorError(f"cannot listen on {self.host}:{self.port}: {e.strerror}") from None
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close("")
        if self._server is not None:
            await self._server.wait_closed()
