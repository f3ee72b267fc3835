"""Consumer groups end to end: real clients subscribe, split partitions, commit and resume.

Group membership is the broker's group coordinator; committed offsets and group metadata are
records of `__consumer_offsets` (see `odradek.coordinator.group.metadata_manager`). The tests use
confluent-kafka (librdkafka), kafka-python, aiokafka and KafkaJS as users run them, plus raw
protocol requests (`_wire`) where the exact error code matters, and Kafka's own
`DumpLogSegments --offsets-decoder` to read what the coordinator wrote (when Kafka's jars are in
the cache `./dev kafka` fills). Every test runs on the shared `cluster3` with its own topic and
group names; coordinator failures are in `test_offsets_failover`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from odradek.coordinator.group import schemas
from odradek.coordinator.group.placement import OFFSETS_TOPIC, partition_for
from odradek.protocol.codec import ApiKey
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration import _wire
from tests.integration._clients import create_topic, unique_topic
from tests.integration._groups import (
    CLIENT_TIMEOUT_S,
    OFFSETS_PARTITIONS,
    Position,
    assigned,
    committed,
    find_coordinator,
    group_consumer,
    kafka_python_consumer,
    offsets_leader,
    poll_all,
    poll_until,
    produce,
    unique_group,
)
from tests.integration._kafka import kafka_available, kafka_libs

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
    bootstrap = cluster3.bootstrap_servers
    topic, group = unique_topic("groups-kp"), unique_group("kafka-python")
    create_topic(bootstrap, topic, partitions=2)

    def consume(count: int) -> list[Position]:
        consumer = kafka_python_consumer(
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
# Error codes, the store, admin APIs (raw protocol)


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
    metadata: str = "",
    epoch: int = -1,
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
                            "committed_leader_epoch": epoch,
                            "committed_metadata": metadata,
                        }
                    ],
                }
            ],
        },
    )
    return ErrorCode(answer.topics[0].partitions[0].error_code)


def fetch_offsets(
    connection: _wire.WireConnection, group: str, topic: str, partitions: list[int]
) -> tuple[ErrorCode, dict[int, tuple[int, int, str]]]:
    """OffsetFetch v5: (group error, partition -> (offset, leader epoch, metadata))."""
    answer = connection.request(
        ApiKey.OFFSET_FETCH,
        5,
        {"group_id": group, "topics": [{"name": topic, "partition_indexes": partitions}]},
    )
    offsets = {
        p.partition_index: (p.committed_offset, p.committed_leader_epoch, p.metadata)
        for t in answer.topics
        for p in t.partitions
    }
    return ErrorCode(answer.error_code), offsets


def stored_records(bootstrap: str, group: str) -> list[tuple[Any, Any]]:
    """The group's records in its `__consumer_offsets` partition, decoded (key, value or None)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_group("reader"),
            "enable.auto.commit": False,
        }
    )
    partition = partition_for(group, OFFSETS_PARTITIONS)
    consumer.assign([TopicPartition(OFFSETS_TOPIC, partition, 0)])
    _low, high = consumer.get_watermark_offsets(
        TopicPartition(OFFSETS_TOPIC, partition), timeout=CLIENT_TIMEOUT_S
    )
    records = []
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    try:
        while True:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                key = schemas.decode_key(message.key())
                if key is not None and key.group == group:
                    value_type = (
                        schemas.OffsetCommitValue
                        if isinstance(key, schemas.OffsetCommitKey)
                        else schemas.GroupMetadataValue
                    )
                    value = message.value()
                    records.append(
                        (key, None if value is None else schemas.decode(value_type, value))
                    )
                if message.offset() >= high - 1:
                    return records
            assert time.monotonic() < deadline, f"read only {records} of {OFFSETS_TOPIC}"
    finally:
        consumer.close()


def test_the_store_its_errors_and_group_admin(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic, group = unique_topic("groups-wire"), unique_group("wire")
    create_topic(bootstrap, topic, partitions=1)
    coordinator_id = find_coordinator(bootstrap, group)
    # The coordinator is the leader of the group's offsets partition, as in Kafka.
    assert coordinator_id == offsets_leader(bootstrap, group)
    other_id = next(b for b in cluster3.broker_ids if b != coordinator_id)
    with _wire.WireConnection.to(cluster3.broker(other_id).bootstrap) as elsewhere:
        # v4 batches keys (KIP-699); any broker answers.
        batched = elsewhere.request(
            ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group, "other"]}
        )
        assert [(c.key, c.error_code, c.node_id) for c in batched.coordinators] == [
            (group, ErrorCode.none, coordinator_id),
            ("other", ErrorCode.none, offsets_leader(bootstrap, "other")),
        ]
        transactional = elsewhere.request(
            ApiKey.FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": ["txn"]}
        )
        # Key type 1 finds transaction coordinators (tests/integration/test_transactions.py);
        # the first ask may find `__transaction_state` still being created.
        assert transactional.coordinators[0].error_code in (
            ErrorCode.none,
            ErrorCode.coordinator_not_available,
        )
        assert fetch_offsets(elsewhere, group, topic, [0])[0] == ErrorCode.not_coordinator
        # Clients may not write to the internal topic.
        refused = _wire.produce(elsewhere, OFFSETS_TOPIC, 0, _wire_batch(), acks=1)
        assert refused.error_code == ErrorCode.invalid_topic_exception
    with _wire.WireConnection.to(cluster3.broker(coordinator_id).bootstrap) as connection:
        # Never committed: -1.
        assert fetch_offsets(connection, group, topic, [0]) == (ErrorCode.none, {0: (-1, -1, "")})
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
        assert commit_error(connection, group, member, generation, topic, 0, "x" * 5000) == (
            ErrorCode.offset_metadata_too_large
        )
        assert (
            commit_error(connection, group, member, generation, topic, 42, "checkpoint", 3)
            == ErrorCode.none
        )
        # OffsetFetch returns the committed metadata and leader epoch.
        assert fetch_offsets(connection, group, topic, [0, 7]) == (
            ErrorCode.none,
            {0: (42, 3, "checkpoint"), 7: (-1, -1, "")},
        )
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

        # What the log holds: Kafka's records, in Kafka's order (metadata of generation 1, the
        # commit, the Empty generation 2).
        # (The Empty generation is stored after LeaveGroup answered: wait until it is replicated.)
        def three_records() -> list[tuple[Any, Any]] | None:
            found = stored_records(bootstrap, group)
            return found if len(found) >= 3 else None

        records = wait_until(three_records, CLIENT_TIMEOUT_S, "three records of the group")
        kinds = [(type(k).__name__, type(v).__name__) for k, v in records]
        assert kinds == [
            ("GroupMetadataKey", "GroupMetadataValue"),
            ("OffsetCommitKey", "OffsetCommitValue"),
            ("GroupMetadataKey", "GroupMetadataValue"),
        ]
        generation_one, commit, emptied = (v for _k, v in records)
        assert (generation_one.generation, generation_one.protocol, generation_one.leader) == (
            1,
            "range",
            member,
        )
        assert [m.assignment for m in generation_one.members] == [b"mine"]
        assert records[1][0] == schemas.OffsetCommitKey(group, topic, 0)
        assert (commit.offset, commit.leader_epoch, commit.metadata) == (42, 3, "checkpoint")
        assert (emptied.generation, emptied.members) == (2, ())
        # OffsetDelete, then DeleteGroups: tombstones.
        removed = connection.request(
            ApiKey.OFFSET_DELETE,
            0,
            {
                "group_id": group,
                "topics": [{"name": topic, "partitions": [{"partition_index": 0}]}],
            },
        )
        assert (removed.error_code, removed.topics[0].partitions[0].error_code) == (
            ErrorCode.none,
            ErrorCode.none,
        )
        assert fetch_offsets(connection, group, topic, [0])[1] == {0: (-1, -1, "")}
        deleted = connection.request(ApiKey.DELETE_GROUPS, 2, {"groups_names": [group]})
        assert deleted.results[0].error_code == ErrorCode.none
        # Tombstones are appended with acks=1 (as Kafka does): readers see them once replicated.
        tombstones = [
            (schemas.OffsetCommitKey(group, topic, 0), None),
            (schemas.GroupMetadataKey(group), None),
        ]
        wait_until(
            lambda: stored_records(bootstrap, group)[-2:] == tombstones,
            CLIENT_TIMEOUT_S,
            "the tombstones in the offsets topic",
        )
        described = connection.request(ApiKey.DESCRIBE_GROUPS, 5, {"groups": [group]})
        assert described.groups[0].group_state == "Dead"


def _wire_batch() -> bytes:
    from odradek.protocol.record_batch import build_batch

    return build_batch([(b"k", b"v", (), int(time.time() * 1000))])


def test_pipelined_async_commits_leave_the_last_one(cluster3: LocalCluster) -> None:
    """librdkafka pipelines asynchronous OffsetCommits on one connection; the last one acknowledged
    must be what OffsetFetch returns afterwards (a defect of the ZooKeeper store: later commits
    were overtaken by earlier ones)."""
    from confluent_kafka import Consumer

    bootstrap = cluster3.bootstrap_servers
    topic, group = unique_topic("groups-async"), unique_group("async")
    create_topic(bootstrap, topic, partitions=1)
    find_coordinator(bootstrap, group)
    acknowledged: list[int] = []

    def on_commit(error: Any, partitions: list[TopicPartition]) -> None:
        assert error is None, error
        acknowledged.extend(p.offset for p in partitions)

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "on_commit": on_commit,
        }
    )
    try:
        for offset in range(1, 301):
            consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=True)
        wait_until_polled(consumer, lambda: len(acknowledged) == 300)
        assert acknowledged[-1] == 300 or max(acknowledged) == 300
        found = consumer.committed([TopicPartition(topic, 0)], timeout=CLIENT_TIMEOUT_S)
        assert found[0].offset == 300
    finally:
        consumer.close()
    assert committed(bootstrap, group, topic, 1) == {0: 300}


def wait_until_polled(consumer: Any, condition: Any) -> None:
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, "commit callbacks did not all arrive"
        consumer.poll(0.1)


def test_kafkas_dump_log_segments_reads_the_offsets_topic(cluster3: LocalCluster) -> None:
    """Kafka's own tool (`kafka-dump-log.sh --offsets-decoder`) decodes the segment the
    coordinator wrote: the same keys, offsets, metadata and group generation."""
    libs = kafka_libs()
    if not kafka_available() or shutil.which("java") is None:
        pytest.skip(f"Apache Kafka's jars are not in {libs} (./dev kafka fetches them)")
    bootstrap = cluster3.bootstrap_servers
    topic, group = unique_topic("groups-dump"), unique_group("dump")
    create_topic(bootstrap, topic, partitions=1)
    coordinator_id = find_coordinator(bootstrap, group)
    with _wire.WireConnection.to(cluster3.broker(coordinator_id).bootstrap) as connection:
        member, generation = join_and_sync(connection, group)
        assert commit_error(connection, group, member, generation, topic, 17, "m-17", 2) == (
            ErrorCode.none
        )
    partition = partition_for(group, OFFSETS_PARTITIONS)
    directory = cluster3.broker(coordinator_id).data_dir / f"{OFFSETS_TOPIC}-{partition}"
    segments = sorted(str(p) for p in directory.glob("*.log"))
    run = subprocess.run(
        [
            "java",
            "-cp",
            f"{libs}/*",
            "kafka.tools.DumpLogSegments",
            "--offsets-decoder",
            "--print-data-log",
            "--files",
            ",".join(segments),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if group in line]
    offset_line = next(line for line in lines if '"type":"1"' in line or "offset_commit" in line)
    assert f'"topic":"{topic}"' in offset_line and '"offset":17' in offset_line, offset_line
    assert '"metadata":"m-17"' in offset_line and '"leaderEpoch":2' in offset_line, offset_line
    group_line = next(line for line in lines if '"generation":1' in line)
    assert '"protocol":"range"' in group_line and member in group_line, group_line
