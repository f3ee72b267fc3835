"""librdkafka's idempotent producer stores a record twice after an epoch bump, on Kafka 3.9.1 as on
Odradek; Kafka's Java producer, in the same scenario, stores it once on both (README, "a duplicate
under an idempotent producer"; librdkafka issue #4953).

librdkafka (v2.15.0 source, 2.16 bundled here) bumps an idempotent producer's epoch for the whole
producer when a message times out (`rd_kafka_toppar_producer_serve`, "message(s) timed out"). After
the bump it restarts every partition's sequence at the first message of its queue
(`rd_kafka_toppar_pid_change`), even a message whose earlier attempt was answered
REQUEST_TIMED_OUT and so may be in the log already. A broker must take epoch+1, sequence 0 as new.
The scenario, on a two-broker Odradek cluster and a two-broker Kafka 3.9.1 (ZooKeeper mode):

* topic A: replicas [1, 2] (leader 1); topic B: replicas [2]. Broker 2's ZooKeeper session and its
  place in A's ISR outlast the pause below, so nothing but the pause changes.
* One idempotent producer (acks=all) writes a warm-up record to A and to B, so that it has its
  producer id and both connections. Then broker 2 is paused (SIGSTOP).
* M_B goes to B; its request times out client-side halfway through its delivery timeout. That log
  line is the cue for M_A to go to A: broker 1 appends it, waits for its paused follower and answers
  REQUEST_TIMED_OUT, again and again (a retry keeps the sequence). When M_B's delivery timeout
  passes, the producer bumps its epoch, and M_A has half of its own timeout left. Broker 2 is
  resumed once the client logs the bump.
* M_A is delivered, M_B timed out. librdkafka re-sent M_A as epoch e+1, sequence 0, and both
  brokers hold it twice; the Java producer retried it as epoch e, sequence s, and both hold it once.

Without Kafka's jars the tests are skipped, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import atexit
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from odradek.protocol.codec import ApiKey
from odradek.protocol.record_batch import decode_records, iter_batches
from odradek.testing.local_cluster import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.fixtures.zookeeper import ZooKeeperHandle
from tests.integration import _wire
from tests.integration._clients import wait_until_serving
from tests.integration._epoch_bump_clients import (
    JAVA_CUES,
    LIBRDKAFKA_CUES,
    Cues,
    JavaProducer,
    Librdkafka,
    java_command,
)
from tests.integration._kafka import KafkaBroker, kafka_available, require_kafka

M_A, M_B = b"m-a", b"m-b"
BROKER_PROPERTIES = {
    "auto.create.topics.enable": "false",
    # Broker 2 is paused for about 1.5 x the delivery timeout (12 s): it keeps its session (the
    # client side gives up after two thirds of it) and its place in A's ISR.
    "zookeeper.session.timeout.ms": "45000",
    "replica.lag.time.max.ms": "60000",
}


@dataclass(frozen=True)
class Target:
    """A two-broker cluster: everyone's bootstrap, broker 1's, and broker 2's pause and resume."""

    bootstrap: str
    broker_1: str
    pause: Callable[[], None]
    resume: Callable[[], None]


@dataclass(frozen=True)
class Outcome:
    stored: list[tuple[bytes | None, int, int]]
    """Topic A from offset 0, a record each: (value, producer epoch, base sequence)."""
    delivered: dict[bytes, str]
    """Value -> "delivered" or the error the client reported."""
    log: list[str]


def create_topics(bootstrap: str, layout: dict[str, tuple[int, tuple[int, ...]]]) -> None:
    """`layout`: topic -> (leader, replicas = ISR) of its one partition."""
    wait_until_serving(bootstrap)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(t, 1, replica_assignment=[list(r)]) for t, (_, r) in layout.items()]
    for future in admin.create_topics(topics).values():
        future.result(30)

    def laid_out(server: str) -> bool:
        with _wire.WireConnection.to(server) as connection:
            response = connection.request(
                ApiKey.METADATA,
                _wire.METADATA_VERSION,
                {"topics": [{"name": t} for t in layout], "allow_auto_topic_creation": False},
            )
        seen = {
            t.name: (int(p.leader_id), tuple(sorted(int(r) for r in p.isr_nodes)))
            for t in response.topics
            for p in t.partitions
        }
        return seen == layout

    for server in bootstrap.split(","):
        wait_until(partial(laid_out, server), 30, f"{layout} in {server}'s metadata")


def read_partition(leader: str, topic: str) -> list[tuple[bytes | None, int, int]]:
    """Every record of partition 0 up to the high watermark, read from its leader; all of them
    from one producer id."""
    stored, producer_ids, offset = [], set(), 0
    with _wire.WireConnection.to(leader) as connection:
        while offset < (fetched := _wire.fetch(connection, topic, 0, offset)).high_watermark:
            headers = list(iter_batches(fetched.records))
            assert headers, f"{topic} on {leader}: nothing at {offset} below {fetched}"
            for header in headers:
                batch = fetched.records[header.position : header.position + header.size]
                producer_ids.add(header.producer_id)
                for record in decode_records(batch):
                    stored.append((record.value, header.producer_epoch, header.base_sequence))
                offset = header.base_offset + header.last_offset_delta + 1
    assert len(producer_ids) == 1, producer_ids
    return stored


def produce_across_an_epoch_bump(
    target: Target,
    make_client: Callable[[str], Librdkafka | JavaProducer],
    topic_a: str,
    topic_b: str,
    cues: Cues,
) -> Outcome:
    """The module docstring's scenario; `make_client(bootstrap)` makes the producer."""
    create_topics(target.bootstrap, {topic_a: (1, (1, 2)), topic_b: (2, (2,))})
    client = make_client(target.bootstrap)
    try:
        client.produce(topic_a, b"warm-up-a")
        client.produce(topic_b, b"warm-up-b")
        assert set(client.flush().values()) == {"delivered"}, client.lines[-20:]
        target.pause()
        try:
            client.produce(topic_b, M_B)
            client.wait_for(cues.b_timed_out)
            client.produce(topic_a, M_A)
            client.wait_for(cues.bumped)
        finally:
            target.resume()
        delivered = client.flush()
    finally:
        client.close()
    return Outcome(read_partition(target.broker_1, topic_a), delivered, client.lines)


def check_delivered(name: str, outcome: Outcome, m_b_error: str) -> list[tuple[int, int]]:
    """The reports the scenario expects; M_A's copies in topic A as (epoch, base sequence)."""
    assert outcome.delivered == {
        b"warm-up-a": "delivered",
        b"warm-up-b": "delivered",
        M_A: "delivered",
        M_B: m_b_error,
    }, name
    assert outcome.stored[0][0] == b"warm-up-a", (name, outcome.stored)
    return [(epoch, sequence) for value, epoch, sequence in outcome.stored if value == M_A]


def check_renumbered(name: str, outcome: Outcome, topic_a: str, topic_b: str) -> None:
    """librdkafka stored M_A twice, and its own log says why."""
    copies = check_delivered(name, outcome, "_MSG_TIMED_OUT")
    assert len(copies) == 2, (name, outcome.stored)
    (epoch, sequence), renumbered = copies
    assert renumbered == (epoch + 1, 0), (name, outcome.stored)

    def found(pattern: str) -> list[re.Match[str]]:
        return [m for line in outcome.log if (m := re.search(pattern, line))]

    # M_A was answered REQUEST_TIMED_OUT as (epoch, sequence) and kept "possibly persisted".
    possibly_persisted = found(
        rf"{topic_a} \[0\]: MessageSet with 1 message\(s\) \(MsgId \d+, BaseSeq {sequence}\) "
        r"encountered error: Broker: Request timed out \(actions [^)]*MsgPossiblyPersisted"
    )
    assert possibly_persisted, name
    assert found(rf"epoch bump for .*: 1 message\(s\) timed out on {topic_b} \[0\]"), name
    assert [int(m[1]) for m in found(LIBRDKAFKA_CUES.bumped.pattern)] == [epoch + 1], name
    # A's last reset moved its base past the messages before M_A: M_A became sequence 0.
    resets = found(rf"{topic_a} \[0\] resetting epoch base seq from (\d+) to (\d+)")
    old_base, new_base = map(int, resets[-1].groups())
    assert new_base - old_base == sequence, (name, resets[-1][0])


@pytest.fixture(scope="module")
def clusters(
    zookeeper: ZooKeeperHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Target]]:
    require_kafka()
    zookeeper.ensure_running()
    base = tmp_path_factory.mktemp("epoch-bump")
    odradek = LocalCluster.up(
        base / "odradek",
        2,
        overrides=BROKER_PROPERTIES,
        zookeeper=f"{zookeeper.connect_string}/odradek-{uuid.uuid4().hex}",
    )
    atexit.register(odradek.kill_all)
    chroot = f"{zookeeper.connect_string}/kafka-{uuid.uuid4().hex}"
    kafka = [KafkaBroker(base / f"kafka-{i}", chroot, i, **BROKER_PROPERTIES) for i in (1, 2)]
    try:
        for broker in kafka:
            broker.start()
        yield {
            "odradek": Target(
                odradek.bootstrap_servers,
                odradek.broker(1).bootstrap,
                partial(odradek.stop, 2),
                partial(odradek.cont, 2),
            ),
            "kafka": Target(
                ",".join(b.bootstrap for b in kafka),
                kafka[0].bootstrap,
                kafka[1].pause,
                kafka[1].resume,
            ),
        }
    finally:
        for broker in kafka:
            broker.stop()
        try:
            odradek.down()
        finally:
            odradek.kill_all()
            atexit.unregister(odradek.kill_all)


def test_librdkafka_stores_a_record_twice_after_an_epoch_bump_on_kafka_as_on_odradek(
    clusters: dict[str, Target],
) -> None:
    topic_a, topic_b = "replicated-librdkafka", "alone-librdkafka"
    outcomes = {
        name: produce_across_an_epoch_bump(target, Librdkafka, topic_a, topic_b, LIBRDKAFKA_CUES)
        for name, target in clusters.items()
    }
    for name, outcome in outcomes.items():
        check_renumbered(name, outcome, topic_a, topic_b)
    assert outcomes["odradek"].stored == outcomes["kafka"].stored


@pytest.fixture(scope="module")
def java_producer(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    if not kafka_available() or shutil.which("javac") is None:
        pytest.skip("Kafka 3.9.1's jars (./dev kafka) and a JDK are needed")
    return java_command(tmp_path_factory.mktemp("java"))


def test_the_java_producer_stores_it_once_on_both(
    clusters: dict[str, Target], java_producer: list[str]
) -> None:
    topic_a, topic_b = "replicated-java", "alone-java"
    outcomes = {
        name: produce_across_an_epoch_bump(
            target, partial(JavaProducer, java_producer), topic_a, topic_b, JAVA_CUES
        )
        for name, target in clusters.items()
    }
    for name, outcome in outcomes.items():
        copies = check_delivered(name, outcome, "TimeoutException")
        # The epoch was bumped (for B), and M_A's retries kept the epoch and sequence it had.
        (bumped,) = {int(m[1]) for line in outcome.log if (m := JAVA_CUES.bumped.search(line))}
        assert copies == [(bumped - 1, 1)], (name, outcome.stored)
    assert outcomes["odradek"].stored == outcomes["kafka"].stored
