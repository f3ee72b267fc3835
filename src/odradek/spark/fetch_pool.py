"""What a reader's fast path keeps between tasks in one Python worker: partition leaders and idle
Fetch connections.

A streaming query runs one small task per partition every micro-batch. Without this, each task
created a Consumer only to learn its partition's leader (a Metadata round trip), opened a new
connection to the leader, sent one Fetch and closed everything again, a fixed cost per batch
that a few hundred records never amortise. Spark's own Kafka connector keeps its consumers in a
per-executor cache for the same reason. PySpark reuses its Python workers between tasks
(`spark.python.worker.reuse`, on by default), so a module-level `FetchPool` outlives a task.

Nothing here is trusted blindly: a remembered leader that no longer leads answers the Fetch with
an error, and an idle connection the broker closed fails its first exchange; either way the fast
path forgets the leader (or retries once on a new connection) and the reader carries on as without
the pool. Only connections with no request in flight are returned to the pool.

Concurrency: a lock guards the maps; a connection is used by the one task that checked it out.
A forked child (PySpark's daemon forks its workers) starts with an empty pool, never its parent's
sockets.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from odradek.spark.wire import BrokerSocket

__all__ = ["IDLE_S", "POOL", "FetchPool"]

IDLE_S = 60.0  # an idle connection older than this is closed rather than reused
_IDLE_PER_BROKER = 4


class FetchPool:
    """Partition leaders by (bootstrap servers, topic, partition), and idle connections by
    broker address."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._leaders: dict[tuple[str, str, int], tuple[str, int]] = {}
        self._idle: dict[tuple[str, int], list[tuple[float, BrokerSocket]]] = {}

    def _after_fork(self) -> None:
        """Drop what a parent process held (its sockets are not this process's to use)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._leaders = {}
            self._idle = {}

    def leader(self, bootstrap: str, topic: str, partition: int) -> tuple[str, int] | None:
        with self._lock:
            self._after_fork()
            return self._leaders.get((bootstrap, topic, partition))

    def remember_leader(
        self, bootstrap: str, topic: str, partition: int, address: tuple[str, int]
    ) -> None:
        with self._lock:
            self._after_fork()
            self._leaders[(bootstrap, topic, partition)] = address

    def forget_leader(self, bootstrap: str, topic: str, partition: int) -> None:
        with self._lock:
            self._after_fork()
            self._leaders.pop((bootstrap, topic, partition), None)

    def checkout(self, address: tuple[str, int]) -> BrokerSocket | None:
        """An idle connection to `address`, newest first; None if there is none young enough."""
        stale: list[BrokerSocket] = []
        found = None
        with self._lock:
            self._after_fork()
            idle = self._idle.get(address, [])
            while idle:
                since, connection = idle.pop()
                if self._clock() - since <= IDLE_S:
                    found = connection
                    break
                stale.append(connection)
        for connection in stale:
            connection.close()
        return found

    def checkin(self, address: tuple[str, int], connection: BrokerSocket) -> None:
        """Keep `connection` for a later task, if it has nothing in flight and there is room."""
        if connection.in_flight:
            connection.close()
            return
        with self._lock:
            self._after_fork()
            idle = self._idle.setdefault(address, [])
            if len(idle) < _IDLE_PER_BROKER:
                idle.append((self._clock(), connection))
                return
        connection.close()

    def idle_connections(self) -> int:
        with self._lock:
            return sum(len(idle) for idle in self._idle.values())


POOL = FetchPool()
