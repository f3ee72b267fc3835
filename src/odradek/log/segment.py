"""One log segment: a `.log` file of record batches plus its offset and time indexes.

The `.log` file is the concatenation of RecordBatch v2 batches exactly as they were appended (see
protocol/record_batch.py for the batch layout); there is no per-file header or footer, so the file is
valid up to the end of its last complete batch and a crash can only leave a torn or garbage tail. The
segment's name is its base offset: every batch in it has offsets >= that base and < the next
segment's base, and offsets increase strictly from batch to batch (gaps are allowed).

Reads use `os.pread` on a descriptor opened on first use, so a segment that nobody reads costs no file
descriptor and a read never moves a shared file position. Writes go through the page cache; `flush`
(fsync) is called by the log on flush, roll and close only.

The segment knows its "tail state" (next offset, largest timestamp, bytes since the last index entry)
only once `load_tail_state` or `recover` has run; the log does that for the active segment when it
opens, and sealed segments never need it. Their largest timestamp comes from the time index's final
entry instead.

Recovery (validating every batch, rebuilding the indexes, cutting a torn tail) is in
`segment_recovery`, a base of `LogSegment`.

Concurrency: not thread-safe; owned by one `Log`, used from the broker's event loop thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from odradek.errors import CorruptIndexError, CorruptRecordError
from odradek.log.index import OffsetIndex, TimeIndex, fsync_path
from odradek.log.naming import child_path, index_file_name, log_file_name, time_index_file_name
from odradek.log.segment_recovery import SegmentRecovery
from odradek.protocol.record_batch import (
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    NO_TIMESTAMP,
    BatchHeader,
)

logger = logging.getLogger(__name__)

SCAN_CHUNK_BYTES = 16 * 1024
"""Bytes read per pread while scanning headers: a little more than the default index interval."""


class LogSegment(SegmentRecovery):
    """A segment file with its two indexes and, once loaded, the state needed to append to it.

    Not thread-safe: owned by one `Log` and called only from the broker's event loop thread.
    """

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        max_index_bytes: int,
        index_interval_bytes: int,
        size: int,
        created_ms: int,
        suffix: str = "",
    ) -> None:
        """`suffix` follows every file name (`.swap` for a segment being swapped in, see
        segment_swap; empty for a segment of the log)."""
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        """`index.interval.bytes`; the log updates it when its config changes."""
        self.suffix = suffix
        self.log_path = child_path(directory, log_file_name(base_offset) + suffix)
        self.offset_index = OffsetIndex(
            child_path(directory, index_file_name(base_offset) + suffix),
            base_offset,
            max_index_bytes,
        )
        self.time_index = TimeIndex(
            child_path(directory, time_index_file_name(base_offset) + suffix),
            base_offset,
            max_index_bytes,
        )
        self.size = size
        self.created_ms = created_ms
        self._fd: int | None = None
        self._dirty = False
        # Tail state, valid when self._tail_loaded.
        self._tail_loaded = False
        self._next_offset = base_offset
        self._max_timestamp = NO_TIMESTAMP
        self._offset_of_max_timestamp = base_offset
        self._bytes_since_last_index_entry = 0
        self._rolling_timestamp: int | None = None  # maxTimestamp of the first batch, lazily

    # -- creation --------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: Path,
        base_offset: int,
        *,
        max_index_bytes: int,
        index_interval_bytes: int,
        now_ms: int,
    ) -> LogSegment:
        """A new empty segment. Only the data file is created now; the index files appear with
        their first entry or when the segment is sealed (`on_become_inactive`). Creating 10,000
        partitions then costs 10,000 file creations rather than 30,000."""
        segment = cls(
            directory,
            base_offset,
            max_index_bytes=max_index_bytes,
            index_interval_bytes=index_interval_bytes,
            size=0,
            created_ms=now_ms,
        )
        os.close(os.open(segment.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        segment._tail_loaded = True
        return segment

    # -- file access -----------------------------------------------------------------------------

    @property
    def fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.log_path, os.O_RDWR)
        return self._fd

    def read_at(self, position: int, length: int) -> bytes:
        return os.pread(self.fd, length, position)

    def scan_headers(self, start: int = 0, end: int | None = None) -> Iterator[BatchHeader]:
        """Headers of the complete batches between byte positions `start` and `end`.

        Reads `SCAN_CHUNK_BYTES` at a time and parses every header inside a chunk; a batch larger
        than a chunk costs one pread of its header. Stops at a partial tail; a batch length too
        small to be a batch raises `CorruptRecordError`.
        """
        end = self.size if end is None else end
        unpack_from = HEADER.unpack_from
        fd = self.fd
        position = start
        while position + HEADER_SIZE <= end:
            chunk = os.pread(fd, min(SCAN_CHUNK_BYTES, end - position), position)
            available = len(chunk)
            offset_in_chunk = 0
            while offset_in_chunk + HEADER_SIZE <= available:
                fields = unpack_from(chunk, offset_in_chunk)
                batch_length = fields[1]
                if batch_length < MIN_BATCH_LENGTH:
                    raise CorruptRecordError(
                        f"{self.log_path}: batch at position {position + offset_in_chunk} has "
                        f"batchLength {batch_length}"
                    )
                batch_end = position + offset_in_chunk + LOG_OVERHEAD + batch_length
                if batch_end > end:
                    return
                yield BatchHeader._make((*fields, position + offset_in_chunk))
                offset_in_chunk += LOG_OVERHEAD + batch_length
            if available < HEADER_SIZE:
                return  # the file is shorter than `end`: treat like a partial tail
            position += offset_in_chunk

    def find_batch(self, offset: int) -> BatchHeader | None:
        """The first batch whose last offset is >= `offset`, or None if there is none.

        The index entry used is verified on the way (the batch at its position must end at its
        offset); an index that fails is rebuilt from the data and the lookup repeated.
        """
        try:
            return self._find_batch(offset)
        except CorruptIndexError as e:
            logger.warning("%s; rebuilding the indexes of %s", e, self.log_path)
            self.rebuild_indexes()
            return self._find_batch(offset)

    def time_index_floor_offset(self, timestamp: int, end_offset: int) -> int:
        """Where to start looking for the first record with timestamp >= `timestamp`: the offset
        of the time index's floor entry (the base offset if none). `end_offset` (the next
        segment's base or the LEO) bounds a plausible answer; an implausible one means the time
        index is corrupt, and it is rebuilt."""
        try:
            return self._time_index_floor_offset(timestamp, end_offset)
        except CorruptIndexError as e:
            logger.warning("%s; rebuilding the indexes of %s", e, self.log_path)
            self.rebuild_indexes()
            return self._time_index_floor_offset(timestamp, end_offset)

    def _time_index_floor_offset(self, timestamp: int, end_offset: int) -> int:
        _, offset = self.time_index.lookup(timestamp)
        if not self.base_offset <= offset < max(end_offset, self.base_offset + 1):
            raise CorruptIndexError(
                f"{self.time_index.path}: entry offset {offset} lies outside the segment"
            )
        return offset

    def _find_batch(self, offset: int) -> BatchHeader | None:
        entry_offset, position = self.offset_index.lookup(offset)
        verify = position != 0  # (base offset, 0) means "no entry": nothing to verify
        try:
            for header in self.scan_headers(position):
                if verify:
                    if header.base_offset + header.last_offset_delta != entry_offset:
                        break
                    verify = False
                if header.base_offset + header.last_offset_delta >= offset:
                    return header
        except CorruptRecordError:
            if not verify:
                raise
        if verify:
            raise CorruptIndexError(
                f"{self.offset_index.path}: entry ({entry_offset}, {position}) does not point at "
                "a batch ending at that offset"
            )
        return None

    # -- reads -----------------------------------------------------------------------------------

    def read(
        self, start_offset: int, max_bytes: int, limit_offset: int, min_one_batch: bool
    ) -> bytes | None:
        """Whole batches from the one holding `start_offset`; None if this segment has none.

        Stops before the first batch whose base offset is >= `limit_offset` and keeps the total
        within `max_bytes`, except that with `min_one_batch` the first batch is returned whole
        even if it is larger (KIP-74). Usually two preads: one chunk of headers to find the start
        (after the index lookup) and one for the data.
        """
        first = self.find_batch(start_offset)
        if first is None:
            return None
        if first.base_offset >= limit_offset:
            return b""
        start = first.position
        if first.size > max_bytes:
            return self.read_at(start, first.size) if min_one_batch else b""
        data = self.read_at(start, min(max_bytes, self.size - start))
        unpack_from = HEADER.unpack_from
        cut = 0
        available = len(data)
        while cut + HEADER_SIZE <= available:
            fields = unpack_from(data, cut)
            batch_size = LOG_OVERHEAD + fields[1]
            if fields[0] >= limit_offset or cut + batch_size > available:
                break
            cut += batch_size
        return data if cut == available else data[:cut]

    def read_range(
        self, start_offset: int, max_bytes: int, limit_offset: int, min_one_batch: bool
    ) -> tuple[int, int] | None:
        """`read`'s answer as a (position, size) range of this segment's file, found without
        reading the records: whole batches, the same ones `read` returns.

        The end is where the first batch at or beyond `limit_offset` starts (the end of the file
        when `limit_offset` is past the segment's last offset; otherwise an index lookup and a
        short header scan); when more than `max_bytes` would follow, the headers up to there are
        scanned for the last batch boundary within it."""
        first = self.find_batch(start_offset)
        if first is None:
            return None
        start = first.position
        if first.base_offset >= limit_offset:
            return (start, 0)
        if first.size > max_bytes:
            return (start, first.size if min_one_batch else 0)
        if limit_offset >= self.next_offset:
            end = self.size
        else:
            boundary = self.find_batch(limit_offset)
            if boundary is None:
                end = self.size
            elif boundary.base_offset >= limit_offset:
                end = boundary.position
            else:
                end = boundary.position + boundary.size
        if end - start > max_bytes:
            end = start
            for header in self.scan_headers(start, start + max_bytes):
                end = header.position + header.size
        return (start, end - start)

    # -- tail state and appends ------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """Offset after the last batch (the segment's base offset when empty); needs tail state."""
        self.load_tail_state()
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        self.load_tail_state()
        return self._max_timestamp

    @property
    def offset_of_max_timestamp(self) -> int:
        self.load_tail_state()
        return self._offset_of_max_timestamp

    def load_tail_state(self) -> None:
        """Learn the next offset and largest timestamp cheaply: from the last index entries, then a
        forward header scan over at most about index.interval.bytes of data.

        Raises `CorruptRecordError` if the data after the last index entry does not end at a batch
        boundary (the segment needs recovery) and `CorruptIndexError` if the indexes do not fit
        the data.
        """
        if self._tail_loaded:
            return
        last_entry = self.offset_index.last_entry()
        last_time_entry = self.time_index.last_entry()
        position = 0
        if last_entry is not None:
            if last_entry[1] >= self.size or last_entry[0] < self.base_offset:
                raise CorruptIndexError(
                    f"{self.offset_index.path}: last entry {last_entry} does not fit a "
                    f"{self.size}-byte segment"
                )
            position = last_entry[1]
        max_timestamp, offset_of_max = NO_TIMESTAMP, self.base_offset
        if last_time_entry is not None:
            max_timestamp, offset_of_max = last_time_entry
        next_offset = self.base_offset
        end_of_last_batch = position
        bytes_since_entry = 0
        for header in self.scan_headers(position):
            next_offset = header.base_offset + header.last_offset_delta + 1
            indexed_batch = last_entry is not None and header.position == position
            if indexed_batch and last_entry is not None and next_offset - 1 != last_entry[0]:
                raise CorruptIndexError(
                    f"{self.offset_index.path}: last entry {last_entry} does not point at a "
                    "batch ending at that offset"
                )
            if header.max_timestamp > max_timestamp:
                max_timestamp = header.max_timestamp
                offset_of_max = next_offset - 1
            end_of_last_batch = header.position + header.size
            # The indexed batch itself counts: entries are added before a batch's bytes are.
            bytes_since_entry += header.size
        if end_of_last_batch != self.size:
            raise CorruptRecordError(
                f"{self.log_path}: data ends at byte {self.size} but the last complete batch ends "
                f"at {end_of_last_batch}"
            )
        if last_entry is not None and next_offset <= last_entry[0]:
            raise CorruptIndexError(
                f"{self.offset_index.path}: last entry {last_entry} is beyond the data"
            )
        if last_time_entry is not None and last_time_entry[1] >= next_offset:
            raise CorruptIndexError(
                f"{self.time_index.path}: last entry {last_time_entry} is beyond the data"
            )
        self._next_offset = next_offset
        self._max_timestamp = max_timestamp
        self._offset_of_max_timestamp = offset_of_max
        self._bytes_since_last_index_entry = bytes_since_entry
        self._tail_loaded = True

    def rolling_timestamp(self) -> int:
        """maxTimestamp of the first batch (what segment.ms counts from), or -1."""
        if self._rolling_timestamp is None:
            if self.size < HEADER_SIZE:
                return NO_TIMESTAMP
            self._rolling_timestamp = HEADER.unpack_from(self.read_at(0, HEADER_SIZE))[8]
        return self._rolling_timestamp

    def append(self, data: bytes | bytearray | memoryview, headers: list[BatchHeader]) -> None:
        """Append `data`, which holds exactly the batches `headers` describe (positions relative
        to `data`), and add index entries for them."""
        self.load_tail_state()
        position = self.size
        # Open every file this append writes before writing any: an open refused half way
        # (EMFILE) must not leave batches in the data file without their index entries, or a
        # size that disagrees with the file. The index files are created with their first entry.
        fd = self.fd
        if self._adds_index_entry(headers):
            self.offset_index.open_file()
            self.time_index.open_file()
        view = memoryview(data)
        written = 0
        while written < len(view):  # pwrite may write less than asked (signals, huge writes)
            written += os.pwrite(fd, view[written:], position + written)
        self._dirty = True
        if position == 0 and headers:
            self._rolling_timestamp = headers[0].max_timestamp
        for header in headers:
            self._index_batch(header, position + header.position)
        self.size = position + len(data)

    def _adds_index_entry(self, headers: list[BatchHeader]) -> bool:
        """Will appending these batches add an index entry (`_index_batch`'s rule)?"""
        pending = self._bytes_since_last_index_entry
        for header in headers:
            if pending > self.index_interval_bytes:
                return True
            pending += header.size
        return False

    def _index_batch(self, header: BatchHeader, position: int) -> None:
        """Update the tail state and the sparse indexes for a batch stored at `position`."""
        last_offset = header.base_offset + header.last_offset_delta
        if header.max_timestamp > self._max_timestamp:
            self._max_timestamp = header.max_timestamp
            self._offset_of_max_timestamp = last_offset
        if self._bytes_since_last_index_entry > self.index_interval_bytes:
            if not self.offset_index.is_full:
                self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += header.size
        self._next_offset = last_offset + 1

    def _reset_tail_state(self) -> None:
        self._next_offset = self.base_offset
        self._max_timestamp = NO_TIMESTAMP
        self._offset_of_max_timestamp = self.base_offset
        self._bytes_since_last_index_entry = 0
        self._rolling_timestamp = None

    # -- truncation, sealing, lifecycle ----------------------------------------------------------

    def truncate_to(self, offset: int, now_ms: int) -> int:
        """Remove the batch holding `offset` (or the first batch after it) and everything after.

        Returns the bytes removed. Truncation happens at batch boundaries, so when `offset` lies
        inside a batch the whole batch goes and the segment ends before `offset`.
        """
        header = self.find_batch(offset)
        if header is None:
            return 0
        self.offset_index.truncate_to(header.base_offset)
        self.time_index.truncate_to(header.base_offset)
        removed = self.size - header.position
        os.ftruncate(self.fd, header.position)
        self._dirty = True
        self.size = header.position
        if self.size == 0:
            self.created_ms = now_ms
        self._rolling_timestamp = None
        self._tail_loaded = False
        try:
            self.load_tail_state()
        except (CorruptIndexError, CorruptRecordError):
            self.rebuild_indexes()
        return removed

    def on_become_inactive(self) -> None:
        """The segment is no longer active: record its largest timestamp as a final time index
        entry (retention by time and ListOffsets read it from there), fsync everything and
        release the index files and their in-memory copies."""
        if self._tail_loaded and self._max_timestamp >= 0:
            self.time_index.maybe_append(
                self._max_timestamp, self._offset_of_max_timestamp, skip_full_check=True
            )
        self.flush()
        self.offset_index.ensure_file()
        self.time_index.ensure_file()
        self.offset_index.close()
        self.time_index.close()
        self.offset_index.unload()
        self.time_index.unload()

    def largest_timestamp(self) -> int:
        """The largest batch timestamp, or the file's modification time if there is none.

        For a sealed segment this reads only the time index's last entry.
        """
        if self._tail_loaded:
            timestamp = self._max_timestamp
        else:
            try:
                last = self.time_index.last_entry()
            except CorruptIndexError:
                self.rebuild_indexes()
                last = self.time_index.last_entry()
            timestamp = last[0] if last is not None else NO_TIMESTAMP
        if timestamp >= 0:
            return timestamp
        try:
            return int(os.stat(self.log_path).st_mtime * 1000)
        except FileNotFoundError:
            return NO_TIMESTAMP

    @property
    def is_dirty(self) -> bool:
        return self._dirty

    def flush(self) -> None:
        """fsync the data and both indexes (also those written and then closed by
        `close_files`)."""
        if self._dirty:
            if self._fd is not None:
                os.fsync(self._fd)
            else:
                fsync_path(self.log_path)
        self._dirty = False
        self.offset_index.flush()
        self.time_index.flush()

    def close_files(self, *, keep_data_file: bool = False) -> None:
        """Close the descriptors (the data file's too unless `keep_data_file`), back to the
        state of a segment opened lazily: each reopens on its next use, and what was written
        and not yet fsynced is fsynced by the next `flush` all the same. Recovery calls this
        so that a log recovered after a crash holds no more descriptors than one opened after
        a clean shutdown."""
        if not keep_data_file and self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.offset_index.close()
        self.time_index.close()

    def close(self) -> None:
        """Seal (see `on_become_inactive`) and close the data file."""
        self.on_become_inactive()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close_quietly(self) -> None:
        """Close every file descriptor, writing nothing and ignoring errors (a failed disk)."""
        for close in (self.offset_index.close, self.time_index.close):
            try:
                close()
            except OSError:
                pass
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def delete(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.offset_index.delete()
        self.time_index.delete()
        self.log_path.unlink(missing_ok=True)

    def change_file_suffix(self, suffix: str) -> None:
        """Rename the segment's files from their current suffix to `suffix` (data file first,
        then the indexes; an index file that was never written is skipped). Open descriptors
        stay valid: they follow the files."""

        def renamed(path: Path) -> Path:
            return path.with_name(path.name[: len(path.name) - len(self.suffix)] + suffix)

        new_log_path = renamed(self.log_path)
        os.rename(self.log_path, new_log_path)
        self.log_path = new_log_path
        for index in (self.offset_index, self.time_index):
            new_path = renamed(index.path)
            try:
                os.rename(index.path, new_path)
            except FileNotFoundError:
                pass
            index.path = new_path
        self.suffix = suffix

    def release(self) -> None:
        """Close every descriptor (the segment leaves its log; its files stay)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.offset_index.close()
        self.time_index.close()
        self.offset_index.unload()
        self.time_index.unload()

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size})"
