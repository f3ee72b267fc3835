"""Produce and consume throughput, measured with confluent-kafka (librdkafka) as the load generator.

Prints one JSON object per run. Targets any Kafka-compatible bootstrap address (`--bootstrap`), or
starts a local Odradek cluster itself (`--brokers N`, the default being 1).

    .venv/bin/python bench/throughput.py --brokers 1 --records 200000 --sizes 100,1024
    .venv/bin/python bench/throughput.py --bootstrap 127.0.0.1:9092 --topic bench

Measured: produce records/s and MB/s until every record is acknowledged (acks as given), then consume
records/s and MB/s reading the whole topic back by explicit partition assignment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from scratch import temporary_directory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

# librdkafka security settings added to every client (bench/security.py sets them per listener).
CLIENT_SETTINGS: dict[str, str] = {}


def create_topic(
    bootstrap: str, topic: str, partitions: int, replication: int, configs: dict[str, str]
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **CLIENT_SETTINGS})
    futures = admin.create_topics(
        [
            NewTopic(
                topic, num_partitions=partitions, replication_factor=replication, config=configs
            )
        ],
        operation_timeout=60,
    )
    for future in futures.values():
        future.result(timeout=90)


def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete a measured topic (a long bench would otherwise fill the disk)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **CLIENT_SETTINGS})
    for future in admin.delete_topics([topic], operation_timeout=60).values():
        future.result(timeout=90)


def produce(
    bootstrap: str, topic: str, records: int, size: int, acks: str, linger_ms: int
) -> dict[str, float]:
    producer = Producer(
        {
            **CLIENT_SETTINGS,
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "linger.ms": linger_ms,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
            "compression.type": "none",
        }
    )
    value = os.urandom(size)
    failures = 0

    def on_delivery(err, _msg):  # type: ignore[no-untyped-def]
        nonlocal failures
        if err is not None:
            failures += 1

    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10000 == 0:
            producer.poll(0)
    remaining = producer.flush(300)
    elapsed = time.perf_counter() - started
    return {
        "records_per_s": records / elapsed,
        "mb_per_s": records * size / elapsed / 1e6,
        "seconds": elapsed,
        "failed": failures + remaining,
    }


def consume(
    bootstrap: str, topic: str, partitions: int, records: int, size: int
) -> dict[str, float]:
    consumer = Consumer(
        {
            **CLIENT_SETTINGS,
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
            "queued.max.messages.kbytes": 1_000_000,
            # librdkafka postpones a partition's next fetch by this much whenever its queue holds
            # more than queued.min.messages (100,000): at the default of 1 s, one consume in
            # two stalled for a second (as in bench/native/loadgen.c)
            "fetch.queue.backoff.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    received = 0
    started = time.perf_counter()
    deadline = started + 300
    while received < records and time.perf_counter() < deadline:
        for message in consumer.consume(10000, 1.0):
            if message.error() is None:
                received += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return {
        "records_per_s": received / elapsed,
        "mb_per_s": received * size / elapsed / 1e6,
        "seconds": elapsed,
        "received": received,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bootstrap", help="existing cluster; default: start a local Odradek cluster"
    )
    parser.add_argument("--brokers", type=int, default=1, help="brokers of the local cluster")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument(
        "--sizes", default="100,1024", help="record sizes in bytes, comma separated"
    )
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--min-insync-replicas", type=int, default=1)
    parser.add_argument("--acks", default="1")
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--topic", default=None)
    args = parser.parse_args()

    cluster = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from odradek.testing import LocalCluster

        directory = temporary_directory("odradek-bench-")
        cluster = LocalCluster.up(directory, brokers=args.brokers)
        bootstrap = cluster.bootstrap_servers
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            topic = args.topic or f"bench-{size}-{uuid.uuid4().hex[:8]}"
            if args.topic is None:
                create_topic(
                    bootstrap,
                    topic,
                    args.partitions,
                    args.replication_factor,
                    {"min.insync.replicas": str(args.min_insync_replicas)},
                )
            produced = produce(bootstrap, topic, args.records, size, args.acks, args.linger_ms)
            consumed = consume(bootstrap, topic, args.partitions, args.records, size)
            print(
                json.dumps(
                    {
                        "bench": "throughput",
                        "target": "odradek" if cluster else bootstrap,
                        "brokers": args.brokers if cluster else None,
                        "record_bytes": size,
                        "records": args.records,
                        "partitions": args.partitions,
                        "replication_factor": args.replication_factor,
                        "acks": args.acks,
                        "produce": {k: round(v, 2) for k, v in produced.items()},
                        "consume": {k: round(v, 2) for k, v in consumed.items()},
                    }
                ),
                flush=True,
            )
    finally:
        if cluster is not None:
            cluster.down()


if __name__ == "__main__":
    main()
