"""The log cleaner on real log directories, without a broker: the manager's choices, a cleaning's
result, tombstones, a small offset map, and a crash at every step of a segment swap.

A cleaning is driven synchronously here (`Harness.clean`): the swap the cleaner thread would hand
to the event loop runs inline. What the tests check after each cleaning and each reopen:

* offsets strictly increase and every record is the one appended at its offset (nothing moved,
  nothing changed: key, value, headers, timestamp);
* each key's latest record is there (a tombstone may be gone once its horizon passed, and then so
  is every record of its key);
* after a complete cleaning of a fully cleanable log, exactly one record per key;
* the indexes are those a rebuild from the data gives.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from odradek.log import segment_swap
from odradek.log.cleaner import Cleaner, CleanerStats, CleaningAbortedError, Throttler
from odradek.log.cleaner_manager import LogCleanerManager
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.naming import CLEANER_OFFSET_CHECKPOINT
from odradek.log.segment import LogSegment
from odradek.protocol.compaction import SLOT_SIZE, OffsetMap
from odradek.protocol.record_batch import (
    CompressionType,
    Record,
    build_batch,
    decode_records,
    iter_batches,
)

TOPIC = "compacted"

Appended = dict[int, tuple[bytes | None, bytes | None, int]]


class SimulatedCrash(Exception):
    pass


class Harness:
    """A compacted log, what was appended to it, and a synchronous cleaner."""

    def __init__(self, root: Path, config: LogConfig, map_bytes: int = 1 << 20) -> None:
        self.root = root
        self.dir = root / f"{TOPIC}-0"
        self.config = config
        self.appended: Appended = {}
        self.now = 1_000_000
        self.stable_offset: int | None = None
        self.log = self.open(clean=True)
        self.manager = self.new_manager()
        self.cleaner = Cleaner(OffsetMap(map_bytes), 2048, Throttler(float("inf")))

    def new_manager(self) -> LogCleanerManager:
        manager = LogCleanerManager(
            lambda: {(TOPIC, 0): self.log},
            lambda tp: self.root,
            lambda t, p: (
                self.log.log_end_offset if self.stable_offset is None else self.stable_offset
            ),
        )
        manager.load_checkpoints([self.root])
        return manager

    def open(self, *, clean: bool) -> Log:
        return Log.open(
            self.dir,
            self.config,
            recovery_point=0,
            log_start_offset=0,
            clean_shutdown=clean,
            now_ms=self.now,
        )

    def append(
        self,
        records: list[tuple[bytes | None, bytes | None]],
        codec: CompressionType = CompressionType.NONE,
    ) -> None:
        self.now += 1
        batch = build_batch([(k, v, [("h", k)], self.now) for k, v in records], 0, codec)
        info = self.log.append_as_leader(batch, 0, self.now)
        for i, (key, value) in enumerate(records):
            self.appended[info.first_offset + i] = (key, value, self.now)

    def clean(self, now: int | None = None) -> CleanerStats | None:
        now = self.now if now is None else now
        job = self.manager.grab_filthiest_log(now)
        if job is None:
            return None

        def swap(job, group, size):  # type: ignore[no-untyped-def]
            old = [s.segment for s in group]
            done = self.log.replace_segments(old, [s.size for s in group], size, now)
            if done:
                for segment in old:
                    segment.delete()
            return done

        try:
            stats = self.cleaner.clean(job, now, swap, lambda: None)
        except BaseException:
            self.manager.cleaning_ended(job.topic_partition)
            raise
        self.manager.done_cleaning(
            job.topic_partition,
            stats.end_offset,
            stats.tombstones_kept,
            job.config.delete_retention_ms,
            now,
        )
        return stats

    def records(self) -> list[Record]:
        found: list[Record] = []
        offset = self.log.log_start_offset
        while offset < self.log.log_end_offset:
            data = self.log.read(offset, 1 << 20)
            if not data:
                break
            for header in iter_batches(data):
                found += decode_records(data[header.position : header.position + header.size])
                offset = header.next_offset
        return found

    def latest(self) -> dict[bytes, tuple[int, bytes | None]]:
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        for offset, (key, value, _) in sorted(self.appended.items()):
            if key is not None:
                latest[key] = (offset, value)
        return latest

    def check(self) -> list[Record]:
        """The invariants of the module docstring; returns the records read."""
        records = self.records()
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets)), "offsets must strictly increase"
        for record in records:
            key, value, timestamp = self.appended[record.offset]
            assert (record.key, record.value, record.timestamp) == (key, value, timestamp)
            assert record.headers == [("h", key)]
        present = {r.offset for r in records}
        for key, (offset, value) in self.latest().items():
            if value is not None:
                assert offset in present, f"the latest value of {key!r} (offset {offset}) is lost"
            elif offset not in present:
                assert not any(r.key == key for r in records), f"{key!r} came back"
        for segment in self.log.segments()[:-1]:
            check_indexes(segment)
        return records

    def roll(self) -> None:
        self.log.roll(self.now)


def check_indexes(segment: LogSegment) -> None:
    """A segment's index files are exactly what rebuilding them from its data gives."""
    offsets = segment.offset_index.entries()
    times = segment.time_index.entries()
    copy = LogSegment(
        segment.log_path.parent,
        segment.base_offset,
        max_index_bytes=segment.offset_index.max_entries * 8,
        index_interval_bytes=segment.index_interval_bytes,
        size=segment.size,
        created_ms=0,
        suffix=".check",
    )
    os.link(segment.log_path, copy.log_path)
    try:
        copy.rebuild_indexes()
        copy.on_become_inactive()
        assert offsets == copy.offset_index.entries()
        assert times == copy.time_index.entries()
    finally:
        copy.delete()


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


def fill(h: Harness, count: int, keys: int, seed: int = 1, tombstones: float = 0.1) -> None:
    rng = random.Random(seed)
    codecs = [
        CompressionType.NONE,
        CompressionType.NONE,
        CompressionType.ZSTD,
        CompressionType.GZIP,
    ]
    for i in range(count):
        batch = [
            (
                f"key-{rng.randrange(keys)}".encode(),
                None if rng.random() < tombstones else f"value-{i}-{j}".encode(),
            )
            for j in range(rng.randrange(1, 4))
        ]
        h.append(batch, rng.choice(codecs))


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


def abandon(log: Log) -> None:
    for segment in log.segments():
        segment.release()
