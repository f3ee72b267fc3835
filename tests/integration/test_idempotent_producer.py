"""The idempotent producer against real brokers and real clients at their defaults.

* InitProducerId 0-5: fresh ids from blocks in `/latest_producer_id_block` (Kafka's JSON), never
  the same id twice across brokers; a transactional id goes to the transaction coordinator.
* Kafka 3.9.1's Java producer with nothing but bootstrap.servers (idempotence on by default),
  kafka-python 3 at its defaults, confluent-kafka with enable.idempotence=true, aiokafka with
  enable_idempotence=True and KafkaJS with idempotent: every batch stored carries a producer id,
  every acknowledged record is read back once, at the offset it was acknowledged with.
* The producer state survives a clean and an unclean restart: a retry of the last batch is
  answered with its original offset and not stored again; a gap is OUT_OF_ORDER_SEQUENCE_NUMBER.

The dropped-response proxy and the leader SIGKILL are in test_idempotent_failover.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.protocol.record_batch import build_batch
from odradek.testing import LocalCluster
from odradek.zk.client import ZkClient
from odradek.zk.znodes.producer_ids import ProducerIdBlockZNode
from tests.fixtures.cluster import wait_until
from tests.integration import _wire
from tests.integration._clients import (
    CLIENT_TIMEOUT_S,
    consume,
    create_topic,
    stored_batches,
    unique_topic,
)
from tests.integration._kafka import kafka_available, kafka_libs
from tests.integration._replication import request

JAVA_SOURCE = Path(__file__).resolve().parents[1] / "java" / "IdempotentProducer.java"
NODE_CLIENT = Path(__file__).resolve().parents[1] / "js" / "client.js"
RECORDS = 3000
PARTITIONS = 3


# -- helpers ----------------------------------------------------------------------------------


def init_producer_id(
    broker: Any, version: int = 4, transactional_id: str | None = None, **values: int
) -> tuple[ErrorCode, int, int]:
    body: dict[str, Any] = {"transactional_id": transactional_id, "transaction_timeout": 60_000}
    if version >= 3:
        body.update(
            producer_id=values.get("producer_id", -1), producer_epoch=values.get("epoch", -1)
        )
    response = request(broker, ApiKey.INIT_PRODUCER_ID, version, body)
    return ErrorCode(response.error_code), int(response.producer_id), int(response.producer_epoch)


def read_producer_id_block(cluster: LocalCluster) -> tuple[bytes, int]:
    async def read() -> tuple[bytes, int]:
        zk = ZkClient(cluster.zookeeper_connect, session_timeout_s=10)
        await zk.start(timeout=10)
        try:
            data, stat = await zk.get(ProducerIdBlockZNode.path())
        finally:
            await zk.close()
        return data, stat.version

    return asyncio.run(read())


def end_offset(cluster: LocalCluster, topic: str, partition: int) -> int:
    """The partition's high watermark, asked of each broker until its leader answers."""
    for server in cluster.bootstrap_servers.split(","):
        try:
            return _wire.log_end_offset(server, topic, partition)
        except (OSError, _wire.ConnectionClosed, _wire.NoAnswer, AssertionError):
            continue
    raise AssertionError(f"no broker answers ListOffsets for {topic}-{partition}")


def check_exactly_once(
    cluster: LocalCluster, topic: str, acked: dict[bytes, tuple[int, int]], partitions: int
) -> None:
    """Every acknowledged value is stored once, at its acknowledged offset; nothing else is
    stored twice; every stored batch of the topic carries a producer id."""
    stored: dict[bytes, list[tuple[int, int]]] = {}
    for partition in range(partitions):
        end = end_offset(cluster, topic, partition)
        records = consume("confluent", cluster.bootstrap_servers, topic, partition, 0, end)
        assert len(records) == end
        for record in records:
            assert record.value is not None
            stored.setdefault(record.value, []).append((partition, record.offset))
        batches = stored_batches(cluster, topic, partition)
        assert len(batches) >= (1 if end else 0)  # a sticky partitioner may leave one empty
        assert all(b.producer_id >= 0 and b.base_sequence >= 0 for b in batches)
    assert stored, f"nothing stored in {topic}"
    duplicates = {value: places for value, places in stored.items() if len(places) > 1}
    assert not duplicates, f"stored more than once: {list(duplicates.items())[:5]}"
    for value, place in acked.items():
        assert stored.get(value) == [place], (
            f"{value!r} acknowledged at {place}, stored at {stored.get(value)}"
        )


# -- InitProducerId -----------------------------------------------------------------------------


def test_init_producer_id_hands_out_blocks_from_zookeeper(cluster3: LocalCluster) -> None:
    ids = []
    for version in range(6):
        for broker in cluster3.brokers:
            error, producer_id, epoch = init_producer_id(broker, version)
            assert (error, epoch) == (ErrorCode.none, 0)
            ids.append(producer_id)
    assert len(set(ids)) == len(ids) and min(ids) >= 0
    data, version = read_producer_id_block(cluster3)
    block = json.loads(data)
    assert set(block) == {"version", "broker", "block_start", "block_end"}
    assert block["version"] == 1 and isinstance(block["block_start"], str)
    assert int(block["block_end"]) - int(block["block_start"]) == 999
    assert block["broker"] in cluster3.broker_ids and version >= 3  # one block per broker at least
    # Each broker serves ids from its own block: no two brokers' ids fall in one block of 1000.
    assert len({producer_id // 1000 for producer_id in ids}) >= len(cluster3.brokers)


def test_init_producer_id_refusals(cluster3: LocalCluster) -> None:
    broker = cluster3.brokers[0]
    # With a transactional id the transaction coordinator answers: this broker coordinates
    # "tx-1" (a producer id) or says NOT_COORDINATOR (the client asks FindCoordinator first).
    assert init_producer_id(broker, 4, transactional_id="tx-1")[0] in (
        ErrorCode.none,
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_load_in_progress,
    )
    # KIP-360 fields: an id without an epoch (or the reverse) is INVALID_REQUEST.
    assert init_producer_id(broker, 3, producer_id=5)[0] == ErrorCode.invalid_request
    assert init_producer_id(broker, 3, epoch=2)[0] == ErrorCode.invalid_request
    # A known id and epoch without a transactional id: a fresh id at epoch 0, as Kafka answers.
    error, producer_id, epoch = init_producer_id(broker, 4, producer_id=5, epoch=2)
    assert (error, epoch) == (ErrorCode.none, 0) and producer_id != 5


# -- real clients at their defaults ----------------------------------------------------------


@pytest.fixture(scope="module")
def java_producer(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    if not kafka_available() or shutil.which("javac") is None:
        pytest.skip("Kafka 3.9.1's jars (./dev kafka) and a JDK are needed")
    classes = tmp_path_factory.mktemp("java")
    clients_jar = next(kafka_libs().glob("kafka-clients-*.jar"))
    subprocess.run(
        ["javac", "-cp", str(clients_jar), "-d", str(classes), str(JAVA_SOURCE)],
        check=True,
        timeout=120,
    )
    return ["java", "-cp", f"{classes}:{kafka_libs()}/*", "IdempotentProducer"]


def test_java_producer_at_its_defaults(cluster3: LocalCluster, java_producer: list[str]) -> None:
    topic = unique_topic("idem-java")
    create_topic(cluster3.bootstrap_servers, topic, PARTITIONS, 3)
    result = subprocess.run(
        [*java_producer, cluster3.bootstrap_servers, topic, str(RECORDS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines[-1] == "done", (
        result.stdout[-2000:] + result.stderr[-2000:]
    )
    acked = {}
    for line in lines:
        if line.startswith("ack "):
            _, partition, offset, value = line.split()
            acked[value.encode()] = (int(partition), int(offset))
    assert len(acked) == RECORDS
    check_exactly_once(cluster3, topic, acked, PARTITIONS)


def _produce_kafka_python(
    bootstrap: str, topic: str, values: list[bytes]
) -> dict[bytes, tuple[int, int]]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)  # kafka-python 3: idempotent by default
    try:
        assert producer.config["enable_idempotence"] is True
        futures = [(value, producer.send(topic, value=value)) for value in values]
        producer.flush(CLIENT_TIMEOUT_S)
        return {
            value: (metadata.partition, metadata.offset)
            for value, future in futures
            for metadata in [future.get(CLIENT_TIMEOUT_S)]
        }
    finally:
        producer.close(5)


def _produce_confluent(
    bootstrap: str, topic: str, values: list[bytes]
) -> dict[bytes, tuple[int, int]]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    acked: dict[bytes, tuple[int, int]] = {}
    errors: list[Any] = []

    def report(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(error)
        else:
            acked[message.value()] = (message.partition(), message.offset())

    for value in values:
        producer.produce(topic, value, on_delivery=report)
        producer.poll(0)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0 and not errors, errors[:3]
    return acked


def _produce_aiokafka(
    bootstrap: str, topic: str, values: list[bytes]
) -> dict[bytes, tuple[int, int]]:
    from aiokafka import AIOKafkaProducer

    async def run() -> dict[bytes, tuple[int, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            futures = [(value, await producer.send(topic, value)) for value in values]
            results = {}
            for value, future in futures:
                metadata = await future
                results[value] = (metadata.partition, metadata.offset)
            return results
        finally:
            await producer.stop()

    return asyncio.run(asyncio.wait_for(run(), CLIENT_TIMEOUT_S))


@pytest.mark.parametrize("client", ["kafka-python", "confluent", "aiokafka"])
def test_python_clients_with_idempotence(cluster3: LocalCluster, client: str) -> None:
    topic = unique_topic(f"idem-{client}")
    create_topic(cluster3.bootstrap_servers, topic, PARTITIONS, 3)
    values = [f"{client}-{i}".encode() for i in range(RECORDS)]
    produce = {
        "kafka-python": _produce_kafka_python,
        "confluent": _produce_confluent,
        "aiokafka": _produce_aiokafka,
    }[client]
    acked = produce(cluster3.bootstrap_servers, topic, values)
    assert set(acked) == set(values)
    check_exactly_once(cluster3, topic, acked, PARTITIONS)


def test_kafkajs_idempotent_producer(cluster3: LocalCluster) -> None:
    if (
        shutil.which("node") is None
        or not (NODE_CLIENT.parent / "node_modules" / "kafkajs").is_dir()
    ):
        pytest.skip("KafkaJS is installed by ./dev setup (npm ci in tests/js)")
    topic = unique_topic("idem-kafkajs")
    create_topic(cluster3.bootstrap_servers, topic, PARTITIONS, 3)
    job = {
        "brokers": cluster3.bootstrap_servers.split(","),
        "ssl": None,
        "sasl": None,
        "topic": topic,
        "count": 500,
        "steps": ["produce"],
        "idempotent": True,
    }
    result = subprocess.run(
        ["node", str(NODE_CLIENT)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["ok"] and answer["produced"] == 500, answer
    check_exactly_once(cluster3, topic, {}, PARTITIONS)
    values = Counter()
    for partition in range(PARTITIONS):
        end = end_offset(cluster3, topic, partition)
        values.update(
            r.value
            for r in consume("confluent", cluster3.bootstrap_servers, topic, partition, 0, end)
        )
    assert values == Counter(f"v{i}".encode() for i in range(500))


# -- producer state across restarts -------------------------------------------------------------


def _batch(producer_id: int, sequence: int, count: int = 2) -> bytes:
    return build_batch(
        # Current timestamps: a producer whose last write is older than producer.id.expiration.ms
        # (a day) is not reloaded after a restart.
        [(None, f"s{sequence + i}".encode(), [], int(time.time() * 1000)) for i in range(count)],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=sequence,
    )


def test_producer_state_survives_clean_and_unclean_restarts(make_cluster: Any) -> None:
    cluster = make_cluster(brokers=1, log_segment_bytes=4096)
    topic = unique_topic("idem-restart")
    create_topic(cluster.bootstrap_servers, topic, 1, 1)
    broker = cluster.brokers[0]
    error, producer_id, _ = init_producer_id(broker)
    assert error == ErrorCode.none
    offsets = []
    with _wire.WireConnection.to(cluster.bootstrap_servers) as connection:
        for sequence in range(0, 200, 2):
            answer = _wire.produce(connection, topic, 0, _batch(producer_id, sequence), acks=-1)
            assert answer.error_code == ErrorCode.none, answer
            offsets.append(answer.base_offset)
    next_sequence = 200
    directory = broker.data_dir / f"{topic}-0"
    for restart in ("clean", "unclean"):
        if restart == "clean":
            cluster.restart(broker.id)
        else:
            cluster.kill(broker.id)
            cluster.start_broker(broker.id)
        snapshots = sorted(p.name for p in directory.glob("*.snapshot"))
        assert snapshots, f"no producer snapshot in {directory}"
        wait_until(
            lambda: _serving(cluster, topic),
            60,
            f"{topic}-0 to be served after the {restart} restart",
        )
        end = _wire.log_end_offset(cluster.bootstrap_servers, topic, 0)
        with _wire.WireConnection.to(cluster.bootstrap_servers) as connection:
            retry = _wire.produce(
                connection, topic, 0, _batch(producer_id, next_sequence - 2), acks=-1
            )
            assert (retry.error_code, retry.base_offset) == (ErrorCode.none, offsets[-1]), restart
            assert _wire.log_end_offset(cluster.bootstrap_servers, topic, 0) == end
            gap = _wire.produce(
                connection, topic, 0, _batch(producer_id, next_sequence + 2), acks=-1
            )
            assert gap.error_code == ErrorCode.out_of_order_sequence_number, restart
            ok = _wire.produce(connection, topic, 0, _batch(producer_id, next_sequence), acks=-1)
            assert (ok.error_code, ok.base_offset) == (ErrorCode.none, end), restart
            offsets.append(ok.base_offset)
            next_sequence += 2


def _serving(cluster: LocalCluster, topic: str) -> bool:
    try:
        return _wire.log_end_offset(cluster.bootstrap_servers, topic, 0) >= 0
    except (OSError, _wire.ConnectionClosed, _wire.NoAnswer, AssertionError):
        return False


def test_idle_producers_expire(make_cluster: Any) -> None:
    cluster = make_cluster(
        brokers=1,
        shared_zookeeper=True,
        producer_id_expiration_ms=3000,
        producer_id_expiration_check_interval_ms=500,
    )
    topic = unique_topic("idem-expire")
    create_topic(cluster.bootstrap_servers, topic, 1, 1)
    error, producer_id, _ = init_producer_id(cluster.brokers[0])
    assert error == ErrorCode.none
    with _wire.WireConnection.to(cluster.bootstrap_servers) as connection:
        written_ms = time.time() * 1000  # at most the first batch's timestamp
        first = _wire.produce(connection, topic, 0, _batch(producer_id, 0), acks=-1)
        assert first.error_code == ErrorCode.none
        gap = _wire.produce(connection, topic, 0, _batch(producer_id, 10), acks=-1)
        assert gap.error_code == ErrorCode.out_of_order_sequence_number  # still known

        def accepted_once_forgotten() -> bool:
            answer = _wire.produce(connection, topic, 0, _batch(producer_id, 10), acks=-1)
            assert answer.error_code in (ErrorCode.none, ErrorCode.out_of_order_sequence_number)
            return answer.error_code == ErrorCode.none

        wait_until(accepted_once_forgotten, 30, "the idle producer to be forgotten", interval=0.25)
        # Not before producer.id.expiration.ms (3 s) after its last write.
        assert time.time() * 1000 - written_ms >= 3000
