"""Incremental fetch sessions (KIP-227) on a real 3-broker cluster.

On the wire, against the partition's leader, with Fetch v12 (topic names) and v15 (topic ids): a
full request opens a session; an incremental request with nothing new is answered with no
partitions; after a produce it carries just that partition's records; partitions join a session
and are forgotten; a wrong epoch, an unknown session id and a session used across the v12/v13
boundary get INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_ID_NOT_FOUND and FETCH_SESSION_TOPIC_ID_ERROR,
and a closed session (epoch -1) is gone. Then the Java client (Kafka 3.9.1), kafka-python and
confluent-kafka read a topic with small fetch sizes, so that most of their records come in
incremental responses. Follower replication with sessions is covered by the replication and
fault suites (every fetcher uses a session).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.protocol.record_batch import build_batch
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration import _wire
from tests.integration._clients import create_topic, unique_topic
from tests.integration._kafka import kafka_libs, require_kafka

RECORDS_PER_PARTITION = 300
JAVA_CONSUMER = Path(__file__).parent / "java" / "ConsumeAll.java"


@pytest.fixture(scope="module")
def topic(cluster3: LocalCluster) -> dict[str, Any]:
    """A 3-partition RF=3 topic: its name, id, and each partition's leader connection string."""
    name = unique_topic("sessions")
    create_topic(cluster3.bootstrap_servers, name, partitions=3, replication_factor=3)
    with _wire.WireConnection.to(cluster3.bootstrap_servers) as connection:

        def described() -> Any:
            metadata = connection.request(
                ApiKey.METADATA,
                12,
                {"topics": [{"name": name}], "allow_auto_topic_creation": False},
            )
            (entry,) = metadata.topics
            ok = entry.error_code == ErrorCode.none and len(entry.partitions) == 3
            return entry if ok and all(p.leader_id >= 0 for p in entry.partitions) else None

        wait_until(lambda: described() is not None, 30, "the topic's leaders")
        entry = described()
    leaders = {
        p.partition_index: f"127.0.0.1:{cluster3.broker(p.leader_id).port}"
        for p in entry.partitions
    }
    return {"name": name, "id": entry.topic_id, "leaders": leaders}


def _fetch(
    connection: _wire.WireConnection,
    version: int,
    session_id: int,
    epoch: int,
    topic: dict[str, Any],
    partitions: dict[int, int],
    forget: list[int] = (),  # type: ignore[assignment]
) -> Any:
    topic_field = {"topic_id": topic["id"]} if version >= 13 else {"topic": topic["name"]}
    return connection.request(
        ApiKey.FETCH,
        version,
        {
            "replica_id": -1,
            "max_wait": 0,
            "min_bytes": 0,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": session_id,
            "session_epoch": epoch,
            "topics": [
                {
                    **topic_field,
                    "partitions": [
                        {
                            "partition": index,
                            "current_leader_epoch": -1,
                            "fetch_offset": offset,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20,
                        }
                        for index, offset in partitions.items()
                    ],
                }
            ]
            if partitions
            else [],
            "forgotten_topics_data": [{**topic_field, "partitions": list(forget)}]
            if forget
            else [],
            "rack_id": "",
        },
    )


def _partitions(response: Any) -> dict[int, Any]:
    return {p.partition_index: p for t in response.responses for p in t.partitions}


def _produce(topic: dict[str, Any], partition: int, values: list[bytes]) -> None:
    now_ms = int(time.time() * 1000)
    batch = build_batch([(None, value, (), now_ms) for value in values])
    with _wire.WireConnection.to(topic["leaders"][partition]) as connection:
        answer = _wire.produce(connection, topic["name"], partition, batch, acks=-1)
    assert answer.error_code == ErrorCode.none, answer


@pytest.mark.parametrize("version", [12, 15])
def test_incremental_fetches_answer_only_what_changed(topic: dict[str, Any], version: int) -> None:
    # One leader's partitions (a session lives on one broker).
    bootstrap = topic["leaders"][0]
    mine = [p for p, leader in topic["leaders"].items() if leader == bootstrap]
    with _wire.WireConnection.to(bootstrap) as connection:
        ends = {p: _wire.log_end_offset(bootstrap, topic["name"], p) for p in mine}
        full = _fetch(connection, version, 0, 0, topic, ends)
        assert full.error_code == ErrorCode.none
        session = full.session_id
        assert session != 0
        assert set(_partitions(full)) == set(mine)

        idle = _fetch(connection, version, session, 1, topic, {})
        assert idle.error_code == ErrorCode.none and idle.session_id == session
        assert _partitions(idle) == {}

        _produce(topic, mine[0], [b"a", b"b", b"c"])
        fresh = _fetch(connection, version, session, 2, topic, {})
        got = _partitions(fresh)
        assert list(got) == [mine[0]]
        assert got[mine[0]].high_watermark == ends[mine[0]] + 3
        assert len(bytes(got[mine[0]].records or b"")) > 0

        # The same fetch offset again: the records come again, the HW is unchanged.
        again = _fetch(connection, version, session, 3, topic, {})
        assert list(_partitions(again)) == [mine[0]]
        # Moving the fetch offset to the end: nothing new.
        moved = _fetch(connection, version, session, 4, topic, {mine[0]: ends[mine[0]] + 3})
        assert _partitions(moved) == {}

        # An unknown partition joins the session and answers its error every time.
        joined = _fetch(connection, version, session, 5, topic, {7: 0})
        assert _partitions(joined)[7].error_code == ErrorCode.unknown_topic_or_partition
        # Forgotten partitions are no longer read: produce to one, forget it, ask.
        _produce(topic, mine[0], [b"d"])
        forgot = _fetch(connection, version, session, 6, topic, {}, forget=[mine[0]])
        assert set(_partitions(forgot)) == {7}
        assert _partitions(forgot)[7].error_code == ErrorCode.unknown_topic_or_partition
        _fetch(connection, version, session, 7, topic, {mine[0]: ends[mine[0]] + 4})

        stale = _fetch(connection, version, session, 3, topic, {})
        assert stale.error_code == ErrorCode.invalid_fetch_session_epoch
        assert stale.session_id == 0 and _partitions(stale) == {}
        other = 12 if version >= 13 else 13
        crossed = _fetch(connection, other, session, 8, topic, {})
        assert crossed.error_code == ErrorCode.fetch_session_topic_id_error

        # Epoch -1 closes the session and answers without one.
        closing = _fetch(connection, version, session, -1, topic, ends)
        assert closing.error_code == ErrorCode.none and closing.session_id == 0
        assert set(_partitions(closing)) == set(mine)
        gone = _fetch(connection, version, session, 8, topic, {})
        assert gone.error_code == ErrorCode.fetch_session_id_not_found

        unknown = _fetch(connection, version, 0x7FFFFFF0, 1, topic, {})
        assert unknown.error_code == ErrorCode.fetch_session_id_not_found


def test_full_fetch_without_session_before_v7(topic: dict[str, Any]) -> None:
    bootstrap = topic["leaders"][0]
    with _wire.WireConnection.to(bootstrap) as connection:
        response = _fetch(connection, 6, 0, 0, topic, {0: 0})
        assert 0 in _partitions(response)


@pytest.fixture(scope="module")
def loaded_topic(cluster3: LocalCluster) -> tuple[str, set[bytes]]:
    """A 3-partition RF=3 topic holding RECORDS_PER_PARTITION small records per partition, in
    many batches (so that small fetches need many round trips)."""
    from confluent_kafka import Producer

    name = unique_topic("sessions-read")
    create_topic(cluster3.bootstrap_servers, name, partitions=3, replication_factor=3)
    producer = Producer(
        {
            "bootstrap.servers": cluster3.bootstrap_servers,
            "acks": "all",
            "linger.ms": 0,
            "batch.num.messages": 10,
        }
    )
    values = set()
    for partition in range(3):
        for i in range(RECORDS_PER_PARTITION):
            value = f"{partition}-{i}-{uuid.uuid4().hex}".encode()
            values.add(value)
            producer.produce(name, value, partition=partition)
        producer.flush(60)
    assert producer.flush(60) == 0
    return name, values


def test_kafka_python_reads_through_sessions(
    cluster3: LocalCluster, loaded_topic: tuple[str, set[bytes]]
) -> None:
    from kafka import KafkaConsumer

    name, values = loaded_topic
    consumer = KafkaConsumer(
        name,
        bootstrap_servers=cluster3.bootstrap_servers,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=512,
    )
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 60
        while len(got) < len(values) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(record.value for record in records)
    finally:
        consumer.close()
    assert sorted(got) == sorted(values)


def test_confluent_kafka_reads_through_sessions(
    cluster3: LocalCluster, loaded_topic: tuple[str, set[bytes]]
) -> None:
    from confluent_kafka import Consumer

    name, values = loaded_topic
    consumer = Consumer(
        {
            "bootstrap.servers": cluster3.bootstrap_servers,
            "group.id": f"sessions-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": 512,
        }
    )
    got: list[bytes] = []
    try:
        consumer.subscribe([name])
        deadline = time.monotonic() + 60
        while len(got) < len(values) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message.value())
    finally:
        consumer.close()
    assert sorted(got) == sorted(values)


def test_java_client_reads_through_sessions(
    cluster3: LocalCluster,
    loaded_topic: tuple[str, set[bytes]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    require_kafka()
    name, values = loaded_topic
    classes = tmp_path_factory.mktemp("java")
    classpath = f"{kafka_libs()}/*"
    subprocess.run(
        ["javac", "-cp", classpath, "-d", str(classes), str(JAVA_CONSUMER)],
        check=True,
        timeout=120,
    )
    run = subprocess.run(
        [
            "java",
            "-cp",
            f"{classpath}:{classes}",
            "ConsumeAll",
            cluster3.bootstrap_servers,
            name,
            str(len(values)),
            "60000",
            "max.partition.fetch.bytes=512",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    got = [line.encode() for line in run.stdout.splitlines() if line]
    assert sorted(got) == sorted(values), run.stderr[-2000:]
