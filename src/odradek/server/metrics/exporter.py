"""The `/metrics` HTTP endpoint (`metrics.listener=http://HOST:PORT`), off the request path.

prometheus_client's HTTP server runs on its own daemon thread. A scrape asks the broker's event
loop for a snapshot (`snapshot.collect`, which reads the components the loop owns, so no lock is
needed), waits for it on the HTTP thread, and formats the text there: the loop spends only the
snapshot's time per scrape, and a slow scraper never holds it. A scrape with `name[]` parameters
gets only those samples, and the snapshot builds only what they need.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from odradek.errors import OperatorError

log = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT_S = 10.0


def parse_metrics_listener(value: str) -> tuple[str, int]:
    """`http://HOST:PORT` -> (host, port); an empty host listens on all interfaces."""
    parts = urlsplit(value.strip())
    if parts.scheme != "http" or parts.port is None or parts.path not in ("", "/"):
        raise OperatorError(f"metrics.listener must be http://HOST:PORT, not {value!r}")
    return parts.hostname or "0.0.0.0", parts.port


Snapshot = Callable[[Collection[str] | None], list[Metric]]


class _LoopSnapshot(Collector):
    """Collects by running `snapshot` on `loop` and waiting for it (HTTP thread); `names`
    restricts it to the samples a scrape's `name[]` parameters ask for."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        snapshot: Snapshot,
        names: Collection[str] | None = None,
    ):
        self._loop = loop
        self._snapshot = snapshot
        self._names = names

    def collect(self) -> Iterator[Metric]:
        async def on_loop() -> list[Metric]:
            return self._snapshot(self._names)

        future = asyncio.run_coroutine_threadsafe(on_loop(), self._loop)
        yield from future.result(timeout=SNAPSHOT_TIMEOUT_S)


class _SnapshotRegistry(CollectorRegistry):
    """The exporter's registry: prometheus_client's HTTP handler calls `restricted_registry`
    for a scrape with `name[]` parameters (`/metrics?name[]=kafka_..._value&name[]=...`, as a
    Prometheus job's `params` sends them); the broker then builds only what was asked for (see
    `snapshot.collect`) instead of building everything and filtering."""

    def __init__(self, loop: asyncio.AbstractEventLoop, snapshot: Snapshot) -> None:
        super().__init__(auto_describe=False)
        self._loop = loop
        self._full_snapshot = snapshot
        self.register(_LoopSnapshot(loop, snapshot))

    def restricted_registry(self, names: Iterable[str]) -> Any:
        return _Restricted(_LoopSnapshot(self._loop, self._full_snapshot, frozenset(names)))


class _Restricted:
    def __init__(self, collector: _LoopSnapshot) -> None:
        self._collector = collector

    def collect(self) -> Iterator[Metric]:
        return self._collector.collect()


class MetricsExporter:
    """Serves `snapshot()` (run on the loop thread) at http://host:port/metrics."""

    def __init__(self, host: str, port: int, snapshot: Snapshot) -> None:
        """`snapshot(names)`: every family (names None) or only the named samples."""
        self.host = host
        self.port = port
        self._snapshot = snapshot
        self._server: object | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve; call from the broker's event loop."""
        registry = _SnapshotRegistry(asyncio.get_running_loop(), self._snapshot)
        try:
            server, thread = start_http_server(self.port, addr=self.host, registry=registry)
        except OSError as e:
            raise OperatorError(
                f"cannot listen for metrics on {self.host}:{self.port}: {e}"
            ) from None
        self._server, self._thread = server, thread
        self.port = server.server_port
        log.info("metrics at http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._server = self._thread = None
        # shutdown() waits for the serving thread, which may be waiting for this loop: off-loop.
        await asyncio.to_thread(server.shutdown)  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]
        await asyncio.to_thread(thread.join, SNAPSHOT_TIMEOUT_S)
