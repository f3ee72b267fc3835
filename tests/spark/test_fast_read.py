"""The range reader's Fetch fast path (`odradek.spark.fetch`) against a live cluster, without Spark:
the rows it decodes equal what a confluent-kafka consumer reads, for every codec, and it stops
(for the Consumer path to carry on) where the leader has nothing more."""

from __future__ import annotations

import datetime as dt
import socket
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from odradek.spark.arrow import arrow_schema, source_schema
from odradek.spark.clients import consumer_config
from odradek.spark.fetch import fast_path_allowed, fast_read
from odradek.spark.fetch_pool import FetchPool
from odradek.spark.offsets import OffsetRange
from odradek.testing import LocalCluster
from tests.spark.topics import (
    Record,
    consume_all,
    create_topic,
    high_watermarks,
    produce,
    unique_topic,
)

SCHEMA = arrow_schema(source_schema(True))
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PER_CODEC = 400


@pytest.fixture(scope="module")
def mixed_topic(cluster3: LocalCluster) -> tuple[str, list[Record]]:
    """One partition holding batches of every codec, with null keys and headers."""
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("fast-read")
    create_topic(bootstrap, topic, partitions=1)
    for n, codec in enumerate(CODECS):
        messages: list[dict[str, Any]] = []
        for i in range(PER_CODEC):
            message: dict[str, Any] = {"value": f"{codec}-{i}".encode() * (1 + i % 7)}
            if i % 4:
                message["key"] = f"k{i}".encode()
            if i % 3 == 0:
                message["headers"] = [("h", f"{n}-{i}".encode()), ("none", None)]
            messages.append(message)
        produce(bootstrap, topic, messages, compression_type=codec, batch_num_messages=97)
    return topic, consume_all(bootstrap, topic)


class Consumers:
    """The reader's lazily created Consumer, counting how many were created."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.created: list[Consumer] = []

    def __call__(self) -> Consumer:
        if not self.created:
            self.created.append(Consumer(self.config))
        return self.created[0]

    def close(self) -> None:
        for consumer in self.created:
            consumer.close()


def _fast(
    bootstrap: str,
    r: OffsetRange,
    pool: FetchPool | None = None,
    consumers: list[int] | None = None,
) -> tuple[list[Record], int]:
    """The rows `fast_read` yields for `r` and where it stopped; with a fresh pool unless one is
    given; the number of Consumers it created is appended to `consumers`."""
    config = consumer_config(bootstrap, {})
    assert fast_path_allowed(config)
    consumer = Consumers(config)
    try:
        reader = fast_read(consumer, r, SCHEMA, config, 30, FetchPool() if pool is None else pool)
        batches: list[pa.RecordBatch] = []
        while True:
            try:
                batches.append(next(reader))
            except StopIteration as stop:
                stopped = stop.value
                break
    finally:
        consumer.close()
    if consumers is not None:
        consumers.append(len(consumer.created))
    records = []
    for row in pa.Table.from_batches(batches, schema=SCHEMA).to_pylist():
        headers = row["headers"]
        records.append(
            Record(
                row["partition"],
                row["offset"],
                row["key"],
                row["value"],
                None if headers is None else tuple((h["key"], h["value"]) for h in headers),
                int(row["timestamp"].replace(tzinfo=dt.UTC).timestamp() * 1000),
                row["timestampType"],
            )
        )
    return records, stopped


def test_fast_path_reads_every_codec_as_a_consumer_does(
    cluster3: LocalCluster, mixed_topic: tuple[str, list[Record]]
) -> None:
    topic, expected = mixed_topic
    assert len(expected) == PER_CODEC * len(CODECS)
    bootstrap = cluster3.bootstrap_servers
    got, stopped = _fast(bootstrap, OffsetRange(topic, 0, 0, len(expected)))
    assert stopped == len(expected)  # no fallback: the fast path read the whole range
    assert got == expected
    assert any(r.key is None for r in got) and any(r.headers for r in got)
    # A range starting and ending inside batches is trimmed to exactly its offsets.
    got, stopped = _fast(bootstrap, OffsetRange(topic, 0, 250, 1333))
    assert stopped == 1333
    assert got == expected[250:1333]


def test_fast_path_stops_where_the_leader_has_nothing_more(
    cluster3: LocalCluster, mixed_topic: tuple[str, list[Record]]
) -> None:
    topic, expected = mixed_topic
    high = high_watermarks(cluster3.bootstrap_servers, topic)[0]
    got, stopped = _fast(cluster3.bootstrap_servers, OffsetRange(topic, 0, high - 10, high + 50))
    assert stopped == high  # the Consumer path takes over from here, and waits
    assert got == expected[high - 10 :]


def test_many_small_fetches_and_chunks_give_the_same_rows(
    cluster3: LocalCluster, mixed_topic: tuple[str, list[Record]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answers of a few KB (many Fetches, each in flight while the previous one is decoded, all
    through the connection's one reused receive buffer) and chunks of ~150 rows (many takes of
    the decoder's buffers): every chunk, kept until the end, still holds its own rows."""
    import odradek.spark.fetch as fetch_module

    monkeypatch.setattr(fetch_module, "FETCH_MAX_BYTES", 3000)
    monkeypatch.setattr(fetch_module, "CHUNK_ROWS", 150)
    topic, expected = mixed_topic
    got, stopped = _fast(cluster3.bootstrap_servers, OffsetRange(topic, 0, 0, len(expected)))
    assert stopped == len(expected)
    assert got == expected
    got, stopped = _fast(cluster3.bootstrap_servers, OffsetRange(topic, 0, 333, 1777))
    assert stopped == 1777
    assert got == expected[333:1777]


def test_a_worker_reuses_the_leader_and_connection_of_its_previous_read(
    cluster3: LocalCluster, mixed_topic: tuple[str, list[Record]]
) -> None:
    """A streaming query's next micro-batch, in the same Python worker: no Consumer, no
    Metadata, no new connection; the same rows."""
    topic, expected = mixed_topic
    pool, consumers = FetchPool(), []
    bootstrap = cluster3.bootstrap_servers
    got, stopped = _fast(bootstrap, OffsetRange(topic, 0, 0, 700), pool, consumers)
    assert (got, stopped) == (expected[:700], 700)
    assert pool.idle_connections() == 1
    [(address, [(_, connection)])] = pool._idle.items()
    got, stopped = _fast(bootstrap, OffsetRange(topic, 0, 700, 1500), pool, consumers)
    assert (got, stopped) == (expected[700:1500], 1500)
    assert consumers == [1, 0]  # the second read asked no Consumer for the leader
    assert pool._idle[address][0][1] is connection  # and went over the same connection


def test_a_remembered_leader_that_no_longer_leads_is_forgotten(
    cluster3: LocalCluster, mixed_topic: tuple[str, list[Record]]
) -> None:
    """A leader remembered from an earlier batch that moved since: the broker answers
    NOT_LEADER, the fast path stops at the range's start (the Consumer path reads it), and the
    next read asks for the leader again and reads everything."""
    topic, expected = mixed_topic
    bootstrap = cluster3.bootstrap_servers
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    leader = metadata.topics[topic].partitions[0].leader
    other = next(b for b in metadata.brokers.values() if b.id != leader)
    pool, consumers = FetchPool(), []
    pool.remember_leader(
        consumer_config(bootstrap, {})["bootstrap.servers"], topic, 0, (other.host, other.port)
    )
    got, stopped = _fast(bootstrap, OffsetRange(topic, 0, 100, 200), pool, consumers)
    assert (got, stopped) == ([], 100)
    assert pool.leader(bootstrap, topic, 0) is None
    got, stopped = _fast(bootstrap, OffsetRange(topic, 0, 100, 200), pool, consumers)
    assert (got, stopped) == (expected[100:200], 200)
    assert consumers == [0, 1]


def test_an_idle_connection_closed_since_is_replaced_once(
    cluster3: LocalCluster, mixed_topic: tuple[str, list[Record]]
) -> None:
    """A pooled connection whose other end has gone (a broker closing idle connections, or
    restarted): the first exchange fails, and the read goes on over a new connection."""
    topic, expected = mixed_topic
    bootstrap = cluster3.bootstrap_servers
    pool = FetchPool()
    _fast(bootstrap, OffsetRange(topic, 0, 0, 10), pool)
    [address] = pool._idle
    dead = pool.checkout(address)
    assert dead is not None
    with socket.create_server(("127.0.0.1", 0)) as listener:
        dead.sock.close()
        dead.sock = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        accepted.close()  # the far end hangs up
    pool.checkin(address, dead)
    consumers: list[int] = []
    got, stopped = _fast(bootstrap, OffsetRange(topic, 0, 10, 900), pool, consumers)
    assert (got, stopped) == (expected[10:900], 900)
    assert consumers == [0]
    [(_, replacement)] = pool._idle[address]
    assert replacement is not dead
