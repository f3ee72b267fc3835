"""Which compacted log to clean next, and where each one's dirty section starts (Kafka's
LogCleanerManager).

Checkpoint. `cleaner-offset-checkpoint` in each log directory (the same format as the other offset
checkpoints: `0`, the entry count, then `<topic> <partition> <offset>` lines) holds, per
compacted log, the first dirty offset: everything below it was cleaned. A log without an entry
starts dirty at its log start offset; an entry below the log start offset or beyond the log end
offset (a truncation, lost data) is reset to the log start offset. A truncation below the entry
lowers it to the truncation offset.

Choosing a log (`grab_filthiest_log`), for every log whose cleanup.policy has compact and that is
not being cleaned or marked uncleanable:

* the cleanable range ends at the first uncleanable offset: the smallest of the partition's high
  watermark (`stable_offset_of`: nothing not yet replicated is cleaned; transactions will make it
  the last stable offset), the active segment's base offset (the active segment is never
  cleaned) and the base offset of the first dirty segment whose newest record is younger than
  min.compaction.lag.ms; rounded down to the start of its segment;
* its dirty ratio is the bytes of the segments from the first dirty offset to there, over those
  plus the bytes of the segments below the first dirty offset;
* it is due when that ratio exceeds min.cleanable.dirty.ratio, or when it has dirty bytes and the
  first batch of some dirty segment is older than max.compaction.lag.ms;
* also due (an Odradek addition; Kafka waits for the ratio): a log whose last cleaning kept
  tombstones, once delete.retention.ms has passed since, so that they go without new writes.

The due log with the highest ratio is cleaned (logs due by lag or tombstones count as ratio 1).

Concurrency: every method runs on the event loop thread, except `check_abort`, which cleaner
threads call: it reads one dict entry that only the loop writes (atomic under the GIL).
"""

from __future__ import annotations

import enum
import logging
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from odradek.errors import CorruptIndexError, CorruptRecordError, KafkaStorageError
from odradek.log.checkpoints import OffsetCheckpointFile
from odradek.log.cleaner import CleaningAbortedError, LogToClean, SegmentToClean
from odradek.log.log import Log
from odradek.log.naming import CLEANER_OFFSET_CHECKPOINT
from odradek.log.segment import LogSegment

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class CleaningState(enum.Enum):
    """A log's state while the cleaner holds it (Kafka's LogCleaningInProgress/Aborted)."""

    IN_PROGRESS = "in progress"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class _Candidate:
    topic_partition: TopicPartition
    log: Log
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    needs_compaction_now: bool
    tombstones_due: bool

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0

    @property
    def due(self) -> bool:
        if self.needs_compaction_now and self.cleanable_bytes > 0:
            return True
        return self.tombstones_due or self.ratio > self.log.config.min_cleanable_dirty_ratio

    @property
    def priority(self) -> float:
        return 1.0 if self.needs_compaction_now or self.tombstones_due else self.ratio


class LogCleanerManager:
    """Cleaner checkpoints and the choice of the next log (module docstring)."""

    def __init__(
        self,
        logs: Callable[[], Mapping[TopicPartition, Log]],
        dir_of: Callable[[TopicPartition], Path | None],
        stable_offset_of: Callable[[str, int], int | None],
    ) -> None:
        self._logs = logs
        self._dir_of = dir_of
        self._stable_offset_of = stable_offset_of
        self._checkpoints: dict[Path, dict[TopicPartition, int]] = {}
        self._states: dict[TopicPartition, CleaningState] = {}
        self._uncleanable: set[TopicPartition] = set()
        self._tombstones_due: dict[TopicPartition, int] = {}

    # -- checkpoints -----------------------------------------------------------------------------

    def load_checkpoints(self, log_dirs: list[Path]) -> None:
        for log_dir in log_dirs:
            try:
                self._checkpoints[log_dir] = OffsetCheckpointFile(
                    log_dir / CLEANER_OFFSET_CHECKPOINT
                ).read()
            except KafkaStorageError as e:
                logger.warning(
                    "%s; every compacted log in %s is cleaned from its start", e, log_dir
                )
                self._checkpoints[log_dir] = {}

    def checkpoint(self, topic_partition: TopicPartition) -> int | None:
        log_dir = self._dir_of(topic_partition)
        if log_dir is None:
            return None
        return self._checkpoints.get(log_dir, {}).get(topic_partition)

    def _write_checkpoint(
        self, topic_partition: TopicPartition, offset: int | None, log_dir: Path | None = None
    ) -> None:
        log_dir = log_dir or self._dir_of(topic_partition)
        if log_dir is None:
            return
        entries = self._checkpoints.setdefault(log_dir, {})
        if offset is None:
            if entries.pop(topic_partition, None) is None:
                return
        else:
            entries[topic_partition] = offset
        OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT).write(entries)

    def maybe_truncate_checkpoint(self, topic_partition: TopicPartition, offset: int) -> None:
        """A truncation to `offset`: a first dirty offset beyond it comes down to it."""
        current = self.checkpoint(topic_partition)
        if current is not None and current > offset:
            self._write_checkpoint(topic_partition, offset)

    def forget(self, topic_partition: TopicPartition, log_dir: Path) -> None:
        """The log is deleted: drop its checkpoint entry and any state."""
        self._states.pop(topic_partition, None)
        self._uncleanable.discard(topic_partition)
        self._tombstones_due.pop(topic_partition, None)
        self._write_checkpoint(topic_partition, None, log_dir)

    # -- cleaning states ---------------------------------------------------------------------------

    def is_cleaning(self, topic_partition: TopicPartition) -> bool:
        return topic_partition in self._states

    def abort(self, topic_partition: TopicPartition) -> bool:
        """Stop the log's cleaning at its next check; returns whether one was running."""
        if topic_partition not in self._states:
            return False
        self._states[topic_partition] = CleaningState.ABORTED
        return True

    def is_aborted(self, topic_partition: TopicPartition) -> bool:
        return self._states.get(topic_partition) is CleaningState.ABORTED

    def check_abort(self, topic_partition: TopicPartition) -> None:
        """Cleaner threads: raise CleaningAbortedError if the log's cleaning was aborted."""
        if self._states.get(topic_partition) is CleaningState.ABORTED:
            raise CleaningAbortedError(f"{topic_partition[0]}-{topic_partition[1]}: aborted")

    def done_cleaning(
        self,
        topic_partition: TopicPartition,
        end_offset: int,
        tombstones_kept: int,
        delete_retention_ms: int,
        now_ms: int,
    ) -> None:
        """A cleaning finished: the dirty section now starts at `end_offset`."""
        self._states.pop(topic_partition, None)
        self._write_checkpoint(topic_partition, end_offset)
        if tombstones_kept:
            self._tombstones_due[topic_partition] = now_ms + delete_retention_ms
        else:
            self._tombstones_due.pop(topic_partition, None)

    def cleaning_ended(self, topic_partition: TopicPartition) -> None:
        """A cleaning stopped without finishing (aborted or failed)."""
        self._states.pop(topic_partition, None)

    def mark_uncleanable(self, topic_partition: TopicPartition) -> None:
        self._states.pop(topic_partition, None)
        self._uncleanable.add(topic_partition)

    @property
    def uncleanable(self) -> frozenset[TopicPartition]:
        return frozenset(self._uncleanable)

    # -- choosing a log ----------------------------------------------------------------------------

    def grab_filthiest_log(self, now_ms: int) -> LogToClean | None:
        """The due log with the highest dirty ratio, marked in progress; None if none is due."""
        best: _Candidate | None = None
        for topic_partition, log in list(self._logs().items()):
            if (
                log.is_closed
                or not log.config.compact
                or topic_partition in self._states
                or topic_partition in self._uncleanable
            ):
                continue
            try:
                candidate = self._candidate(topic_partition, log, now_ms)
            except (KafkaStorageError, CorruptIndexError, CorruptRecordError, OSError) as e:
                logger.warning("%s: cannot tell what to clean: %s", log, e)
                continue
            if candidate is None or not candidate.due:
                continue
            if best is None or candidate.priority > best.priority:
                best = candidate
        if best is None:
            return None
        job = self._snapshot(best)
        self._states[best.topic_partition] = CleaningState.IN_PROGRESS
        return job

    def _candidate(
        self, topic_partition: TopicPartition, log: Log, now_ms: int
    ) -> _Candidate | None:
        stable_offset = self._stable_offset_of(*topic_partition)
        if stable_offset is None:
            return None  # not a partition this broker serves (yet)
        segments = log.segments()
        base_offsets = [segment.base_offset for segment in segments]
        active = segments[-1]
        config = log.config
        start = log.log_start_offset
        first_dirty = self.checkpoint(topic_partition)
        if first_dirty is None or first_dirty < start or first_dirty > log.log_end_offset:
            if first_dirty is not None:
                logger.warning(
                    "%s: resetting the first dirty offset %d to the log start offset %d",
                    log,
                    first_dirty,
                    start,
                )
                self._write_checkpoint(topic_partition, start)
            first_dirty = start
        uncleanable = min(stable_offset, active.base_offset)
        dirty_index = max(bisect_right(base_offsets, first_dirty) - 1, 0)
        dirty_non_active = segments[dirty_index:-1]
        if config.min_compaction_lag_ms > 0:
            for segment in dirty_non_active:
                if segment.largest_timestamp() > now_ms - config.min_compaction_lag_ms:
                    uncleanable = min(uncleanable, segment.base_offset)
                    break
        uncleanable = max(first_dirty, uncleanable)
        uncleanable_index = max(bisect_right(base_offsets, uncleanable) - 1, 0)
        first_uncleanable_offset = segments[uncleanable_index].base_offset
        clean_bytes = sum(s.size for s in segments if s.base_offset < first_dirty)
        cleanable_bytes = 0
        if first_dirty < first_uncleanable_offset:
            cleanable_bytes = sum(s.size for s in segments[dirty_index:uncleanable_index])
        if clean_bytes + cleanable_bytes == 0:
            return None
        due_at = self._tombstones_due.get(topic_partition)
        return _Candidate(
            topic_partition,
            log,
            first_dirty,
            first_uncleanable_offset,
            clean_bytes,
            cleanable_bytes,
            self._max_compaction_delay(dirty_non_active, config.max_compaction_lag_ms, now_ms) > 0,
            due_at is not None and now_ms >= due_at and clean_bytes > 0,
        )

    @staticmethod
    def _max_compaction_delay(segments: list[LogSegment], max_lag_ms: int, now_ms: int) -> int:
        """How long past max.compaction.lag.ms the oldest dirty data is (0: not past it)."""
        timestamps = [t for t in (s.rolling_timestamp() for s in segments) if t > 0]
        if not timestamps:
            return 0
        clean_until = now_ms - max(max_lag_ms, 0)
        earliest = min(timestamps)
        return clean_until - earliest if earliest < clean_until else 0

    def _snapshot(self, candidate: _Candidate) -> LogToClean:
        log = candidate.log
        segments = log.segments()
        snapshot = []
        map_start_position = 0
        for i, segment in enumerate(segments[:-1]):
            if segment.base_offset >= candidate.first_uncleanable_offset:
                break
            next_base = segments[i + 1].base_offset
            if segment.base_offset <= candidate.first_dirty_offset < next_base:
                header = segment.find_batch(candidate.first_dirty_offset)
                map_start_position = segment.size if header is None else header.position
            snapshot.append(
                SegmentToClean(
                    segment=segment,
                    base_offset=segment.base_offset,
                    path=segment.log_path,
                    size=segment.size,
                    next_base_offset=next_base,
                    index_bytes=segment.offset_index.entry_count * 8,
                    time_index_bytes=segment.time_index.entry_count * 12,
                )
            )
        return LogToClean(
            topic_partition=candidate.topic_partition,
            directory=log.dir,
            config=log.config,
            segments=tuple(snapshot),
            first_dirty_offset=candidate.first_dirty_offset,
            first_uncleanable_offset=candidate.first_uncleanable_offset,
            map_start_position=map_start_position,
            needs_compaction_now=candidate.needs_compaction_now,
        )
