"""A client connection's responses given as parts (`EncodedResponse`): bytes through the
transport, file ranges of segments by sendfile(2) straight to the socket (zero copy), or, on TLS,
read once, a chunk at a time, and written through the TLS transport as it drains.

`ZeroCopyWrites` is a base of `ClientConnection` (connection.py, which says when these run); it
works on the fields `ClientConnection.__init__` sets, declared below.

Concurrency: the broker's event loop thread only.
"""

from __future__ import annotations

import asyncio
import enum
import os
from typing import TYPE_CHECKING

from odradek.errors import require
from odradek.protocol.fetch_response import FileRecords

if TYPE_CHECKING:
    from odradek.network.server import SocketServer


TLS_CHUNK = 1 << 18
"""Bytes of a file range read and written at a time on TLS (`_write_tls_parts`)."""


class ConnectionState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class ZeroCopyWrites:
    """Writing a response's parts (see the module docstring)."""

    # set by ClientConnection.__init__
    _server: SocketServer
    _transport: asyncio.Transport | None
    state: ConnectionState
    _sending_file: bool
    _send_task: asyncio.Future[None] | None
    _poll_fd: int
    _socket_fd: int
    _file_send: tuple[int, int] | None
    _writing_paused: bool
    _drained: asyncio.Future[None] | None

    if TYPE_CHECKING:  # defined by ClientConnection

        def close(self, reason: str) -> None: ...

        def _handed_over(self, api_key: int, started: int) -> None: ...

        def _write_ready_responses(self) -> None: ...

        def _update_reading(self) -> None: ...

    def _write_parts(self, parts: list[bytes | FileRecords]) -> bool:
        """Write a response given as parts; True when all of it went to the transport.

        Bytes go through the transport (consecutive ones in one `writelines`). On TLS a file
        range is read into bytes a chunk at a time and goes the same way (`_write_tls_parts`).
        Otherwise it goes by sendfile(2) straight to the socket while the transport has nothing
        buffered and the socket takes it; whatever remains is sent by `_send_rest`, which waits
        for the socket, and responses after this one wait for it (False)."""
        transport = require(self._transport, "the connection's transport")
        socket_fd = self._socket_fd
        server = self._server
        if socket_fd < 0:
            return self._write_tls_parts(parts)
        buffered: list[bytes] = []
        for index, part in enumerate(parts):
            if not isinstance(part, FileRecords):
                buffered.append(part)
                continue
            self._write_bytes(buffered)
            buffered = []
            sent = 0
            if transport.get_write_buffer_size() == 0:
                try:
                    while sent < part.size:
                        n = os.sendfile(socket_fd, part.fd, part.position + sent, part.size - sent)
                        if n == 0:
                            raise OSError("the segment ended before the range sent")
                        sent += n
                        server.outgoing_bytes += n
                except BlockingIOError:
                    pass
                except OSError as e:
                    self.close(f"sendfile failed: {e}")
                    return False
            if sent == part.size:
                continue
            rest = [
                FileRecords(part.handle, part.position + sent, part.size - sent),
                *parts[index + 1 :],
            ]
            self._sending_file = True
            self._send_task = asyncio.ensure_future(self._send_rest(rest))
            return False
        self._write_bytes(buffered)
        return True

    def _write_tls_parts(self, parts: list[bytes | FileRecords]) -> bool:
        """On TLS, write a response's parts, file ranges read `TLS_CHUNK` bytes at a time; True
        when all of it went to the transport. Each chunk is written (encrypted and handed to the
        socket) before the next is read, so the client decrypts the start of a large response
        while its rest is encrypted, instead of the two taking turns. When the transport holds
        more than its high-water mark (`pause_writing`), the rest waits for it to drain
        (`_send_tls_rest`): a slow reader does not make the broker encrypt a whole response
        into memory, and other connections are served in between."""
        rest = self._write_tls_some(parts)
        if rest is None:
            return True
        if rest:
            self._sending_file = True
            self._send_task = asyncio.ensure_future(self._send_tls_rest(rest))
        return False

    def _write_tls_some(self, parts: list[bytes | FileRecords]) -> list[bytes | FileRecords] | None:
        """Write parts until the transport pauses writing: None when all are written, else the
        parts left (empty when the connection was closed for a range that cannot be read; part
        of the frame may be out by then)."""
        pending: list[bytes] = []
        try:
            for index, part in enumerate(parts):
                if not isinstance(part, FileRecords):
                    pending.append(part)
                    continue
                fd, position, end = part.fd, part.position, part.position + part.size
                while position < end:
                    size = min(TLS_CHUNK, end - position)
                    data = os.pread(fd, size, position)
                    if len(data) != size:
                        raise OSError(f"segment shrank under a read: {len(data)} of {size} bytes")
                    pending.append(data)
                    self._write_bytes(pending)
                    pending = []
                    position += size
                    if self._writing_paused:
                        rest = parts[index + 1 :]
                        if position < end:
                            rest.insert(0, FileRecords(part.handle, position, end - position))
                        if rest:
                            return rest
        except OSError as e:
            self.close(f"reading records failed: {e}")
            return []
        self._write_bytes(pending)
        return None

    async def _send_tls_rest(self, parts: list[bytes | FileRecords]) -> None:
        """The rest of a TLS response, each time the transport has drained below its low-water
        mark (`resume_writing` sets `_drained`)."""
        rest: list[bytes | FileRecords] | None = parts
        try:
            while rest:
                if self._writing_paused:
                    drained = asyncio.get_running_loop().create_future()
                    self._drained = drained
                    await drained
                if self.state is ConnectionState.CLOSED:
                    return
                rest = self._write_tls_some(rest)
        finally:
            self._drained = None
            self._sending_file = False
            self._send_task = None
        if rest is None:
            self._rest_sent()

    def _write_bytes(self, parts: list[bytes]) -> None:
        if parts:
            require(self._transport, "the connection's transport").writelines(parts)
            self._server.outgoing_bytes += sum(map(len, parts))

    async def _send_rest(self, parts: list[bytes | FileRecords]) -> None:
        """Send the rest of a response whose file range did not fit in the socket: each range
        by sendfile(2) whenever the transport has flushed what it holds and the socket can take
        more; bytes through the transport. Waits on the socket's writability through a second
        descriptor of it (any event loop, uvloop included, refuses a writer on a descriptor its
        transport owns)."""
        transport = require(self._transport, "the connection's transport")
        try:
            for part in parts:
                if self.state is ConnectionState.CLOSED:
                    return
                if not isinstance(part, FileRecords):
                    transport.write(part)
                    self._server.outgoing_bytes += len(part)
                    continue
                position, remaining = part.position, part.size
                while remaining:
                    if self.state is ConnectionState.CLOSED:
                        return
                    sent = -1
                    if transport.get_write_buffer_size() == 0:
                        try:
                            sent = os.sendfile(self._socket_fd, part.fd, position, remaining)
                        except BlockingIOError:
                            sent = -1
                        if sent == 0:
                            raise OSError("the segment ended before the range was sent")
                    if sent > 0:
                        position += sent
                        remaining -= sent
                        self._server.outgoing_bytes += sent
                        continue
                    await self._socket_writable()
        except OSError as e:
            self.close(f"sendfile failed: {e!r}")
            return
        finally:
            self._sending_file = False
            self._send_task = None
        self._rest_sent()

    def _rest_sent(self) -> None:
        """A response that `_send_rest` or `_send_tls_rest` finished: its send is over, and the
        responses queued behind it go out."""
        file_send, self._file_send = self._file_send, None
        if file_send is not None and self.state is not ConnectionState.CLOSED:
            self._handed_over(*file_send)
        if self.state is ConnectionState.OPEN:
            self._write_ready_responses()
            self._update_reading()

    async def _socket_writable(self) -> None:
        if self._poll_fd < 0:
            self._poll_fd = os.dup(self._socket_fd)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not waiter.done():
                waiter.set_result(None)

        loop.add_writer(self._poll_fd, ready)
        try:
            await waiter
        finally:
            if self._poll_fd >= 0:  # closed by connection_lost otherwise
                loop.remove_writer(self._poll_fd)
