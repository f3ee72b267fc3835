"""A compacted log on disk with what was appended to it and a synchronous cleaner, and the
invariants a compacted log must keep (used by the unit and the stateful tests of the cleaner).

A cleaning is driven synchronously (`Harness.clean`): the swap the cleaner thread would hand to the
event loop runs inline. `Harness.check` asserts:

* offsets strictly increase and every record is the one appended at its offset (nothing moved,
  nothing changed: key, value, headers, timestamp);
* each key's latest record is there (a tombstone may be gone once its horizon passed, and then so
  is every record of its key);
* the indexes of the sealed segments are those a rebuild from the data gives.
"""

from __future__ import annotations

import random
from pathlib import Path

from odradek.log.cleaner import Cleaner, CleanerStats, Throttler
from odradek.log.cleaner_manager import LogCleanerManager
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.segment import LogSegment
from odradek.protocol.compaction import OffsetMap
from odradek.protocol.record_batch import (
    CompressionType,
    Record,
    build_batch,
    decode_records,
    iter_batches,
)

TOPIC = "compacted"


class SimulatedCrash(Exception):
    """Raised where a test makes the process "die" (segment_swap._die)."""


Appended = dict[int, tuple[bytes | None, bytes | None, int]]


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
    """A sealed segment's indexes are valid for its data: every offset index entry points at a
    batch that ends at its offset; time index entries grow, each is the largest timestamp up to
    its offset, and the last is the segment's largest timestamp. (Entries need not be those a
    rebuild would make: a segment that was active across a restart keeps the final time entry
    written when it was closed.)"""
    headers = list(segment.scan_headers())
    by_position = {h.position: h for h in headers}
    for offset, position in segment.offset_index.entries():
        assert position in by_position, f"{segment}: index entry ({offset}, {position}) is no batch"
        assert by_position[position].last_offset == offset
    running: list[tuple[int, int]] = []  # (last offset, largest timestamp so far)
    largest = -1
    for header in headers:
        largest = max(largest, header.max_timestamp)
        running.append((header.last_offset, largest))
    entries = segment.time_index.entries()
    assert [t for t, _ in entries] == sorted({t for t, _ in entries})
    for timestamp, offset in entries:
        assert any(last <= offset and top == timestamp for last, top in running) or any(
            last == offset and top >= timestamp for last, top in running
        ), f"{segment}: time index entry ({timestamp}, {offset}) does not fit the data"
    if largest >= 0:
        assert entries and entries[-1][0] == largest


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


def abandon(log: Log) -> None:
    for segment in log.segments():
        segment.release()
