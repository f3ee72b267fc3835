"""Cleanings in a cleaner process (`odradek.log.cleaner_process`): the same result as in the
broker's own process, at a lower CPU priority, and nothing left behind when a cleaning is aborted
or its process dies."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from odradek.log.cleaner import CleanerStats, CleaningAbortedError
from odradek.log.cleaner_process import CleanerChildError, CleanerProcess, CleanerProcessConfig
from odradek.log.config import LogConfig
from tests.unit.compacted_log import Harness, fill

CONFIG = LogConfig(
    segment_bytes=1200,
    index_interval_bytes=150,
    cleanup_policy=("compact",),
    delete_retention_ms=1000,
)


def process_config(**changes: Any) -> CleanerProcessConfig:
    values: dict[str, Any] = {
        "map_memory": 1 << 20,
        "load_factor": 0.9,
        "io_buffer_size": 2048,
        "io_max_bytes_per_second": float("inf"),
        "nice": 5,
    }
    values.update(changes)
    return CleanerProcessConfig(**values)


@pytest.fixture
def make_process() -> Iterator[Callable[..., CleanerProcess]]:
    started: list[CleanerProcess] = []

    def make(**changes: Any) -> CleanerProcess:
        process = CleanerProcess(process_config(**changes), "test-cleaner")
        started.append(process)
        return process

    yield make
    for process in started:
        process.close()


def filled(root: Path, records: int = 300) -> Harness:
    harness = Harness(root, CONFIG)
    fill(harness, records, keys=15)
    harness.roll()
    return harness


def clean_with(
    harness: Harness, process: CleanerProcess, check_abort: Callable[[], None]
) -> CleanerStats:
    job = harness.manager.grab_filthiest_log(harness.now)
    assert job is not None
    swapped: list[list[Any]] = []

    def swap(job: Any, group: Any, size: int) -> bool:
        old = [s.segment for s in group]
        swapped.append(old)
        done = harness.log.replace_segments(old, [s.size for s in group], size, harness.now)
        for segment in old if done else []:
            segment.delete()
        return done

    try:
        stats = process.clean(job, harness.now, swap, check_abort)
    finally:
        harness.manager.cleaning_ended(job.topic_partition)
    # The swaps got the broker's own segment objects back, not the child's copies.
    assert swapped and all(segment is not None for group in swapped for segment in group)
    return stats


def cleaned_files(harness: Harness) -> list[str]:
    return sorted(p.name for p in harness.dir.iterdir() if p.name.endswith(".cleaned"))


def test_a_cleaning_in_a_process_leaves_what_one_in_the_broker_leaves(
    tmp_path: Path, make_process: Callable[..., CleanerProcess]
) -> None:
    here, there = filled(tmp_path / "here"), filled(tmp_path / "there")
    expected = here.clean()
    assert expected is not None
    stats = clean_with(there, make_process(), lambda: None)
    assert stats.end_offset == expected.end_offset
    assert (stats.records_read, stats.records_kept) == (
        expected.records_read,
        expected.records_kept,
    )
    assert there.check() == here.check()
    assert cleaned_files(there) == []


def test_the_cleaner_process_runs_at_a_lower_priority(
    make_process: Callable[..., CleanerProcess],
) -> None:
    process = make_process(nice=7)
    process.start()
    assert process._process is not None
    assert os.getpriority(os.PRIO_PROCESS, process._process.pid) >= 7


def test_an_aborted_cleaning_stops_the_child_and_leaves_the_log_as_it_was(
    tmp_path: Path, make_process: Callable[..., CleanerProcess]
) -> None:
    harness = filled(tmp_path)
    before = harness.records()
    process = make_process(io_max_bytes_per_second=20_000.0)  # slow: seconds for this log

    def abort() -> None:
        raise CleaningAbortedError("the test aborts")

    with pytest.raises(CleaningAbortedError):
        clean_with(harness, process, abort)
    assert cleaned_files(harness) == []
    assert harness.records() == before
    # The same child takes the next cleaning.
    pid = process._process.pid
    stats = clean_with(harness, process, lambda: None)
    assert stats.records_kept < len(before)
    assert process._process is not None and process._process.pid == pid


def test_a_child_killed_in_a_cleaning_fails_only_that_cleaning(
    tmp_path: Path, make_process: Callable[..., CleanerProcess]
) -> None:
    harness = filled(tmp_path)
    before = harness.records()
    process = make_process(io_max_bytes_per_second=20_000.0)

    def kill_child() -> None:
        os.kill(process._process.pid, signal.SIGKILL)

    with pytest.raises(CleanerChildError, match="died during the cleaning"):
        clean_with(harness, process, kill_child)
    assert cleaned_files(harness) == []
    assert harness.records() == before


def test_a_new_child_takes_the_cleaning_after_one_died(
    tmp_path: Path, make_process: Callable[..., CleanerProcess]
) -> None:
    harness = filled(tmp_path)
    process = make_process()
    process.start()
    first = process._process.pid
    os.kill(first, signal.SIGKILL)
    process._process.join(10)
    stats = clean_with(harness, process, lambda: None)
    assert process._process.pid != first
    records = harness.check()
    assert stats.records_kept == len(records) == len({r.key for r in records})


def test_the_child_exits_when_the_broker_goes(
    make_process: Callable[..., CleanerProcess],
) -> None:
    process = make_process()
    process.start()
    child = process._process
    process._conn.close()  # what the broker's exit does to its end of the pipe
    child.join(10)
    assert child.exitcode == 0
