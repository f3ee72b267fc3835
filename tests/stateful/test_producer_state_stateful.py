"""The leader's producer state rules (log/producer_state.py) against an independent model of
Kafka 3.9's, driven by hypothesis through a real `Log`.

Rules: idempotent appends by three producers with chosen epochs and sequences (in sequence,
duplicates of recent batches, gaps, epoch bumps, fenced epochs), truncation, clean and unclean
reopens. The model predicts each append's outcome (appended, duplicate with the original offsets,
OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH) from the history of appended batches, and,
after a reload, what Kafka's snapshots keep: the last batch of each producer below the snapshot
used, plus every batch replayed after it. After every step each producer's epoch and recent
batches must match the model, and a follower fed the leader's log must hold the same state.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from odradek.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.producer_snapshot import list_snapshots
from odradek.protocol.record_batch import build_batch
from tests.stateful.test_log_stateful import _abandon

CONFIG = LogConfig(segment_bytes=700, index_interval_bytes=64)
PRODUCERS = (1, 2, 3)
NOW_MS = int(time.time() * 1000)
"""Batch timestamps and the clock: truncation reloads with the wall clock, and producers whose
last write is older than producer.id.expiration.ms (a day) are rightly not reloaded."""


@dataclass(frozen=True)
class Appended:
    producer_id: int
    epoch: int
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass
class ModelProducer:
    epoch: int
    recent: deque[Appended]


def _model_state(history: list[Appended], snapshot_offset: int) -> dict[int, ModelProducer]:
    """What Kafka's state holds after loading the snapshot at `snapshot_offset` (only each
    producer's last batch below it) and replaying every batch from there."""
    state: dict[int, ModelProducer] = {}
    for batch in history:
        if batch.last_offset < snapshot_offset:
            state[batch.producer_id] = ModelProducer(batch.epoch, deque([batch], maxlen=5))
    for batch in history:
        if batch.first_offset < snapshot_offset:
            continue
        producer = state.get(batch.producer_id)
        if producer is None or producer.epoch != batch.epoch:
            state[batch.producer_id] = ModelProducer(batch.epoch, deque([batch], maxlen=5))
        else:
            producer.recent.append(batch)
    return state


class ProducerStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="odradek-producers-"))
        # Durability is not under test here: fsync (segments, snapshots) is a no-op, for speed.
        self.saved_fsync = os.fsync
        os.fsync = lambda fd: None
        self.log = self._open("leader", clean=True)
        self.history: list[Appended] = []
        self.model: dict[int, ModelProducer] = {}
        self.rejections = 0

    def _open(self, name: str, clean: bool, recovery_point: int = 0) -> Log:
        return Log.open(
            self.root / name / "p-0",
            CONFIG,
            recovery_point=recovery_point,
            log_start_offset=0,
            clean_shutdown=clean,
            now_ms=NOW_MS,
        )

    def teardown(self) -> None:
        self.log.close()
        os.fsync = self.saved_fsync
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(
        producer_id=st.sampled_from(PRODUCERS),
        epoch_change=st.sampled_from([0, 0, 0, 1, -1]),
        kind=st.sampled_from(["next", "next", "next", "duplicate", "gap", "zero"]),
        count=st.integers(1, 3),
        data=st.data(),
    )
    def append(
        self, producer_id: int, epoch_change: int, kind: str, count: int, data: st.DataObject
    ) -> None:
        producer = self.model.get(producer_id)
        epoch = max(0, (producer.epoch if producer else 0) + epoch_change)
        if kind == "duplicate" and producer and producer.recent:
            original = data.draw(st.sampled_from(list(producer.recent)))
            first_seq, count = original.first_seq, original.last_seq - original.first_seq + 1
        elif kind == "next" and producer and producer.recent:
            first_seq = producer.recent[-1].last_seq + 1 if epoch == producer.epoch else 0
        elif kind == "gap":
            first_seq = data.draw(st.integers(0, 40))
        else:
            first_seq = 0
        last_seq = first_seq + count - 1
        expected: object
        if producer is None:
            expected = "appended"
        elif epoch == producer.epoch and any(
            (b.first_seq, b.last_seq) == (first_seq, last_seq) for b in producer.recent
        ):
            expected = next(
                b for b in producer.recent if (b.first_seq, b.last_seq) == (first_seq, last_seq)
            )
        elif epoch < producer.epoch:
            expected = InvalidProducerEpochError
        elif epoch > producer.epoch:
            expected = "appended" if first_seq == 0 else OutOfOrderSequenceError
        else:
            in_sequence = first_seq == producer.recent[-1].last_seq + 1
            expected = "appended" if in_sequence else OutOfOrderSequenceError
        batch = build_batch(
            [(None, b"v", [], NOW_MS) for _ in range(count)],
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=first_seq,
        )
        end = self.log.log_end_offset
        if isinstance(expected, type):
            try:
                self.log.append_as_leader(batch, 0, 10_000)
            except (InvalidProducerEpochError, OutOfOrderSequenceError) as e:
                assert isinstance(e, expected), (e, expected)
                assert self.log.log_end_offset == end
                self.rejections += 1
                return
            raise AssertionError(f"expected {expected.__name__}")
        info = self.log.append_as_leader(batch, 0, 10_000)
        if isinstance(expected, Appended):
            assert (info.first_offset, info.last_offset, info.batch_count) == (
                expected.first_offset,
                expected.last_offset,
                0,
            )
            assert self.log.log_end_offset == end
            return
        assert info.first_offset == end and info.batch_count == 1
        appended = Appended(producer_id, epoch, first_seq, last_seq, end, end + count - 1)
        self.history.append(appended)
        if producer is None or producer.epoch != epoch:
            self.model[producer_id] = ModelProducer(epoch, deque([appended], maxlen=5))
        else:
            producer.recent.append(appended)

    def _snapshot_below(self, offset: int) -> int:
        return max((o for o in list_snapshots(self.log.dir) if 0 < o <= offset), default=0)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        if not self.history:
            return
        offset = data.draw(st.integers(0, self.log.log_end_offset - 1))
        batch = next(b for b in self.history if b.first_offset <= offset <= b.last_offset)
        new_end = batch.first_offset
        snapshot = self._snapshot_below(new_end)
        self.log.truncate_to(offset)
        assert self.log.log_end_offset == new_end
        self.history = [b for b in self.history if b.last_offset < new_end]
        self.model = _model_state(self.history, snapshot)

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        end = self.log.log_end_offset
        if clean:
            self.log.close()
            self.log = self._open("leader", clean=True)
            snapshot = end
        else:
            self.log.flush()
            snapshot = self._snapshot_below(end)
            recovery_point = self.log.recovery_point
            _abandon(self.log)
            self.log = self._open("leader", clean=False, recovery_point=recovery_point)
        assert self.log.log_end_offset == end
        self.model = _model_state(self.history, snapshot)

    @invariant()
    def state_matches_the_model(self) -> None:
        state = self.log.producer_state
        assert set(state.producers) == set(self.model)
        for producer_id, producer in self.model.items():
            entry = state.producers[producer_id]
            assert entry.producer_epoch == producer.epoch
            assert [
                (b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in entry.batches
            ] == [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in producer.recent]

    @invariant()
    def a_follower_of_the_whole_log_knows_each_producers_last_batch(self) -> None:
        end = self.log.log_end_offset
        if end == 0:
            return
        follower = self._open(f"follower-{len(self.history)}-{end}", clean=True)
        try:
            offset = 0
            while offset < end:
                data = self.log.read(offset, 1 << 20)
                follower.append_as_follower(data, 10_000)
                offset = follower.log_end_offset
            full = _model_state(self.history, 0)
            for producer_id, producer in full.items():
                entry = follower.producer_state.producers[producer_id]
                assert entry.producer_epoch == producer.epoch
                assert entry.last_seq == producer.recent[-1].last_seq
                assert entry.last_data_offset == producer.recent[-1].last_offset
        finally:
            follower.delete()


ProducerStateMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ODRADEK_PRODUCER_STATE_EXAMPLES", "40")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestProducerStateStateful = ProducerStateMachine.TestCase
