"""End-to-end latency (produce -> consume) at a fixed moderate rate on a local cluster.

A producer (confluent-kafka, acks as given) sends records at `--rate` per second, each carrying its
send time; a consumer assigned to every partition reads them and records now - send time. Consumers
only see records below the high watermark, so with RF=3 this includes replication to the ISR.
Prints one JSON object with p50/p99/p99.9/max in milliseconds:

    .venv/bin/python bench/latency.py --brokers 3 --replication-factor 3 --acks all --rate 2000 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from scratch import temporary_directory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

STAMP = struct.Struct(">d")


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--min-insync-replicas", type=int, default=2)
    parser.add_argument("--acks", default="all")
    parser.add_argument("--rate", type=int, default=2000, help="records per second")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()

    cluster = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from odradek.testing import LocalCluster

        cluster = LocalCluster.up(
            temporary_directory("odradek-bench-latency-"), brokers=args.brokers
        )
        bootstrap = cluster.bootstrap_servers
    try:
        topic = f"latency-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics(
            [
                NewTopic(
                    topic,
                    num_partitions=args.partitions,
                    replication_factor=args.replication_factor,
                    config={"min.insync.replicas": str(args.min_insync_replicas)},
                )
            ]
        )[topic].result(60)
        latencies: list[float] = []
        total = int(args.rate * args.seconds)
        done = threading.Event()

        def consume() -> None:
            consumer = Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": "latency",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": 100,
                    "fetch.min.bytes": 1,
                }
            )
            consumer.assign([TopicPartition(topic, p, 0) for p in range(args.partitions)])
            deadline = time.monotonic() + args.seconds + 60
            while len(latencies) < total and time.monotonic() < deadline:
                message = consumer.poll(0.5)  # one at a time: consume(n) waits for n records
                if message is not None and message.error() is None:
                    latencies.append(time.time() - STAMP.unpack_from(message.value())[0])
            consumer.close()
            done.set()

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        time.sleep(1.0)  # let the consumer assign and fetch before the first record (not a test)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": args.acks, "linger.ms": 0})
        padding = b"x" * max(0, args.size - STAMP.size)
        started = time.monotonic()
        for i in range(total):
            target = started + i / args.rate
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            producer.produce(topic, value=STAMP.pack(time.time()) + padding)
            producer.poll(0)
        producer.flush(60)
        done.wait(args.seconds + 90)
        values = sorted(v * 1000 for v in latencies)
        print(
            json.dumps(
                {
                    "bench": "latency",
                    "brokers": args.brokers if cluster else None,
                    "replication_factor": args.replication_factor,
                    "acks": args.acks,
                    "rate": args.rate,
                    "records": len(values),
                    "p50_ms": round(percentile(values, 0.50), 2),
                    "p99_ms": round(percentile(values, 0.99), 2),
                    "p999_ms": round(percentile(values, 0.999), 2),
                    "max_ms": round(values[-1], 2) if values else None,
                }
            ),
            flush=True,
        )
    finally:
        if cluster is not None:
            cluster.down()


if __name__ == "__main__":
    main()
