"""A 3-broker cluster replicating over a SASL_SSL inter-broker listener with no PLAINTEXT listener
(issue 14, item 8).

The shared secure cluster registers only TLS/SASL endpoints; every follower fetches from its
leader over INTERNAL (SASL_SSL, SCRAM-SHA-512, as the super user `admin`), and the controller talks
to the brokers there too. A broker's controlled shutdown (its request to the controller goes over
INTERNAL as well) moves its leaderships away; restarted, it catches up over TLS and rejoins every
ISR; nothing acknowledged with acks=all is lost.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewTopic

from odradek.testing.cluster_files import run_sync
from odradek.testing.cluster_status import read_registrations, zk_session
from tests.fixtures.cluster import wait_until
from tests.fixtures.secure import SecureEnv
from tests.integration._secure_clients import librdkafka_config

PARTITIONS = 6


def _isrs(env: SecureEnv, topic: str) -> dict[int, tuple[int, ...]]:
    metadata = env.admin().list_topics(topic, timeout=10)
    return {p: tuple(sorted(m.isrs)) for p, m in metadata.topics[topic].partitions.items()}


def _leaders(env: SecureEnv, topic: str) -> dict[int, int]:
    metadata = env.admin().list_topics(topic, timeout=10)
    return {p: m.leader for p, m in metadata.topics[topic].partitions.items()}


def test_replication_over_sasl_ssl_with_plaintext_disabled(secure_cluster: SecureEnv) -> None:
    cluster = secure_cluster.cluster

    async def registrations() -> dict[int, object]:
        async with zk_session(cluster.zookeeper_connect, 10) as zk:
            return await read_registrations(zk)

    for info in run_sync(registrations).values():
        protocols = {e.listener_name: e.security_protocol for e in info.endpoints}  # type: ignore[attr-defined]
        assert "PLAINTEXT" not in protocols.values(), protocols
        assert protocols["INTERNAL"] == "SASL_SSL", protocols

    topic = f"sec-replicated-{uuid.uuid4().hex[:8]}"
    admin = secure_cluster.admin()
    creation = NewTopic(topic, PARTITIONS, 3, config={"min.insync.replicas": "2"})
    for future in admin.create_topics([creation]).values():
        future.result(timeout=30)
    wait_until(
        lambda: all(len(isr) == 3 for isr in _isrs(secure_cluster, topic).values()), 30, "ISRs"
    )
    client = librdkafka_config(secure_cluster.identity("sasl_ssl"))
    producer = Producer({**client, "acks": "all", "enable.idempotence": False})
    acknowledged: list[str] = []

    def send(values: list[str]) -> None:
        for value in values:
            producer.produce(
                topic,
                value.encode(),
                on_delivery=lambda e, m: acknowledged.append(m.value().decode()) if not e else None,
            )
        assert producer.flush(30) == 0

    send([f"before-{i}" for i in range(300)])
    victim = _leaders(secure_cluster, topic)[0]
    cluster.terminate(victim, timeout=60)  # controlled shutdown over INTERNAL
    assert all(leader != victim for leader in _leaders(secure_cluster, topic).values())
    send([f"during-{i}" for i in range(300)])
    cluster.start_broker(victim, timeout=60)
    wait_until(
        lambda: all(len(isr) == 3 for isr in _isrs(secure_cluster, topic).values()),
        60,
        f"broker {victim} back in every ISR",
    )
    send([f"after-{i}" for i in range(300)])
    assert len(acknowledged) == 900

    consumer = Consumer(
        {
            **client,
            "group.id": f"sec-replicated-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got: set[str] = set()
    deadline = time.monotonic() + 60
    try:
        while len(got) < len(acknowledged) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.add(message.value().decode())
    finally:
        consumer.close()
    assert got == set(acknowledged)
