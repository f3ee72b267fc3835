"""Topic helpers for the Spark tests, on confluent-kafka: create, produce, read back.

The reference for every comparison is what a plain confluent-kafka consumer reads by explicit
assignment, so a test checks the data source against the client it is built on, not against
itself.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(
    bootstrap: str,
    topic: str,
    partitions: int = 3,
    replication: int = 3,
    config: dict[str, str] | None = None,
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, partitions, replication, config=config or {})], operation_timeout=30
    )
    for future in futures.values():
        future.result(timeout=60)
    # Wait until every partition has a leader in the metadata.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = admin.list_topics(timeout=10).topics.get(topic)
        if (
            found is not None
            and len(found.partitions) == partitions
            and all(p.leader >= 0 for p in found.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} has no leaders after 30s")


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result(timeout=60)


@dataclass(frozen=True, order=True)
class Record:
    """A record as a consumer saw it; timestamps in milliseconds, the Java timestamp type id."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] | None
    timestamp_ms: int
    timestamp_type: int


def producer(bootstrap: str, **config: Any) -> Producer:
    return Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False, **config}
    )


def produce(
    bootstrap: str,
    topic: str,
    messages: Iterable[dict[str, Any]],
    **config: Any,
) -> int:
    """Produce `messages` (keyword arguments of `Producer.produce`); every one must be acked.
    `config`: producer settings (dots as underscores)."""
    client = producer(
        bootstrap, **{"linger.ms": 5, **{k.replace("_", "."): v for k, v in config.items()}}
    )
    failures: list[KafkaError] = []
    count = 0

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    for message in messages:
        client.produce(topic, on_delivery=on_delivery, **message)
        count += 1
        if count % 1000 == 0:
            client.poll(0)
    assert client.flush(60) == 0, "records left unacknowledged"
    assert not failures, failures[:3]
    return count


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "odradek-tests"})
    try:
        metadata = consumer.list_topics(timeout=10).topics[topic]
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in sorted(metadata.partitions)
        }
    finally:
        consumer.close()


def consume_all(bootstrap: str, topic: str, timeout: float = 60) -> list[Record]:
    """Every record of `topic` below the high watermarks, read by assignment from offset 0."""
    ends = high_watermarks(bootstrap, topic)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "odradek-tests",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    records: list[Record] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        remaining = sum(ends.values())
        deadline = time.monotonic() + timeout
        while remaining > 0 and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.5):
                if message.error() is not None or message.offset() >= ends[message.partition()]:
                    continue
                ts_type, ts = message.timestamp()
                headers = message.headers()
                records.append(
                    Record(
                        message.partition(),
                        message.offset(),
                        message.key(),
                        message.value(),
                        tuple(headers) if headers else None,
                        ts,
                        ts_type - 1,
                    )
                )
                remaining -= 1
    finally:
        consumer.close()
    assert remaining == 0, f"{remaining} records of {topic} not read back in {timeout}s"
    return sorted(records)


class BackgroundProducer(threading.Thread):
    """Produces values `prefix-0`, `prefix-1`, ... at about `rate` records/s until `stop()`;
    `acked` lists the values whose delivery was acknowledged."""

    def __init__(self, bootstrap: str, topic: str, rate: float = 500, prefix: str = "v") -> None:
        super().__init__(daemon=True, name=f"producer-{topic}")
        self.client = producer(bootstrap, **{"linger.ms": 5, "message.timeout.ms": 60_000})
        self.topic = topic
        self.rate = rate
        self.prefix = prefix
        self.acked: list[bytes] = []
        self.failed: list[KafkaError] = []
        self.sent = 0
        self._halt = threading.Event()

    def _on_delivery(self, error: KafkaError | None, message: Any) -> None:
        if error is None:
            self.acked.append(message.value())
        else:
            self.failed.append(error)

    def run(self) -> None:
        started = time.monotonic()
        while not self._halt.is_set():
            due = int((time.monotonic() - started) * self.rate) - self.sent
            for _ in range(max(0, min(due, 1000))):
                value = f"{self.prefix}-{self.sent}".encode()
                self.client.produce(
                    self.topic, value=value, key=value, on_delivery=self._on_delivery
                )
                self.sent += 1
            self.client.poll(0.02)

    def stop(self) -> None:
        """Stop producing and wait for every delivery report."""
        self._halt.set()
        self.join(30)
        self.client.flush(90)
