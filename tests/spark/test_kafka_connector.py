"""Spark's own Kafka connector (`format("kafka")`, spark-sql-kafka-0-10 with Java kafka-clients 3.x)
against a live 3-broker cluster: batch read and write, a streaming read into Parquet and a
streaming write into a topic, checked record by record against what a plain consumer reads.
The run through a broker SIGKILL lives in test_kafka_connector_faults.py (its own cluster)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from odradek.testing import LocalCluster
from tests.spark.streaming import check_alive, wait_caught_up
from tests.spark.topics import (
    Record,
    consume_all,
    create_topic,
    high_watermarks,
    produce,
    unique_topic,
)

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("kafka_connector")]

RECORDS = 600
PARTITIONS = 3


def kafka_read(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    reader = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@pytest.fixture(scope="module")
def loaded(cluster3: LocalCluster) -> tuple[str, list[Record]]:
    """A topic of RECORDS records (keys, headers, timestamps) on three partitions, RF=3."""
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("connector")
    create_topic(bootstrap, topic, PARTITIONS, 3, {"min.insync.replicas": "2"})
    base_ms = 1_700_000_000_000
    produce(
        bootstrap,
        topic,
        (
            {
                "value": f"value-{i}".encode(),
                "key": f"key-{i}".encode() if i % 4 else None,
                "partition": i % PARTITIONS,
                "timestamp": base_ms + i,
                "headers": [("h", f"{i}".encode())] if i % 3 == 0 else None,
            }
            for i in range(RECORDS)
        ),
    )
    return topic, consume_all(bootstrap, topic)


def _rows_as_records(df: DataFrame) -> list[Record]:
    records = []
    for row in df.collect():
        headers = tuple((h["key"], h["value"]) for h in row["headers"]) if row["headers"] else None
        records.append(
            Record(
                row["partition"],
                row["offset"],
                row["key"],
                row["value"],
                headers,
                int(row["timestamp"].timestamp() * 1000),
                row["timestampType"],
            )
        )
    return sorted(records)


def test_batch_read_returns_every_record_as_a_consumer_sees_it(
    spark: SparkSession, cluster3: LocalCluster, loaded: tuple[str, list[Record]]
) -> None:
    topic, expected = loaded
    df = kafka_read(
        spark,
        cluster3.bootstrap_servers,
        subscribe=topic,
        startingOffsets="earliest",
        includeHeaders="true",
    )
    assert _rows_as_records(df) == expected


def test_batch_read_with_offsets_matches_the_odradek_source(
    spark: SparkSession, cluster3: LocalCluster, loaded: tuple[str, list[Record]]
) -> None:
    """A differential check: the same offset options through both formats give the same rows."""
    topic, _ = loaded
    options = {
        "kafka.bootstrap.servers": cluster3.bootstrap_servers,
        "subscribe": topic,
        "startingOffsets": f'{{"{topic}":{{"0":5,"1":-2,"2":100}}}}',
        "endingOffsets": f'{{"{topic}":{{"0":150,"1":-1,"2":180}}}}',
    }
    rows = {}
    for fmt in ("kafka", "odradek"):
        df = spark.read.format(fmt).options(**options).load()
        rows[fmt] = sorted(df.collect(), key=lambda r: (r["partition"], r["offset"]))
    assert rows["kafka"] == rows["odradek"]
    assert len(rows["kafka"]) == 145 + 200 + 80


def test_batch_write_then_read_back(spark: SparkSession, cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("connector-write")
    create_topic(bootstrap, topic, PARTITIONS, 3, {"min.insync.replicas": "2"})
    df = spark.range(0, 2_000).selectExpr(
        "CAST(id AS STRING) AS key", "CONCAT('payload-', CAST(id AS STRING)) AS value"
    )
    df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option(
        "topic", topic
    ).save()
    written = consume_all(bootstrap, topic)
    assert sorted(r.value for r in written) == sorted(f"payload-{i}".encode() for i in range(2_000))
    # The Java client's default partitioner (murmur2 of the key) and the odradek sink's agree.
    for record in written:
        assert record.key is not None and record.value == b"payload-" + record.key


def test_stream_read_into_parquet_and_stream_write_into_a_topic(
    spark: SparkSession,
    cluster3: LocalCluster,
    loaded: tuple[str, list[Record]],
    tmp_path: Path,
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic, expected = loaded
    copy = unique_topic("connector-copy")
    create_topic(bootstrap, copy, PARTITIONS, 3, {"min.insync.replicas": "2"})
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "250")
        .load()
    )
    to_parquet = (
        source.select("partition", "offset", "key", "value")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "chk-parquet"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    to_topic = (
        source.selectExpr("key", "value", "partition")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", copy)
        .option("checkpointLocation", str(tmp_path / "chk-topic"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        ends = high_watermarks(bootstrap, topic)
        wait_caught_up(to_parquet, topic, ends, timeout=180)
        wait_caught_up(to_topic, topic, ends, timeout=180)
        check_alive(to_topic)
    finally:
        to_parquet.stop()
        to_topic.stop()
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert Counter((r["partition"], r["offset"]) for r in rows).most_common(1)[0][1] == 1
    assert sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in rows) == [
        (r.partition, r.offset, r.key, r.value) for r in expected
    ]
    copied = consume_all(bootstrap, copy)
    assert sorted((r.partition, r.key or b"", r.value) for r in copied) == sorted(
        (r.partition, r.key or b"", r.value) for r in expected
    )
