"""Option parity of the `odradek` source with Spark's own Kafka connector, on the shared cluster.

Where both formats take an option, the same options go to `format("kafka")` and
`format("odradek")` and the rows must be the same (the connector is the reference); each case
also checks the rows against what the option means, so that two equally wrong readers fail too.
The topic's record i sits in partition i % 3 with the timestamp BASE_MS + i * 1000, so a
timestamp maps to known offsets.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from odradek.spark.progress import offsets_behind_latest
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.spark.streaming import check_alive, rows_processed, stream, to_parquet
from tests.spark.topics import create_topic, produce, unique_topic

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("kafka_connector")]

RECORDS = 300
PARTITIONS = 3
BASE_MS = 1_700_000_000_000
NEVER_MS = BASE_MS + 10**9  # later than every record

Row = tuple[int, int, bytes]  # partition, offset, value


def _ts(i: int) -> int:
    return BASE_MS + i * 1000


@pytest.fixture(scope="module")
def timed(cluster3: LocalCluster) -> str:
    topic = unique_topic("parity")
    create_topic(cluster3.bootstrap_servers, topic, PARTITIONS)
    produce(
        cluster3.bootstrap_servers,
        topic,
        (
            {"value": b"v%d" % i, "partition": i % PARTITIONS, "timestamp": _ts(i)}
            for i in range(RECORDS)
        ),
    )
    return topic


def _expected(start_ms: int = 0, end_ms: int | None = None) -> list[Row]:
    """Records whose timestamp is in [start_ms, end_ms): an end by timestamp is exclusive (the
    first offset at or after it)."""
    return sorted(
        (i % PARTITIONS, i // PARTITIONS, b"v%d" % i)
        for i in range(RECORDS)
        if _ts(i) >= start_ms and (end_ms is None or _ts(i) < end_ms)
    )


def _read(spark: SparkSession, fmt: str, bootstrap: str, options: dict[str, str]) -> list[Row]:
    df = spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap).options(**options)
    return sorted(
        (r["partition"], r["offset"], bytes(r["value"]))
        for r in df.load().select("partition", "offset", "value").collect()
    )


def _both(spark: SparkSession, bootstrap: str, options: dict[str, str]) -> list[Row]:
    """The rows both formats read with `options`; they must agree."""
    reference = _read(spark, "kafka", bootstrap, options)
    assert _read(spark, "odradek", bootstrap, options) == reference
    return reference


def test_timestamp_options_read_what_sparks_connector_reads(
    spark: SparkSession, cluster3: LocalCluster, timed: str
) -> None:
    bootstrap, topic = cluster3.bootstrap_servers, timed
    by_ts = {topic: {"0": _ts(30), "1": _ts(0), "2": _ts(299)}}
    cases: list[tuple[dict[str, str], list[Row]]] = [
        # One timestamp for every partition (150 is exact on partition 0, between on 1 and 2).
        ({"subscribe": topic, "startingTimestamp": str(_ts(150))}, _expected(_ts(150))),
        # startingTimestamp wins over startingOffsets, as in Spark.
        (
            {
                "subscribe": topic,
                "startingTimestamp": str(_ts(150) + 1),
                "startingOffsets": "earliest",
            },
            _expected(_ts(151)),
        ),
        (
            {
                "subscribe": topic,
                "startingTimestamp": str(_ts(100) + 500),
                "endingTimestamp": str(_ts(200) + 500),
            },
            _expected(_ts(101), _ts(201)),
        ),
        (
            {"subscribe": topic, "startingOffsetsByTimestamp": json.dumps(by_ts)},
            [r for r in _expected() if _ts(r[1] * PARTITIONS + r[0]) >= by_ts[topic][str(r[0])]],
        ),
        # An end later than every record is the latest offset.
        (
            {
                "assign": json.dumps({topic: [1, 2]}),
                "endingOffsetsByTimestamp": json.dumps({topic: {"1": _ts(31), "2": NEVER_MS}}),
            },
            [r for r in _expected() if r[0] == 2 or (r[0] == 1 and r[1] * 3 + 1 < 31)],
        ),
        # No record that late: with strategy latest, the partitions start at their end.
        (
            {
                "subscribe": topic,
                "startingTimestamp": str(NEVER_MS),
                "startingOffsetsByTimestampStrategy": "latest",
            },
            [],
        ),
    ]
    for options, expected in cases:
        assert _both(spark, bootstrap, options) == expected, options


def test_timestamp_errors_fail_both_formats(
    spark: SparkSession, cluster3: LocalCluster, timed: str
) -> None:
    bootstrap, topic = cluster3.bootstrap_servers, timed
    no_match = {"subscribe": topic, "startingTimestamp": str(NEVER_MS)}
    with pytest.raises(Exception, match="No offset matched"):
        _read(spark, "kafka", bootstrap, no_match)
    with pytest.raises(Exception, match=r"startingTimestamp: no record of .* at or after"):
        _read(spark, "odradek", bootstrap, no_match)
    # A by-timestamp spec must name every partition read.
    partial = {
        "subscribe": topic,
        "startingOffsetsByTimestamp": json.dumps({topic: {"0": _ts(0)}}),
    }
    with pytest.raises(Exception):  # noqa: B017 - the connector's assertion error, any wording
        _read(spark, "kafka", bootstrap, partial)
    with pytest.raises(Exception, match="startingOffsetsByTimestamp: a timestamp is needed"):
        _read(spark, "odradek", bootstrap, partial)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"startingTimestamp": "yesterday"}, "startingTimestamp: expected a timestamp"),
        ({"endingTimestamp": "-5"}, "endingTimestamp: expected a timestamp"),
        ({"startingOffsetsByTimestamp": "[1]"}, "startingOffsetsByTimestamp: expected JSON"),
        ({"startingOffsetsByTimestampStrategy": "first"}, "expected error or latest, got 'first'"),
        ({"minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger: expected a positive integer"),
        (
            {"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
            "minOffsetsPerTrigger: 10 is higher than maxOffsetsPerTrigger 5",
        ),
        ({"maxTriggerDelay": "soon"}, "maxTriggerDelay: expected a duration such as 500ms"),
        ({"maxRecordsPerPartition": "-1"}, "maxRecordsPerPartition: expected a positive integer"),
        (
            {"kafka.ssl.truststore.type": "JKS", "kafka.ssl.truststore.location": "/x"},
            "kafka.ssl.truststore.type: JKS is not supported (accepted: PEM, PKCS12)",
        ),
    ],
)
def test_bad_options_fail_load_with_one_line_naming_the_option(
    spark: SparkSession, cluster3: LocalCluster, timed: str, options: dict[str, str], fragment: str
) -> None:
    with pytest.raises(Exception) as info:
        _read(spark, "odradek", cluster3.bootstrap_servers, {"subscribe": timed, **options})
    assert fragment in str(info.value)


def test_max_records_per_partition_splits_ranges(
    spark: SparkSession, cluster3: LocalCluster, timed: str
) -> None:
    """100 records per partition at most 40 per task: 3 tasks each. (The connector 4.2.0 reads
    the same rows but, in a batch read, in one task per partition: it does not split there.)"""
    bootstrap = cluster3.bootstrap_servers
    options = {"subscribe": timed, "maxRecordsPerPartition": "40"}
    df = spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap)
    assert df.options(**options).load().rdd.getNumPartitions() == PARTITIONS * 3
    assert _both(spark, bootstrap, options) == _expected()


def _drain(spark: SparkSession, fmt: str, bootstrap: str, tmp: Path, **options: str) -> Any:
    """A Trigger.AvailableNow query of `fmt` into Parquet, run to its end: (rows, progresses)."""
    reader = spark.readStream.format(fmt).option("kafka.bootstrap.servers", bootstrap)
    query = (
        reader.options(**options)
        .load()
        .select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(tmp / fmt / "out"))
        .option("checkpointLocation", str(tmp / fmt / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), f"{fmt}: the AvailableNow query did not finish"
        assert query.exception() is None, query.exception()
        progress = list(query.recentProgress)
    finally:
        query.stop()
    rows = spark.read.parquet(str(tmp / fmt / "out")).collect()
    return sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows), progress


def test_stream_from_a_timestamp_and_offsets_behind_latest_match_the_connector(
    spark: SparkSession, cluster3: LocalCluster, timed: str, tmp_path: Path
) -> None:
    """startingTimestamp on a stream, drained 60 records per batch: the same rows, the same
    batches, and per batch the offsets behind latest the connector reports as source metrics
    (computed for odradek from its progress: a Python source cannot report metrics)."""
    bootstrap = cluster3.bootstrap_servers
    options = {
        "subscribe": timed,
        "startingTimestamp": str(_ts(60)),
        "maxOffsetsPerTrigger": "60",
    }
    reference, reference_progress = _drain(spark, "kafka", bootstrap, tmp_path, **options)
    rows, progress = _drain(spark, "odradek", bootstrap, tmp_path, **options)
    assert reference == _expected(_ts(60)) and rows == reference
    sizes = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert sizes == [p["numInputRows"] for p in reference_progress if p["numInputRows"]]
    assert sizes == [60, 60, 60, 60]
    metrics = [
        {k: v for k, v in p["sources"][0]["metrics"].items() if "OffsetsBehindLatest" in k}
        for p in reference_progress
        if p["numInputRows"]
    ]
    computed = [offsets_behind_latest(p["sources"][0]) for p in progress if p["numInputRows"]]
    assert computed == metrics
    assert computed[0] == {
        "minOffsetsBehindLatest": "60",
        "avgOffsetsBehindLatest": "60.0",
        "maxOffsetsBehindLatest": "60",
    }


def test_min_offsets_per_trigger_waits_until_max_trigger_delay(
    spark: SparkSession, cluster3: LocalCluster, tmp_path: Path
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("parity-min")
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, [{"value": b"first"}])
    waits = to_parquet(
        stream(
            bootstrap=bootstrap,
            spark=spark,
            subscribe=topic,
            startingOffsets="earliest",
            minOffsetsPerTrigger="100",
            maxTriggerDelay="10m",
        ),
        tmp_path / "a",
        tmp_path / "chk-a",
        {"processingTime": "100 milliseconds"},
    )
    delayed = to_parquet(
        stream(
            bootstrap=bootstrap,
            spark=spark,
            subscribe=topic,
            startingOffsets="earliest",
            minOffsetsPerTrigger="1000",
            maxTriggerDelay="3s",
        ),
        tmp_path / "b",
        tmp_path / "chk-b",
        {"processingTime": "100 milliseconds"},
    )
    try:
        # The first trigger of a run is never held back (Spark's rule): the one record passes.
        for query in (waits, delayed):
            wait_until(lambda q=query: check_alive(q) or rows_processed(q) == 1, 120, "1 row")
        produce(bootstrap, topic, ({"value": b"w%d" % i} for i in range(30)))
        # 30 waiting < 100: over 2 s of 100 ms triggers nothing runs...
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            check_alive(waits)
            assert rows_processed(waits) == 1
            time.sleep(0.1)
        # ...while the other query, held back by 1000, runs them once 3 s have passed.
        wait_until(lambda: check_alive(delayed) or rows_processed(delayed) == 31, 60, "31 rows")
        # 110 waiting >= 100: the batch runs without waiting for maxTriggerDelay (10 min).
        produce(bootstrap, topic, ({"value": b"x%d" % i} for i in range(80)))
        wait_until(lambda: check_alive(waits) or rows_processed(waits) == 111, 60, "111 rows")
    finally:
        waits.stop()
        delayed.stop()


def test_fail_on_data_loss_after_delete_records(
    spark: SparkSession, cluster3: LocalCluster, tmp_path: Path
) -> None:
    """DeleteRecords under a query's feet: a batch read from offset 0 and a stream restarted
    from a checkpoint behind the new log start fail with failOnDataLoss (the default), and skip
    to the log start with failOnDataLoss=false -- the batch rows equal the connector's."""
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("parity-delete")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, ({"value": b"d%d" % i} for i in range(100)))
    checkpoints = {flag: tmp_path / f"chk-{flag}" for flag in ("true", "false")}
    for flag, checkpoint in checkpoints.items():  # both streams read offsets 0..99, then stop
        query = to_parquet(
            stream(
                spark, bootstrap, subscribe=topic, startingOffsets="earliest", failOnDataLoss=flag
            ),
            tmp_path / f"out-{flag}",
            checkpoint,
            {"availableNow": True},
        )
        assert query.awaitTermination(120) and query.exception() is None
    produce(bootstrap, topic, ({"value": b"d%d" % i} for i in range(100, 200)))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (deleted,) = admin.delete_records([RdTopicPartition(topic, 0, 150)]).values()
    assert deleted.result(timeout=30).low_watermark == 150

    from_zero = {
        "assign": json.dumps({topic: [0]}),
        "startingOffsets": json.dumps({topic: {"0": 0}}),
    }
    for fmt in ("kafka", "odradek"):
        with pytest.raises(Exception, match=r"(?i)data.*lost|failOnDataLoss"):
            _read(spark, fmt, bootstrap, from_zero)
    lenient = {**from_zero, "failOnDataLoss": "false"}
    assert _both(spark, bootstrap, lenient) == [(0, o, b"d%d" % o) for o in range(150, 200)]

    for flag, checkpoint in checkpoints.items():
        query = to_parquet(
            stream(spark, bootstrap, subscribe=topic, failOnDataLoss=flag),
            tmp_path / f"out-{flag}",
            checkpoint,
            {"availableNow": True},
        )
        try:
            finished, error = query.awaitTermination(120), None
        except Exception as e:  # the query failed: awaitTermination raises its exception
            finished, error = True, e
        finally:
            query.stop()
        assert finished
        if flag == "true":
            assert error is not None and "were deleted (the log now starts at 150)" in str(error)
            continue
        assert error is None
        rows = spark.read.parquet(str(tmp_path / f"out-{flag}")).collect()
        assert sorted(r["offset"] for r in rows) == [*range(100), *range(150, 200)]
