"""The aborted-transaction index of a log: Kafka's `.txnindex` files, one per segment.

File format (Kafka's TransactionIndex, so Kafka's DumpLogSegments reads it): a sequence of 34-byte
entries, each

    int16 version (0) | int64 producerId | int64 firstOffset | int64 lastOffset | int64 lastStableOffset

one per transaction aborted by an ABORT marker stored in that segment (`lastOffset` is the marker's
offset, `firstOffset` the transaction's first batch, `lastStableOffset` the partition's LSO once the
abort completed). The file `<base offset>.txnindex` sits beside the segment's `.log`; it exists
only once the segment holds an aborted transaction.

Readers: a read_committed Fetch gets, with its records, the aborted transactions that overlap
them (`collect(fetch_offset, upper_bound)`: entries with lastOffset >= fetch offset and
firstOffset < upper bound), so the consumer can drop their records.

Maintenance: entries are appended by `Log` as markers are appended (leader, follower, and the
replay of recovery, which re-adds any entry missing after a crash: `append` ignores an entry it
already has); truncation drops the entries of markers at or beyond the truncation offset;
segments deleted by retention take their file with them (`retain`).

The whole index of a log is also kept in memory (a few bytes per aborted transaction).

Concurrency: owned by one `Log`; event-loop thread only.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from odradek.errors import CorruptRecordError

ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34
VERSION = 0
SUFFIX = ".txnindex"


def txn_index_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


@dataclass(frozen=True, slots=True, order=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return ENTRY.pack(
            VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset
        )


def read_index_file(path: Path) -> list[AbortedTxn]:
    """The entries of one `.txnindex` file; a torn last entry (a crash mid-write) is ignored."""
    data = path.read_bytes()
    entries = []
    for position in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        version, producer_id, first, last, lso = ENTRY.unpack_from(data, position)
        if version != VERSION:
            raise CorruptRecordError(f"{path}: unknown transaction index version {version}")
        entries.append(AbortedTxn(producer_id, first, last, lso))
    return entries


class TransactionIndexes:
    def __init__(self, directory: Path, names: Iterable[str] | None = None) -> None:
        """Reads the `.txnindex` files of `directory` (`names`: its file names, when the caller
        has listed it)."""
        self.directory = directory
        self._by_segment: dict[int, list[AbortedTxn]] = {}
        for name in os.listdir(directory) if names is None else names:
            if not name.endswith(SUFFIX):
                continue
            try:
                base = int(name[: -len(SUFFIX)])
            except ValueError:
                continue
            entries = read_index_file(directory / name)
            if entries:
                self._by_segment[base] = entries
        self._bases = sorted(self._by_segment)

    def _path(self, base: int) -> Path:
        return self.directory / txn_index_file_name(base)

    def entries(self) -> list[AbortedTxn]:
        return [e for base in self._bases for e in self._by_segment[base]]

    def append(self, segment_base: int, txn: AbortedTxn) -> None:
        """Record an aborted transaction whose marker is in the segment at `segment_base`."""
        entries = self._by_segment.get(segment_base)
        if entries is None:
            entries = self._by_segment[segment_base] = []
            bisect.insort(self._bases, segment_base)
        if any(
            e.producer_id == txn.producer_id and e.first_offset == txn.first_offset for e in entries
        ):
            return
        entries.append(txn)
        with open(self._path(segment_base), "ab") as f:
            f.write(txn.encode())

    def replaced(self, old_bases: Iterable[int], new_base: int) -> None:
        """The log cleaner swapped the segment at `new_base` in for those at `old_bases`: its
        `.txnindex` (when it has one) came with it and theirs were renamed away; read it."""
        for base in old_bases:
            if self._by_segment.pop(base, None) is not None:
                self._bases.remove(base)
        path = self._path(new_base)
        entries = read_index_file(path) if path.exists() else []
        if entries:
            self._by_segment[new_base] = entries
            bisect.insort(self._bases, new_base)

    def collect(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Aborted transactions that overlap [fetch_offset, upper_bound)."""
        found = []
        for base in self._bases:
            for txn in self._by_segment[base]:
                if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound:
                    found.append(txn)
        return found

    def truncate_to(self, offset: int) -> None:
        """Forget the entries whose marker is at or beyond `offset`."""
        for base in list(self._bases):
            entries = self._by_segment[base]
            kept = [e for e in entries if e.last_offset < offset]
            if len(kept) == len(entries):
                continue
            self._rewrite(base, kept)

    def retain(self, bases: Iterable[int]) -> None:
        """Delete the index files of segments no longer in the log."""
        alive = set(bases)
        for base in list(self._bases):
            if base not in alive:
                self._rewrite(base, [])

    def delete_all(self) -> None:
        for base in list(self._bases):
            self._rewrite(base, [])

    def flush(self) -> None:
        for base in self._bases:
            path = self._path(base)
            if path.exists():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def _rewrite(self, base: int, entries: list[AbortedTxn]) -> None:
        path = self._path(base)
        if not entries:
            self._by_segment.pop(base, None)
            self._bases.remove(base)
            path.unlink(missing_ok=True)
            return
        self._by_segment[base] = entries
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_bytes(b"".join(e.encode() for e in entries))
        os.replace(temporary, path)
