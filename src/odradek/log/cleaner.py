"""The cleaner: rewrites the cleanable segments of one compacted log, keeping the latest record of
each key (Kafka's Cleaner in LogCleaner.scala).

What to clean comes as a `LogToClean`, a snapshot the manager takes on the event loop
(`odradek.log.cleaner_manager`): the log's segments from its first up to the first uncleanable
offset, and where the dirty section (not cleaned since the last cleaning) starts. A cleaning:

1. **Map** the dirty section: every key of a record at or after the first dirty offset goes into
   the offset map with its offset, the last one winning, segment after segment, until the
   section is done or the map is full (its memory budget, log.cleaner.dedupe.buffer.size over
   the cleaner threads, holds `capacity x load factor` keys). The map then covers offsets up to
   its `latest_offset`; the cleaning's end offset is the one after that: the next cleaning
   starts there.
2. **Group** the segments below the end offset (clean and dirty alike: a key overwritten in the
   dirty section removes its older records everywhere) into runs that fit one segment: at most
   segment.bytes of data and segment.index.bytes of each index, offsets within 2^31 of the
   run's base (Kafka's groupSegmentsBySize).
3. **Rewrite** each group into one new segment, `<base>.log.cleaned` with its indexes: every
   batch read from the old segments goes through the native filter (records that are not the
   latest of their key go, tombstones go once their batch's delete horizon has passed, batches
   left empty go; see `odradek.protocol.compaction` and `_compaction.c` for the exact rules) and
   the offset and time indexes are built as the batches are written. The files are fsynced and
   the data file gets the modification time of the group's last segment (retention by time of a
   segment without timestamps reads it), as Kafka does.
4. **Swap** the new segment in for the group (`swap`, which runs `Log.replace_segments` on the
   event loop: see `odradek.log.segment_swap` for the crash-safe steps). A refused swap (the log
   changed under the cleaning) aborts the cleaning.

I/O goes through two buffers of log.cleaner.io.buffer.size / threads / 2 bytes each (a read and a
write buffer, grown for a batch larger than them and shrunk back afterwards), and every byte read
or written passes the shared `Throttler` (log.cleaner.io.max.bytes.per.second).

Concurrency: a `Cleaner` belongs to one cleaner thread. What it touches is its own (the offset
map, the buffers, the `.cleaned` files) or does not change while it runs (the snapshot, the sealed
segment files, read through descriptors of its own). `check_abort` is called between buffers:
it raises `CleaningAbortedError` when the manager aborted this log's cleaning or the cleaner is
stopping.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from odradek.errors import CorruptRecordError
from odradek.log.config import LogConfig
from odradek.log.naming import CLEANED_SUFFIX
from odradek.log.segment import LogSegment
from odradek.log.segment_swap import crash_point, delete_cleaned_files, segment_paths
from odradek.protocol.compaction import (
    BatchDecisions,
    IndexBuilder,
    OffsetMap,
    filter_buffer,
    map_buffer,
)

logger = logging.getLogger(__name__)

_INT32_MAX = 2**31 - 1
_OFFSET_INDEX_ENTRY = 8
_TIME_INDEX_ENTRY = 12
_MIN_RECORD_BYTES = 8
"""A lower bound on the bytes a record takes in a log, to size the offset map for a section."""

TopicPartition = tuple[str, int]


class CleaningAbortedError(Exception):
    """The cleaning of a log stops: aborted by the manager, the cleaner stopping, or a refused
    swap. Its `.cleaned` files are removed; the log is as the last completed swap left it."""


@dataclass(frozen=True, slots=True)
class SegmentToClean:
    """What a cleaning needs of one sealed segment, read on the event loop."""

    segment: LogSegment
    """Only for the swap's identity check, on the event loop; never used by the cleaner thread."""
    base_offset: int
    path: Path
    size: int
    next_base_offset: int
    """The base offset of the segment after it: no offset of this one reaches it."""
    index_bytes: int
    time_index_bytes: int


@dataclass(frozen=True, slots=True)
class LogToClean:
    """A compacted log's cleanable range, as the manager found it (Kafka's LogToClean)."""

    topic_partition: TopicPartition
    directory: Path
    config: LogConfig
    segments: tuple[SegmentToClean, ...]
    """From the log's first segment up to (not including) the first uncleanable one."""
    first_dirty_offset: int
    first_uncleanable_offset: int
    map_start_position: int
    """Where in the segment holding first_dirty_offset its batches start (from the index)."""
    needs_compaction_now: bool = False
    """Dirty data is older than max.compaction.lag.ms: clean whatever the dirty ratio."""
    decisions: BatchDecisions | None = None

    @property
    def clean_bytes(self) -> int:
        return sum(s.size for s in self.segments if s.next_base_offset <= self.first_dirty_offset)

    @property
    def cleanable_bytes(self) -> int:
        return sum(s.size for s in self.segments if s.next_base_offset > self.first_dirty_offset)

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0


@dataclass(slots=True)
class CleanerStats:
    """What one cleaning did (logged, and kept as the cleaner's last stats)."""

    end_offset: int = -1
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    tombstones_kept: int = 0
    map_bytes_read: int = 0
    map_records_read: int = 0
    map_utilization: float = 0.0
    groups: int = 0
    started: float = field(default_factory=time.monotonic)
    map_done: float = 0.0
    finished: float = 0.0

    @property
    def elapsed_s(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def summary(self) -> str:
        elapsed = max(self.elapsed_s, 1e-9)
        return (
            f"read {self.bytes_read / 1e6:.1f} MB ({self.records_read} records) and wrote "
            f"{self.bytes_written / 1e6:.1f} MB ({self.records_kept} records) in {elapsed:.2f} s "
            f"({self.bytes_read / 1e6 / elapsed:.1f} MB/s; map of {self.map_records_read} records "
            f"in {self.map_done - self.started:.2f} s, {self.map_utilization:.0%} full), "
            f"{self.groups} groups, cleaned up to offset {self.end_offset}"
        )


class Throttler:
    """Bounds the bytes per second all cleaner threads read and write together (Kafka's
    Throttler: measured over periods of `check_interval_s`; a period over the rate sleeps for the
    difference). Thread-safe: the cleaner threads share one; the sleep happens under its lock, so
    every thread waits out the excess."""

    def __init__(self, bytes_per_second: float, check_interval_s: float = 0.3) -> None:
        self.bytes_per_second = bytes_per_second
        self.check_interval_s = check_interval_s
        self._lock = threading.Lock()
        self._period_start = time.monotonic()
        self._observed = 0.0

    def maybe_throttle(self, observed: int) -> None:
        if self.bytes_per_second <= 0 or self.bytes_per_second >= 1e300:
            return
        with self._lock:
            self._observed += observed
            elapsed = time.monotonic() - self._period_start
            if elapsed < self.check_interval_s:
                return
            wanted = self._observed / self.bytes_per_second
            if wanted > elapsed:
                time.sleep(wanted - elapsed)
            self._period_start = time.monotonic()
            self._observed = 0.0


SwapFunction = Callable[[LogToClean, Sequence[SegmentToClean], int], bool]
"""Swap a group's cleaned segment (of the given size) in on the event loop; False if refused."""


def group_segments_by_size(
    segments: Sequence[SegmentToClean],
    max_size: int,
    max_index_size: int,
    first_uncleanable_offset: int,
) -> list[list[SegmentToClean]]:
    """Consecutive runs of `segments` that fit one segment (module docstring, step 2)."""
    groups: list[list[SegmentToClean]] = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        log_size = segments[i].size
        index_size = segments[i].index_bytes
        time_index_size = segments[i].time_index_bytes
        i += 1
        while i < len(segments):
            candidate = segments[i]
            # The candidate's last offset is at most the next one's base (or the uncleanable
            # offset) minus one: cheaper than reading it, and never too small.
            bound = (
                segments[i + 1].base_offset if i + 1 < len(segments) else first_uncleanable_offset
            )
            if not (
                log_size + candidate.size <= max_size
                and index_size + candidate.index_bytes <= max_index_size
                and time_index_size + candidate.time_index_bytes <= max_index_size
                and (candidate.size == 0 or bound - 1 - group[0].base_offset <= _INT32_MAX)
            ):
                break
            group.append(candidate)
            log_size += candidate.size
            index_size += candidate.index_bytes
            time_index_size += candidate.time_index_bytes
            i += 1
        groups.append(group)
    return groups


class Cleaner:
    """Cleans one log at a time on its cleaner thread (module docstring)."""

    def __init__(
        self,
        offset_map: OffsetMap,
        io_buffer_size: int,
        throttler: Throttler,
    ) -> None:
        self.offset_map = offset_map
        self.io_buffer_size = max(io_buffer_size, 1024)
        self.throttler = throttler
        self._read_buffer = bytearray(self.io_buffer_size)
        self._write_buffer = bytearray(self.io_buffer_size)

    # -- a cleaning -------------------------------------------------------------------------------

    def clean(
        self,
        job: LogToClean,
        now_ms: int,
        swap: SwapFunction,
        check_abort: Callable[[], None],
    ) -> CleanerStats:
        """Clean `job`'s log (steps 1-4 of the module docstring); returns the stats, whose
        `end_offset` is where the next cleaning's dirty section starts. Raises
        CleaningAbortedError, CorruptRecordError (data the cleaner cannot read) or OSError."""
        stats = CleanerStats()
        try:
            end_offset = self._build_offset_map(job, stats, check_abort)
            stats.map_done = time.monotonic()
            stats.end_offset = end_offset
            stats.map_utilization = self.offset_map.utilization
            candidates = [s for s in job.segments if s.base_offset < end_offset]
            groups = group_segments_by_size(
                candidates,
                job.config.segment_bytes,
                job.config.segment_index_bytes,
                job.first_uncleanable_offset,
            )
            for group in groups:
                check_abort()
                size = self._clean_group(job, group, now_ms, stats, check_abort)
                check_abort()
                if not swap(job, group, size):
                    raise CleaningAbortedError(f"{job.topic_partition}: the swap was refused")
                stats.groups += 1
        finally:
            self._restore_buffers()
        stats.finished = time.monotonic()
        return stats

    # -- the offset map ----------------------------------------------------------------------------

    def _build_offset_map(
        self, job: LogToClean, stats: CleanerStats, check_abort: Callable[[], None]
    ) -> int:
        start = job.first_dirty_offset
        dirty = [s for s in job.segments if s.next_base_offset > start]
        dirty_bytes = sum(s.size for s in dirty)
        # The section holds at most one record per offset and per _MIN_RECORD_BYTES bytes: a
        # map that large (every record a new key; the budget caps it) is never full before the
        # section is mapped, and touches no more pages than it needs (a fresh page costs a
        # fault, which dominated mapping when the map was sized by bytes alone).
        dirty_offsets = sum(
            max(
                min(s.next_base_offset, job.first_uncleanable_offset) - max(s.base_offset, start), 0
            )
            for s in dirty
        )
        most_records = min(dirty_bytes // _MIN_RECORD_BYTES, dirty_offsets)
        self.offset_map.clear(max(most_records * 10 // 9 + 1, 16))
        for segment in dirty:
            position = job.map_start_position if segment.base_offset <= start else 0
            if self._map_segment(job, segment, start, position, stats, check_abort):
                logger.debug(
                    "%s: the offset map is full in the segment at %d",
                    job.topic_partition,
                    segment.base_offset,
                )
                break
            # Offsets missing at the end of the segment (a gap) are covered too.
            if segment.next_base_offset - 1 > self.offset_map.latest_offset:
                self.offset_map.latest_offset = segment.next_base_offset - 1
        if not dirty:
            # Nothing new to map (a cleaning for tombstones whose horizon has passed): the clean
            # section holds one record per key already, so an empty map covering it keeps each
            # record but the expired tombstones.
            self.offset_map.latest_offset = start - 1
        return max(self.offset_map.latest_offset + 1, start)

    def _map_segment(
        self,
        job: LogToClean,
        segment: SegmentToClean,
        start_offset: int,
        position: int,
        stats: CleanerStats,
        check_abort: Callable[[], None],
    ) -> bool:
        """Add the segment's keys to the map from byte `position`; True if the map filled up."""
        fd = self._open(job, segment)
        try:
            while position < segment.size:
                check_abort()
                buffer = self._read(fd, position, segment.size)
                result = map_buffer(
                    self.offset_map,
                    buffer,
                    start_offset,
                    job.config.decompressed_limit,
                    job.decisions,
                )
                buffer.release()
                position += result.consumed
                stats.map_bytes_read += result.consumed
                stats.map_records_read += result.records_read
                self.throttler.maybe_throttle(result.consumed)
                if result.map_full:
                    return True
                if result.consumed == 0:
                    self._grow_read_buffer(job, segment, position, result.needed)
            return False
        finally:
            os.close(fd)

    # -- rewriting a group -------------------------------------------------------------------------

    def _clean_group(
        self,
        job: LogToClean,
        group: Sequence[SegmentToClean],
        now_ms: int,
        stats: CleanerStats,
        check_abort: Callable[[], None],
    ) -> int:
        """Write the group's cleaned segment (`.cleaned` files, fsynced); returns its size."""
        base_offset = group[0].base_offset
        log_path, index_path, time_index_path = segment_paths(
            job.directory, base_offset, CLEANED_SUFFIX
        )
        config = job.config
        builder = IndexBuilder(
            base_offset,
            config.index_interval_bytes,
            config.segment_index_bytes // _OFFSET_INDEX_ENTRY,
            config.segment_index_bytes // _TIME_INDEX_ENTRY,
        )
        out_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            written = 0
            for segment in group:
                written = self._clean_segment(
                    job, segment, out_fd, written, builder, now_ms, stats, check_abort
                )
            self._flush(out_fd, written, stats)
            offset_entries, time_entries = builder.finish()
            os.fsync(out_fd)
            for path, entries in ((index_path, offset_entries), (time_index_path, time_entries)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    _write_all(fd, entries)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            modified = os.stat(group[-1].path).st_mtime_ns
            os.utime(log_path, ns=(modified, modified))
        except BaseException:
            os.close(out_fd)
            delete_cleaned_files(job.directory, base_offset)
            raise
        os.close(out_fd)
        crash_point("cleaned")
        return int(builder.position)

    def _clean_segment(
        self,
        job: LogToClean,
        segment: SegmentToClean,
        out_fd: int,
        written: int,
        builder: IndexBuilder,
        now_ms: int,
        stats: CleanerStats,
        check_abort: Callable[[], None],
    ) -> int:
        """Filter one old segment into the write buffer (flushed to `out_fd` when full);
        returns the bytes of the write buffer in use."""
        config = job.config
        fd = self._open(job, segment)
        try:
            position = 0
            while position < segment.size:
                check_abort()
                buffer = self._read(fd, position, segment.size)
                result = filter_buffer(
                    self.offset_map,
                    buffer,
                    self._write_buffer,
                    written,
                    builder,
                    now_ms,
                    config.delete_retention_ms,
                    config.decompressed_limit,
                    job.decisions,
                )
                buffer.release()
                position += result.consumed
                written = result.written
                stats.bytes_read += result.consumed
                stats.records_read += result.records_read
                stats.records_kept += result.records_kept
                stats.tombstones_kept += result.tombstones_kept
                self.throttler.maybe_throttle(result.consumed)
                if result.output_full:
                    self._flush(out_fd, written, stats)
                    written = 0
                    if result.needed > len(self._write_buffer):
                        self._write_buffer = bytearray(result.needed)
                elif result.consumed == 0:
                    self._grow_read_buffer(job, segment, position, result.needed)
            return written
        finally:
            os.close(fd)

    # -- I/O ---------------------------------------------------------------------------------------

    @staticmethod
    def _open(job: LogToClean, segment: SegmentToClean) -> int:
        try:
            return os.open(segment.path, os.O_RDONLY)
        except FileNotFoundError:
            raise CleaningAbortedError(
                f"{job.topic_partition}: {segment.path.name} is gone (retention, truncation or "
                "deletion got there first)"
            ) from None

    def _read(self, fd: int, position: int, size: int) -> memoryview:
        """The bytes at `position` (at most the read buffer's size, never past `size`), as a view
        of the read buffer: valid until the next read."""
        wanted = min(len(self._read_buffer), size - position)
        view = memoryview(self._read_buffer)[:wanted]
        got = os.preadv(fd, [view], position)
        if got < wanted:
            view.release()
            # A sealed segment only shrinks when it is truncated: the cleaning is moot.
            raise CleaningAbortedError(f"a segment shrank below {position + got} bytes")
        return view

    def _grow_read_buffer(
        self, job: LogToClean, segment: SegmentToClean, position: int, needed: int
    ) -> None:
        """The next batch is larger than the read buffer: grow it, unless the batch claims more
        bytes than the segment has."""
        if needed > segment.size - position or needed <= len(self._read_buffer):
            raise CorruptRecordError(
                f"{job.topic_partition}: {segment.path.name} position {position}: a batch of "
                f"{needed} bytes where {segment.size - position} remain"
            )
        logger.info(
            "%s: growing the cleaner's read buffer to %d bytes", job.topic_partition, needed
        )
        self._read_buffer = bytearray(needed)

    def _flush(self, fd: int, written: int, stats: CleanerStats) -> None:
        if written:
            with memoryview(self._write_buffer) as view:
                _write_all(fd, view[:written])
            stats.bytes_written += written
            self.throttler.maybe_throttle(written)

    def _restore_buffers(self) -> None:
        if len(self._read_buffer) > self.io_buffer_size:
            self._read_buffer = bytearray(self.io_buffer_size)
        if len(self._write_buffer) > self.io_buffer_size:
            self._write_buffer = bytearray(self.io_buffer_size)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])
