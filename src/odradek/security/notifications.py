"""Sequential change notifications, as Kafka's `ZkNodeChangeNotificationListener` consumes them.

A writer records "entity X changed" by creating a persistent sequential znode under a parent
(`/kafka-acl-changes/acl_changes_0000000042`, `/config/changes/config_change_0000000007`); every
broker watches the parent's children and, when they change:

1. lists the children, sorted by sequence number;
2. processes, in order, each one whose number is above the last it processed (re-reading the
   named entity from ZooKeeper: the notification only names it, it never carries the new value);
3. deletes the ones older than `change_expiration_ms` (15 minutes), so the parent does not grow
   without bound; every broker does this, and a delete that finds the znode gone is fine.

A broker starts with "last processed" at -1, so at start-up it re-reads every entity named by a
notification still present, which is harmless. The listener's watch is set before the full load
of the cache, so that no change falls between the load and the first notification.

`NotificationTracker` is that bookkeeping, pure; `Coalescer` runs one processing pass at a time and
remembers that another is needed when a watch fires during a pass (watches only schedule work).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from odradek.security.znodes import change_sequence
from odradek.zk.errors import ClientClosedError, InvalidZNodeDataError

log = logging.getLogger(__name__)

CHANGE_EXPIRATION_MS = 15 * 60 * 1000
RETRY_BACKOFF_S = 0.5  # after a failed pass; doubled up to MAX_RETRY_BACKOFF_S while it fails
MAX_RETRY_BACKOFF_S = 10.0


class NotificationTracker:
    """Which notifications of one parent are new. Owned by one task; not thread-safe."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.last_processed = -1

    def new_children(self, children: Iterable[str]) -> list[str]:
        """The children after the last processed one, in sequence order (others are ignored)."""
        numbered = []
        for child in children:
            if not child.startswith(self.prefix):
                continue
            try:
                numbered.append((change_sequence(child), child))
            except InvalidZNodeDataError:
                log.warning("ignoring change notification %r: no sequence number", child)
        return [child for number, child in sorted(numbered) if number > self.last_processed]

    def processed(self, child: str) -> None:
        self.last_processed = max(self.last_processed, change_sequence(child))

    @staticmethod
    def obsolete(
        created_ms: Sequence[tuple[str, int]],
        now_ms: int,
        expiration_ms: int = CHANGE_EXPIRATION_MS,
    ) -> list[str]:
        """The notifications (child, ctime in ms) old enough to delete."""
        return [child for child, ctime in created_ms if now_ms - ctime > expiration_ms]


class Coalescer:
    """Runs `work` once per `request()`, never twice at once; requests during a run make exactly
    one more run. `request` is safe to call from a watch callback on the event loop thread: it
    only schedules a task. Errors are logged, never raised into the callback, and the work is run
    again after a backoff until it succeeds: a pass that failed (ZooKeeper connection lost) may not
    have re-armed its watch, so waiting for "the next change" could wait forever."""

    def __init__(
        self,
        work: Callable[[], Awaitable[None]],
        name: str,
        retry_backoff_s: float = RETRY_BACKOFF_S,
        max_retry_backoff_s: float = MAX_RETRY_BACKOFF_S,
    ) -> None:
        self._work = work
        self._name = name
        self._pending = False
        self._task: asyncio.Task[None] | None = None
        self._retry_backoff_s = retry_backoff_s
        self._max_retry_backoff_s = max_retry_backoff_s

    def request(self) -> None:
        self._pending = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        backoff = self._retry_backoff_s
        while self._pending:
            self._pending = False
            try:
                await self._work()
            except asyncio.CancelledError:
                raise
            except ClientClosedError:
                return  # shutting down: nothing to keep in step with any more
            except Exception as e:
                log.warning("%s failed (%r); retrying in %.1f s", self._name, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_retry_backoff_s)
                self._pending = True
            else:
                backoff = self._retry_backoff_s

    async def wait_idle(self) -> None:
        """Until no run is in progress or pending (tests, shutdown)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
