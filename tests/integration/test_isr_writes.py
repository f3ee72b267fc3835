"""Leaders' ISR writes coalesced into multi() batches (`cluster/isr_writes.py`), against a real
ZooKeeper: concurrent writes go as one transaction; a batch holding a write the controller has
fenced (znode version moved on) is refused whole and then written one by one, so every partition
gets exactly the outcome it would get alone."""

from __future__ import annotations

import asyncio
from typing import Any

from odradek.cluster.isr_writes import BatchedIsrWriter, encode_state
from odradek.cluster.partition_isr import IsrUpdate
from odradek.zk.client import ZkClient
from odradek.zk.errors import ClientClosedError, SessionExpiredError
from odradek.zk.ops import CreateOp
from odradek.zk.znodes import TopicPartitionStateZNode

SCENARIO_TIMEOUT_S = 90.0
TOPIC = "isr-writes"


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_S))


def update(partition: int, isr: tuple[int, ...], zk_version: int, epoch: int = 3) -> IsrUpdate:
    return IsrUpdate(TOPIC, partition, 1, epoch, isr, controller_epoch=2, zk_version=zk_version)


async def setup(client: ZkClient, count: int) -> None:
    await client.ensure_paths([f"/brokers/topics/{TOPIC}/partitions/{p}" for p in range(count)])
    await client.multi(
        [
            CreateOp(TopicPartitionStateZNode.path(TOPIC, p), encode_state(update(p, (1, 2, 3), 0)))
            for p in range(count)
        ]
    )


async def state(client: ZkClient, partition: int) -> tuple[list[int], int, int]:
    path = TopicPartitionStateZNode.path(TOPIC, partition)
    data, stat = await client.get(path)
    decoded = TopicPartitionStateZNode.decode(data, stat.version, path)
    return list(decoded.isr), decoded.leader_epoch, stat.version


def test_concurrent_writes_go_as_batches_of_at_most_max_batch(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = ZkClient(zk_chroot)
        await client.start()
        try:
            await setup(client, 250)
            writer = BatchedIsrWriter(client, max_batch=100)
            versions = await asyncio.gather(*(writer(update(p, (1, 2), 0)) for p in range(250)))
            assert versions == [1] * 250
            assert writer.batches == 3
            for p in (0, 99, 100, 249):
                assert await state(client, p) == ([1, 2], 3, 1)
            # a lone write goes straight through (no batch of one)
            assert await writer(update(7, (1,), 1)) == 2
            assert writer.batches == 3
            assert await state(client, 7) == ([1], 3, 2)
        finally:
            await client.close()

    run(scenario())


def test_a_fenced_write_fails_alone_and_the_rest_of_its_batch_lands(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = ZkClient(zk_chroot)
        await client.start()
        try:
            await setup(client, 60)
            # the controller moves partitions 5 and 40 on (new leader, new epoch)
            for p in (5, 40):
                await client.set(
                    TopicPartitionStateZNode.path(TOPIC, p),
                    encode_state(IsrUpdate(TOPIC, p, 2, 4, (2, 3), 2, 0)),
                    0,
                )
            # partition 9: our own write already landed (retried after a connection loss)
            await client.set(
                TopicPartitionStateZNode.path(TOPIC, 9), encode_state(update(9, (1, 3), 0)), 0
            )
            writer = BatchedIsrWriter(client)
            versions = await asyncio.gather(*(writer(update(p, (1, 3), 0)) for p in range(60)))
            assert writer.batches == 0  # the batch was refused whole, then written one by one
            assert versions[5] is None and versions[40] is None
            assert versions[9] == 1
            assert [v for p, v in enumerate(versions) if p not in (5, 40)] == [1] * 58
            assert await state(client, 5) == ([2, 3], 4, 1)  # the controller's state stands
            assert await state(client, 12) == ([1, 3], 3, 1)
        finally:
            await client.close()

    run(scenario())


def test_every_caller_gets_the_error_when_zookeeper_is_gone(zk_chroot: str) -> None:
    async def scenario() -> None:
        client = ZkClient(zk_chroot)
        await client.start()
        await setup(client, 5)
        writer = BatchedIsrWriter(client)
        await client.close()
        outcomes = await asyncio.gather(
            *(writer(update(p, (1,), 0)) for p in range(5)), return_exceptions=True
        )
        assert all(isinstance(o, ClientClosedError | SessionExpiredError) for o in outcomes), (
            outcomes
        )

    run(scenario())
