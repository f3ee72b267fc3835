"""The controller's shortcuts for events of thousands of partitions, and why each is safe.

* A broker failure elects new leaders (writing their states) and then removes the dead replicas
  from the ISR. States this controller wrote in the current, unsent batch are not read again from
  ZooKeeper before the ISR removal (no broker knows their versions yet, so nobody can have changed
  them); every other state still is, and once the batch is sent the written ones are too.
* The cyclic garbage collector is paused during a controller event (`gc_pause`); the pause nests and
  restores the collector exactly as it was.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from odradek.controller import events as ev
from odradek.controller.context import LeaderAndIsr, PartitionReplica, TopicPartition
from odradek.controller.gc_pause import pause_depth, paused_gc
from odradek.controller.states import PartitionState, ReplicaState, StateChangeLogger
from tests.unit.test_state_machines import TOPIC, Harness, run

P = PartitionState
R = ReplicaState


class CountingReads:
    """Wraps the harness's `get_partition_states` and records the partitions of each read."""

    def __init__(self, h: Harness) -> None:
        self.reads: list[list[TopicPartition]] = []
        self._real = h.zk.get_partition_states
        h.zk.get_partition_states = self._read  # type: ignore[method-assign]

    async def _read(self, partitions: Sequence[TopicPartition], *args: Any) -> Any:
        self.reads.append(list(partitions))
        return await self._real(partitions, *args)

    def partitions_read(self) -> list[TopicPartition]:
        return [tp for read in self.reads for tp in read]


def led_by_2(h: Harness, count: int) -> list[TopicPartition]:
    h.add_topic(TOPIC, {p: [2, 1, 3] for p in range(count)})
    partitions = [(TOPIC, p) for p in range(count)]
    for tp in partitions:
        h.seed_partition(tp, leader=2, isr=[2, 1, 3])
    return partitions


async def broker_2_fails(h: Harness, partitions: list[TopicPartition]) -> None:
    """What `on_replicas_become_offline` does for broker 2 (without sending the batch)."""
    await h.partitions.handle_state_changes(partitions, P.OfflinePartition)
    await h.partitions.trigger_online_partition_state_change()
    await h.replicas.handle_state_changes(
        [PartitionReplica(*tp, 2) for tp in partitions], R.OfflineReplica
    )


def test_a_broker_failure_reads_each_partition_state_once() -> None:
    h = Harness(live=[1, 2, 3])
    partitions = led_by_2(h, 5)
    reads = CountingReads(h)
    h.kill(2)

    run(broker_2_fails(h, partitions))

    assert reads.reads == [partitions]  # the election's read only
    for tp in partitions:
        state = h.zk.partition_state(tp)
        assert state == h.context.leadership[tp]
        assert state is not None and state.leader in (1, 3) and 2 not in state.isr
        assert h.context.partition_states[tp] is P.OnlinePartition
        assert h.context.replica_states[PartitionReplica(*tp, 2)] is R.OfflineReplica


def test_states_not_written_in_this_batch_are_still_read_before_the_isr_removal() -> None:
    """Broker 2 follows t-1 (not elected in this event): the leader re-added it to the ISR in
    ZooKeeper without notifying; the removal must read that and take it out."""
    h = Harness(live=[1, 2, 3])
    partitions = led_by_2(h, 1)
    h.add_topic("other", {0: [1, 2]})
    followed = ("other", 0)
    h.seed_partition(followed, leader=1, isr=[1])
    h.zk.leader_update_isr(followed, [1, 2], notify=False)
    reads = CountingReads(h)
    h.kill(2)

    async def fail() -> None:
        await broker_2_fails(h, partitions)
        await h.replicas.handle_state_changes([PartitionReplica(*followed, 2)], R.OfflineReplica)

    run(fail())

    assert followed in reads.partitions_read()
    assert h.zk.partition_state(followed).isr == (1,)  # type: ignore[union-attr]


def test_once_the_batch_is_sent_written_states_are_read_again() -> None:
    """After the LeaderAndIsr went out, the new leader may change the ISR: a later removal reads
    ZooKeeper (here the leader put 3 back after the controller had removed it)."""
    h = Harness(live=[1, 2, 3])
    partitions = led_by_2(h, 1)
    tp = partitions[0]
    h.kill(2)
    run(broker_2_fails(h, partitions))
    run(h.replicas.handle_state_changes([PartitionReplica(*tp, 3)], R.OfflineReplica))
    h.send()
    assert h.batch.unsent_writes == {}
    h.zk.leader_update_isr(tp, [1, 3], notify=False)
    reads = CountingReads(h)

    run(h.replicas.handle_state_changes([PartitionReplica(*tp, 3)], R.OnlineReplica))
    run(h.replicas.handle_state_changes([PartitionReplica(*tp, 3)], R.OfflineReplica))

    assert reads.partitions_read() == [tp]
    assert h.zk.partition_state(tp).isr == (1,)  # type: ignore[union-attr]


def test_a_cached_state_replaced_since_the_write_is_read_again() -> None:
    """Only the very state this controller wrote counts as fresh: if the cache holds another one
    (an ISR change notification was read in between), ZooKeeper is read."""
    h = Harness(live=[1, 2, 3])
    partitions = led_by_2(h, 1)
    tp = partitions[0]
    h.kill(2)

    async def elect() -> None:
        await h.partitions.handle_state_changes(partitions, P.OfflinePartition)
        await h.partitions.trigger_online_partition_state_change()

    run(elect())
    written = h.context.leadership[tp]
    h.context.leadership[tp] = (
        LeaderAndIsr(**{**written.__dict__}) if hasattr(written, "__dict__") else _copy(written)
    )
    reads = CountingReads(h)

    run(h.replicas.handle_state_changes([PartitionReplica(*tp, 2)], R.OfflineReplica))

    assert reads.partitions_read() == [tp]


def _copy(state: LeaderAndIsr) -> LeaderAndIsr:
    return LeaderAndIsr(
        state.leader, state.leader_epoch, state.isr, state.controller_epoch, state.zk_version
    )


# --- the collector's pause ----------------------------------------------------------------------


@pytest.fixture
def collector_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.disable()


@pytest.mark.usefixtures("collector_enabled")
def test_the_pause_nests_and_enables_the_collector_after_the_outermost() -> None:
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
            assert pause_depth() == 2
        assert not gc.isenabled()
    assert gc.isenabled()
    assert pause_depth() == 0


@pytest.mark.usefixtures("collector_enabled")
def test_the_pause_ends_when_its_body_raises() -> None:
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("boom")
    assert gc.isenabled()
    assert pause_depth() == 0


def test_a_collector_disabled_before_stays_disabled() -> None:
    was = gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()


@pytest.mark.usefixtures("collector_enabled")
def test_overlapping_pauses_on_one_event_loop_end_with_the_last() -> None:
    """A controller event and a LeaderAndIsr being applied overlap across awaits."""
    states: list[bool] = []

    async def work(hold: asyncio.Event, done: asyncio.Event) -> None:
        with paused_gc():
            await hold.wait()
        states.append(gc.isenabled())
        done.set()

    async def main() -> None:
        first_hold, second_hold = asyncio.Event(), asyncio.Event()
        first_done, second_done = asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(work(first_hold, first_done)),
            asyncio.create_task(work(second_hold, second_done)),
        ]
        await asyncio.sleep(0)
        first_hold.set()
        await first_done.wait()
        second_hold.set()
        await second_done.wait()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert states == [False, True]


def test_the_controller_processes_an_event_with_the_collector_paused() -> None:
    """`KafkaController.process` wraps every event (an Expire of an inactive controller here)."""
    from odradek.controller.controller import KafkaController

    seen: list[int] = []

    class Probe(KafkaController):
        async def _dispatch(self, event: Any) -> None:
            seen.append(pause_depth())

    probe = Probe.__new__(Probe)
    probe.state_change_logger = StateChangeLogger(1)
    asyncio.run(probe.process(ev.Expire()))
    assert seen == [1]
    assert pause_depth() == 0


@pytest.mark.usefixtures("collector_enabled")
def test_a_pause_that_outlasts_its_limit_enables_the_collector_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An event waiting across awaits (ZooKeeper retries) must not keep the collector off while
    the broker goes on serving clients."""
    from odradek.controller import gc_pause

    monkeypatch.setattr(gc_pause, "MAX_PAUSE_S", 0.05)
    seen: list[bool] = []

    async def main() -> None:
        with paused_gc():
            seen.append(gc.isenabled())
            deadline = asyncio.get_running_loop().time() + 10
            while not gc.isenabled() and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            seen.append(gc.isenabled())
            assert pause_depth() == 1
        seen.append(gc.isenabled())

    asyncio.run(main())
    assert seen == [False, True, True]
    assert pause_depth() == 0


@pytest.mark.usefixtures("collector_enabled")
def test_a_pause_that_ends_in_time_cancels_its_limit() -> None:
    from odradek.controller import gc_pause

    async def main() -> None:
        with paused_gc():
            await asyncio.sleep(0)
        assert gc_pause._limit is None

    asyncio.run(main())
    assert gc.isenabled()
