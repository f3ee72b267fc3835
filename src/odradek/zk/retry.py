"""The one helper that retries ZooKeeper requests after a connection loss (see
`retry_on_connection_loss`); the client's single operations and transactions go through it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from odradek.zk.errors import ConnectionLossError

log = logging.getLogger(__name__)

T = TypeVar("T")


async def retry_on_connection_loss(
    attempt: Callable[[], Awaitable[T]],
    *,
    deadline_s: float,
    first: Awaitable[T] | None = None,
) -> T:
    """Await `attempt()` and call it again while it fails with ConnectionLossError.

    The one place that retries ZooKeeper requests. Connection loss fails only the requests that
    were in flight; the session normally survives, and a resent request waits in kazoo's queue
    until the client has reconnected. Gives up (re-raising) after `deadline_s` seconds; never
    retries SessionExpiredError or a server's refusal. `first`, if given, is an attempt already
    sent (so that callers can put many requests in flight before awaiting any).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    delay = 0.02
    pending = first if first is not None else attempt()
    while True:
        try:
            return await pending
        except ConnectionLossError:
            if loop.time() + delay >= deadline:
                raise
            log.debug("ZooKeeper connection lost during a request; retrying in %.2fs", delay)
        # Backoff only bounds a pathological loop; normally the retry just waits in kazoo's queue.
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
        pending = attempt()
