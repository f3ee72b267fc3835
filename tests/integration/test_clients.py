"""Real clients against real brokers: what a user of Kafka expects to keep working unchanged.

Every test runs against `cluster3` (three `odradek server server.properties` processes and a
private ZooKeeper, as `odradek cluster up` starts them) with topics of its own, and talks to it
only through real clients: confluent-kafka, kafka-python, aiokafka and kcat (see `_clients`), plus
raw protocol requests (`_wire`) where a test needs the broker's exact error code rather than a
client's interpretation of it.

The round trip (`test_produced_with_every_codec`, `test_stored_in_the_codec_written`,
`test_read_back`) writes with each client in each codec -- keys (one null), values (one null,
one empty), headers (repeated names, empty values), explicit timestamps -- checks the batches on
disk are in the codec asked for, and reads every topic back with every client, by explicit
partition assignment: the diagonal is "a client reads back what it wrote", the rest is
cross-client compatibility. A record must come back byte for byte at a contiguous offset.

Then: acks=0 and acks=1; ListOffsets earliest/latest/by timestamp through confluent-kafka and
kafka-python; and the errors a client must see with Kafka's codes (OFFSET_OUT_OF_RANGE,
UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION, TOPIC_ALREADY_EXISTS, MESSAGE_TOO_LARGE).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from odradek.protocol.record_batch import BatchHeader, build_batch
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration import _wire
from tests.integration._clients import (
    CLIENTS,
    CODEC_NUMBER,
    CODECS,
    ClientError,
    Consumed,
    Rec,
    confluent_consumer,
    consume,
    create_topic,
    create_topic_error,
    produce,
    stored_batches,
    unique_topic,
)

RECORDS_PER_CODEC = 8
FILLER = b" the quick brown fox jumps over the lazy dog" * 8  # compressible
DAY_MS = 24 * 3600 * 1000


def leader_bootstrap(cluster: LocalCluster, topic: str, partition: int = 0) -> str:
    """host:port of the partition's leader, as the cluster's metadata says."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})

    def leader() -> int | None:
        topics = admin.list_topics(topic, timeout=10).topics
        info = topics.get(topic)
        if info is None or info.error is not None or partition not in info.partitions:
            return None
        found = info.partitions[partition].leader
        return found if found >= 0 else None

    return cluster.broker(wait_until(leader, 30, f"a leader of {topic}-{partition}")).bootstrap


def latest_offset(cluster: LocalCluster, topic: str, partition: int = 0) -> int:
    return _wire.log_end_offset(leader_bootstrap(cluster, topic, partition), topic, partition)


# ---------------------------------------------------------------------------------------------
# The round trip: every client, every codec


def records_for(client: str, codec: str, first_timestamp: int) -> list[Rec]:
    """The records one client writes in one codec (kcat's limits: see `_clients`)."""
    records = []
    for i in range(RECORDS_PER_CODEC):
        key: bytes | None = f"{codec}-key-{i}".encode()
        value: bytes | None = f"{codec} value {i}:".encode() + FILLER
        if client == "kcat":
            value = f"{codec} value {i}".encode() + FILLER
            headers: tuple[tuple[str, bytes], ...] = (("source", b"kcat"), ("empty", b""))
            records.append(Rec(key, value, headers))
            continue
        headers = (("source", client.encode()), ("seq", str(i).encode()), ("seq", b"again"))
        if i == 2:
            key = None
        if i == 3:
            value = None
        if i == 4:
            value = b""
        if i == 5:
            headers = ()
        if i == 6:
            headers = (("empty", b""),)
        records.append(Rec(key, value, headers, first_timestamp + i * 1000))
    return records


@dataclass
class Written:
    """What one client wrote to its own topic: records in offset order, per codec."""

    topic: str
    records: list[Rec]
    acknowledged: list[int] | None  # None: kcat reports no offsets
    codec_of_offset: dict[int, str]
    started_ms: int
    finished_ms: int


def write_every_codec(cluster: LocalCluster, client: str) -> Written:
    topic = unique_topic(f"roundtrip-{client}")
    create_topic(cluster.bootstrap_servers, topic)
    records: list[Rec] = []
    acknowledged: list[int] | None = []
    codec_of_offset: dict[int, str] = {}
    started = int(time.time() * 1000)
    for number, codec in enumerate(CODECS):
        batch = records_for(client, codec, started - DAY_MS + number * 100_000)
        offsets = produce(client, cluster.bootstrap_servers, topic, 0, batch, codec=codec)
        for i in range(len(batch)):
            codec_of_offset[len(records) + i] = codec
        records.extend(batch)
        if offsets is None:
            acknowledged = None
        elif acknowledged is not None:
            acknowledged.extend(offsets)
    return Written(topic, records, acknowledged, codec_of_offset, started, int(time.time() * 1000))


@pytest.fixture(scope="module")
def written(cluster3: LocalCluster) -> Callable[[str], Written]:
    """Each client's round-trip topic, written on first use and shared by the tests after."""
    cache: dict[str, Written | BaseException] = {}

    def get(client: str) -> Written:
        if client not in cache:
            try:
                cache[client] = write_every_codec(cluster3, client)
            except BaseException as e:
                cache[client] = e
                raise
        found = cache[client]
        if isinstance(found, BaseException):
            raise AssertionError(f"writing with {client} failed earlier: {found!r}")
        return found

    return get


def assert_read_back(written: Written, consumed: list[Consumed], start: int) -> None:
    expected = written.records[start:]
    assert [c.offset for c in consumed] == list(range(start, start + len(expected))), (
        "offsets are not contiguous from the start offset"
    )
    for record, want in zip(consumed, expected, strict=True):
        assert record.matches(want), f"offset {record.offset}: read {record}, wrote {want}"
        if want.timestamp is None:  # stamped by the client while producing
            assert written.started_ms - 1000 <= record.timestamp <= written.finished_ms + 1000


def batches_on_disk(cluster: LocalCluster, written: Written) -> list[BatchHeader]:
    total = len(written.records)
    return wait_until(
        lambda: (
            (found := stored_batches(cluster, written.topic, 0))
            and found[-1].next_offset == total
            and found
        ),
        30,
        f"{total} records in the segment files of {written.topic}",
    )


@pytest.mark.parametrize("client", CLIENTS)
def test_produced_with_every_codec(
    cluster3: LocalCluster, written: Callable[[str], Written], client: str
):
    result = written(client)
    total = len(result.records)
    if result.acknowledged is not None:
        assert result.acknowledged == list(range(total))
    assert latest_offset(cluster3, result.topic) == total
    batches = batches_on_disk(cluster3, result)
    assert batches[0].base_offset == 0
    for previous, batch in itertools.pairwise(batches):
        assert batch.base_offset == previous.next_offset
    assert sum(b.records_count for b in batches) == total


@pytest.mark.parametrize(
    ("client", "codec"),
    [pytest.param(client, codec, id=f"{client}-{codec}") for client in CLIENTS for codec in CODECS],
)
def test_stored_in_the_codec_written(
    cluster3: LocalCluster, written: Callable[[str], Written], client: str, codec: str
):
    """The broker stores a producer's batches as sent, so each is in the codec the producer was
    asked to use (and proves the client really compressed: none of them silently fell back)."""
    result = written(client)
    checked = 0
    for batch in batches_on_disk(cluster3, result):
        codecs = {result.codec_of_offset[o] for o in range(batch.base_offset, batch.next_offset)}
        assert len(codecs) == 1, f"batch at {batch.base_offset} mixes codecs {codecs}"
        if codecs == {codec}:
            assert batch.compression == CODEC_NUMBER[codec], f"batch at {batch.base_offset}"
            checked += batch.records_count
    assert checked == RECORDS_PER_CODEC


@pytest.mark.parametrize("consumer", CLIENTS)
@pytest.mark.parametrize("producer", CLIENTS)
def test_read_back(
    cluster3: LocalCluster, written: Callable[[str], Written], producer: str, consumer: str
):
    result = written(producer)
    total = len(result.records)
    bootstrap = cluster3.bootstrap_servers
    assert_read_back(result, consume(consumer, bootstrap, result.topic, 0, 0, total), 0)
    # From an offset in the middle of a compressed batch: the broker returns the whole batch
    # and the client skips the records before the offset it asked for.
    middle = total // 2 + 3
    tail = consume(consumer, bootstrap, result.topic, 0, middle, total - middle)
    assert_read_back(result, tail, middle)


# ---------------------------------------------------------------------------------------------
# acks


def _latest_or_none(cluster: LocalCluster, topic: str) -> int | None:
    """The partition's high watermark, or None while its leader cannot answer yet."""
    try:
        return latest_offset(cluster, topic)
    except AssertionError:
        return None


@pytest.mark.parametrize("acks", [0, 1])
@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_acks(cluster3: LocalCluster, client: str, acks: int):
    topic = unique_topic(f"acks{acks}-{client}")
    create_topic(cluster3.bootstrap_servers, topic)
    # With acks=0 nothing reports a record sent before the leader has the partition: wait until
    # the leader answers for it (CreateTopics only waits for the metadata of the broker it asked).
    wait_until(
        lambda: _latest_or_none(cluster3, topic) == 0, 30, "the leader to host the partition"
    )
    records = [
        Rec(f"k{i}".encode(), f"v{i}".encode(), (), 1_600_000_000_000 + i) for i in range(20)
    ]
    offsets = produce(client, cluster3.bootstrap_servers, topic, 0, records, acks=acks)
    if acks == 0:
        assert offsets == [-1] * 20  # nobody answered, so nobody knows
    else:
        assert offsets == list(range(20))
    wait_until(lambda: _latest_or_none(cluster3, topic) == 20, 30, "20 records committed")
    consumed = consume("confluent", cluster3.bootstrap_servers, topic, 0, 0, 20)
    assert [c.offset for c in consumed] == list(range(20))
    assert all(c.matches(r) for c, r in zip(consumed, records, strict=True))


# ---------------------------------------------------------------------------------------------
# ListOffsets: earliest, latest, by timestamp


def write_timestamped(
    cluster: LocalCluster,
    topic: str,
    codecs: list[str],
    base: int,
    client: str = "confluent",
) -> int:
    """Ten records per codec, one batch per codec, timestamps base + 1000 * offset (values
    compressible: clients send a batch uncompressed when compression would not shrink it)."""
    offset = 0
    for codec in codecs:
        batch = [
            Rec(b"k", f"v{offset + i}".encode() + FILLER, (), base + (offset + i) * 1000)
            for i in range(10)
        ]
        offsets = produce(
            client, cluster.bootstrap_servers, topic, 0, batch, codec=codec, linger_ms=500
        )
        assert offsets == [offset + i for i in range(10)]
        offset += 10
    return offset


def test_list_offsets_through_clients(cluster3: LocalCluster):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition

    topic = unique_topic("list-offsets")
    create_topic(cluster3.bootstrap_servers, topic)
    base = 1_650_000_000_000
    # The second batch is gzip: the broker must look inside a compressed batch for the record.
    total = write_timestamped(cluster3, topic, ["none", "gzip"], base)
    queries = {
        base - 5000: 0,  # before everything: the first record
        base: 0,
        base + 2500: 3,  # between records: the next one
        base + 9000: 9,
        base + 9001: 10,  # the first record of the next batch
        base + 12000: 12,  # inside the gzip batch
        base + 12001: 13,
        base + 19000: 19,
    }

    consumer = confluent_consumer(cluster3.bootstrap_servers)
    try:
        low, high = consumer.get_watermark_offsets(
            ConfluentTopicPartition(topic, 0), timeout=30, cached=False
        )
        assert (low, high) == (0, total)
        for timestamp, offset in queries.items():
            (answer,) = consumer.offsets_for_times(
                [ConfluentTopicPartition(topic, 0, timestamp)], timeout=30
            )
            assert answer.error is None
            assert answer.offset == offset, f"confluent-kafka, timestamp {timestamp}"
        (beyond,) = consumer.offsets_for_times(
            [ConfluentTopicPartition(topic, 0, base + 20_000)], timeout=30
        )
        assert beyond.offset == -1  # no record that late: Kafka answers offset -1
    finally:
        consumer.close()

    kafka = KafkaConsumer(bootstrap_servers=cluster3.bootstrap_servers, group_id=None)
    try:
        partition = KafkaTopicPartition(topic, 0)
        assert kafka.beginning_offsets([partition]) == {partition: 0}
        assert kafka.end_offsets([partition]) == {partition: total}
        for timestamp, offset in queries.items():
            found = kafka.offsets_for_times({partition: timestamp})[partition]
            assert found is not None and found.offset == offset, f"kafka-python, {timestamp}"
            assert found.timestamp == base + offset * 1000
        assert kafka.offsets_for_times({partition: base + 20_000}) == {partition: None}
    finally:
        kafka.close()


@pytest.mark.parametrize("codec", ["snappy", "lz4", "zstd"])
def test_list_offsets_by_timestamp_inside_other_codecs(cluster3: LocalCluster, codec: str):
    topic = unique_topic(f"list-offsets-{codec}")
    create_topic(cluster3.bootstrap_servers, topic)
    base = 1_650_000_000_000
    write_timestamped(cluster3, topic, [codec], base, client="kafka-python")
    batches = wait_until(lambda: stored_batches(cluster3, topic, 0), 30, "the batch on disk")
    if [(b.records_count, b.compression) for b in batches] != [(10, CODEC_NUMBER[codec])]:
        # Not an AssertionError: a broken precondition must fail, not pass as the known xfail.
        raise RuntimeError(f"expected one {codec} batch of 10 records, stored {batches}")
    consumer = confluent_consumer(cluster3.bootstrap_servers)
    try:
        (answer,) = consumer.offsets_for_times(
            [ConfluentTopicPartition(topic, 0, base + 2500)], timeout=30
        )
    finally:
        consumer.close()
    assert answer.offset == 3


# ---------------------------------------------------------------------------------------------
# Errors a client must see with Kafka's codes


def test_fetch_beyond_the_log_end_is_offset_out_of_range(cluster3: LocalCluster):
    from kafka.errors import OffsetOutOfRangeError

    topic = unique_topic("out-of-range")
    create_topic(cluster3.bootstrap_servers, topic)
    records = [Rec(b"k", f"v{i}".encode(), (), 1_600_000_000_000) for i in range(5)]
    produce("confluent", cluster3.bootstrap_servers, topic, 0, records)

    with _wire.WireConnection.to(leader_bootstrap(cluster3, topic)) as leader:
        at_end = _wire.fetch(leader, topic, 0, 5)
        assert (at_end.error_code, at_end.records) == (ErrorCode.none, b"")  # nothing yet: fine
        assert at_end.high_watermark == 5
        for offset in (6, 1000, -7):
            answer = _wire.fetch(leader, topic, 0, offset)
            assert answer.error_code == ErrorCode.offset_out_of_range, offset

    # auto.offset.reset=error: librdkafka reports the broker's OFFSET_OUT_OF_RANGE.
    consumer = confluent_consumer(cluster3.bootstrap_servers)
    try:
        consumer.assign([ConfluentTopicPartition(topic, 0, 1000)])
        message = wait_until(lambda: consumer.poll(0.5), 30, "an answer to the consumer")
        assert message is not None
        error = message.error()
        assert error is not None
        assert error.code() == KafkaError._AUTO_OFFSET_RESET
        assert "out of range" in error.str().lower()
    finally:
        consumer.close()

    for client in ("kafka-python", "aiokafka"):
        with pytest.raises(ClientError) as failure:
            consume(client, cluster3.bootstrap_servers, topic, 0, 1000, 1, timeout=30)
        assert isinstance(failure.value.__cause__, OffsetOutOfRangeError) or (
            "OffsetOutOfRange" in repr(failure.value.__cause__)
        ), client


def test_produce_to_a_partition_that_does_not_exist(cluster3: LocalCluster):
    topic = unique_topic("no-such-partition")
    create_topic(cluster3.bootstrap_servers, topic, partitions=2)
    batch = build_batch([(b"k", b"v", [], 1_600_000_000_000)])
    with _wire.WireConnection.to(leader_bootstrap(cluster3, topic)) as leader:
        answer = _wire.produce(leader, topic, 7, batch)
        assert answer.error_code == ErrorCode.unknown_topic_or_partition
        assert _wire.produce(leader, topic, -1, batch).error_code == (
            ErrorCode.unknown_topic_or_partition
        )
    # A client refuses too (librdkafka knows the partition count from the broker's metadata).
    producer = Producer({"bootstrap.servers": cluster3.bootstrap_servers})
    errors: list[Any] = []
    try:
        producer.list_topics(topic, timeout=30)
        producer.produce(topic, b"v", partition=7, on_delivery=lambda e, _m: errors.append(e))
        producer.flush(30)
    except KafkaException as e:
        errors.append(e.args[0])
    assert [e.code() for e in errors] == [KafkaError._UNKNOWN_PARTITION]
    assert latest_offset(cluster3, topic, 0) == 0
    assert latest_offset(cluster3, topic, 1) == 0


@pytest.mark.parametrize("name", ["bad name!", "x" * 250, ".", "..", "tab\tname", "slash/name"])
def test_create_topic_with_an_invalid_name(cluster3: LocalCluster, name: str):
    assert create_topic_error(cluster3.bootstrap_servers, name) == KafkaError.TOPIC_EXCEPTION


def test_create_topic_errors_through_kafka_python(cluster3: LocalCluster):
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import InvalidTopicError, TopicAlreadyExistsError

    topic = unique_topic("exists")
    create_topic(cluster3.bootstrap_servers, topic)
    assert create_topic_error(cluster3.bootstrap_servers, topic) == (
        KafkaError.TOPIC_ALREADY_EXISTS
    )
    admin = KafkaAdminClient(bootstrap_servers=cluster3.bootstrap_servers)
    try:
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic, 1, 1)])
        with pytest.raises(InvalidTopicError):
            admin.create_topics([NewTopic("no spaces allowed", 1, 1)])
    finally:
        admin.close()


def produce_error(bootstrap: str, topic: str, value: bytes) -> int | None:
    """Produce one record (client-side limit raised to 8 MB); the delivery error code or None."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "message.max.bytes": 8_000_000,
            "enable.idempotence": False,
            "message.send.max.retries": 0,
        }
    )
    reports: list[KafkaError | None] = []
    producer.produce(topic, value, partition=0, on_delivery=lambda e, _m: reports.append(e))
    assert producer.flush(60) == 0
    (error,) = reports
    return None if error is None else int(error.code())


def test_record_larger_than_message_max_bytes(cluster3: LocalCluster):
    bootstrap = cluster3.bootstrap_servers
    # The broker's message.max.bytes (1048588 by default) ...
    topic = unique_topic("too-large")
    create_topic(bootstrap, topic)
    assert produce_error(bootstrap, topic, b"x" * 1_200_000) == KafkaError.MSG_SIZE_TOO_LARGE
    assert latest_offset(cluster3, topic) == 0
    # ... and a topic's own max.message.bytes.
    small = unique_topic("too-large-topic")
    create_topic(bootstrap, small, configs={"max.message.bytes": "1024"})
    assert produce_error(bootstrap, small, b"y" * 2048) == KafkaError.MSG_SIZE_TOO_LARGE
    assert produce_error(bootstrap, small, b"y" * 500) is None
    assert latest_offset(cluster3, small) == 1


def test_brokers_run_as_a_user_runs_them(cluster3: LocalCluster):
    """The fixture's brokers are `odradek server <server.properties>` processes."""
    for broker in cluster3.brokers:
        assert broker.pid is not None
        argv = Path(f"/proc/{broker.pid}/cmdline").read_bytes().split(b"\0")
        assert b"server" in argv and str(broker.config).encode() in argv
