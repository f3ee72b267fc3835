"""The sink's fast path (`odradek.spark.produce`) on real brokers: through Spark, every row once
and keys where Spark's own Kafka connector puts them; in a task's code, without falling back;
and through a partition leader's SIGKILL mid-write, where the rest goes through the producer and
every row is still written (at least once)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient
from odradek.protocol._encoder import murmur2
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    StringType,
    StructField,
    StructType,
)

from odradek.errors import DataSourceSchemaError
from odradek.spark.options import SinkOptions
from odradek.spark.writer import write_task
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.spark.topics import consume_all, create_topic, high_watermarks, unique_topic

pytestmark = pytest.mark.spark

HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
STOPPED = "fast write path stopped"


def _java_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return metadata.topics[topic].partitions[partition].leader


def test_spark_write_puts_keys_where_the_kafka_connector_does(
    spark: SparkSession, cluster3: LocalCluster, kafka_connector: None
) -> None:
    bootstrap = cluster3.bootstrap_servers
    ours, theirs = unique_topic("fast-sink"), unique_topic("connector-sink")
    for topic in (ours, theirs):
        create_topic(bootstrap, topic, 5)
    schema = StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("headers", ArrayType(HEADER)),
        ]
    )
    rows = [
        (
            f"user-{i % 97}" if i % 5 else None,
            b"" if i % 11 == 0 else (None if i % 13 == 0 else b"value-%d" % i),
            [("h", b"%d" % i), ("n", None)] if i % 3 == 0 else None,
        )
        for i in range(3000)
    ]
    df = spark.createDataFrame(rows, schema).repartition(2)
    (
        df.write.format("odradek")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", ours)
        .option("kafka.compression.type", "lz4")
        .mode("append")
        .save()
    )
    (
        df.select("key", "value")
        .write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", theirs)
        .mode("append")
        .save()
    )

    written = consume_all(bootstrap, ours)
    assert Counter((r.key, r.value, r.headers) for r in written) == Counter(
        (k.encode() if k is not None else None, v, tuple(h) if h else None) for k, v, h in rows
    )
    by_connector = {r.key: r.partition for r in consume_all(bootstrap, theirs) if r.key}
    by_fast_path = {r.key: r.partition for r in written if r.key}
    assert len(by_connector) == 97
    assert by_fast_path == by_connector
    assert all(p == _java_partition(k, 5) for k, p in by_fast_path.items())
    keyless = Counter(r.partition for r in written if r.key is None)
    assert sum(keyless.values()) == 600


def _batches(start: int, count: int, size: int, topics: list[str] | None = None) -> pa.RecordBatch:
    ids = range(start, start + count)
    columns = {
        "key": pa.array([None if i % 4 == 0 else b"k%d" % (i % 500) for i in ids], pa.binary()),
        "value": pa.array([b"%08d" % i + b"x" * (size - 8) for i in ids], pa.binary()),
        "headers": pa.array(
            [[{"key": "i", "value": b"%d" % i}] if i % 2 else None for i in ids], HEADER_TYPE
        ),
    }
    if topics is not None:
        columns["topic"] = pa.array([topics[i % len(topics)] for i in ids], pa.string())
    return pa.RecordBatch.from_pydict(columns)


def test_a_task_writes_every_row_on_the_fast_path(
    cluster3: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topics = [unique_topic("fast-a"), unique_topic("fast-b")]
    create_topic(bootstrap, topics[0], 3)
    create_topic(bootstrap, topics[1], 2)
    options = SinkOptions.parse({"kafka.bootstrap.servers": bootstrap})
    batches = [_batches(i * 4000, 4000, 200, topics) for i in range(10)]
    with caplog.at_level(logging.INFO, logger="odradek.spark"):
        report = write_task(options, iter(batches))
    assert STOPPED not in caplog.text
    assert report.records == 40_000
    for n, topic in enumerate(topics):
        records = consume_all(bootstrap, topic)
        assert sorted(int(r.value[:8]) for r in records) == list(range(n, 40_000, 2))
        partitions = 3 if n == 0 else 2
        assert all(
            r.partition == _java_partition(r.key, partitions) for r in records if r.key is not None
        )
        # The report's offsets cover what was written.
        ends = high_watermarks(bootstrap, topic)
        for p, end in ends.items():
            assert report.last_offsets[(topic, p)] == end - 1


def test_leader_sigkill_mid_write_falls_back_to_the_producer(
    make_cluster: Callable[..., LocalCluster], caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(brokers=3, min_insync_replicas=2)
    bootstrap = cluster.bootstrap_servers
    topic = unique_topic("fast-kill")
    create_topic(bootstrap, topic, 2, 3, {"min.insync.replicas": "2"})
    options = SinkOptions.parse({"kafka.bootstrap.servers": bootstrap, "topic": topic})
    total, per_batch = 300_000, 5_000
    killed: list[int] = []

    def rows() -> Iterator[pa.RecordBatch]:
        for i in range(0, total, per_batch):
            if i == 100_000:
                # Requests have gone out by now: crash partition 0's leader mid-write.
                wait_until(lambda: sum(high_watermarks(bootstrap, topic).values()) > 0, 60, "data")
                victim = _leader(bootstrap, topic, 0)
                assert cluster.kill(victim)
                killed.append(victim)
            yield _batches(i, per_batch, 100)

    with caplog.at_level(logging.INFO, logger="odradek.spark"):
        report = write_task(options, rows())
    assert killed
    assert STOPPED in caplog.text  # the producer wrote the rest
    assert report.records >= total
    values = Counter(int(r.value[:8]) for r in consume_all(bootstrap, topic))
    # At least once: every row is there; a batch whose answer was lost may be there twice.
    assert set(values) == set(range(total))
    assert sum(values.values()) >= total


def _paced_source() -> type:
    """A data source of `rows` 100-byte values (a 12-digit id, then padding) in two partitions,
    10,000 a batch at most 200,000 rows/s per partition, so that a kill lands mid-write."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class PacedReader(DataSourceReader):
        def __init__(self, rows: int) -> None:
            self.rows = rows

        def partitions(self) -> list[InputPartition]:
            half = self.rows // 2
            return [InputPartition((0, half)), InputPartition((half, self.rows))]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            import time as _time

            start, end = partition.value
            for first in range(start, end, 10_000):
                _time.sleep(0.05)
                values = [b"%012d" % i + b"x" * 88 for i in range(first, min(first + 10_000, end))]
                yield pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], ["value"])

    class PacedSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "paced-rows"

        def schema(self) -> str:
            return "value binary"

        def reader(self, schema: Any) -> DataSourceReader:
            return PacedReader(int(self.options["rows"]))

    return PacedSource


def test_spark_write_through_a_leader_sigkill_writes_every_row(
    spark: SparkSession, make_cluster: Callable[..., LocalCluster]
) -> None:
    cluster = make_cluster(brokers=3, min_insync_replicas=2)
    bootstrap = cluster.bootstrap_servers
    topic = unique_topic("fast-spark-kill")
    create_topic(bootstrap, topic, 2, 3, {"min.insync.replicas": "2"})
    total = 800_000

    spark.dataSource.register(_paced_source())
    df = spark.read.format("paced-rows").option("rows", total).load()
    # The write runs on this thread (Spark finds the session's data sources there); a helper
    # thread crashes partition 0's leader once 150,000 rows are in, while the write goes on.
    finished = threading.Event()
    killed: list[int] = []

    def kill_mid_write() -> None:
        deadline = time.monotonic() + 180
        while not finished.is_set() and time.monotonic() < deadline:
            if sum(high_watermarks(bootstrap, topic).values()) >= 150_000:
                victim = _leader(bootstrap, topic, 0)
                if not finished.is_set() and cluster.kill(victim):
                    killed.append(victim)
                return
            finished.wait(0.2)

    killer = threading.Thread(target=kill_mid_write, daemon=True)
    killer.start()
    try:
        (
            df.write.format("odradek")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic)
            .mode("append")
            .save()
        )
    finally:
        finished.set()
        killer.join(60)
    assert killed, "no leader was killed during the write: nothing was tested"
    values = Counter(int(r.value[:12]) for r in consume_all(bootstrap, topic, timeout=180))
    # At least once: every row is there (a batch whose answer was lost may be there twice).
    assert set(values) == set(range(total))


def test_a_batch_the_fast_path_refuses_goes_to_the_producer_whole(cluster3: LocalCluster) -> None:
    # A null topic stops the fast path before the batch is split: the producer path must get
    # the whole batch (and refuse it as it always did), not lose it.
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("fast-refused")
    create_topic(bootstrap, topic, 2)
    options = SinkOptions.parse({"kafka.bootstrap.servers": bootstrap})
    good = _batches(0, 100, 20, [topic])
    bad = pa.RecordBatch.from_pydict(
        {"value": pa.array([b"v"], pa.binary()), "topic": pa.array([None], pa.string())}
    )
    with pytest.raises(DataSourceSchemaError, match="null 'topic'"):
        write_task(options, iter([good, bad]))
