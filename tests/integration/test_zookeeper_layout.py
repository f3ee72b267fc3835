"""ZooKeeper holds Kafka's exact paths and JSON, so Kafka-aware tools can read an Odradek cluster.

The reference is Apache Kafka's `kafka.zk.ZkData` (ZooKeeper mode, 2.8): the field names, value
types and versions of every znode a broker, the controller and the admin path write. The test
creates a topic through a real client (kafka-python's CreateTopics, which also returns the topic
id) on the shared `cluster3`, then reads ZooKeeper with a plain `KazooClient` -- not through
`odradek.zk` -- and checks each znode's exact key set, types and values, cross-checked against
what the brokers tell clients (Metadata, DescribeTopics). JSON is compact, as Kafka's Jackson
writer produces it.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient

from odradek.testing import LocalCluster
from tests.integration._clients import unique_topic, wait_until_serving

BROKER_V5_KEYS = {
    "version",
    "host",
    "port",
    "endpoints",
    "listener_security_protocol_map",
    "jmx_port",
    "features",
    "timestamp",
}
STATE_KEYS = {"controller_epoch", "leader", "version", "leader_epoch", "isr"}
DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def zk(cluster3: LocalCluster) -> Iterator[KazooClient]:
    client = KazooClient(hosts=cluster3.zookeeper_connect, timeout=10)
    client.start(timeout=30)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def read_json(zk: KazooClient, path: str) -> tuple[dict[str, Any], Any]:
    """A znode's JSON object and its stat; the bytes must be compact UTF-8 JSON."""
    data, stat = zk.get(path)
    text = data.decode("utf-8")
    assert ": " not in text and ", " not in text, f"{path} is not compact JSON: {text}"
    value = json.loads(text)
    assert isinstance(value, dict), path
    return value, stat


def kafka_topic_id(value: uuid.UUID | str) -> str:
    """Kafka's textual topic id: the 16 bytes in URL-safe base64 without padding."""
    raw = (value if isinstance(value, uuid.UUID) else uuid.UUID(value)).bytes
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def confluent_topic_id(value: Any) -> str:
    """A confluent-kafka `Uuid` in Kafka's text form (its own str() uses standard base64)."""
    most, least = value.get_most_significant_bits(), value.get_least_significant_bits()
    return kafka_topic_id(uuid.UUID(int=((most % 2**64) << 64) | (least % 2**64)))


def is_millis_text(value: object) -> bool:
    now = int(time.time() * 1000)
    return isinstance(value, str) and value.isdigit() and now - DAY_MS < int(value) <= now + 60_000


def create_with_kafka_python(bootstrap: str, topic: str) -> str:
    """CreateTopics (3 partitions, 2 replicas, one config) through kafka-python; the topic id."""
    from kafka.admin import KafkaAdminClient, NewTopic

    wait_until_serving(bootstrap)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        response = admin.create_topics(
            [NewTopic(topic, 3, 2, topic_configs={"retention.ms": "123456789"})]
        )
    finally:
        admin.close()
    (created,) = response["topics"]
    assert created["error_code"] == 0
    return kafka_topic_id(created["topic_id"])


def test_zookeeper_holds_kafkas_layout(cluster3: LocalCluster, zk: KazooClient):
    topic = unique_topic("zk-layout")
    bootstrap = cluster3.bootstrap_servers
    topic_id = create_with_kafka_python(bootstrap, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=30)
    description = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30)

    # /brokers/ids/<id>: ephemeral, version 5 registration.
    assert sorted(zk.get_children("/brokers/ids"), key=int) == ["1", "2", "3"]
    for broker in cluster3.brokers:
        registration, stat = read_json(zk, f"/brokers/ids/{broker.id}")
        assert set(registration) == BROKER_V5_KEYS  # no "rack": cluster3 sets none
        assert registration["version"] == 5
        assert (registration["host"], registration["port"]) == (broker.host, broker.port)
        assert registration["endpoints"] == [f"PLAINTEXT://{broker.host}:{broker.port}"]
        assert registration["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT"}
        assert registration["jmx_port"] == -1
        assert registration["features"] == {}
        assert is_millis_text(registration["timestamp"])
        assert stat.ephemeralOwner != 0

    # /brokers/topics/<t>: persistent assignment, version 2, with the topic id.
    assignment, stat = read_json(zk, f"/brokers/topics/{topic}")
    assert set(assignment) == {
        "version",
        "partitions",
        "adding_replicas",
        "removing_replicas",
        "topic_id",
    }
    assert assignment["version"] == 2
    assert assignment["adding_replicas"] == {} and assignment["removing_replicas"] == {}
    assert assignment["topic_id"] == topic_id == confluent_topic_id(description.topic_id)
    replicas = assignment["partitions"]
    assert sorted(replicas) == ["0", "1", "2"]
    for partition in description.partitions:
        assigned = replicas[str(partition.id)]
        assert len(assigned) == 2 and len(set(assigned)) == 2 and set(assigned) <= {1, 2, 3}
        assert assigned == [r.id for r in partition.replicas]
    assert stat.ephemeralOwner == 0

    # /brokers/topics/<t>/partitions/<p>/state: exactly Kafka's five fields.
    controller_epoch = int(zk.get("/controller_epoch")[0].decode("ascii"))
    assert sorted(zk.get_children(f"/brokers/topics/{topic}/partitions"), key=int) == [
        "0",
        "1",
        "2",
    ]
    for partition in description.partitions:
        path = f"/brokers/topics/{topic}/partitions/{partition.id}/state"
        state, _ = read_json(zk, path)
        assert set(state) == STATE_KEYS
        assert all(isinstance(state[k], int) for k in STATE_KEYS - {"isr"})
        assert state["version"] == 1
        assert state["leader"] == partition.leader.id
        assert state["leader"] in state["isr"]
        assert set(state["isr"]) <= set(replicas[str(partition.id)])
        assert state["leader_epoch"] >= 0
        assert 1 <= state["controller_epoch"] <= controller_epoch

    # /controller: ephemeral, names the controller the brokers report to clients.
    controller, stat = read_json(zk, "/controller")
    assert set(controller) == {"version", "brokerid", "timestamp"}
    assert controller["version"] == 1
    assert controller["brokerid"] == cluster3.controller_id() == metadata.controller_id
    assert is_millis_text(controller["timestamp"])
    assert stat.ephemeralOwner != 0

    # /controller_epoch: a bare decimal integer, not JSON.
    raw_epoch = zk.get("/controller_epoch")[0]
    assert raw_epoch == str(controller_epoch).encode() and controller_epoch >= 1

    # /cluster/id: the version is a string here, unlike everywhere else.
    cluster_id, _ = read_json(zk, "/cluster/id")
    assert cluster_id == {"version": "1", "id": metadata.cluster_id}

    # /config/topics/<t>: the topic's overrides, and only them.
    config, _ = read_json(zk, f"/config/topics/{topic}")
    assert config == {"version": 1, "config": {"retention.ms": "123456789"}}

    # The persistent paths every Kafka broker creates.
    for path in (
        "/admin/delete_topics",
        "/isr_change_notification",
        "/config/changes",
        "/config/topics",
        "/brokers/seqid",
        "/consumers",
    ):
        assert zk.exists(path) is not None, path
