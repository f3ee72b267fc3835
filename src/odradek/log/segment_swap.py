"""Swapping a cleaned segment into a log in crash-safe steps, and finishing or discarding an
interrupted swap when the log is next opened (Kafka's LocalLog.replaceSegments and LogLoader).

The log cleaner rewrites a group of consecutive segments [S1 .. Sn] into one new segment whose
base offset is S1's (B). The swap, in order, each step a rename (atomic on POSIX file systems):

  0. the cleaner writes `B.log.cleaned`, `B.index.cleaned` and `B.timeindex.cleaned` (and
     `B.txnindex.cleaned` when aborted transactions stay; a `.txnindex` is renamed last in each
     step below, with its segment's other files) and fsyncs
     them (on its own thread; everything below runs on the event loop, in one call);
  1. rename the three `.cleaned` files to `.swap` (data file first), then fsync the directory:
     once no `.cleaned` file of B is left the new segment is *committed*;
  2. rename the files of S1 .. Sn to `.deleted`, in offset order;
  3. rename the `.swap` files to their final names (data file first), and fsync the directory;
  4. (in memory) the log's segment list holds the new segment instead of S1 .. Sn; the
     `.deleted` files are removed after file.delete.delay.ms.

A crash anywhere leaves files from which the next start-up (`complete_interrupted_swap`, run
before segments are loaded) rebuilds a consistent log:

| crash after step | files left                                 | start-up                                    |
|------------------|--------------------------------------------|---------------------------------------------|
| 0, or inside 1   | some `.cleaned` of B (and maybe `.swap`)   | discard: every `.swap` with base >= the     |
|                  |                                            | smallest `.cleaned` base, then every        |
|                  |                                            | `.cleaned`; S1 .. Sn are intact             |
| 1, or inside 2   | `B.*.swap`; some of S1 .. Sn, some         | complete: delete every segment file with a  |
|                  | `.deleted`                                 | base offset in [B, next offset of the swap  |
|                  |                                            | segment), then rename `.swap` to final      |
| inside 3         | some final names, some `.swap`             | the same (the range holds only B)           |
| 3                | the new segment; `.deleted` files          | remove the `.deleted` files                 |

"Next offset of the swap segment" is read from its last batch. When cleaning emptied the last
segments of the group entirely, those lie beyond that offset and survive a crash inside step 2
(Kafka behaves the same): no offset is then present twice and no record that should stay is lost,
but the records of those segments, all superseded, are back until the next cleaning, which starts
again from the unchanged cleaner checkpoint and removes them.

Tests stop the broker between steps with `ODRADEK_CLEANER_CRASH_AT=<step>` in its environment
(`crash_point`: SIGKILL of the process itself); nothing else may set it.

Concurrency: `swap_in` runs on the event loop thread, inside `Log.replace_segments`;
`complete_interrupted_swap` inside `Log.open`, before the log is shared.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from odradek.log.checkpoints import fsync_dir
from odradek.log.naming import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    Listing,
    index_file_name,
    log_file_name,
    parse_segment_file_name,
    read_listing,
    time_index_file_name,
)
from odradek.log.segment import LogSegment
from odradek.log.transaction_index import SUFFIX as TXN_INDEX_SUFFIX
from odradek.log.transaction_index import txn_index_file_name

logger = logging.getLogger(__name__)

_SWAP_OR_CLEANED = (SWAP_SUFFIX, CLEANED_SUFFIX)

CRASH_POINT_ENV = "ODRADEK_CLEANER_CRASH_AT"
"""Tests only: the step after which the process kills itself (see `crash_point`)."""

CRASH_POINTS = (
    "cleaned",  # step 0 done
    "swap-log",  # inside step 1: the data file is .swap, the indexes still .cleaned
    "swapped",  # step 1 done
    "deleted-one",  # inside step 2: the first old segment renamed
    "deleted",  # step 2 done
    "renamed-log",  # inside step 3: the data file has its final name, the indexes not
    "renamed",  # step 3 done, before the directory fsync and the in-memory swap
    "checkpoint",  # the cleaning is done, before the cleaner checkpoint is written
)

_crash_at = os.environ.get(CRASH_POINT_ENV)


def crash_point(step: str) -> None:
    """SIGKILL this process if the test environment asks for a crash after `step`."""
    if _crash_at == step:
        logger.error("%s=%s: killing the broker after that step", CRASH_POINT_ENV, step)
        _die()


_broker_pid: int | None = None
"""Set in a cleaner process (`cleaner_process`): a crash point there kills the broker too."""


def set_broker_pid(pid: int) -> None:
    global _broker_pid
    _broker_pid = pid


def _die() -> None:
    if _broker_pid is not None:
        os.kill(_broker_pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def segment_paths(directory: Path, base_offset: int, suffix: str = "") -> tuple[Path, Path, Path]:
    """The data, offset index and time index files of a segment, with `suffix` after each."""
    return (
        directory / (log_file_name(base_offset) + suffix),
        directory / (index_file_name(base_offset) + suffix),
        directory / (time_index_file_name(base_offset) + suffix),
    )


def txn_index_path(directory: Path, base_offset: int, suffix: str = "") -> Path:
    """The segment's `.txnindex` (aborted transactions), with `suffix` after it."""
    return directory / (txn_index_file_name(base_offset) + suffix)


def _rename_all(directory: Path, base_offset: int, old: str, new: str, step: str) -> None:
    sources = segment_paths(directory, base_offset, old)
    targets = segment_paths(directory, base_offset, new)
    for i, (source, target) in enumerate(zip(sources, targets, strict=True)):
        os.rename(source, target)
        if i == 0:
            crash_point(step)
    _rename_if_present(
        txn_index_path(directory, base_offset, old), txn_index_path(directory, base_offset, new)
    )


def _rename_if_present(source: Path, target: Path) -> None:
    """Rename an optional file (a `.txnindex` exists only once its segment has an entry)."""
    try:
        os.rename(source, target)
    except FileNotFoundError:
        pass


def swap_in(directory: Path, base_offset: int, old_segments: list[LogSegment]) -> None:
    """Steps 1-3 (module docstring) for the cleaned segment `base_offset`, replacing
    `old_segments` (in offset order, closed by the caller). The old segments' files end up with
    the `.deleted` suffix; the caller removes them later."""
    _rename_all(directory, base_offset, CLEANED_SUFFIX, SWAP_SUFFIX, "swap-log")
    fsync_dir(directory)
    crash_point("swapped")
    for i, segment in enumerate(old_segments):
        segment.change_file_suffix(DELETED_SUFFIX)
        _rename_if_present(
            txn_index_path(directory, segment.base_offset),
            txn_index_path(directory, segment.base_offset, DELETED_SUFFIX),
        )
        if i == 0:
            crash_point("deleted-one")
    crash_point("deleted")
    _rename_all(directory, base_offset, SWAP_SUFFIX, "", "renamed-log")
    crash_point("renamed")
    fsync_dir(directory)


def delete_cleaned_files(directory: Path, base_offset: int) -> None:
    """Remove what step 0 wrote (an aborted cleaning)."""
    for path in segment_paths(directory, base_offset, CLEANED_SUFFIX):
        path.unlink(missing_ok=True)
    txn_index_path(directory, base_offset, CLEANED_SUFFIX).unlink(missing_ok=True)


def delete_replaced_txn_index(directory: Path, base_offset: int) -> None:
    """Remove a replaced segment's `.txnindex.deleted` (with its other `.deleted` files)."""
    txn_index_path(directory, base_offset, DELETED_SUFFIX).unlink(missing_ok=True)


def complete_interrupted_swap(directory: Path, listing: Listing | None = None) -> bool:
    """Discard or finish a swap a crash interrupted (the table in the module docstring).

    Runs before the segments of `directory` are loaded (`listing`: its entries, when the caller
    has read them). Returns whether anything was found, in which case files were removed or
    renamed and the listing is out of date.
    """
    cleaned: list[Path] = []
    swaps: list[tuple[int, Path]] = []
    names = read_listing(directory) if listing is None else listing
    for name in names:
        if not name.endswith(_SWAP_OR_CLEANED):
            continue
        if _parse_suffixed(name, CLEANED_SUFFIX) is not None:
            cleaned.append(directory / name)
        elif (parsed := _parse_suffixed(name, SWAP_SUFFIX)) is not None:
            swaps.append((parsed[0], directory / name))
    if not cleaned and not swaps:
        return False
    min_cleaned = min((_base_offset(path, CLEANED_SUFFIX) for path in cleaned), default=None)
    valid: list[tuple[int, Path]] = []
    for base_offset, path in swaps:
        if min_cleaned is not None and base_offset >= min_cleaned:
            logger.warning("%s: discarding %s, an interrupted swap", directory, path.name)
            path.unlink(missing_ok=True)
        else:
            valid.append((base_offset, path))
    for path in cleaned:
        logger.info("%s: removing %s, an unfinished cleaning", directory, path.name)
        path.unlink(missing_ok=True)
    log_swaps = [
        (base, path) for base, path in valid if path.name.endswith(LOG_SUFFIX + SWAP_SUFFIX)
    ]
    if log_swaps:
        start = min(base for base, _ in log_swaps)
        end = max(_next_offset(directory, base, path) for base, path in log_swaps)
        with os.scandir(directory) as entries:
            for entry in entries:
                parsed = _parse(entry.name)
                if parsed is not None and start <= parsed[0] < end:
                    logger.warning(
                        "%s: deleting %s, replaced by a swap a crash interrupted",
                        directory,
                        entry.name,
                    )
                    os.unlink(entry.path)
    for _base, path in valid:
        os.rename(path, path.with_name(path.name[: -len(SWAP_SUFFIX)]))
        logger.warning("%s: completed the swap of %s", directory, path.name)
    fsync_dir(directory)
    return True


def _parse(name: str) -> tuple[int, str] | None:
    """(base offset, suffix) of a segment file name, its `.txnindex` included."""
    if name.endswith(TXN_INDEX_SUFFIX):
        stem = name[: -len(TXN_INDEX_SUFFIX)]
        if stem.isdigit() and stem.isascii():
            return int(stem), TXN_INDEX_SUFFIX
        return None
    return parse_segment_file_name(name)


def _parse_suffixed(name: str, extra: str) -> tuple[int, str] | None:
    if not name.endswith(extra):
        return None
    return _parse(name[: -len(extra)])


def _base_offset(path: Path, suffix: str) -> int:
    parsed = _parse_suffixed(path.name, suffix)
    return -1 if parsed is None else parsed[0]


def _next_offset(directory: Path, base_offset: int, path: Path) -> int:
    """The offset after the last complete batch of a `.swap` data file (its base when empty)."""
    segment = LogSegment(
        directory,
        base_offset,
        max_index_bytes=0,
        index_interval_bytes=0,
        size=os.stat(path).st_size,
        created_ms=0,
        suffix=SWAP_SUFFIX,
    )
    try:
        next_offset = base_offset
        for header in segment.scan_headers():
            next_offset = header.next_offset
        return max(next_offset, base_offset + 1)
    finally:
        segment.release()
