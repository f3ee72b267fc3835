"""Spark's own Kafka connector through a partition leader's SIGKILL, on a private 3-broker cluster.

One streaming read (`format("kafka")`) feeds two queries: one into Parquet, one back into a topic
through the connector's sink, whose Java producer is idempotent (kafka-clients 3.x's default).
While records flow in, the leader of partition 0 is killed. Afterwards
(`tests.spark.duplicates.copy_problems` for the copy):

* the Parquet output holds every record of the input topic exactly once (by partition and offset);
* the broker's part: no two records of a copy partition are stored under one producer id, epoch
  and sequence -- the new leaders recognised every retry of the sink's batches;
* Spark's part: every input value is in the copy at least as often as in the input, and more
  often only if a Spark task failed.

The copy may hold a value twice without any fault, for two reasons:

* The input's own producer (librdkafka, acks=all, idempotence off) retries a request that the
  killed leader had written and its followers had copied; the new leader appends it again, so
  the input holds that value twice, at two offsets, and Spark copies both. A run here showed it:
  input `v-2974` at offset 1484 (leader epoch 0) and 1485 (epoch 1), copied under one producer
  and epoch with sequences 1445 and 1446, no Spark task failed. The same symptom (a value twice
  in the copy, no offset twice in Parquet) failed CI when this test asked for one copy per value.
* Spark's Kafka sink is at-least-once: "Apache Kafka only supports at least once write
  semantics ... some records may be duplicated" (Structured Streaming + Kafka Integration
  Guide, "Writing Data to Kafka"). A failed task (a send that timed out, say) is retried and
  resends its rows under new sequence numbers, which the broker rightly takes as new records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.spark.duplicates import copy_problems, stored_records
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


def _failed_tasks(spark: SparkSession) -> int:
    """Tasks that failed in this SparkSession so far, whatever the query (each is retried, up to
    TASK_ATTEMPTS). Read through py4j from the driver's status store (Spark's AppStatusStore):
    its per-executor totals do not age out as its per-stage records do, and a streaming query
    runs thousands of stages; the public StatusTracker only sees the stages still kept."""
    summaries = spark.sparkContext._jsc.sc().statusStore().executorList(True).iterator()
    failed = 0
    while summaries.hasNext():
        failed += summaries.next().failedTasks()
    return failed


def test_connector_stream_survives_leader_sigkill(
    spark: SparkSession, make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(brokers=3, min_insync_replicas=2)
    bootstrap = cluster.bootstrap_servers
    topic, copy = unique_topic("connector-kill"), unique_topic("connector-kill-copy")
    create_topic(bootstrap, topic, 2, 3, {"min.insync.replicas": "2"})
    create_topic(bootstrap, copy, 2, 3, {"min.insync.replicas": "2"})
    failed_before = _failed_tasks(spark)
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
    failed_tasks = _failed_tasks(spark) - failed_before
    copy_records = consume_all(bootstrap, copy)
    stored = stored_records(cluster, bootstrap, copy)
    assert copy_problems(in_topic, copy_records, stored, failed_tasks) == []
