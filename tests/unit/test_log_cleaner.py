"""The log cleaner on real log directories, without a broker: the manager's choices, a cleaning's
result, tombstones, a small offset map, and a crash at every step of a segment swap.

`tests.unit.compacted_log.Harness` drives cleanings synchronously and checks the invariants of a
compacted log after each cleaning and reopen; here, in addition, a complete cleaning of a fully
cleanable log leaves exactly one record per key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from odradek.log import segment_swap
from odradek.log.cleaner import CleaningAbortedError
from odradek.log.config import LogConfig
from odradek.log.naming import CLEANER_OFFSET_CHECKPOINT
from odradek.protocol.compaction import SLOT_SIZE
from tests.unit.compacted_log import TOPIC, Harness, SimulatedCrash, abandon, fill


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    config = LogConfig(
        segment_bytes=1200,
        index_interval_bytes=150,
        cleanup_policy=("compact",),
        delete_retention_ms=1000,
    )
    h = Harness(tmp_path, config)
    yield h
    if not h.log.is_closed:
        h.log.close()


def test_a_cleaning_leaves_the_latest_record_of_each_key(harness: Harness) -> None:
    fill(harness, 200, keys=15)
    harness.roll()
    stats = harness.clean()
    assert stats is not None and stats.end_offset == harness.log.log_end_offset
    records = harness.check()
    assert len({r.key for r in records}) == len(records) == 15
    assert harness.manager.checkpoint((TOPIC, 0)) == harness.log.log_end_offset
    checkpoint = (harness.root / CLEANER_OFFSET_CHECKPOINT).read_text().split("\n")
    assert checkpoint[:3] == ["0", "1", f"{TOPIC} 0 {harness.log.log_end_offset}"]
    # Reopened cleanly and after a crash, the log reads the same.
    harness.log.close()
    for clean in (True, False):
        harness.log = harness.open(clean=clean)
        assert harness.check() == records
        harness.log.close()


def test_tombstones_stay_for_delete_retention_ms_then_go(harness: Harness) -> None:
    harness.append([(b"a", b"1"), (b"b", b"1")])
    harness.append([(b"a", None)])
    harness.roll()
    harness.clean()
    assert [(r.key, r.value) for r in harness.check()] == [(b"b", b"1"), (b"a", None)]
    # Nothing dirty, within the horizon: nothing to do.
    assert harness.clean(harness.now + 999) is None
    # Once the horizon has passed the manager cleans again by itself, and the tombstone goes.
    stats = harness.clean(harness.now + 1000)
    assert stats is not None
    assert [(r.key, r.value) for r in harness.check()] == [(b"b", b"1")]
    assert harness.clean(harness.now + 5000) is None


def test_the_active_segment_and_data_above_the_high_watermark_are_not_cleaned(
    harness: Harness,
) -> None:
    fill(harness, 60, keys=3, tombstones=0)
    harness.roll()
    fill(harness, 60, keys=3, seed=2, tombstones=0)
    active = harness.log.active_segment.base_offset
    harness.clean()
    records = harness.check()
    assert all(r.offset >= active for r in records[3:])  # the active segment is untouched
    assert sum(1 for r in records if r.offset < active) <= 3
    harness.roll()
    harness.stable_offset = active  # followers have not caught up beyond the old active base
    before = harness.records()
    assert harness.clean() is None or harness.records() == before


def test_min_dirty_ratio_and_compaction_lags(tmp_path: Path) -> None:
    config = LogConfig(
        segment_bytes=600, cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.9
    )
    h = Harness(tmp_path, config)
    fill(h, 40, keys=40, tombstones=0)
    h.roll()
    h.clean()
    fill(h, 3, keys=40, seed=3, tombstones=0)
    h.roll()
    # 3 dirty batches against 40 clean ones: below the ratio.
    assert h.clean() is None
    # max.compaction.lag.ms makes it due anyway once the dirty data is old enough.
    h.log.config = LogConfig(
        segment_bytes=600,
        cleanup_policy=("compact",),
        min_cleanable_dirty_ratio=0.9,
        max_compaction_lag_ms=10_000,
    )
    h.config = h.log.config
    assert h.clean(h.now + 5_000) is None
    assert h.clean(h.now + 20_000) is not None
    # min.compaction.lag.ms keeps young segments out.
    fill(h, 30, keys=5, seed=4, tombstones=0)
    h.roll()
    h.log.config = LogConfig(
        segment_bytes=600, cleanup_policy=("compact",), min_compaction_lag_ms=60_000
    )
    assert h.clean() is None
    assert h.clean(h.now + 61_000) is not None
    h.check()
    h.log.close()


def test_a_small_offset_map_cleans_in_several_rounds(tmp_path: Path) -> None:
    config = LogConfig(
        segment_bytes=2000, cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.0
    )
    h = Harness(tmp_path, config, map_bytes=SLOT_SIZE * 40)  # 36 keys per round
    fill(h, 300, keys=100, tombstones=0)
    h.roll()
    rounds = 0
    while h.clean() is not None:
        rounds += 1
        h.check()
        assert rounds < 50
    assert rounds >= 3
    records = h.check()
    assert len(records) == len({r.key for r in records}) == 100
    h.log.close()


def test_compact_delete_still_applies_retention_and_delete_only_is_never_cleaned(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, LogConfig(segment_bytes=600, cleanup_policy=("delete",)))
    fill(h, 30, keys=3)
    h.roll()
    assert h.clean() is None
    h.log.close()


def test_a_truncation_makes_the_swap_refused_and_lowers_the_checkpoint(harness: Harness) -> None:
    fill(harness, 100, keys=5)
    harness.roll()
    harness.clean()
    fill(harness, 100, keys=5, seed=7)
    harness.roll()
    job = harness.manager.grab_filthiest_log(harness.now)
    assert job is not None
    end = harness.log.log_end_offset
    assert harness.manager.checkpoint((TOPIC, 0)) is not None
    harness.log.truncate_to(end - 30)  # a follower's truncation while the cleaner works
    harness.manager.maybe_truncate_checkpoint((TOPIC, 0), end - 30)
    assert harness.manager.checkpoint((TOPIC, 0)) <= end - 30
    harness.appended = {o: v for o, v in harness.appended.items() if o < harness.log.log_end_offset}

    def swap(job, group, size):  # type: ignore[no-untyped-def]
        return harness.log.replace_segments(
            [s.segment for s in group], [s.size for s in group], size, harness.now
        )

    with pytest.raises(CleaningAbortedError):
        harness.cleaner.clean(job, harness.now, swap, lambda: None)
    harness.manager.cleaning_ended((TOPIC, 0))
    assert not list(harness.dir.glob("*.cleaned"))
    harness.check()


def test_an_aborted_cleaning_removes_its_files(harness: Harness) -> None:
    fill(harness, 100, keys=5)
    harness.roll()
    job = harness.manager.grab_filthiest_log(harness.now)
    assert job is not None
    calls = 0

    def abort_late() -> None:
        nonlocal calls
        calls += 1
        if calls > 3:
            raise CleaningAbortedError("stop")

    with pytest.raises(CleaningAbortedError):
        harness.cleaner.clean(job, harness.now, lambda *a: True, abort_late)
    assert not list(harness.dir.glob("*.cleaned"))
    harness.check()


@pytest.mark.parametrize("step", segment_swap.CRASH_POINTS[:-1])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_crash_at_any_step_of_a_swap_leaves_a_consistent_log(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, step: str, seed: int
) -> None:
    fill(harness, 150, keys=8, seed=seed, tombstones=0.2)
    harness.roll()
    harness.clean()  # tombstones get their horizon
    fill(harness, 80, keys=8, seed=seed + 10, tombstones=0.2)
    harness.roll()
    monkeypatch.setattr(segment_swap, "_crash_at", step)

    def die() -> None:
        raise SimulatedCrash(step)

    monkeypatch.setattr(segment_swap, "_die", die)
    with pytest.raises(SimulatedCrash):
        harness.clean(harness.now + 10_000)
    monkeypatch.setattr(segment_swap, "_crash_at", None)
    # The process died: drop the log without closing anything, and reopen it as after a crash.
    abandon(harness.log)
    harness.log = harness.open(clean=False)
    names = [p.name for p in harness.dir.iterdir()]
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
    harness.check()
    # The next cleaning (from the unchanged checkpoint) finishes the job.
    harness.manager = harness.new_manager()
    harness.clean(harness.now + 20_000)
    records = harness.check()
    assert len(records) == len({r.key for r in records})


def test_reconfigure_restarts_the_threads_with_the_new_settings(tmp_path: Path) -> None:
    """Dynamic log.cleaner.* configs: the threads (and their cleaner processes) are replaced by
    as many as the new config says, and nothing restarts after a shutdown."""
    import asyncio

    from odradek.log.log_cleaner import CleanerConfig, LogCleaner
    from odradek.log.log_manager import LogManager

    async def run() -> None:
        manager = LogManager([tmp_path], LogConfig())
        manager.startup()
        small = {"dedupe_buffer_size": 64 * SLOT_SIZE, "backoff_ms": 20}
        cleaner = LogCleaner(manager, CleanerConfig(threads=1, **small), lambda t, p: None)
        cleaner.start()
        first = list(cleaner._tasks)
        assert len(first) == 1
        await cleaner.reconfigure(CleanerConfig(threads=2, io_max_bytes_per_second=1000.0, **small))
        assert all(task.done() for task in first)
        assert len(cleaner._tasks) == 2 and not any(t.done() for t in cleaner._tasks)
        assert len(cleaner._processes) == 2
        assert cleaner.config.threads == 2 and cleaner.config.io_max_bytes_per_second == 1000.0
        await cleaner.shutdown()
        await cleaner.reconfigure(CleanerConfig(threads=1, **small))
        assert cleaner._tasks == [] and cleaner._processes == []
        manager.shutdown()

    asyncio.run(run())
