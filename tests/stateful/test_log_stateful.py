"""The log against a simple in-memory model, driven by hypothesis.

Rules: leader appends of random batches, rolls, truncation, clean and unclean reopens (with a torn
active segment), reads at random offsets with random limits, retention by size and log start
offset. After every step the invariants compare the log with the model: log start and end
offsets, every offset readable with its value, segments and index entries in order.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from odradek.errors import RecordBatchTooLargeError
from odradek.log import segment as segment_module
from odradek.log import segment_recovery as segment_recovery_module
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.protocol.record_batch import build_batch, decode_records, iter_batches, read_header


@dataclass
class ModelBatch:
    base_offset: int
    values: list[bytes]

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.values) - 1


def _abandon(log: Log) -> None:
    """Drop a log without flushing or sealing anything, as a crash would (closing raw fds)."""
    for segment in log.segments():
        for holder, name in (
            (segment, "_fd"),
            (segment.offset_index, "_fd"),
            (segment.time_index, "_fd"),
        ):
            fd = getattr(holder, name)
            if fd is not None:
                os.close(fd)
                setattr(holder, name, None)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="odradek-log-"))
        self.dir = self.root / "stateful.topic-0"
        self.batches: list[ModelBatch] = []
        self.log_start = 0
        self.log_end = 0
        self.floor = 0  # where the log restarts when empty (moved by truncate_fully_and_start_at)
        self.counter = 0
        self.clock = 1_000
        self.epoch = 0

    @initialize(
        segment_bytes=st.integers(150, 1_500),
        index_interval_bytes=st.sampled_from([0, 50, 200, 4096]),
        segment_index_bytes=st.sampled_from([16, 60, 10 * 1024 * 1024]),
        scan_chunk_bytes=st.sampled_from([61, 100, segment_module.SCAN_CHUNK_BYTES]),
        recovery_chunk_bytes=st.sampled_from(
            [61, 150, segment_recovery_module.RECOVERY_CHUNK_BYTES]
        ),
    )
    def open_log(
        self,
        segment_bytes: int,
        index_interval_bytes: int,
        segment_index_bytes: int,
        scan_chunk_bytes: int,
        recovery_chunk_bytes: int,
    ) -> None:
        # Crashes here are simulated by abandoning the log object, which keeps the page cache, so
        # fsync has nothing to prove and only costs time (seconds on a busy disk, with a roll every
        # few appends): make it a no-op while the machine runs.
        self.saved_fsync = os.fsync
        os.fsync = lambda fd: None
        # Small read chunks make batches straddle chunk boundaries in header scans and recovery.
        self.saved_chunks = (
            segment_module.SCAN_CHUNK_BYTES,
            segment_recovery_module.RECOVERY_CHUNK_BYTES,
        )
        segment_module.SCAN_CHUNK_BYTES = scan_chunk_bytes
        segment_recovery_module.RECOVERY_CHUNK_BYTES = recovery_chunk_bytes
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
            segment_index_bytes=segment_index_bytes,
        )
        self.log = self._open(clean=True, recovery_point=0)

    def _open(self, *, clean: bool, recovery_point: int) -> Log:
        return Log.open(
            self.dir,
            self.config,
            recovery_point=recovery_point,
            log_start_offset=self.log_start,
            clean_shutdown=clean,
            now_ms=self.clock,
        )

    def teardown(self) -> None:
        if hasattr(self, "log"):
            self.log.close()
        if hasattr(self, "saved_fsync"):
            os.fsync = self.saved_fsync
        if hasattr(self, "saved_chunks"):
            (
                segment_module.SCAN_CHUNK_BYTES,
                segment_recovery_module.RECOVERY_CHUNK_BYTES,
            ) = self.saved_chunks
        shutil.rmtree(self.root, ignore_errors=True)

    # -- model helpers ---------------------------------------------------------------------------

    def _value(self, offset: int) -> bytes:
        for batch in self.batches:
            if batch.base_offset <= offset <= batch.last_offset:
                return batch.values[offset - batch.base_offset]
        raise KeyError(offset)

    def _truncate_model(self, offset: int) -> None:
        """Batch-boundary truncation: drop the batch holding `offset` and everything after."""
        self.batches = [b for b in self.batches if b.last_offset < offset]
        self.log_end = self.batches[-1].last_offset + 1 if self.batches else self.floor
        self.log_start = min(self.log_start, self.log_end)

    # -- rules -----------------------------------------------------------------------------------

    @rule(
        sizes=st.lists(st.integers(1, 6), min_size=1, max_size=3),
        value_size=st.integers(0, 40),
        new_epoch=st.booleans(),
    )
    def append(self, sizes: list[int], value_size: int, new_epoch: bool) -> None:
        self._append(sizes, value_size, new_epoch)

    @rule(
        appends=st.lists(
            st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=2, max_size=6
        ),
        value_size=st.integers(0, 20),
    )
    def append_burst(self, appends: list[list[int]], value_size: int) -> None:
        """Several appends in one step, so that logs grow to many segments."""
        for sizes in appends:
            self._append(sizes, value_size, new_epoch=False)

    def _append(self, sizes: list[int], value_size: int, new_epoch: bool) -> None:
        if new_epoch:
            self.epoch += 1
        self.clock += 7
        payloads: list[list[bytes]] = []
        for size in sizes:
            values = []
            for _ in range(size):
                self.counter += 1
                values.append(f"{self.counter}:".encode().ljust(value_size, b"*"))
            payloads.append(values)
        for values in payloads:  # one batch per append: a produce request carries one
            data = build_batch([(None, v, [], self.clock + i) for i, v in enumerate(values)])
            if len(data) > self.config.segment_bytes:
                try:
                    self.log.append_as_leader(data, self.epoch, self.clock)
                except RecordBatchTooLargeError:
                    continue
                raise AssertionError("an append larger than segment.bytes was accepted")
            info = self.log.append_as_leader(data, self.epoch, self.clock)
            assert info.first_offset == self.log_end
            self.batches.append(ModelBatch(self.log_end, values))
            self.log_end += len(values)
            assert info.last_offset == self.log_end - 1

    @rule()
    def roll(self) -> None:
        self.log.roll(now_ms=self.clock)

    @precondition(lambda self: self.log_end > self.log_start)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log_start, self.log_end))
        self.log.truncate_to(offset, now_ms=self.clock)
        self._truncate_model(offset)

    @rule(clean=st.booleans(), tear=st.booleans(), data=st.data())
    def reopen(self, clean: bool, tear: bool, data: st.DataObject) -> None:
        if clean:
            self.log.flush()
            recovery_point = self.log.recovery_point
            self.log.close()
            self.log = self._open(clean=True, recovery_point=recovery_point)
            return
        recovery_point = self.log.recovery_point
        active = self.log.active_segment
        _abandon(self.log)
        if tear and active.size > 0:
            cut = data.draw(st.integers(0, active.size - 1))
            content = active.log_path.read_bytes()[:cut]
            surviving = list(iter_batches(content))
            garbage = data.draw(st.binary(max_size=80))
            with open(active.log_path, "r+b") as file:
                file.truncate(cut)
                file.seek(cut)
                file.write(garbage)
            lost_from = surviving[-1].last_offset + 1 if surviving else active.base_offset
            start_before_crash = self.log_start
            self.log = self._open(clean=False, recovery_point=min(recovery_point, lost_from))
            if lost_from < self.log_end:
                self._truncate_model(lost_from)
                self.log_start = start_before_crash
            if self.log_start > self.log_end:
                # The checkpointed log start is beyond what survived: the log restarts there.
                self.batches = []
                self.floor = self.log_end = self.log_start
        else:
            self.log = self._open(clean=False, recovery_point=recovery_point)

    @precondition(lambda self: self.log_end > self.log_start)
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log_start, self.log_end))
        max_bytes = data.draw(st.integers(0, 2_000))
        max_offset = data.draw(st.none() | st.integers(self.log_start, self.log_end))
        self._check_read(offset, max_bytes, max_offset, data.draw(st.booleans()))

    @precondition(lambda self: self.log_end - self.log_start > 1)
    @rule(data=st.data())
    def read_below_high_watermark(self, data: st.DataObject) -> None:
        """A consumer's read: a high watermark strictly inside the log."""
        high_watermark = data.draw(st.integers(self.log_start + 1, self.log_end - 1))
        offset = data.draw(st.integers(self.log_start, high_watermark))
        self._check_read(offset, 10_000, high_watermark, True)

    def _check_read(
        self, offset: int, max_bytes: int, max_offset: int | None, min_one: bool
    ) -> None:
        result = self.log.read(offset, max_bytes, max_offset, min_one)
        limit = self.log_end if max_offset is None else max_offset
        if offset >= limit:
            assert result == b""
            return
        headers = list(iter_batches(result))
        assert sum(h.size for h in headers) == len(result), "reads return whole batches"
        if not headers:
            assert not min_one, "min_one_batch returns at least one batch"
            return
        assert headers[0].base_offset <= max(offset, self.log_start) <= headers[0].last_offset
        assert all(h.base_offset < limit for h in headers)
        assert len(result) <= max_bytes or len(headers) == 1
        for previous, current in itertools.pairwise(headers):
            assert current.base_offset == previous.last_offset + 1
        for header in headers:
            for record in decode_records(result[header.position :]):
                assert record.value == self._value(record.offset)

    @rule(retention_bytes=st.integers(0, 3_000))
    def retention_by_size(self, retention_bytes: int) -> None:
        # Segments below the log start offset go first (a rule of their own), so that what
        # follows deletes by size alone.
        self.log.delete_retention_segments(self.clock)
        self.log.config = LogConfig(
            segment_bytes=self.config.segment_bytes,
            index_interval_bytes=self.config.index_interval_bytes,
            segment_index_bytes=self.config.segment_index_bytes,
            retention_bytes=retention_bytes,
        )
        before = self.log.segment_count
        deleted = self.log.delete_retention_segments(self.clock)
        assert self.log.segment_count == before - deleted
        segments = self.log.segments()
        if deleted:
            assert self.log.size_in_bytes >= retention_bytes
            assert self.log.log_start_offset == segments[0].base_offset >= self.log_start
        assert len(segments) == 1 or self.log.size_in_bytes - retention_bytes < segments[0].size, (
            "retention stopped early"
        )
        self.log_start = self.log.log_start_offset
        self.log.config = self.config

    @precondition(lambda self: self.log_end > self.log_start)
    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log_start, self.log_end))
        self.log.maybe_increment_log_start_offset(offset)
        self.log_start = offset
        self.log.delete_retention_segments(self.clock)
        assert self.log.log_start_offset == offset

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def offsets_match(self) -> None:
        if not hasattr(self, "log"):
            return
        assert self.log.log_end_offset == self.log_end
        assert self.log.log_start_offset == self.log_start
        assert self.log.recovery_point <= self.log.log_end_offset

    @invariant()
    def every_offset_readable(self) -> None:
        if not hasattr(self, "log"):
            return
        for offset in range(self.log_start, self.log_end):
            single = self.log.read(offset, 1)
            header = read_header(single)
            assert header.size == len(single)
            assert header.base_offset <= offset <= header.last_offset
            record = decode_records(single)[offset - header.base_offset]
            assert (record.offset, record.value) == (offset, self._value(offset))

    @invariant()
    def segments_and_indexes_in_order(self) -> None:
        if not hasattr(self, "log"):
            return
        segments = self.log.segments()
        bases = [s.base_offset for s in segments]
        assert bases == sorted(set(bases))
        assert bases[0] <= self.log_start and bases[-1] <= self.log_end
        assert sum(s.size for s in segments) == self.log.size_in_bytes
        for i, segment in enumerate(segments):
            end = bases[i + 1] if i + 1 < len(bases) else self.log_end
            entries = segment.offset_index.entries()
            assert [o for o, _ in entries] == sorted({o for o, _ in entries})
            assert [p for _, p in entries] == sorted({p for _, p in entries})
            assert all(segment.base_offset <= o < end and p < segment.size for o, p in entries)
            time_entries = segment.time_index.entries()
            assert [t for t, _ in time_entries] == sorted({t for t, _ in time_entries})
            assert [o for _, o in time_entries] == sorted(o for _, o in time_entries)

    @invariant()
    def leader_epochs_in_range(self) -> None:
        if not hasattr(self, "log"):
            return
        entries = self.log.leader_epoch_cache.epoch_entries()
        assert [e.epoch for e in entries] == sorted({e.epoch for e in entries})
        # An epoch starts below the LEO, except that moving the log start up to the LEO (retention,
        # DeleteRecords) moves the first entry's start there too.
        assert all(self.log_start <= e.start_offset <= self.log_end for e in entries)
        assert all(e.start_offset < self.log_end for e in entries[1:])


LogMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ODRADEK_LOG_EXAMPLES", "150")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLogStateful = LogMachine.TestCase
