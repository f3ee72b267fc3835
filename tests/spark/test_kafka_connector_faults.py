"""Spark's own Kafka connector through a partition leader's SIGKILL, on a private 3-broker cluster.

One streaming read (`format("kafka")`) feeds two queries: one into Parquet, one back into a topic
through the connector's sink, whose Java producer is idempotent (kafka-clients 3.x's default).
While records flow in, the leader of partition 0 is killed; afterwards the Parquet output holds
every record of the input topic exactly once, and the copy holds every input value exactly once
(the idempotent producer's retries across the leader change write nothing twice)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.spark.streaming import check_alive, rows_processed, wait_caught_up
from tests.spark.topics import (
    BackgroundProducer,
    consume_all,
    create_topic,
    high_watermarks,
    unique_topic,
)

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("kafka_connector")]


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return metadata.topics[topic].partitions[partition].leader


def test_connector_stream_survives_leader_sigkill(
    spark: SparkSession, make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(brokers=3, min_insync_replicas=2)
    bootstrap = cluster.bootstrap_servers
    topic, copy = unique_topic("connector-kill"), unique_topic("connector-kill-copy")
    create_topic(bootstrap, topic, 2, 3, {"min.insync.replicas": "2"})
    create_topic(bootstrap, copy, 2, 3, {"min.insync.replicas": "2"})
    producer = BackgroundProducer(bootstrap, topic, rate=300)
    producer.start()
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    to_parquet = (
        source.select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "chk-parquet"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    to_topic = (
        source.select("key", "value")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", copy)
        .option("checkpointLocation", str(tmp_path / "chk-topic"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    queries = (to_parquet, to_topic)

    def alive_and(condition: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            for query in queries:
                check_alive(query)
            return condition()

        return check

    try:
        wait_until(alive_and(lambda: rows_processed(to_topic) >= 300), 120, "300 rows")
        victim = _leader(bootstrap, topic, 0)
        assert cluster.kill(victim)
        processed = rows_processed(to_topic)
        wait_until(lambda: _leader(bootstrap, topic, 0) not in (victim, -1), 60, "a new leader")
        wait_until(
            alive_and(lambda: rows_processed(to_topic) >= processed + 600),
            180,
            "600 more rows after the kill",
        )
        producer.stop()
        ends = high_watermarks(bootstrap, topic)
        for query in queries:
            wait_caught_up(query, topic, ends, timeout=180)
    finally:
        producer.stop()
        for query in queries:
            query.stop()

    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert [
        k for k, n in Counter((r["partition"], r["offset"]) for r in rows).items() if n > 1
    ] == []
    in_topic = consume_all(bootstrap, topic)
    assert {(r["partition"], r["offset"], r["value"]) for r in rows} == {
        (r.partition, r.offset, r.value) for r in in_topic
    }
    assert set(producer.acked) <= {r["value"] for r in rows}
    copied = Counter(r.value for r in consume_all(bootstrap, copy))
    assert [v for v, n in copied.items() if n > 1] == []
    assert set(copied) == {r.value for r in in_topic}
