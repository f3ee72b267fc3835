"""The same `kafka.*` security settings -- the Java client's, as a user of Spark's Kafka connector
writes them (SASL_SSL, SCRAM-SHA-512 through `sasl.jaas.config`, a PEM truststore) -- given to
`format("kafka")` and `format("odradek")` on the shared secure cluster: both write, both read
back what the other wrote."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import NewTopic
from pyspark.sql import SparkSession

from odradek.testing.secure import bootstrap
from tests.fixtures.secure import SecureEnv
from tests.spark.topics import unique_topic

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("kafka_connector")]


def test_java_security_settings_work_for_both_formats(
    spark: SparkSession, secure_cluster: SecureEnv
) -> None:
    java = {f"kafka.{k}": v for k, v in secure_cluster.setup.client_properties().items()}
    servers = bootstrap(secure_cluster.cluster, "SASL_SSL")
    topic = unique_topic("spark-secure")
    admin = secure_cluster.admin()
    for future in admin.create_topics([NewTopic(topic, 2, 3)]).values():
        future.result(timeout=60)
    for fmt, first in (("kafka", 0), ("odradek", 100)):
        (
            spark.range(first, first + 100)
            .selectExpr("CAST(id AS STRING) AS key", "CONCAT('s-', CAST(id AS STRING)) AS value")
            .write.format(fmt)
            .option("kafka.bootstrap.servers", servers)
            .options(**java)
            .option("topic", topic)
            .mode("append")  # a Python data source refuses PySpark's default, ErrorIfExists
            .save()
        )
    expected = sorted(f"s-{i}".encode() for i in range(200))
    for fmt in ("kafka", "odradek"):
        df = (
            spark.read.format(fmt)
            .option("kafka.bootstrap.servers", servers)
            .options(**java)
            .option("subscribe", topic)
            .load()
        )
        assert sorted(bytes(r["value"]) for r in df.select("value").collect()) == expected, fmt
    # Without the credentials the odradek source is refused, as the connector would be.
    plain = {k: v for k, v in java.items() if k != "kafka.sasl.jaas.config"}
    with pytest.raises(Exception):  # noqa: B017 - librdkafka's authentication error text
        (
            spark.read.format("odradek")
            .option("kafka.bootstrap.servers", servers)
            .options(**plain)
            .option("subscribe", topic)
            .option("kafka.sasl.username", "client")
            .option("kafka.sasl.password", "wrong")
            .option("fetchOffset.numRetries", "0")
            .load()
            .collect()
        )
