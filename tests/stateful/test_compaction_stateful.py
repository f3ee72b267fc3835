"""A compacted log against a model of "the latest value of each key", driven by hypothesis.

Rules: appends of random batches (keys from a small set so that they repeat, tombstones, every
codec), rolls, time passing, cleanings (with an offset map small enough to fill up at times),
cleanings that crash at a random step of a segment swap, clean and unclean restarts, and a
follower-style truncation. After every step the invariants of `tests.unit.compacted_log` hold:
offsets increase, every record read is the one appended at its offset, each key's latest value is
there, a removed tombstone took every record of its key with it, indexes match the data. Once
everything is rolled and cleaned with min.cleanable.dirty.ratio 0, the log holds exactly one record
per key: its latest value, or its tombstone while the tombstone's horizon has not passed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from odradek.log import segment_swap
from odradek.log.cleaner import Cleaner, Throttler
from odradek.log.config import LogConfig
from odradek.protocol.compaction import SLOT_SIZE, OffsetMap
from odradek.protocol.record_batch import CompressionType
from tests.unit.compacted_log import Harness, SimulatedCrash, abandon

KEYS = [b"k%d" % i for i in range(12)]


class CompactionMachine(RuleBasedStateMachine):
    @initialize(
        segment_bytes=st.integers(300, 3_000),
        index_interval_bytes=st.sampled_from([0, 100, 4096]),
        map_slots=st.sampled_from([8, 20, 1_000]),
        retention_ms=st.sampled_from([0, 50, 10_000]),
    )
    def open_log(
        self, segment_bytes: int, index_interval_bytes: int, map_slots: int, retention_ms: int
    ) -> None:
        self.saved_fsync = os.fsync
        os.fsync = lambda fd: None  # crashes are simulated: the page cache survives them
        self.root = Path(tempfile.mkdtemp(prefix="odradek-compaction-"))
        config = LogConfig(
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
            cleanup_policy=("compact",),
            delete_retention_ms=retention_ms,
            min_cleanable_dirty_ratio=0.0,
        )
        self.h = Harness(self.root, config, map_bytes=SLOT_SIZE * map_slots)

    def teardown(self) -> None:
        if hasattr(self, "h") and not self.h.log.is_closed:
            self.h.log.close()
        if hasattr(self, "saved_fsync"):
            os.fsync = self.saved_fsync
        segment_swap._crash_at = None
        if hasattr(self, "root"):
            shutil.rmtree(self.root, ignore_errors=True)

    @rule(
        records=st.lists(
            st.tuples(st.sampled_from(KEYS), st.none() | st.binary(min_size=1, max_size=20)),
            min_size=1,
            max_size=6,
        ),
        codec=st.sampled_from(list(CompressionType)),
    )
    def append(self, records: list[tuple[bytes, bytes | None]], codec: CompressionType) -> None:
        self.h.append(records, codec)

    @rule()
    def roll(self) -> None:
        self.h.roll()

    @rule(ms=st.integers(1, 20_000))
    def time_passes(self, ms: int) -> None:
        self.h.now += ms

    @rule()
    def clean(self) -> None:
        self.h.clean()

    @rule(step=st.sampled_from(segment_swap.CRASH_POINTS[:-1]))
    def crash_while_cleaning(self, step: str) -> None:
        segment_swap._crash_at = step
        saved = segment_swap._die

        def die() -> None:
            raise SimulatedCrash(step)

        segment_swap._die = die
        try:
            self.h.clean()
        except SimulatedCrash:
            abandon(self.h.log)
            self.h.log = self.h.open(clean=False)
            self.h.manager = self.h.new_manager()
        finally:
            segment_swap._crash_at = None
            segment_swap._die = saved

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        if clean:
            self.h.log.close()
        else:
            abandon(self.h.log)
        self.h.log = self.h.open(clean=clean)
        self.h.manager = self.h.new_manager()
        self.h.cleaner = Cleaner(
            OffsetMap(self.h.cleaner.offset_map.slots * SLOT_SIZE), 1024, Throttler(float("inf"))
        )

    @precondition(lambda self: self.h.log.log_end_offset > 0)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        """A follower's truncation (to above the cleaned part: the cleaner never cleans above the
        high watermark, and a follower does not truncate below it)."""
        checkpoint = self.h.manager.checkpoint(("compacted", 0)) or 0
        low = max(checkpoint, self.h.log.active_segment.base_offset)
        if low >= self.h.log.log_end_offset:
            return
        offset = data.draw(st.integers(low, self.h.log.log_end_offset - 1))
        self.h.log.truncate_to(offset)
        end = self.h.log.log_end_offset
        self.h.appended = {o: v for o, v in self.h.appended.items() if o < end}

    @rule()
    def clean_everything(self) -> None:
        self.h.roll()
        for _ in range(200):
            if self.h.clean() is None:
                break
        records = self.h.check()
        latest = self.h.latest()
        assert len(records) == len({r.key for r in records})
        for record in records:
            assert latest[record.key][0] == record.offset
        for _key, (offset, value) in latest.items():
            if value is not None:
                assert any(r.offset == offset for r in records)

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "h"):
            self.h.check()


TestCompaction = CompactionMachine.TestCase
TestCompaction.settings = settings(
    max_examples=int(os.environ.get("ODRADEK_COMPACTION_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
