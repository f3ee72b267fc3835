"""Offset and time indexes: file format, lookups, truncation, laziness, corruption checks."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from odradek.errors import CorruptIndexError, InvalidOffsetError
from odradek.log.index import OffsetIndex, TimeIndex


def test_offset_index_file_format_and_lookup(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", base_offset=100, max_index_bytes=1024)
    index.append(105, 200)
    index.append(110, 450)
    index.append(130, 900)
    # Big-endian int32 relative offset + int32 position per entry.
    assert index.path.read_bytes() == struct.pack(">iiiiii", 5, 200, 10, 450, 30, 900)
    assert index.lookup(99) == (100, 0)
    assert index.lookup(104) == (100, 0)
    assert index.lookup(105) == (105, 200)
    assert index.lookup(129) == (110, 450)
    assert index.lookup(10**6) == (130, 900)
    assert index.entry_count == 3 and index.max_entries == 128
    assert index.last_entry() == (130, 900)


def test_offset_index_rejects_out_of_order_entries(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", base_offset=10, max_index_bytes=1024)
    index.append(20, 100)
    with pytest.raises(InvalidOffsetError):
        index.append(20, 200)
    with pytest.raises(InvalidOffsetError):
        index.append(25, 100)
    with pytest.raises(InvalidOffsetError):
        index.append(9, 300)
    with pytest.raises(InvalidOffsetError):
        index.append(10 + 2**31, 300)


def test_offset_index_truncate(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", base_offset=0, max_index_bytes=1024)
    for i in range(1, 6):
        index.append(i * 10, i * 100)
    index.truncate_to(30)
    assert index.entries() == [(10, 100), (20, 200)]
    assert index.path.stat().st_size == 16
    index.truncate_to(25)
    assert index.entry_count == 2
    index.append(22, 250)
    assert index.last_entry() == (22, 250)
    index.truncate_to(0)
    assert index.entries() == [] and index.lookup(50) == (0, 0)


def test_index_is_lazy_and_reopens_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    index = OffsetIndex(path, base_offset=0, max_index_bytes=1024)
    for i in range(1, 50):
        index.append(i, i * 10)
    index.flush()
    index.close()
    reopened = OffsetIndex(path, base_offset=0, max_index_bytes=1024)
    assert reopened.lookup(1_000) == (49, 490)  # tail lookups need only the last entry
    assert not reopened.is_loaded
    assert reopened.lookup(17) == (17, 170)
    assert reopened.is_loaded
    reopened.append(60, 600)  # appends continue where the file ends
    assert OffsetIndex(path, 0, 1024).entries()[-2:] == [(49, 490), (60, 600)]


def test_torn_final_entry_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    path.write_bytes(struct.pack(">iiii", 1, 10, 2, 20) + b"\x00\x00\x00")
    index = OffsetIndex(path, base_offset=0, max_index_bytes=1024)
    assert index.entry_count == 2
    assert index.entries() == [(1, 10), (2, 20)]


def test_corrupt_index_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    path.write_bytes(struct.pack(">iiiiii", 5, 10, 3, 20, 9, 30))
    with pytest.raises(CorruptIndexError):
        OffsetIndex(path, 0, 1024).entries()
    path.write_bytes(struct.pack(">iiii", 9, 10, 3, 20))
    with pytest.raises(CorruptIndexError):  # even the cheap first/last check sees this
        OffsetIndex(path, 0, 1024).last_entry()
    path.write_bytes(b"\x00" * 36)
    with pytest.raises(CorruptIndexError):
        TimeIndex(path, 0, 1024).last_entry()


def test_is_full(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", base_offset=0, max_index_bytes=20)
    assert index.max_entries == 2
    index.append(1, 1)
    assert not index.is_full
    index.append(2, 2)
    assert index.is_full


def test_time_index_semantics(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", base_offset=1_000, max_index_bytes=36)
    assert index.max_entries == 3
    assert index.lookup(5) == (-1, 1_000)
    assert index.maybe_append(100, 1_004)
    assert not index.maybe_append(100, 1_008)  # only growing timestamps are recorded
    assert not index.maybe_append(-1, 1_009)
    assert index.maybe_append(300, 1_010)
    assert index.path.read_bytes() == struct.pack(">qiqi", 100, 4, 300, 10)
    with pytest.raises(InvalidOffsetError):
        index.maybe_append(400, 1_009)
    assert index.lookup(99) == (-1, 1_000)
    assert index.lookup(100) == (100, 1_004)
    assert index.lookup(299) == (100, 1_004)
    assert index.lookup(10**12) == (300, 1_010)
    assert index.maybe_append(400, 1_020)
    assert index.is_full
    assert not index.maybe_append(500, 1_030)
    assert index.maybe_append(500, 1_030, skip_full_check=True)
    index.truncate_to(1_010)
    assert index.entries() == [(100, 1_004)]
    assert index.last_entry() == (100, 1_004)
