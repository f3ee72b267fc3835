"""Kafka's RequestMetrics per API: RequestsPerSec, TotalTimeMs, LocalTimeMs, RemoteTimeMs.

Kafka times a request through its queues and threads. Odradek has no request queue or handler
thread pool: a request is dispatched on the event loop as soon as its frame is read, so
RequestQueueTimeMs is not measured (it would always read 0). What is measured, per API:

* LocalTimeMs: the handler's synchronous part (decode, validate, append, read);
* RemoteTimeMs: the wait after it (acks=all replication, a fetch's max.wait, a rebalance);
* TotalTimeMs: both, from dispatch until the response is ready to be written.

Each request costs a few additions and two clock reads; no lock (event loop thread only).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from odradek.network.request_context import RequestContext

Dispatch = Callable[[RequestContext, bytes], Any]


class ApiRequestStats:
    """One API's counts and summed times (milliseconds)."""

    __slots__ = ("errors", "local_ms", "remote_ms", "requests", "total_max_ms", "total_ms")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.local_ms = 0.0
        self.remote_ms = 0.0
        self.total_ms = 0.0
        self.total_max_ms = 0.0

    def completed(self, started: float, local_done: float) -> None:
        now = time.perf_counter()
        total_ms = (now - started) * 1000
        self.remote_ms += (now - local_done) * 1000
        self.total_ms += total_ms
        if total_ms > self.total_max_ms:
            self.total_max_ms = total_ms


class RequestMetrics:
    """Per-API request stats, and the dispatch wrapper that keeps them. Event loop thread only."""

    def __init__(self) -> None:
        self.by_api: dict[int, ApiRequestStats] = {}

    def stats(self, api_key: int) -> ApiRequestStats:
        found = self.by_api.get(api_key)
        if found is None:
            found = self.by_api[api_key] = ApiRequestStats()
        return found

    def metered(self, dispatch: Dispatch) -> Dispatch:
        """`dispatch`, timing each request into the stats of its API."""

        def metered_dispatch(context: RequestContext, frame: bytes) -> Any:
            stats = self.stats(context.header.api_key)
            stats.requests += 1
            started = time.perf_counter()
            try:
                result = dispatch(context, frame)
            except Exception:
                stats.errors += 1
                raise
            local_done = time.perf_counter()
            stats.local_ms += (local_done - started) * 1000
            if inspect.isawaitable(result):
                future = asyncio.ensure_future(result)
                future.add_done_callback(lambda _f: stats.completed(started, local_done))
                return future
            stats.completed(started, local_done)
            return result

        return metered_dispatch
