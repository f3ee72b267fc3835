"""The sparse offset index and time index of one log segment.

Both are arrays of fixed-size big-endian entries, appended in order and never rewritten in place.
Neither is needed for correctness: a lookup that finds nothing (or an index that was lost) falls back
to scanning the segment's batch headers from an earlier position, which is only slower. That is what
lets the log rebuild a missing or corrupt index from the segment data at any time.

`<base offset>.index` (offset index), 8-byte entries::

    relative offset  int32   last offset of a batch minus the segment's base offset
    position         int32   byte position of that batch in the segment's .log file

An entry is added for a batch once more than `index.interval.bytes` of data has been appended
since the previous entry, so lookups scan at most about that many bytes of headers. Both columns
increase strictly. "Largest entry with offset <= target" gives a batch at or before the one that
holds the target offset.

`<base offset>.timeindex` (time index), 12-byte entries::

    timestamp        int64   largest batch maxTimestamp in the segment up to this entry
    relative offset  int32   last offset of the batch where that timestamp was first reached

An entry is added together with an offset index entry, but only when the segment's largest
timestamp has grown since the last time index entry; when a segment stops being active one final
entry records its overall largest timestamp (which retention by time reads). Timestamps increase
strictly, offsets never decrease.

Unlike Kafka, files are not preallocated and memory-mapped: they are plain append-only files whose
length is always a whole number of entries (a torn final entry is ignored), and an index is read into
memory only when a lookup needs it. Lookups at or beyond the last entry (consumers and followers
reading the tail) are answered from the last entry alone, so a broker with thousands of partitions
never loads most of its indexes. The file is opened on the first write (an entry, a truncation, a
reset) and closed when the segment is sealed or recovered; `flush` fsyncs a file written and then
closed by reopening it, so closing early never loses an fsync.

Concurrency: not thread-safe; owned by one `LogSegment`, used from the broker's event loop thread.
"""

from __future__ import annotations

import operator
import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from itertools import islice
from pathlib import Path
from typing import ClassVar

from odradek.errors import CorruptIndexError, InvalidOffsetError

_INT32_MAX = 2**31 - 1
_NO_TIMESTAMP = -1


def fsync_path(path: Path) -> None:
    """fsync a file that has no open descriptor (a read-only one is enough on Linux); a file
    deleted meanwhile needs none."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _SparseIndex:
    """Append-only file of (key, value) entries with a lazily loaded in-memory copy.

    Not thread-safe: owned by one `LogSegment`, called only from the broker's event loop thread.
    """

    _ENTRY: ClassVar[struct.Struct]
    _KEY_TYPE: ClassVar[str]
    _VALUE_TYPE: ClassVar[str]

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max_index_bytes // self._ENTRY.size
        self._keys: array[int] | None = None
        self._values: array[int] | None = None
        self._count: int | None = None
        self._last: tuple[int, int] | None = None
        self._last_known = False
        self._fd: int | None = None
        self._dirty = False

    # -- state -----------------------------------------------------------------------------------

    @property
    def entry_count(self) -> int:
        if self._count is None:
            try:
                size = os.stat(self.path).st_size
            except FileNotFoundError:
                size = 0
            self._count = size // self._ENTRY.size
        return self._count

    @property
    def is_full(self) -> bool:
        return self.entry_count >= self.max_entries

    @property
    def is_loaded(self) -> bool:
        return self._keys is not None

    def _last_raw(self) -> tuple[int, int] | None:
        if not self._last_known:
            count = self.entry_count
            if count == 0:
                self._last = None
            elif self._keys is not None and self._values is not None:
                self._last = (self._keys[-1], self._values[-1])
            else:
                self._last = self._read_ends(count)
            self._last_known = True
        return self._last

    def _read_ends(self, count: int) -> tuple[int, int]:
        """Read the first and last entries without loading the index, check that they are in
        order (a cheap sanity check in the spirit of Kafka's), and return the last one."""
        size = self._ENTRY.size
        with open(self.path, "rb") as file:
            first = os.pread(file.fileno(), size, 0)
            last = os.pread(file.fileno(), size, (count - 1) * size)
        if len(first) != size or len(last) != size:
            raise CorruptIndexError(f"{self.path} shrank while being read")
        ends = (
            [self._ENTRY.unpack(first), self._ENTRY.unpack(last)]
            if count > 1
            else [self._ENTRY.unpack(last)]
        )
        keys: array[int] = array(self._KEY_TYPE, [key for key, _ in ends])
        values: array[int] = array(self._VALUE_TYPE, [value for _, value in ends])
        self._check(keys, values)
        return keys[-1], values[-1]

    def _load(self) -> tuple[array[int], array[int]]:
        if self._keys is None or self._values is None:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                data = b""
            usable = len(data) - len(data) % self._ENTRY.size
            keys, values = self._decode(data[:usable])
            self._check(keys, values)
            self._keys, self._values = keys, values
            self._count = len(keys)
            self._last = (keys[-1], values[-1]) if keys else None
            self._last_known = True
        return self._keys, self._values

    def _decode(self, data: bytes) -> tuple[array[int], array[int]]:
        keys: array[int] = array(self._KEY_TYPE)
        values: array[int] = array(self._VALUE_TYPE)
        for key, value in self._ENTRY.iter_unpack(data):
            keys.append(key)
            values.append(value)
        return keys, values

    def _check(self, keys: array[int], values: array[int]) -> None:
        raise NotImplementedError

    def _floor_entry(self, key: int) -> tuple[int, int] | None:
        """The entry with the largest key <= `key`, or None."""
        last = self._last_raw()
        if last is None:
            return None
        if key >= last[0]:
            return last
        keys, values = self._load()
        i = bisect_right(keys, key) - 1
        return (keys[i], values[i]) if i >= 0 else None

    # -- updates ---------------------------------------------------------------------------------

    def open_file(self) -> int:
        """The file's descriptor, opening (and creating) the file if need be."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    def _append_raw(self, key: int, value: int) -> None:
        count = self.entry_count
        os.pwrite(self.open_file(), self._ENTRY.pack(key, value), count * self._ENTRY.size)
        self._count = count + 1
        if self._keys is not None and self._values is not None:
            self._keys.append(key)
            self._values.append(value)
        self._last = (key, value)
        self._last_known = True
        self._dirty = True

    def _truncate_entries(self, count: int) -> None:
        if count >= self.entry_count:
            return
        os.ftruncate(self.open_file(), count * self._ENTRY.size)
        if self._keys is not None and self._values is not None:
            del self._keys[count:]
            del self._values[count:]
        self._count = count
        self._last_known = False
        self._dirty = True

    def reset(self) -> None:
        """Drop every entry (before a rebuild from the segment data). A file that does not
        exist stays absent (index files are created by their first entry), so recovering an
        empty segment creates and opens nothing."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            self._dirty = True
        else:
            try:
                os.truncate(self.path, 0)
                self._dirty = True
            except FileNotFoundError:
                pass
        self._keys = array(self._KEY_TYPE)
        self._values = array(self._VALUE_TYPE)
        self._count = 0
        self._last = None
        self._last_known = True

    def unload(self) -> None:
        """Forget the in-memory copy (it is reloaded on the next lookup that needs it)."""
        self._keys = self._values = None

    def flush(self) -> None:
        if self._dirty:
            if self._fd is not None:
                os.fsync(self._fd)
            else:
                fsync_path(self.path)
        self._dirty = False

    def ensure_file(self) -> None:
        """Create the (empty) file if no entry has created it yet."""
        if self._fd is None and not self.path.exists():
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644))

    def close(self) -> None:
        """Close the file; the index stays usable (it reopens lazily). Entries written since
        the last `flush` are still owed an fsync: the next `flush` reopens the file for it (a
        recovered log closes its rebuilt indexes at once, without paying for that fsync at
        start-up, and still has them on disk when its recovery point moves past them)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
        self.reset_memory()
        self._dirty = False

    def reset_memory(self) -> None:
        self._keys = self._values = None
        self._count = None
        self._last_known = False


class OffsetIndex(_SparseIndex):
    """Maps offsets to positions in the segment's .log file (see the module docstring)."""

    _ENTRY = struct.Struct(">ii")
    _KEY_TYPE = "i"
    _VALUE_TYPE = "i"

    def _decode(self, data: bytes) -> tuple[array[int], array[int]]:
        # Both columns are int32: decode the whole file with one array() call and split the
        # interleaved columns with slices, instead of unpacking entry by entry.
        words: array[int] = array("i", data)
        if sys.byteorder == "little":
            words.byteswap()
        return words[0::2], words[1::2]

    def _check(self, keys: array[int], values: array[int]) -> None:
        if keys and (keys[0] < 0 or values[0] < 0):
            raise CorruptIndexError(f"{self.path}: negative first entry")
        if not all(map(operator.lt, keys, islice(keys, 1, None))):
            raise CorruptIndexError(f"{self.path}: offsets do not increase")
        if not all(map(operator.lt, values, islice(values, 1, None))):
            raise CorruptIndexError(f"{self.path}: positions do not increase")

    def last_entry(self) -> tuple[int, int] | None:
        """(offset, position) of the last entry, or None."""
        last = self._last_raw()
        return None if last is None else (self.base_offset + last[0], last[1])

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the largest entry with offset <= `offset`; (base, 0) if none."""
        entry = self._floor_entry(offset - self.base_offset)
        if entry is None:
            return self.base_offset, 0
        return self.base_offset + entry[0], entry[1]

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        if not 0 <= relative <= _INT32_MAX:
            raise InvalidOffsetError(
                f"{self.path}: offset {offset} does not fit a segment based at {self.base_offset}"
            )
        last = self._last_raw()
        if last is not None and (relative <= last[0] or position <= last[1]):
            raise InvalidOffsetError(
                f"{self.path}: entry ({offset}, {position}) is not after the last entry "
                f"({self.base_offset + last[0]}, {last[1]})"
            )
        self._append_raw(relative, position)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= `offset`."""
        keys, _ = self._load()
        self._truncate_entries(bisect_left(keys, max(offset - self.base_offset, 0)))

    def entries(self) -> list[tuple[int, int]]:
        keys, values = self._load()
        return [(self.base_offset + k, v) for k, v in zip(keys, values, strict=True)]


class TimeIndex(_SparseIndex):
    """Maps timestamps to offsets in the segment (see the module docstring)."""

    _ENTRY = struct.Struct(">qi")
    _KEY_TYPE = "q"
    _VALUE_TYPE = "i"

    def _check(self, keys: array[int], values: array[int]) -> None:
        if values and values[0] < 0:
            raise CorruptIndexError(f"{self.path}: negative first offset")
        if not all(map(operator.lt, keys, islice(keys, 1, None))):
            raise CorruptIndexError(f"{self.path}: timestamps do not increase")
        if not all(map(operator.le, values, islice(values, 1, None))):
            raise CorruptIndexError(f"{self.path}: offsets decrease")

    def last_entry(self) -> tuple[int, int] | None:
        """(timestamp, offset) of the last entry, or None."""
        last = self._last_raw()
        return None if last is None else (last[0], self.base_offset + last[1])

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the largest entry with timestamp <= `timestamp`.

        (-1, base offset) if every entry is newer: the search must start at the segment's start.
        """
        entry = self._floor_entry(timestamp)
        if entry is None:
            return _NO_TIMESTAMP, self.base_offset
        return entry[0], self.base_offset + entry[1]

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> bool:
        """Add (timestamp, offset) if the timestamp is newer than the last entry's.

        `skip_full_check` is for the final entry written when the segment stops being active,
        which may exceed `max_entries` by one.
        """
        if timestamp < 0 or (self.is_full and not skip_full_check):
            return False
        relative = offset - self.base_offset
        if not 0 <= relative <= _INT32_MAX:
            raise InvalidOffsetError(
                f"{self.path}: offset {offset} does not fit a segment based at {self.base_offset}"
            )
        last = self._last_raw()
        if last is not None:
            if relative < last[1]:
                raise InvalidOffsetError(
                    f"{self.path}: offset {offset} is before the last entry's "
                    f"{self.base_offset + last[1]}"
                )
            if timestamp <= last[0]:
                return False
        self._append_raw(timestamp, relative)
        return True

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= `offset`."""
        _, values = self._load()
        self._truncate_entries(bisect_left(values, max(offset - self.base_offset, 0)))

    def entries(self) -> list[tuple[int, int]]:
        keys, values = self._load()
        return [(k, self.base_offset + v) for k, v in zip(keys, values, strict=True)]
