"""Retention of one partition's log: deleting whole old segments by retention.ms, retention.bytes
and the log start offset, and moving the log start offset up (DeleteRecords).

`LogRetention` is a base of `Log` (log.py), on top of the segment list of `local_log`; the log
manager's retention task calls `delete_retention_segments`, the partition
`maybe_increment_log_start_offset`.

Concurrency: as `Log`'s — the broker's event loop thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from odradek.errors import OffsetOutOfRangeError
from odradek.log.local_log import LocalLog
from odradek.log.log_dir_failure import storage_errors
from odradek.log.segment import LogSegment

logger = logging.getLogger(__name__)


class LogRetention(LocalLog):
    """Deleting old segments and moving the log start offset (see the module docstring)."""

    # LocalLog's, restated for mypy: inside the log package's import cycle it cannot infer the
    # type of a base class's attribute that a subclass method assigns
    _log_start_offset: int
    _recovery_point: int

    # -- retention -----------------------------------------------------------------------------

    @storage_errors
    def delete_retention_segments(self, now_ms: int, high_watermark: int | None = None) -> int:
        """Delete whole old segments by retention.ms, retention.bytes and the log start offset.

        A segment goes when its largest timestamp is more than retention.ms old, when the log
        is larger than retention.bytes even without it (oldest first), or when it lies wholly
        below the log start offset. Retention by time and size applies only when cleanup.policy
        holds "delete" (a compacted topic keeps its segments for the cleaner). The active
        segment is never deleted, and with `high_watermark` neither is any segment holding
        offsets at or above it (data not yet replicated everywhere). Moves the log start offset
        up to the first remaining segment. Returns the number of segments deleted.
        """
        self._check_open()
        config = self._config
        deleted = 0
        if config.delete and config.retention_ms >= 0:
            deleted += self._delete_oldest_while(
                high_watermark,
                lambda segment, _next: now_ms - segment.largest_timestamp() > config.retention_ms,
            )
        if config.delete and config.retention_bytes >= 0:
            excess = self._size - config.retention_bytes

            def over_size(segment: LogSegment, _next: LogSegment) -> bool:
                nonlocal excess
                if excess - segment.size < 0:
                    return False
                excess -= segment.size
                return True

            deleted += self._delete_oldest_while(high_watermark, over_size)
        start = self._log_start_offset
        deleted += self._delete_oldest_while(
            high_watermark, lambda _segment, following: following.base_offset <= start
        )
        return deleted

    def _delete_oldest_while(
        self,
        high_watermark: int | None,
        predicate: Callable[[LogSegment, LogSegment], bool],
    ) -> int:
        count = 0
        while len(self._segments) > 1:
            segment, following = self._segments[0], self._segments[1]
            if high_watermark is not None and following.base_offset > high_watermark:
                break
            if not predicate(segment, following):
                break
            self._segments.pop(0)
            self._base_offsets.pop(0)
            self._size -= segment.size
            segment.delete()
            count += 1
        if count:
            new_start = self._segments[0].base_offset
            if new_start > self._log_start_offset:
                self._log_start_offset = new_start
                self._leader_epoch_cache.truncate_from_start(new_start)
                self._producer_state.on_log_start_offset_incremented(new_start)
            self._producer_state.delete_snapshots_before(new_start)
            self._txn_index.retain(self._base_offsets)
            self._recovery_point = max(self._recovery_point, new_start)
            logger.info("%s: deleted %d old segments, log start offset %d", self, count, new_start)
        return count

    @storage_errors
    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up to `offset` (DeleteRecords); segments wholly below it go
        at the next retention pass. Returns whether it moved."""
        self._check_open()
        if offset > self._log_end_offset:
            raise OffsetOutOfRangeError(
                f"{self}: cannot move the log start offset to {offset}, beyond the log end "
                f"offset {self._log_end_offset}"
            )
        if offset <= self._log_start_offset:
            return False
        self._log_start_offset = offset
        self._leader_epoch_cache.truncate_from_start(offset)
        self._producer_state.on_log_start_offset_incremented(offset)
        return True
