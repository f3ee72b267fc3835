"""Kafka's RequestMetrics per API: RequestsPerSec, ErrorsPerSec and the request times.

Kafka times a request through its queues and threads. Odradek has no request queue or handler
thread pool: the connection decodes the frames of each read off the socket and hands them to the
dispatcher one after the other, on the event loop. What is measured, per API, each as a histogram
(`odradek.histogram`: count, mean, max and Kafka's percentiles):

* RequestQueueTimeMs: from the read that completed the request's frame (`RequestContext.received_ns`)
  to its handler starting: the frames before it in the same read (pipelined requests on one
  connection, handled in order), and throttled connections' held frames (KIP-219 mutes);
* LocalTimeMs: the handler's synchronous part (decode, validate, append, read);
* RemoteTimeMs: the wait after it (acks=all replication, a fetch's max.wait, a rebalance);
* TotalTimeMs: the three, from the read until the response is ready to be written (the send is
  not included: it is measured apart, by the connection);
* ResponseSendTimeMs: recorded by the connection (`response_sent`): from taking the ready response
  at the head of its queue (responses go out in request order) to its bytes being handed to the
  transport -- encoding and `write` -- or, when the socket did not take them at once, to the
  transport's buffer draining below its low-water mark (`resume_writing`) or a file range's last
  `sendfile` (zero-copy fetches).

ErrorsPerSec{request, error}: the response's top-level `error_code` (`NONE` included, as Kafka
does), for the APIs whose responses have one; a handler that raised counts as
`UNKNOWN_SERVER_ERROR`. Per-partition codes (Produce, Fetch, ...) are not walked -- that is per
partition work on the request path; BrokerTopicMetrics' Failed*RequestsPerSec count those.

Per request: three clock reads, four histogram records (a few integer operations each, no per-record
or per-partition work) and a dict increment for the error code; no lock (event loop thread only).
"""

from __future__ import annotations

import asyncio
import inspect
import time
import types
from collections.abc import Callable
from typing import Any

from odradek.histogram import LatencyHistogram
from odradek.network.request_context import RequestContext

Dispatch = Callable[[RequestContext, bytes], Any]

# The code a handler that raised is counted under (Kafka answers those UNKNOWN_SERVER_ERROR).
UNKNOWN_SERVER_ERROR = -1

_now_ns = time.perf_counter_ns

# inspect.isawaitable by the result's type: its check of an ordinary response against the
# Awaitable ABC costs more than all the timing here. Generators are asked each time (whether
# one is awaitable depends on its code's flags, not its type).
_AWAITABLE_BY_TYPE: dict[type, bool] = {}


def _is_awaitable(value: Any) -> bool:
    kind = type(value)
    found = _AWAITABLE_BY_TYPE.get(kind)
    if found is None:
        found = inspect.isawaitable(value)
        if kind is not types.GeneratorType:
            _AWAITABLE_BY_TYPE[kind] = found
    return found


class ApiRequestStats:
    """One API's counts and time histograms (nanoseconds)."""

    __slots__ = (
        "errors",
        "local",
        "queue",
        "remote",
        "requests",
        "response_send",
        "total",
    )

    def __init__(self) -> None:
        self.requests = 0
        # error code (int or kio ErrorCode) -> responses with it
        self.errors: dict[Any, int] = {}
        self.queue = LatencyHistogram()
        self.local = LatencyHistogram()
        self.remote = LatencyHistogram()
        self.total = LatencyHistogram()
        self.response_send = LatencyHistogram()

    def completed(self, received: int, local_done: int, response: Any) -> None:
        now = _now_ns()
        self.remote.record_ns(now - local_done)
        self.total.record_ns(now - received)
        code = getattr(response, "error_code", None)
        if code is not None:
            errors = self.errors
            errors[code] = errors.get(code, 0) + 1

    def failed(self) -> None:
        errors = self.errors
        errors[UNKNOWN_SERVER_ERROR] = errors.get(UNKNOWN_SERVER_ERROR, 0) + 1


class RequestMetrics:
    """Per-API request stats, and the dispatch wrapper that keeps them. Event loop thread only."""

    def __init__(self) -> None:
        self.by_api: dict[int, ApiRequestStats] = {}

    def stats(self, api_key: int) -> ApiRequestStats:
        found = self.by_api.get(api_key)
        if found is None:
            found = self.by_api[api_key] = ApiRequestStats()
        return found

    def response_sent(self, api_key: int, send_ns: int) -> None:
        """The connection's measure of one response's send (see the module docstring)."""
        self.stats(api_key).response_send.record_ns(send_ns)

    def metered(self, dispatch: Dispatch) -> Dispatch:
        """`dispatch`, timing each request into the stats of its API."""

        def metered_dispatch(context: RequestContext, frame: bytes) -> Any:
            stats = self.stats(context.header.api_key)
            stats.requests += 1
            started = _now_ns()
            received = context.received_ns or started
            stats.queue.record_ns(started - received)
            try:
                result = dispatch(context, frame)
            except Exception:
                stats.failed()
                raise
            local_done = _now_ns()
            stats.local.record_ns(local_done - started)
            if _is_awaitable(result):
                future = asyncio.ensure_future(result)
                future.add_done_callback(lambda f: _on_done(f, stats, received, local_done))
                return future
            stats.completed(received, local_done, result)
            return result

        return metered_dispatch


def _on_done(
    future: asyncio.Future[Any], stats: ApiRequestStats, received: int, local_done: int
) -> None:
    if future.cancelled():  # the connection closed: no response, no error to count
        return
    if future.exception() is not None:
        stats.failed()
    else:
        stats.completed(received, local_done, future.result())
