"""Helpers of the transaction tests: transactional producers and read_committed readers.

`txn_producer` is a confluent-kafka producer with a transactional id, initialized; `read_all`
reads a topic's partitions from the beginning with the given isolation level until `expected`
values arrived or the partitions' end is reached and stays; `end_offsets` asks ListOffsets for
the latest offsets under an isolation level (read_committed gives the last stable offset).

`bounded_call` runs one transactional API call with a watchdog: librdkafka (2.16 included) can
block in `send_offsets_to_transaction` past its own timeout, for ever, when the group coordinator
it cached was a broker that left the metadata (killed, or its ZooKeeper session expired) —
librdkafka issues #5456 (the coordinator request's timeout is never checked) and #5511 (a
decommissioned coordinator never re-triggers the lookup). An application can only abandon such a
producer and start another with the same transactional id, whose InitProducerId fences it; the
tests do the same, and the abandoned producer is kept referenced by its blocked thread, so it is
never destroyed under a call.

Every wait has a deadline; every client is closed by the caller or here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from odradek.spark.exactly_once import TransactionCallHung, bounded

CLIENT_TIMEOUT_S = 60.0
HUNG_AFTER_S = 30.0
"""How long past its own timeout a client call may run before the producer is abandoned."""

T = TypeVar("T")


class ClientCallHung(Exception):
    """A client call did not return `HUNG_AFTER_S` after its own timeout (module docstring)."""


def bounded_call(call: Callable[[], T], timeout_s: float, what: str) -> T:
    """`call()`, whose own timeout is `timeout_s`, under the Spark sink's watchdog
    (`odradek.spark.exactly_once.bounded`); ClientCallHung if it is still running
    `HUNG_AFTER_S` later (its thread is left blocked, holding the client)."""
    try:
        return bounded(call, what, timeout_s, hung_after_s=HUNG_AFTER_S)
    except TransactionCallHung:
        raise ClientCallHung(
            f"{what} still running {timeout_s + HUNG_AFTER_S:g}s after it was called "
            f"(its timeout: {timeout_s:g}s)"
        ) from None


def unique_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def txn_producer(bootstrap: str, transactional_id: str, **overrides: Any) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 5,
            **overrides,
        }
    )
    producer.init_transactions(CLIENT_TIMEOUT_S)
    return producer


def read_all(
    bootstrap: str,
    topic: str,
    partitions: int,
    isolation: str,
    expected: int | None = None,
    quiet_s: float = 3.0,
    timeout: float = CLIENT_TIMEOUT_S,
) -> list[str]:
    """Every value of the topic a consumer with `isolation.level=isolation` reads; stops at
    `expected` values, or once nothing new arrived for `quiet_s` seconds."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_id("reader"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: list[str] = []
        deadline = time.monotonic() + timeout
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            if expected is not None and len(values) >= expected:
                break
            if expected is None and time.monotonic() - last_new > quiet_s:
                break
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            values.append(message.value().decode())
            last_new = time.monotonic()
        return values
    finally:
        consumer.close()


def end_offsets(
    bootstrap: str, topic: str, partitions: int, read_committed: bool
) -> dict[int, int]:
    """ListOffsets (latest) for each partition: the HW, or with read_committed the LSO."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    futures = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)},
        isolation_level=isolation,
        request_timeout=30,
    )
    return {tp.partition: f.result(timeout=CLIENT_TIMEOUT_S).offset for tp, f in futures.items()}
