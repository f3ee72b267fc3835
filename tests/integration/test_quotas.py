"""Client quotas on real brokers, driven by real clients (KIP-13/55/219).

* `odradek configs --alter --add-config producer_byte_rate=R --entity-type clients` holds a
  confluent-kafka producer with that client id to R (±20%) over 10 s — measured as the bytes the
  broker acknowledged — while the client sees `throttle_time_ms` in its statistics; a producer
  with another client id is not held back.
* A `consumer_byte_rate` quota, set through a broker that does not lead the partition (so that
  the leader learns it from the `/config/changes` notification), holds a consumer to its rate.
* A user quota over SASL (PLAIN user `bob` on the shared secure cluster): bob gets the ten
  windows' burst Kafka's rate allows and no more, while another user is not throttled.
* AlterClientQuotas' validation (validate_only, Kafka's INVALID_REQUEST cases) on the wire, and
  Kafka 3.9.1's own `kafka-configs` (ConfigCommand) altering and describing quotas against
  Odradek, with the same output as `odradek configs`.

The throttle tests take ~10 s each (the measurement) on the session's shared clusters.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode

from odradek.network.client import BrokerConnection
from odradek.protocol.build import build
from odradek.protocol.codec import request_class
from odradek.security.api_acls import ALTER_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS
from odradek.testing import LocalCluster
from odradek.testing.secure import ADMIN, CLIENT
from tests.fixtures.cluster import wait_until
from tests.fixtures.secure import SecureEnv
from tests.integration._clients import create_topic, unique_topic
from tests.integration._kafka import kafka_available, kafka_libs
from tests.integration._replication import zk_partition_state
from tests.integration._secure_clients import create_topic as create_secure_topic
from tests.integration._secure_clients import librdkafka_config
from tests.integration._tools import assert_one_line_error, odradek

RATE = 200 * 1024  # bytes/s
MEASURE_S = 11.0
"""One whole quota window (11 samples of 1 s): Kafka's rate lets a client send ten windows' worth at
once, then holds it until that burst ages out of the window, so it is over a whole window that
the quota holds (over the first 10 s alone the same client shows ~1.1x its quota)."""
VALUE = b"q" * 1000


def _leader(bootstrap: str, topic: str) -> int:
    """Partition 0's leader, once the metadata the client gets names one (a broker may not
    have heard of a new topic yet)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def leader() -> int | None:
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
        found = partitions.get(0)
        return found.leader if found is not None and found.leader >= 0 else None

    return int(wait_until(leader, timeout=30, message=f"a leader for {topic}-0"))


def _configs(bootstrap: str, *args: str, command_config: Path | None = None) -> str:
    extra = ("--command-config", str(command_config)) if command_config else ()
    result = odradek("configs", "--bootstrap-server", bootstrap, *extra, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


class Throughput:
    """Produces as fast as the client goes (at most `outstanding` bytes unacknowledged) for
    `seconds`; counts the bytes acknowledged and the largest throttle time the client saw."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.topic = topic
        self.acked = 0
        self.max_throttle_ms = 0
        self.errors: list[str] = []
        self.producer = Producer(
            {
                "acks": "1",
                "linger.ms": 5,
                # Small requests: the quota is counted per request, and each throttle lets one
                # more request through, so large batches would make the measurement coarse.
                "batch.size": 4096,
                "statistics.interval.ms": 500,
                "stats_cb": self._stats,
                **config,
            }
        )

    def _stats(self, text: str) -> None:
        for broker in json.loads(text).get("brokers", {}).values():
            self.max_throttle_ms = max(
                self.max_throttle_ms, broker.get("throttle", {}).get("max", 0)
            )

    def _delivered(self, error: Any, message: Any) -> None:
        if error is None:
            self.acked += len(message.value())
        elif "purge" not in str(error).lower():
            self.errors.append(str(error))

    def run(self, seconds: float, outstanding: int = 4 * 1024 * 1024) -> float:
        """Bytes acknowledged per second over `seconds` from the first send."""
        sent = 0
        start = time.monotonic()
        while (now := time.monotonic()) - start < seconds:
            if sent - self.acked < outstanding:
                try:
                    self.producer.produce(self.topic, VALUE, on_delivery=self._delivered)
                    sent += len(VALUE)
                    continue
                except BufferError:
                    pass
            self.producer.poll(0.01)
        acked = self.acked
        elapsed = now - start
        self.producer.purge()
        self.producer.flush(5)
        del self.producer  # destroyed now, not after the cluster is gone
        assert not self.errors, self.errors[:3]
        return acked / elapsed


def _log_mark(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _logged_since(path: Path, mark: int, text: str) -> bool:
    with path.open("rb") as f:
        f.seek(mark)
        return text.encode() in f.read()


def test_producer_byte_rate_throttles_one_client_id(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("quota-produce")
    create_topic(bootstrap, topic, partitions=1, replication_factor=1)
    leader = cluster3.broker(_leader(bootstrap, topic))
    throttled, free = unique_topic("throttled"), unique_topic("free")
    # Altered through the leader itself: it applies the quota before it answers.
    out = _configs(
        leader.bootstrap, "--alter", "--add-config", f"producer_byte_rate={RATE}",
        "--entity-type", "clients", "--entity-name", throttled,
    )  # fmt: skip
    assert out == f"Completed updating config for client {throttled}.\n"
    # Another client id is not held back: many times the quota in two seconds.
    unlimited = Throughput({"bootstrap.servers": bootstrap, "client.id": free}, topic)
    assert unlimited.run(2.0) > 5 * RATE
    assert unlimited.max_throttle_ms == 0
    client = Throughput({"bootstrap.servers": bootstrap, "client.id": throttled}, topic)
    rate = client.run(MEASURE_S)
    print(f"producer held to {rate / RATE:.3f} of its quota over {MEASURE_S} s")
    assert 0.8 * RATE <= rate <= 1.2 * RATE, f"{rate / 1024:.0f} KiB/s against {RATE // 1024}"
    assert client.max_throttle_ms > 0  # the broker told the client (throttle_time_ms)
    _configs(
        leader.bootstrap, "--alter", "--delete-config", "producer_byte_rate",
        "--entity-type", "clients", "--entity-name", throttled,
    )  # fmt: skip


def test_consumer_byte_rate_throttles_a_consumer(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("quota-fetch")
    create_topic(bootstrap, topic, partitions=1, replication_factor=1)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 20, "batch.size": 4096}
    )
    count = (12 * RATE) // len(VALUE) * 2  # more than the consumer can take in the window
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, VALUE)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    leader = cluster3.broker(_leader(bootstrap, topic))
    other = next(b for b in cluster3.brokers if b.id != leader.id)
    client_id = unique_topic("reader")
    mark = _log_mark(leader.log)
    _configs(
        other.bootstrap, "--alter", "--add-config", f"consumer_byte_rate={RATE}",
        "--entity-type", "clients", "--entity-name", client_id,
    )  # fmt: skip
    # The leader follows the change notification.
    wait_until(
        lambda: _logged_since(leader.log, mark, f"quotas of clients/{client_id}"),
        timeout=30,
        message="the leader applied the consumer quota",
    )
    throttles: list[int] = []

    def on_stats(text: str) -> None:
        for broker in json.loads(text).get("brokers", {}).values():
            throttles.append(broker.get("throttle", {}).get("max", 0))

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": client_id,
            "client.id": client_id,
            "enable.auto.commit": False,
            "statistics.interval.ms": 500,
            "stats_cb": on_stats,
            # Small fetches, for a fine-grained measurement (see Throughput's batch.size).
            "max.partition.fetch.bytes": 8192,
            "fetch.max.bytes": 8192,
            "message.max.bytes": 8192,  # librdkafka wants fetch.max.bytes >= it
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        received = 0
        start = time.monotonic()
        while time.monotonic() - start < MEASURE_S:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                received += len(message.value())
        rate = received / MEASURE_S
        print(f"consumer held to {rate / RATE:.3f} of its quota over {MEASURE_S} s")
    finally:
        consumer.close()
    assert 0.8 * RATE <= rate <= 1.2 * RATE, f"{rate / 1024:.0f} KiB/s against {RATE // 1024}"
    assert max(throttles, default=0) > 0


def test_a_user_quota_over_sasl(secure_cluster: SecureEnv) -> None:
    env = secure_cluster
    admin_bootstrap = env.identity("admin").bootstrap
    admin_properties = env.setup.client_properties_file(ADMIN)
    topic = f"sec-{unique_topic('quota-user')}"
    create_secure_topic(
        "confluent-kafka", env.identity("admin"), topic, partitions=1, replication=1
    )
    bob = env.identity("sasl_plain")
    rate = 128 * 1024
    _configs(
        admin_bootstrap, "--alter", "--add-config", f"producer_byte_rate={rate}",
        "--entity-type", "users", "--entity-name", bob.username or "",
        command_config=admin_properties,
    )  # fmt: skip
    try:
        # Only who may ALTER_CONFIGS / DESCRIBE_CONFIGS the cluster: user `client` may not.
        refused = odradek(
            "configs", "--bootstrap-server", admin_bootstrap,
            "--command-config", str(env.setup.client_properties_file(CLIENT)),
            "--describe", "--entity-type", "users", "--entity-name", bob.username or "",
        )  # fmt: skip
        assert_one_line_error(refused, "CLUSTER_AUTHORIZATION_FAILED")
        # Every broker has it (bob's partition may be led by any): described through each.
        for broker in env.cluster.brokers:
            described = _configs(
                broker.address("SASL_SSL"), "--describe", "--entity-type", "users",
                "--entity-name", bob.username or "", command_config=admin_properties,
            )  # fmt: skip
            assert f"Quota configs for user-principal '{bob.username}' are producer_byte_rate=" in (
                described
            )
        leader = env.cluster.broker(_leader_secure(env, topic))
        wait_until(
            lambda: _logged_since(leader.log, 0, f"quotas of users/{bob.username}"),
            timeout=30,
            message="bob's leader applied the user quota",
        )
        # bob may send ten windows of his quota at once (Kafka's padded window), then is held.
        client = Throughput(librdkafka_config(bob), topic)
        sent = client.run(4.0) * 4.0
        print(f"bob sent {sent / rate:.2f} s of his quota in 4 s")
        assert 8 * rate <= sent <= 13 * rate, f"{sent / 1024:.0f} KiB in 4 s at {rate // 1024}"
        assert client.max_throttle_ms > 0
        other = Throughput(librdkafka_config(env.identity("sasl_ssl")), topic)
        assert other.run(2.0) > 8 * rate
    finally:
        _configs(
            admin_bootstrap, "--alter", "--delete-config", "producer_byte_rate",
            "--entity-type", "users", "--entity-name", bob.username or "",
            command_config=admin_properties,
        )  # fmt: skip


def _leader_secure(env: SecureEnv, topic: str) -> int:
    admin = env.admin()

    def leader() -> int | None:
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
        found = partitions.get(0)
        return found.leader if found is not None and found.leader >= 0 else None

    return int(wait_until(leader, timeout=30, message=f"a leader for {topic}-0"))


def _alter(bootstrap: str, entries: list[dict[str, Any]], validate_only: bool) -> list[Any]:
    async def send() -> list[Any]:
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        connection = await BrokerConnection.connect(host, int(port), timeout=10)
        try:
            request = build(
                request_class(ALTER_CLIENT_QUOTAS, 1),
                {"entries": entries, "validate_only": validate_only},
            )
            response = await connection.send(ALTER_CLIENT_QUOTAS, 1, request, timeout=10)
            return [(ErrorCode(e.error_code), e.error_message) for e in response.entries]
        finally:
            connection.close()

    return asyncio.run(send())


def _describe(bootstrap: str, components: list[dict[str, Any]], strict: bool) -> Any:
    async def send() -> Any:
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        connection = await BrokerConnection.connect(host, int(port), timeout=10)
        try:
            request = build(
                request_class(DESCRIBE_CLIENT_QUOTAS, 1),
                {"components": components, "strict": strict},
            )
            return await connection.send(DESCRIBE_CLIENT_QUOTAS, 1, request, timeout=10)
        finally:
            connection.close()

    return asyncio.run(send())


def _op(key: str, value: float, remove: bool = False) -> dict[str, Any]:
    return {"key": key, "value": value, "remove": remove}


def test_alter_client_quotas_validation(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    name = unique_topic("validate")
    client = [{"entity_type": "client-id", "entity_name": name}]
    results = _alter(
        bootstrap,
        [
            {"entity": client, "ops": [_op("producer_byte_rate", 1024)]},
            {"entity": client, "ops": [_op("producer_byte_rate", 10.5)]},
            {"entity": client, "ops": [_op("no_such_quota", 1)]},
            {"entity": [{"entity_type": "client-id", "entity_name": ""}], "ops": []},
            {"entity": [], "ops": []},
            {"entity": [{"entity_type": "group", "entity_name": "g"}], "ops": []},
        ],
        validate_only=True,
    )
    assert [code for code, _ in results] == [ErrorCode.none] + [ErrorCode.invalid_request] * 5
    assert results[1][1] == "Configuration producer_byte_rate must be a LONG value"
    assert results[2][1] == "Invalid configuration key no_such_quota"
    assert results[3][1] == "Empty client-id not supported"
    # validate_only wrote nothing.
    response = _describe(
        bootstrap, [{"entity_type": "client-id", "match_type": 0, "match": name}], True
    )
    assert response.error_code == ErrorCode.none and not response.entries
    # A bad filter is the request's error.
    response = _describe(
        bootstrap,
        [
            {"entity_type": "user", "match_type": 2, "match": None},
            {"entity_type": "user", "match_type": 1, "match": None},
        ],
        False,
    )
    assert response.error_code == ErrorCode.invalid_request
    assert response.error_message == "Duplicate user filter component entity type"


def _kafka_configs(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["java", "-Xmx256m", "-cp", f"{kafka_libs()}/*", "kafka.admin.ConfigCommand",
         "--bootstrap-server", bootstrap, *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.skipif(not kafka_available(), reason="Kafka 3.9.1's jars are not cached (./dev kafka)")
def test_kafka_config_command_alters_and_describes_quotas(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    user, client = unique_topic("kuser"), unique_topic("kclient")
    entity = ("--entity-type", "users", "--entity-name", user,
              "--entity-type", "clients", "--entity-name", client)  # fmt: skip
    result = _kafka_configs(
        bootstrap, "--alter", "--add-config",
        "producer_byte_rate=1048576,consumer_byte_rate=2097152,request_percentage=50.5", *entity,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    ours = _configs(bootstrap, "--describe", *entity)
    kafkas = _kafka_configs(bootstrap, "--describe", *entity)
    assert kafkas.returncode == 0, kafkas.stderr
    assert kafkas.stdout == ours
    assert ours == (
        f"Quota configs for user-principal '{user}', client-id '{client}' are "
        "consumer_byte_rate=2097152.0, producer_byte_rate=1048576.0, request_percentage=50.5\n"
    )
    # Altered by our tool, described by Kafka's: every user+client entity of the user.
    _configs(bootstrap, "--alter", "--delete-config", "request_percentage", *entity)
    kafkas = _kafka_configs(
        bootstrap, "--describe", "--entity-type", "users", "--entity-name", user,
        "--entity-type", "clients",
    )  # fmt: skip
    assert kafkas.stdout == (
        f"Quota configs for user-principal '{user}', client-id '{client}' are "
        "consumer_byte_rate=2097152.0, producer_byte_rate=1048576.0\n"
    ), kafkas.stderr


def _set_broker_configs(bootstrap: str, configs: dict[int, dict[str, str | None]]) -> None:
    """Dynamic broker configs through IncrementalAlterConfigs on BROKER resources (None: delete),
    as `kafka-configs.sh --entity-type brokers` and `kafka-reassign-partitions.sh --throttle`
    set them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resources = [
        ConfigResource(
            ResourceType.BROKER,
            str(broker_id),
            incremental_configs=[
                ConfigEntry(
                    name,
                    value,
                    incremental_operation=AlterConfigOpType.SET
                    if value is not None
                    else AlterConfigOpType.DELETE,
                )
                for name, value in config.items()
            ],
        )
        for broker_id, config in configs.items()
    ]
    for resource in resources:  # librdkafka: one BROKER resource per call
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=30)


def test_replication_throttle_bounds_a_reassignment(cluster3: LocalCluster) -> None:
    """KIP-73: a new replica copies a 2 MB partition at the throttled 200 KiB/s — about five
    seconds once the first 1 MB fetch (replica.fetch.max.bytes) is in — where the unthrottled
    copy takes well under one."""
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("quota-move")
    create_topic(bootstrap, topic, partitions=1, replication_factor=1)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 20})
    size = 2 * 1024 * 1024
    for _ in range(size // len(VALUE)):
        while True:
            try:
                producer.produce(topic, VALUE)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    source = _leader(bootstrap, topic)
    target = next(b.id for b in cluster3.brokers if b.id != source)
    # What `kafka-reassign-partitions.sh --throttle` writes: the replicas, then the rates.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in (
                ("leader.replication.throttled.replicas", f"0:{source}"),
                ("follower.replication.throttled.replicas", f"0:{target}"),
            )
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    rate = 200 * 1024
    throttles: dict[str, str | None] = {
        "leader.replication.throttled.rate": str(rate),
        "follower.replication.throttled.rate": str(rate),
    }
    marks = {b.id: _log_mark(b.log) for b in cluster3.brokers}
    _set_broker_configs(bootstrap, {source: throttles, target: throttles})
    try:
        for broker_id in (source, target):
            broker = cluster3.broker(broker_id)
            wait_until(
                lambda b=broker: _logged_since(
                    b.log, marks[b.id], f"replication throttles: leader {float(rate)}"
                ),
                timeout=30,
                message=f"broker {broker_id} applied the replication throttle",
            )
        started = time.monotonic()
        moves = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
        try:
            errors = moves.alter_partition_reassignments(
                {KafkaTopicPartition(topic, 0): [source, target]}
            )
        finally:
            moves.close()
        assert all(error is None for error in errors.values()), errors
        wait_until(
            lambda: target in zk_partition_state(cluster3, topic, 0).isr,
            timeout=90,
            message="the new replica joined the ISR",
        )
        elapsed = time.monotonic() - started
        print(f"throttled reassignment of {size} bytes at {rate} B/s: {elapsed:.1f} s")
        least = 0.8 * (size - 1024 * 1024) / rate
        assert least <= elapsed <= 60, f"{elapsed:.1f} s for {size} bytes at {rate} B/s"
    finally:
        cleared: dict[str, str | None] = dict.fromkeys(throttles)
        _set_broker_configs(bootstrap, {source: cleared, target: cleared})


def test_kafka_python_alters_and_describes_quotas(cluster3: LocalCluster) -> None:
    """kafka-python's own encoding of AlterClientQuotas and DescribeClientQuotas (it has the
    messages but no admin method for them: they are sent the way its admin methods send theirs)."""
    from kafka.protocol.admin import AlterClientQuotasRequest, DescribeClientQuotasRequest

    admin = KafkaAdminClient(bootstrap_servers=cluster3.bootstrap_servers)
    user, client = unique_topic("kp-user"), unique_topic("kp-client")

    async def send(request: Any) -> Any:
        return await admin._manager.send(request)

    try:
        altered = admin._manager.run(
            send,
            AlterClientQuotasRequest(
                entries=[
                    (
                        [("user", user), ("client-id", client)],
                        [
                            ("producer_byte_rate", 4096.0, False),
                            ("request_percentage", 25.0, False),
                        ],
                    ),
                    ([("client-id", client)], [("consumer_byte_rate", 1.5, False)]),
                ],
                validate_only=False,
            ),
        )
        assert [(e.error_code, e.error_message) for e in altered.entries] == [
            (0, None),
            (
                ErrorCode.invalid_request.value,
                "Configuration consumer_byte_rate must be a LONG value",
            ),
        ]
        described = admin._manager.run(
            send,
            DescribeClientQuotasRequest(
                components=[("user", 0, user), ("client-id", 2, None)], strict=True
            ),
        )
        assert described.error_code == 0
        assert [
            (
                sorted((e.entity_type, e.entity_name) for e in entry.entity),
                sorted((v.key, v.value) for v in entry.values),
            )
            for entry in described.entries
        ] == [
            (
                [("client-id", client), ("user", user)],
                [("producer_byte_rate", 4096.0), ("request_percentage", 25.0)],
            )
        ]
    finally:
        admin.close()
