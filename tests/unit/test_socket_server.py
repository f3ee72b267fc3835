"""The socket server's limits and TLS, in process: connection limits (`max.connections`,
`max.connections.per.ip`), idle connections (`connections.max.idle.ms`), the request memory pool
(`queued.max.request.bytes`) and failed TLS handshakes giving their slot back.

A server with a trivial dispatcher (it answers ApiVersions) runs on the test's event loop; clients
are asyncio streams. No broker, no ZooKeeper.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from odradek.network.listener_security import ListenerSecurity
from odradek.network.quotas import ConnectionQuotas, MemoryPool, parse_overrides
from odradek.network.request_context import RequestContext
from odradek.network.server import SocketServer
from odradek.protocol.build import build, build_response
from odradek.protocol.codec import ApiKey, decode_response, encode_request, request_class
from odradek.security.certificates import create_local_pki
from odradek.security.ssl_config import client_context, server_context

API_VERSIONS = int(ApiKey.API_VERSIONS)


def _dispatch(context: RequestContext, frame: bytes) -> Any:
    return build_response(context.header, {"error_code": 0, "api_keys": [], "throttle_time": 0})


def _api_versions_frame(correlation_id: int = 1) -> bytes:
    request = build(request_class(API_VERSIONS, 3), {})
    return encode_request(API_VERSIONS, 3, correlation_id, "test", request)


@asynccontextmanager
async def _server(**options: Any) -> AsyncIterator[SocketServer]:
    server = SocketServer(
        "127.0.0.1", 0, _dispatch, options.pop("max_request_bytes", 10 << 20), **options
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _open(server: SocketServer, context: ssl.SSLContext | None = None) -> Any:
    return await asyncio.open_connection("127.0.0.1", server.port, ssl=context)


async def _answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Does the server answer an ApiVersions request on this connection?"""
    try:
        writer.write(_api_versions_frame())
        await writer.drain()
        async with asyncio.timeout(5):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            frame = await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        return False
    correlation_id, _ = decode_response(API_VERSIONS, 3, frame)
    return correlation_id == 1


async def _closed_by_server(reader: asyncio.StreamReader, timeout: float = 5) -> bool:
    try:
        async with asyncio.timeout(timeout):
            return await reader.read(1) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def _until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def test_per_ip_limit_refuses_extra_connections_until_one_closes() -> None:
    async def run() -> None:
        async with _server(quotas=ConnectionQuotas(max_connections_per_ip=2)) as server:
            first, second = await _open(server), await _open(server)
            assert await _answered(*first) and await _answered(*second)
            third = await _open(server)
            assert await _closed_by_server(third[0])
            assert server.quotas.refused == 1
            first[1].close()
            await _until(lambda: server.quotas.count("127.0.0.1") == 1)
            fourth = await _open(server)
            assert await _answered(*fourth)
            for _, writer in (second, fourth):
                writer.close()

    asyncio.run(run())


def test_broker_wide_limit_spares_the_inter_broker_listener() -> None:
    async def run() -> None:
        quotas = ConnectionQuotas(max_connections=1, protected_listener="INTERNAL")
        internal = ListenerSecurity(listener="INTERNAL")
        async with (
            _server(quotas=quotas) as clients,
            _server(quotas=quotas, security=internal) as brokers,
        ):
            first = await _open(clients)
            assert await _answered(*first)
            assert await _closed_by_server((await _open(clients))[0])
            between_brokers = [await _open(brokers) for _ in range(3)]
            for streams in between_brokers:
                assert await _answered(*streams)
            for _, writer in [first, *between_brokers]:
                writer.close()

    asyncio.run(run())


def test_overrides_parse_addresses_and_names() -> None:
    assert parse_overrides("127.0.0.1:5, [::1]:7,localhost:3")["127.0.0.1"] == 3
    assert parse_overrides("[::1]:7")["::1"] == 7
    with pytest.raises(Exception, match="host:count"):
        parse_overrides("127.0.0.1")


def test_idle_connections_are_closed_busy_ones_are_not() -> None:
    async def run() -> None:
        async with _server(connections_max_idle_ms=300) as server:
            idle = await _open(server)
            busy = await _open(server)
            for _ in range(6):  # 1.2 s of activity on one connection
                assert await _answered(*busy)
                await asyncio.sleep(0.2)
            assert await _closed_by_server(idle[0], timeout=2)
            assert await _answered(*busy)
            busy[1].close()

    asyncio.run(run())


def test_memory_pool_mutes_connections_that_start_frames_beyond_it() -> None:
    """Two clients announce 4 MB requests against a 1 MB pool and send part of them: the first
    reserves (a reservation succeeds while any memory is free), the second stops being read;
    when the first frame is answered the second is read again. A complete small request is
    always served."""

    async def run() -> None:
        pool = MemoryPool(1 << 20)
        async with _server(memory_pool=pool) as server:
            size = 4 << 20
            frame = _api_versions_frame()
            body = frame[4:] + b"\0" * (size - len(frame) + 4)
            first, second = await _open(server), await _open(server)
            first[1].write(struct.pack(">i", size) + body[:1000])
            await first[1].drain()
            await _until(lambda: pool.used >= size)
            second[1].write(struct.pack(">i", size) + body[:1000])
            await second[1].drain()
            await _until(lambda: pool.waiting == 1)
            # The muted connection's later bytes stay in the kernel, not in the broker.
            second[1].write(body[1000 : 1 << 20])
            await asyncio.sleep(0.3)
            buffered = max(c._decoder.buffered for c in server.connections)
            assert buffered < 300_000, buffered
            assert await _answered(*(await _open(server)))  # small requests still served
            first[1].write(body[1000:])
            await first[1].drain()
            assert struct.unpack(">i", await first[0].readexactly(4))[0] > 0
            await _until(lambda: pool.waiting == 0)
            second[1].write(body[1 << 20 :])
            await second[1].drain()
            assert struct.unpack(">i", await second[0].readexactly(4))[0] > 0
            await _until(lambda: pool.used == 0)

    asyncio.run(run())


def test_failed_tls_handshakes_give_their_slot_back(tmp_path: Path) -> None:
    pki = create_local_pki(tmp_path, [1])
    server_settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.brokers[1].keystore),
    }
    security = ListenerSecurity(
        listener="SSL", security_protocol="SSL", ssl_context=server_context(server_settings)
    )
    trusting = client_context(
        {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca_certificate)}
    )

    async def run() -> None:
        quotas = ConnectionQuotas(max_connections_per_ip=2)
        async with _server(security=security, quotas=quotas) as server:
            for _ in range(5):  # plaintext bytes on a TLS listener
                reader, writer = await _open(server)
                writer.write(_api_versions_frame())
                assert await _closed_by_server(reader)
                writer.close()
            await _until(lambda: quotas.count("127.0.0.1") == 0)
            assert server.handshakes_failed == 5
            assert await _answered(*(await _open(server, trusting)))

    asyncio.run(run())


def test_a_throttled_connection_is_muted_after_its_response() -> None:
    """KIP-219: a handler that throttles its request is answered at once, then the connection
    reads nothing more for the throttle time; other connections are not held."""

    async def run() -> None:
        throttle_ms = 400
        sizes: list[int] = []

        def throttling(context: RequestContext, frame: bytes) -> Any:
            sizes.append(context.size)
            if context.header.correlation_id == 1 and context.throttle is not None:
                context.throttle(throttle_ms)
            return _dispatch(context, frame)

        async def round_trip(reader: Any, writer: Any, correlation_id: int) -> float:
            started = asyncio.get_running_loop().time()
            writer.write(_api_versions_frame(correlation_id))
            await writer.drain()
            async with asyncio.timeout(5):
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                await reader.readexactly(size)
            return asyncio.get_running_loop().time() - started

        server = SocketServer("127.0.0.1", 0, throttling, 10 << 20)
        await server.start()
        try:
            reader, writer = await _open(server)
            other_reader, other_writer = await _open(server)
            assert await round_trip(reader, writer, 1) < throttle_ms / 1000  # answered at once
            assert await round_trip(other_reader, other_writer, 2) < throttle_ms / 1000
            waited = await round_trip(reader, writer, 3)  # read only once the mute is over
            assert waited >= 0.8 * throttle_ms / 1000
            assert sizes[0] == len(_api_versions_frame(1)) - 4
            writer.close()
            other_writer.close()
        finally:
            await server.stop()

    asyncio.run(run())
