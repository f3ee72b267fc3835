"""The controller's event loop: one queue, one consumer task (Kafka's ControllerEventManager).

Everything that can change the controller's state arrives here as an event: ZooKeeper watch callbacks
and broker responses do nothing but `put` an event (from any thread, via `put_threadsafe`). The single
consumer task runs `processor.process(event)` for one event at a time, so the controller context is
only ever touched by that task and needs no locks.

Errors are handled in one place: an exception from `process` is logged and handed to
`processor.on_error(event, error)`, which resigns when the error says the controller moved.
`clear_and_put` drops queued events (their `preempt` is called so that waiters get an answer) before
queueing an urgent one, as Kafka does for session expiry.

What it has done is kept for operators (the broker serves it as `/controller-events`, which the
console's controller page shows): the event in progress and since when, and the last
`RECENT_EVENTS` events with how long each waited in the queue and how long it took (Kafka's
`EventQueueTimeMs` and the per-state rate-and-time metrics, as a list). O(1) per event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

RECENT_EVENTS = 50


@dataclass(frozen=True, slots=True)
class ProcessedEvent:
    """One event the consumer task finished: its name, when it was queued (wall clock, ms), how
    long it waited and how long `process` took, and whether it failed."""

    name: str
    queued_at_ms: int
    queue_ms: float
    process_ms: float
    failed: bool


class ControllerEvent(Protocol):
    name: str


class EventProcessor(Protocol):
    async def process(self, event: Any) -> None: ...

    def preempt(self, event: Any) -> None: ...

    async def on_error(self, event: Any, error: BaseException) -> None: ...


class ControllerEventManager:
    """Owns the queue and the consumer task. `put*` may be called from any thread."""

    def __init__(self, processor: EventProcessor, loop: asyncio.AbstractEventLoop) -> None:
        self._processor = processor
        self._loop = loop
        # (event, time.monotonic() when queued)
        self._queue: asyncio.Queue[tuple[Any, float]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.current_event: Any = None
        self.current_started_ms = 0  # wall clock, while current_event is set
        self.current_queue_ms = 0.0
        self.events_processed = 0
        self.recent: deque[ProcessedEvent] = deque(maxlen=RECENT_EVENTS)
        # Called with each ProcessedEvent (the controller's metrics: `controller.stats`).
        self.on_processed: Callable[[ProcessedEvent], None] | None = None

    def start(self) -> None:
        self._task = self._loop.create_task(self._run(), name="controller-event-thread")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._drain()

    def put(self, event: Any) -> None:
        """Queue an event; event-loop thread only."""
        self._queue.put_nowait((event, time.monotonic()))

    def put_threadsafe(self, event: Any) -> None:
        """Queue an event from another thread (a kazoo watch callback)."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (event, time.monotonic()))

    def clear_and_put(self, event: Any) -> None:
        self._drain()
        self._queue.put_nowait((event, time.monotonic()))

    def _drain(self) -> None:
        while not self._queue.empty():
            pending, _ = self._queue.get_nowait()
            try:
                self._processor.preempt(pending)
            except Exception:
                log.exception("preempting %s failed", getattr(pending, "name", pending))

    @property
    def queue_size(self) -> int:
        return self._queue.qsize()

    async def _run(self) -> None:
        while True:
            event, queued = await self._queue.get()
            started = time.monotonic()
            self.current_event = event
            self.current_started_ms = int(time.time() * 1000)
            self.current_queue_ms = (started - queued) * 1000
            failed = False
            try:
                await self._processor.process(event)
            except asyncio.CancelledError:
                raise
            except BaseException as error:
                failed = True
                try:
                    await self._processor.on_error(event, error)
                except Exception:
                    log.exception("error handling failed for %s", getattr(event, "name", event))
            finally:
                self.current_event = None
                self.events_processed += 1
            elapsed = time.monotonic() - started
            processed = ProcessedEvent(
                getattr(event, "name", type(event).__name__),
                self.current_started_ms - int(self.current_queue_ms),
                self.current_queue_ms,
                elapsed * 1000,
                failed,
            )
            self.recent.append(processed)
            if self.on_processed is not None:
                self.on_processed(processed)
            if elapsed > 1.0:
                log.info("controller event %s took %.2fs", getattr(event, "name", event), elapsed)
