"""Kafka 3.9.1's own Java client against Odradek's transactions (jars from `./dev kafka`):
a transactional KafkaProducer commits one transaction and aborts another, a read_committed
KafkaConsumer sees only the committed records, and the Java Admin client's describeProducers,
describeTransactions and listTransactions read the producer and the transactional id
(`TransactionalJavaClient.java`, run as a single-file Java program)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from odradek.testing import LocalCluster
from tests.integration._clients import create_topic, unique_topic
from tests.integration._kafka import kafka_libs, require_kafka
from tests.integration._transactions import read_all, unique_id

JAVA_CLIENT = Path(__file__).with_name("TransactionalJavaClient.java")


def test_java_client_transactions_and_admin(cluster3: LocalCluster) -> None:
    require_kafka()
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("txn-java")
    create_topic(bootstrap, topic, partitions=1)
    transactional_id = unique_id("java")
    result = subprocess.run(
        ["java", "-cp", f"{kafka_libs()}/*", str(JAVA_CLIENT), bootstrap, topic, transactional_id],
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    answer = json.loads(lines[-1])
    assert answer["values"] == [f"java-commit-{i}" for i in range(5)]
    assert answer["producers"] == 1 and answer["open_txn"] is False
    assert answer["state"] == "CompleteAbort"  # TransactionState.toString()
    assert answer["listed"] is True
    assert len(read_all(bootstrap, topic, 1, "read_uncommitted", expected=8)) == 8
