"""A streaming query through a partition leader's crash (SIGKILL) on a private cluster."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.spark.streaming import check_alive, rows_processed, stream, to_parquet, wait_caught_up
from tests.spark.topics import (
    BackgroundProducer,
    consume_all,
    create_topic,
    high_watermarks,
    unique_topic,
)

pytestmark = pytest.mark.spark


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return metadata.topics[topic].partitions[partition].leader


def test_stream_survives_leader_sigkill(
    spark: SparkSession, make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(brokers=3, min_insync_replicas=2)
    bootstrap = cluster.bootstrap_servers
    topic = unique_topic("spark-kill")
    create_topic(bootstrap, topic, 2, 3, {"min.insync.replicas": "2"})
    producer = BackgroundProducer(bootstrap, topic, rate=300)
    producer.start()
    out = tmp_path / "out"
    query = to_parquet(
        stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest"),
        out,
        tmp_path / "chk",
    )
    try:
        wait_until(lambda: check_alive(query) or rows_processed(query) >= 300, 120, "300 rows")
        victim = _leader(bootstrap, topic, 0)
        assert cluster.kill(victim)
        processed = rows_processed(query)
        # The partition moves to a surviving replica; the query keeps making progress.
        wait_until(lambda: _leader(bootstrap, topic, 0) not in (victim, -1), 60, "a new leader")
        wait_until(
            lambda: check_alive(query) or rows_processed(query) >= processed + 600,
            180,
            "600 more rows after the kill",
        )
        producer.stop()
        wait_caught_up(query, topic, high_watermarks(bootstrap, topic), timeout=180)
    finally:
        producer.stop()
        query.stop()

    rows = spark.read.parquet(str(out)).collect()
    keys = Counter((r["partition"], r["offset"]) for r in rows)
    assert [k for k, n in keys.items() if n > 1] == []
    in_topic = {(r.partition, r.offset, r.value) for r in consume_all(bootstrap, topic)}
    assert {(r["partition"], r["offset"], r["value"]) for r in rows} == in_topic
    # Every acknowledged record (acks=all, min.insync.replicas=2) survived and was read.
    assert set(producer.acked) <= {r["value"] for r in rows}
