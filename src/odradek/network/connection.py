"""One client connection of the broker's socket server: frames in, requests dispatched, responses out
in request order.

Bytes go through the sans-I/O `FrameDecoder` and request codec (`odradek.protocol`). Requests are
handed to the dispatcher in the order they arrive, synchronously, so that whatever a handler does
before its first `await` (appending a produce request to the log, say) happens in request order. A
handler may answer at once or return an awaitable (a delayed produce waiting for acks=all, a fetch
long-polling for data); responses are written strictly in request order, as Kafka clients require,
while later requests keep being processed — pipelining without reordering.

Authentication (`odradek.network.listener_security`): on a TLS listener the handshake is over
before `connection_made`, and the client certificate gives the principal; on a SASL listener every
frame goes to the connection's `SaslSession` until it has authenticated (frames are capped at its
`max_receive_size` meanwhile), and each later request passes through it before the handlers.

A frame that is too large, a header or body that cannot be parsed, or a request the dispatcher rejects
as malformed closes that one connection with a log line; every other connection is unaffected.

Metrics (O(1) per read and per response): the read's time travels with each request
(`RequestContext.received_ns`, for RequestQueueTimeMs); each response's send time goes to the
server's `response_sent` (see `odradek.server.metrics.request_metrics`); bytes, connections and
authentications are counted on the `SocketServer`.

Responses given as parts (a Fetch's records as ranges of segment files) are written by
`ZeroCopyWrites` (`odradek.network.zero_copy_writes`): sendfile(2) on plaintext, one read per range
on TLS.

State (`ConnectionState`, changed only in `_set_state`): OPEN → CLOSING (a final response is being
flushed before a graceful close: after a failed authentication) → CLOSED.

Concurrency: everything here runs on the broker's event loop thread.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from odradek.errors import require
from odradek.network.listener_security import (
    ANONYMOUS,
    Action,
    AuthenticationRefused,
    Close,
    Proceed,
    Reply,
    ReplyRaw,
    SaslSession,
    SetPrincipal,
)
from odradek.network.request_context import RequestContext
from odradek.network.zero_copy_writes import ConnectionState, ZeroCopyWrites
from odradek.protocol.codec import (
    ProtocolError,
    RequestHeader,
    encode_response,
    parse_request_header,
)
from odradek.protocol.fetch_response import EncodedResponse
from odradek.protocol.framing import FrameDecoder, FrameError, frame

if TYPE_CHECKING:
    from odradek.network.server import SocketServer

log = logging.getLogger(__name__)

NO_RESPONSE = object()
"""Returned by a handler for requests that get no response (Produce with acks=0)."""

MAX_IN_FLIGHT_PER_CONNECTION = 64
"""Requests read but not yet answered before the connection stops reading (back-pressure)."""


class ClientConnection(ZeroCopyWrites, asyncio.Protocol):
    """One client connection. Owned by the event loop thread."""

    def __init__(self, server: SocketServer, client_host: str, peer: str) -> None:
        self._server = server
        self._decoder = FrameDecoder(server.max_request_bytes)
        # (header or None for a raw SASL token, result, bytes reserved in the memory pool)
        self._pending: deque[tuple[RequestHeader | None, Any, int]] = deque()
        self._transport: asyncio.Transport | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._waiting_for_memory = False
        self._reserved = 0  # pool bytes reserved for the frame being assembled
        self.state = ConnectionState.OPEN
        self.peer = peer
        self.client_host = client_host
        self.last_activity = time.monotonic()
        # Who the client is: every request of this connection carries it in its context.
        self.principal: str = ANONYMOUS
        self._sasl: SaslSession | None = None
        # a response's file ranges are being sent (`_send_rest`, `_send_tls_rest`)
        self._sending_file = False
        self._send_task: asyncio.Future[None] | None = None
        self._poll_fd = -1  # a dup of the socket, to wait for writability while sending files
        self._socket_fd = -1  # the socket for sendfile; -1 on TLS connections (copying path)
        self._throttled_until = 0.0  # monotonic time until which a quota mutes the connection
        self._unmute: asyncio.TimerHandle | None = None
        # frames read while throttled, their sizes and when they were read (perf_counter_ns)
        self._held: deque[tuple[bytes, int, int]] = deque()
        # (api key, send start) of responses written while the transport's buffer was above its
        # high-water mark: their send ends when it drains (`resume_writing`). Empty but for slow
        # readers.
        self._unflushed: list[tuple[int, int]] = []
        self._file_send: tuple[int, int] | None = None  # the same, for a response in `_send_rest`
        self._drained: asyncio.Future[None] | None = None  # `_send_tls_rest` waits on it

    # asyncio.Protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server.connections.add(self)
        self._server.connections_created += 1
        security = self._server.security
        sock = transport.get_extra_info("socket")
        if security.ssl_context is None and sock is not None:
            self._socket_fd = sock.fileno()
        try:
            if security.ssl_context is not None and security.principal_for_certificate:
                ssl_object = transport.get_extra_info("ssl_object")
                der = ssl_object.getpeercert(binary_form=True) if ssl_object else None
                self.principal = security.principal_for_certificate(der)
        except AuthenticationRefused as e:
            log.info("Failed authentication with %s (%s)", self.peer, e)
            self._server.authentications_failed += 1
            self.close("")
            return
        if security.new_sasl_session is not None:
            self._sasl = security.new_sasl_session(self.peer)
            self._decoder.max_frame_bytes = min(
                self._server.max_request_bytes, self._sasl.max_receive_size
            )
        else:
            # PLAINTEXT and TLS: the principal is known now (Kafka counts these too).
            self._server.authentications_succeeded += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._set_state(ConnectionState.CLOSED)
        if self._unmute is not None:
            self._unmute.cancel()
        if self._send_task is not None:
            self._send_task.cancel()
        if self._poll_fd >= 0:
            asyncio.get_running_loop().remove_writer(self._poll_fd)
            os.close(self._poll_fd)
            self._poll_fd = -1
        self._server.on_connection_closed(self)
        self._unflushed.clear()
        self._file_send = None
        for _header, result, _size in self._pending:
            if isinstance(result, asyncio.Future):
                result.cancel()
        self._release_all()

    def data_received(self, data: bytes) -> None:
        if self.state is not ConnectionState.OPEN:
            return
        received = time.perf_counter_ns()
        self._server.incoming_bytes += len(data)
        self.last_activity = time.monotonic()
        try:
            frames = self._decoder.feed(data)
        except FrameError as e:
            self.close(f"invalid frame: {e}")
            return
        pool = self._server.memory_pool
        for index, item in enumerate(frames):
            if self.state is not ConnectionState.OPEN:
                return
            if self._reserved:
                # The reservation made for this frame when its size prefix was read.
                size, self._reserved = self._reserved, 0
            else:
                # A whole frame in one read: counted if there is memory, never refused (its bytes
                # are already here; refusing would only lose them).
                size = len(item) if not pool.unlimited and pool.try_reserve(len(item)) else 0
            if self._unmute is not None or self._held:
                # Throttled by a quota: the frames read with the throttled one wait, as the
                # unread ones do, until the throttle ends (Kafka reads one request at a time).
                self._held.append((item, size, received))
                continue
            self._handle(item, size, received, final=index == len(frames) - 1)
        if self.state is ConnectionState.OPEN:
            self._reserve_partial_frame()
            self._update_reading()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self._unflushed:  # drained below the low-water mark: those responses are sent
            now = time.perf_counter_ns()
            sent = self._server.response_sent
            for api_key, started in self._unflushed:
                if sent is not None:
                    sent(api_key, now - started)
            self._unflushed.clear()
        self._update_reading()

    # memory (queued.max.request.bytes)

    def _reserve_partial_frame(self) -> bool:
        """Reserve pool memory for the frame being assembled; pause reading if there is none.
        True once nothing more is needed (the pool's waiter protocol)."""
        if self.state is not ConnectionState.OPEN:
            self._waiting_for_memory = False
            return True
        needed = self._decoder.pending_frame_size
        pool = self._server.memory_pool
        if pool.unlimited or needed < 0 or self._reserved:
            self._set_waiting(False)
            return True
        if pool.try_reserve(needed):
            self._reserved = needed
            self._set_waiting(False)
            return True
        self._set_waiting(True)
        return False

    def _set_waiting(self, waiting: bool) -> None:
        if waiting == self._waiting_for_memory:
            return
        self._waiting_for_memory = waiting
        pool = self._server.memory_pool
        if waiting:
            pool.wait(id(self), self._reserve_partial_frame)
        else:
            pool.forget(id(self))
        self._update_reading()

    def _release_all(self) -> None:
        pool = self._server.memory_pool
        pool.forget(id(self))
        released = self._reserved + sum(size for _h, _r, size in self._pending)
        released += sum(size for _frame, size, _received in self._held)
        self._reserved = 0
        self._pending.clear()
        self._held.clear()
        pool.release(released)

    # request handling

    def _handle(self, data: bytes, size: int, received: int, final: bool) -> None:
        sasl = self._sasl
        if sasl is not None and sasl.authenticating:
            now_ms = int(time.time() * 1000)
            self._apply(sasl.receive_frame(data, now_ms), None, data, size, received)
            return
        try:
            header = parse_request_header(data)
        except ProtocolError as e:
            self._server.memory_pool.release(size)
            self.close(f"malformed request: {e}")
            return
        if sasl is not None:
            now_ms = int(time.time() * 1000)
            self._apply(sasl.on_request(header, data, now_ms), header, data, size, received)
            return
        self._dispatch(header, data, size, received)

    def _apply(
        self,
        actions: Sequence[Action],
        header: RequestHeader | None,
        data: bytes,
        size: int,
        received: int,
    ) -> None:
        """Carry out a SASL session's actions, in order."""
        used = False
        for action in actions:
            if isinstance(action, Reply):
                self._pending.append((action.header, action.response, 0))
            elif isinstance(action, ReplyRaw):
                self._pending.append((None, action.data, 0))
            elif isinstance(action, SetPrincipal):
                self.principal = action.principal
                self._decoder.max_frame_bytes = self._server.max_request_bytes
                self._server.authentications_succeeded += 1
            elif isinstance(action, Proceed) and header is not None:
                used = True
                self._dispatch(header, data, size, received)
            elif isinstance(action, Close):
                # The SASL session ends the connection: a failed (re-)authentication, an expired
                # session or a request out of place in it.
                self._server.authentications_failed += 1
                self._write_ready_responses()
                self._server.memory_pool.release(0 if used else size)
                self._close_after_flush(action.reason)
                return
        if not used:
            self._server.memory_pool.release(size)
        self._write_ready_responses()

    def _dispatch(self, header: RequestHeader, data: bytes, size: int, received: int) -> None:
        security = self._server.security
        try:
            context = RequestContext(
                header,
                self.peer,
                self.client_host,
                self.principal,
                security.listener,
                security.security_protocol,
                len(data),
                self._throttle,
                received,
            )
            result = self._server.dispatch(context, data)
        except ProtocolError as e:
            self._server.memory_pool.release(size)
            self.close(f"malformed request: {e}")
            return
        except Exception:
            log.exception("unexpected error handling a request from %s; closing it", self.peer)
            self._server.memory_pool.release(size)
            self.close("internal error")
            return
        if result is NO_RESPONSE:
            self._server.memory_pool.release(size)
            return
        if inspect.isawaitable(result):
            future = asyncio.ensure_future(result)
            future.add_done_callback(self._on_response_ready)
            result = future
        self._pending.append((header, result, size))
        self._write_ready_responses()

    def _on_response_ready(self, _future: asyncio.Future[Any]) -> None:
        if self.state is ConnectionState.OPEN:
            self._write_ready_responses()
            self._update_reading()

    def _write_ready_responses(self) -> None:
        pending = self._pending
        pool = self._server.memory_pool
        transport = require(self._transport, "the connection's transport")
        while pending and self.state is not ConnectionState.CLOSED and not self._sending_file:
            header, result, size = pending[0]
            if header is None:  # a raw SASL token
                pending.popleft()
                token = frame(result)
                transport.write(token)
                self._server.outgoing_bytes += len(token)
                continue
            if isinstance(result, asyncio.Future):
                if not result.done():
                    return
                if result.cancelled():
                    pending.popleft()
                    pool.release(size)
                    self.close("request handling was cancelled")
                    return
                error = result.exception()
                if error is not None:
                    pending.popleft()
                    pool.release(size)
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
            pool.release(size)
            if response is NO_RESPONSE:
                continue
            started = time.perf_counter_ns()
            if isinstance(response, EncodedResponse):
                self.last_activity = time.monotonic()
                if not self._write_parts(response.parts):
                    if self._sending_file:  # the send ends with `_send_rest`
                        self._file_send = (header.api_key, started)
                    return  # the rest goes out from `_send_rest`, which resumes the queue
                self._handed_over(header.api_key, started)
                continue
            try:
                data = encode_response(header, response)
            except Exception:
                log.exception("cannot encode the response to api %d; closing", header.api_key)
                self.close("response encoding failed")
                return
            transport.write(data)
            self._server.outgoing_bytes += len(data)
            self.last_activity = time.monotonic()
            self._handed_over(header.api_key, started)

    def _handed_over(self, api_key: int, started: int) -> None:
        """A response's bytes are all with the transport: its send is over unless the transport
        is holding more than its high-water mark (then it ends at `resume_writing`)."""
        if self._writing_paused:
            self._unflushed.append((api_key, started))
            return
        sent = self._server.response_sent
        if sent is not None:
            sent(api_key, time.perf_counter_ns() - started)

    # quota throttling (KIP-219)

    def _throttle(self, throttle_ms: int) -> None:
        """Read nothing more from this client for `throttle_ms` (a quota was exceeded; the response
        says so in its throttle_time_ms). Called by a handler as its response is ready."""
        if throttle_ms <= 0 or self.state is not ConnectionState.OPEN:
            return
        until = time.monotonic() + throttle_ms / 1000
        if until <= self._throttled_until:
            return
        self._throttled_until = until
        if self._unmute is not None:
            self._unmute.cancel()
        self._unmute = asyncio.get_running_loop().call_later(throttle_ms / 1000, self._end_throttle)
        self._update_reading()

    def _end_throttle(self) -> None:
        self._unmute = None
        self._throttled_until = 0.0
        while self._held and self._unmute is None and self.state is ConnectionState.OPEN:
            frame, size, received = self._held.popleft()
            self._handle(frame, size, received, final=not self._held)
        self._update_reading()

    @property
    def throttled(self) -> bool:
        return self._unmute is not None

    def _update_reading(self) -> None:
        if self._transport is None or self.state is not ConnectionState.OPEN:
            return
        should_pause = (
            self._writing_paused
            or self._waiting_for_memory
            or self._unmute is not None
            or len(self._pending) >= MAX_IN_FLIGHT_PER_CONNECTION
        )
        if should_pause and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            self._transport.resume_reading()
            self._reading_paused = False

    @property
    def idle(self) -> bool:
        return not self._pending and not self._sending_file and not self._held

    def _set_state(self, state: ConnectionState) -> None:
        self.state = state

    def _close_after_flush(self, reason: str) -> None:
        if self.state is not ConnectionState.OPEN:
            return
        if reason:
            log.info("closing connection from %s: %s", self.peer, reason)
        self._set_state(ConnectionState.CLOSING)
        if self._transport is not None:
            self._transport.close()  # sends what is buffered first

    def close(self, reason: str) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        if reason:
            log.warning("closing connection from %s: %s", self.peer, reason)
        self._set_state(ConnectionState.CLOSED)
        if self._transport is not None:
            self._transport.abort()
