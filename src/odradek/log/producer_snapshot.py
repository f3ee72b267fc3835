"""Producer state snapshot files: `<20-digit offset>.snapshot` in a partition's directory.

Kafka's format (`ProducerStateManager`, snapshot version 1), all integers big-endian:

    offset  size  field
         0     2  version                 1
         2     4  crc                     CRC32C (unsigned) of every byte from offset 6 to the end
         6     4  entry count             then, per producer, 46 bytes:
                8  producer id
                2  producer epoch
                4  last sequence          of the producer's last batch (-1 if none)
                8  last offset            of that batch (-1 if none)
                4  offset delta           last offset minus first offset of that batch
                8  timestamp              the batch's max timestamp (the producer's last write)
                4  coordinator epoch      of the last transaction marker (-1 if none)
                8  current txn first offset   first offset of its open transaction, -1 if none

The file named N holds the state of the producers after every batch below offset N: loading it
and replaying the batches from N on rebuilds the state at the log end. Only the last batch of
each producer is kept (as in Kafka): after a restart a producer's retry of one of its four
earlier batches is no longer recognised as a duplicate, but is refused as out of sequence.

A snapshot is written to `<name>.tmp` and renamed (`.tmp` files are removed when the log is
opened), and read back with its CRC checked: a file that fails it raises `CorruptSnapshotError`,
and the caller falls back to an older snapshot or to the log itself. A snapshot only saves
replay work -- losing one never makes the state wrong, only its rebuild longer -- so an empty one
(a partition without producers, the common case) is not fsynced: a broker leading 10,000
partitions writes 10,000 of them at shutdown, and at ~8 ms per fsynced file that would take over a
minute. A snapshot with producers is fsynced (file, then directory).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import google_crc32c

from odradek.errors import KafkaStorageError
from odradek.log.naming import (
    SNAPSHOT_SUFFIX,
    TEMP_SUFFIX,
    parse_producer_snapshot_file_name,
    producer_snapshot_file_name,
    read_listing,
)

SNAPSHOT_VERSION = 1
_HEADER = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")
_ENTRIES_OFFSET = 6


class CorruptSnapshotError(KafkaStorageError):
    """A snapshot file that is not a version-1 snapshot with a valid CRC."""


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    """One producer as a snapshot stores it."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / producer_snapshot_file_name(offset)


def list_snapshots(
    directory: Path, listing: Mapping[str, os.DirEntry[str]] | None = None
) -> dict[int, Path]:
    """Every snapshot file in `directory` (`listing`: its entries, when the caller has read
    them), by offset."""
    if listing is None:
        try:
            listing = read_listing(directory)
        except FileNotFoundError:
            return {}
    found: dict[int, Path] = {}
    for name, entry in listing.items():
        if not name.endswith(SNAPSHOT_SUFFIX):
            continue
        offset = parse_producer_snapshot_file_name(name)
        if offset is not None and entry.is_file():
            found[offset] = directory / name
    return found


def encode_snapshot(entries: list[SnapshotEntry]) -> bytes:
    body = bytearray(_HEADER.size + _ENTRY.size * len(entries))
    _HEADER.pack_into(body, 0, SNAPSHOT_VERSION, 0, len(entries))
    position = _HEADER.size
    pack_into = _ENTRY.pack_into
    for e in entries:
        pack_into(
            body,
            position,
            e.producer_id,
            e.producer_epoch,
            e.last_sequence,
            e.last_offset,
            e.offset_delta,
            e.timestamp,
            e.coordinator_epoch,
            e.current_txn_first_offset,
        )
        position += _ENTRY.size
    crc = google_crc32c.value(bytes(body[_ENTRIES_OFFSET:]))
    struct.pack_into(">I", body, 2, crc)
    return bytes(body)


def decode_snapshot(data: bytes, where: str = "snapshot") -> list[SnapshotEntry]:
    if len(data) < _HEADER.size:
        raise CorruptSnapshotError(f"{where}: {len(data)} bytes, shorter than a snapshot header")
    version, crc, count = _HEADER.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"{where}: unknown snapshot version {version}")
    computed = google_crc32c.value(data[_ENTRIES_OFFSET:])
    if computed != crc:
        raise CorruptSnapshotError(f"{where}: CRC {crc:#010x} stored, {computed:#010x} computed")
    if count < 0 or len(data) != _HEADER.size + count * _ENTRY.size:
        raise CorruptSnapshotError(f"{where}: {count} entries do not fit {len(data)} bytes")
    return [
        SnapshotEntry(*fields) for fields in _ENTRY.iter_unpack(memoryview(data)[_HEADER.size :])
    ]


def write_snapshot(
    directory: Path, offset: int, entries: list[SnapshotEntry], *, sync: bool = True
) -> Path:
    """Write the snapshot of `offset` (temp file, rename); with `sync`, durably (fsync the file
    before the rename and the directory after it)."""
    path = snapshot_path(directory, offset)
    temp = path.with_name(path.name + TEMP_SUFFIX)
    data = encode_snapshot(entries)
    with open(temp, "wb") as file:
        file.write(data)
        if sync:
            file.flush()
            os.fsync(file.fileno())
    os.replace(temp, path)
    if sync:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def read_snapshot(path: Path) -> list[SnapshotEntry]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CorruptSnapshotError(f"{path}: cannot read ({e})") from e
    return decode_snapshot(data, str(path))
