"""`kafka.isolation.level=read_committed` in the `odradek` source, batch and streaming, over a
topic with committed, aborted, plain and still-open transactional records."""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka import IsolationLevel
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql import DataFrame, SparkSession

from odradek.errors import DataSourceOptionError
from odradek.spark.clients import consumer_config, producer_config
from odradek.spark.options import SourceOptions
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.spark.streaming import check_alive, end_offsets, stream
from tests.spark.topics import create_topic, unique_topic
from tests.spark.transactional import PARTITIONS, TransactionalInput, load_transactions

pytestmark = pytest.mark.spark


def _latest(bootstrap: str, topic: str, isolation: IsolationLevel) -> dict[int, int]:
    """ListOffsets latest: the LSO under READ_COMMITTED, the HW under READ_UNCOMMITTED (a
    consumer's get_watermark_offsets would use its own isolation level, read_committed by
    librdkafka's default)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = {RdTopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)}
    futures = admin.list_offsets(request, isolation_level=isolation)
    return {tp.partition: f.result(30).offset for tp, f in futures.items()}


def _stable_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    return _latest(bootstrap, topic, IsolationLevel.READ_COMMITTED)


def _high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    return _latest(bootstrap, topic, IsolationLevel.READ_UNCOMMITTED)


@pytest.fixture(scope="module")
def txn_input(cluster3: LocalCluster) -> TransactionalInput:
    topic = unique_topic("spark-rc")
    create_topic(cluster3.bootstrap_servers, topic, PARTITIONS)
    return load_transactions(cluster3.bootstrap_servers, topic)


def _read(spark: SparkSession, bootstrap: str, topic: str, **options: str) -> DataFrame:
    reader = (
        spark.read.format("odradek")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_isolation_level_option() -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    assert SourceOptions.parse(base).isolation_level == "read_uncommitted"
    parsed = SourceOptions.parse({**base, "kafka.isolation.level": "READ_COMMITTED"})
    assert parsed.read_committed
    assert "isolation.level" not in parsed.client_params
    with pytest.raises(DataSourceOptionError, match=r"kafka\.isolation\.level"):
        SourceOptions.parse({**base, "kafka.isolation.level": "serializable"})


def test_batch_read_committed_skips_aborted_and_stops_at_lso(
    spark: SparkSession, cluster3: LocalCluster, txn_input: TransactionalInput
) -> None:
    bootstrap = cluster3.bootstrap_servers
    lso = _stable_offsets(bootstrap, txn_input.topic)
    hw = _high_watermarks(bootstrap, txn_input.topic)
    assert all(lso[p] < hw[p] for p in hw), (lso, hw)  # the open transaction holds the LSO back

    rows = _read(
        spark, bootstrap, txn_input.topic, **{"kafka.isolation.level": "read_committed"}
    ).collect()
    assert Counter(r["value"] for r in rows) == Counter(txn_input.committed)
    for row in rows:
        assert row["offset"] < lso[row["partition"]]

    # An explicit end past the LSO is past the latest offset a read_committed read may reach.
    with pytest.raises(Exception, match="past its latest offset"):
        _read(
            spark,
            bootstrap,
            txn_input.topic,
            endingOffsets=f'{{"{txn_input.topic}": {{"0": {hw[0]}, "1": {lso[1]}}}}}',
            **{"kafka.isolation.level": "read_committed"},
        ).collect()


def test_batch_read_uncommitted_is_the_default(
    spark: SparkSession, cluster3: LocalCluster, txn_input: TransactionalInput
) -> None:
    bootstrap = cluster3.bootstrap_servers
    rows = _read(spark, bootstrap, txn_input.topic).collect()
    # Every data record up to the HW, aborted and open ones too; control batches (the markers
    # of three finished transactions) take offsets but are never rows.
    assert Counter(r["value"] for r in rows) == Counter(
        txn_input.committed + txn_input.aborted + txn_input.open
    )
    assert sum(_high_watermarks(bootstrap, txn_input.topic).values()) > len(rows)


def test_stream_read_committed_waits_for_the_open_transaction(
    spark: SparkSession, cluster3: LocalCluster
) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("spark-rc-stream")
    create_topic(bootstrap, topic, PARTITIONS)
    data = load_transactions(bootstrap, topic)
    name = topic.replace("-", "_")
    query = (
        stream(
            spark,
            bootstrap,
            subscribe=topic,
            startingOffsets="earliest",
            **{"kafka.isolation.level": "read_committed"},
        )
        .select("value", "partition", "offset")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def seen() -> list[bytes]:
        check_alive(query)
        return [r["value"] for r in spark.sql(f"SELECT value FROM {name}").collect()]

    try:
        lso = {str(p): o for p, o in _stable_offsets(bootstrap, topic).items()}
        wait_until(lambda: end_offsets(query).get(topic) == lso, 120, f"batches up to {lso}")
        assert Counter(seen()) == Counter(data.committed)
        # Later triggers stay at the LSO while the transaction is open...
        progress = len(query.recentProgress)
        wait_until(lambda: len(query.recentProgress) >= progress + 3, 60, "three more triggers")
        assert end_offsets(query).get(topic) == lso
        # ...and read it once it commits, its COMMIT marker not a row.
        data.producer.commit_transaction(60)
        wait_until(lambda: len(seen()) >= len(data.committed) + len(data.open), 120, "all rows")
        hw = {str(p): o for p, o in _high_watermarks(bootstrap, topic).items()}
        wait_until(lambda: end_offsets(query).get(topic) == hw, 60, f"batches up to {hw}")
        assert Counter(seen()) == Counter(data.committed + data.open)
    finally:
        query.stop()


def test_client_configs() -> None:
    assert consumer_config("b:1", {})["isolation.level"] == "read_uncommitted"
    assert consumer_config("b:1", {}, "read_committed")["isolation.level"] == "read_committed"
    plain = producer_config("b:1", {})
    assert plain["enable.idempotence"] is False and "transactional.id" not in plain
    txn = producer_config("b:1", {}, "odradek-spark-q-0")
    assert txn["enable.idempotence"] is True and txn["transactional.id"] == "odradek-spark-q-0"
    assert txn["acks"] == "all"
