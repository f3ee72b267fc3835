"""Exactly once through broker failures, on a private 3-broker cluster (RF 3, min ISR 2).

A consume-transform-produce loop (confluent-kafka: a read_committed consumer in a group, a
transactional producer that writes each input record's transformation and commits the consumer's
offsets in the same transaction) runs while the test SIGKILLs, one after the other, the leader of
an output partition and the transaction coordinator of the loop's transactional id, each
restarted a few seconds later. The loop handles errors as Kafka's documentation says: abortable
errors abort the transaction and rewind the consumer to its committed offsets; a fenced or fatal
producer is replaced by a new one (whose InitProducerId fences the old epoch). At the end a
read_committed reader finds every input exactly once in the output.

The loop's transactional id is chosen so that its transaction coordinator is also the group's
coordinator: the kill then also tests that transactional offset commits survive a group
coordinator failover (they are in `__consumer_offsets` as transactional batches, replayed with
their markers by the next leader).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from odradek.coordinator.group.placement import OFFSETS_TOPIC, partition_for
from odradek.coordinator.transaction.log_records import TRANSACTION_STATE_TOPIC
from odradek.testing import LocalCluster
from tests.fixtures.cluster import (
    START_TIMEOUT_S,
    WaitTimeout,
    _bring_down,
    _used_clusters,
    wait_until,
)
from tests.fixtures.threads import innermost_calls, thread_stack
from tests.integration._clients import create_topic, unique_topic
from tests.integration._groups import committed
from tests.integration._transactions import (
    CLIENT_TIMEOUT_S,
    ClientCallHung,
    bounded_call,
    read_all,
    txn_producer,
    unique_id,
)

INPUTS = 3000
PARTITIONS = 3
RESTART_AFTER_S = 4.0


@pytest.fixture(scope="module")
def txn_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster.up(tmp_path_factory.mktemp("txn-failover"), 3, timeout=START_TIMEOUT_S)
    try:
        yield cluster
    finally:
        _bring_down(cluster)


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    """The partition's leader, once it has one (internal topics are created on first use)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    found: list[int] = []

    def led() -> bool:
        metadata = admin.list_topics(topic, timeout=30).topics[topic]
        state = metadata.partitions.get(partition)
        if state is None or state.leader < 0:
            return False
        found.append(int(state.leader))
        return True

    wait_until(led, 60, f"{topic}-{partition} has no leader")
    return found[-1]


def _produce_inputs(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(INPUTS):
        producer.produce(topic, value=f"in-{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0


class Loop(threading.Thread):
    """The consume-transform-produce loop (module docstring)."""

    def __init__(self, bootstrap: str, source: str, sink: str, group: str, txn_id: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.source, self.sink = bootstrap, source, sink
        self.group, self.txn_id = group, txn_id
        self.committed_inputs = 0
        self.aborts = self.new_producers = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.events: deque[str] = deque(maxlen=10)
        self.last_consumed = self.started

    def note(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.started:.0f}s {what}")

    def describe(self) -> str:
        """One line on where the loop is: its counts, its last events, the call it is in."""
        return (
            f"{self.committed_inputs}/{INPUTS} inputs committed, {self.aborts} aborts, "
            f"{self.new_producers} new producers, last input consumed "
            f"{time.monotonic() - self.last_consumed:.0f}s ago; last events {list(self.events)}; "
            f"now in {innermost_calls(self, 5)}"
        )

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by the test
            self.error = e

    def _consumer(self) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([self.source])
        return consumer

    def _rewind(self, consumer: Consumer) -> None:
        partitions = consumer.assignment()
        if not partitions:
            return
        for tp in consumer.committed(partitions, timeout=CLIENT_TIMEOUT_S):
            consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))

    def _run(self) -> None:
        consumer = self._consumer()
        producer = txn_producer(self.bootstrap, self.txn_id, **{"transaction.timeout.ms": 20000})
        deadline = time.monotonic() + 240
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                messages = consumer.consume(200, timeout=0.5)
                messages = [m for m in messages if not m.error()]
                if not messages:
                    continue
                self.last_consumed = time.monotonic()
                try:
                    producer.begin_transaction()
                    for message in messages:
                        producer.produce(
                            self.sink,
                            value=message.value() + b"-out",
                            partition=message.partition(),
                        )
                    positions = consumer.position(consumer.assignment())
                    group = consumer.consumer_group_metadata()
                    send = producer.send_offsets_to_transaction
                    bounded_call(
                        functools.partial(send, positions, group, CLIENT_TIMEOUT_S),
                        CLIENT_TIMEOUT_S,
                        "send_offsets_to_transaction",
                    )
                    bounded_call(
                        functools.partial(producer.commit_transaction, CLIENT_TIMEOUT_S),
                        CLIENT_TIMEOUT_S,
                        "commit_transaction",
                    )
                    self.committed_inputs += len(messages)
                    self.note(f"committed, {self.committed_inputs} in all")
                except ClientCallHung as e:
                    # librdkafka #5456/#5511 (see _transactions): abandon the producer; the next
                    # one's InitProducerId fences it and aborts its transaction.
                    self.note(f"abandoned the producer: {e}")
                    producer = self._replace(producer)
                    self._rewind(consumer)
                except KafkaException as e:
                    error = e.args[0]
                    self.note(f"transaction failed: {error.name()}")
                    if error.txn_requires_abort():
                        self.aborts += 1
                        producer = self._abort(producer)
                    elif error.retriable() and not error.fatal():
                        # The commit's outcome is unknown: abort if we still can, else the
                        # coordinator settles it; either way re-read from the committed offsets.
                        producer = self._abort(producer)
                    else:
                        producer = self._replace(producer)
                    self._rewind(consumer)
        finally:
            consumer.close()

    def _abort(self, producer: Producer) -> Producer:
        """Abort the transaction; a producer that cannot is replaced."""
        try:
            bounded_call(
                lambda: producer.abort_transaction(CLIENT_TIMEOUT_S),
                CLIENT_TIMEOUT_S,
                "abort_transaction",
            )
            return producer
        except (KafkaException, ClientCallHung) as e:
            self.note(f"abort failed: {e}")
            return self._replace(producer)

    def _replace(self, producer: Producer) -> Producer:
        self.new_producers += 1
        self.note("replacing the producer")
        deadline = time.monotonic() + 120
        while True:
            try:
                return bounded_call(
                    lambda: txn_producer(
                        self.bootstrap, self.txn_id, **{"transaction.timeout.ms": 20000}
                    ),
                    CLIENT_TIMEOUT_S,
                    "init_transactions",
                )
            except (KafkaException, ClientCallHung) as e:
                self.note(f"init_transactions: {e}")
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def _wait_for(loop: Loop, inputs: int, timeout: float, what: str) -> None:
    """Wait until `inputs` are committed (or the loop failed); a timeout says where the loop is,
    on its first line since that is what a CI summary shows."""
    try:
        wait_until(lambda: loop.committed_inputs >= inputs or loop.error, timeout, what)
    except WaitTimeout as e:
        raise WaitTimeout(f"{e}: {loop.describe()}\n{thread_stack(loop)}") from None


def _kill_and_restart(cluster: LocalCluster, broker_id: int) -> None:
    assert cluster.kill(broker_id)
    time.sleep(RESTART_AFTER_S)  # the outage itself, not a wait for a condition
    cluster.start_broker(broker_id, timeout=START_TIMEOUT_S)


def test_exactly_once_through_leader_and_coordinator_kills(txn_cluster: LocalCluster) -> None:
    bootstrap = txn_cluster.bootstrap_servers
    source, sink = unique_topic("eos-in"), unique_topic("eos-out")
    create_topic(
        bootstrap,
        source,
        partitions=PARTITIONS,
        replication_factor=3,
        configs={"min.insync.replicas": "2"},
    )
    create_topic(
        bootstrap,
        sink,
        partitions=PARTITIONS,
        replication_factor=3,
        configs={"min.insync.replicas": "2"},
    )
    _produce_inputs(bootstrap, source)
    group = unique_id("eos")
    # Bring both internal topics into existence (FindCoordinator creates them) and wait for
    # their leaders, so the coordinators can be located.
    warm = txn_producer(bootstrap, unique_id("warm"))
    warm.begin_transaction()
    warm.abort_transaction(CLIENT_TIMEOUT_S)
    committed(bootstrap, group, source, PARTITIONS)
    group_coordinator = _leader(bootstrap, OFFSETS_TOPIC, partition_for(group, 50))
    txn_id = next(
        candidate
        for candidate in (unique_id("eos-txn") for _ in range(200))
        if _leader(bootstrap, TRANSACTION_STATE_TOPIC, partition_for(candidate, 50))
        == group_coordinator
    )
    txn_coordinator = _leader(bootstrap, TRANSACTION_STATE_TOPIC, partition_for(txn_id, 50))
    loop = Loop(bootstrap, source, sink, group, txn_id)
    loop.start()
    try:
        _wait_for(loop, INPUTS // 4, 120, "no progress")
        leader = _leader(bootstrap, sink, 0)
        _kill_and_restart(txn_cluster, leader)
        loop.note(f"killed and restarted broker {leader}, the sink's leader")
        _wait_for(loop, INPUTS // 2, 180, "stuck after leader kill")
        _kill_and_restart(txn_cluster, txn_coordinator)
        loop.note(f"killed and restarted broker {txn_coordinator}, the coordinator")
        _wait_for(loop, INPUTS, 180, "the loop did not finish after the coordinator kill")
    finally:
        loop.stop.set()
        loop.join(timeout=120)
    print(f"the loop: {loop.describe()}")  # shown with -s or -rP: what the faults cost it
    assert loop.error is None, repr(loop.error)
    outputs = read_all(bootstrap, sink, PARTITIONS, "read_committed", quiet_s=5.0)
    expected = sorted(f"in-{i}-out" for i in range(INPUTS))
    duplicates = len(outputs) - len(set(outputs))
    assert duplicates == 0, f"{duplicates} duplicates"
    assert sorted(outputs) == expected


@pytest.fixture(autouse=True)
def _report_logs(txn_cluster: LocalCluster, request: pytest.FixtureRequest) -> None:
    _used_clusters(request.node).append(txn_cluster)
