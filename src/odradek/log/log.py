"""One partition's log: an ordered list of segments, the last of which takes appends.

Offsets. `log_start_offset` is the first offset readers may see (retention and DeleteRecords move it
up); `log_end_offset` (LEO) is the offset the next appended record gets; `recovery_point` is the
offset below which everything has been fsynced, so that recovery after a crash only has to
validate what follows it. Always log_start_offset <= recovery_point <= LEO... except that the
recovery point may lag the log start offset after retention, which is harmless.

Appends. The leader validates a produce request's batch (`odradek.log.validator`: header, CRC,
and every record, natively and decompressed if need be), stamps base offsets from the LEO and its
leader epoch into it, optionally LogAppendTime, and writes it byte for byte. A follower writes batches copied from the leader as they are, after checking their
CRC and that their offsets continue the log. Before an append the active segment is rolled when the
append would make it exceed segment.bytes, when segment.ms has passed since its first batch's
timestamp (Kafka's rule: the new batches' max timestamp minus the first batch's max timestamp,
or the segment's age when it has no timestamps), when one of its indexes is full, or when the new
offsets would not fit 32-bit offsets relative to its base. The whole append goes to one segment.

Reads return whole batches from one segment, like Kafka's: a fetch that reaches the end of a
segment returns what that segment has and the client asks again from the next offset.

Truncation always happens at batch boundaries: `truncate_to(offset)` removes the batch holding
`offset` and everything after, so the LEO afterwards is <= `offset`.

Where it lives: this module has opening, appends, transactions, ListOffsets and the lifecycle;
the segment list's operations (rolling, reads, truncation, the cleaner's segment swap) are in
`local_log` (Kafka's LocalLog), retention in `log_retention`; `Log` inherits both.

Concurrency: not thread-safe. A `Log` is used only from the broker's event loop thread (the
partition that owns it calls it; the log manager opens, flushes and closes it). All I/O is
synchronous page-cache I/O; fsync happens only in `flush`, `roll` and `close`.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import Any

from odradek.errors import (
    InvalidRecordError,
    KafkaStorageError,
    RecordBatchTooLargeError,
)
from odradek.histogram import LatencyHistogram
from odradek.log.append_info import LogAppendInfo, append_info
from odradek.log.config import LogConfig
from odradek.log.leader_epoch import LeaderEpochCache
from odradek.log.local_log import _wall_clock_ms
from odradek.log.log_dir_failure import LogDirFailureChannel, storage_errors
from odradek.log.log_retention import LogRetention
from odradek.log.naming import (
    LEADER_EPOCH_CHECKPOINT,
    Listing,
    child_path,
    parse_log_dir_name,
    read_listing,
)
from odradek.log.partition_metadata import read_partition_topic_id, write_partition_topic_id
from odradek.log.producer_state import (
    AppendOrigin,
    CompletedTxn,
    ProducerStateManager,
    last_sequence,
)
from odradek.log.producer_state_loading import markers_in, rebuild_producer_state
from odradek.log.recovery import load_segments
from odradek.log.segment import LogSegment
from odradek.log.timestamp_search import offset_for_timestamp, offset_of_largest_timestamp
from odradek.log.transaction_index import AbortedTxn, TransactionIndexes
from odradek.log.validator import ValidatedRecords, validate_produce_records
from odradek.protocol.record_batch import (
    NO_TIMESTAMP,
    BatchHeader,
    assign_offsets,
    set_create_time,
    validate_replicated_batches,
)

logger = logging.getLogger(__name__)

# Kafka's LogFlushStats.LogFlushRateAndTimeMs: every flush that fsynced something (a roll's flush
# of the segments before the new one, a shutdown's), of every log of this process, in ns.
LOG_FLUSH_TIMES = LatencyHistogram()

EARLIEST_TIMESTAMP = -2
"""ListOffsets' "earliest" sentinel: answered with the log start offset."""
LATEST_TIMESTAMP = -1
"""ListOffsets' "latest" sentinel: answered with the log end offset."""
MAX_TIMESTAMP = -3
"""ListOffsets' KIP-734 sentinel: the record with the largest timestamp."""


class Log(LogRetention):
    """A partition's segmented log (semantics in the module docstring).

    Not thread-safe: called only from the broker's event loop thread, by the partition that owns
    it and by the log manager. It takes no locks; a caller holding the partition's state must not
    await between reading the log end offset and appending.
    """

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        log_end_offset: int,
        recovery_point: int,
        leader_epoch_cache: LeaderEpochCache,
        failure_channel: LogDirFailureChannel | None = None,
        producer_state: ProducerStateManager | None = None,
        listing: Listing | None = None,
    ) -> None:
        """Use `Log.open`; this only assembles already loaded parts (`listing`: the
        directory's entries, which `Log.open` has read)."""
        parsed = parse_log_dir_name(directory.name)
        if parsed is None:
            raise KafkaStorageError(f"{directory} is not named <topic>-<partition>")
        self.topic, self.partition = parsed
        self._dir = directory
        self._config = config
        self._segments = segments
        self._base_offsets = [segment.base_offset for segment in segments]
        self._log_start_offset = log_start_offset
        self._log_end_offset = log_end_offset
        self._recovery_point = recovery_point
        self._size = sum(segment.size for segment in segments)
        self._leader_epoch_cache = leader_epoch_cache
        self._producer_state = producer_state or ProducerStateManager(
            directory, f"{self.topic}-{self.partition}", config.producer_id_expiration_ms, listing
        )
        self._txn_index = TransactionIndexes(directory, listing)
        self._closed = False
        self.failure_channel = failure_channel
        self.parent_dir = directory.parent
        self.on_truncate: Callable[[Log, int], None] | None = None
        """Called before a truncation with the new end offset (the log cleaner aborts a cleaning
        of this log and lowers its checkpoint); set by the log manager."""

    @classmethod
    @storage_errors
    def open(
        cls,
        directory: Path,
        config: LogConfig,
        *,
        recovery_point: int,
        log_start_offset: int,
        clean_shutdown: bool,
        now_ms: int,
        failure_channel: LogDirFailureChannel | None = None,
    ) -> Log:
        """Open (creating if new) the log in `directory`, named `<topic>-<partition>`.

        Lazy after a clean shutdown; validates and truncates the unflushed tail after an
        unclean one (see recovery.py). `log_start_offset` and `recovery_point` come from the log
        directory's checkpoint files (0 when absent).
        """
        if parse_log_dir_name(directory.name) is None:
            raise KafkaStorageError(f"{directory} is not named <topic>-<partition>")
        try:
            listing = read_listing(directory)
        except FileNotFoundError:
            directory.mkdir(parents=True, exist_ok=True)
            listing = {}
        try:
            cache = LeaderEpochCache(
                child_path(directory, LEADER_EPOCH_CHECKPOINT),
                exists=LEADER_EPOCH_CHECKPOINT in listing,
            )
        except KafkaStorageError as e:
            # The data still carries every batch's leader epoch: recover the whole log, which
            # re-records the epochs, rather than serve OffsetForLeaderEpoch from a lost history.
            logger.warning("%s; rebuilding the leader epoch cache from the data", e)
            (directory / LEADER_EPOCH_CHECKPOINT).unlink()
            cache = LeaderEpochCache(directory / LEADER_EPOCH_CHECKPOINT)
            clean_shutdown, recovery_point = False, 0
        loaded = load_segments(
            directory,
            config,
            cache,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            clean_shutdown=clean_shutdown,
            now_ms=now_ms,
            listing=listing,
        )
        start = max(log_start_offset, loaded.segments[0].base_offset)
        log = cls(
            directory,
            config,
            loaded.segments,
            log_start_offset=start,
            log_end_offset=loaded.log_end_offset,
            recovery_point=loaded.recovery_point,
            leader_epoch_cache=cache,
            failure_channel=failure_channel,
            listing=listing,
        )
        if start > log.log_end_offset:
            # The checkpointed start is past the data (e.g. recovery cut the tail below it):
            # nothing readable remains, so restart the log at the start offset.
            log.truncate_fully_and_start_at(start, now_ms)
        else:
            cache.truncate_from_end(log.log_end_offset)
            cache.truncate_from_start(start)
            log._txn_index.truncate_to(log.log_end_offset)  # a torn tail's markers are gone
            state = log._producer_state
            state.remove_stray_snapshots(segment.base_offset for segment in log._segments)
            rebuild_producer_state(
                state,
                log._segments,
                start,
                log.log_end_offset,
                now_ms,
                reload_from_clean_shutdown=clean_shutdown,
                on_completed=log._index_aborted,
            )
            log._txn_index.retain(log._base_offsets)
        if loaded.recovered:
            # One line per log: INFO when there was data to validate, DEBUG for an empty log
            # (after a crash a broker may recover 10,000 of those; what recovery cut off is a
            # WARNING of its own either way).
            logger.log(
                logging.INFO if log.log_end_offset > log.log_start_offset else logging.DEBUG,
                "%s: recovered, log end offset %d, %d segments",
                log,
                log.log_end_offset,
                log.segment_count,
            )
        return log

    # -- properties --------------------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def config(self) -> LogConfig:
        return self._config

    @config.setter
    def config(self, config: LogConfig) -> None:
        """New settings apply from the next append; index sizes from the next segment."""
        self._config = config
        self._segments[-1].index_interval_bytes = config.index_interval_bytes

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size_in_bytes(self) -> int:
        return self._size

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def leader_epoch_cache(self) -> LeaderEpochCache:
        return self._leader_epoch_cache

    @property
    def producer_state(self) -> ProducerStateManager:
        return self._producer_state

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """The partition's HW moved up: transactions completed below it are no longer unstable."""
        self._producer_state.on_high_watermark_updated(high_watermark)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    def segments(self) -> list[LogSegment]:
        """The segments in offset order (a copy of the list; the segments themselves are live)."""
        return list(self._segments)

    def __repr__(self) -> str:
        return f"Log({self.topic}-{self.partition})"

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"{self} is closed")

    # -- appends -------------------------------------------------------------------------------

    @storage_errors
    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        now_ms: int,
        *,
        validated: ValidatedRecords | None = None,
        budget: int | None = None,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> LogAppendInfo:
        """Validate a produce request's records, assign offsets from the LEO, stamp the leader
        epoch (and LogAppendTime if configured) and append them.

        A batch of a producer id is first checked against the producer state: a duplicate of
        one of the producer's last 5 batches is answered with that batch's offsets and not
        appended (`batch_count` 0); a batch out of sequence or of a fenced epoch raises
        OutOfOrderSequenceError / InvalidProducerEpochError / InvalidTxnStateError.

        Raises the validator's errors (CorruptRecordError, InvalidRecordError, RecordTooLargeError,
        InvalidTimestampError, ...) or RecordBatchTooLargeError (more than segment.bytes at once)
        without writing anything. `budget` bounds the validation work done here (NeedsWorkerThread
        beyond it); `validated` is the result of a validation already done elsewhere.
        """
        self._check_open()
        if validated is None:
            validated = validate_produce_records(
                records,
                self._config,
                now_ms,
                budget,
                f"{self.topic}-{self.partition}",
                allow_control=origin is AppendOrigin.COORDINATOR,
            )
        size = validated.size
        self._check_fits_segment(size)
        state = self._producer_state
        if validated.header.producer_id >= 0 and origin is AppendOrigin.CLIENT:
            duplicate = self._find_duplicate(validated.header)
            if duplicate is not None:
                return duplicate
        if validated.batch is not None:  # recompressed for the topic's compression.type
            data = bytearray(validated.batch)
        else:
            data = bytearray(memoryview(records)[:size])
        headers = [validated.header]
        if validated.fix_create_time:
            headers = [set_create_time(data, validated.header, validated.max_timestamp)]
        append_time = now_ms if self._config.uses_log_append_time else None
        headers = assign_offsets(data, headers, self._log_end_offset, leader_epoch, append_time)
        info = append_info(
            headers, size, NO_TIMESTAMP if append_time is None else now_ms, self._log_start_offset
        )
        if headers[0].producer_id >= 0:
            # Kafka's producer state rules (log/producer_state.py): raises before anything is
            # written; the state changes only once the batch is in the log.
            infos, completed = state.apply_batches(headers, origin, markers_in(data, headers))
            self._append(data, headers, info, now_ms)
            self._index_aborted(completed)
            state.commit(infos, completed, self._log_end_offset)
        else:
            self._append(data, headers, info, now_ms)
            state.map_end_offset = self._log_end_offset
        if leader_epoch > self._leader_epoch_cache.latest_epoch:
            self._leader_epoch_cache.assign(leader_epoch, info.first_offset)
        return info

    def _find_duplicate(self, header: BatchHeader) -> LogAppendInfo | None:
        entry = self._producer_state.last_entry(header.producer_id)
        if entry is None:
            return None
        duplicate = entry.find_duplicate_batch(
            header.producer_epoch, header.base_sequence, last_sequence(header)
        )
        if duplicate is None:
            return None
        return LogAppendInfo(
            first_offset=duplicate.first_offset,
            last_offset=duplicate.last_offset,
            max_timestamp=duplicate.timestamp,
            offset_of_max_timestamp=duplicate.last_offset,
            log_append_time=NO_TIMESTAMP,
            batch_count=0,
            size=0,
            log_start_offset=self._log_start_offset,
        )

    @storage_errors
    def append_as_follower(
        self, records: bytes | bytearray | memoryview, now_ms: int | None = None
    ) -> LogAppendInfo:
        """Append batches copied from the leader, offsets and epochs included, unchanged.

        The batches must be intact (CorruptRecordError otherwise) and their offsets must
        increase strictly, starting at or after the LEO (InvalidRecordError otherwise; gaps are
        allowed, as a leader's log may have them). Batches of a leader epoch newer than the
        cache's latest record that epoch's start. `now_ms` only matters for rolling segments
        that carry no timestamps; the wall clock is used when it is omitted.
        """
        self._check_open()
        headers = validate_replicated_batches(records)
        if not headers:
            return self._empty_append_info()
        previous_last = self._log_end_offset - 1
        for header in headers:
            if header.base_offset <= previous_last:
                raise InvalidRecordError(
                    f"{self}: replicated batch at offset {header.base_offset} does not follow "
                    f"offset {previous_last} (log end offset {self._log_end_offset})"
                )
            previous_last = header.base_offset + header.last_offset_delta
        size = len(records)
        self._check_fits_segment(size)
        info = append_info(headers, size, NO_TIMESTAMP, self._log_start_offset)
        state = self._producer_state
        infos, completed = state.apply_batches(
            headers, AppendOrigin.REPLICATION, markers_in(records, headers)
        )
        self._append(records, headers, info, _wall_clock_ms() if now_ms is None else now_ms)
        self._index_aborted(completed)
        state.commit(infos, completed, self._log_end_offset)
        cache = self._leader_epoch_cache
        for header in headers:
            if header.partition_leader_epoch > cache.latest_epoch:
                cache.assign(header.partition_leader_epoch, header.base_offset)
        return info

    # -- transactions ------------------------------------------------------------------------------

    def _index_aborted(self, completed: list[CompletedTxn]) -> None:
        """Record the aborted transactions among `completed` (their markers are in the log, the
        producer state has not completed them yet) in the `.txnindex` of the marker's segment."""
        for txn in completed:
            if not txn.is_aborted:
                continue
            segment = self._base_offsets[bisect_right(self._base_offsets, txn.last_offset) - 1]
            self._txn_index.append(
                segment,
                AbortedTxn(
                    txn.producer_id,
                    txn.first_offset,
                    txn.last_offset,
                    self._producer_state.last_stable_offset(txn),
                ),
            )

    def last_stable_offset(self, high_watermark: int) -> int:
        """The LSO: the first offset of a transaction not yet decided (open, or closed by a marker
        still above the HW), at most the high watermark (Kafka's UnifiedLog.lastStableOffset)."""
        state = self._producer_state
        state.on_high_watermark_updated(high_watermark)
        first_unstable = state.first_unstable_offset()
        if first_unstable is None:
            return high_watermark
        return min(first_unstable, high_watermark)

    def collect_aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions a read_committed read of [fetch_offset, upper_bound) needs."""
        return self._txn_index.collect(fetch_offset, upper_bound)

    def _empty_append_info(self) -> LogAppendInfo:
        return LogAppendInfo(-1, -1, NO_TIMESTAMP, -1, NO_TIMESTAMP, 0, 0, self._log_start_offset)

    def _check_fits_segment(self, size: int) -> None:
        if size > self._config.segment_bytes:
            raise RecordBatchTooLargeError(
                f"{self}: {size} bytes of records exceed segment.bytes {self._config.segment_bytes}"
            )

    def _append(
        self,
        data: bytes | bytearray | memoryview,
        headers: list[BatchHeader],
        info: LogAppendInfo,
        now_ms: int,
    ) -> None:
        self._maybe_roll(info, now_ms)
        self._segments[-1].append(data, headers)
        self._size += info.size
        self._log_end_offset = info.last_offset + 1

    # -- ListOffsets ---------------------------------------------------------------------------

    @storage_errors
    def fetch_offset_by_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """ListOffsets: (offset, timestamp) of the first record with timestamp >= `timestamp`.

        Also answers the sentinels: -2 (earliest) gives (log start offset, -1), -1 (latest)
        gives (LEO, -1), -3 gives the record with the largest timestamp (KIP-734). None when
        no record is that recent. Searching uses the time index to find the segment and a
        starting position, then batch headers (whose maxTimestamp bounds their records); within
        the batch found, uncompressed and gzip CreateTime batches are searched record by record
        as Kafka does, while LogAppendTime batches and other codecs answer with the batch's base
        offset and maxTimestamp (batch granularity).
        """
        self._check_open()
        if timestamp == EARLIEST_TIMESTAMP:
            return self._log_start_offset, NO_TIMESTAMP
        if timestamp == LATEST_TIMESTAMP:
            return self._log_end_offset, NO_TIMESTAMP
        segments = self._segments_from(self._log_start_offset)
        limit = self._config.decompressed_limit
        if timestamp == MAX_TIMESTAMP:
            return offset_of_largest_timestamp(segments, self._log_start_offset, limit)
        return offset_for_timestamp(
            segments, timestamp, self._log_start_offset, self._log_end_offset, limit
        )

    @storage_errors
    def record_topic_id(self, topic_id: str) -> None:
        """Write `partition.metadata` with `topic_id` unless it already holds it (KIP-516)."""
        self._check_open()
        if read_partition_topic_id(self._dir) != topic_id:
            write_partition_topic_id(self._dir, topic_id)

    @storage_errors
    def assign_leader_epoch(self, leader_epoch: int, start_offset: int) -> None:
        """Record that `leader_epoch` starts at `start_offset` (a new leader's first act)."""
        self._check_open()
        self._leader_epoch_cache.assign(leader_epoch, start_offset)

    # -- durability and lifecycle --------------------------------------------------------------

    @storage_errors
    def flush(self, up_to: int | None = None) -> None:
        """fsync every segment holding offsets in [recovery point, `up_to`) and move the
        recovery point to `up_to` (the LEO when None)."""
        self._check_open()
        end = self._log_end_offset if up_to is None else min(up_to, self._log_end_offset)
        if end <= self._recovery_point:
            return
        started = time.perf_counter_ns()
        for segment in self._segments_from(self._recovery_point):
            if segment.base_offset >= end:
                break
            segment.flush()
        self._leader_epoch_cache.sync()
        self._recovery_point = end
        LOG_FLUSH_TIMES.record_ns(time.perf_counter_ns() - started)

    @storage_errors
    def close(self) -> None:
        """Seal and fsync the active segment and close every file. Idempotent."""
        if self._closed:
            return
        self._producer_state.update_map_end_offset(self._log_end_offset)
        self._producer_state.take_snapshot()
        for segment in self._segments:
            segment.close()
        self._leader_epoch_cache.sync()
        self._recovery_point = self._log_end_offset
        self._closed = True

    def close_quietly(self) -> None:
        """Close every file without flushing or writing anything, ignoring errors: for a log
        whose directory failed (its data stays as the disk has it; recovery sorts it out at the
        next start-up)."""
        self._closed = True
        for segment in self._segments:
            segment.close_quietly()

    @storage_errors
    def delete(self) -> None:
        """Close the log and remove its directory."""
        if not self._closed:
            for segment in self._segments:
                segment.delete()
            self._closed = True
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def describe(self) -> dict[str, Any]:
        """A summary for logs and admin tools."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "log_start_offset": self._log_start_offset,
            "log_end_offset": self._log_end_offset,
            "recovery_point": self._recovery_point,
            "size": self._size,
            "segments": len(self._segments),
            "dir": os.fspath(self._dir),
        }
