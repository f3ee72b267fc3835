"""Transactions end to end with real clients on the shared `cluster3` (RF 3 everywhere,
`__transaction_state` created on first use):

* confluent-kafka: init, begin, send, send_offsets_to_transaction, commit and abort; read_committed
  consumers see exactly the committed records, read_uncommitted ones every record; the group's
  offsets move only with a committed transaction;
* a fenced zombie (same transactional.id, older epoch) can neither write nor commit;
* a hanging transaction (its producer SIGKILLed) holds the last stable offset back until the
  coordinator aborts it on its timeout, and no longer;
* aiokafka's transactional producer and KafkaJS's, read back by a read_committed reader.

Leader and coordinator kills are in `test_transactions_failover`; Kafka's Java client and
kafka-transactions.sh in `test_transactions_kafka`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._clients import create_topic, unique_topic
from tests.integration._groups import committed
from tests.integration._transactions import (
    CLIENT_TIMEOUT_S,
    end_offsets,
    read_all,
    txn_producer,
    unique_id,
)

NODE_TRANSACTIONS = Path(__file__).resolve().parents[1] / "js" / "transactions.js"


def test_confluent_commit_abort_and_read_committed(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("txn")
    create_topic(bootstrap, topic, partitions=3)
    producer = txn_producer(bootstrap, unique_id("txn"))
    committed_values = []
    for round_, commit in enumerate([True, False, True, False, True]):
        producer.begin_transaction()
        for i in range(20):
            value = f"r{round_}-{i}"
            producer.produce(topic, value=value.encode(), partition=i % 3)
            if commit:
                committed_values.append(value)
        producer.flush(CLIENT_TIMEOUT_S)  # the aborted records reach the log too
        if commit:
            producer.commit_transaction(CLIENT_TIMEOUT_S)
        else:
            producer.abort_transaction(CLIENT_TIMEOUT_S)
    everything = read_all(bootstrap, topic, 3, "read_uncommitted", expected=100)
    assert len(everything) == 100
    visible = read_all(bootstrap, topic, 3, "read_committed")
    assert sorted(visible) == sorted(committed_values)
    # No transaction is open: the last stable offset is the high watermark everywhere.
    assert end_offsets(bootstrap, topic, 3, True) == end_offsets(bootstrap, topic, 3, False)


def test_confluent_send_offsets_to_transaction(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    source, sink = unique_topic("txn-in"), unique_topic("txn-out")
    create_topic(bootstrap, source, partitions=1)
    create_topic(bootstrap, sink, partitions=1)
    group = unique_id("txn-group")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    producer = txn_producer(bootstrap, unique_id("txn"))
    try:
        consumer.subscribe([source])
        wait_until(
            lambda: consumer.poll(0.2) is None and bool(consumer.assignment()),
            CLIENT_TIMEOUT_S,
            "the consumer never got its partition",
        )
        for offset, commit in [(5, True), (9, False), (12, True)]:
            producer.begin_transaction()
            producer.produce(sink, value=f"upto-{offset}".encode(), partition=0)
            producer.send_offsets_to_transaction(
                [TopicPartition(source, 0, offset)],
                consumer.consumer_group_metadata(),
                CLIENT_TIMEOUT_S,
            )
            producer.flush(CLIENT_TIMEOUT_S)
            if commit:
                producer.commit_transaction(CLIENT_TIMEOUT_S)
            else:
                producer.abort_transaction(CLIENT_TIMEOUT_S)
            expected = {True: offset, False: 5}[commit]
            # The transaction's offsets become the group's when its marker reaches the offsets
            # partition, which the coordinator writes after answering EndTxn (as Kafka does).
            wait_until(
                lambda expected=expected: committed(bootstrap, group, source, 1) == {0: expected},
                CLIENT_TIMEOUT_S,
                f"the committed offset to become {expected}",
            )
            assert committed(bootstrap, group, source, 1) == {0: expected}
        assert sorted(read_all(bootstrap, sink, 1, "read_committed")) == ["upto-12", "upto-5"]
    finally:
        consumer.close()


def test_fenced_zombie_can_neither_write_nor_commit(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("txn-zombie")
    create_topic(bootstrap, topic, partitions=1)
    transactional_id = unique_id("zombie")
    zombie = txn_producer(bootstrap, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie-1", partition=0)
    zombie.flush(CLIENT_TIMEOUT_S)
    # A new instance with the same id: its InitProducerId aborts the zombie's transaction and
    # bumps the epoch.
    successor = txn_producer(bootstrap, transactional_id)
    with pytest.raises(KafkaException) as raised:
        zombie.produce(topic, value=b"zombie-2", partition=0)
        zombie.commit_transaction(CLIENT_TIMEOUT_S)
    assert raised.value.args[0].fatal() or "fenced" in str(raised.value).lower()
    successor.begin_transaction()
    successor.produce(topic, value=b"successor", partition=0)
    successor.commit_transaction(CLIENT_TIMEOUT_S)
    assert read_all(bootstrap, topic, 1, "read_committed") == ["successor"]


HANGING_PRODUCER = textwrap.dedent(
    """
    import sys
    import time
    from confluent_kafka import Producer

    bootstrap, topic, transactional_id = sys.argv[1:4]
    timeout_ms = int(sys.argv[4])
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": timeout_ms})
    producer.init_transactions(60)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=b"hanging-%d" % i, partition=0)
    producer.flush(60)
    print("ready", flush=True)
    time.sleep(600)
    """
)


def _leave_hanging(bootstrap: str, topic: str, transactional_id: str, timeout_ms: int) -> None:
    """A producer writes 5 records in a transaction to partition 0 and is SIGKILLed."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HANGING_PRODUCER,
            bootstrap,
            topic,
            transactional_id,
            str(timeout_ms),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def test_hanging_transaction_holds_the_lso_until_it_times_out(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("txn-hanging")
    create_topic(bootstrap, topic, partitions=1)
    _leave_hanging(bootstrap, topic, unique_id("hanging"), 3000)
    started = time.monotonic()
    other = txn_producer(bootstrap, unique_id("txn"))
    other.begin_transaction()
    other.produce(topic, value=b"after", partition=0)
    other.commit_transaction(CLIENT_TIMEOUT_S)
    # The hanging transaction starts at offset 0: the LSO stays there, the HW has moved on.
    assert end_offsets(bootstrap, topic, 1, True) == {0: 0}
    assert end_offsets(bootstrap, topic, 1, False)[0] >= 6
    assert read_all(bootstrap, topic, 1, "read_committed", quiet_s=1.0) == []
    # transaction.timeout.ms 3 s, checked every 10 s: the coordinator aborts it (and fences the
    # dead producer), the marker lands, the LSO catches up with the HW.
    wait_until(
        lambda: end_offsets(bootstrap, topic, 1, True) == end_offsets(bootstrap, topic, 1, False),
        45,
        "the hanging transaction was never aborted",
    )
    assert time.monotonic() - started >= 2.0
    assert read_all(bootstrap, topic, 1, "read_committed") == ["after"]


def test_aiokafka_transactional_producer(cluster3: LocalCluster) -> None:
    from aiokafka import AIOKafkaProducer

    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("txn-aiokafka")
    create_topic(bootstrap, topic, partitions=2)

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=unique_id("aiokafka")
        )
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(10):
                    await producer.send_and_wait(topic, f"commit-{i}".encode(), partition=i % 2)
            await producer.begin_transaction()
            for i in range(5):
                await producer.send_and_wait(topic, f"abort-{i}".encode(), partition=i % 2)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())
    assert len(read_all(bootstrap, topic, 2, "read_uncommitted", expected=15)) == 15
    visible = read_all(bootstrap, topic, 2, "read_committed")
    assert sorted(visible) == sorted(f"commit-{i}" for i in range(10))


def test_kafkajs_transactional_producer(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("txn-kafkajs")
    create_topic(bootstrap, topic, partitions=1)
    job = {
        "brokers": bootstrap.split(","),
        "topic": topic,
        "transactionalId": unique_id("kafkajs"),
        "timeoutMs": 60000,
    }
    result = subprocess.run(
        ["node", str(NODE_TRANSACTIONS)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=NODE_TRANSACTIONS.parent,
    )
    answer = json.loads(result.stdout or "{}")
    assert answer.get("ok"), (answer, result.stderr[-2000:])
    assert len(read_all(bootstrap, topic, 1, "read_uncommitted", expected=8)) == 8
    visible = read_all(bootstrap, topic, 1, "read_committed")
    assert sorted(visible) == sorted(f"commit-{i}" for i in range(5))


def _cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "odradek.cli.main",
            "transactions",
            "--bootstrap-server",
            bootstrap,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_lists_describes_and_aborts_a_hanging_transaction(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("txn-cli")
    create_topic(bootstrap, topic, partitions=1)
    transactional_id = unique_id("cli-hanging")
    # A 10-minute timeout: only the operator can unblock this partition within the test.
    _leave_hanging(bootstrap, topic, transactional_id, 600_000)
    listed = _cli(bootstrap, "list")
    assert listed.returncode == 0, listed.stderr
    assert any(
        line.split()[0] == transactional_id and line.split()[-1] == "Ongoing"
        for line in listed.stdout.splitlines()[1:]
    ), listed.stdout
    described = _cli(bootstrap, "describe", "--transactional-id", transactional_id)
    assert described.returncode == 0, described.stderr
    header, row = described.stdout.splitlines()
    fields = dict(zip(header.split(), row.split(), strict=True))
    assert fields["TransactionState"] == "Ongoing"
    assert fields["TopicPartitions"] == f"{topic}-0"
    producers = _cli(bootstrap, "describe-producers", "--topic", topic, "--partition", "0")
    assert producers.returncode == 0, producers.stderr
    (producer_row,) = producers.stdout.splitlines()[1:]
    assert producer_row.split()[0] == fields["ProducerId"]
    assert producer_row.split()[-1] == "0"  # CurrentTransactionStartOffset
    assert end_offsets(bootstrap, topic, 1, True) == {0: 0}
    missing = _cli(bootstrap, "abort", "--topic", topic, "--partition", "0", "--start-offset", "3")
    assert missing.returncode == 1 and "no open transaction" in missing.stderr
    aborted = _cli(bootstrap, "abort", "--topic", topic, "--partition", "0", "--start-offset", "0")
    assert aborted.returncode == 0, aborted.stderr
    wait_until(
        lambda: end_offsets(bootstrap, topic, 1, True) == end_offsets(bootstrap, topic, 1, False),
        30,
        "the LSO did not move after the abort",
    )
    assert read_all(bootstrap, topic, 1, "read_committed", quiet_s=1.0) == []
    assert len(read_all(bootstrap, topic, 1, "read_uncommitted", expected=5)) == 5
