"""The broker's HTTP endpoints (`metrics.listener=http://HOST:PORT`), off the request path.

One small WSGI server (prometheus_client's, thread per request) on its own daemon threads serves:

* `/metrics` (any path not below, as prometheus_client does): Prometheus text. A scrape asks the
  broker's event loop for a snapshot (`snapshot.collect`, which reads the components the loop owns,
  so no lock is needed), waits for it on the HTTP thread, and formats the text there: the loop
  spends only the snapshot's time per scrape, and a slow scraper never holds it. The text, in
  the format the Accept header chooses as prometheus_client does (the 0.0.4 text by default,
  OpenMetrics for a Prometheus server), is written by `text.TextFormat`, whose caches of what did
  not change since the last scrape make it a fraction of prometheus_client's cost, with the same
  bytes, status and headers as prometheus_client's app (which still answers OPTIONS). A scrape with
  `name[]` parameters gets only those samples, one with `topic=` (and `partition=`) only that
  topic's (see `filters`), and the snapshot builds only what they need.
* JSON endpoints (`JsonEndpoint`, e.g. `/state-changes`, `/controller-events`): the parameters
  are checked on the HTTP thread, a copy of the state is taken on the loop (cheap: it copies a
  bounded ring), and it is encoded on the HTTP thread.

A bad query parameter gets 400 and a one-line reason; a snapshot that does not arrive in time, 503.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit
from wsgiref.simple_server import make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import Metric
from prometheus_client.exposition import (
    ThreadingWSGIServer,
    _get_best_family,
    _SilentHandler,
    choose_encoder,
    gzip_accepted,
)
from prometheus_client.registry import Collector, CollectorRegistry

from odradek.errors import OperatorError
from odradek.server.metrics.filters import BadQuery, ReplicaFilter, parse_replica_filter
from odradek.server.metrics.text import TextFormat
from odradek.server.metrics.timers import Deferred, expand

log = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT_S = 10.0
# More query fields than any of our endpoints takes (name[] lists a few dozen at most).
MAX_QUERY_FIELDS = 200
# Text formats (content types: the 0.0.4 text, OpenMetrics' versions and escapings) with caches
# kept; a scraper asking for yet another gets prometheus_client's answer, uncached.
MAX_TEXT_FORMATS = 8
# A Prometheus server asks for gzip. prometheus_client compresses at level 9: 2.4 ms of CPU for a
# broker's 110 KB text here, 8.2 KB out; level 1 takes 0.4 ms for 10.3 KB (the same text once
# decompressed; the gzip bytes were never the same twice anyway, they carry the time).
GZIP_LEVEL = 1


def parse_metrics_listener(value: str) -> tuple[str, int]:
    """`http://HOST:PORT` -> (host, port); an empty host listens on all interfaces."""
    parts = urlsplit(value.strip())
    if parts.scheme != "http" or parts.port is None or parts.path not in ("", "/"):
        raise OperatorError(f"metrics.listener must be http://HOST:PORT, not {value!r}")
    return parts.hostname or "0.0.0.0", parts.port


# snapshot(names, replicas): every family, or only the named samples, of only some replicas;
# `Deferred` items are built on the HTTP thread (`timers.expand`).
Snapshot = Callable[[Collection[str] | None, ReplicaFilter | None], list[Metric | Deferred]]
# A JSON endpoint: given the query's parameters (HTTP thread; raises BadQuery), a function to run
# on the event loop whose JSON-serialisable result is the answer.
JsonEndpoint = Callable[[Mapping[str, Sequence[str]]], Callable[[], Any]]


class _LoopSnapshot(Collector):
    """Collects by running `snapshot` on `loop` and waiting for it (HTTP thread); `names`
    restricts it to the samples a scrape's `name[]` parameters ask for, `replicas` to a topic."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        snapshot: Snapshot,
        names: Collection[str] | None = None,
        replicas: ReplicaFilter | None = None,
    ):
        self._loop = loop
        self._snapshot = snapshot
        self._names = names
        self._replicas = replicas

    def collect(self) -> Iterator[Metric]:
        async def on_loop() -> list[Metric | Deferred]:
            return self._snapshot(self._names, self._replicas)

        future = asyncio.run_coroutine_threadsafe(on_loop(), self._loop)
        yield from expand(future.result(timeout=SNAPSHOT_TIMEOUT_S))


class _SnapshotRegistry(CollectorRegistry):
    """The exporter's registry: prometheus_client's HTTP handler calls `restricted_registry`
    for a scrape with `name[]` parameters (`/metrics?name[]=kafka_..._value&name[]=...`, as a
    Prometheus job's `params` sends them); the broker then builds only what was asked for (see
    `snapshot.collect`) instead of building everything and filtering."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        snapshot: Snapshot,
        replicas: ReplicaFilter | None = None,
    ) -> None:
        super().__init__(auto_describe=False)
        self._loop = loop
        self._full_snapshot = snapshot
        self._replicas = replicas
        self.register(_LoopSnapshot(loop, snapshot, None, replicas))

    def restricted_registry(self, names: Iterable[str]) -> Any:
        collector = _LoopSnapshot(self._loop, self._full_snapshot, frozenset(names), self._replicas)
        return _Restricted(collector)


class _Restricted:
    def __init__(self, collector: _LoopSnapshot) -> None:
        self._collector = collector

    def collect(self) -> Iterator[Metric]:
        return self._collector.collect()


def _answer(start_response: Any, status: str, body: bytes, content_type: str) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
    return [body]


def _text(start_response: Any, status: str, message: str) -> list[bytes]:
    return _answer(start_response, status, (message + "\n").encode(), "text/plain; charset=utf-8")


class MetricsExporter:
    """Serves `snapshot(names, replicas)` (run on the loop thread) at http://host:port/metrics,
    and each of `json_endpoints` at its path."""

    def __init__(
        self,
        host: str,
        port: int,
        snapshot: Snapshot,
        json_endpoints: Mapping[str, JsonEndpoint] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._snapshot = snapshot
        self._json_endpoints = dict(json_endpoints or {})
        self._server: object | None = None
        self._thread: threading.Thread | None = None
        # Content type -> the TextFormat of its encoder (`_metrics_text`).
        self._text_formats: dict[str, TextFormat] = {}

    def start(self) -> None:
        """Bind and serve; call from the broker's event loop."""
        app = self._app(asyncio.get_running_loop())

        class Server(ThreadingWSGIServer):
            """prometheus_client's server, with the address family of `host` (IPv6 too)."""

        try:
            Server.address_family, address = _get_best_family(self.host, self.port)
            server = make_server(address, self.port, app, Server, handler_class=_SilentHandler)
        except OSError as e:
            raise OperatorError(
                f"cannot listen for metrics on {self.host}:{self.port}: {e}"
            ) from None
        thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        self._server, self._thread = server, thread
        self.port = server.server_port
        log.info("metrics at http://%s:%d/metrics", self.host, self.port)

    def _app(self, loop: asyncio.AbstractEventLoop) -> Callable[[Any, Any], list[bytes]]:
        """The WSGI application (HTTP threads)."""
        metrics = make_wsgi_app(_SnapshotRegistry(loop, self._snapshot))

        def app(environ: Any, start_response: Any) -> list[bytes]:
            path = environ.get("PATH_INFO", "")
            if environ.get("REQUEST_METHOD") not in ("GET", "OPTIONS"):
                return _text(start_response, "405 Method Not Allowed", "use GET")
            try:
                # Blank values kept: `topic=` is a mistake to point out, not "no filter".
                params = parse_qs(
                    environ.get("QUERY_STRING", ""),
                    keep_blank_values=True,
                    max_num_fields=MAX_QUERY_FIELDS,
                )
            except ValueError as e:
                return _text(start_response, "400 Bad Request", f"bad query: {e}")
            endpoint = self._json_endpoints.get(path)
            if endpoint is not None:
                return self._json(loop, endpoint, params, start_response)
            try:
                replicas = parse_replica_filter(params)
            except BadQuery as e:
                return _text(start_response, "400 Bad Request", str(e))
            answer = self._metrics_text(loop, environ, replicas, start_response)
            if answer is not None:
                return answer
            if replicas is None:
                return metrics(environ, start_response)  # type: ignore[no-any-return]
            filtered = make_wsgi_app(_SnapshotRegistry(loop, self._snapshot, replicas))
            return filtered(environ, start_response)  # type: ignore[no-any-return]

        return app

    def _metrics_text(
        self,
        loop: asyncio.AbstractEventLoop,
        environ: Any,
        replicas: ReplicaFilter | None,
        start_response: Any,
    ) -> list[bytes] | None:
        """What prometheus_client's app answers a GET of the metrics (status, headers, body), in
        the format the Accept header chooses, the text written by that format's `TextFormat`
        (its caches make a scrape cheaper); None if the app is to answer (OPTIONS,
        /favicon.ico, more formats asked for than `MAX_TEXT_FORMATS`)."""
        if environ.get("REQUEST_METHOD") != "GET" or environ.get("PATH_INFO") == "/favicon.ico":
            return None
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT"))
        text_format = self._text_formats.get(content_type)
        if text_format is None:
            # The content type names the format's version and escaping, which a client chooses.
            if len(self._text_formats) >= MAX_TEXT_FORMATS:
                return None
            text_format = self._text_formats.setdefault(content_type, TextFormat(encoder))
        # As prometheus_client reads `name[]`: blank values dropped.
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        collector = _LoopSnapshot(
            loop, self._snapshot, frozenset(names) if names is not None else None, replicas
        )
        output = text_format.render(collector.collect())
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING")):
            output = gzip.compress(output, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [output]

    @staticmethod
    def _json(
        loop: asyncio.AbstractEventLoop,
        endpoint: JsonEndpoint,
        params: Mapping[str, Sequence[str]],
        start_response: Any,
    ) -> list[bytes]:
        try:
            on_loop = endpoint(params)
        except BadQuery as e:
            return _text(start_response, "400 Bad Request", str(e))

        async def run() -> Any:
            return on_loop()

        try:
            value = asyncio.run_coroutine_threadsafe(run(), loop).result(SNAPSHOT_TIMEOUT_S)
        except TimeoutError:
            return _text(start_response, "503 Service Unavailable", "the broker did not answer")
        except Exception as e:
            log.exception("JSON endpoint failed")
            return _text(start_response, "500 Internal Server Error", f"{type(e).__name__}: {e}")
        body = json.dumps(value, separators=(",", ":")).encode()
        return _answer(start_response, "200 OK", body, "application/json")

    async def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._server = self._thread = None
        # shutdown() waits for the serving thread, which may be waiting for this loop: off-loop.
        await asyncio.to_thread(server.shutdown)  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]
        await asyncio.to_thread(thread.join, SNAPSHOT_TIMEOUT_S)
