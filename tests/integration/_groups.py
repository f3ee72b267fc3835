"""Consumer-group helpers shared by the group, offsets and consumer-groups CLI tests.

Groups live in `__consumer_offsets`: a group's coordinator is the leader of partition
`partition_for(group, 50)`. `find_coordinator` asks as a client does (FindCoordinator, retried
while the topic is being created or the partition loads); `offsets_leader` reads the same answer
from Metadata; `group_on(broker)` picks a group name whose coordinator is a given broker, so a
test can kill exactly that one. The rest drive confluent-kafka consumers the way the tests need.

Consumers heartbeat every 500 ms (instead of 3 s) so that rebalances take a second, not ten; the
brokers' `group.initial.rebalance.delay.ms` is 0 in local clusters. Waits are deadlines.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from odradek.coordinator.group.placement import OFFSETS_TOPIC, partition_for
from odradek.protocol.codec import ApiKey
from tests.fixtures.cluster import wait_until
from tests.integration import _wire

CLIENT_TIMEOUT_S = 60.0
FAST_GROUP = {"heartbeat.interval.ms": 500, "session.timeout.ms": 6000}
OFFSETS_PARTITIONS = 50

Position = tuple[int, int]  # (partition, offset)


def unique_group(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def find_coordinator(bootstrap: str, group: str, timeout: float = CLIENT_TIMEOUT_S) -> int:
    """The group's coordinator as the first broker of `bootstrap` answers FindCoordinator v3,
    asked again while the answer is COORDINATOR_NOT_AVAILABLE (the offsets topic being created,
    or its partition without a leader)."""

    def ask() -> int | None:
        try:
            with _wire.WireConnection.to(bootstrap.split(",")[0]) as connection:
                answer = connection.request(
                    ApiKey.FIND_COORDINATOR, 3, {"key": group, "key_type": 0}
                )
        except (OSError, _wire.ConnectionClosed, _wire.NoAnswer):
            return None
        if answer.error_code == ErrorCode.coordinator_not_available:
            return None
        assert answer.error_code == ErrorCode.none, answer
        return int(answer.node_id) + 1  # truthy for wait_until; 0 is no broker id here anyway

    return wait_until(ask, timeout, f"a coordinator for {group}") - 1


def offsets_leader(bootstrap: str, group: str) -> int:
    """The leader of the group's offsets partition, from Metadata (-1 if none)."""
    with _wire.WireConnection.to(bootstrap.split(",")[0]) as connection:
        answer = connection.request(
            ApiKey.METADATA,
            _wire.METADATA_VERSION,
            {"topics": [{"name": OFFSETS_TOPIC}], "allow_auto_topic_creation": False},
        )
    (topic,) = answer.topics
    wanted = partition_for(group, OFFSETS_PARTITIONS)
    for partition in topic.partitions:
        if partition.partition_index == wanted:
            return int(partition.leader_id)
    return -1


def group_on(bootstrap: str, broker_id: int, prefix: str) -> str:
    """A fresh group name whose coordinator is `broker_id` (the offsets topic must exist)."""
    find_coordinator(bootstrap, unique_group("warm-up"))  # creates the offsets topic if need be
    for _ in range(2000):
        group = unique_group(prefix)
        if offsets_leader(bootstrap, group) == broker_id:
            return group
    raise AssertionError(f"no group name found for coordinator {broker_id}")


def kafka_python_consumer(topic: str, **config: Any) -> Any:
    """A kafka-python `KafkaConsumer` (`config` as its keywords) subscribed to `topic`, whose
    metadata holds the topic's partitions before its first poll joins the group.

    kafka-python 3.0.12 is fragile when its first JoinGroup comes before it has seen the topic's
    partitions (a group coordinator with `group.initial.rebalance.delay.ms=0` answers at once):
    * the leader assigns nothing, the metadata arrives, and the member rejoins; if
      `poll(timeout_ms)` returns while that rejoin's SyncGroup is in flight, the next poll sees
      no rejoin needed and never applies the answer: the member holds no partitions, sends no
      heartbeat, and is removed after its session timeout (a 45 s stall in
      test_offsets_failover; the client's debug log showed the SyncGroup answered with every
      partition, never applied);
    * or the leader assigns every partition from the cluster's metadata while its own snapshot
      of it is still empty, and rejoins as soon as the snapshot fills: a commit in between
      fails with REBALANCE_IN_PROGRESS.
    Both come from the consumer's snapshot of the topic's partitions, which it refreshes on every
    metadata update once subscribed: so subscribe first, then wait until a metadata update that
    holds the partitions has come (`partitions_for_topic` asks for one while the topic is
    unknown), and only then poll."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(**config)
    try:
        consumer.subscribe([topic])
        wait_until(lambda: consumer.partitions_for_topic(topic), message=f"{topic}'s metadata")
    except BaseException:
        consumer.close()
        raise
    return consumer


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
