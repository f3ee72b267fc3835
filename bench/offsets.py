"""Offset commits per second, and how long a coordinator takes to load a partition of 10,000
groups after a broker failure. Prints one JSON object per measurement:

    ./dev bench offsets                       # all three, on a fresh 3-broker cluster
    ./dev bench offsets --only commits --groups 1,1000 --seconds 20
    ./dev bench offsets --only load --load-groups 10000

* `commits`: OffsetCommit v8 requests (one partition each, like a consumer committing after each
  poll of one partition) sent by one client over one connection per coordinator, `--window`
  requests in flight, for `--seconds`; with `--groups 1` every request commits for the same
  group, with 1000 they go round-robin over 1,000 groups (spread over the offsets partitions, so
  over every broker). Each commit is answered once replicated (offsets.commit.required.acks=-1,
  the offsets topic has RF 3). Reports commits/s and the latency percentiles.
* `load`: commits one offset for each of `--load-groups` groups that all live in the same offsets
  partition (three partitions each, so 3 records a group), SIGKILLs that partition's leader, and
  reports (a) the new leader's own load time (its "loaded offsets partition" log line: replaying
  the partition and installing the groups), (b) the time from the kill until a group of the
  partition answers OffsetFetch from the new coordinator (includes ZooKeeper noticing the death:
  the session timeout, 6 s in local clusters).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from kio.schema.errors import ErrorCode
from scratch import temporary_directory

from odradek.coordinator.group.placement import partition_for
from odradek.network.client import BrokerConnection
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class
from odradek.testing import LocalCluster

RETRIABLE = {
    ErrorCode.coordinator_not_available,
    ErrorCode.coordinator_load_in_progress,
    ErrorCode.not_coordinator,
}


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class Client:
    """One connection per broker, requests pipelined (BrokerConnection matches answers)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.connections: dict[int, BrokerConnection] = {}
        self.coordinators: dict[str, int] = {}

    async def connection(self, broker_id: int) -> BrokerConnection:
        found = self.connections.get(broker_id)
        if found is None or found.closed:
            broker = self.cluster.broker(broker_id)
            found = await BrokerConnection.connect(broker.host, broker.port, client_id="bench")
            self.connections[broker_id] = found
        return found

    async def request(self, broker_id: int, api_key: int, version: int, values: Any) -> Any:
        connection = await self.connection(broker_id)
        return await connection.send(
            api_key, version, build(request_class(api_key, version), values)
        )

    async def coordinator(self, group: str, alive: list[int], timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while True:
            for broker_id in alive:
                try:
                    answer = await self.request(
                        broker_id, ApiKey.FIND_COORDINATOR, 3, {"key": group, "key_type": 0}
                    )
                except Exception:
                    continue
                if answer.error_code == ErrorCode.none:
                    self.coordinators[group] = int(answer.node_id)
                    return int(answer.node_id)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no coordinator for {group}")
            await asyncio.sleep(0.1)

    async def commit(self, group: str, topic: str, partitions: dict[int, int]) -> ErrorCode:
        answer = await self.request(
            self.coordinators[group],
            ApiKey.OFFSET_COMMIT,
            8,
            {
                "group_id": group,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {
                                "partition_index": p,
                                "committed_offset": o,
                                "committed_leader_epoch": -1,
                                "committed_metadata": "",
                            }
                            for p, o in partitions.items()
                        ],
                    }
                ],
            },
        )
        return ErrorCode(answer.topics[0].partitions[0].error_code)

    async def fetch(self, broker_id: int, group: str, topic: str) -> tuple[ErrorCode, int]:
        answer = await self.request(
            broker_id,
            ApiKey.OFFSET_FETCH,
            7,
            {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}]},
        )
        if answer.error_code != ErrorCode.none:
            return ErrorCode(answer.error_code), -1
        return ErrorCode.none, int(answer.topics[0].partitions[0].committed_offset)

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()


async def create_topic(client: Client, topic: str, partitions: int) -> None:
    controller = next(iter(client.cluster.broker_ids))
    await client.request(
        controller,
        ApiKey.CREATE_TOPICS,
        7,
        {
            "topics": [
                {
                    "name": topic,
                    "num_partitions": partitions,
                    "replication_factor": 3,
                    "assignments": [],
                    "configs": [],
                }
            ],
            "timeout": 60_000,
            "validate_only": False,
        },
    )
    await asyncio.sleep(2)


async def bench_commits(
    cluster: LocalCluster, groups: int, seconds: float, window: int
) -> dict[str, Any]:
    client = Client(cluster)
    try:
        topic = f"bench-commits-{uuid.uuid4().hex[:6]}"
        await create_topic(client, topic, 3)
        names = [f"bench-{groups}-{i}-{uuid.uuid4().hex[:6]}" for i in range(groups)]
        alive = list(cluster.broker_ids)
        await asyncio.gather(*(client.coordinator(g, alive) for g in names))
        latencies: list[float] = []
        errors: dict[str, int] = {}
        sent = 0
        stop = time.monotonic() + seconds

        async def worker(index: int) -> None:
            nonlocal sent
            offset = 0
            while time.monotonic() < stop:
                group = names[(index + sent) % len(names)]
                sent += 1
                offset += 1
                started = time.monotonic()
                code = await client.commit(group, topic, {index % 3: offset})
                latencies.append(time.monotonic() - started)
                if code is not ErrorCode.none:
                    errors[code.name] = errors.get(code.name, 0) + 1

        started = time.monotonic()
        await asyncio.gather(*(worker(i) for i in range(window)))
        elapsed = time.monotonic() - started
        return {
            "bench": "offset_commits",
            "groups": groups,
            "window": window,
            "seconds": round(elapsed, 1),
            "commits": len(latencies),
            "commits_per_s": round(len(latencies) / elapsed),
            "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
            "errors": errors,
        }
    finally:
        client.close()


def loaded_line(log: Path, partition: int, since: int) -> tuple[float, float] | None:
    """(timestamp, load seconds) of the broker's "loaded offsets partition N in S s" line."""
    with open(log, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    pattern = re.compile(
        rf"^\[(\S+ \S+)\] INFO \S+: loaded offsets partition {partition} in ([0-9.]+) s", re.M
    )
    match = pattern.search(text)
    return None if match is None else (0.0, float(match.group(2)))


async def bench_load(cluster: LocalCluster, count: int) -> dict[str, Any]:
    client = Client(cluster)
    try:
        topic = f"bench-load-{uuid.uuid4().hex[:6]}"
        await create_topic(client, topic, 3)
        alive = list(cluster.broker_ids)
        await client.coordinator("warm-up", alive)  # creates the offsets topic
        target = partition_for("warm-up", 50)
        names: list[str] = []
        index = 0
        while len(names) < count:
            name = f"load-{index}"
            index += 1
            if partition_for(name, 50) == target:
                names.append(name)
        coordinator = await client.coordinator(names[0], alive)
        for name in names:
            client.coordinators[name] = coordinator
        started = time.monotonic()
        semaphore = asyncio.Semaphore(64)

        async def one(name: str) -> None:
            async with semaphore:
                code = await client.commit(name, topic, {0: 11, 1: 22, 2: 33})
                if code is not ErrorCode.none:
                    raise RuntimeError(f"commit of {name}: {code.name}")

        await asyncio.gather(*(one(n) for n in names))
        filled = time.monotonic() - started
        survivors = [b for b in alive if b != coordinator]
        logs = {b: cluster.broker(b).log for b in survivors}
        offsets = {b: logs[b].stat().st_size for b in survivors}
        client.connections.pop(coordinator).close()
        killed = time.monotonic()
        cluster.kill(coordinator)
        probe = names[len(names) // 2]
        while True:
            try:
                new = await client.coordinator(probe, survivors, timeout=5)
                code, offset = await client.fetch(new, probe, topic)
            except Exception:
                code, offset = ErrorCode.coordinator_not_available, -1
            if code is ErrorCode.none and offset == 11:
                break
            if code not in RETRIABLE and code is not ErrorCode.none:
                raise RuntimeError(f"OffsetFetch: {code.name}")
            if time.monotonic() - killed > 300:
                raise TimeoutError("the partition did not come back")
            await asyncio.sleep(0.05)
        recovered = time.monotonic() - killed
        load = None
        for broker_id in survivors:
            found = loaded_line(logs[broker_id], target, offsets[broker_id])
            if found is not None:
                load = found[1]
        cluster.start_broker(coordinator)
        return {
            "bench": "coordinator_load",
            "groups": count,
            "records": count * 3,
            "partition": target,
            "fill_s": round(filled, 1),
            "load_s": load,
            "from_kill_to_offset_fetch_s": round(recovered, 2),
        }
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=("commits", "load"))
    parser.add_argument("--groups", default="1,1000", help="commit benchmark: group counts")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--window", type=int, default=64, help="commits in flight")
    parser.add_argument("--load-groups", type=int, default=10_000)
    args = parser.parse_args()
    directory = temporary_directory("odradek-bench-offsets-")
    cluster = LocalCluster.up(directory, 3, timeout=300)
    try:
        if args.only in (None, "commits"):
            for groups in (int(g) for g in args.groups.split(",")):
                emit(asyncio.run(bench_commits(cluster, groups, args.seconds, args.window)))
        if args.only in (None, "load"):
            emit(asyncio.run(bench_load(cluster, args.load_groups)))
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
