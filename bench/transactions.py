"""Transactional produce throughput beside plain (idempotent, acks=all) produce, in one run.

Prints one JSON object. Starts a local Odradek cluster (`--brokers`, default 3, RF = min(3,
brokers), min.insync.replicas 2 when there are 3) or targets `--bootstrap`.

    .venv/bin/python bench/transactions.py --brokers 3 --seconds 20 --size 100

For `--seconds` each, with confluent-kafka (librdkafka) as fast as it goes:

* plain: an idempotent producer (acks=all), no transactions;
* transactional: one transactional producer committing a transaction every `--txn-ms` (100 ms)
  of producing, so each transaction holds what 100 ms of load produces on all partitions;

then a read_committed consumer reads the transactional topic back and checks it got every
committed record. Reported: records/s and MB/s of each, their ratio, transactions/s and the
commit latency (p50/p99 of commit_transaction).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from scratch import temporary_directory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def create_topic(
    bootstrap: str, topic: str, partitions: int, replication: int, min_isr: int
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, partitions, replication, config={"min.insync.replicas": str(min_isr)})],
        operation_timeout=60,
    )
    for future in futures.values():
        future.result(timeout=90)


def _producer(bootstrap: str, **extra: object) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
            **extra,
        }
    )


def plain(bootstrap: str, topic: str, seconds: float, payload: bytes) -> dict[str, float]:
    producer = _producer(bootstrap)
    sent = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(1000):
            try:
                producer.produce(topic, payload)
                sent += 1
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(120)
    elapsed = time.perf_counter() - started
    return {"records": sent, "seconds": round(elapsed, 2)}


def transactional(
    bootstrap: str, topic: str, seconds: float, payload: bytes, txn_ms: int
) -> dict[str, float]:
    producer = _producer(bootstrap, **{"transactional.id": f"bench-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(60)
    sent = transactions = 0
    commit_ms: list[float] = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        producer.begin_transaction()
        opened = time.perf_counter()
        while (time.perf_counter() - opened) * 1000 < txn_ms:
            for _ in range(500):
                try:
                    producer.produce(topic, payload)
                    sent += 1
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
        before = time.perf_counter()
        producer.commit_transaction(60)
        commit_ms.append((time.perf_counter() - before) * 1000)
        transactions += 1
    elapsed = time.perf_counter() - started
    commit_ms.sort()
    return {
        "records": sent,
        "seconds": round(elapsed, 2),
        "transactions": transactions,
        "commit_ms_p50": round(commit_ms[len(commit_ms) // 2], 1),
        "commit_ms_p99": round(commit_ms[min(len(commit_ms) - 1, int(len(commit_ms) * 0.99))], 1),
    }


def read_committed_count(bootstrap: str, topic: str, partitions: int, expected: int) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.max.bytes": 50_000_000,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    deadline = time.monotonic() + 300
    while got < expected and time.monotonic() < deadline:
        for message in consumer.consume(10_000, timeout=1.0):
            if not message.error():
                got += 1
    consumer.close()
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="existing cluster; default: a local Odradek cluster")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--size", type=int, default=100, help="record value bytes")
    parser.add_argument("--txn-ms", type=int, default=100, help="milliseconds per transaction")
    args = parser.parse_args()
    cluster = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from odradek.testing import LocalCluster

        cluster = LocalCluster.up(temporary_directory("bench-txn-"), brokers=args.brokers)
        bootstrap = cluster.bootstrap_servers
    replication = min(3, args.brokers)
    min_isr = 2 if replication == 3 else 1
    try:
        payload = b"x" * args.size
        topics = {kind: f"bench-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("plain", "txn")}
        for topic in topics.values():
            create_topic(bootstrap, topic, args.partitions, replication, min_isr)
        plain_result = plain(bootstrap, topics["plain"], args.seconds, payload)
        txn_result = transactional(bootstrap, topics["txn"], args.seconds, payload, args.txn_ms)
        read_back = read_committed_count(
            bootstrap, topics["txn"], args.partitions, txn_result["records"]
        )
        plain_rate = plain_result["records"] / plain_result["seconds"]
        txn_rate = txn_result["records"] / txn_result["seconds"]
        print(
            json.dumps(
                {
                    "bench": "transactions",
                    "brokers": args.brokers if cluster else None,
                    "partitions": args.partitions,
                    "replication_factor": replication,
                    "record_bytes": args.size,
                    "txn_ms": args.txn_ms,
                    "plain_records_per_s": round(plain_rate),
                    "plain_mb_per_s": round(plain_rate * args.size / 1e6, 1),
                    "txn_records_per_s": round(txn_rate),
                    "txn_mb_per_s": round(txn_rate * args.size / 1e6, 1),
                    "txn_over_plain": round(txn_rate / plain_rate, 2),
                    "transactions_per_s": round(
                        txn_result["transactions"] / txn_result["seconds"], 1
                    ),
                    "commit_ms_p50": txn_result["commit_ms_p50"],
                    "commit_ms_p99": txn_result["commit_ms_p99"],
                    "read_committed_records": read_back,
                    "read_committed_complete": read_back == txn_result["records"],
                }
            )
        )
    finally:
        if cluster is not None:
            cluster.down()


if __name__ == "__main__":
    main()
