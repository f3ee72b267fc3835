"""The transaction state machine (`coordinator.transaction.metadata`) and the coordinator's flows
(`coordinator.transaction.coordinator`) over an in-memory `__transaction_state` and a marker
sender that records what it would send:

* valid transitions are exactly Kafka's table; an invalid one raises InvariantError;
* InitProducerId: new ids, epoch bumps, KIP-360 recovery and retries, fencing a stale producer,
  aborting an ongoing transaction under a bumped epoch (CONCURRENT_TRANSACTIONS first);
* AddPartitions / EndTxn errors (fenced epoch, wrong producer id, retried EndTxn, wrong result);
* a failed append leaves the metadata as it was; a timed-out transaction is aborted and its
  producer fenced; a partition reloaded from the log resends the markers of a Prepare* state.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from odradek.coordinator.transaction.coordinator import TransactionCoordinator
from odradek.coordinator.transaction.marker_channel import PendingMarkers
from odradek.coordinator.transaction.metadata import (
    VALID_PREVIOUS,
    TransactionMetadata,
    TransactionState,
)
from odradek.coordinator.transaction.state_manager import (
    AppendResult,
    TransactionConfig,
    TransactionStateManager,
)
from odradek.errors import InvariantError
from odradek.protocol.record_batch import iter_batches

S = TransactionState

KAFKA_VALID_PREVIOUS = {
    "Empty": {"Empty", "CompleteCommit", "CompleteAbort"},
    "Ongoing": {"Ongoing", "Empty", "CompleteCommit", "CompleteAbort"},
    "PrepareCommit": {"Ongoing"},
    "PrepareAbort": {"Ongoing", "PrepareEpochFence"},
    "CompleteCommit": {"PrepareCommit"},
    "CompleteAbort": {"PrepareAbort"},
    "Dead": {"Empty", "CompleteAbort", "CompleteCommit"},
    "PrepareEpochFence": {"Ongoing"},
}


def test_valid_transitions_are_kafkas() -> None:
    ours = {s.kafka_name: {p.kafka_name for p in prev} for s, prev in VALID_PREVIOUS.items()}
    assert ours == KAFKA_VALID_PREVIOUS
    assert [s.value for s in S] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_invalid_transition_raises_and_pending_blocks() -> None:
    metadata = TransactionMetadata("t", 1, producer_epoch=0)
    with pytest.raises(InvariantError):
        metadata.prepare_abort_or_commit(S.PREPARE_COMMIT, 1)  # Empty -> PrepareCommit
    target = metadata.prepare_add_partitions({("a", 0)}, 5)
    with pytest.raises(InvariantError):
        metadata.prepare_add_partitions({("a", 1)}, 6)  # one transition at a time
    metadata.complete_transition(target)
    assert metadata.state is S.ONGOING and metadata.partitions == {("a", 0)}
    assert metadata.txn_start_timestamp == 5


class FakeLog:
    """`TransactionLog` in memory; `fail_with` makes the next appends fail."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.fail_with: ErrorCode | None = None

    def append(self, partition: int, records: bytes, acks: int, timeout: int) -> AppendResult:
        if self.fail_with is not None:
            return AppendResult(self.fail_with)
        self.batches.append(records)
        return AppendResult(ErrorCode.none, len(self.batches) - 1)

    def read(self, partition: int, offset: int, max_bytes: int) -> bytes:
        data = bytearray()
        for i, batch in enumerate(self.batches[offset:], start=offset):
            patched = bytearray(batch)
            patched[0:8] = i.to_bytes(8, "big")
            data += patched
        return bytes(data)

    def log_start_offset(self, partition: int) -> int:
        return 0

    def log_end_offset(self, partition: int) -> int:
        return len(self.batches)


class FakeMarkers:
    """Records markers; 'writes' them at once unless `hold` is set."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bool, int, frozenset[tuple[str, int]]]] = []
        self.hold = False
        self.held: list[Callable[[], Awaitable[None]]] = []

    def add_markers_to_send(
        self,
        txn_partition: int,
        coordinator_epoch: int,
        commit: bool,
        metadata: TransactionMetadata,
        on_written: Callable[[PendingMarkers], Awaitable[None]],
    ) -> None:
        self.sent.append(
            (
                metadata.transactional_id,
                commit,
                metadata.producer_epoch,
                frozenset(metadata.partitions),
            )
        )
        pending = PendingMarkers(
            metadata.transactional_id,
            txn_partition,
            coordinator_epoch,
            metadata.producer_id,
            metadata.producer_epoch,
            commit,
            set(),
        )
        if self.hold:
            self.held.append(lambda: on_written(pending))
        else:
            asyncio.get_running_loop().create_task(on_written(pending))

    def remove_markers_for_partition(self, partition: int) -> None:
        pass

    async def shutdown(self) -> None:
        pass


class Ids:
    def __init__(self) -> None:
        self.counter = itertools.count(1000)

    async def generate_producer_id(self) -> int:
        return next(self.counter)


def make(now: list[int] | None = None) -> tuple[TransactionCoordinator, FakeLog, FakeMarkers]:
    clock = now if now is not None else [1_000_000]
    log = FakeLog()
    manager = TransactionStateManager(
        TransactionConfig(num_partitions=1), log, lambda: 1, now_ms=lambda: clock[0]
    )
    markers = FakeMarkers()
    coordinator = TransactionCoordinator(1, manager, markers, Ids())  # type: ignore[arg-type]
    return coordinator, log, markers


async def _elect(coordinator: TransactionCoordinator, epoch: int = 0) -> None:
    coordinator.on_elected(0, epoch)
    for _ in range(100):
        if coordinator.manager.owned_partitions().get(0):
            return
        await asyncio.sleep(0)
    raise AssertionError("the partition never loaded")


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def run(test: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(test())


def test_init_bumps_epochs_and_kip360() -> None:
    async def scenario() -> None:
        c, _log, _m = make()
        await _elect(c)
        first = await c.init_producer_id("t", 60000)
        assert (first.error, first.producer_epoch) == (ErrorCode.none, 0)
        second = await c.init_producer_id("t", 60000)
        assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
        # KIP-360: the current producer recovers (bump); a retry of that call gets the same epoch
        again = await c.init_producer_id("t", 60000, (first.producer_id, 1))
        assert again.producer_epoch == 2
        retry = await c.init_producer_id("t", 60000, (first.producer_id, 1))
        assert retry.producer_epoch == 2
        stale = await c.init_producer_id("t", 60000, (first.producer_id, 0))
        assert stale.error is ErrorCode.producer_fenced
        other = await c.init_producer_id("t", 60000, (first.producer_id + 99, 2))
        assert other.error is ErrorCode.producer_fenced
        assert (await c.init_producer_id("", 60000)).error is ErrorCode.invalid_request
        too_long = await c.init_producer_id("t", 900_001)
        assert too_long.error is ErrorCode.invalid_transaction_timeout

    run(scenario)


def test_commit_abort_and_end_txn_errors() -> None:
    async def scenario() -> None:
        c, _log, markers = make()
        await _elect(c)
        init = await c.init_producer_id("t", 60000)
        pid, epoch = init.producer_id, init.producer_epoch
        assert await c.add_partitions("t", pid, epoch, [("a", 0), ("b", 1)]) is ErrorCode.none
        assert await c.add_partitions("t", pid, epoch + 1, [("a", 0)]) is ErrorCode.producer_fenced
        assert (
            await c.add_partitions("t", pid + 1, epoch, [("a", 0)])
            is ErrorCode.invalid_producer_id_mapping
        )
        assert await c.end_transaction("t", pid, epoch, True) is ErrorCode.none
        await _settle()
        assert markers.sent == [("t", True, epoch, frozenset({("a", 0), ("b", 1)}))]
        metadata = c.manager.get_state("t")[1].metadata  # type: ignore[union-attr]
        assert metadata.state is S.COMPLETE_COMMIT and not metadata.partitions
        assert await c.end_transaction("t", pid, epoch, True) is ErrorCode.none  # a retry
        assert await c.end_transaction("t", pid, epoch, False) is ErrorCode.invalid_txn_state
        assert await c.add_partitions("t", pid, epoch, [("a", 0)]) is ErrorCode.none
        assert await c.end_transaction("t", pid, epoch, False) is ErrorCode.none
        await _settle()
        assert markers.sent[-1][:2] == ("t", False)
        assert metadata.state is S.COMPLETE_ABORT

    run(scenario)


def test_markers_in_flight_make_others_wait() -> None:
    async def scenario() -> None:
        c, _log, markers = make()
        await _elect(c)
        init = await c.init_producer_id("t", 60000)
        pid, epoch = init.producer_id, init.producer_epoch
        await c.add_partitions("t", pid, epoch, [("a", 0)])
        markers.hold = True
        assert await c.end_transaction("t", pid, epoch, True) is ErrorCode.none
        assert (await c.init_producer_id("t", 60000)).error is ErrorCode.concurrent_transactions
        assert (
            await c.add_partitions("t", pid, epoch, [("a", 1)]) is ErrorCode.concurrent_transactions
        )
        await markers.held.pop()()
        assert (await c.init_producer_id("t", 60000)).producer_epoch == epoch + 1

    run(scenario)


def test_init_aborts_an_ongoing_transaction_and_fences_the_old_producer() -> None:
    async def scenario() -> None:
        c, _log, markers = make()
        await _elect(c)
        old = await c.init_producer_id("t", 60000)
        await c.add_partitions("t", old.producer_id, old.producer_epoch, [("a", 0)])
        first = await c.init_producer_id("t", 60000)
        assert first.error is ErrorCode.concurrent_transactions
        await _settle()
        assert markers.sent == [("t", False, old.producer_epoch + 1, frozenset({("a", 0)}))]
        new = await c.init_producer_id("t", 60000)
        assert (new.error, new.producer_epoch) == (ErrorCode.none, old.producer_epoch + 2)
        zombie = await c.end_transaction("t", old.producer_id, old.producer_epoch, True)
        assert zombie is ErrorCode.producer_fenced

    run(scenario)


def test_failed_append_changes_nothing() -> None:
    async def scenario() -> None:
        c, log, _m = make()
        await _elect(c)
        init = await c.init_producer_id("t", 60000)
        log.fail_with = ErrorCode.not_enough_replicas
        error = await c.add_partitions("t", init.producer_id, init.producer_epoch, [("a", 0)])
        assert error is ErrorCode.coordinator_not_available
        metadata = c.manager.get_state("t")[1].metadata  # type: ignore[union-attr]
        assert metadata.state is S.EMPTY and metadata.pending_state is None
        log.fail_with = ErrorCode.not_leader_or_follower
        assert (await c.init_producer_id("t", 60000)).error is ErrorCode.not_coordinator

    run(scenario)


def test_timed_out_transaction_is_aborted_and_producer_fenced() -> None:
    async def scenario() -> None:
        clock = [1_000_000]
        c, _log, markers = make(clock)
        await _elect(c)
        init = await c.init_producer_id("t", 5000)
        await c.add_partitions("t", init.producer_id, init.producer_epoch, [("a", 0)])
        assert await c.abort_timed_out_transactions() == 0
        clock[0] += 5001
        assert await c.abort_timed_out_transactions() == 1
        await _settle()
        assert markers.sent[-1] == ("t", False, init.producer_epoch + 1, frozenset({("a", 0)}))
        late = await c.end_transaction("t", init.producer_id, init.producer_epoch, True)
        assert late is ErrorCode.producer_fenced

    run(scenario)


def test_reload_resends_markers_of_prepared_transactions() -> None:
    async def scenario() -> None:
        c, log, markers = make()
        await _elect(c)
        init = await c.init_producer_id("t", 60000)
        await c.add_partitions("t", init.producer_id, init.producer_epoch, [("a", 0)])
        markers.hold = True
        await c.end_transaction("t", init.producer_id, init.producer_epoch, True)
        # The coordinator moves before the markers are written; a new one loads the log.
        c.on_resigned(0)
        assert c.manager.get_state("t")[0] is ErrorCode.not_coordinator
        fresh, _, fresh_markers = make()
        fresh.manager.log = log
        await _elect(fresh, 1)
        await _settle()
        assert fresh_markers.sent == [("t", True, init.producer_epoch, frozenset({("a", 0)}))]
        metadata = fresh.manager.get_state("t")[1].metadata  # type: ignore[union-attr]
        assert metadata.state is S.COMPLETE_COMMIT
        assert len(list(iter_batches(b"".join(log.batches)))) == len(log.batches)

    run(scenario)


def test_expiry_tombstones_idle_ids() -> None:
    async def scenario() -> None:
        clock = [1_000_000]
        c, _log, _m = make(clock)
        await _elect(c)
        await c.init_producer_id("t", 60000)
        assert await c.manager.expire_transactional_ids() == 0
        clock[0] += TransactionConfig().transactional_id_expiration_ms + 1
        assert await c.manager.expire_transactional_ids() == 1
        assert c.manager.get_state("t") == (ErrorCode.none, None)
        assert c.describe("t")[0] is ErrorCode.transactional_id_not_found

    run(scenario)
