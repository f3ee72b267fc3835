"""DescribeConfigs, AlterConfigs/IncrementalAlterConfigs and CreatePartitions through a real admin
client (confluent-kafka) against the shared 3-broker cluster."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

from tests.fixtures.cluster import wait_until


def _admin(cluster) -> AdminClient:  # type: ignore[no-untyped-def]
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 2})


def _topic(
    admin: AdminClient, partitions: int = 3, replication: int = 2, config: dict | None = None
) -> str:
    name = f"cfg-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, partitions, replication, config=config or {})])[
        name
    ].result(60)
    return name


def _describe(admin: AdminClient, name: str) -> dict:
    (future,) = admin.describe_configs([ConfigResource("topic", name)]).values()
    return future.result(30)


def test_describe_shows_overrides_and_defaults(cluster3) -> None:  # type: ignore[no-untyped-def]
    admin = _admin(cluster3)
    name = _topic(admin, config={"retention.ms": "123456", "min.insync.replicas": "2"})
    configs = _describe(admin, name)
    assert configs["retention.ms"].value == "123456"
    assert configs["retention.ms"].source == 1  # DYNAMIC_TOPIC_CONFIG
    assert configs["min.insync.replicas"].value == "2"
    assert configs["segment.bytes"].source == 5  # DEFAULT_CONFIG
    assert configs["cleanup.policy"].value == "delete"


def test_incremental_alter_then_describe_and_the_brokers_apply_it(cluster3) -> None:  # type: ignore[no-untyped-def]
    admin = _admin(cluster3)
    name = _topic(admin, config={"retention.ms": "1000000"})
    resource = ConfigResource(
        "topic",
        name,
        incremental_configs=[
            ConfigEntry("retention.ms", "777777", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("max.message.bytes", "2048", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    configs = _describe(admin, name)
    assert configs["retention.ms"].value == "777777"
    assert configs["max.message.bytes"].value == "2048"

    # Every broker applies the new max.message.bytes: a 4 KB record is now refused.
    from confluent_kafka import Producer

    def refused() -> bool:
        producer = Producer(
            {"bootstrap.servers": cluster3.bootstrap_servers, "log_level": 2, "retries": 0}
        )
        outcome: list = []
        producer.produce(
            name, value=b"x" * 4096, partition=0, on_delivery=lambda e, m: outcome.append(e)
        )
        producer.flush(20)
        return bool(outcome) and outcome[0] is not None and "TOO_LARGE" in outcome[0].name()

    wait_until(refused, 30, "the new max.message.bytes to reach the partition leader")

    delete = ConfigResource(
        "topic",
        name,
        incremental_configs=[
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)
        ],
    )
    for future in admin.incremental_alter_configs([delete]).values():
        future.result(30)
    assert _describe(admin, name)["retention.ms"].source == 5


def test_cleanup_policy_is_a_list_config(cluster3) -> None:  # type: ignore[no-untyped-def]
    """`compact` and `compact,delete` are accepted at creation; APPEND and SUBTRACT work on the
    list (starting from the broker default `delete` when the topic has no override)."""
    admin = _admin(cluster3)
    compacted = _topic(admin, config={"cleanup.policy": "compact"})
    assert _describe(admin, compacted)["cleanup.policy"].value == "compact"
    name = _topic(admin)

    def alter(value: str, operation: AlterConfigOpType) -> str:
        resource = ConfigResource(
            "topic",
            name,
            incremental_configs=[
                ConfigEntry("cleanup.policy", value, incremental_operation=operation)
            ],
        )
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)
        return str(_describe(admin, name)["cleanup.policy"].value)

    assert alter("compact", AlterConfigOpType.APPEND) == "delete,compact"
    assert alter("compact", AlterConfigOpType.APPEND) == "delete,compact"
    assert alter("delete", AlterConfigOpType.SUBTRACT) == "compact"
    with pytest.raises(KafkaException) as error:
        alter("shred", AlterConfigOpType.APPEND)
    assert "INVALID_CONFIG" in str(error.value)
    with pytest.raises(KafkaException) as error:
        _topic(admin, config={"cleanup.policy": "compact,shred"})
    assert "INVALID_CONFIG" in str(error.value)


def test_unknown_config_is_refused(cluster3) -> None:  # type: ignore[no-untyped-def]
    admin = _admin(cluster3)
    name = _topic(admin)
    resource = ConfigResource(
        "topic",
        name,
        incremental_configs=[
            ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(KafkaException) as error:
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)
    assert "INVALID_CONFIG" in str(error.value)
    assert "no.such.config" not in _describe(admin, name)


def test_create_partitions_grows_the_topic_with_leaders(cluster3) -> None:  # type: ignore[no-untyped-def]
    admin = _admin(cluster3)
    name = _topic(admin, partitions=2, replication=3)
    for future in admin.create_partitions([NewPartitions(name, 5)]).values():
        future.result(60)
    metadata = admin.list_topics(name, timeout=10).topics[name]
    assert sorted(metadata.partitions) == [0, 1, 2, 3, 4]
    for partition in metadata.partitions.values():
        assert partition.leader >= 0
        assert len(set(partition.replicas)) == 3

    with pytest.raises(KafkaException) as error:
        for future in admin.create_partitions([NewPartitions(name, 3)]).values():
            future.result(30)
    assert "INVALID_PARTITIONS" in str(error.value)


def test_describe_broker_configs(cluster3) -> None:  # type: ignore[no-untyped-def]
    admin = _admin(cluster3)
    broker_id = cluster3.brokers[0].id
    (future,) = admin.describe_configs([ConfigResource("broker", str(broker_id))]).values()
    configs = future.result(30)
    assert configs["broker.id"].value == str(broker_id)
    assert configs["broker.id"].is_read_only


def test_describe_of_an_unknown_topic_is_unknown_topic_or_partition(cluster3) -> None:  # type: ignore[no-untyped-def]
    """Kafka's answer; the broker checks its metadata cache (then the assignment znode's
    existence) and no longer reads the topic's whole assignment."""
    admin = _admin(cluster3)
    with pytest.raises(KafkaException) as raised:
        _describe(admin, f"cfg-missing-{uuid.uuid4().hex[:8]}")
    assert raised.value.args[0].code() == 3  # UNKNOWN_TOPIC_OR_PARTITION
    name = _topic(admin)
    assert _describe(admin, name)["cleanup.policy"].value == "delete"  # just created
