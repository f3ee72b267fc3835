"""The failover benches' cluster (`bench/failover.py`; `bench/idle_cpu.py` uses the set-up too):
starting a local cluster for one measurement, creating partitions with explicit assignments, and
watching it -- each broker's Metadata (leaders and ISRs), the controller's logs, the registrations
in ZooKeeper -- plus the benches' output lines. Never part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from scratch import temporary_directory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from odradek.errors import OdradekError
from odradek.network.client import BrokerConnection
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class
from odradek.testing import LocalBroker, LocalCluster

METADATA_VERSION = 12
POLL_S = 0.1
SETUP_TIMEOUT_S = 1800.0
FAILOVER_LINE = re.compile(r"controller failover done in (?P<seconds>[0-9.]+)s: (?P<what>.*)")
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")

Partition = tuple[str, int]


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def note(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Metadata


async def _metadata(broker: LocalBroker, timeout: float) -> Any:
    """One broker's Metadata response for every topic."""
    connection = await BrokerConnection.connect(broker.host, broker.port, timeout=timeout)
    try:
        request = build(
            request_class(ApiKey.METADATA, METADATA_VERSION),
            {"topics": None, "allow_auto_topic_creation": False},
        )
        return await connection.send(ApiKey.METADATA, METADATA_VERSION, request, timeout)
    finally:
        connection.close()


async def _leaders(broker: LocalBroker, timeout: float) -> dict[Partition, int]:
    response = await _metadata(broker, timeout)
    return {
        (topic.name, int(p.partition_index)): int(p.leader_id)
        for topic in response.topics
        for p in topic.partitions
    }


def leaders(broker: LocalBroker, timeout: float = 60.0) -> dict[Partition, int] | None:
    """Partition -> leader in one broker's Metadata (every topic); None if it did not answer."""
    try:
        return asyncio.run(_leaders(broker, timeout))
    except OdradekError:
        return None


class BenchTimeout(Exception):
    """A measured step did not complete in time: reported as the measurement's result."""


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until `condition()`; the perf_counter time at which it first held."""
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            raise BenchTimeout(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL_S)
    return time.perf_counter()


async def _partition_views(
    broker: LocalBroker, timeout: float
) -> dict[Partition, tuple[int, tuple[int, ...]]]:
    response = await _metadata(broker, timeout)
    return {
        (topic.name, int(p.partition_index)): (int(p.leader_id), tuple(p.isr_nodes))
        for topic in response.topics
        for p in topic.partitions
    }


def partition_views(
    broker: LocalBroker, timeout: float = 60.0
) -> dict[Partition, tuple[int, tuple[int, ...]]] | None:
    """Partition -> (leader, ISR) in one broker's Metadata; None if it did not answer."""
    try:
        return asyncio.run(_partition_views(broker, timeout))
    except OdradekError:
        return None


def all_in_sync(broker: LocalBroker, partitions: set[Partition], rf: int) -> bool:
    """Every partition has all `rf` replicas in its ISR in `broker`'s Metadata. Waited for before
    a kill: on a loaded machine, followers still catching up on thousands of new partitions drop
    out of the ISR for a while, and a partition whose ISR is only the killed leader stays
    offline (clean election), which timed the bench out."""
    view = partition_views(broker)
    return view is not None and all(len(view.get(p, (-1, ()))[1]) >= rf for p in partitions)


# How long the last `all_led` poll took (its requests to every broker, concurrently): the
# resolution of a time measured with it, since the condition may have held that much earlier.
LAST_POLL_S: list[float] = [0.0]


async def _leaders_or_none(broker: LocalBroker, timeout: float) -> dict[Partition, int] | None:
    try:
        return await _leaders(broker, timeout)
    except OdradekError:
        return None


async def _all_leaders(
    brokers: list[LocalBroker], timeout: float
) -> list[dict[Partition, int] | None]:
    return list(await asyncio.gather(*(_leaders_or_none(b, timeout) for b in brokers)))


def all_led(
    brokers: Iterable[LocalBroker], partitions: set[Partition], ok: Callable[[int], bool]
) -> bool:
    """Every broker's Metadata shows every partition with a leader satisfying `ok` (the brokers
    asked at once; the poll's duration in LAST_POLL_S)."""
    started = time.perf_counter()
    views = asyncio.run(_all_leaders(list(brokers), 60.0))
    LAST_POLL_S[0] = time.perf_counter() - started
    return all(view is not None and all(ok(view.get(p, -1)) for p in partitions) for view in views)


# ---------------------------------------------------------------------------------------------
# Set-up


# For `broker` and `shutdown`: Kafka's default (the local cluster's is 10 s). On a loaded machine,
# followers of thousands of new partitions fall out of the ISR within 10 s, and a kill then leaves
# partitions whose only ISR member is the victim (offline: the bench timed out).
STEADY_ISR = {"replica.lag.time.max.ms": "30000"}


def start_cluster(
    args: argparse.Namespace, name: str, extra: dict[str, str] | None = None
) -> LocalCluster:
    base = args.dir or temporary_directory("odradek-bench-failover-")
    directory = base / f"{name}-{time.strftime('%H%M%S')}"
    overrides = {
        "zookeeper.session.timeout.ms": str(args.session_timeout_ms),
        "controlled.shutdown.max.retries": "10",
        "controller.socket.timeout.ms": "120000",
        **(extra or {}),
    }
    if getattr(args, "system", "odradek") == "kafka":
        from failover_kafka import KafkaCluster

        return KafkaCluster.up(directory, args.brokers, overrides)  # type: ignore[return-value]
    return LocalCluster.up(directory, args.brokers, overrides=overrides, timeout=300)


def create_partitions(
    cluster: LocalCluster, assignment: list[list[int]], topic_size: int, prefix: str
) -> set[Partition]:
    """Topics `<prefix>-<i>` of up to `topic_size` partitions with this assignment, in order;
    returns once every broker's Metadata shows a leader for every partition."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 2})
    created: set[Partition] = set()
    for index, start in enumerate(range(0, len(assignment), topic_size)):
        chunk = assignment[start : start + topic_size]
        topic = f"{prefix}-{index}"
        futures = admin.create_topics(
            [NewTopic(topic, num_partitions=len(chunk), replica_assignment=chunk)],
            operation_timeout=600,
            request_timeout=600,
        )
        futures[topic].result(timeout=900)
        created |= {(topic, p) for p in range(len(chunk))}
    wait_for(
        lambda: all_led(cluster.brokers, created, lambda leader: leader >= 0),
        SETUP_TIMEOUT_S,
        f"leaders for {len(created)} partitions",
    )
    return created


def assignment_led_by(leader: int, others: list[int], count: int, rf: int) -> list[list[int]]:
    """`count` partitions whose preferred (first) replica is `leader`; followers rotate."""
    return [[leader, *[others[(p + i) % len(others)] for i in range(rf - 1)]] for p in range(count)]


def assignment_spread(brokers: list[int], count: int, rf: int) -> list[list[int]]:
    """`count` partitions, preferred leaders round-robin over `brokers`."""
    n = len(brokers)
    return [[brokers[(p + i) % n] for i in range(rf)] for p in range(count)]


def log_offset(broker: LocalBroker) -> int:
    return broker.log.stat().st_size if broker.log.exists() else 0


def failover_line(broker: LocalBroker, since: int) -> dict[str, Any] | None:
    """The controller's own account of its failover, after `since` in its log: Odradek's
    "controller failover done in X s" line, or for Kafka the time from its "successfully elected
    as the controller" line to its "Ready to serve as the new controller" line."""
    with open(broker.log, "rb") as file:
        file.seek(since)
        text = file.read().decode(errors="replace")
    match = FAILOVER_LINE.search(text)
    if match:
        return {"seconds": float(match["seconds"]), "what": match["what"]}
    elected = ready = None
    for line in text.splitlines():
        if elected is None and "successfully elected as the controller" in line:
            elected = log_time(line)
        elif elected is not None and "Ready to serve as the new controller" in line:
            ready = log_time(line)
            break
    if elected is None or ready is None:
        return None
    return {"seconds": round(ready - elected, 3), "what": "Kafka: elected to ready to serve"}


def log_time(line: str) -> float | None:
    match = LOG_TIME.match(line)
    if match is None:
        return None
    return time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S")) + int(match[2]) / 1000


def controller_work_s(controller: LocalBroker, since: dict[str, int], trigger: str) -> float | None:
    """The controller's own share, from its logs: from the first main-log line containing
    `trigger` (after `since["log"]`) to the last state-change log line written after it."""
    with open(controller.log, "rb") as file:
        file.seek(since["log"])
        lines = file.read().decode(errors="replace").splitlines()
    start = next((log_time(line) for line in lines if trigger in line), None)
    state_change = controller.dir / "state-change.log"
    if not state_change.exists():  # Kafka: its lines say nothing this function looks for
        return None
    with open(state_change, "rb") as file:
        file.seek(since["state_change"])
        changes = file.read().decode(errors="replace").splitlines()
    times = [t for t in (log_time(line) for line in changes) if t is not None]
    if start is None or not times:
        return None
    return round(max(times) - start, 3)


def last_log_line_s(
    brokers: Iterable[LocalBroker],
    offsets: dict[int, int],
    started_wall: float,
    text: str = "LeaderAndIsr from controller",
) -> float | None:
    """When the last of `brokers` logged applying a LeaderAndIsr (its INFO line "LeaderAndIsr
    from controller ...", written once the roles are taken; with `text` "UpdateMetadata from
    controller", the line of an UpdateMetadata that moved leaders: from then on Metadata from that
    broker shows them), after each one's log offset, in seconds from `started_wall`
    (time.time()). Unlike a Metadata poll it does not wait for a busy broker to answer."""
    last = None
    for broker in brokers:
        with open(broker.log, "rb") as file:
            file.seek(offsets[broker.id])
            lines = file.read().decode(errors="replace").splitlines()
        times = [log_time(line) for line in lines if text in line]
        seen = [t for t in times if t is not None]
        if seen:
            last = max(seen) if last is None else max(last, max(seen))
    return None if last is None else round(last - started_wall, 3)


def log_offsets(broker: LocalBroker) -> dict[str, int]:
    state_change = broker.dir / "state-change.log"
    return {
        "log": log_offset(broker),
        "state_change": state_change.stat().st_size if state_change.exists() else 0,
    }


def registered(cluster: LocalCluster, broker_id: int) -> bool:
    try:
        return broker_id in cluster.registered_brokers()
    except OdradekError:
        return True  # unknown: keep waiting
