"""Log compaction against real brokers, driven by real clients.

One two-broker cluster for the module (the cleaner looks for work every 200 ms, retention every
200 ms, `__consumer_offsets` has 2 partitions of 8 KiB segments on both brokers). Topics are
compacted with small segments and `min.cleanable.dirty.ratio=0.01`, so that a few rounds of
writes are due for cleaning at once. What is checked is what a consumer and an operator see:

* a topic written by confluent-kafka, kafka-python or aiokafka, read from the beginning after
  cleaning, holds exactly the latest value of each key, at the offsets the producer was given;
  the follower cleans its own replica and ends up with the same records as the leader;
* tombstones are gone after `delete.retention.ms`, and so are the keys they deleted;
* `compact,delete` also deletes old segments by `retention.ms` (a compact-only twin keeps them);
* the active segment is never cleaned, nor a segment younger than `min.compaction.lag.ms`,
  while a topic written at the same time is; a topic never due by its ratio is cleaned once its
  dirty data is older than `max.compaction.lag.ms`;
* a record without a key is refused with INVALID_RECORD (confluent-kafka and kafka-python);
* the compaction configs round-trip through CreateTopics, IncrementalAlterConfigs and
  DescribeConfigs; a bad value is INVALID_CONFIG;
* `__consumer_offsets` is cleaned on both replicas, and the group coordinator, moved to each
  broker in turn, loads the cleaned partition with every committed offset intact.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from odradek.coordinator.group.placement import OFFSETS_TOPIC, partition_for
from odradek.log.naming import log_dir_name, parse_segment_file_name
from odradek.protocol.record_batch import decode_records, iter_batches
from odradek.testing import LocalCluster
from tests.fixtures.cluster import START_TIMEOUT_S, _bring_down, _used_clusters, wait_until
from tests.integration._clients import (
    CLIENT_TIMEOUT_S,
    ClientError,
    Rec,
    create_topic,
    create_topic_error,
    produce,
    unique_topic,
    wait_until_serving,
)

OFFSETS_PARTITIONS = 2
INVALID_RECORD = 87
INVALID_CONFIG = 40
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": "8192",
    "min.cleanable.dirty.ratio": "0.01",
}
CLEANING_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster.up(
        tmp_path_factory.mktemp("compaction"),
        2,
        overrides={
            "log.cleaner.backoff.ms": "200",
            "log.retention.check.interval.ms": "200",
            "offsets.topic.replication.factor": "2",
            "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
            "offsets.topic.segment.bytes": "8192",
        },
        timeout=START_TIMEOUT_S,
    )
    try:
        wait_until_serving(cluster.bootstrap_servers)
        yield cluster
    finally:
        _bring_down(cluster)


@pytest.fixture(autouse=True)
def _report_logs(cluster: LocalCluster, request: pytest.FixtureRequest) -> None:
    _used_clusters(request.node).append(cluster)


# -- helpers ------------------------------------------------------------------------------------


def rounds(keys: int, count: int, tag: str) -> list[list[Rec]]:
    """`count` rounds over keys k000.., each value naming its round; ~100-byte records."""
    return [
        [
            Rec(f"k{k:03d}".encode(), f"{tag}-r{r}-k{k:03d}-".encode().ljust(90, b"."))
            for k in range(keys)
        ]
        for r in range(count)
    ]


def tail(tag: str) -> list[list[Rec]]:
    """Keys written once, more than a segment of them (a batch may not exceed segment.bytes):
    the active segment then holds none of the keys written before."""
    return [
        [Rec(f"tail-{tag}-{part}-{i:04d}".encode(), b"t" * 100) for i in range(35)]
        for part in range(4)
    ]


def write(client: str, bootstrap: str, topic: str, parts: list[list[Rec]]) -> list[Rec]:
    """Each part in one produce call (so one batch or a few); returns the records in order and
    checks that the offsets the client was given follow each other."""
    written: list[Rec] = []
    for part in parts:
        offsets = produce(client, bootstrap, topic, 0, part, linger_ms=50)
        assert offsets == list(range(len(written), len(written) + len(part)))
        written.extend(part)
    return written


def latest(records: list[Rec]) -> dict[bytes, tuple[int, bytes | None]]:
    """Key -> (offset, value) of its last record, records written from offset 0."""
    found: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, record in enumerate(records):
        assert record.key is not None
        found[record.key] = (offset, record.value)
    return found


def read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record from the log start to the end, as confluent-kafka reads them."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "compaction-reader",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, 0), timeout=CLIENT_TIMEOUT_S, cached=False
        )
        got: list[tuple[int, bytes | None, bytes | None]] = []
        if high <= low:
            return got
        consumer.assign([TopicPartition(topic, 0, low)])
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise ClientError(f"consumer error: {message.error()}")
            got.append((message.offset(), message.key(), message.value()))
            if message.offset() >= high - 1:
                return got
        raise ClientError(f"read {len(got)} records of {topic} but not up to {high}")
    finally:
        consumer.close()


def replica_records(
    cluster: LocalCluster, broker_id: int, topic: str, partition: int = 0
) -> list[tuple[int, bytes | None, bytes | None]]:
    """The records of one broker's replica, read from its segment files."""
    directory = Path(cluster.broker(broker_id).data_dir) / log_dir_name(topic, partition)
    bases = sorted(
        parsed[0]
        for path in directory.iterdir()
        if (parsed := parse_segment_file_name(path.name)) is not None and parsed[1] == ".log"
    )
    found = []
    for base in bases:
        data = (directory / f"{base:020d}.log").read_bytes()
        position = 0
        for header in iter_batches(data):
            batch = data[position : position + header.size]
            position += header.size
            found.extend((r.offset, r.key, r.value) for r in decode_records(batch))
    return found


def is_exactly(
    got: list[tuple[int, bytes | None, bytes | None]],
    expected: dict[bytes, tuple[int, bytes | None]],
) -> bool:
    return sorted(got) == sorted((o, k, v) for k, (o, v) in expected.items())


def admin(cluster: LocalCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers})


def alter_topic(cluster: LocalCluster, topic: str, configs: dict[str, str]) -> None:
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()
        ],
    )
    client = admin(cluster)
    futures = client.incremental_alter_configs([resource])
    futures[resource].result(timeout=CLIENT_TIMEOUT_S)


def describe_topic(cluster: LocalCluster, topic: str) -> dict[str, str]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    client = admin(cluster)  # kept alive until the answer is in
    entries = client.describe_configs([resource])[resource].result(timeout=CLIENT_TIMEOUT_S)
    return {name: entry.value for name, entry in entries.items()}


# -- tests --------------------------------------------------------------------------------------


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_a_cleaned_topic_holds_the_latest_value_of_each_key(
    cluster: LocalCluster, client: str
) -> None:
    topic = unique_topic(f"compacted-{client}")
    create_topic(cluster.bootstrap_servers, topic, replication_factor=2, configs=COMPACTED)
    written = write(client, cluster.bootstrap_servers, topic, [*rounds(40, 6, "a"), *tail("a")])
    expected = latest(written)

    wait_until(
        lambda: is_exactly(read_all(cluster.bootstrap_servers, topic), expected),
        CLEANING_TIMEOUT_S,
        f"{topic} to hold only the latest value of each key",
        interval=0.5,
    )
    # Each replica is cleaned by its own broker, to the same records.
    for broker_id in cluster.broker_ids:
        wait_until(
            lambda b=broker_id: is_exactly(replica_records(cluster, b, topic), expected),
            CLEANING_TIMEOUT_S,
            f"broker {broker_id}'s replica of {topic} to be cleaned",
            interval=0.5,
        )


def test_tombstones_go_after_delete_retention(cluster: LocalCluster) -> None:
    topic = unique_topic("tombstones")
    configs = {**COMPACTED, "delete.retention.ms": "1000"}
    create_topic(cluster.bootstrap_servers, topic, replication_factor=2, configs=configs)
    deletes = [Rec(f"k{k:03d}".encode(), None) for k in range(0, 20, 2)]  # half the keys
    parts = [*rounds(20, 3, "b"), deletes, *tail("b")]
    written = write("confluent", cluster.bootstrap_servers, topic, parts)
    kept = {k: v for k, v in latest(written).items() if v[1] is not None}

    def no_tombstones() -> bool:
        got = read_all(cluster.bootstrap_servers, topic)
        return is_exactly(got, kept)

    wait_until(no_tombstones, CLEANING_TIMEOUT_S, "the tombstones to go", interval=0.5)


def test_compact_delete_also_applies_retention(cluster: LocalCluster) -> None:
    hour_ago = int(time.time() * 1000) - 3_600_000
    written = [
        Rec(f"k{i % 10}".encode(), f"old-{i}".encode().ljust(50, b"."), timestamp=hour_ago + i)
        for i in range(200)
    ]
    topics = {}
    for policy in ("compact,delete", "compact"):
        topic = unique_topic(policy.replace(",", "-"))
        configs = {
            "cleanup.policy": policy,
            "segment.bytes": "8192",
            "min.cleanable.dirty.ratio": "1",  # the cleaner leaves both alone
            "retention.ms": "60000",
        }
        create_topic(cluster.bootstrap_servers, topic, replication_factor=2, configs=configs)
        write("confluent", cluster.bootstrap_servers, topic, [written[:100], written[100:]])
        topics[policy] = topic

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "ret"})
    try:

        def earliest(topic: str) -> int:
            low, _high = consumer.get_watermark_offsets(
                TopicPartition(topic, 0), timeout=CLIENT_TIMEOUT_S, cached=False
            )
            return int(low)

        # Retention deletes every segment but the active one of the compact,delete topic.
        wait_until(
            lambda: earliest(topics["compact,delete"]) > 0,
            CLEANING_TIMEOUT_S,
            "retention to delete the old segments of the compact,delete topic",
            interval=0.3,
        )
        assert earliest(topics["compact"]) == 0
    finally:
        consumer.close()
    assert len(read_all(cluster.bootstrap_servers, topics["compact"])) == 200


def test_the_active_segment_and_young_segments_are_not_cleaned(cluster: LocalCluster) -> None:
    active_only = unique_topic("active-only")
    young = unique_topic("young")
    witness = unique_topic("witness")
    create_topic(
        cluster.bootstrap_servers,
        active_only,
        replication_factor=2,
        configs={**COMPACTED, "segment.bytes": str(1 << 20)},
    )
    create_topic(
        cluster.bootstrap_servers,
        young,
        replication_factor=2,
        configs={**COMPACTED, "min.compaction.lag.ms": "3600000"},
    )
    create_topic(cluster.bootstrap_servers, witness, replication_factor=2, configs=COMPACTED)
    parts = [*rounds(20, 5, "c"), *tail("c")]
    for topic in (active_only, young, witness):
        written = write("confluent", cluster.bootstrap_servers, topic, parts)
    wait_until(
        lambda: is_exactly(read_all(cluster.bootstrap_servers, witness), latest(written)),
        CLEANING_TIMEOUT_S,
        "the witness topic to be cleaned",
        interval=0.5,
    )
    # The cleaner has chosen a log since these were written (the witness), and left them whole.
    for topic in (active_only, young):
        assert len(read_all(cluster.bootstrap_servers, topic)) == len(written), topic


def test_max_compaction_lag_forces_a_cleaning(cluster: LocalCluster) -> None:
    topic = unique_topic("max-lag")
    configs = {**COMPACTED, "min.cleanable.dirty.ratio": "1", "max.compaction.lag.ms": "2000"}
    create_topic(cluster.bootstrap_servers, topic, replication_factor=2, configs=configs)
    written = write(
        "confluent", cluster.bootstrap_servers, topic, [*rounds(20, 5, "d"), *tail("d")]
    )
    wait_until(
        lambda: is_exactly(read_all(cluster.bootstrap_servers, topic), latest(written)),
        CLEANING_TIMEOUT_S,
        "the topic to be cleaned once its dirty data is older than max.compaction.lag.ms",
        interval=0.5,
    )


def test_a_record_without_a_key_is_refused(cluster: LocalCluster) -> None:
    topic = unique_topic("keyless")
    create_topic(cluster.bootstrap_servers, topic, replication_factor=2, configs=COMPACTED)
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "enable.idempotence": False,
            "retries": 0,
        }
    )
    errors = []
    producer.produce(topic, value=b"no key", partition=0, on_delivery=lambda e, m: errors.append(e))
    producer.flush(CLIENT_TIMEOUT_S)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == INVALID_RECORD

    with pytest.raises(ClientError, match="InvalidRecord"):
        produce("kafka-python", cluster.bootstrap_servers, topic, 0, [Rec(None, b"no key")])
    assert read_all(cluster.bootstrap_servers, topic) == []


def test_compaction_configs_through_the_admin_apis(cluster: LocalCluster) -> None:
    topic = unique_topic("configs")
    configs = {
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": "0.25",
        "min.compaction.lag.ms": "1000",
        "max.compaction.lag.ms": "90000",
        "delete.retention.ms": "5000",
        "compression.type": "zstd",
    }
    create_topic(cluster.bootstrap_servers, topic, replication_factor=2, configs=configs)
    described = describe_topic(cluster, topic)
    assert {k: described[k] for k in configs} == configs
    alter_topic(cluster, topic, {"min.cleanable.dirty.ratio": "0.75", "delete.retention.ms": "7"})
    described = describe_topic(cluster, topic)
    assert (described["min.cleanable.dirty.ratio"], described["delete.retention.ms"]) == (
        "0.75",
        "7",
    )
    # Broker defaults (Kafka's) for a topic that sets none.
    plain = unique_topic("plain")
    create_topic(cluster.bootstrap_servers, plain, replication_factor=2)
    described = describe_topic(cluster, plain)
    assert described["min.cleanable.dirty.ratio"] == "0.5"
    assert described["delete.retention.ms"] == "86400000"
    assert described["min.compaction.lag.ms"] == "0"
    assert described["max.compaction.lag.ms"] == str(2**63 - 1)
    assert described["compression.type"] == "producer"

    for bad in (
        {"min.cleanable.dirty.ratio": "1.5"},
        {"delete.retention.ms": "-1"},
        {"min.compaction.lag.ms": "5000", "max.compaction.lag.ms": "1000"},
        {"compression.type": "brotli"},
    ):
        code = create_topic_error(cluster.bootstrap_servers, unique_topic("bad"), configs=bad)
        assert code == INVALID_CONFIG, bad
    with pytest.raises(KafkaException):
        alter_topic(cluster, topic, {"min.cleanable.dirty.ratio": "x"})


def test_the_coordinator_loads_a_cleaned_offsets_partition(cluster: LocalCluster) -> None:
    topic = unique_topic("committed")
    create_topic(cluster.bootstrap_servers, topic, partitions=3, replication_factor=2)
    group = f"cleaned-{topic}"
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    commits = 300
    try:
        for i in range(commits):
            consumer.commit(
                offsets=[TopicPartition(topic, p, i * 10 + p) for p in range(3)],
                asynchronous=False,
            )
    finally:
        consumer.close()
    expected = {p: (commits - 1) * 10 + p for p in range(3)}
    partition = partition_for(group, OFFSETS_PARTITIONS)

    def cleaned_on(broker_id: int) -> bool:
        keys = [k for _, k, _ in replica_records(cluster, broker_id, OFFSETS_TOPIC, partition)]
        # 3 offsets of this group written `commits` times; cleaned, far fewer remain (the
        # active segment still holds the newest ones).
        return len(keys) < commits

    for broker_id in cluster.broker_ids:
        wait_until(
            lambda b=broker_id: cleaned_on(b),
            CLEANING_TIMEOUT_S,
            f"broker {broker_id}'s replica of {OFFSETS_TOPIC}-{partition} to be cleaned",
            interval=0.5,
        )

    def committed() -> dict[int, int]:
        reader = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group})
        try:
            found = reader.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
            return {tp.partition: tp.offset for tp in found}
        except KafkaException:
            return {}  # the coordinator is moving (asked again until the deadline)
        finally:
            reader.close()

    # Move the coordinator to each broker in turn: each loads its own cleaned replica.
    for broker_id in cluster.broker_ids:
        cluster.restart(broker_id, timeout=START_TIMEOUT_S)
        wait_until_serving(cluster.bootstrap_servers)
        assert wait_until(lambda: committed() == expected, CLIENT_TIMEOUT_S, "the offsets")
