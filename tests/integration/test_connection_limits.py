"""A client cannot exhaust a broker by opening connections or by sending partial frames (issue 14,
item 6), against a real broker process:

* `max.connections.per.ip`: of a thousand connections from one address only the allowed number
  stays open, the rest are closed at once;
* `connections.max.idle.ms`: the ones that stay open but say nothing are closed after that long,
  and the address can connect again;
* `queued.max.request.bytes`: forty connections announcing 8 MB requests and sending them slowly
  (slowloris) make the broker hold at most the pool plus one socket read per connection, not
  forty times 8 MB; clients sending whole requests are still answered meanwhile.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._wire import WireConnection

PER_IP = 100
IDLE_MS = 3000
POOL = 16 << 20
FRAME = 8 << 20
SLOW_CLIENTS = 40


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def _answers(bootstrap: str) -> bool:
    try:
        with WireConnection.to(bootstrap, timeout=5) as connection:
            return connection.request(ApiKey.API_VERSIONS, 3, {}).error_code == ErrorCode.none
    except (OSError, Exception):
        return False


def test_connection_floods_and_slow_partial_frames_are_bounded(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(
        brokers=1,
        shared_zookeeper=True,
        max_connections_per_ip=PER_IP,
        connections_max_idle_ms=IDLE_MS,
        queued_max_request_bytes=POOL,
        socket_request_max_bytes=FRAME + 1024,
    )
    broker = cluster.brokers[0]
    assert broker.pid is not None
    address = (broker.host, broker.port)

    # 1. A thousand connections: only max.connections.per.ip stay open.
    sockets = []
    for _ in range(1000):
        sock = socket.create_connection(address, timeout=5)
        sockets.append(sock)
    wait_until(
        lambda: sum(_closed(s) for s in sockets) >= 1000 - PER_IP,
        10,
        "connections beyond the per-address limit closed",
    )
    open_ones = [s for s in sockets if not _closed(s)]
    assert len(open_ones) <= PER_IP, len(open_ones)
    assert not _answers(broker.bootstrap)  # the address is at its limit

    # 2. Idle connections are closed after connections.max.idle.ms; the address may come back.
    wait_until(lambda: all(_closed(s) for s in open_ones), IDLE_MS / 1000 + 10, "idle closed")
    for sock in sockets:
        sock.close()
    wait_until(lambda: _answers(broker.bootstrap), 10, "the broker answering again")

    # 3. Slow partial frames: memory stays near the pool, whatever the announced sizes.
    baseline = _rss_bytes(broker.pid)
    slow = []
    for _ in range(SLOW_CLIENTS):
        sock = socket.create_connection(address, timeout=5)
        sock.setblocking(False)
        sock.send(FRAME.to_bytes(4, "big"))
        slow.append(sock)
    chunk = b"\0" * (256 << 10)
    sent = dict.fromkeys(slow, 0)
    peak = baseline
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:  # all but the last byte, as fast as the broker takes it
        for sock in slow:
            left = FRAME - 1 - sent[sock]
            if left <= 0:
                continue
            # (A muted connection is idle for connections.max.idle.ms and closed: fine.)
            with contextlib.suppress(BlockingIOError, InterruptedError, ConnectionError):
                sent[sock] += sock.send(chunk[:left])
        peak = max(peak, _rss_bytes(broker.pid))
        time.sleep(0.01)
    grown = peak - baseline
    print(
        f"{sum(sent.values()) / (1 << 20):.0f} MiB sent by {SLOW_CLIENTS} slow clients: the "
        f"broker's memory grew by at most {grown / (1 << 20):.1f} MiB"
    )
    # Without the pool the broker would hold most of SLOW_CLIENTS x FRAME (320 MB) by now.
    assert grown < POOL + SLOW_CLIENTS * (1 << 20) + (24 << 20), grown
    assert _answers(broker.bootstrap)  # a whole small request is served meanwhile
    for sock in slow:
        sock.close()
    wait_until(lambda: _answers(broker.bootstrap), 10, "the broker after the slow clients")
