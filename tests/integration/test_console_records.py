"""The record browser (`odradek.console.record_browser`) against a real cluster: its rows equal
what a confluent-kafka consumer (read_committed, librdkafka's default and what the page used
before) reads, for compressed batches, LogAppendTime, headers, null keys and values, and a
partition with committed and aborted transactions (control records and aborted records never
show); leaders that moved since the snapshot; the page's one-line error."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from odradek.console.app import ConsoleSettings, create_app
from odradek.console.record_browser import Record
from odradek.testing import LocalCluster
from tests.integration._replication import create_topic, unique_topic
from tests.integration.test_console import fresh

TIMEOUT_S = 60.0

pytestmark = pytest.mark.usefixtures("cluster3")


@pytest.fixture(scope="module")
def console(cluster3: LocalCluster) -> Iterator[Any]:
    from starlette.testclient import TestClient

    settings = ConsoleSettings(
        bootstrap_servers=cluster3.bootstrap_servers, zookeeper=cluster3.zookeeper_connect
    )
    app = create_app(settings)
    app.state.console.zk.max_age_s = 0.2
    with TestClient(app) as client:
        yield client


def consumed(bootstrap: str, topic: str, partition: int, start: int) -> list[Record]:
    """What a read_committed confluent-kafka consumer reads from `start` to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "log_level": 0,
        }
    )
    rows = []
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        while True:
            message = consumer.poll(10)
            assert message is not None, "no end of partition in 10 s"
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                break
            kind, ts = message.timestamp()
            rows.append(
                Record(
                    message.offset(),
                    ts if kind else None,
                    {1: "CreateTime", 2: "LogAppendTime"}.get(kind, "-"),
                    message.key(),
                    message.value(),
                    tuple(message.headers() or ()),
                )
            )
    finally:
        consumer.close()
    return rows


def browse(console: Any, topic: str, partition: int, leader: int, **kwargs: Any) -> Any:
    assert console.portal is not None  # the app's event loop, where the clients live
    browser = console.app.state.console.records
    return console.portal.call(lambda: browser.browse((topic, partition), leader, 500, **kwargs))


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_as_the_consumer_reads_them(
    console: Any, cluster3: LocalCluster, codec: str
) -> None:
    topic = unique_topic(f"console-{codec}")
    create_topic(cluster3, topic, [[1, 2]])
    producer = Producer(
        {
            "bootstrap.servers": cluster3.bootstrap_servers,
            "compression.type": codec,
            "linger.ms": 50,
            "log_level": 0,
        }
    )
    for i in range(120):
        headers = [("n", str(i).encode()), ("empty", None)] if i % 3 else None
        key = None if i % 5 == 0 else b"k%d" % i
        value = None if i % 7 == 0 else b"v" * (i % 40)
        producer.produce(topic, value, key, partition=0, headers=headers)
    assert producer.flush(30) == 0
    expected = consumed(cluster3.bootstrap_servers, topic, 0, 0)
    assert len(expected) == 120
    records, low, high = browse(console, topic, 0, 1, from_offset=0)
    assert (records, low, high) == (expected, 0, 120)
    records, _, _ = browse(console, topic, 0, 2, from_offset=37)  # 2 follows: moved leader
    assert records == expected[37:]
    latest, _, _ = console.portal.call(
        lambda: console.app.state.console.records.browse((topic, 0), 1, 5)
    )
    assert latest == expected[-5:]


def test_transactions_committed_shown_aborted_and_markers_not(
    console: Any, cluster3: LocalCluster
) -> None:
    topic = unique_topic("console-txn")
    create_topic(cluster3, topic, [[1, 2, 3]])
    producer = Producer(
        {
            "bootstrap.servers": cluster3.bootstrap_servers,
            "transactional.id": f"console-{uuid.uuid4().hex[:8]}",
            "compression.type": "lz4",
            "log_level": 0,
        }
    )
    producer.init_transactions(30)
    for round_ in range(4):
        producer.begin_transaction()
        for i in range(10):
            producer.produce(topic, b"r%d-%d" % (round_, i), partition=0)
        producer.flush(30)
        if round_ % 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    plain = Producer({"bootstrap.servers": cluster3.bootstrap_servers, "log_level": 0})
    plain.produce(topic, b"plain", partition=0)
    assert plain.flush(30) == 0
    expected = consumed(cluster3.bootstrap_servers, topic, 0, 0)
    assert [r.value for r in expected][-1] == b"plain" and len(expected) == 21
    records, low, high = browse(console, topic, 0, 1, from_offset=0)
    assert records == expected and low == 0
    assert high == expected[-1].offset + 1
    # From inside an aborted transaction: none of its records.
    middle = expected[10].offset  # the first after the first commit's marker... and the abort
    records, _, _ = browse(console, topic, 0, 1, from_offset=middle - 5)
    assert records == [r for r in expected if r.offset >= middle - 5]
    fresh(console, "/topics", topic)  # the snapshot knows the topic
    page = fresh(
        console, f"/topics/{topic}/records?partition=0&count=500&mode=offset&offset=0", "plain"
    )
    assert "r1-" not in page and "r3-" not in page and "r2-9" in page


def test_errors_are_one_line_on_the_page(console: Any, cluster3: LocalCluster) -> None:
    topic = unique_topic("console-records-error")
    create_topic(cluster3, topic, [[1]])
    fresh(console, "/topics", topic)
    page = fresh(console, f"/topics/{topic}/records?partition=0", "high watermark 0")
    assert "0 record(s) shown" in page
    records, low, high = browse(console, topic, 0, -1)  # no leader named: ZooKeeper is asked
    assert (records, low, high) == ([], 0, 0)
