"""Every file and directory name of the log layer, from one place.

The layout is Kafka's, so that an operator's muscle memory (and tools like kafka-dump-log) carries
over::

    <log.dir>/
        .kafka_cleanshutdown                 written last by a clean shutdown, removed at start-up
        recovery-point-offset-checkpoint     per log: offset below which data is known to be fsynced
        log-start-offset-checkpoint          per log: first offset still exposed to readers
        replication-offset-checkpoint        per log: high watermark (owned by the replica manager)
        cleaner-offset-checkpoint            per compacted log: where the cleaner's dirty section starts
        <topic>-<partition>/
            00000000000000000000.log         segment data, named by its 20-digit base offset
            00000000000000000000.index       sparse offset index of that segment
            00000000000000000000.timeindex   sparse time index of that segment
            00000000000000000000.snapshot    producer state at that offset (log/producer_snapshot.py)
            leader-epoch-checkpoint          leader epoch -> start offset history
            00000000000000000000.log.cleaned a segment the log cleaner is writing (with its
                                             .index.cleaned and .timeindex.cleaned)
            00000000000000000000.log.swap    a cleaned segment being swapped in (see segment_swap)
            00000000000000000000.log.deleted a replaced segment awaiting file.delete.delay.ms
        <topic>-<partition>.<uuid>-delete/   a log being deleted

A topic name may itself contain '-' and '.', so the partition number is whatever follows the LAST
'-' of the directory name.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from odradek.errors import InvalidTopicError

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)

SNAPSHOT_SUFFIX = ".snapshot"
"""A producer state snapshot, named by the offset it describes the state before."""

TEMP_SUFFIX = ".tmp"
"""Half-written checkpoint files; deleted when found at start-up."""

CLEANED_SUFFIX = ".cleaned"
"""Appended to the three file names of a segment the log cleaner is writing."""
SWAP_SUFFIX = ".swap"
"""Appended to a cleaned segment's file names while it replaces the segments it was made from."""
DELETED_SUFFIX = ".deleted"
"""Appended to a replaced segment's file names until it is deleted (file.delete.delay.ms)."""

STRAY_SUFFIXES = (DELETED_SUFFIX, TEMP_SUFFIX)
"""Leftovers of asynchronous deletion and of checkpoint writes; removed when a log is opened
(`.cleaned` and `.swap` files are for `segment_swap.complete_interrupted_swap` to judge)."""

DELETE_DIR_SUFFIX = "-delete"
FUTURE_DIR_SUFFIX = "-future"

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"

_OFFSET_DIGITS = 20

Listing = dict[str, os.DirEntry[str]]
"""A log directory's entries by name, read once when the log is opened and handed to each part
that would otherwise list the directory itself (segments, swaps, snapshots, transaction
indexes): at start-up a broker opens every log, and one listing per log instead of five is a
large part of what opening 10,000 logs costs."""


def read_listing(directory: Path) -> Listing:
    """`directory`'s entries by name (FileNotFoundError when it does not exist)."""
    with os.scandir(directory) as entries:
        return {entry.name: entry for entry in entries}


def child_path(directory: Path, name: str) -> Path:
    """`directory / name` for a plain file name, without parsing it again (pathlib's `/` does,
    which costs more than the rest of opening an empty log's segment)."""
    make = getattr(directory, "_make_child_relpath", None)  # CPython 3.11-3.12 pathlib
    return make(name) if make is not None else directory / name


def log_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{LOG_SUFFIX}"


def index_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{INDEX_SUFFIX}"


def time_index_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{TIME_INDEX_SUFFIX}"


def producer_snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def parse_producer_snapshot_file_name(name: str) -> int | None:
    """The offset of a producer snapshot file name, or None if `name` is not one."""
    if not name.endswith(SNAPSHOT_SUFFIX):
        return None
    stem = name[: -len(SNAPSHOT_SUFFIX)]
    return int(stem) if len(stem) == _OFFSET_DIGITS and stem.isdigit() else None


def parse_segment_file_name(name: str) -> tuple[int, str] | None:
    """(base offset, suffix) of a segment file name, or None if `name` is not one."""
    for suffix in SEGMENT_SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            if len(stem) == _OFFSET_DIGITS and stem.isdigit():
                return int(stem), suffix
    return None


def parse_suffixed_segment_file_name(name: str, extra: str) -> tuple[int, str] | None:
    """(base offset, segment suffix) of a segment file name followed by `extra` (`.cleaned`,
    `.swap`, ...), or None if `name` is not one."""
    if not name.endswith(extra):
        return None
    return parse_segment_file_name(name[: -len(extra)])


def log_dir_name(topic: str, partition: int) -> str:
    """`<topic>-<partition>`, refusing topic names that would escape or confuse the layout."""
    if not topic or topic in (".", "..") or "/" in topic or "\\" in topic or "\0" in topic:
        raise InvalidTopicError(f"topic name {topic!r} cannot be used as a directory name")
    if partition < 0:
        raise InvalidTopicError(f"partition {partition} of {topic!r} is negative")
    return f"{topic}-{partition}"


def parse_log_dir_name(name: str) -> tuple[str, int] | None:
    """(topic, partition) of a `<topic>-<partition>` directory name, or None if it is not one."""
    topic, dash, partition = name.rpartition("-")
    if not dash or not topic or not partition.isdigit() or not partition.isascii():
        return None
    return topic, int(partition)


def delete_dir_name(topic: str, partition: int) -> str:
    """A unique name a log directory is renamed to before removal (as Kafka's `.<uuid>-delete`)."""
    return f"{log_dir_name(topic, partition)}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"


def is_delete_dir_name(name: str) -> bool:
    return name.endswith(DELETE_DIR_SUFFIX)
