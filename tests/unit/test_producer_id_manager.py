"""ProducerIdManager: blocks of producer ids reserved in `/latest_producer_id_block` with
conditional writes (Kafka's ZkProducerIdManager), against a fake ZooKeeper that keeps versions."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest

from odradek.coordinator.transaction.producer_id_manager import ProducerIdManager
from odradek.errors import KafkaError
from odradek.zk.errors import BadVersionError, NodeExistsError, NoNodeError, SessionExpiredError
from odradek.zk.znodes.producer_ids import ProducerIdBlock, ProducerIdBlockZNode

PATH = "/latest_producer_id_block"


@dataclass
class Stat:
    version: int


class FakeZk:
    """One znode store with versions; `interleave` runs before each conditional write (another
    broker's write landing between our read and our write)."""

    def __init__(self, exists: bool = True) -> None:
        self.nodes: dict[str, tuple[bytes, int]] = {PATH: (b"", 0)} if exists else {}
        self.interleave: list[object] = []
        self.writes = 0
        self.fail_with: Exception | None = None
        self.lose_answer_once = False

    async def get(self, path: str) -> tuple[bytes, Stat]:
        await asyncio.sleep(0)
        if self.fail_with is not None:
            raise self.fail_with
        if path not in self.nodes:
            raise NoNodeError(path=path)
        data, version = self.nodes[path]
        return data, Stat(version)

    async def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        await asyncio.sleep(0)
        while self.interleave:
            action = self.interleave.pop(0)
            await action()  # type: ignore[operator]
        _data, current_version = self.nodes[path]
        if version != -1 and version != current_version:
            raise BadVersionError(path=path)
        self.nodes[path] = (data, current_version + 1)
        self.writes += 1
        if self.lose_answer_once:
            # The write landed but its answer was lost; the client's retry then fails.
            self.lose_answer_once = False
            raise BadVersionError(path=path)
        return Stat(current_version + 1)

    async def create(self, path: str, data: bytes = b"") -> str:
        if path in self.nodes:
            raise NodeExistsError(path=path)
        self.nodes[path] = (data, 0)
        return path


def test_znode_json_is_kafkas() -> None:
    data = ProducerIdBlockZNode.encode(ProducerIdBlock(3, 2000, 1000))
    assert json.loads(data) == {
        "version": 1,
        "broker": 3,
        "block_start": "2000",
        "block_end": "2999",
    }
    assert ProducerIdBlockZNode.decode(data, 7) == ProducerIdBlock(3, 2000, 1000, 7)
    assert ProducerIdBlockZNode.decode(b"", 0) is None


def test_ids_come_from_consecutive_blocks() -> None:
    async def run() -> list[int]:
        zk = FakeZk()
        manager = ProducerIdManager(1, zk, block_size=10)
        return [await manager.generate_producer_id() for _ in range(25)]

    assert asyncio.run(run()) == list(range(25))


def test_two_brokers_never_share_an_id_even_with_conflicting_writes() -> None:
    async def run() -> tuple[list[int], list[int], FakeZk]:
        zk = FakeZk()
        first, second = ProducerIdManager(1, zk, 10), ProducerIdManager(2, zk, 10)

        async def other_broker_takes_a_block() -> None:
            await second.generate_producer_id()

        zk.interleave.append(other_broker_takes_a_block)  # first's first write conflicts
        ids_first = [await first.generate_producer_id() for _ in range(15)]
        results = await asyncio.gather(*(m.generate_producer_id() for m in (first, second) * 20))
        ids_second = [await second.generate_producer_id() for _ in range(5)]
        return ids_first + list(results), ids_second, zk

    ids_a, ids_b, zk = asyncio.run(run())
    all_ids = ids_a + ids_b
    assert len(all_ids) == len(set(all_ids))
    block = ProducerIdBlockZNode.decode(*zk.nodes[PATH])
    assert block is not None and max(all_ids) <= block.last_producer_id


def test_a_lost_answer_wastes_a_block_but_never_repeats_an_id() -> None:
    async def run() -> list[int]:
        zk = FakeZk()
        zk.lose_answer_once = True
        manager = ProducerIdManager(1, zk, 10)
        ids = [await manager.generate_producer_id() for _ in range(3)]
        assert zk.writes == 2
        # A restarted broker (a new manager) continues after every block ever written.
        restarted = ProducerIdManager(1, zk, 10)
        return [*ids, await restarted.generate_producer_id()]

    ids = asyncio.run(run())
    assert ids == [10, 11, 12, 20]


def test_missing_znode_is_created() -> None:
    async def run() -> int:
        return await ProducerIdManager(1, FakeZk(exists=False), 10).generate_producer_id()

    assert asyncio.run(run()) == 0


def test_zookeeper_failure_is_a_kafka_error() -> None:
    async def run() -> None:
        zk = FakeZk()
        zk.fail_with = SessionExpiredError("gone")
        await ProducerIdManager(1, zk, 10).generate_producer_id()

    with pytest.raises(KafkaError):
        asyncio.run(run())
