"""Loading a partition directory into segments, with recovery after an unclean shutdown.

Two paths, chosen by whether the log directory had the clean-shutdown marker:

Clean shutdown (the common case, and it must be fast: a broker opens thousands of logs at
start-up). List the directory and stat the segment files; touch nothing else except the active
(last) segment, whose next offset and largest timestamp come from the last entries of its indexes
and a forward scan of the batch headers after the last offset index entry (about
index.interval.bytes of data). Sealed segments are not read at all until a reader needs them. If
that short scan finds the active segment does not end at a batch boundary, the segment is
recovered as below instead of being trusted.

Unclean shutdown. Data after the recovery point (the offset up to which everything was fsynced)
may be torn. Every segment from the one holding the recovery point onward is validated batch by
batch (header sanity, CRC, offsets increasing across segment boundaries), its indexes are rebuilt,
and the file is cut after the last valid batch; every later segment is deleted, since its data
would follow a hole. So are the segments after one that ends before the next begins (a torn
write that cut it exactly at a batch boundary, or emptied it): segments are contiguous. Leader epochs found in the recovered batches are re-recorded in the leader
epoch cache.

Either way, a segment swap of the log cleaner that a crash interrupted is first finished or
discarded (`segment_swap.complete_interrupted_swap`: `.cleaned` and `.swap` files), then stray
files (`.tmp`, `.deleted`, indexes without a `.log`) are removed, and a segment whose index files
are missing gets them rebuilt from its data.

Either way, the loaded log holds one file descriptor: the active segment's data file. Everything
recovery or a rebuild opened is closed again (`LogSegment.close_files`), so a log recovered after a
crash costs no more descriptors than one opened after a clean shutdown; index files reopen on the
next append, sealed segments on the next read.

Concurrency: runs inside `Log.open`, before the log is shared with anyone.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from odradek.errors import CorruptIndexError, CorruptRecordError
from odradek.log.config import LogConfig
from odradek.log.leader_epoch import LeaderEpochCache
from odradek.log.naming import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    STRAY_SUFFIXES,
    TIME_INDEX_SUFFIX,
    Listing,
    parse_segment_file_name,
    read_listing,
)
from odradek.log.segment import LogSegment
from odradek.log.segment_swap import complete_interrupted_swap

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedLog:
    """What `load_segments` found: segments in base-offset order (the last one active)."""

    segments: list[LogSegment]
    log_end_offset: int
    recovery_point: int
    recovered: bool


@dataclass(slots=True)
class _SegmentFiles:
    size: int = 0
    has_log: bool = False
    has_index: bool = False
    has_time_index: bool = False


def _scan_directory(directory: Path, listing: Listing) -> dict[int, _SegmentFiles]:
    """Segment files by base offset; removes stray files on the way (and from `listing`)."""
    found: dict[int, _SegmentFiles] = {}
    segment_names: list[tuple[str, int]] = []
    for name, entry in list(listing.items()):
        if name.endswith(STRAY_SUFFIXES):
            logger.info("removing stray file %s", entry.path)
            _remove(entry.path)
            del listing[name]
            continue
        parsed = parse_segment_file_name(name)
        if parsed is None:
            continue
        base_offset, suffix = parsed
        files = found.get(base_offset)
        if files is None:
            files = found[base_offset] = _SegmentFiles()
        if suffix == LOG_SUFFIX:
            files.has_log = True
            files.size = entry.stat().st_size
        elif suffix == INDEX_SUFFIX:
            files.has_index = True
        elif suffix == TIME_INDEX_SUFFIX:
            files.has_time_index = True
        segment_names.append((name, base_offset))
    for name, base_offset in segment_names:
        if not found[base_offset].has_log:
            logger.info("removing index file without a segment: %s", listing[name].path)
            _remove(listing.pop(name).path)
    return {base: files for base, files in found.items() if files.has_log}


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def load_segments(
    directory: Path,
    config: LogConfig,
    leader_epoch_cache: LeaderEpochCache,
    *,
    recovery_point: int,
    log_start_offset: int,
    clean_shutdown: bool,
    now_ms: int,
    listing: Listing | None = None,
) -> LoadedLog:
    """Open the segments of `directory`, recovering the unflushed tail if the shutdown was
    unclean (see the module docstring). Creates a first segment at `log_start_offset` when the
    directory holds none. `listing` is the directory's entries if the caller has read them
    (it is kept up to date with the files this removes or renames)."""
    if listing is None:
        listing = read_listing(directory)
    if complete_interrupted_swap(directory, listing):
        listing.clear()
        listing.update(read_listing(directory))
    files = _scan_directory(directory, listing)

    def segment_for(base_offset: int, size: int) -> LogSegment:
        return LogSegment(
            directory,
            base_offset,
            max_index_bytes=config.segment_index_bytes,
            index_interval_bytes=config.index_interval_bytes,
            size=size,
            created_ms=now_ms,
        )

    if not files:
        segment = LogSegment.create(
            directory,
            log_start_offset,
            max_index_bytes=config.segment_index_bytes,
            index_interval_bytes=config.index_interval_bytes,
            now_ms=now_ms,
        )
        return LoadedLog([segment], log_start_offset, log_start_offset, recovered=False)

    base_offsets = sorted(files)
    segments = [segment_for(base, files[base].size) for base in base_offsets]
    recover_from: int | None = None
    if clean_shutdown:
        active = segments[-1]
        active_files = files[active.base_offset]
        try:
            if active.size > 0 and not (active_files.has_index and active_files.has_time_index):
                logger.warning("%s: rebuilding missing index files", active.log_path)
                active.rebuild_indexes()
            else:
                active.load_tail_state()
        except (CorruptRecordError, CorruptIndexError) as e:
            logger.warning(
                "%s: active segment is inconsistent after a clean shutdown: %s", directory, e
            )
            recover_from = len(segments) - 1
    else:
        recover_from = max(bisect_right(base_offsets, recovery_point) - 1, 0)

    first_recovered = len(segments) if recover_from is None else recover_from
    for i, segment in enumerate(segments[: min(first_recovered, len(segments) - 1)]):
        entry = files[segment.base_offset]
        if segment.size > 0 and not (entry.has_index and entry.has_time_index):
            logger.warning("%s: rebuilding missing index files", segment.log_path)
            try:
                segment.rebuild_indexes()
            except CorruptRecordError as e:
                logger.warning("%s: cannot rebuild indexes (%s); recovering", segment.log_path, e)
                recover_from = first_recovered = i
                break
            segment.on_become_inactive()

    if recover_from is not None:
        # A compacted log has offset gaps (the cleaner removes records): only Kafka's weaker
        # rule, offsets increasing, holds there.
        _recover(
            directory, segments, recover_from, leader_epoch_cache, contiguous=not config.compact
        )

    log_end_offset = segments[-1].next_offset
    # Leave every segment as a clean start does: sealed ones with no descriptor, the active one
    # with its data file only (the tail scan read it). Recovery and index rebuilds opened more,
    # and kept, three per log were enough for 10,000 recovered logs to exhaust a 20,000
    # descriptor limit (issue 19's restart benchmark). Unsynced index writes are fsynced by the
    # next flush all the same.
    for segment in segments[:-1]:
        segment.close_files()
    segments[-1].close_files(keep_data_file=True)
    # After a clean shutdown everything was fsynced; after recovery, what was validated may
    # still be only in the page cache, so the old recovery point stands.
    if recover_from is not None:
        recovery_point = min(recovery_point, log_end_offset)
    else:
        recovery_point = log_end_offset
    return LoadedLog(segments, log_end_offset, recovery_point, recovered=recover_from is not None)


def _recover(
    directory: Path,
    segments: list[LogSegment],
    recover_from: int,
    leader_epoch_cache: LeaderEpochCache,
    *,
    contiguous: bool = True,
) -> None:
    """Validate segments[recover_from:] in place; drop everything after the first bad batch.
    With `contiguous`, also after a batch or segment that does not start where the previous
    one ended."""
    min_offset = segments[recover_from].base_offset
    index = recover_from
    while index < len(segments):
        segment = segments[index]
        truncated = segment.recover(min_offset, leader_epoch_cache, contiguous=contiguous)
        if truncated:
            for later in segments[index + 1 :]:
                logger.warning(
                    "%s: deleting segment %s that follows corrupt data", directory, later.log_path
                )
                later.delete()
            del segments[index + 1 :]
            break
        min_offset = segment.next_offset
        if index < len(segments) - 1:
            if contiguous and segment.next_offset < segments[index + 1].base_offset:
                # A segment that ends before the next one begins lost its tail (cut at a batch
                # boundary, or emptied): Odradek's segments are contiguous (a roll starts the new
                # segment at the LEO, and there is no compaction), so the later segments follow
                # a hole. Regression: test_torn_writes, a .log truncated at a batch boundary.
                logger.warning(
                    "%s: %s ends at offset %d but the next segment starts at %d; deleting the "
                    "segments after the hole",
                    directory,
                    segment.log_path,
                    segment.next_offset,
                    segments[index + 1].base_offset,
                )
                for later in segments[index + 1 :]:
                    later.delete()
                del segments[index + 1 :]
                break
            segment.on_become_inactive()
            segment.close_files()  # one segment's descriptors at a time, however many there are
        index += 1
