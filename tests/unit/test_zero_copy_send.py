"""Responses with file ranges (zero-copy fetch), in process: a socket server whose dispatcher
answers every request with an `EncodedResponse` made of header bytes and ranges of a file, and a
client that reads slowly, so that the socket fills and the rest goes out through
`loop.sendfile`. Pipelined requests must come back whole and in order, on plaintext (sendfile)
and TLS (each range read once, a chunk at a time, and written through the TLS transport); a range whose file shrank
closes the connection rather than send a short frame, on either.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import struct
from pathlib import Path
from typing import Any

import pytest

from odradek.network.connection import ClientConnection
from odradek.network.listener_security import ListenerSecurity
from odradek.network.request_context import RequestContext
from odradek.network.server import SocketServer
from odradek.network.zero_copy_writes import TLS_CHUNK
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, encode_request, request_class
from odradek.protocol.fetch_response import EncodedResponse, FileHandle, FileRecords
from odradek.security.certificates import create_local_pki
from odradek.security.ssl_config import client_context, server_context

API_VERSIONS = int(ApiKey.API_VERSIONS)
CHUNK = 3 << 20  # larger than any socket buffer: forces the asynchronous path


def _frame(correlation_id: int) -> bytes:
    request = build(request_class(API_VERSIONS, 3), {})
    return encode_request(API_VERSIONS, 3, correlation_id, "test", request)


def _pattern(size: int) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(size))


def _dispatcher(fd: int, sizes: list[int]) -> Any:
    def dispatch(context: RequestContext, frame: bytes) -> Any:
        correlation_id = context.header.correlation_id
        size = sizes[(correlation_id - 1) % len(sizes)]
        body = [b"head", FileRecords(FileHandle(fd), 10, size), b"tail"]
        total = 4 + sum(len(p) for p in body)
        return EncodedResponse([struct.pack(">ii", total, correlation_id), *body])

    return dispatch


async def _exchange(port: int, count: int, context: ssl.SSLContext | None) -> list[bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, limit=1 << 16)
    try:
        for correlation_id in range(1, count + 1):
            writer.write(_frame(correlation_id))
        await writer.drain()
        frames = []
        async with asyncio.timeout(60):
            for _ in range(count):
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                frame = b""
                while len(frame) < size:  # read slowly, in small pieces
                    frame += await reader.read(min(65536, size - len(frame)))
                    await asyncio.sleep(0)
                frames.append(frame)
        return frames
    finally:
        writer.close()


def _run(main: Any, loop: str) -> Any:
    """asyncio.run on the default loop or on uvloop (which the broker runs on)."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def _listener(tmp_path: Path, tls: bool) -> tuple[ListenerSecurity, ssl.SSLContext | None]:
    """The server's listener security and the client's TLS context (None: plaintext)."""
    if not tls:
        return ListenerSecurity(), None
    pki = create_local_pki(tmp_path / "pki", [1])
    server_settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.brokers[1].keystore),
    }
    security = ListenerSecurity(
        listener="SSL", security_protocol="SSL", ssl_context=server_context(server_settings)
    )
    client = client_context(
        {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca_certificate)}
    )
    client.check_hostname = False
    return security, client


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("tls", [False, True])
def test_pipelined_file_range_responses_arrive_whole_and_in_order(
    tls: bool, loop: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sendfile_calls = []
    real_sendfile = os.sendfile

    def counting_sendfile(*args: Any) -> int:
        sendfile_calls.append(args[3])
        return real_sendfile(*args)

    monkeypatch.setattr(os, "sendfile", counting_sendfile)
    rests = []
    real_send_rest = ClientConnection._send_rest

    def counting_send_rest(self: ClientConnection, parts: list[Any]) -> Any:
        rests.append(len(parts))
        return real_send_rest(self, parts)

    monkeypatch.setattr(ClientConnection, "_send_rest", counting_send_rest)
    real_send_tls_rest = ClientConnection._send_tls_rest

    def counting_send_tls_rest(self: ClientConnection, parts: list[Any]) -> Any:
        rests.append(len(parts))
        return real_send_tls_rest(self, parts)

    monkeypatch.setattr(ClientConnection, "_send_tls_rest", counting_send_tls_rest)
    writes: list[int] = []
    real_write_bytes = ClientConnection._write_bytes

    def counting_write_bytes(self: ClientConnection, parts: list[bytes]) -> None:
        if parts:
            writes.append(sum(map(len, parts)))
        real_write_bytes(self, parts)

    monkeypatch.setattr(ClientConnection, "_write_bytes", counting_write_bytes)
    data = _pattern(10 + CHUNK + 10)
    path = tmp_path / "segment.log"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    sizes = [CHUNK, 1000, 0, CHUNK // 2]
    security, client = _listener(tmp_path, tls)

    sends: list[tuple[int, int]] = []
    totals: dict[str, int] = {}

    async def main() -> list[bytes]:
        server = SocketServer("127.0.0.1", 0, _dispatcher(fd, sizes), 10 << 20, security=security)
        server.response_sent = lambda api_key, ns: sends.append((api_key, ns))
        await server.start()
        try:
            return await _exchange(server.port, 8, client)
        finally:
            await server.stop()
            totals.update(
                incoming=server.incoming_bytes,
                outgoing=server.outgoing_bytes,
                created=server.connections_created,
                succeeded=server.authentications_succeeded,
            )

    try:
        frames = _run(main(), loop)
    finally:
        os.close(fd)
    # ResponseSendTimeMs: one record per response, whichever way its bytes went (written at
    # once, after the transport drained below its low-water mark, or by the last sendfile).
    assert len(sends) == 8 and all(api == API_VERSIONS and ns >= 0 for api, ns in sends)
    # Byte totals count the frames, not TLS's overhead; sendfile included.
    assert totals["incoming"] == 8 * len(_frame(1))
    assert totals["outgoing"] == sum(4 + len(f) for f in frames)
    assert totals["created"] == totals["succeeded"] == 1
    if tls:
        assert not sendfile_calls  # TLS copies
        # ... a chunk at a time, each written before the next is read: a 3 MiB range goes as
        # 12 writes of at most TLS_CHUNK (plus the header bytes before it), not as one; and
        # the slow reader made the rest of some wait for the transport to drain.
        assert rests
        assert max(writes) <= TLS_CHUNK + 8 + len(b"head")
        assert len(writes) >= 8 + 2 * (CHUNK // TLS_CHUNK)
    else:
        assert sendfile_calls and rests  # both the immediate and the waiting path were used
    for correlation_id, frame in enumerate(frames, start=1):
        size = sizes[(correlation_id - 1) % len(sizes)]
        assert struct.unpack(">i", frame[:4])[0] == correlation_id
        assert frame[4:] == b"head" + data[10 : 10 + size] + b"tail"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("tls", [False, True])
def test_a_range_past_the_end_of_its_file_closes_the_connection(
    tls: bool, loop: str, tmp_path: Path
) -> None:
    security, client = _listener(tmp_path, tls)
    path = tmp_path / "segment.log"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDONLY)

    def dispatch(context: RequestContext, frame: bytes) -> Any:
        body = [FileRecords(FileHandle(fd), 0, 5000)]  # the file holds only 100 bytes
        return EncodedResponse([struct.pack(">ii", 5004, context.header.correlation_id), *body])

    async def main() -> bytes:
        server = SocketServer("127.0.0.1", 0, dispatch, 10 << 20, security=security)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client)
            writer.write(_frame(1))
            await writer.drain()
            received = b""
            async with asyncio.timeout(10):
                with contextlib.suppress(ConnectionError, ssl.SSLError):  # TLS: no close_notify
                    while chunk := await reader.read(65536):
                        received += chunk
            writer.close()
            return received
        finally:
            await server.stop()

    try:
        received = _run(main(), loop)
    finally:
        os.close(fd)
    assert len(received) < 5008  # the frame was cut short and the connection closed
