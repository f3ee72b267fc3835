"""Batch reads through the `odradek` source, checked against a confluent-kafka consumer."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from odradek.testing import LocalCluster
from tests.spark.topics import Record, consume_all, create_topic, produce, unique_topic

pytestmark = pytest.mark.spark

RECORDS = 300
PARTITIONS = 3
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _messages(count: int) -> list[dict[str, Any]]:
    base_ms = 1_700_000_000_000
    messages = []
    for i in range(count):
        message: dict[str, Any] = {
            "value": f"value-{i}".encode() * (1 + i % 4),
            "partition": i % PARTITIONS,
            "timestamp": base_ms + i * 1000,
        }
        if i % 5:
            message["key"] = f"key-{i}".encode()
        if i % 3 == 0:
            message["headers"] = [("h1", f"x{i}".encode()), ("empty", None)]
        messages.append(message)
    return messages


@pytest.fixture(scope="module")
def loaded_topic(cluster3: LocalCluster) -> tuple[str, list[Record]]:
    """A topic with RECORDS records over three partitions, and what a consumer reads of it."""
    topic = unique_topic("spark-read")
    create_topic(cluster3.bootstrap_servers, topic, PARTITIONS)
    produce(cluster3.bootstrap_servers, topic, _messages(RECORDS))
    return topic, consume_all(cluster3.bootstrap_servers, topic)


def _read(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    reader = spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _as_records(df: DataFrame) -> list[Record]:
    has_headers = "headers" in df.columns
    records = []
    for row in df.collect():
        headers = None
        if has_headers and row["headers"] is not None:
            headers = tuple((h["key"], h["value"]) for h in row["headers"])
        stamp = row["timestamp"].replace(tzinfo=dt.UTC)
        records.append(
            Record(
                row["partition"],
                row["offset"],
                row["key"],
                row["value"],
                headers,
                (stamp - EPOCH) // dt.timedelta(milliseconds=1),
                row["timestampType"],
            )
        )
    return sorted(records)


def test_batch_read_returns_what_a_consumer_reads(
    spark: SparkSession, cluster3: LocalCluster, loaded_topic: tuple[str, list[Record]]
) -> None:
    topic, expected = loaded_topic
    df = _read(spark, cluster3.bootstrap_servers, subscribe=topic, includeHeaders="true")
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert {row["topic"] for row in df.select("topic").distinct().collect()} == {topic}
    got = _as_records(df)
    assert len(expected) == RECORDS
    assert got == expected
    # Spot checks on the reference itself, so that a broken reference cannot pass silently.
    assert any(r.headers == (("h1", b"x0"), ("empty", None)) for r in got)
    assert any(r.key is None for r in got)
    assert {r.timestamp_type for r in got} == {0}  # CreateTime, as the producer set it
    # Without includeHeaders there is no headers column.
    assert "headers" not in _read(spark, cluster3.bootstrap_servers, subscribe=topic).columns


def _offsets(df: DataFrame) -> dict[int, list[int]]:
    result: dict[int, list[int]] = {}
    for row in df.select("partition", "offset").collect():
        result.setdefault(row["partition"], []).append(row["offset"])
    return {p: sorted(o) for p, o in sorted(result.items())}


def test_starting_and_ending_offsets(
    spark: SparkSession, cluster3: LocalCluster, loaded_topic: tuple[str, list[Record]]
) -> None:
    topic, expected = loaded_topic
    bootstrap = cluster3.bootstrap_servers
    per_partition = RECORDS // PARTITIONS  # 100 per partition, offsets 0..99

    explicit = _read(
        spark,
        bootstrap,
        subscribe=topic,
        startingOffsets=f'{{"{topic}":{{"0":5,"1":-2,"2":90}}}}',
        endingOffsets=f'{{"{topic}":{{"0":20,"1":-1,"2":95}}}}',
    )
    assert _offsets(explicit) == {
        0: list(range(5, 20)),
        1: list(range(per_partition)),
        2: list(range(90, 95)),
    }
    # Partitions a JSON spec leaves out take the defaults (earliest .. latest).
    partial = _read(spark, bootstrap, subscribe=topic, endingOffsets=f'{{"{topic}":{{"1":3}}}}')
    assert _offsets(partial) == {
        0: list(range(per_partition)),
        1: [0, 1, 2],
        2: list(range(per_partition)),
    }
    plain = _read(
        spark, bootstrap, subscribe=topic, startingOffsets="earliest", endingOffsets="latest"
    )
    assert plain.count() == len(expected)
    # endingOffsets past the high watermark is refused, naming the option.
    with pytest.raises(Exception, match="endingOffsets"):
        _read(
            spark, bootstrap, subscribe=topic, endingOffsets=f'{{"{topic}":{{"0":{10**6}}}}}'
        ).collect()


def test_assign_and_subscribe_pattern(
    spark: SparkSession, cluster3: LocalCluster, loaded_topic: tuple[str, list[Record]]
) -> None:
    topic, expected = loaded_topic
    bootstrap = cluster3.bootstrap_servers
    assigned = _read(spark, bootstrap, assign=f'{{"{topic}":[1,2]}}')
    assert sorted(set(_offsets(assigned))) == [1, 2]
    assert assigned.count() == sum(1 for r in expected if r.partition in (1, 2))

    prefix = unique_topic("spark-pattern")
    create_topic(bootstrap, f"{prefix}-a", 1)
    create_topic(bootstrap, f"{prefix}-b", 2)
    create_topic(bootstrap, f"x{prefix}-c", 1)  # does not match: the pattern is anchored
    for name, count in ((f"{prefix}-a", 7), (f"{prefix}-b", 11), (f"x{prefix}-c", 5)):
        produce(bootstrap, name, ({"value": b"v%d" % i} for i in range(count)))
    matched = _read(spark, bootstrap, subscribePattern=f"{prefix}-.*")
    counts = {r["topic"]: r["count"] for r in matched.groupBy("topic").count().collect()}
    assert counts == {f"{prefix}-a": 7, f"{prefix}-b": 11}
    several = _read(spark, bootstrap, subscribe=f"{prefix}-a, x{prefix}-c")
    assert several.count() == 12


def test_min_partitions_splits_ranges(
    spark: SparkSession, cluster3: LocalCluster, loaded_topic: tuple[str, list[Record]]
) -> None:
    topic, expected = loaded_topic
    bootstrap = cluster3.bootstrap_servers
    assert _read(spark, bootstrap, subscribe=topic).rdd.getNumPartitions() == PARTITIONS
    split = _read(
        spark,
        bootstrap,
        subscribe=topic,
        minPartitions="8",
        includeHeaders="true",
        **{"kafka.group.id": "spark-readers", "kafka.client.id": "split-reader"},
    )
    assert split.rdd.getNumPartitions() >= 8
    assert _as_records(split) == expected  # every record once, whatever the split


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({}, "one of the options 'subscribe', 'subscribePattern' or 'assign' is required"),
        ({"subscribe": "t", "assign": '{"t":[0]}'}, "only one of 'subscribe'"),
        ({"subscribe": "t", "startingOffsets": '{"t":{"0":1'}, "startingOffsets: not valid JSON"),
        ({"assign": "[0]"}, "assign: expected a non-empty JSON object"),
        ({"subscribe": "t", "startingOffsets": "latest"}, "startingOffsets: 'latest'"),
        ({"subscribe": "t", "kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit is not"),
    ],
)
def test_batch_option_errors(
    spark: SparkSession, cluster3: LocalCluster, options: dict[str, str], fragment: str
) -> None:
    with pytest.raises(Exception) as info:
        _read(spark, cluster3.bootstrap_servers, **options).collect()
    assert fragment in str(info.value)


def test_ending_offsets_on_a_stream_is_refused(
    spark: SparkSession, cluster3: LocalCluster, tmp_path: Any
) -> None:
    stream = (
        spark.readStream.format("odradek")
        .option("kafka.bootstrap.servers", cluster3.bootstrap_servers)
        .option("subscribe", "whatever")
        .option("endingOffsets", "latest")
        .load()
    )
    with pytest.raises(Exception) as info:
        query = (
            stream.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "chk"))
            .start()
        )
        try:
            query.awaitTermination(120)
        finally:
            query.stop()
    assert "endingOffsets is not allowed in a streaming query" in str(info.value)
