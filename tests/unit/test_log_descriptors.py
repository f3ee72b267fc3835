"""File descriptors of the log layer: a log recovered after a crash holds no more than one opened
after a clean shutdown (one: its active segment's data file), its rebuilt indexes are still
fsynced by the next flush, and running out of descriptors (EMFILE) fails the operation with a
message naming the limit, writes nothing half-way and does not take the log directory offline.
The broker process under a low limit: tests/integration/test_crash_recovery.py."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from odradek.errors import KafkaStorageError
from odradek.log import index as index_module
from odradek.log.config import LogConfig
from odradek.log.fd_limit import descriptor_limit_message, is_descriptor_exhaustion
from odradek.log.log import Log
from odradek.log.log_dir_failure import LogDirFailureChannel, is_io_failure
from odradek.log.log_manager import LogManager
from odradek.protocol.record_batch import build_batch, decode_records, iter_batches

CONFIG = LogConfig(segment_bytes=1_000, index_interval_bytes=100)


def records(n: int, tag: str) -> bytes:
    return build_batch([(None, f"{tag}-{i}".encode(), [], 1_000 + i) for i in range(n)])


def open_log(directory: Path, *, clean: bool, recovery_point: int = 0) -> Log:
    return Log.open(
        directory,
        CONFIG,
        recovery_point=recovery_point,
        log_start_offset=0,
        clean_shutdown=clean,
        now_ms=0,
    )


def open_files_under(directory: Path) -> list[str]:
    """Names of the files under `directory` that this process has open (/proc/self/fd)."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir itself used, closed meanwhile
            continue
        if target.startswith(f"{directory}/"):
            names.append(target[len(str(directory)) + 1 :])
    return sorted(names)


def values(log: Log) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    offset = 0
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        for header in iter_batches(data):
            out += [(r.offset, r.value) for r in decode_records(data[header.position :])]
            offset = header.base_offset + header.last_offset_delta + 1
    return out


def write_logs(root: Path, count: int, batches: int) -> list[tuple[int, bytes | None]]:
    """`count` logs of `batches` 4-record batches (several segments each), left as a crash
    leaves them: written, not flushed, never closed. Returns the values of each."""
    for n in range(count):
        log = open_log(root / f"events-{n}", clean=True)
        for i in range(batches):
            log.append_as_leader(records(4, f"r{i}"), 1, 0)
        expected = values(log)
        log.close_quietly()
    return expected


def test_a_recovered_log_holds_no_more_descriptors_than_a_clean_open(tmp_path: Path):
    expected = write_logs(tmp_path / "crashed", 5, 40)
    write_logs(tmp_path / "clean", 5, 40)
    for n in range(5):
        open_log(tmp_path / "clean" / f"events-{n}", clean=True).close()

    recovered = [open_log(tmp_path / "crashed" / f"events-{n}", clean=False) for n in range(5)]
    clean = [open_log(tmp_path / "clean" / f"events-{n}", clean=True) for n in range(5)]

    assert recovered[0].segment_count >= 4  # every segment was recovered (recovery point 0)
    held_after_recovery = open_files_under(tmp_path / "crashed")
    held_after_clean_open = open_files_under(tmp_path / "clean")
    # One per log, the active segment's data file, either way (before: three per log after
    # recovery, and one more for every recovered sealed segment).
    assert len(held_after_recovery) == len(held_after_clean_open) == 5
    assert all(name.endswith(".log") for name in held_after_recovery)
    for log in recovered:
        assert values(log) == expected  # reading reopens what it needs
        log.append_as_leader(records(4, "after"), 2, 0)
        assert values(log)[-1] == (log.log_end_offset - 1, b"after-3")
    for log in recovered + clean:
        log.close()


def test_the_rebuilt_indexes_closed_after_recovery_are_fsynced_by_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    write_logs(tmp_path, 1, 15)
    log = open_log(tmp_path / "events-0", clean=False)
    active = log.active_segment
    assert active.offset_index.entry_count > 0 and open_files_under(tmp_path) == [
        f"events-0/{active.log_path.name}"
    ]
    fsynced: list[Path] = []
    real = index_module.fsync_path

    def recording_fsync(path: Path) -> None:
        fsynced.append(path)
        real(path)

    monkeypatch.setattr(index_module, "fsync_path", recording_fsync)
    log.flush()
    assert sorted(fsynced) == sorted([active.offset_index.path, active.time_index.path])
    log.close()


def refuse_opens(monkeypatch: pytest.MonkeyPatch, refused: Callable[[str], bool]) -> None:
    """Make `os.open` fail with EMFILE for the paths `refused` picks."""
    real_open = os.open

    def open_or_refuse(path: Any, *args: Any, **kwargs: Any) -> int:
        if refused(os.fspath(path)):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_or_refuse)


def test_an_append_refused_a_descriptor_writes_nothing_and_keeps_the_directory_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    offline: list[Path] = []
    manager = LogManager(
        [tmp_path / "a"], CONFIG, failure_channel=LogDirFailureChannel(offline.append)
    )
    manager.startup(now_ms=0)
    log = manager.get_or_create_log("t", 0)
    log.append_as_leader(records(8, "first"), 0, 0)  # > index.interval.bytes: the next indexes
    active = log.active_segment
    size, end = active.size, log.log_end_offset

    refuse_opens(monkeypatch, lambda path: path.endswith(".index"))
    with pytest.raises(KafkaStorageError, match="RLIMIT_NOFILE") as refused:
        log.append_as_leader(records(8, "second"), 0, 0)
    monkeypatch.undo()
    assert "ulimit" in str(refused.value) and "\n" not in str(refused.value)
    assert offline == [] and manager.is_log_dir_online(tmp_path / "a")
    # Nothing of the refused append reached the file or the log's state.
    assert (active.size, log.log_end_offset) == (size, end)
    assert os.path.getsize(active.log_path) == size

    log.append_as_leader(records(8, "third"), 0, 0)
    assert [v for _, v in values(log)] == [f"first-{i}".encode() for i in range(8)] + [
        f"third-{i}".encode() for i in range(8)
    ]
    assert active.offset_index.entry_count == 1
    manager.shutdown()


def test_running_out_of_descriptors_during_recovery_stops_the_start_up_not_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    write_logs(tmp_path / "a", 3, 20)
    offline: list[Path] = []
    manager = LogManager(
        [tmp_path / "a"], CONFIG, failure_channel=LogDirFailureChannel(offline.append)
    )
    refuse_opens(monkeypatch, lambda path: path.endswith(".timeindex"))
    with pytest.raises(KafkaStorageError, match="RLIMIT_NOFILE"):
        manager.startup(now_ms=0)
    monkeypatch.undo()
    assert offline == []
    manager.shutdown()  # releases the directory's lock; writes no clean-shutdown marker

    # The interrupted recovery lost nothing: the next start recovers every record.
    manager = LogManager([tmp_path / "a"], CONFIG)
    manager.startup(now_ms=0)
    logs = manager.all_logs()
    assert len(logs) == 3
    for log in logs:
        assert [v for _, v in values(log)] == [
            f"r{i}-{j}".encode() for i in range(20) for j in range(4)
        ]
    manager.shutdown()


def test_descriptor_exhaustion_is_not_a_disk_failure():
    emfile = OSError(errno.EMFILE, "Too many open files")
    wrapped = KafkaStorageError("x")
    wrapped.__cause__ = emfile
    assert is_descriptor_exhaustion(emfile) and is_descriptor_exhaustion(wrapped)
    assert not is_io_failure(emfile) and not is_io_failure(wrapped)
    assert is_io_failure(OSError(errno.EIO, "eio"))
    assert "RLIMIT_NOFILE" in descriptor_limit_message(wrapped)
    assert "fs.file-max" in descriptor_limit_message(OSError(errno.ENFILE, "table full"))


def test_the_soft_limit_is_raised_to_the_hard_limit():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 64 if hard == resource.RLIM_INFINITY else min(64, hard)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import resource; from odradek.log.fd_limit import raise_soft_limit; "
            "raise_soft_limit(); print(*resource.getrlimit(resource.RLIMIT_NOFILE))",
        ],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    soft_after, hard_after = map(int, result.stdout.split())
    assert hard_after == hard
    assert soft_after == hard or (hard == resource.RLIM_INFINITY and soft_after > low)
