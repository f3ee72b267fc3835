"""A cleaner thread's cleanings run in a process of their own, at a lower CPU priority than the
broker, so that cleaning cannot take the CPU from the event loop.

Why a process: the cleaner's per-record work is native and releases the GIL, but a cleaning
still keeps a core busy for seconds. On a machine with few cores the event loop then waits for
the scheduler behind it (measured by `bench/cleaner.py --only latency`: produce p99 several
times higher while cleaning). A thread cannot simply be given a lower priority: descheduled
while it holds the GIL between two native passes, it would stall the event loop instead
(priority inversion). A process has no GIL to share, so it can be niced (`log.cleaner.nice`,
an Odradek setting; Kafka has no equivalent, its cleaner threads run beside the JVM's request
threads): it gets all the CPU the broker leaves, and yields the moment the broker wants it.

`CleanerProcess.clean` has `Cleaner.clean`'s signature and is called on the same cleaner
thread of the broker (`log_cleaner`); the child (started on first use, with the `spawn` method
so it inherits none of the broker's threads or sockets) runs `Cleaner.clean` on a copy of the
job. The two talk over a pipe, a message at a time:

| from | message | meaning |
|---|---|---|
| broker | `("clean", job, now_ms)` | clean this log (the job without its `LogSegment` objects) |
| child | `("swap", first, count, size)` | swap segments first .. first+count-1 of the job for the cleaned one; the broker answers `("swapped", ok)` after `Log.replace_segments` ran on the event loop |
| broker | `("abort",)` | the manager aborted this cleaning or the broker is stopping: stop at the next buffer |
| child | `("done", stats)` / `("error", kind, text)` | the cleaning's end; `kind` is `aborted`, `corrupt` or `failed` |
| broker | `("stop",)` | exit |

The child exits when the broker's end of the pipe closes (the broker exited or was killed), at
its next buffer at the latest. A child that dies in a cleaning fails that cleaning like any other
error (the log is marked uncleanable, as for data the cleaner cannot read), and the next cleaning
starts a new child.

Concurrency: a `CleanerProcess` belongs to one cleaner thread of the broker.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from odradek.errors import CorruptRecordError
from odradek.log import segment_swap
from odradek.log.cleaner import (
    Cleaner,
    CleanerStats,
    CleaningAbortedError,
    LogToClean,
    SwapFunction,
    Throttler,
)
from odradek.protocol.compaction import OffsetMap

logger = logging.getLogger(__name__)

_POLL_S = 0.05
"""How often the broker's side checks for an abort while the child works."""
_ABORT_GRACE_S = 30.0
"""How long an aborted child may take to stop before it is killed."""


class CleanerChildError(Exception):
    """The cleaner process died or broke the protocol during a cleaning."""


@dataclasses.dataclass(frozen=True, slots=True)
class CleanerProcessConfig:
    map_memory: int
    load_factor: float
    io_buffer_size: int
    io_max_bytes_per_second: float
    nice: int


class CleanerProcess:
    """The broker's side of one cleaner process (module docstring)."""

    def __init__(self, config: CleanerProcessConfig, name: str) -> None:
        self.config = config
        self.name = name
        self._process: Any = None
        self._conn: Connection | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the child now (on a cleaner thread, at the broker's start-up), so that its
        start costs nothing to requests served later."""
        self._ensure_started()

    def _ensure_started(self) -> Connection:
        if self._conn is not None and self._process is not None and self._process.is_alive():
            return self._conn
        self._discard()
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe(duplex=True)
        process = context.Process(
            target=_child_main,
            args=(child_end, self.config, os.getpid()),
            name=self.name,
            daemon=True,
        )
        process.start()
        child_end.close()
        if self.config.nice and process.pid is not None:  # a started process has its pid
            try:  # at once, so that the child's start-up (imports) runs niced already
                os.setpriority(os.PRIO_PROCESS, process.pid, self.config.nice)
            except OSError:  # it may have lowered its priority itself already
                pass
        self._process, self._conn = process, parent_end
        logger.info("%s started (pid %d, nice %+d)", self.name, process.pid, self.config.nice)
        return parent_end

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the child (after its cleaning, if any, was aborted)."""
        if self._conn is not None:
            try:
                self._conn.send(("stop",))
            except OSError:
                pass
        if self._process is not None:
            self._process.join(timeout_s)
        self._discard()

    def _discard(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None

    # -- a cleaning ------------------------------------------------------------------------------

    def clean(
        self,
        job: LogToClean,
        now_ms: int,
        swap: SwapFunction,
        check_abort: Callable[[], None],
    ) -> CleanerStats:
        """`Cleaner.clean`, in the child; swaps run through `swap` here."""
        conn = self._ensure_started()
        child_job = dataclasses.replace(
            job,
            segments=tuple(dataclasses.replace(s, segment=None) for s in job.segments),  # type: ignore[arg-type]
        )
        aborted_at: float | None = None
        try:
            conn.send(("clean", child_job, now_ms))
            while True:
                if not conn.poll(_POLL_S):
                    if aborted_at is None:
                        try:
                            check_abort()
                        except CleaningAbortedError:
                            aborted_at = time.monotonic()
                            conn.send(("abort",))
                    elif time.monotonic() - aborted_at > _ABORT_GRACE_S:
                        raise CleanerChildError("did not stop after the cleaning was aborted")
                    continue
                message = conn.recv()
                kind = message[0]
                if kind == "swap":
                    _, first, count, size = message
                    ok = swap(job, job.segments[first : first + count], size)
                    conn.send(("swapped", ok))
                elif kind == "done":
                    stats: CleanerStats = message[1]
                    return stats
                elif kind == "error":
                    raise _error(message[1], message[2])
                else:
                    raise CleanerChildError(f"unexpected message {kind!r}")
        except (EOFError, OSError, CleanerChildError) as e:
            for segment in job.segments:
                segment_swap.delete_cleaned_files(job.directory, segment.base_offset)
            self._discard()
            if isinstance(e, CleanerChildError):
                raise CleanerChildError(f"{self.name}: {e}") from None
            raise CleanerChildError(f"{self.name} died during the cleaning: {e!r}") from None


def _error(kind: str, text: str) -> Exception:
    if kind == "aborted":
        return CleaningAbortedError(text)
    if kind == "corrupt":
        return CorruptRecordError(text)
    return CleanerChildError(text)


# -- the child -------------------------------------------------------------------------------------


class _Channel:
    """The child's end: abort checks between buffers, and swaps that wait for the broker."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.aborted = False

    def _receive(self) -> Any:
        message = self.conn.recv()
        if message[0] == "abort":
            self.aborted = True
        elif message[0] == "stop":
            raise SystemExit(0)
        return message

    def check_abort(self) -> None:
        while not self.aborted and self.conn.poll(0):
            self._receive()
        if self.aborted:
            raise CleaningAbortedError("aborted by the broker")

    def swap(self, job: LogToClean, group: Any, size: int) -> bool:
        first = next(i for i, s in enumerate(job.segments) if s.base_offset == group[0].base_offset)
        self.conn.send(("swap", first, len(group), size))
        while True:
            message = self._receive()
            if message[0] == "swapped":
                return bool(message[1])


def _child_main(conn: Connection, config: CleanerProcessConfig, broker_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the broker decides when its cleaner stops
    segment_swap.set_broker_pid(broker_pid)
    if config.nice and os.getpriority(os.PRIO_PROCESS, 0) < config.nice:
        os.setpriority(os.PRIO_PROCESS, 0, config.nice)
    cleaner = Cleaner(
        OffsetMap(config.map_memory, config.load_factor),
        config.io_buffer_size,
        Throttler(config.io_max_bytes_per_second),
    )
    channel = _Channel(conn)
    try:
        while True:
            message = conn.recv()
            if message[0] == "stop":
                return
            if message[0] != "clean":
                continue  # an abort that arrived after its cleaning ended
            _, job, now_ms = message
            channel.aborted = False
            try:
                stats = cleaner.clean(job, now_ms, channel.swap, channel.check_abort)
                reply: tuple[Any, ...] = ("done", stats)
            except CleaningAbortedError as e:
                reply = ("error", "aborted", str(e))
            except CorruptRecordError as e:
                reply = ("error", "corrupt", str(e))
            except (EOFError, BrokenPipeError, ConnectionResetError):
                return
            except Exception as e:
                reply = ("error", "failed", f"{type(e).__name__}: {e}")
            conn.send(reply)
    except (EOFError, BrokenPipeError, ConnectionResetError, SystemExit):
        return
