"""The broker's socket server: one per listener. Accepts connections, applies the connection limits,
runs the TLS handshake on TLS listeners, and hands each connection to a `ClientConnection`
(`odradek.network.connection`), which turns frames into requests and answers them in order.

Accepting: the server accepts sockets itself (rather than through `loop.create_server`) so that the
connection limits (`odradek.network.quotas`) see the client's address before anything is spent on
it — a connection over a limit is closed before its TLS handshake — and so that a handshake that
fails or times out (`ListenerSecurity.ssl_handshake_timeout`) gives its slot back. Each accepted
socket becomes a transport with `loop.connect_accepted_socket` (with the listener's SSL context on
TLS listeners).

Idle connections: a connection that has neither received nor sent anything for
`connections.max.idle.ms` and has no request in flight is closed by a periodic sweep (Kafka's
selector does the same).

Concurrency: everything here runs on the broker's event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from odradek.errors import OperatorError
from odradek.network.connection import (
    MAX_IN_FLIGHT_PER_CONNECTION,
    NO_RESPONSE,
    ClientConnection,
    ConnectionState,
)
from odradek.network.listener_security import PLAINTEXT, ListenerSecurity
from odradek.network.quotas import ConnectionQuotas, MemoryPool
from odradek.network.request_context import RequestContext

__all__ = [
    "MAX_IN_FLIGHT_PER_CONNECTION",
    "NO_RESPONSE",
    "ClientConnection",
    "ConnectionState",
    "Dispatch",
    "SocketServer",
]

log = logging.getLogger(__name__)

Dispatch = Callable[[RequestContext, bytes], Any]
"""(request context, frame) -> response entity | awaitable of one | NO_RESPONSE.

Raises ProtocolError for a request that must close the connection."""

BACKLOG = 1024


class SocketServer:
    """Listens on one address (one listener) and dispatches the requests of its connections."""

    def __init__(
        self,
        host: str,
        port: int,
        dispatch: Dispatch,
        max_request_bytes: int,
        *,
        security: ListenerSecurity = PLAINTEXT,
        quotas: ConnectionQuotas | None = None,
        memory_pool: MemoryPool | None = None,
        connections_max_idle_ms: int = 600_000,
    ) -> None:
        self.host = host
        self.port = port
        self.dispatch = dispatch
        self.max_request_bytes = max_request_bytes
        self.security = security
        self.quotas = quotas or ConnectionQuotas()
        self.memory_pool = memory_pool or MemoryPool(-1)
        self.connections_max_idle_ms = connections_max_idle_ms
        self.connections: set[ClientConnection] = set()
        self.handshakes_failed = 0
        # Kafka's socket-server-metrics of this listener (cumulative; read at scrape time):
        # bytes read and written (sendfile included), connections accepted and closed, and
        # authentications (see `ClientConnection`; failed TLS handshakes are `handshakes_failed`).
        self.incoming_bytes = 0
        self.outgoing_bytes = 0
        self.connections_created = 0
        self.connections_closed = 0
        self.authentications_succeeded = 0
        self.authentications_failed = 0
        # (api key, ns) for each response sent: RequestMetrics' ResponseSendTimeMs (None: untimed).
        self.response_sent: Callable[[int, int], None] | None = None
        self._socket: socket.socket | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._accept_task: asyncio.Task[None] | None = None
        self._idle_task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def listener(self) -> str:
        return self.security.listener

    async def start(self) -> None:
        self._socket = self._bind()
        if self.port == 0:
            self.port = self._socket.getsockname()[1]
        loop = asyncio.get_running_loop()
        self._accept_task = loop.create_task(
            self._accept_loop(self._socket), name=f"acceptor-{self.listener}"
        )
        if self.connections_max_idle_ms > 0:
            self._idle_task = loop.create_task(
                self._idle_loop(), name=f"idle-connections-{self.listener}"
            )

    def _bind(self) -> socket.socket:
        where = f"{self.host}:{self.port} (listener {self.listener})"
        try:
            infos = socket.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except OSError as e:
            raise OperatorError(f"cannot listen on {where}: {e}") from None
        family, kind, proto, _name, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            if e.errno == errno.EADDRINUSE:
                raise OperatorError(f"cannot listen on {where}: the port is in use") from None
            raise OperatorError(f"cannot listen on {where}: {e.strerror}") from None
        return sock

    async def _accept_loop(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listening)
            except asyncio.CancelledError:
                raise
            except OSError as e:
                # EMFILE and friends: back off instead of spinning; the listener stays up.
                log.warning("accepting on listener %s failed: %s", self.listener, e)
                await asyncio.sleep(0.1)
                continue
            host = str(address[0]) if address else "?"
            if not self.quotas.try_acquire(self.listener, host):
                with contextlib.suppress(OSError):
                    sock.close()
                continue
            task = loop.create_task(self._establish(sock, address))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _establish(self, sock: socket.socket, address: Any) -> None:
        host = str(address[0]) if address else "?"
        peer = f"{address[0]}:{address[1]}" if address else "?"
        loop = asyncio.get_running_loop()
        context = self.security.ssl_context
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if context is None:
                await loop.connect_accepted_socket(lambda: ClientConnection(self, host, peer), sock)
            else:
                await loop.connect_accepted_socket(
                    lambda: ClientConnection(self, host, peer),
                    sock,
                    ssl=context,
                    ssl_handshake_timeout=self.security.ssl_handshake_timeout,
                )
        except asyncio.CancelledError:
            self.quotas.release(self.listener, host)
            with contextlib.suppress(OSError):
                sock.close()
            raise
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as e:
            self.handshakes_failed += 1
            self.quotas.release(self.listener, host)
            with contextlib.suppress(OSError):
                sock.close()
            log.info("Failed authentication with %s (SSL handshake failed: %s)", peer, e)

    def on_connection_closed(self, connection: ClientConnection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self.connections_closed += 1
            self.quotas.release(self.listener, connection.client_host)

    async def _idle_loop(self) -> None:
        limit = self.connections_max_idle_ms / 1000
        interval = max(0.05, min(limit / 4, 5.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for connection in list(self.connections):
                if connection.idle and now - connection.last_activity > limit:
                    log.debug("closing idle connection from %s", connection.peer)
                    connection.close("")

    async def stop(self) -> None:
        self._stopping = True
        for task in (self._accept_task, self._idle_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._socket is not None:
            self._socket.close()
        for task in list(self._tasks):
            task.cancel()
        for connection in list(self.connections):
            connection.close("")
