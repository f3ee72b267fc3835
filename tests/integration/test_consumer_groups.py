"""Consumer groups end to end: real clients subscribe, split partitions, commit and resume.

Group membership is the broker's group coordinator; committed offsets are znodes under
`/consumers/<group>/offsets/<topic>/<partition>` (see `odradek.coordinator.group.offset_store`). The tests use
confluent-kafka (librdkafka), kafka-python, aiokafka and KafkaJS as users run them, plus raw
protocol requests (`_wire`) where the exact error code matters. Every test but the coordinator
kill runs on the shared `cluster3` with its own topic and group names.

Consumers heartbeat every 500 ms (instead of 3 s) so that rebalances take a second, not ten; the
brokers' `group.initial.rebalance.delay.ms` is 0 in local clusters. Waits are deadlines.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient
from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration import _wire
from tests.integration._clients import create_topic, unique_topic

CLIENT_TIMEOUT_S = 60.0
FAST_GROUP = {"heartbeat.interval.ms": 500, "session.timeout.ms": 6000}

Position = tuple[int, int]  # (partition, offset)


def unique_group(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def produce(bootstrap: str, topic: str, per_partition: dict[int, int], tag: str) -> None:
    """Write `count` records to each partition (acks=all), values "<tag>-<partition>-<i>"."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False}
    )
    failures: list[Any] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    for partition, count in per_partition.items():
        for i in range(count):
            producer.produce(
                topic,
                value=f"{tag}-{partition}-{i}".encode(),
                partition=partition,
                on_delivery=on_delivery,
            )
            producer.poll(0)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0, "records left undelivered"
    assert not failures, f"delivery failures: {failures}"


def group_consumer(bootstrap: str, group: str, topic: str, **overrides: Any) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **FAST_GROUP,
            **overrides,
        }
    )
    consumer.subscribe([topic])
    return consumer


def assigned(consumer: Consumer) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def poll_all(consumers: Iterable[Consumer], wanted: int, got: dict[int, list[Position]]) -> None:
    """Poll `consumers` in turn until `wanted` records arrived between them (into `got`, keyed by
    the consumer's index)."""
    consumers = list(consumers)
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while sum(len(v) for v in got.values()) < wanted:
        assert time.monotonic() < deadline, f"only {got} of {wanted} records arrived"
        for index, consumer in enumerate(consumers):
            message = consumer.poll(0.1)
            if message is None:
                continue
            assert message.error() is None, f"consumer error: {message.error()}"
            got.setdefault(index, []).append((message.partition(), message.offset()))


def poll_until(consumers: Iterable[Consumer], condition: Any, message: str) -> None:
    """Keep the consumers polling (it drives their group protocol) until `condition()` holds."""
    consumers = list(consumers)

    def step() -> bool:
        for consumer in consumers:
            polled = consumer.poll(0.1)
            assert polled is None, (
                f"unexpected record or error: {polled.error() or polled.offset()}"
            )
        return bool(condition())

    wait_until(step, CLIENT_TIMEOUT_S, message)


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets as confluent-kafka's OffsetFetch reads them (-1001: none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=CLIENT_TIMEOUT_S
        )
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


def find_coordinator(bootstrap: str, group: str) -> int:
    """The group's coordinator as the first broker of `bootstrap` answers FindCoordinator v3."""
    with _wire.WireConnection.to(bootstrap.split(",")[0]) as connection:
        answer = connection.request(ApiKey.FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
    assert answer.error_code == ErrorCode.none, answer
    return int(answer.node_id)


# ---------------------------------------------------------------------------------------------
# confluent-kafka: split, exactly once, commit, leave, resume


def test_confluent_group_splits_commits_rebalances_and_resumes(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic, group = unique_topic("groups"), unique_group("split")
    create_topic(bootstrap, topic, partitions=6)
    first, second = (group_consumer(bootstrap, group, topic) for _ in range(2))
    try:
        # 1. Both members hold partitions, none twice.
        poll_until(
            (first, second),
            lambda: (
                assigned(first)
                and assigned(second)
                and not assigned(first) & assigned(second)
                and assigned(first) | assigned(second) == set(range(6))
            ),
            "the two consumers to split the six partitions",
        )
        owned = {0: assigned(first), 1: assigned(second)}
        # The admin client sees the same group through ListGroups and DescribeGroups.
        admin = AdminClient({"bootstrap.servers": bootstrap})
        listed = admin.list_consumer_groups().result(CLIENT_TIMEOUT_S)
        assert group in {g.group_id for g in listed.valid}
        description = admin.describe_consumer_groups([group])[group].result(CLIENT_TIMEOUT_S)
        assert description.state is ConsumerGroupState.STABLE
        described = [
            sorted(tp.partition for tp in m.assignment.topic_partitions)
            for m in description.members
        ]
        assert sorted(described) == sorted(sorted(partitions) for partitions in owned.values())
        # 2. Everything produced is consumed exactly once between them, each from its own.
        produce(bootstrap, topic, dict.fromkeys(range(6), 20), "a")
        got: dict[int, list[Position]] = {}
        poll_all((first, second), 120, got)
        everything = [p for positions in got.values() for p in positions]
        assert sorted(everything) == [(p, o) for p in range(6) for o in range(20)]
        for index, positions in got.items():
            assert {p for p, _ in positions} <= owned[index]
        first.commit(asynchronous=False)
        second.commit(asynchronous=False)
        assert committed(bootstrap, group, topic, 6) == dict.fromkeys(range(6), 20)
        # 3. A member leaves: the other takes over its partitions at their committed offsets.
        second.close()
        poll_until((first,), lambda: assigned(first) == set(range(6)), "the survivor to own all")
        produce(bootstrap, topic, dict.fromkeys(range(6), 5), "b")
        got = {}
        poll_all((first,), 30, got)
        assert sorted(got[0]) == [(p, o) for p in range(6) for o in range(20, 25)]
        first.commit(asynchronous=False)
    finally:
        first.close()
        second.close()
    # 4. A new member of the group resumes from the committed offsets: nothing re-read, nothing
    # skipped.
    assert committed(bootstrap, group, topic, 6) == dict.fromkeys(range(6), 25)
    produce(bootstrap, topic, dict.fromkeys(range(6), 3), "c")
    third = group_consumer(bootstrap, group, topic)
    try:
        got = {}
        poll_all((third,), 18, got)
        assert sorted(got[0]) == [(p, o) for p in range(6) for o in range(25, 28)]
    finally:
        third.close()


# ---------------------------------------------------------------------------------------------
# kafka-python and aiokafka: subscribe, commit, resume


def test_kafka_python_group_commits_and_resumes(cluster3: LocalCluster) -> None:
    from kafka import KafkaConsumer

    bootstrap = cluster3.bootstrap_servers
    topic, group = unique_topic("groups-kp"), unique_group("kafka-python")
    create_topic(bootstrap, topic, partitions=2)

    def consume(count: int) -> list[Position]:
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            heartbeat_interval_ms=500,
            session_timeout_ms=6000,
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

    produce(bootstrap, topic, {0: 4, 1: 4}, "a")
    assert sorted(consume(8)) == [(p, o) for p in range(2) for o in range(4)]
    assert committed(bootstrap, group, topic, 2) == {0: 4, 1: 4}
    produce(bootstrap, topic, {0: 2, 1: 2}, "b")
    assert sorted(consume(4)) == [(p, o) for p in range(2) for o in range(4, 6)]


def test_aiokafka_group_commits_and_resumes(cluster3: LocalCluster) -> None:
    from aiokafka import AIOKafkaConsumer

    bootstrap = cluster3.bootstrap_servers
    topic, group = unique_topic("groups-aio"), unique_group("aiokafka")
    create_topic(bootstrap, topic, partitions=2)

    async def consume(count: int) -> list[Position]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            heartbeat_interval_ms=500,
            session_timeout_ms=6000,
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

    produce(bootstrap, topic, {0: 3, 1: 3}, "a")
    assert sorted(asyncio.run(consume(6))) == [(p, o) for p in range(2) for o in range(3)]
    assert committed(bootstrap, group, topic, 2) == {0: 3, 1: 3}
    produce(bootstrap, topic, {0: 2, 1: 2}, "b")
    assert sorted(asyncio.run(consume(4))) == [(p, o) for p in range(2) for o in range(3, 5)]


# ---------------------------------------------------------------------------------------------
# KafkaJS

KAFKAJS_CONSUMER = """
const { Kafka, logLevel } = require('kafkajs');
const [brokers, topic, groupId, count] = process.argv.slice(2);
const kafka = new Kafka({ clientId: 'odradek-test', brokers: brokers.split(','),
                          logLevel: logLevel.ERROR });
const consumer = kafka.consumer({ groupId, heartbeatInterval: 500, sessionTimeout: 6000 });
(async () => {
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const seen = [];
  await new Promise((resolve, reject) => {
    consumer.run({ eachMessage: async ({ partition, message }) => {
      seen.push([partition, Number(message.offset)]);
      if (seen.length >= Number(count)) resolve();
    } }).catch(reject);
  });
  await consumer.disconnect();  // commits what it consumed, then leaves the group
  console.log(JSON.stringify(seen));
})().catch((e) => { console.error(e); process.exit(1); });
"""


@pytest.fixture(scope="session")
def kafkajs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with KafkaJS installed from the npm registry and the consumer script."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("Node.js and npm are not installed")
    directory = tmp_path_factory.mktemp("kafkajs")
    try:
        installed = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--silent", "kafkajs@2"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm could not install kafkajs within 180 s (registry unreachable?)")
    if installed.returncode != 0:
        pytest.skip(f"npm could not install kafkajs: {installed.stderr.strip()[-500:]}")
    (directory / "consume.js").write_text(KAFKAJS_CONSUMER)
    return directory


def test_kafkajs_consumer_group(cluster3: LocalCluster, kafkajs: Path) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic, group = unique_topic("groups-js"), unique_group("kafkajs")
    create_topic(bootstrap, topic, partitions=3)
    produce(bootstrap, topic, dict.fromkeys(range(3), 4), "js")
    run = subprocess.run(
        ["node", "consume.js", bootstrap, topic, group, "12"],
        cwd=kafkajs,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(map(tuple, seen)) == [(p, o) for p in range(3) for o in range(4)]
    assert committed(bootstrap, group, topic, 3) == dict.fromkeys(range(3), 4)


# ---------------------------------------------------------------------------------------------
# Error codes, storage format, admin APIs (raw protocol)


def join_and_sync(connection: _wire.WireConnection, group: str) -> tuple[str, int]:
    """A one-member group through JoinGroup v5 (KIP-394 round trip) and SyncGroup v3."""
    values = {
        "group_id": group,
        "session_timeout": 10_000,
        "rebalance_timeout": 10_000,
        "member_id": "",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"\x00"}],
    }
    first = connection.request(ApiKey.JOIN_GROUP, 5, values)
    assert first.error_code == ErrorCode.member_id_required
    joined = connection.request(ApiKey.JOIN_GROUP, 5, {**values, "member_id": first.member_id})
    assert joined.error_code == ErrorCode.none
    assert (joined.leader, joined.generation_id) == (first.member_id, 1)
    synced = connection.request(
        ApiKey.SYNC_GROUP,
        3,
        {
            "group_id": group,
            "generation_id": 1,
            "member_id": joined.member_id,
            "group_instance_id": None,
            "assignments": [{"member_id": joined.member_id, "assignment": b"mine"}],
        },
    )
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"mine")
    return joined.member_id, 1


def commit_error(
    connection: _wire.WireConnection,
    group: str,
    member: str,
    generation: int,
    topic: str,
    offset: int,
) -> ErrorCode:
    answer = connection.request(
        ApiKey.OFFSET_COMMIT,
        7,
        {
            "group_id": group,
            "generation_id_or_member_epoch": generation,
            "member_id": member,
            "group_instance_id": None,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": offset,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        }
                    ],
                }
            ],
        },
    )
    return ErrorCode(answer.topics[0].partitions[0].error_code)


def fetch_offsets(
    connection: _wire.WireConnection, group: str, topic: str, partitions: list[int]
) -> tuple[ErrorCode, dict[int, int]]:
    answer = connection.request(
        ApiKey.OFFSET_FETCH,
        5,
        {"group_id": group, "topics": [{"name": topic, "partition_indexes": partitions}]},
    )
    offsets = {p.partition_index: p.committed_offset for t in answer.topics for p in t.partitions}
    return ErrorCode(answer.error_code), offsets


def test_commit_errors_storage_and_group_admin(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic, group = unique_topic("groups-wire"), unique_group("wire")
    create_topic(bootstrap, topic, partitions=1)
    coordinator_id = find_coordinator(bootstrap, group)
    other_id = next(b for b in cluster3.broker_ids if b != coordinator_id)
    with _wire.WireConnection.to(cluster3.broker(other_id).bootstrap) as elsewhere:
        # v4 batches keys (KIP-699); any broker answers; there are no transaction coordinators.
        batched = elsewhere.request(
            ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group, "other"]}
        )
        assert [(c.key, c.error_code, c.node_id) for c in batched.coordinators] == [
            (group, ErrorCode.none, coordinator_id),
            ("other", ErrorCode.none, find_coordinator(bootstrap, "other")),
        ]
        transactional = elsewhere.request(
            ApiKey.FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": ["txn"]}
        )
        assert transactional.coordinators[0].error_code == ErrorCode.invalid_request
    with _wire.WireConnection.to(cluster3.broker(other_id).bootstrap) as elsewhere:
        assert fetch_offsets(elsewhere, group, topic, [0])[0] == ErrorCode.not_coordinator
    with _wire.WireConnection.to(cluster3.broker(coordinator_id).bootstrap) as connection:
        # Never committed: -1.
        assert fetch_offsets(connection, group, topic, [0]) == (ErrorCode.none, {0: -1})
        # A generation of a group this coordinator does not have.
        assert commit_error(connection, group, "m", 3, topic, 5) == ErrorCode.illegal_generation
        member, generation = join_and_sync(connection, group)
        assert commit_error(connection, group, "bogus", generation, topic, 5) == (
            ErrorCode.unknown_member_id
        )
        assert commit_error(connection, group, member, generation + 1, topic, 5) == (
            ErrorCode.illegal_generation
        )
        assert commit_error(connection, group, member, generation, "no-such-topic", 5) == (
            ErrorCode.unknown_topic_or_partition
        )
        assert commit_error(connection, group, member, generation, topic, 42) == ErrorCode.none
        assert fetch_offsets(connection, group, topic, [0, 7]) == (
            ErrorCode.none,
            {0: 42, 7: -1},
        )
        # Stored as Kafka 0.8 did: the offset as text in /consumers/<group>/offsets/<topic>/<p>.
        zk = KazooClient(hosts=cluster3.zookeeper_connect)
        zk.start(timeout=15)
        try:
            data, _ = zk.get(f"/consumers/{group}/offsets/{topic}/0")
        finally:
            zk.stop()
            zk.close()
        assert data == b"42"
        described = connection.request(ApiKey.DESCRIBE_GROUPS, 5, {"groups": [group]})
        (state,) = described.groups
        assert (state.group_state, state.protocol_data) == ("Stable", "range")
        assert [m.member_assignment for m in state.members] == [b"mine"]
        deleted = connection.request(ApiKey.DELETE_GROUPS, 2, {"groups_names": [group]})
        assert deleted.results[0].error_code == ErrorCode.non_empty_group
        left = connection.request(
            ApiKey.LEAVE_GROUP,
            3,
            {"group_id": group, "members": [{"member_id": member, "group_instance_id": None}]},
        )
        assert (left.error_code, left.members[0].error_code) == (ErrorCode.none, ErrorCode.none)
        listed = connection.request(ApiKey.LIST_GROUPS, 4, {"states_filter": ["Empty"]})
        assert (group, "Empty") in {(g.group_id, g.group_state) for g in listed.groups}
        deleted = connection.request(ApiKey.DELETE_GROUPS, 2, {"groups_names": [group]})
        assert deleted.results[0].error_code == ErrorCode.none
        assert fetch_offsets(connection, group, topic, [0]) == (ErrorCode.none, {0: -1})


# ---------------------------------------------------------------------------------------------
# The coordinator dies


def test_group_moves_when_its_coordinator_dies(make_cluster: Any) -> None:
    cluster = make_cluster(3)
    topic, group = "moving", unique_group("moving")
    create_topic(cluster.bootstrap_servers, topic, partitions=3, replication_factor=3)
    coordinator_id = find_coordinator(cluster.bootstrap_servers, group)
    survivors = ",".join(
        cluster.broker(b).bootstrap for b in cluster.broker_ids if b != coordinator_id
    )
    produce(cluster.bootstrap_servers, topic, dict.fromkeys(range(3), 10), "before")
    consumer = group_consumer(survivors, group, topic)
    try:
        got: dict[int, list[Position]] = {}
        poll_all((consumer,), 30, got)
        assert sorted(got[0]) == [(p, o) for p in range(3) for o in range(10)]
        consumer.commit(asynchronous=False)
        cluster.kill(coordinator_id)

        def moved() -> bool:
            try:
                return find_coordinator(survivors, group) != coordinator_id
            except (OSError, _wire.ConnectionClosed, _wire.NoAnswer):
                return False

        wait_until(moved, CLIENT_TIMEOUT_S, "the group to move to a live coordinator")
        # Consumption continues from the committed offsets, through the new coordinator.
        produce(survivors, topic, dict.fromkeys(range(3), 5), "after")
        got = {}
        poll_all((consumer,), 15, got)
        assert sorted(got[0]) == [(p, o) for p in range(3) for o in range(10, 15)]
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert committed(survivors, group, topic, 3) == dict.fromkeys(range(3), 15)
