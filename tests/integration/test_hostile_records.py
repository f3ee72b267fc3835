"""Hostile record batches against a live broker: refused with their codes, nothing unreadable stored.

* `test_every_case_then_consumers_read_everything_stored`: every case of the catalogue
  (tests/fuzz/record_batches.py, bombs included) is produced over the wire and answered with its
  code; afterwards librdkafka and kafka-python consumers read each topic from the start to its end
  without an error, and find exactly the records of the accepted cases: a refused batch left
  nothing behind, and an accepted one is readable (the defect this guards: a CRC-correct batch with
  malformed records used to be stored, and librdkafka consumers silently stopped at it). The
  broker's memory grows by less than a bound over the bombs.
* `test_each_partition_of_a_request_is_answered_on_its_own`: a bad batch fails its partition
  only, as in Kafka.
* `test_large_batches_keep_their_order_and_the_loop_keeps_serving`: batches too large to validate
  on the event loop go to worker threads; pipelined appends to one partition keep their order,
  and other requests are served meanwhile.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.protocol.record_batch import CompressionType, read_header
from tests.fixtures.cluster import wait_until
from tests.fuzz.record_batches import (
    Case,
    RawRecord,
    batch_of,
    bomb_cases,
    cases,
    numbered,
)
from tests.integration import _wire
from tests.integration._clients import (
    confluent_consumer,
    consume,
    create_topic,
    unique_topic,
)
from tests.integration._controller import zk_broker_epoch

HOUR_MS = 3600 * 1000
RSS_GROWTH_BOUND = 150 * 1024 * 1024


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def topics_for(bootstrap: str) -> dict[str, str]:
    names = {kind: unique_topic(f"hostile-{kind}") for kind in ("create", "bounded", "append")}
    create_topic(bootstrap, names["create"], replication_factor=1)
    create_topic(
        bootstrap,
        names["bounded"],
        replication_factor=1,
        configs={
            "message.timestamp.before.max.ms": str(HOUR_MS),
            "message.timestamp.after.max.ms": str(HOUR_MS),
        },
    )
    create_topic(
        bootstrap,
        names["append"],
        replication_factor=1,
        configs={"message.timestamp.type": "LogAppendTime"},
    )
    for name in names.values():
        wait_until(lambda n=name: _leader_ready(bootstrap, n), 30, f"a leader for {name}")
    return names


def _leader_ready(bootstrap: str, topic: str) -> bool:
    try:
        _wire.log_end_offset(bootstrap, topic)
    except AssertionError:
        return False
    return True


def read_offsets(client: str, bootstrap: str, topic: str, count: int) -> list[int]:
    """Every offset a real consumer reads from `topic`-0 from the start, until `count` records
    or a minute; the consumer's own errors raise. Keys, values and headers are touched, so that
    a client that fails to decode a record fails here."""
    offsets: list[int] = []
    deadline = time.monotonic() + 60
    if client == "confluent":
        consumer = confluent_consumer(bootstrap)
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            while len(offsets) < count and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                if message.error():
                    raise AssertionError(f"librdkafka: {message.error()}")
                message.key(), message.value(), message.headers(), message.timestamp()
                offsets.append(message.offset())
        finally:
            consumer.close()
        return offsets
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition

    reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="none")
    try:
        assigned = KafkaTopicPartition(topic, 0)
        reader.assign([assigned])
        reader.seek(assigned, 0)
        while len(offsets) < count and time.monotonic() < deadline:
            for message in reader.poll(timeout_ms=500).get(assigned, []):
                offsets.append(message.offset)
    finally:
        reader.close()
    return offsets


def produce_raw(bootstrap: str, topic: str, records: bytes) -> Any:
    with _wire.WireConnection.to(bootstrap, timeout=60) as connection:
        response = connection.request(
            ApiKey.PRODUCE, 8, _wire.produce_values(topic, 0, records), timeout=60
        )
    (answer,) = response.responses[0].partition_responses
    return answer


def test_every_case_then_consumers_read_everything_stored(make_cluster: Any) -> None:
    cluster = make_cluster(1, auto_create_topics_enable=False)
    bootstrap = cluster.broker(1).bootstrap
    names = topics_for(bootstrap)
    pid = cluster.broker(1).pid
    stored = dict.fromkeys(names, 0)
    catalogue: list[Case] = cases(int(time.time() * 1000))
    rss_before = rss_bytes(pid)
    catalogue += bomb_cases() * 3  # every bomb three times: memory must not keep growing
    for case in catalogue:
        answer = produce_raw(bootstrap, names[case.topic], case.records)
        assert ErrorCode(answer.error_code).name == case.expected, (case.name, answer)
        if case.expected == "none":
            stored[case.topic] += read_header(case.records).records_count
        else:
            assert answer.error_message, case.name
    grown = rss_bytes(pid) - rss_before
    assert grown < RSS_GROWTH_BOUND, f"the broker's RSS grew by {grown >> 20} MB"
    for kind, topic in names.items():
        assert _wire.log_end_offset(bootstrap, topic) == stored[kind]
        for client in ("confluent", "kafka-python"):
            offsets = read_offsets(client, bootstrap, topic, stored[kind])
            assert offsets == list(range(stored[kind])), (client, kind)


def test_each_partition_of_a_request_is_answered_on_its_own(make_cluster: Any) -> None:
    cluster = make_cluster(1, auto_create_topics_enable=False)
    bootstrap = cluster.broker(1).bootstrap
    topic = unique_topic("mixed")
    create_topic(bootstrap, topic, partitions=3, replication_factor=1)
    wait_until(lambda: _leader_ready(bootstrap, topic), 30, "a leader")
    good = batch_of(numbered(2))
    bad = batch_of([RawRecord(key_raw=b"\x05")])  # a key of 2 bytes cut short
    values = {
        "transactional_id": None,
        "acks": 1,
        "timeout": 10_000,
        "topic_data": [
            {
                "name": topic,
                "partition_data": [
                    {"index": 0, "records": good},
                    {"index": 1, "records": bad},
                    {"index": 2, "records": good},
                ],
            }
        ],
    }
    with _wire.WireConnection.to(bootstrap) as connection:
        response = connection.request(ApiKey.PRODUCE, 8, values)
    answers = {a.index: a for a in response.responses[0].partition_responses}
    assert [ErrorCode(answers[i].error_code) for i in range(3)] == [
        ErrorCode.none,
        ErrorCode.invalid_record,
        ErrorCode.none,
    ]
    assert "record 0" in answers[1].error_message
    assert [_wire.log_end_offset(bootstrap, topic, p) for p in range(3)] == [2, 0, 2]


def test_large_batches_keep_their_order_and_the_loop_keeps_serving(make_cluster: Any) -> None:
    cluster = make_cluster(1, auto_create_topics_enable=False)
    bootstrap = cluster.broker(1).bootstrap
    topic = unique_topic("ordered")
    create_topic(bootstrap, topic, replication_factor=1)
    wait_until(lambda: _leader_ready(bootstrap, topic), 30, "a leader")
    line = b"a highly compressible line of text, repeated over and over again " * 15
    large = batch_of(
        [RawRecord(key=b"large", value=line, offset_delta=i) for i in range(30_000)],
        compression=CompressionType.ZSTD,
    )  # about 30 MB once decompressed: validated on a worker thread
    small = batch_of(numbered(5))
    sequence = [large, small, large, small, small, large, small]
    slowest = 0.0
    with (
        _wire.WireConnection.to(bootstrap, timeout=60) as producer,
        _wire.WireConnection.to(bootstrap) as other,
    ):
        sent = []
        for records in sequence:
            correlation_id, frame = producer.encode(
                ApiKey.PRODUCE, 8, _wire.produce_values(topic, 0, records)
            )
            producer.send_bytes(frame)
            sent.append(correlation_id)
        for _ in range(20):  # meanwhile, another client's requests are answered promptly
            started = time.monotonic()
            other.request(ApiKey.METADATA, 9, {"topics": [], "allow_auto_topic_creation": False})
            slowest = max(slowest, time.monotonic() - started)
        offsets = []
        for correlation_id in sent:
            response = producer.read_response(ApiKey.PRODUCE, 8, correlation_id, timeout=60)
            (answer,) = response.responses[0].partition_responses
            assert answer.error_code == ErrorCode.none, answer
            offsets.append(int(answer.base_offset))
    expected, next_offset = [], 0
    for records in sequence:
        expected.append(next_offset)
        next_offset += read_header(records).records_count
    assert offsets == expected
    assert slowest < 1.0, f"a Metadata request waited {slowest:.2f}s"
    consumed = consume("confluent", bootstrap, topic, 0, 0, next_offset, timeout=120)
    keys = [c.key for c in consumed]
    assert keys == [
        b"large" if r is large else b"k"
        for r in sequence
        for _ in range(read_header(r).records_count)
    ]


def fetch_size(
    bootstrap: str, topic: str, replica_id: int, max_bytes: int, replica_epoch: int = -1
) -> int:
    """The bytes of records one Fetch at offset 0 gets: a consumer's (replica id -1, v11) or a
    follower's (Fetch v15 with the broker epoch, as the broker refuses a follower fetch without
    one, and the topic by id)."""
    partition = {
        "partition": 0,
        "current_leader_epoch": -1,
        "fetch_offset": 0,
        "log_start_offset": -1,
        "partition_max_bytes": max_bytes,
    }
    body: dict[str, Any] = {
        "max_wait": 0,
        "min_bytes": 0,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    with _wire.WireConnection.to(bootstrap) as connection:
        if replica_id < 0:
            version = _wire.FETCH_VERSION
            body |= {"replica_id": -1, "topics": [{"topic": topic, "partitions": [partition]}]}
        else:
            version = 15
            metadata = connection.request(
                ApiKey.METADATA,
                12,
                {"topics": [{"name": topic}], "allow_auto_topic_creation": False},
            )
            body |= {
                "cluster_id": None,
                "replica_state": {"replica_id": replica_id, "replica_epoch": replica_epoch},
                "topics": [{"topic_id": metadata.topics[0].topic_id, "partitions": [partition]}],
            }
        response = connection.request(ApiKey.FETCH, version, body)
    (answer,) = response.responses[0].partitions
    assert answer.error_code == ErrorCode.none, answer
    return len(answer.records or b"")


def test_fetch_responses_are_capped_by_the_broker(make_cluster: Any) -> None:
    """KIP-541: a fetch asking for 2 GB gets at most fetch.max.bytes (consumers) or
    replica.fetch.response.max.bytes (followers), plus at most one batch (KIP-74)."""
    cluster = make_cluster(
        1,
        auto_create_topics_enable=False,
        fetch_max_bytes=64 * 1024,
        replica_fetch_response_max_bytes=32 * 1024,
    )
    bootstrap = cluster.broker(1).bootstrap
    topic = unique_topic("capped")
    create_topic(bootstrap, topic, replication_factor=1)
    wait_until(lambda: _leader_ready(bootstrap, topic), 30, "a leader")
    batch = batch_of([RawRecord(value=bytes(10_000), offset_delta=i) for i in range(2)])
    for _ in range(30):
        assert produce_raw(bootstrap, topic, batch).error_code == ErrorCode.none
    total = 30 * len(batch)
    assert fetch_size(bootstrap, topic, -1, 2**31 - 1) <= 64 * 1024
    epoch = zk_broker_epoch(cluster, 1)
    assert 0 < fetch_size(bootstrap, topic, 1, 2**31 - 1, epoch) <= 32 * 1024
    assert fetch_size(bootstrap, topic, -1, 100) == len(batch)  # one batch, whatever the size
    assert fetch_size(bootstrap, topic, -1, -5) == len(batch)
    assert fetch_size(bootstrap, topic, -1, 64 * 1024) < total


def test_a_million_records_out_of_bounds_get_a_bounded_answer(make_cluster: Any) -> None:
    """A batch of a million tiny records, each with a timestamp years old, to a topic bounding
    timestamps: INVALID_TIMESTAMP listing the first 1000 (Kafka would list a million), promptly;
    and a records field of 100,000 tiny batches is refused as more than one batch, promptly."""
    cluster = make_cluster(1, auto_create_topics_enable=False)
    server = cluster.broker(1)
    bootstrap = server.bootstrap
    names = topics_for(bootstrap)
    count = 1_000_000
    tiny = [RawRecord(key=None, value=None, offset_delta=i) for i in range(count)]
    batch = batch_of(tiny, compression=CompressionType.ZSTD)
    rss_before = rss_bytes(server.pid)
    started = time.monotonic()
    answer = produce_raw(bootstrap, names["bounded"], batch)
    assert ErrorCode(answer.error_code) == ErrorCode.invalid_timestamp
    assert [e.batch_index for e in answer.record_errors] == list(range(1000))
    many = batch_of(numbered(1)) * 100_000
    answer = produce_raw(bootstrap, names["create"], many)
    assert ErrorCode(answer.error_code) == ErrorCode.invalid_record
    assert time.monotonic() - started < 30
    assert rss_bytes(server.pid) - rss_before < RSS_GROWTH_BOUND
    assert _wire.log_end_offset(bootstrap, names["bounded"]) == 0
