"""ListOffsets by timestamp over a log's segments (`Log.fetch_offset_by_timestamp`).

The time index finds the segment and a starting position, then batch headers (whose maxTimestamp
bounds their records) find the batch; within it, uncompressed and gzip CreateTime batches are
searched record by record as Kafka does, while LogAppendTime batches and other codecs answer with
the batch's base offset and maxTimestamp (batch granularity). Records below the log start offset
are never answered.

Called by the `Log` that owns the segments, on the event loop thread.
"""

from __future__ import annotations

from collections.abc import Sequence

from odradek.log.segment import LogSegment
from odradek.protocol.record_batch import BatchHeader, find_timestamp_in_batch


def _search_batch(
    segment: LogSegment, header: BatchHeader, timestamp: int, log_start: int, limit: int
) -> tuple[int, int] | None:
    batch = segment.read_at(header.position, header.size)
    return find_timestamp_in_batch(batch, timestamp, log_start, limit)


def offset_for_timestamp(
    segments: Sequence[LogSegment],
    timestamp: int,
    log_start: int,
    log_end: int,
    decompressed_limit: int,
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after `log_start` with a timestamp >=
    `timestamp`, in `segments` (those from the one holding the log start); None if none."""
    for i, segment in enumerate(segments):
        if segment.largest_timestamp() < timestamp:
            continue
        end = segments[i + 1].base_offset if i + 1 < len(segments) else log_end
        offset = segment.time_index_floor_offset(timestamp, end)
        header = segment.find_batch(max(offset, log_start))
        if header is None:
            continue
        for candidate in segment.scan_headers(header.position):
            if candidate.max_timestamp >= timestamp and candidate.last_offset >= log_start:
                found = _search_batch(segment, candidate, timestamp, log_start, decompressed_limit)
                if found is not None:
                    return found
    return None


def offset_of_largest_timestamp(
    segments: Sequence[LogSegment], log_start: int, decompressed_limit: int
) -> tuple[int, int] | None:
    """KIP-734: the record with the largest timestamp (the first of them), or None."""
    best: tuple[int, LogSegment] | None = None
    for segment in segments:
        if segment.size == 0:
            continue
        largest = segment.largest_timestamp()
        if best is None or largest > best[0]:
            best = (largest, segment)
    if best is None:
        return None
    largest, segment = best
    for header in segment.scan_headers(0):
        if header.max_timestamp >= largest and header.last_offset >= log_start:
            found = _search_batch(segment, header, largest, log_start, decompressed_limit)
            if found is not None:
                return found
    return None
