"""The segment list of one partition's log (Kafka's LocalLog): rolling, reads, truncation, and
swapping in the segments the log cleaner wrote.

`LocalLog` is a base of `Log` (log.py, whose module docstring states the rules: when a segment
rolls, what a read returns, that truncation works at batch boundaries); it holds no state of its
own but works on the fields `Log.__init__` sets, declared below. `log_retention` deletes old
segments on top of it.

Concurrency: as `Log`'s — the broker's event loop thread only.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from odradek.errors import OffsetOutOfRangeError
from odradek.log.append_info import LogAppendInfo
from odradek.log.checkpoints import fsync_dir
from odradek.log.config import LogConfig
from odradek.log.leader_epoch import LeaderEpochCache
from odradek.log.log_dir_failure import storage_errors
from odradek.log.producer_state import CompletedTxn, ProducerStateManager
from odradek.log.producer_state_loading import rebuild_producer_state
from odradek.log.segment import LogSegment
from odradek.log.segment_swap import delete_cleaned_files, swap_in
from odradek.log.transaction_index import TransactionIndexes
from odradek.protocol.fetch_response import FileHandle, FileRecords

_INT32_MAX = 2**31 - 1


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class LocalLog:
    """The segments of a `Log` and the operations that change the list (see the module docstring)."""

    # set by Log.__init__
    _dir: Path
    _config: LogConfig
    _segments: list[LogSegment]
    _base_offsets: list[int]
    _size: int
    _log_start_offset: int
    _log_end_offset: int
    _recovery_point: int
    _leader_epoch_cache: LeaderEpochCache
    _producer_state: ProducerStateManager
    _txn_index: TransactionIndexes
    _closed: bool
    on_truncate: Callable[[Any, int], None] | None

    if TYPE_CHECKING:  # defined by Log

        def _check_open(self) -> None: ...

        def flush(self, up_to: int | None = None) -> None: ...

        def _index_aborted(self, completed: list[CompletedTxn]) -> None: ...

    # -- rolling -------------------------------------------------------------------------------

    def _maybe_roll(self, info: LogAppendInfo, now_ms: int) -> None:
        """Roll before an append that the active segment should not take (module docstring)."""
        active = self._segments[-1]
        offsets_fit = info.last_offset - active.base_offset <= _INT32_MAX
        if active.size == 0:
            if not offsets_fit:
                # An empty segment based far below a replicated batch (a big gap): move it.
                self._replace_empty_active_segment(info.first_offset, now_ms)
            return
        config = self._config
        rolling_timestamp = active.rolling_timestamp()
        if rolling_timestamp >= 0:
            time_waited = info.max_timestamp - rolling_timestamp
        else:
            time_waited = now_ms - active.created_ms
        if (
            active.size + info.size > config.segment_bytes
            or time_waited > config.max_segment_ms
            or active.offset_index.is_full
            or active.time_index.is_full
            or not offsets_fit
        ):
            self._roll(info.first_offset, now_ms)

    def _roll(self, new_base_offset: int, now_ms: int) -> LogSegment:
        old = self._segments[-1]
        old.on_become_inactive()
        # Its data file too (fsynced just now): a sealed segment holds a descriptor only once a
        # reader opens it, so a log's descriptors do not grow with its rolls (Kafka keeps one
        # per segment).
        old.close_files()
        segment = self._new_segment(new_base_offset, now_ms)
        self._segments.append(segment)
        self._base_offsets.append(new_base_offset)
        fsync_dir(self._dir)
        # The producer state of everything before the new segment, named by its base offset:
        # recovery replays at most from here.
        self._producer_state.update_map_end_offset(new_base_offset)
        self._producer_state.take_snapshot()
        # Everything before the new segment is now fsynced (on_become_inactive flushed the
        # old segment; older ones were flushed when they were rolled or by flush()).
        self.flush(new_base_offset)
        return segment

    def _replace_empty_active_segment(self, base_offset: int, now_ms: int) -> None:
        self._segments.pop().delete()
        self._base_offsets.pop()
        self._segments.append(self._new_segment(base_offset, now_ms))
        self._base_offsets.append(base_offset)

    def _new_segment(self, base_offset: int, now_ms: int) -> LogSegment:
        """A new empty segment at `base_offset`, its indexes as the log's config says."""
        return LogSegment.create(
            self._dir,
            base_offset,
            max_index_bytes=self._config.segment_index_bytes,
            index_interval_bytes=self._config.index_interval_bytes,
            now_ms=now_ms,
        )

    @storage_errors
    def roll(self, now_ms: int | None = None) -> LogSegment:
        """Start a new segment at the LEO (a no-op when the active segment is empty)."""
        self._check_open()
        if self._segments[-1].size == 0:
            return self._segments[-1]
        return self._roll(self._log_end_offset, _wall_clock_ms() if now_ms is None else now_ms)

    # -- reads ---------------------------------------------------------------------------------

    @storage_errors
    def read(
        self,
        start_offset: int,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> bytes:
        """Whole batches from the one holding `start_offset`, from a single segment.

        Stops before any batch whose base offset is >= `max_offset` (the high watermark for
        consumers; None means the LEO) and within `max_bytes`, except that with `min_one_batch`
        the first batch comes whole even when larger (KIP-74). Returns b"" at the LEO or at or
        beyond `max_offset`; raises OffsetOutOfRangeError below the log start offset or beyond
        the LEO.
        """
        found = self._read_start(start_offset, max_offset)
        if found is None:
            return b""
        index, limit = found
        segments = self._segments
        while index < len(segments):
            data = segments[index].read(start_offset, max_bytes, limit, min_one_batch)
            if data is not None:
                return data
            index += 1
        return b""

    @storage_errors
    def read_file_records(
        self,
        start_offset: int,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> FileRecords | bytes:
        """`read`, as a range of a segment file rather than its bytes (zero-copy fetch): the
        same batches, found from the indexes and batch headers only. b"" when there is
        nothing to read."""
        found = self._read_start(start_offset, max_offset)
        if found is None:
            return b""
        index, limit = found
        segments = self._segments
        while index < len(segments):
            segment = segments[index]
            found = segment.read_range(start_offset, max_bytes, limit, min_one_batch)
            if found is not None:
                position, size = found
                return FileRecords(FileHandle(segment.fd), position, size) if size else b""
            index += 1
        return b""

    def _read_start(self, start_offset: int, max_offset: int | None) -> tuple[int, int] | None:
        """Where a read of `start_offset` begins: (index of its segment, the offset it stops
        at), or None when there is nothing to read; OffsetOutOfRangeError outside the log."""
        self._check_open()
        end = self._log_end_offset
        if start_offset < self._log_start_offset or start_offset > end:
            raise OffsetOutOfRangeError(
                f"{self}: offset {start_offset} is outside [{self._log_start_offset}, {end}]"
            )
        limit = end if max_offset is None else min(max_offset, end)
        if start_offset >= limit:
            return None
        return max(bisect_right(self._base_offsets, start_offset) - 1, 0), limit

    def offset_after_range(self, records: FileRecords) -> int:
        """The offset of the first batch after a range `read_file_records` returned: the base
        offset of the batch that follows it in its segment file, or, at the end of that file,
        the next segment's base offset (the log end offset for the active segment). Appends run
        on this thread, so no half-written header is ever read."""
        head = os.pread(records.fd, 8, records.position + records.size)
        if len(head) == 8:
            return int.from_bytes(head, "big", signed=True)
        first = int.from_bytes(os.pread(records.fd, 8, records.position), "big", signed=True)
        index = bisect_right(self._base_offsets, first)
        return (
            self._base_offsets[index] if index < len(self._base_offsets) else self._log_end_offset
        )

    def _segments_from(self, offset: int) -> list[LogSegment]:
        return self._segments[max(bisect_right(self._base_offsets, offset) - 1, 0) :]

    # -- truncation ----------------------------------------------------------------------------

    @storage_errors
    def truncate_to(self, offset: int, now_ms: int | None = None) -> bool:
        """Remove every batch holding offsets >= `offset` (a follower's truncation).

        Works at batch boundaries: a batch that straddles `offset` is removed whole. Later
        segments are deleted, the leader epoch cache forgets epochs that started at or after
        the new LEO, and the log start and recovery point move down if needed. Returns whether
        anything was removed.
        """
        self._check_open()
        if offset < 0:
            raise OffsetOutOfRangeError(f"{self}: cannot truncate to negative offset {offset}")
        if offset >= self._log_end_offset:
            return False
        if self.on_truncate is not None:
            self.on_truncate(self, offset)
        now_ms = _wall_clock_ms() if now_ms is None else now_ms
        if offset < self._segments[0].base_offset:
            self.truncate_fully_and_start_at(offset, now_ms)
            return True
        while len(self._segments) > 1 and self._segments[-1].base_offset > offset:
            segment = self._segments.pop()
            self._base_offsets.pop()
            self._size -= segment.size
            segment.delete()
        active = self._segments[-1]
        self._size -= active.truncate_to(offset, now_ms)
        active.index_interval_bytes = self._config.index_interval_bytes
        self._log_end_offset = active.next_offset
        self._recovery_point = min(self._recovery_point, self._log_end_offset)
        self._log_start_offset = min(self._log_start_offset, self._log_end_offset)
        self._leader_epoch_cache.truncate_from_end(self._log_end_offset)
        self._txn_index.truncate_to(self._log_end_offset)
        rebuild_producer_state(
            self._producer_state,
            self._segments,
            self._log_start_offset,
            self._log_end_offset,
            now_ms,
            on_completed=self._index_aborted,
        )
        return True

    @storage_errors
    def truncate_fully_and_start_at(self, offset: int, now_ms: int | None = None) -> None:
        """Delete everything and restart the log empty at `offset` (a follower whose fetch
        offset fell below the leader's log start)."""
        self._check_open()
        if self.on_truncate is not None:
            self.on_truncate(self, offset)
        for segment in self._segments:
            segment.delete()
        segment = self._new_segment(offset, _wall_clock_ms() if now_ms is None else now_ms)
        fsync_dir(self._dir)
        self._segments = [segment]
        self._base_offsets = [offset]
        self._size = 0
        self._log_start_offset = self._log_end_offset = self._recovery_point = offset
        self._leader_epoch_cache.clear_and_flush()
        self._producer_state.truncate_fully_and_start_at(offset)
        self._txn_index.delete_all()

    # -- compaction ----------------------------------------------------------------------------

    @storage_errors
    def replace_segments(
        self, old: Sequence[LogSegment], sizes: Sequence[int], cleaned_size: int, now_ms: int
    ) -> bool:
        """Swap the segment the log cleaner wrote (`<base>.*.cleaned`, base = old[0]'s) in for
        the consecutive sealed segments `old` (see segment_swap for the crash-safe steps).

        Refused (False, the cleaned files deleted) when the log is closed or the old segments are
        no longer exactly what the cleaner read: the same objects, consecutive, not the active
        segment, with the `sizes` it read (retention, a truncation or a deletion got there
        first). On success the old segments' files carry the `.deleted` suffix: the caller
        removes them after file.delete.delay.ms.
        """
        base_offset = old[0].base_offset
        if not self._can_replace(old, sizes):
            delete_cleaned_files(self._dir, base_offset)
            return False
        first = self._segments.index(old[0])
        for segment in old:
            segment.release()
        swap_in(self._dir, base_offset, list(old))
        self._txn_index.replaced([segment.base_offset for segment in old], base_offset)
        cleaned = LogSegment(
            self._dir,
            base_offset,
            max_index_bytes=self._config.segment_index_bytes,
            index_interval_bytes=self._config.index_interval_bytes,
            size=cleaned_size,
            created_ms=now_ms,
        )
        self._segments[first : first + len(old)] = [cleaned]
        self._base_offsets[first : first + len(old)] = [base_offset]
        self._size += cleaned_size - sum(sizes)
        return True

    def _can_replace(self, old: Sequence[LogSegment], sizes: Sequence[int]) -> bool:
        if self._closed or not old or len(old) != len(sizes):
            return False
        try:
            first = self._segments.index(old[0])
        except ValueError:
            return False
        if first + len(old) >= len(self._segments):  # would include the active segment
            return False
        current = self._segments[first : first + len(old)]
        return all(a is b for a, b in zip(current, old, strict=True)) and all(
            segment.size == size for segment, size in zip(old, sizes, strict=True)
        )
