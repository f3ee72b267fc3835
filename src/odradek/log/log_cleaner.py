"""The log cleaner of a broker: cleaner threads that compact logs without stalling the event loop
(Kafka's LogCleaner).

Settings (broker properties, Kafka's names and defaults): `log.cleaner.enable` (true),
`log.cleaner.threads` (1), `log.cleaner.dedupe.buffer.size` (128 MB over all threads: each thread's
offset map gets its share), `log.cleaner.io.buffer.load.factor` (0.9, how full a map may get),
`log.cleaner.io.buffer.size` (512 KB over all threads, half for reading, half for writing),
`log.cleaner.io.max.bytes.per.second` (unlimited) and `log.cleaner.backoff.ms` (15 s between
looks when no log is due). The per-topic settings are in `LogConfig`.

Threading. Each of the `threads` cleaners is an asyncio task on the event loop, a thread of the
cleaner's own pool, and a process of its own (`cleaner_process`, niced by `log.cleaner.nice`,
Odradek's setting, default 10, so that cleaning takes only the CPU the broker leaves):

1. on the loop, the task asks the manager for the dirtiest due log
   (`LogCleanerManager.grab_filthiest_log`, cheap: segment sizes and a few index reads) and
   takes a snapshot of its segments;
2. in the cleaner process, `Cleaner.clean` maps and rewrites segments (all per-record work is
   native), reading and writing through descriptors of its own; the cleaner thread waits for it,
   relays its swaps and checks for an abort every 50 ms;
3. each group's swap is handed back to the loop (`run_coroutine_threadsafe`, the thread waiting
   for the answer): `Log.replace_segments` runs there between two appends or reads of the log,
   so nothing else ever sees a half-swapped log; the replaced segments' files are deleted
   file.delete.delay.ms later;
4. on the loop, the manager records the new first dirty offset in `cleaner-offset-checkpoint`.

A truncation of the log (`Log.on_truncate`), its deletion, or the broker's shutdown aborts a
cleaning in progress: the thread stops at its next check and the swap is refused. A cleaning
that fails on data it cannot read marks its log uncleanable (logged; the broker goes on, and the
log is not cleaned again until the broker restarts).

Concurrency: `LogCleaner` is created, started and shut down on the event loop, and its hooks
(`is_cleaning`, `on_truncate`, `on_delete`) are called there by the log manager and the logs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from odradek.errors import InvariantError
from odradek.log.cleaner import (
    CleanerStats,
    CleaningAbortedError,
    LogToClean,
    SegmentToClean,
)
from odradek.log.cleaner_manager import LogCleanerManager
from odradek.log.cleaner_process import CleanerProcess, CleanerProcessConfig
from odradek.log.log import Log
from odradek.log.log_manager import LogManager
from odradek.log.segment import LogSegment
from odradek.log.segment_swap import crash_point, delete_cleaned_files, delete_replaced_txn_index
from odradek.protocol.compaction import SLOT_SIZE

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The broker's log.cleaner.* settings (module docstring)."""

    enable: bool = True
    threads: int = 1
    dedupe_buffer_size: int = 128 * 1024 * 1024
    dedupe_buffer_load_factor: float = 0.9
    io_buffer_size: int = 512 * 1024
    io_max_bytes_per_second: float = float("inf")
    backoff_ms: int = 15_000
    nice: int = 10

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise InvariantError(f"log.cleaner.threads must be >= 0, got {self.threads}")
        if self.enable and self.threads and self.map_memory_per_thread < 2 * SLOT_SIZE:
            raise InvariantError(
                f"log.cleaner.dedupe.buffer.size {self.dedupe_buffer_size} is too small for "
                f"{self.threads} cleaner threads"
            )

    @property
    def map_memory_per_thread(self) -> int:
        return min(self.dedupe_buffer_size // max(self.threads, 1), 2**31 - 1)

    @property
    def io_buffer_per_thread(self) -> int:
        return self.io_buffer_size // max(self.threads, 1) // 2

    @classmethod
    def from_broker_config(cls, get: Callable[[str], Any]) -> CleanerConfig:
        """From the broker's validated properties (`KafkaConfig.__getitem__`)."""
        return cls(
            enable=bool(get("log.cleaner.enable")),
            threads=int(get("log.cleaner.threads")),
            dedupe_buffer_size=int(get("log.cleaner.dedupe.buffer.size")),
            dedupe_buffer_load_factor=float(get("log.cleaner.io.buffer.load.factor")),
            io_buffer_size=int(get("log.cleaner.io.buffer.size")),
            io_max_bytes_per_second=float(get("log.cleaner.io.max.bytes.per.second")),
            backoff_ms=int(get("log.cleaner.backoff.ms")),
            nice=int(get("log.cleaner.nice")),
        )


class LogCleaner:
    """The broker's cleaner threads (module docstring)."""

    def __init__(
        self,
        log_manager: LogManager,
        config: CleanerConfig,
        stable_offset_of: Callable[[str, int], int | None],
    ) -> None:
        self.config = config
        self.log_manager = log_manager
        self.manager = LogCleanerManager(
            lambda: log_manager.logs_by_partition(),
            lambda tp: log_manager.log_dir_of(*tp),
            stable_offset_of,
        )
        self.last_stats: CleanerStats | None = None
        self.cleanings = 0
        """Cleanings finished since start-up (tests and benchmarks wait on it)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._processes: list[CleanerProcess] = []
        self._wakeup: asyncio.Event | None = None
        self._stopping = False
        self._closed = False
        self._pending_deletes: dict[int, tuple[asyncio.TimerHandle, list[LogSegment]]] = {}
        self._next_delete_id = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Load the checkpoints, hook into the log manager and start the cleaner threads."""
        self.manager.load_checkpoints(self.log_manager.log_dirs)
        self.log_manager.set_cleaner(self)
        self._start_threads()

    def _start_threads(self) -> None:
        if not self.config.enable or self.config.threads == 0:
            logger.info("the log cleaner is disabled (log.cleaner.enable, log.cleaner.threads)")
            return
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(
            max_workers=self.config.threads,
            thread_name_prefix="odradek-log-cleaner",
        )
        process_config = CleanerProcessConfig(
            map_memory=self.config.map_memory_per_thread,
            load_factor=self.config.dedupe_buffer_load_factor,
            io_buffer_size=self.config.io_buffer_per_thread,
            # Kafka's throttler is shared by the threads; each process takes its share.
            io_max_bytes_per_second=self.config.io_max_bytes_per_second / self.config.threads,
            nice=self.config.nice,
        )
        for i in range(self.config.threads):
            process = CleanerProcess(process_config, f"log-cleaner-{i}")
            self._processes.append(process)
            self._tasks.append(self._loop.create_task(self._run(process), name=f"log-cleaner-{i}"))
        logger.info(
            "log cleaner started: %d threads, each cleaning in a process of its own (nice %+d) "
            "with a %d MB offset map",
            self.config.threads,
            self.config.nice,
            self.config.map_memory_per_thread // (1024 * 1024),
        )

    async def reconfigure(self, config: CleanerConfig) -> None:
        """New log.cleaner.* settings (dynamic broker configs; Kafka's LogCleaner.reconfigure):
        the threads and their processes are stopped — cleanings in progress are aborted, to be
        done again later from their checkpoints — and started again with the new count, offset
        maps, buffers and I/O rate."""
        self.config = config
        if self._closed:
            return
        await self._stop_threads()
        if not self._closed:  # a shutdown while the threads stopped wins
            self._stopping = False
            self._start_threads()

    async def _stop_threads(self) -> None:
        self._stopping = True
        for topic_partition in list(self.log_manager.logs_by_partition()):
            self.manager.abort(topic_partition)
        if self._wakeup is not None:
            self._wakeup.set()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks.clear()
        loop = asyncio.get_running_loop()
        for process in self._processes:
            await loop.run_in_executor(None, process.close)
        self._processes.clear()
        if self._executor is not None:
            # Every task has returned, so no cleaning runs on the pool any more.
            self._executor.shutdown(wait=True)
            self._executor = None

    async def shutdown(self) -> None:
        """Abort cleanings in progress, wait for the threads, delete replaced segments now."""
        self._closed = True
        await self._stop_threads()
        for handle, segments in self._pending_deletes.values():
            handle.cancel()
            _delete_segments(segments)
        self._pending_deletes.clear()

    def wake(self) -> None:
        """Look for a due log now rather than after log.cleaner.backoff.ms."""
        if self._wakeup is not None:
            self._wakeup.set()

    # -- hooks for the log manager and the logs ----------------------------------------------------

    def is_cleaning(self, topic_partition: TopicPartition) -> bool:
        return self.manager.is_cleaning(topic_partition)

    def on_truncate(self, log: Log, offset: int) -> None:
        topic_partition = (log.topic, log.partition)
        if self.manager.abort(topic_partition):
            logger.info("%s: truncation to %d aborts its cleaning", log, offset)
        self.manager.maybe_truncate_checkpoint(topic_partition, offset)

    def on_delete(self, topic_partition: TopicPartition, log_dir: Path) -> None:
        self.manager.abort(topic_partition)
        self.manager.forget(topic_partition, log_dir)

    # -- the cleaner threads -----------------------------------------------------------------------

    async def _run(self, cleaner: CleanerProcess) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, cleaner.start)
        except Exception:  # the first cleaning tries again
            logger.exception("%s could not start", cleaner.name)
        while not self._stopping:
            try:
                job = self.manager.grab_filthiest_log(_wall_clock_ms())
            except Exception:
                logger.exception("the log cleaner could not choose a log")
                job = None
            if job is None:
                await self._backoff()
                continue
            topic_partition = job.topic_partition
            now_ms = _wall_clock_ms()
            try:
                stats = await loop.run_in_executor(
                    self._executor,
                    cleaner.clean,
                    job,
                    now_ms,
                    self._swap_from_thread,
                    functools.partial(self._check_abort, topic_partition),
                )
            except CleaningAbortedError as e:
                logger.info("cleaning of %s-%d stopped: %s", *topic_partition, e)
                self.manager.cleaning_ended(topic_partition)
                continue
            except Exception:
                logger.exception(
                    "cleaning of %s-%d failed; it is not cleaned again until the broker restarts",
                    *topic_partition,
                )
                self.manager.mark_uncleanable(topic_partition)
                continue
            crash_point("checkpoint")
            if self.manager.is_aborted(topic_partition) or self._stopping:
                self.manager.cleaning_ended(topic_partition)
                continue
            self.manager.done_cleaning(
                topic_partition,
                stats.end_offset,
                stats.tombstones_kept,
                job.config.delete_retention_ms,
                _wall_clock_ms(),
            )
            self.last_stats = stats
            self.cleanings += 1
            logger.info("cleaned %s-%d: %s", *topic_partition, stats.summary())

    async def _backoff(self) -> None:
        if self._wakeup is None:
            return
        try:
            await asyncio.wait_for(self._wakeup.wait(), self.config.backoff_ms / 1000)
        except TimeoutError:
            pass
        self._wakeup.clear()

    def _check_abort(self, topic_partition: TopicPartition) -> None:
        """Cleaner threads, between buffers."""
        if self._stopping:
            raise CleaningAbortedError("the log cleaner is shutting down")
        self.manager.check_abort(topic_partition)

    def _swap_from_thread(
        self, job: LogToClean, group: list[SegmentToClean] | tuple[SegmentToClean, ...], size: int
    ) -> bool:
        """Cleaner threads: hand the swap to the event loop and wait for its answer."""
        if self._loop is None:
            raise InvariantError("the log cleaner swaps segments only once started")
        future = asyncio.run_coroutine_threadsafe(self._swap(job, list(group), size), self._loop)
        return future.result()

    async def _swap(self, job: LogToClean, group: list[SegmentToClean], size: int) -> bool:
        """On the event loop: swap the group's cleaned segment into the live log."""
        topic_partition = job.topic_partition
        base_offset = group[0].base_offset
        log = self.log_manager.get_log(*topic_partition)
        if (
            self._stopping
            or self.manager.is_aborted(topic_partition)
            or log is None
            or log.dir != job.directory
        ):
            delete_cleaned_files(job.directory, base_offset)
            return False
        old = [s.segment for s in group]
        if not log.replace_segments(old, [s.size for s in group], size, _wall_clock_ms()):
            return False
        self._delete_later(old, log.config.file_delete_delay_ms)
        return True

    def _delete_later(self, segments: list[LogSegment], delay_ms: int) -> None:
        """Remove replaced segments' `.deleted` files after file.delete.delay.ms (Kafka's
        asynchronous deletion: a reader holding the old files has that long to finish)."""
        if self._loop is None:
            _delete_segments(segments)
            return
        key = self._next_delete_id
        self._next_delete_id += 1

        def delete() -> None:
            self._pending_deletes.pop(key, None)
            _delete_segments(segments)

        handle = self._loop.call_later(delay_ms / 1000, delete)
        self._pending_deletes[key] = (handle, segments)


def _delete_segments(segments: list[LogSegment]) -> None:
    for segment in segments:
        try:
            segment.delete()
            delete_replaced_txn_index(segment.log_path.parent, segment.base_offset)
        except OSError as e:
            logger.warning("cannot delete %s: %s", segment.log_path, e)
