"""Real Kafka clients behind one small interface, for the walking-skeleton integration tests.

Four clients talk to the brokers exactly as users run them: confluent-kafka (librdkafka 2.x, the
Python binding), kafka-python (pure Python), aiokafka (asyncio) and kcat (Debian's librdkafka
2.0.2 command-line tool, run as a subprocess). Each can

* `produce(client, bootstrap, topic, partition, records, codec, acks)`: write `Rec`s to one
  partition and return the offsets the broker acknowledged, in the order given (-1 for acks=0,
  None for kcat, which does not report offsets);
* `consume(client, bootstrap, topic, partition, start, count)`: read by explicit partition
  assignment (no consumer group, no committed offsets) from `start` until `count` records
  arrived, and return them as `Consumed` records normalised to one shape.

What each client cannot express is stated where it matters: kcat sets no per-record timestamps
(librdkafka stamps the produce time), gives every record of one run the same headers, and splits
"key:value" lines, so its records have non-null ASCII keys and values without ':' or newlines.

`StreamingProducer` keeps a confluent-kafka producer writing from a thread while a test crashes
the broker or throws garbage at it, and records every delivery report. `stored_batches` reads a
partition's segment files straight from a broker's data directory, to check that what a client
compressed is what the broker stored (the broker never re-encodes). `create_topic` first waits
until the brokers serve metadata (`wait_until_serving` says why).

Concurrency: every function is synchronous and owns the client objects it creates; aiokafka runs
on a private event loop (`asyncio.run`); `StreamingProducer` states its own rules. Waits are
deadlines, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from odradek.log.naming import log_dir_name, parse_segment_file_name
from odradek.protocol.record_batch import BatchHeader, iter_batches
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration import _wire

CLIENTS = ("confluent", "kafka-python", "aiokafka", "kcat")
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
CODEC_NUMBER = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
KCAT = "/usr/bin/kcat"
CLIENT_TIMEOUT_S = 60.0
CONFLUENT_CREATE_TIME = 1  # confluent_kafka.TIMESTAMP_CREATE_TIME


def unique_topic(prefix: str) -> str:
    """A topic name no other test of the session uses (cluster3 is shared)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class Rec:
    """A record as a producer is asked to write it; timestamp None lets the client stamp it."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None


@dataclass(frozen=True)
class Consumed:
    """A record as a consumer read it back, the same shape whichever client read it."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int

    def matches(self, expected: Rec) -> bool:
        return (self.key, self.value, self.headers) == (
            expected.key,
            expected.value,
            expected.headers,
        ) and (expected.timestamp is None or expected.timestamp == self.timestamp)


class ClientError(AssertionError):
    """A client reported an error where the test expected none (delivery or fetch failure)."""


# ---------------------------------------------------------------------------------------------
# Topics


def wait_until_serving(bootstrap: str, timeout: float = 30.0) -> None:
    """Wait until every broker of `bootstrap` answers Metadata with all of them and a controller.

    `LocalCluster.up` returns once the brokers are registered and a controller is elected, which
    can be before a broker has received its first UpdateMetadata: its Metadata answer is then
    "no brokers, controller -1", and librdkafka's AdminClient, given that answer, waits for a
    controller until its request times out instead of asking again. A user's first CreateTopics
    would hit the same window; the tests wait it out here, so that they test what they mean to.
    """
    servers = bootstrap.split(",")

    def serving() -> bool:
        for server in servers:
            try:
                controller, brokers = _wire.cluster_view(server)
            except (OSError, _wire.ConnectionClosed, _wire.NoAnswer):
                return False
            if controller < 0 or len(brokers) < len(servers):
                return False
        return True

    wait_until(serving, timeout, f"brokers {bootstrap} to serve metadata")


def create_topic(
    bootstrap: str,
    topic: str,
    partitions: int = 1,
    replication_factor: int = -1,
    configs: dict[str, str] | None = None,
) -> None:
    """CreateTopics through confluent-kafka's AdminClient; raises the client's KafkaException."""
    wait_until_serving(bootstrap)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, partitions, replication_factor, config=configs or {})],
        operation_timeout=30,
        request_timeout=40,
    )
    futures[topic].result(timeout=CLIENT_TIMEOUT_S)


def create_topic_error(bootstrap: str, topic: str, **kwargs: Any) -> int | None:
    """CreateTopics for one topic; the Kafka error code the broker answered, None if none."""
    from confluent_kafka import KafkaException

    try:
        create_topic(bootstrap, topic, **kwargs)
    except KafkaException as e:
        return int(e.args[0].code())
    return None


# ---------------------------------------------------------------------------------------------
# Producing


def produce(
    client: str,
    bootstrap: str,
    topic: str,
    partition: int,
    records: Sequence[Rec],
    codec: str = "none",
    acks: int = -1,
    linger_ms: int = 5,
) -> list[int] | None:
    """Write `records` with `client` (see the module docstring); ClientError on any failure.

    `linger_ms` is how long the client waits to fill a batch; records sent within it go in one
    batch (kcat ignores it)."""
    producers = {
        "confluent": _produce_confluent,
        "kafka-python": _produce_kafka_python,
        "aiokafka": _produce_aiokafka,
        "kcat": _produce_kcat,
    }
    return producers[client](bootstrap, topic, partition, records, codec, acks, linger_ms)


def _produce_confluent(
    bootstrap: str,
    topic: str,
    partition: int,
    records: Sequence[Rec],
    codec: str,
    acks: int,
    linger_ms: int,
) -> list[int]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "acks": str(acks),
            "linger.ms": linger_ms,
            "enable.idempotence": False,
        }
    )
    reports: dict[int, tuple[Any, int]] = {}
    for index, record in enumerate(records):

        def on_delivery(error: Any, message: Any, index: int = index) -> None:
            reports[index] = (error, message.offset())

        producer.produce(
            topic,
            value=record.value,
            key=record.key,
            headers=list(record.headers),
            partition=partition,
            timestamp=record.timestamp or 0,
            on_delivery=on_delivery,
        )
        producer.poll(0)
    remaining = producer.flush(CLIENT_TIMEOUT_S)
    if remaining:
        raise ClientError(f"confluent-kafka: {remaining} records undelivered after flush")
    errors = {i: e for i, (e, _) in reports.items() if e is not None}
    if errors:
        raise ClientError(f"confluent-kafka delivery errors: {errors}")
    offsets = [reports[i][1] for i in range(len(records))]
    return [-1 if acks == 0 else offset for offset in offsets]


def _kafka_python_acks(acks: int) -> int | str:
    return "all" if acks == -1 else acks


def _produce_kafka_python(
    bootstrap: str,
    topic: str,
    partition: int,
    records: Sequence[Rec],
    codec: str,
    acks: int,
    linger_ms: int,
) -> list[int]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if codec == "none" else codec,
        acks=_kafka_python_acks(acks),
        linger_ms=linger_ms,
        # kafka-python 3 defaults to idempotence, which needs acks=all; these tests also use
        # acks=0 and 1 (test_idempotent_producer.py runs it at its defaults).
        enable_idempotence=False,
    )
    try:
        futures = [
            producer.send(
                topic,
                value=record.value,
                key=record.key,
                headers=list(record.headers),
                partition=partition,
                timestamp_ms=record.timestamp,
            )
            for record in records
        ]
        producer.flush(CLIENT_TIMEOUT_S)
        try:
            offsets = [future.get(CLIENT_TIMEOUT_S).offset for future in futures]
        except Exception as e:
            raise ClientError(f"kafka-python delivery error: {e!r}") from e
        # With acks=0 nobody answers, so the "offsets" kafka-python reports mean nothing.
        return [-1] * len(offsets) if acks == 0 else offsets
    finally:
        producer.close(5)


def _produce_aiokafka(
    bootstrap: str,
    topic: str,
    partition: int,
    records: Sequence[Rec],
    codec: str,
    acks: int,
    linger_ms: int,
) -> list[int]:
    from aiokafka import AIOKafkaProducer

    async def run() -> list[int]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            compression_type=None if codec == "none" else codec,
            acks=_kafka_python_acks(acks),
            linger_ms=linger_ms,
        )
        await producer.start()
        try:
            futures = [
                await producer.send(
                    topic,
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                    partition=partition,
                    timestamp_ms=record.timestamp,
                )
                for record in records
            ]
            try:
                metadata = await asyncio.wait_for(asyncio.gather(*futures), CLIENT_TIMEOUT_S)
            except Exception as e:
                raise ClientError(f"aiokafka delivery error: {e!r}") from e
            # With acks=0 nobody answers: aiokafka reports None for each record.
            return [-1 if acks == 0 else m.offset for m in metadata]
        finally:
            await producer.stop()

    return asyncio.run(run())


def _produce_kcat(
    bootstrap: str,
    topic: str,
    partition: int,
    records: Sequence[Rec],
    codec: str,
    acks: int,
    linger_ms: int,
) -> None:
    headers = {r.headers for r in records}
    if len(headers) != 1:
        raise ValueError("kcat gives every record of one run the same headers")
    lines = []
    for record in records:
        if record.timestamp is not None or record.key is None or record.value is None:
            raise ValueError("kcat records have client timestamps and non-null keys and values")
        if b":" in record.key or b"\n" in record.key + record.value:
            raise ValueError("kcat splits 'key:value' lines")
        lines.append(record.key + b":" + record.value)
    command = [KCAT, "-P", "-b", bootstrap, "-t", topic, "-p", str(partition), "-K", ":"]
    command += ["-z", codec, "-X", f"acks={acks}", "-X", "enable.idempotence=false"]
    for name, value in next(iter(headers)):
        command += ["-H", f"{name}={value.decode()}"]
    result = subprocess.run(
        command,
        input=b"\n".join(lines) + b"\n",
        capture_output=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0 or b"ERROR" in result.stderr:
        raise ClientError(f"kcat -P exited {result.returncode}: {result.stderr.decode()[-2000:]}")
    return None


class StreamingProducer:
    """A confluent-kafka producer (no idempotence) writing numbered values ("record-00000042")
    to partition 0 from a background thread until stopped, recording every delivery report.

    Concurrency: the producing thread owns `producer`; delivery callbacks run on it too (inside
    `poll`/`flush`), and append under `lock`, which the test thread takes to read the results.
    """

    MAX_QUEUED = 200  # keep the client's queue short, so that flushing at the end is quick

    def __init__(self, bootstrap: str, topic: str, acks: int) -> None:
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": str(acks),
                "enable.idempotence": False,
                "linger.ms": 2,
                "message.timeout.ms": 120_000,
                "retry.backoff.ms": 100,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
            }
        )
        self.lock = threading.Lock()
        self.acknowledged: list[tuple[int, bytes | None]] = []  # (offset, value), report order
        self.failed: list[tuple[bytes | None, KafkaError]] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="streaming-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        with self.lock:
            if error is None:
                self.acknowledged.append((message.offset() or 0, message.value()))
            else:
                self.failed.append((message.value(), error))

    def _run(self) -> None:
        while not self._stop.is_set():
            if len(self.producer) >= self.MAX_QUEUED:
                self.producer.poll(0.05)  # waits for delivery reports, not a fixed time
                continue
            value = f"record-{self.sent:08d}".encode()
            self.producer.produce(self.topic, value, partition=0, on_delivery=self._on_delivery)
            self.sent += 1
            self.producer.poll(0)

    def acknowledged_count(self) -> int:
        with self.lock:
            return len(self.acknowledged)

    def stop(self, timeout: float = CLIENT_TIMEOUT_S) -> int:
        """Stop producing and wait up to `timeout` for every outstanding report; returns the
        number of records still unreported."""
        self._stop.set()
        self._thread.join(30)
        return self.producer.flush(timeout)


# ---------------------------------------------------------------------------------------------
# Consuming


def consume(
    client: str,
    bootstrap: str,
    topic: str,
    partition: int,
    start: int,
    count: int,
    timeout: float = CLIENT_TIMEOUT_S,
) -> list[Consumed]:
    """Read `count` records from offset `start` by explicit assignment (see the module
    docstring). Returns what arrived before `timeout` (possibly fewer); ClientError if the client
    reported an error (a fetch beyond the log end, for one)."""
    consumers = {
        "confluent": _consume_confluent,
        "kafka-python": _consume_kafka_python,
        "aiokafka": _consume_aiokafka,
        "kcat": _consume_kcat,
    }
    return consumers[client](bootstrap, topic, partition, start, count, timeout)


def _headers(items: Any) -> tuple[tuple[str, bytes], ...]:
    # A header value may be null (the record's headers then say so); keep it as b"".
    return tuple((str(k), bytes(v or b"")) for k, v in (items or ()))


def confluent_consumer(bootstrap: str, **overrides: Any) -> Consumer:
    """A confluent-kafka consumer for explicit assignment: never commits, fails on a bad offset."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"odradek-tests-{uuid.uuid4().hex[:6]}",  # required, never joined
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            **overrides,
        }
    )


def _consume_confluent(
    bootstrap: str, topic: str, partition: int, start: int, count: int, timeout: float
) -> list[Consumed]:
    consumer = confluent_consumer(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        got: list[Consumed] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise ClientError(f"confluent-kafka consumer error: {message.error()}")
            timestamp_type, timestamp = message.timestamp()
            if timestamp_type != CONFLUENT_CREATE_TIME:
                raise ClientError(f"timestamp type {timestamp_type} is not CreateTime")
            offset = message.offset()
            if offset is None:
                raise ClientError("confluent-kafka returned a record without an offset")
            got.append(
                Consumed(
                    offset,
                    message.key(),
                    message.value(),
                    _headers(message.headers()),
                    timestamp,
                )
            )
        return got
    finally:
        consumer.close()


def _consume_kafka_python(
    bootstrap: str, topic: str, partition: int, start: int, count: int, timeout: float
) -> list[Consumed]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
    )
    try:
        assigned = KafkaTopicPartition(topic, partition)
        consumer.assign([assigned])
        consumer.seek(assigned, start)
        got: list[Consumed] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            try:
                batches = consumer.poll(timeout_ms=500)
            except Exception as e:
                raise ClientError(f"kafka-python consumer error: {e!r}") from e
            for message in batches.get(assigned, []):
                if message.timestamp_type != 0:
                    raise ClientError(f"timestamp type {message.timestamp_type} is not CreateTime")
                got.append(
                    Consumed(
                        message.offset,
                        message.key,
                        message.value,
                        _headers(message.headers),
                        message.timestamp,
                    )
                )
        return got
    finally:
        consumer.close()


def _consume_aiokafka(
    bootstrap: str, topic: str, partition: int, start: int, count: int, timeout: float
) -> list[Consumed]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTopicPartition

    async def run() -> list[Consumed]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",
        )
        await consumer.start()
        try:
            assigned = AioTopicPartition(topic, partition)
            consumer.assign([assigned])
            consumer.seek(assigned, start)
            got: list[Consumed] = []
            deadline = time.monotonic() + timeout
            while len(got) < count and time.monotonic() < deadline:
                try:
                    batches = await consumer.getmany(assigned, timeout_ms=500)
                except Exception as e:
                    raise ClientError(f"aiokafka consumer error: {e!r}") from e
                for message in batches.get(assigned, []):
                    if message.timestamp_type != 0:
                        raise ClientError(
                            f"timestamp type {message.timestamp_type} is not CreateTime"
                        )
                    got.append(
                        Consumed(
                            message.offset,
                            message.key,
                            message.value,
                            _headers(message.headers),
                            message.timestamp,
                        )
                    )
            return got
        finally:
            await consumer.stop()

    return asyncio.run(run())


def _consume_kcat(
    bootstrap: str, topic: str, partition: int, start: int, count: int, timeout: float
) -> list[Consumed]:
    command = [KCAT, "-C", "-b", bootstrap, "-t", topic, "-p", str(partition)]
    command += ["-o", str(start), "-c", str(count), "-e", "-J", "-q"]
    try:
        result = subprocess.run(command, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise ClientError(f"kcat -C did not finish in {timeout:g}s") from e
    if result.returncode != 0 or b"ERROR" in result.stderr:
        raise ClientError(f"kcat -C exited {result.returncode}: {result.stderr.decode()[-2000:]}")
    got = []
    for line in result.stdout.decode().splitlines():
        message = json.loads(line)
        if message["tstype"] != "create":
            raise ClientError(f"timestamp type {message['tstype']} is not CreateTime")
        flat = message.get("headers") or []
        headers = tuple((flat[i], flat[i + 1].encode()) for i in range(0, len(flat), 2))
        key, value = message["key"], message["payload"]
        got.append(
            Consumed(
                message["offset"],
                None if key is None else key.encode(),
                None if value is None else value.encode(),
                headers,
                message["ts"],
            )
        )
    return got


# ---------------------------------------------------------------------------------------------
# What the brokers stored


def stored_batches(cluster: LocalCluster, topic: str, partition: int) -> list[BatchHeader]:
    """The batch headers of the replica (of any broker) holding the most data, segment by segment
    in offset order, read from `<data_dir>/<topic>-<partition>/<base offset>.log`."""
    best: list[BatchHeader] = []
    for broker in cluster.brokers:
        directory = Path(broker.data_dir) / log_dir_name(topic, partition)
        if not directory.is_dir():
            continue
        headers: list[BatchHeader] = []
        segments = sorted(
            parsed[0]
            for path in directory.iterdir()
            if (parsed := parse_segment_file_name(path.name)) is not None and parsed[1] == ".log"
        )
        for base_offset in segments:
            data = (directory / f"{base_offset:020d}.log").read_bytes()
            headers.extend(iter_batches(data))
        if len(headers) > len(best):
            best = headers
    return best
