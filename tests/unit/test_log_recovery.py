"""Log start-up: lazy clean opens, recovery of torn/corrupt tails, rebuilt indexes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from odradek.log import segment as segment_module
from odradek.log import segment_recovery as segment_recovery_module
from odradek.log.config import LogConfig
from odradek.log.leader_epoch import EpochEntry
from odradek.log.log import Log
from odradek.log.naming import LEADER_EPOCH_CHECKPOINT
from odradek.protocol.record_batch import build_batch, decode_records, iter_batches, read_header

CONFIG = LogConfig(segment_bytes=1_000, index_interval_bytes=100)


@pytest.fixture(params=["default-chunks", "tiny-chunks"], autouse=True)
def chunk_sizes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every test also with read chunks smaller than a batch, so that batches straddle
    chunk boundaries during header scans and recovery."""
    if request.param == "tiny-chunks":
        monkeypatch.setattr(segment_module, "SCAN_CHUNK_BYTES", 70)
        monkeypatch.setattr(segment_recovery_module, "RECOVERY_CHUNK_BYTES", 64)


def records(n: int, ts: int, tag: str) -> bytes:
    return build_batch([(None, f"{tag}-{i}".encode(), [], ts + i) for i in range(n)])


def open_log(path: Path, *, clean: bool, recovery_point: int = 0, start: int = 0) -> Log:
    return Log.open(
        path / "events-0",
        CONFIG,
        recovery_point=recovery_point,
        log_start_offset=start,
        clean_shutdown=clean,
        now_ms=0,
    )


def populate(path: Path, batches: int = 40) -> tuple[Log, list[int]]:
    """A log of `batches` 4-record batches across several segments; returns it and the batch
    base offsets. The log is left open (like a broker that crashed)."""
    log = open_log(path, clean=True)
    for i in range(batches):
        log.append_as_leader(records(4, 1_000 + 4 * i, f"r{i}"), 1 + i // 20, 0)
    return log, [4 * i for i in range(batches)]


def all_values(log: Log) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        for header in iter_batches(data):
            out += [(r.offset, r.value) for r in decode_records(data[header.position :])]
        offset = read_header(data[-header.size :]).last_offset + 1 if data else offset + 1
    return out


def expected_values(batches: int) -> list[tuple[int, bytes]]:
    return [(4 * i + j, f"r{i}-{j}".encode()) for i in range(batches) for j in range(4)]


def active_log_file(log: Log) -> Path:
    return log.active_segment.log_path


def test_clean_reopen_preserves_everything_and_is_lazy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, _ = populate(tmp_path, 200)
    before = (log.log_end_offset, log.size_in_bytes, log.segment_count)
    assert log.segment_count > 20
    log.flush()
    log.close()

    read_bytes = 0
    real_pread = os.pread

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        nonlocal read_bytes
        data = real_pread(fd, length, offset)
        read_bytes += len(data)
        return data

    monkeypatch.setattr(os, "pread", counting_pread)
    reopened = open_log(tmp_path, clean=True)
    assert (reopened.log_end_offset, reopened.size_in_bytes, reopened.segment_count) == before
    assert reopened.recovery_point == reopened.log_end_offset
    # Only the active segment's tail was read, not the ~19 KB of data or any sealed index.
    assert read_bytes < CONFIG.segment_bytes + 100
    assert not any(s.offset_index.is_loaded for s in reopened.segments())
    monkeypatch.undo()
    assert all_values(reopened) == expected_values(200)
    assert reopened.append_as_leader(records(1, 0, "x"), 9, 0).first_offset == 800


def test_torn_tail_is_truncated(tmp_path: Path) -> None:
    log, bases = populate(tmp_path)
    path = active_log_file(log)
    last = list(iter_batches(path.read_bytes()))[-1]
    os.truncate(path, last.position + last.size // 2)  # crash mid-write of the last batch
    recovered = open_log(tmp_path, clean=False)
    assert recovered.log_end_offset == bases[-1]
    assert all_values(recovered) == expected_values(len(bases) - 1)
    assert recovered.append_as_leader(records(2, 0, "after"), 9, 0).first_offset == bases[-1]
    assert all_values(recovered)[-2:] == [(bases[-1], b"after-0"), (bases[-1] + 1, b"after-1")]


def test_garbage_appended_is_truncated(tmp_path: Path) -> None:
    log, bases = populate(tmp_path)
    path = active_log_file(log)
    size = path.stat().st_size
    with open(path, "ab") as file:
        file.write(b"\x00" * 40 + os.urandom(500))
    recovered = open_log(tmp_path, clean=False)
    assert recovered.log_end_offset == bases[-1] + 4
    assert path.stat().st_size == size
    assert all_values(recovered) == expected_values(len(bases))


def test_flipped_byte_truncates_from_the_bad_batch(tmp_path: Path) -> None:
    log, _bases = populate(tmp_path)
    path = active_log_file(log)
    headers = list(iter_batches(path.read_bytes()))
    assert len(headers) >= 3
    victim = headers[-2]
    with open(path, "r+b") as file:
        file.seek(victim.position + victim.size - 3)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0x10]))
    recovered = open_log(tmp_path, clean=False)
    assert recovered.log_end_offset == victim.base_offset
    assert all_values(recovered) == expected_values(victim.base_offset // 4)
    # The rebuilt indexes serve reads at every offset that survived.
    for offset in range(recovered.log_end_offset):
        assert read_header(recovered.read(offset, 1)).base_offset == offset - offset % 4


def test_corruption_in_an_older_segment_deletes_later_segments(tmp_path: Path) -> None:
    log, _ = populate(tmp_path)
    segments = log.segments()
    assert len(segments) >= 4
    victim_segment = segments[1]
    with open(victim_segment.log_path, "r+b") as file:
        file.seek(200)
        file.write(b"\xff\xff\xff")
    recovered = open_log(tmp_path, clean=False, recovery_point=victim_segment.base_offset)
    assert recovered.segment_count == 2
    end = recovered.log_end_offset
    assert victim_segment.base_offset <= end < segments[2].base_offset
    assert sorted(p.name for p in recovered.dir.glob("*.log")) == [
        s.log_path.name for s in segments[:2]
    ]
    assert all_values(recovered) == expected_values(end // 4)


def test_recovery_starts_at_the_recovery_point(tmp_path: Path) -> None:
    log, _ = populate(tmp_path)
    segments = log.segments()
    # Damage a segment below the recovery point: recovery must not look at it (it was fsynced).
    with open(segments[0].log_path, "r+b") as file:
        file.seek(100)
        file.write(b"\xff")
    recovered = open_log(tmp_path, clean=False, recovery_point=segments[2].base_offset)
    assert recovered.log_end_offset == log.log_end_offset
    assert recovered.segment_count == len(segments)


def test_unclean_reopen_without_damage_keeps_everything(tmp_path: Path) -> None:
    log, bases = populate(tmp_path)
    recovered = open_log(tmp_path, clean=False, recovery_point=0)
    assert recovered.log_end_offset == log.log_end_offset
    assert recovered.recovery_point == 0
    assert all_values(recovered) == expected_values(len(bases))
    assert recovered.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(2, 80)]


def test_unclean_reopen_of_an_empty_log_creates_no_index_files(tmp_path: Path) -> None:
    """Recovering an empty segment has nothing to index: its index files stay absent (they
    appear with their first entry), and appending afterwards indexes as usual."""
    open_log(tmp_path, clean=True)  # created, then the broker is killed
    recovered = open_log(tmp_path, clean=False)
    directory = tmp_path / "events-0"
    assert sorted(p.suffix for p in directory.glob("0*")) == [".log"]
    assert recovered.log_end_offset == 0
    for i in range(10):
        recovered.append_as_leader(records(4, 1_000 + 4 * i, f"r{i}"), 1, 0)
    assert any(s.offset_index.entry_count > 0 for s in recovered.segments())
    assert recovered.fetch_offset_by_timestamp(1_000 + 30) == (30, 1_030)


def test_stale_index_entries_of_an_emptied_segment_are_dropped(tmp_path: Path) -> None:
    """An unclean shutdown may leave index entries behind data that never reached the disk: an
    empty data file with non-empty index files recovers to an empty log with empty indexes."""
    log, _ = populate(tmp_path, 3)
    log.close()
    assert log.active_segment.offset_index.path.stat().st_size > 0
    os.truncate(log.active_segment.log_path, 0)
    recovered = open_log(tmp_path, clean=False)
    assert recovered.log_end_offset == 0
    assert recovered.active_segment.offset_index.entry_count == 0
    assert log.active_segment.offset_index.path.stat().st_size == 0
    assert log.active_segment.time_index.path.stat().st_size == 0


def test_missing_index_files_are_rebuilt(tmp_path: Path) -> None:
    log, bases = populate(tmp_path)
    log.close()
    for index in list(log.dir.glob("*.index")) + list(log.dir.glob("*.timeindex")):
        index.unlink()
    reopened = open_log(tmp_path, clean=True)
    assert reopened.log_end_offset == log.log_end_offset
    assert all(s.offset_index.entry_count > 0 for s in reopened.segments())
    assert all_values(reopened) == expected_values(len(bases))
    assert reopened.fetch_offset_by_timestamp(1_000 + 50) == (50, 1_050)


def test_corrupt_index_files_are_rebuilt(tmp_path: Path) -> None:
    log, bases = populate(tmp_path)
    log.close()
    for index in log.dir.glob("*.index"):
        index.write_bytes(os.urandom(64))
    for index in log.dir.glob("*.timeindex"):
        index.write_bytes(b"\x00" * 36)
    reopened = open_log(tmp_path, clean=True)
    assert reopened.log_end_offset == log.log_end_offset
    assert all_values(reopened) == expected_values(len(bases))
    assert reopened.fetch_offset_by_timestamp(1_000 + 99) == (99, 1_099)


def test_inconsistent_active_segment_after_clean_shutdown_is_recovered(tmp_path: Path) -> None:
    log, bases = populate(tmp_path)
    log.close()
    with open(log.active_segment.log_path, "ab") as file:
        file.write(b"\x01\x02\x03")
    reopened = open_log(tmp_path, clean=True)
    assert reopened.log_end_offset == log.log_end_offset
    assert all_values(reopened) == expected_values(len(bases))


def test_lost_leader_epoch_checkpoint_is_rebuilt_from_batches(tmp_path: Path) -> None:
    log, _ = populate(tmp_path)
    log.close()
    (log.dir / LEADER_EPOCH_CHECKPOINT).write_text("garbage\n")
    reopened = open_log(tmp_path, clean=True)
    assert reopened.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(2, 80)]
    assert reopened.log_end_offset == log.log_end_offset


def test_stray_files_are_removed(tmp_path: Path) -> None:
    log, _ = populate(tmp_path, 3)
    log.close()
    strays = [
        log.dir / "00000000000000000000.log.deleted",
        log.dir / "00000000000000000099.index",
        log.dir / "leader-epoch-checkpoint.tmp",
    ]
    for stray in strays:
        stray.write_bytes(b"x")
    open_log(tmp_path, clean=True)
    assert not any(stray.exists() for stray in strays)


def test_checkpointed_start_beyond_the_data_restarts_the_log(tmp_path: Path) -> None:
    log, _ = populate(tmp_path, 3)
    log.close()
    reopened = open_log(tmp_path, clean=True, start=500)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (500, 500)
    assert reopened.segment_count == 1


def test_checkpointed_start_inside_the_log(tmp_path: Path) -> None:
    log, _ = populate(tmp_path)
    log.close()
    reopened = open_log(tmp_path, clean=True, start=42)
    assert reopened.log_start_offset == 42
    assert all_values(reopened)[0] == (40, b"r10-0")
