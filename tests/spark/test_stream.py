"""Structured Streaming reads through the `odradek` source: restarts, new topics, triggers,
data loss."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.spark.streaming import (
    check_alive,
    end_offsets,
    rows_processed,
    stream,
    to_parquet,
    wait_caught_up,
)
from tests.spark.topics import (
    BackgroundProducer,
    consume_all,
    create_topic,
    delete_topic,
    high_watermarks,
    produce,
    unique_topic,
)

pytestmark = pytest.mark.spark


def test_restart_from_checkpoint_is_exactly_once(
    spark: SparkSession, cluster3: LocalCluster, tmp_path: Path
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("spark-restart")
    create_topic(bootstrap, topic, 3)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    producer = BackgroundProducer(bootstrap, topic, rate=400)
    producer.start()
    try:
        source = stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest")
        first = to_parquet(source, out, checkpoint)
        try:
            wait_until(lambda: check_alive(first) or rows_processed(first) >= 200, 120, "200 rows")
        finally:
            first.stop()
        # The producer keeps writing while no query runs.
        sent = producer.sent
        wait_until(lambda: producer.sent >= sent + 300, 60, "300 more records")
        second = to_parquet(source, out, checkpoint)
        try:
            wait_until(lambda: check_alive(second) or rows_processed(second) > 0, 120, "a batch")
            producer.stop()
            wait_caught_up(second, topic, high_watermarks(bootstrap, topic))
        finally:
            second.stop()
    finally:
        producer.stop()

    assert not producer.failed
    rows = spark.read.parquet(str(out)).collect()
    keys = Counter((r["partition"], r["offset"]) for r in rows)
    assert [k for k, n in keys.items() if n > 1] == []  # nothing twice
    in_topic = {(r.partition, r.offset, r.value) for r in consume_all(bootstrap, topic)}
    assert {(r["partition"], r["offset"], r["value"]) for r in rows} == in_topic
    assert set(producer.acked) <= {r["value"] for r in rows}  # nothing acknowledged is missing
    assert len(rows) >= 500


def test_pattern_picks_up_new_topics_from_the_next_trigger(
    spark: SparkSession, cluster3: LocalCluster
) -> None:
    bootstrap = cluster3.bootstrap_servers
    prefix = unique_topic("spark-new")
    create_topic(bootstrap, f"{prefix}-a", 2)
    produce(bootstrap, f"{prefix}-a", ({"value": b"before-%d" % i} for i in range(5)))
    name = prefix.replace("-", "_")
    query = (
        stream(spark, bootstrap, subscribePattern=f"{prefix}-.*")  # startingOffsets: latest
        .select("topic", "value")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: check_alive(query) or query.lastProgress is not None, 120, "a trigger")
        produce(bootstrap, f"{prefix}-a", ({"value": b"after-%d" % i} for i in range(3)))
        create_topic(bootstrap, f"{prefix}-b", 2)
        produce(bootstrap, f"{prefix}-b", ({"value": b"new-%d" % i} for i in range(4)))

        def seen() -> int:
            check_alive(query)
            return spark.sql(f"SELECT count(*) AS n FROM {name}").collect()[0]["n"]

        wait_until(lambda: seen() >= 7, 120, "7 rows")
    finally:
        query.stop()
    rows = spark.sql(f"SELECT topic, value FROM {name}").collect()
    assert sorted((r["topic"], r["value"]) for r in rows) == sorted(
        [(f"{prefix}-a", b"after-%d" % i) for i in range(3)]
        + [(f"{prefix}-b", b"new-%d" % i) for i in range(4)]
    )


def test_available_now_drains_in_batches_of_max_offsets(
    spark: SparkSession, cluster3: LocalCluster, tmp_path: Path
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("spark-now")
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, ({"value": b"%d" % i, "partition": i % 5 % 2} for i in range(100)))
    source = stream(
        spark, bootstrap, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="40"
    )
    query = to_parquet(source, tmp_path / "out", tmp_path / "chk", {"availableNow": True})
    assert query.awaitTermination(180), "an availableNow query stops by itself"
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [40, 40, 20]
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(int(r["value"]) for r in rows) == list(range(100))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_deleted_topic_is_data_loss(
    spark: SparkSession, cluster3: LocalCluster, tmp_path: Path, fail_on_data_loss: bool
) -> None:
    bootstrap = cluster3.bootstrap_servers
    keep, doomed = unique_topic("spark-keep"), unique_topic("spark-doomed")
    create_topic(bootstrap, keep, 1)
    create_topic(bootstrap, doomed, 1)
    produce(bootstrap, keep, ({"value": b"k"} for _ in range(3)))
    produce(bootstrap, doomed, ({"value": b"d"} for _ in range(3)))
    source = stream(
        spark,
        bootstrap,
        subscribe=f"{keep},{doomed}",
        startingOffsets="earliest",
        failOnDataLoss=str(fail_on_data_loss).lower(),
    )
    query = to_parquet(source, tmp_path / "out", tmp_path / "chk")
    try:
        wait_until(lambda: check_alive(query) or rows_processed(query) >= 6, 120, "6 rows")
        delete_topic(bootstrap, doomed)
        if fail_on_data_loss:
            wait_until(lambda: not query.isActive, 120, "the query to fail")
            assert "no longer exist" in str(query.exception())
            assert "failOnDataLoss" in str(query.exception())
        else:
            wait_until(
                lambda: check_alive(query) or doomed not in end_offsets(query), 120, "a batch"
            )
            produce(bootstrap, keep, ({"value": b"k2"} for _ in range(2)))
            wait_caught_up(query, keep, {0: 5})
    finally:
        query.stop()


def _topic_with_deleted_head(bootstrap: str, topic: str) -> tuple[int, int]:
    """A one-partition topic whose first records retention has already deleted: tiny segments
    and retention.bytes=1 keep only the active segment. Returns (log start, high watermark)."""
    create_topic(bootstrap, topic, 1, 1, {"segment.bytes": "1024", "retention.bytes": "1"})
    values = ({"value": b"r%03d" % i + b"." * 96} for i in range(60))
    produce(bootstrap, topic, values, linger_ms=0, batch_num_messages=1)  # a batch per record

    def log_start() -> int:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "odradek-tests"})
        try:
            low, _ = consumer.get_watermark_offsets(
                TopicPartition(topic, 0), timeout=10, cached=False
            )
            return low
        finally:
            consumer.close()

    low = wait_until(log_start, 60, "retention to delete the first segments")
    return low, high_watermarks(bootstrap, topic)[0]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_records_deleted_by_retention_are_data_loss(
    spark: SparkSession, cluster3: LocalCluster, tmp_path: Path, fail_on_data_loss: bool
) -> None:
    bootstrap = cluster3.bootstrap_servers
    prefix = unique_topic("spark-retention")
    create_topic(bootstrap, f"{prefix}-a", 1)
    source = stream(
        spark,
        bootstrap,
        subscribePattern=f"{prefix}-.*",
        failOnDataLoss=str(fail_on_data_loss).lower(),
    )
    first = to_parquet(source, tmp_path / "out", tmp_path / "chk")
    try:
        wait_until(lambda: check_alive(first) or first.lastProgress is not None, 120, "a trigger")
    finally:
        first.stop()
    # A topic created while the query is down is new to it when it resumes, and is read from
    # offset 0, which retention has deleted by then: the task finds out from the broker (offset
    # out of range), not from the plan.
    low, high = _topic_with_deleted_head(bootstrap, f"{prefix}-b")
    query = to_parquet(source, tmp_path / "out", tmp_path / "chk")
    try:
        if fail_on_data_loss:
            wait_until(lambda: not query.isActive, 120, "the query to fail")
            assert "were deleted (the log now starts at" in str(query.exception())
            return
        wait_caught_up(query, f"{prefix}-b", {0: high})
    finally:
        query.stop()
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r["offset"] for r in rows) == list(range(low, high))
    # The batch reader checks the start on the driver.
    batch = (
        spark.read.format("odradek")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", f"{prefix}-b")
        .option("startingOffsets", f'{{"{prefix}-b":{{"0":0}}}}')
    )
    with pytest.raises(Exception, match="below its log start offset"):
        batch.load().collect()
    assert batch.option("failOnDataLoss", "false").load().count() == high - low
