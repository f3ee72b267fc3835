"""The socket server on a TLS listener, in process, against real TLS clients: big requests and
responses read slowly (partial writes, back-pressure), the client certificate's DN as the principal
with `ssl.client.auth=required|requested`, and a handshake that times out giving its connection
slot back. A `SocketServer` with a dispatcher that echoes each request runs on the test's event loop
(the default one, or uvloop as in the broker); clients are asyncio streams. No broker, no ZooKeeper.
(`tests/unit/test_socket_server.py` has the plaintext limits and failed handshakes.)
"""

from __future__ import annotations

import asyncio
import os
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from odradek.network.listener_security import ListenerSecurity
from odradek.network.quotas import ConnectionQuotas
from odradek.network.request_context import RequestContext
from odradek.network.server import SocketServer
from odradek.protocol.fetch_response import EncodedResponse
from odradek.security.certificates import LocalPki, create_local_pki
from odradek.security.principal_mapping import SslPrincipalMapper, principal_from_certificate
from odradek.security.ssl_config import client_context, server_context

CLIENT_DN_PRINCIPAL = "User:CN=client,OU=clients,O=Odradek"


@dataclass(frozen=True)
class Contexts:
    pki: LocalPki

    def server(self, client_auth: str = "none") -> ssl.SSLContext:
        return server_context(
            {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self.pki.brokers[1].keystore),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.pki.ca_certificate),
                "ssl.client.auth": client_auth,
            }
        )

    def client(self, with_certificate: bool = False) -> ssl.SSLContext:
        settings = {
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.pki.ca_certificate),
        }
        if with_certificate:
            assert self.pki.client is not None
            settings.update(
                {
                    "ssl.keystore.type": "PEM",
                    "ssl.keystore.location": str(self.pki.client.keystore),
                }
            )
        return client_context(settings)


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> Contexts:
    return Contexts(create_local_pki(tmp_path_factory.mktemp("pki"), [1]))


def _run(main: Any, loop: str) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def _echo_dispatch(principals: list[str]) -> Any:
    """Answers every request with its own frame (correlation id, then the request's bytes)."""

    def dispatch(context: RequestContext, frame: bytes) -> Any:
        principals.append(context.principal)
        size = 4 + len(frame)
        return EncodedResponse([struct.pack(">ii", size, context.header.correlation_id), frame])

    return dispatch


def _request(correlation_id: int, body: bytes) -> bytes:
    # a v1 request header (api key, version, correlation id, client id) and then the body
    header = struct.pack(">hhih", 18, 0, correlation_id, 4) + b"test"
    return struct.pack(">i", len(header) + len(body)) + header + body


@asynccontextmanager
async def _server(
    security: ListenerSecurity, principals: list[str], **options: Any
) -> AsyncIterator[SocketServer]:
    server = SocketServer(
        "127.0.0.1", 0, _echo_dispatch(principals), 32 << 20, security=security, **options
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _read_frames(reader: asyncio.StreamReader, count: int) -> list[tuple[int, bytes]]:
    frames = []
    async with asyncio.timeout(60):
        for _ in range(count):
            size, correlation_id = struct.unpack(">ii", await reader.readexactly(8))
            body = bytearray()
            while len(body) < size - 4:  # slowly, in small pieces
                body += await reader.read(min(1 << 16, size - 4 - len(body)))
                await asyncio.sleep(0)
            frames.append((correlation_id, bytes(body)))
    return frames


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_big_requests_and_responses_through_the_socket_server(
    contexts: Contexts, loop: str
) -> None:
    security = ListenerSecurity("SSL", "SSL", ssl_context=contexts.server())
    bodies = [os.urandom(size) for size in (9 << 20, 100, 5 << 20)]

    async def main() -> None:
        principals: list[str] = []
        async with _server(security, principals) as server:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.port, ssl=contexts.client(), limit=1 << 16
            )
            for correlation_id, body in enumerate(bodies, 1):
                writer.write(_request(correlation_id, body))
            frames = await _read_frames(reader, len(bodies))
            assert [correlation_id for correlation_id, _ in frames] == [1, 2, 3]
            for (_, frame), body in zip(frames, bodies, strict=True):
                assert frame.endswith(body)
            assert principals == ["User:ANONYMOUS"] * 3
            writer.close()
            await _until(lambda: not server.connections)

    _run(main(), loop)


def test_client_certificates_give_the_principal_and_required_ones_are_enforced(
    contexts: Contexts,
) -> None:
    mapper = SslPrincipalMapper(None)

    def principal(der: bytes | None) -> str:
        return str(principal_from_certificate(der, mapper))

    async def main() -> None:
        for client_auth, expected in (("required", CLIENT_DN_PRINCIPAL), ("requested", None)):
            security = ListenerSecurity(
                "SSL",
                "SSL",
                ssl_context=contexts.server(client_auth),
                principal_for_certificate=principal,
            )
            principals: list[str] = []
            async with _server(security, principals) as server:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", server.port, ssl=contexts.client(with_certificate=True)
                )
                writer.write(_request(1, b"who"))
                await _read_frames(reader, 1)
                writer.close()
                assert principals == [CLIENT_DN_PRINCIPAL]

                try:  # no certificate
                    reader, writer = await asyncio.open_connection(
                        "127.0.0.1", server.port, ssl=contexts.client()
                    )
                    writer.write(_request(2, b"who"))
                    answered = len(await _read_frames(reader, 1)) == 1
                    writer.close()
                except (OSError, asyncio.IncompleteReadError):
                    answered = False
                if expected is None:  # requested: anonymous
                    assert answered
                    assert principals[-1] == "User:ANONYMOUS"
                else:
                    assert not answered
                    await _until(lambda: server.handshakes_failed == 1)
                    assert principals == [CLIENT_DN_PRINCIPAL]

    asyncio.run(main())


def test_a_handshake_that_times_out_gives_its_slot_back(contexts: Contexts) -> None:
    security = ListenerSecurity(
        "SSL", "SSL", ssl_context=contexts.server(), ssl_handshake_timeout=0.3
    )

    async def main() -> None:
        quotas = ConnectionQuotas(max_connections_per_ip=1)
        async with _server(security, [], quotas=quotas) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            await _until(lambda: quotas.count("127.0.0.1") == 1)
            async with asyncio.timeout(3):  # closed by the server once the handshake times out
                assert await reader.read(1) == b""
            assert server.handshakes_failed == 1
            await _until(lambda: quotas.count("127.0.0.1") == 0)
            writer.close()
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.port, ssl=contexts.client()
            )
            writer.write(_request(1, b"again"))
            assert (await _read_frames(reader, 1))[0][0] == 1
            writer.close()

    asyncio.run(main())
