"""A compacted log on disk with what was appended to it and a synchronous cleaner, and the
invariants a compacted log must keep (used by the unit and the stateful tests of the cleaner).

A cleaning is driven synchronously (`Harness.clean`): the swap the cleaner thread would hand to the
event loop runs inline. `Harness.check` asserts:

* offsets strictly increase and every record is the one appended at its offset (nothing moved,
  nothing changed: key, value, headers, timestamp);
* each key's latest record is there (a tombstone may be gone once its horizon passed, and then so
  is every record of its key);
* the indexes of the sealed segments are those a rebuild from the data gives;
* with producers (`append(..., producer=...)`, `end_txn`): the read_committed view below the
  LSO (what a read_committed consumer gets, with the log's aborted transactions) holds no record
  of an aborted or open transaction, and each key's latest committed value is in it.

Transactional records count for "latest" only once committed; aborted ones never do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from odradek.coordinator.transaction.log_records import build_marker_batch
from odradek.log.cleaner import Cleaner, CleanerStats, Throttler
from odradek.log.cleaner_manager import LogCleanerManager
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.producer_entry import AppendOrigin
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


@dataclass
class Producer:
    """An idempotent (or, with `transactional`, transactional) producer of the model."""

    producer_id: int
    transactional: bool = False
    epoch: int = 0
    sequence: int = 0
    open_offsets: list[int] = field(default_factory=list)
    """Offsets of its open transaction's records."""
    last_batch: bytes | None = None
    """Its last data batch as sent (a retry sends the same bytes)."""
    last_offsets: tuple[int, int] = (-1, -1)


class Harness:
    """A compacted log, what was appended to it, and a synchronous cleaner."""

    def __init__(self, root: Path, config: LogConfig, map_bytes: int = 1 << 20) -> None:
        self.root = root
        self.dir = root / f"{TOPIC}-0"
        self.config = config
        self.appended: Appended = {}
        self.now = 1_000_000
        self.stable_offset: int | None = None
        self.aborted: set[int] = set()
        """Offsets of records of aborted transactions."""
        self.undecided: set[int] = set()
        """Offsets of records of transactions not yet decided."""
        self.producer_offsets: set[int] = set()
        """Offsets of batches of producer ids (markers included): truncations leave them be."""
        self.log = self.open(clean=True)
        self.manager = self.new_manager()
        self.cleaner = Cleaner(OffsetMap(map_bytes), 2048, Throttler(float("inf")))

    def new_manager(self) -> LogCleanerManager:
        manager = LogCleanerManager(
            lambda: {(TOPIC, 0): self.log},
            lambda tp: self.root,
            lambda t, p: (
                self.log.last_stable_offset(self.log.log_end_offset)
                if self.stable_offset is None
                else self.stable_offset
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
        producer: Producer | None = None,
    ) -> None:
        self.now += 1
        entries = [(k, v, [("h", k)], self.now) for k, v in records]
        if producer is None:
            batch = build_batch(entries, 0, codec)
        else:
            batch = build_batch(
                entries,
                0,
                codec,
                producer_id=producer.producer_id,
                producer_epoch=producer.epoch,
                base_sequence=producer.sequence,
                is_transactional=producer.transactional,
            )
            producer.sequence += len(records)
            producer.last_batch = batch
        info = self.log.append_as_leader(batch, 0, self.now)
        for i, (key, value) in enumerate(records):
            self.appended[info.first_offset + i] = (key, value, self.now)
        if producer is not None:
            producer.last_offsets = (info.first_offset, info.last_offset)
            self.producer_offsets.update(range(info.first_offset, info.last_offset + 1))
            if producer.transactional:
                offsets = range(info.first_offset, info.last_offset + 1)
                producer.open_offsets += offsets
                self.undecided.update(offsets)

    def end_txn(self, producer: Producer, commit: bool) -> None:
        """The coordinator's marker for the producer's transaction."""
        self.now += 1
        marker = build_marker_batch(producer.producer_id, producer.epoch, commit, 0, self.now)
        info = self.log.append_as_leader(marker, 0, self.now, origin=AppendOrigin.COORDINATOR)
        self.producer_offsets.add(info.first_offset)
        self.undecided.difference_update(producer.open_offsets)
        if not commit:
            self.aborted.update(producer.open_offsets)
        producer.open_offsets = []

    def retry_last_batch(self, producer: Producer) -> None:
        """The producer's retry of its last batch is answered with its offsets, not appended."""
        assert producer.last_batch is not None
        info = self.log.append_as_leader(producer.last_batch, 0, self.now)
        assert info.batch_count == 0, f"a retry was appended again at {info.first_offset}"
        assert (info.first_offset, info.last_offset) == producer.last_offsets

    def read_committed(self) -> list[Record]:
        """What a read_committed consumer reads from the log start up to the LSO (Kafka's
        consumer: a transactional batch of a producer inside one of the aborted transactions the
        fetch returns is skipped)."""
        lso = self.log.last_stable_offset(self.log.log_end_offset)
        aborted = sorted(
            self.log.collect_aborted_transactions(self.log.log_start_offset, lso),
            key=lambda t: t.first_offset,
        )
        found: list[Record] = []
        offset = self.log.log_start_offset
        while offset < lso:
            data = self.log.read(offset, 1 << 20)
            if not data:
                break
            for header in iter_batches(data):
                offset = header.next_offset
                if header.base_offset >= lso:
                    break
                if header.is_control:
                    continue
                if header.is_transactional and any(
                    t.producer_id == header.producer_id
                    and t.first_offset <= header.base_offset <= t.last_offset
                    for t in aborted
                ):
                    continue
                found += decode_records(data[header.position : header.position + header.size])
        return found

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
                if not header.is_control:
                    found += decode_records(data[header.position : header.position + header.size])
                offset = header.next_offset
        return found

    def latest(self, below: int | None = None) -> dict[bytes, tuple[int, bytes | None]]:
        """Each key's latest committed record (below offset `below`)."""
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        for offset, (key, value, _) in sorted(self.appended.items()):
            if below is not None and offset >= below:
                break
            if key is not None and offset not in self.aborted and offset not in self.undecided:
                latest[key] = (offset, value)
        return latest

    def visible(self, records: list[Record]) -> list[Record]:
        return [
            r for r in records if r.offset not in self.aborted and r.offset not in self.undecided
        ]

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
                assert not any(r.key == key for r in self.visible(records)), f"{key!r} came back"
        for segment in self.log.segments()[:-1]:
            check_indexes(segment)
        if self.producer_offsets:
            self.check_read_committed()
        return records

    def check_read_committed(self) -> None:
        """No aborted or undecided record is visible to read_committed; each key's latest
        committed value below the LSO is what it reads last for that key."""
        lso = self.log.last_stable_offset(self.log.log_end_offset)
        view = self.read_committed()
        leaked = [r.offset for r in view if r.offset in self.aborted or r.offset in self.undecided]
        assert not leaked, f"records of aborted or open transactions are visible: {leaked}"
        seen: dict[bytes | None, tuple[int, bytes | None]] = {}
        for record in view:
            seen[record.key] = (record.offset, record.value)
        for key, (offset, value) in self.latest(below=lso).items():
            if value is not None:
                assert seen.get(key) == (offset, value), f"read_committed lost {key!r} @ {offset}"
            else:
                assert seen.get(key, (offset, None)) == (offset, None), f"{key!r} came back"

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
