"""Idempotent producers through failures: a dropped Produce response and a leader SIGKILL.

* A real TCP proxy (`_proxy.DroppingProxy`, which the broker advertises as its address) forwards a
  Produce request to the broker, throws its answer away and closes the client's connection. The
  client retries the same batch (same producer id, epoch and sequence) on a new connection; the
  broker recognises it and answers with the original offset: the record is stored once.
* An idempotent confluent-kafka producer (acks=all) writes while the partition leader is
  SIGKILLed: the new leader knows every producer from the batches it replicated, so the client's
  retries of batches that reached it are not stored twice, and nothing acknowledged is lost
  (every acknowledged record is read back at its acknowledged offset).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from odradek.errors import OperatorError
from odradek.testing import LocalCluster
from odradek.testing.processes import free_ports
from odradek.zk.server import port_is_free
from tests.fixtures.cluster import wait_until
from tests.integration._clients import CLIENT_TIMEOUT_S, consume, create_topic, unique_topic
from tests.integration._proxy import DroppingProxy
from tests.integration._replication import wait_for_zk_leader, zk_partition_state
from tests.integration.test_idempotent_producer import check_exactly_once, end_offset

SESSION_TIMEOUT_MS = 6000


def _four_free_ports() -> int:
    for _attempt in range(20):
        (base,) = free_ports(1, "127.0.0.1")
        if base + 3 < 65535 and all(port_is_free(base + i, "127.0.0.1") for i in (1, 2, 3)):
            return base
    pytest.skip("no four consecutive free ports")


@contextlib.contextmanager
def proxied_broker(directory: Path) -> Iterator[tuple[LocalCluster, DroppingProxy]]:
    """One broker advertising a `DroppingProxy` in front of it as its address. The ports are
    chosen here (ZooKeeper, broker, the broker's metrics, proxy: consecutive); another process on the machine may take
    one between the choice and the start, so a start that finds its port taken is tried again."""
    for attempt in range(3):
        base = _four_free_ports()
        proxy = DroppingProxy(base + 3)  # base + 2 is the broker's metrics port
        proxy.target = ("127.0.0.1", base + 1)  # broker 1 listens on base + 1
        try:
            cluster = LocalCluster.up(
                directory / f"attempt-{attempt}",
                1,
                base_port=base,
                overrides={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"},
                timeout=120,
            )
        except OperatorError as e:
            proxy.close()
            if "in use" in str(e) and attempt < 2:
                continue
            raise
        break
    try:
        yield cluster, proxy
    finally:
        try:
            cluster.down(timeout=30)
        finally:
            cluster.kill_all()
            proxy.close()


def _send(
    producer: Any, topic: str, values: list[bytes], acked: dict[bytes, tuple[int, int]]
) -> None:
    errors: list[Any] = []

    def report(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(error)
        else:
            acked[message.value()] = (message.partition(), message.offset())

    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=report)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0 and not errors, errors[:3]


def test_retry_after_a_dropped_response_is_not_stored_twice(tmp_path: Path) -> None:
    with proxied_broker(tmp_path / "cluster") as (cluster, proxy):
        bootstrap = f"127.0.0.1:{proxy.port}"
        topic = unique_topic("idem-proxy")
        create_topic(bootstrap, topic, 1, 1)
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 0,
                "reconnect.backoff.ms": 50,
                "retry.backoff.ms": 50,
            }
        )
        acked: dict[bytes, tuple[int, int]] = {}
        _send(producer, topic, [b"before-0", b"before-1"], acked)
        requests_before = proxy.produce_requests
        proxy.arm()
        _send(producer, topic, [b"dropped-response"], acked)
        assert proxy.dropped == 1, "the proxy never dropped a Produce answer"
        assert proxy.produce_requests >= requests_before + 2, "the client did not retry"
        _send(producer, topic, [b"after-0"], acked)
        records = consume("confluent", bootstrap, topic, 0, 0, 10, timeout=10)
        assert [r.value for r in records] == [
            b"before-0",
            b"before-1",
            b"dropped-response",
            b"after-0",
        ]
        assert acked[b"dropped-response"] == (0, 2)
        check_exactly_once(cluster, topic, acked, 1)


def test_retry_with_kafka_python_defaults(tmp_path: Path) -> None:
    from kafka import KafkaProducer

    with proxied_broker(tmp_path / "cluster") as (_cluster, proxy):
        bootstrap = f"127.0.0.1:{proxy.port}"
        topic = unique_topic("idem-proxy-kp")
        create_topic(bootstrap, topic, 1, 1)
        producer = KafkaProducer(bootstrap_servers=bootstrap, retry_backoff_ms=50)
        try:
            first = producer.send(topic, b"first", partition=0).get(CLIENT_TIMEOUT_S)
            proxy.arm()
            retried = producer.send(topic, b"dropped-response", partition=0).get(CLIENT_TIMEOUT_S)
            last = producer.send(topic, b"last", partition=0).get(CLIENT_TIMEOUT_S)
        finally:
            producer.close(5)
        assert proxy.dropped == 1
        assert (first.offset, retried.offset, last.offset) == (0, 1, 2)
        records = consume("confluent", bootstrap, topic, 0, 0, 10, timeout=10)
        assert [r.value for r in records] == [b"first", b"dropped-response", b"last"]


class IdempotentStream:
    """An idempotent confluent-kafka producer (acks=all) writing numbered values to partition 0
    from a thread until stopped; delivery reports are recorded under `lock`."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 120_000,
                "retry.backoff.ms": 100,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
            }
        )
        self.lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: list[Any] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idempotent-stream", daemon=True)

    def _report(self, error: Any, message: Any) -> None:
        with self.lock:
            if error is None:
                self.acked[message.value()] = (message.partition(), message.offset())
            else:
                self.failed.append((message.value(), error))

    def _run(self) -> None:
        while not self._stop.is_set():
            if len(self.producer) >= 500:
                self.producer.poll(0.05)
                continue
            self.producer.produce(
                self.topic, f"r-{self.sent:08d}".encode(), partition=0, on_delivery=self._report
            )
            self.sent += 1
            self.producer.poll(0)

    def start(self) -> None:
        self._thread.start()

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        return self.producer.flush(CLIENT_TIMEOUT_S)


def test_leader_sigkill_under_an_idempotent_producer(make_cluster: Any) -> None:
    cluster = make_cluster(
        brokers=3, min_insync_replicas=2, zookeeper_session_timeout_ms=SESSION_TIMEOUT_MS
    )
    topic = unique_topic("idem-kill")
    create_topic(cluster.bootstrap_servers, topic, 1, 3)
    stream = IdempotentStream(cluster.bootstrap_servers, topic)
    stream.start()
    try:
        wait_until(lambda: stream.acked_count() >= 3000, 60, "3,000 acknowledged records")
        leader = zk_partition_state(cluster, topic, 0).leader
        cluster.kill(leader)
        wait_for_zk_leader(
            cluster, topic, 0, lambda s: s.leader not in (-1, leader), 60, "a new leader"
        )
        after_kill = stream.acked_count()
        wait_until(
            lambda: stream.acked_count() >= after_kill + 3000, 90, "3,000 more acknowledgements"
        )
        cluster.start_broker(leader)
        wait_until(
            lambda: len(zk_partition_state(cluster, topic, 0).isr) == 3, 90, "the ISR to be whole"
        )
    finally:
        remaining = stream.stop()
    assert remaining == 0 and not stream.failed, stream.failed[:3]
    acked = dict(stream.acked)
    end = end_offset(cluster, topic, 0)
    records = consume("confluent", cluster.bootstrap_servers, topic, 0, 0, end)
    assert len(records) == end >= len(acked)
    check_exactly_once(cluster, topic, acked, 1)
    assert {r.value for r in records} == set(acked), "stored records that were never acknowledged"
