"""Offsets and group metadata through broker failures, on a private 3-broker cluster shared by
the tests of this module (each kills one broker and brings it back before it ends).

* A group's coordinator is the leader of its `__consumer_offsets` partition. SIGKILL it: the
  controller elects another leader, that broker loads the partition, and groups of all three
  client libraries (confluent-kafka, kafka-python at its defaults but `enable_idempotence=False`,
  aiokafka) carry on from their committed offsets — no committed offset lost, none moving
  backwards while a monitor reads them through the failover — and the live confluent consumer
  keeps its generation and assignment (no rebalance: the new coordinator loaded its members).
  Moving the leadership back (preferred election after the restart) moves the coordinator back,
  again with the group intact.
* DeleteRecords moves the log start offset on the leader and its followers: after SIGKILLing the
  leader right after the answer, the new leader already starts there, and so does the old one
  once restarted.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient

from odradek.coordinator.group.placement import OFFSETS_TOPIC, partition_for
from odradek.testing import LocalCluster
from tests.fixtures.cluster import START_TIMEOUT_S, _bring_down, _used_clusters, wait_until
from tests.integration import _wire
from tests.integration._clients import create_topic, unique_topic, wait_until_serving
from tests.integration._groups import (
    CLIENT_TIMEOUT_S,
    OFFSETS_PARTITIONS,
    Position,
    find_coordinator,
    group_consumer,
    group_on,
    kafka_python_consumer,
    offsets_leader,
    poll_all,
    produce,
)


@pytest.fixture(scope="module")
def failover_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster.up(
        tmp_path_factory.mktemp("offsets-failover"), 3, timeout=START_TIMEOUT_S
    )
    try:
        yield cluster
    finally:
        _bring_down(cluster)


@pytest.fixture(autouse=True)
def _report_logs(failover_cluster: LocalCluster, request: pytest.FixtureRequest) -> None:
    """A failing test's report gets the tails of this module's broker logs."""
    _used_clusters(request.node).append(failover_cluster)


def survivors(cluster: LocalCluster, dead: int) -> str:
    return ",".join(cluster.broker(b).bootstrap for b in cluster.broker_ids if b != dead)


def committed_now(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed(
            [TopicPartition(topic, p) for p in range(3)], timeout=CLIENT_TIMEOUT_S
        )
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


class Monitor(threading.Thread):
    """Reads the groups' committed offsets over and over; records any that went backwards."""

    def __init__(self, bootstrap: str, groups: list[str], topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.groups, self.topic = bootstrap, groups, topic
        self.highest: dict[tuple[str, int], int] = {}
        self.backwards: list[str] = []
        self.reads = 0
        self.stop = threading.Event()

    def run(self) -> None:
        consumers = {
            g: Consumer({"bootstrap.servers": self.bootstrap, "group.id": g}) for g in self.groups
        }
        try:
            while not self.stop.is_set():
                for group, consumer in consumers.items():
                    try:
                        found = consumer.committed(
                            [TopicPartition(self.topic, p) for p in range(3)], timeout=2
                        )
                    except Exception:
                        continue  # the coordinator is moving: no answer is fine, a lower one not
                    self.reads += 1
                    for tp in found:
                        if tp.error is not None:
                            continue  # an error for the partition is no answer either
                        key = (group, tp.partition)
                        if tp.offset < self.highest.get(key, -1001):
                            self.backwards.append(f"{key}: {tp.offset} after {self.highest[key]}")
                        self.highest[key] = max(tp.offset, self.highest.get(key, -1001))
                time.sleep(0.1)
        finally:
            for consumer in consumers.values():
                consumer.close()


def kafka_python_round(bootstrap: str, group: str, topic: str, count: int) -> list[Position]:
    consumer = kafka_python_consumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        got: list[Position] = []
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while len(got) < count:
            assert time.monotonic() < deadline, f"kafka-python got only {got}"
            for records in consumer.poll(timeout_ms=200).values():
                got.extend((r.partition, r.offset) for r in records)
        consumer.commit()
        return got
    finally:
        consumer.close()


def aiokafka_round(bootstrap: str, group: str, topic: str, count: int) -> list[Position]:
    from aiokafka import AIOKafkaConsumer

    async def consume() -> list[Position]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            got: list[Position] = []
            deadline = time.monotonic() + CLIENT_TIMEOUT_S
            while len(got) < count:
                assert time.monotonic() < deadline, f"aiokafka got only {got}"
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    got.extend((r.partition, r.offset) for r in records)
            await consumer.commit()
            return got
        finally:
            await consumer.stop()

    return asyncio.run(consume())


def test_groups_commit_and_resume_across_a_sigkill_of_their_coordinator(
    failover_cluster: LocalCluster,
) -> None:
    cluster = failover_cluster
    bootstrap = cluster.bootstrap_servers
    wait_until_serving(bootstrap)
    topic = unique_topic("moving")
    create_topic(bootstrap, topic, partitions=3, replication_factor=3)
    victim = cluster.broker_ids[0]
    groups = {name: group_on(bootstrap, victim, name) for name in ("rdkafka", "kp", "aio")}
    alive = survivors(cluster, victim)
    produce(bootstrap, topic, dict.fromkeys(range(3), 10), "before")
    everything_before = [(p, o) for p in range(3) for o in range(10)]
    assignments: list[Any] = []
    # A session longer than the failover (ZooKeeper notices the kill after its 6 s session, then
    # the partition moves and loads): the member must not time out on the client side.
    consumer = group_consumer(alive, groups["rdkafka"], topic, **{"session.timeout.ms": 30_000})
    consumer.subscribe([topic], on_assign=lambda _c, parts: assignments.append(parts))
    monitor = Monitor(alive, list(groups.values()), topic)
    try:
        got: dict[int, list[Position]] = {}
        poll_all((consumer,), 30, got)
        assert sorted(got[0]) == everything_before
        consumer.commit(asynchronous=False)
        assert sorted(kafka_python_round(alive, groups["kp"], topic, 30)) == everything_before
        assert sorted(aiokafka_round(alive, groups["aio"], topic, 30)) == everything_before
        for group in groups.values():
            assert committed_now(alive, group, topic) == dict.fromkeys(range(3), 10)
        monitor.start()
        cluster.kill(victim)

        def moved() -> bool:
            try:
                return all(find_coordinator(alive, g, timeout=2) != victim for g in groups.values())
            except AssertionError:
                return False

        wait_until(moved, CLIENT_TIMEOUT_S, "every group to move to a live coordinator")
        assert all(offsets_leader(alive, g) != victim for g in groups.values())
        # Consumption continues from the committed offsets, through the new coordinator.
        produce(alive, topic, dict.fromkeys(range(3), 5), "after")
        everything_after = [(p, o) for p in range(3) for o in range(10, 15)]
        got = {}
        poll_all((consumer,), 15, got)
        assert sorted(got[0]) == everything_after
        consumer.commit(asynchronous=False)
        assert sorted(kafka_python_round(alive, groups["kp"], topic, 15)) == everything_after
        assert sorted(aiokafka_round(alive, groups["aio"], topic, 15)) == everything_after
        for group in groups.values():
            assert committed_now(alive, group, topic) == dict.fromkeys(range(3), 15)
        # The live member kept its generation: no second assignment through the failover.
        assert len(assignments) == 1
        # Back: the killed broker returns, becomes the preferred leader of the offsets
        # partitions again, and the coordinator moves back with the group intact.
        cluster.start_broker(victim)
        partitions = sorted({partition_for(g, OFFSETS_PARTITIONS) for g in groups.values()})
        admin = AdminClient({"bootstrap.servers": bootstrap})

        def led_again() -> bool:
            try:
                admin.elect_leaders(
                    ElectionType.PREFERRED, [TopicPartition(OFFSETS_TOPIC, p) for p in partitions]
                ).result(10)
            except Exception:
                pass  # not yet in the ISR: PREFERRED_LEADER_NOT_AVAILABLE; try again
            return all(offsets_leader(bootstrap, g) == victim for g in groups.values())

        wait_until(led_again, CLIENT_TIMEOUT_S, "the restarted broker to lead again")
        wait_until(
            lambda: all(find_coordinator(bootstrap, g) == victim for g in groups.values()),
            CLIENT_TIMEOUT_S,
            "the coordinator to move back",
        )
        produce(bootstrap, topic, dict.fromkeys(range(3), 2), "back")
        got = {}
        poll_all((consumer,), 6, got)
        assert sorted(got[0]) == [(p, o) for p in range(3) for o in range(15, 17)]
        consumer.commit(asynchronous=False)
        assert committed_now(bootstrap, groups["rdkafka"], topic) == dict.fromkeys(range(3), 17)
        for group in (groups["kp"], groups["aio"]):
            assert committed_now(bootstrap, group, topic) == dict.fromkeys(range(3), 15)
        assert len(assignments) == 1
    finally:
        monitor.stop.set()
        consumer.close()
        if monitor.is_alive():
            monitor.join(10)
        cluster.start_broker(victim)
    assert monitor.reads > 0
    assert monitor.backwards == []


def test_delete_records_survives_a_leader_crash_and_restart(
    failover_cluster: LocalCluster,
) -> None:
    cluster = failover_cluster
    bootstrap = cluster.bootstrap_servers
    wait_until_serving(bootstrap)
    topic = unique_topic("trimmed")
    create_topic(bootstrap, topic, partitions=1, replication_factor=3)
    produce(bootstrap, topic, {0: 20}, "r")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.delete_records([TopicPartition(topic, 0, 8)]).values()
    assert future.result(CLIENT_TIMEOUT_S).low_watermark == 8
    leader = next(
        p.leader for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
    )
    cluster.kill(leader)  # right after the answer: the followers already moved too
    alive = survivors(cluster, leader)

    def earliest(server: str) -> int | None:
        try:
            with _wire.WireConnection.to(server.split(",")[0]) as connection:
                return _wire.list_offset(connection, topic, 0, _wire.EARLIEST)
        except (AssertionError, OSError, _wire.ConnectionClosed, _wire.NoAnswer):
            return None  # the leader moved to another broker, or not yet

    def new_leader_start() -> int | None:
        for server in alive.split(","):
            found = earliest(server)
            if found is not None:
                return found
        return None

    assert wait_until(new_leader_start, CLIENT_TIMEOUT_S, "a new leader") == 8
    # Below the log start: OFFSET_OUT_OF_RANGE; a consumer from the beginning starts at 8.
    consumer = Consumer(
        {"bootstrap.servers": alive, "group.id": "none", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, -2)])  # OFFSET_BEGINNING
        message = wait_until(lambda: consumer.poll(0.5), CLIENT_TIMEOUT_S, "a record")
        assert message.error() is None and message.offset() == 8
    finally:
        consumer.close()
    cluster.start_broker(leader)
    checkpoint = cluster.broker(leader).data_dir / "log-start-offset-checkpoint"
    assert f"{topic} 0 8" in checkpoint.read_text().splitlines()

    def preferred_again() -> bool:
        try:
            admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(10)
        except Exception:
            pass
        partition = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
        return partition.leader == leader

    wait_until(preferred_again, CLIENT_TIMEOUT_S, "the restarted broker to lead again")
    assert earliest(cluster.broker(leader).bootstrap) == 8
