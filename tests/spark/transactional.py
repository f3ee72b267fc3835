"""Helpers for the Spark transaction tests: transactional input, read_committed read-back."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.spark.topics import produce

PARTITIONS = 2


@dataclass
class TransactionalInput:
    """A topic holding committed, aborted and non-transactional records, and one transaction
    left open by `producer` (commit it with `producer.commit_transaction`)."""

    topic: str
    producer: Producer
    committed: list[bytes]  # what a read_committed reader sees, in no particular order
    aborted: list[bytes]
    open: list[bytes]  # in the open transaction, after every other record


def _txn_producer(bootstrap: str) -> Producer:
    client = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"spark-test-{uuid.uuid4().hex[:10]}",
            "transaction.timeout.ms": 300_000,  # the open transaction must outlive the test
            "linger.ms": 5,
        }
    )
    client.init_transactions(60)
    return client


def _send(client: Producer, topic: str, values: list[bytes]) -> None:
    failures: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(error)

    for i, value in enumerate(values):
        client.produce(topic, value=value, partition=i % PARTITIONS, on_delivery=on_delivery)
    assert client.flush(60) == 0
    assert not failures, failures[:3]


def load_transactions(bootstrap: str, topic: str) -> TransactionalInput:
    """Committed c-0..c-29, aborted a-*, plain n-*, committed c-30..c-59, open o-*."""
    client = _txn_producer(bootstrap)
    first = [b"c-%d" % i for i in range(30)]
    aborted = [b"a-%d" % i for i in range(20)]
    plain = [b"n-%d" % i for i in range(10)]
    second = [b"c-%d" % i for i in range(30, 60)]
    still_open = [b"o-%d" % i for i in range(10)]
    client.begin_transaction()
    _send(client, topic, first)
    client.commit_transaction(60)
    client.begin_transaction()
    _send(client, topic, aborted)
    client.abort_transaction(60)
    produce(
        bootstrap, topic, ({"value": v, "partition": i % PARTITIONS} for i, v in enumerate(plain))
    )
    client.begin_transaction()
    _send(client, topic, second)
    client.commit_transaction(60)
    client.begin_transaction()
    _send(client, topic, still_open)
    return TransactionalInput(topic, client, first + plain + second, aborted, still_open)


def read_committed(bootstrap: str, topic: str, timeout: float = 60) -> list[bytes]:
    """Every value a read_committed consumer reads from offset 0 up to each partition's end
    (its last stable offset: the end-of-partition event of a read_committed consumer)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "odradek-tests",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    values: list[bytes] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending = set(partitions)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is None:
                    values.append(message.value())
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(message.partition())
        assert not pending, f"partitions {pending} of {topic} not read to their end"
    finally:
        consumer.close()
    return values
