"""Bulk reads (`odradek.zk.bulk_read`, used by `ZkClient.get_many` for many paths) against a real
ZooKeeper: they must answer exactly what kazoo answers, path by path, including missing and empty
znodes, under a chroot, across parallel sessions, as multiReads and as single GetData requests,
and fall back when no server answers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from odradek.zk import bulk_read
from odradek.zk.client import BULK_READ_MIN, ZkClient
from odradek.zk.errors import ConnectionLossError, NoNodeError
from odradek.zk.ops import CreateOp
from tests.fixtures.zookeeper import ZooKeeperHandle, free_port

SCENARIO_TIMEOUT_S = 120.0


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_S))


def comparable(results: list[Any]) -> list[Any]:
    return [
        (r[0], r[1].version, r[1].dataLength, r[1].mzxid) if isinstance(r, tuple) else type(r)
        for r in results
    ]


@pytest.mark.parametrize(("sessions", "multi_read"), [(1, True), (3, True), (2, False)])
def test_bulk_read_matches_kazoo_reads(zk_chroot: str, sessions: int, multi_read: bool) -> None:
    async def scenario() -> None:
        client = ZkClient(zk_chroot)
        await client.start()
        try:
            await client.ensure_paths(["/p"])
            count = 2 * bulk_read.BATCH + 123  # several batches, an uneven last one
            ops = [
                CreateOp(f"/p/{i}", f'{{"leader":{i % 7}}}'.encode() * (i % 5))
                for i in range(count)
            ]
            for start in range(0, count, 2000):
                await client.multi(ops[start : start + 2000])
            for i in range(0, count, 97):  # some znodes have moved on from version 0
                await client.set(f"/p/{i}", b"rewritten")
            paths = [f"/p/{i}" for i in range(count)]
            paths[10:10] = ["/p/missing", "/nowhere/at/all"]
            # several multiReads and an uneven last one; missing znodes inside a multiRead fail
            # alone
            assert len(bulk_read.multi_read_chunks(paths)) > 3

            bulk = await bulk_read.read_many(
                zk_chroot, paths, sessions=sessions, multi_read=multi_read
            )
            one_by_one = await asyncio.gather(*(get_or_error(client, p) for p in paths))
            assert comparable(bulk) == comparable(one_by_one)
            assert isinstance(bulk[10], NoNodeError) and bulk[10].path == "/p/missing"
            assert bulk[5][0] == b"" and bulk[2][0] == b'{"leader":2}' * 2
            assert bulk[paths.index("/p/97")][0] == b"rewritten"
            assert bulk[paths.index("/p/97")][1].version == 1

            # get_many takes the bulk path from BULK_READ_MIN paths on and agrees with it
            assert len(paths) >= BULK_READ_MIN
            assert comparable(await client.get_many(paths)) == comparable(bulk)
        finally:
            await client.close()

    run(scenario())


async def get_or_error(client: ZkClient, path: str) -> Any:
    try:
        return await client.get(path)
    except NoNodeError as e:
        return e


def test_bulk_read_sees_writes_made_just_before(zookeeper: ZooKeeperHandle) -> None:
    zookeeper.ensure_running()

    async def scenario() -> None:
        client = ZkClient(zookeeper.connect_string)
        await client.start()
        try:
            await client.ensure_paths(["/bulk-fresh"])
            for round_ in range(5):
                await client.set("/bulk-fresh", str(round_).encode())
                [(data, _stat)] = await bulk_read.read_many(
                    zookeeper.connect_string, ["/bulk-fresh"]
                )
                assert data == str(round_).encode()
        finally:
            await client.close()

    run(scenario())


def test_bulk_read_to_no_server_raises_connection_loss_and_get_many_falls_back(
    zk_chroot: str,
) -> None:
    dead = f"127.0.0.1:{free_port()}"

    async def scenario() -> None:
        with pytest.raises(ConnectionLossError):
            await bulk_read.read_many(dead, ["/a", "/b"], timeout_s=10)
        client = ZkClient(zk_chroot)
        await client.start()
        try:
            await client.ensure_paths(["/q"])
            await client.multi([CreateOp(f"/q/{i}", b"x") for i in range(BULK_READ_MIN)])
            # point the bulk reader at a dead server: get_many must still answer through kazoo
            client.connect_string = dead + "/" + zk_chroot.partition("/")[2]
            results = await client.get_many([f"/q/{i}" for i in range(BULK_READ_MIN)])
            assert all(r[0] == b"x" for r in results)
        finally:
            await client.close()

    run(scenario())


def test_bulk_read_of_no_paths_is_empty() -> None:
    # no server is contacted: the connect string points nowhere
    assert asyncio.run(bulk_read.read_many(f"127.0.0.1:{free_port()}", [])) == []


def test_split_connect_string() -> None:
    assert bulk_read.split_connect_string("a:1,b:2/kafka/x") == ([("a", 1), ("b", 2)], "/kafka/x")
    assert bulk_read.split_connect_string("localhost") == ([("localhost", 2181)], "")
    assert bulk_read.split_connect_string("h:5/") == ([("h", 5)], "")
