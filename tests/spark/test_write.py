"""Writes through the `odradek` sink, batch and streaming, read back with a consumer."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from odradek.testing import LocalCluster
from tests.spark.topics import consume_all, create_topic, produce, unique_topic

pytestmark = pytest.mark.spark


def _write(df: DataFrame, bootstrap: str, **options: str) -> None:
    writer = df.write.format("odradek").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()


def test_write_then_read_back(spark: SparkSession, cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("spark-sink")
    create_topic(bootstrap, topic, 3)
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("partition", IntegerType()),
            StructField("headers", ArrayType(header)),
            StructField("ignored", StringType()),
        ]
    )
    rows = [
        (
            f"k{i}" if i % 4 else None,
            f"payload-{i}".encode() if i % 7 else None,  # a null value is a tombstone
            i % 3,
            [("trace", b"t%d" % i)] if i % 2 else None,
            "not written",
        )
        for i in range(500)
    ]
    _write(spark.createDataFrame(rows, schema), bootstrap, topic=topic)

    written = consume_all(bootstrap, topic)
    assert Counter((r.partition, r.key, r.value, r.headers) for r in written) == Counter(
        (
            p,
            k.encode() if k is not None else None,
            v,
            tuple(h) if h else None,
        )
        for k, v, p, h, _ in rows
    )
    # And through the source, as a pipeline would read it.
    back = (
        spark.read.format("odradek")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
    )
    assert back.filter(F.col("value").isNull()).count() == sum(1 for r in rows if r[1] is None)
    assert back.count() == len(rows)


def test_topic_column_and_string_values(spark: SparkSession, cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    first, second = unique_topic("spark-col"), unique_topic("spark-col")
    create_topic(bootstrap, first, 1)
    create_topic(bootstrap, second, 2)
    df = spark.range(100).select(
        F.when(F.col("id") % 2 == 0, F.lit(first)).otherwise(F.lit(second)).alias("topic"),
        F.col("id").cast("string").alias("key"),
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"),
    )
    _write(df, bootstrap)
    assert sorted(r.value for r in consume_all(bootstrap, first)) == sorted(
        b"v%d" % i for i in range(0, 100, 2)
    )
    got = consume_all(bootstrap, second)
    assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(1, 100, 2))
    # Keys are partitioned as Java clients do (murmur2), so equal keys share a partition.
    assert len({r.partition for r in got}) == 2


def _flaky_udf(marker: Path, fail_at: int) -> object:
    """A UDF that raises once, at value `fail_at`, the first time any task meets it."""

    # No type hints on UDF bodies: PySpark would try to read them as a pandas UDF's.
    def flaky(value):  # type: ignore[no-untyped-def]
        if value == fail_at and not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError("injected task failure")
        return f"row-{value}"

    return F.udf(flaky, StringType(), useArrow=False)


def test_failed_task_is_retried_without_losing_rows(
    spark: SparkSession, cluster3: LocalCluster, tmp_path: Path
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("spark-retry")
    create_topic(bootstrap, topic, 2)
    marker = tmp_path / "failed-once"
    flaky = _flaky_udf(marker, fail_at=700)
    df = spark.range(0, 1000, 1, 2).select(flaky(F.col("id")).alias("value"))
    _write(df, bootstrap, topic=topic)
    assert marker.exists(), "the failure was injected"
    values = Counter(r.value for r in consume_all(bootstrap, topic))
    assert set(values) == {f"row-{i}".encode() for i in range(1000)}  # nothing lost
    # At-least-once: what the failed attempt had produced is written again by the retry.
    assert all(n in (1, 2) for n in values.values())


def test_failing_job_is_aborted_with_a_clear_error(
    spark: SparkSession, cluster3: LocalCluster
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("spark-abort")
    create_topic(bootstrap, topic, 1)

    def always_fails(value):  # type: ignore[no-untyped-def]
        if value == 5:
            raise RuntimeError("this row cannot be written")
        return str(value)

    df = spark.range(0, 10, 1, 1).select(
        F.udf(always_fails, StringType(), useArrow=False)(F.col("id")).alias("value")
    )
    with pytest.raises(Exception, match="this row cannot be written"):
        _write(df, bootstrap, topic=topic)


def test_streaming_sink_retries_a_failed_batch(
    spark: SparkSession, cluster3: LocalCluster, tmp_path: Path
) -> None:
    bootstrap = cluster3.bootstrap_servers
    source, sink = unique_topic("spark-in"), unique_topic("spark-out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    produce(bootstrap, source, ({"value": b"%d" % i} for i in range(300)))
    flaky = _flaky_udf(tmp_path / "failed-once", fail_at=150)
    query = (
        spark.readStream.format("odradek")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "100")
        .load()
        .select(flaky(F.col("value").cast("string").cast("int")).alias("value"))
        .writeStream.format("odradek")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    assert query.exception() is None
    assert (tmp_path / "failed-once").exists()
    values = {r.value for r in consume_all(bootstrap, sink)}
    assert values == {f"row-{i}".encode() for i in range(300)}


@pytest.mark.parametrize(
    "columns, options, fragment",
    [
        (["CAST(id AS STRING) AS key"], {"topic": "t"}, "required column 'value'"),
        (["id AS value"], {"topic": "t"}, "column 'value' must be string or binary"),
        (["CAST(id AS STRING) AS value"], {}, "give the 'topic' option or a string column 'topic'"),
        (
            ["CAST(id AS STRING) AS value", "id AS partition"],
            {"topic": "t"},
            "'partition' must be int",
        ),
    ],
)
def test_sink_schema_errors(
    spark: SparkSession,
    cluster3: LocalCluster,
    columns: list[str],
    options: dict[str, str],
    fragment: str,
) -> None:
    with pytest.raises(Exception) as info:
        _write(spark.range(3).selectExpr(*columns), cluster3.bootstrap_servers, **options)
    assert fragment in str(info.value)


def test_overwrite_is_refused(spark: SparkSession, cluster3: LocalCluster) -> None:
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match="mode\\('overwrite'\\) is not supported"):
        df.write.format("odradek").option(
            "kafka.bootstrap.servers", cluster3.bootstrap_servers
        ).option("topic", "t").mode("overwrite").save()


def test_unknown_topic_without_auto_creation_fails_cleanly(
    spark: SparkSession, make_cluster: object
) -> None:
    cluster = make_cluster(brokers=1, auto_create_topics_enable=False)  # type: ignore[operator]
    bootstrap = cluster.bootstrap_servers
    df = spark.range(10).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception) as info:
        _write(df, bootstrap, topic="missing-topic")
    assert "topic 'missing-topic' does not exist" in str(info.value)
    # Topics named by a column are checked in the task, before anything is produced.
    with pytest.raises(Exception) as info:
        _write(df.withColumn("topic", F.lit("also-missing")), bootstrap)
    assert "topic 'also-missing' does not exist" in str(info.value)
    create_topic(bootstrap, "present", 1, 1)
    _write(df.withColumn("topic", F.lit("present")), bootstrap)
    assert len(consume_all(bootstrap, "present")) == 10
