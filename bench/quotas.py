"""Client quotas, one run: what they cost the produce path, and how closely they hold a client.

One broker (a local cluster), a topic of `--partitions` partitions, confluent-kafka writing
`--records` 100-byte records per round (acks=1, linger 5 ms).

1. Cost. `--rounds` rounds with no quota configured anywhere (the broker's quick "no quotas"
   check), then — once a `producer_byte_rate` far above what the producer reaches is set for its
   client id, so every request is recorded and none throttled — as many rounds with quotas on.
   (A broker stays in "quotas on" once one was configured, as Kafka's does, so the phases cannot
   alternate.) Reported: records/s and broker CPU seconds per million records, medians.
2. Accuracy. A producer with a `producer_byte_rate` of `--rate` bytes/s, producing as fast as it
   can for `--seconds`: the bytes the broker acknowledged per second, against the quota; and the
   same for a consumer with a `consumer_byte_rate` of `--rate` reading a full partition.

    .venv/bin/python bench/quotas.py --records 300000 --rounds 3 --rate 204800 --seconds 11
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from metrics_cost import cpu_seconds

from odradek.testing import LocalCluster

ROOT = Path(__file__).resolve().parent.parent


def produce(
    bootstrap: str, topic: str, records: int, client_id: str, batch_size: int = 1_000_000
) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "acks": "1",
            "linger.ms": 5,
            "batch.size": batch_size,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
        }
    )
    value = b"v" * 100
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("records not acknowledged")
    return records / (time.perf_counter() - started)


def set_quota(bootstrap: str, key: str, value: int, client_id: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "odradek.cli.main", "configs", "--bootstrap-server", bootstrap,
         "--alter", "--add-config", f"{key}={value}", "--entity-type", "clients",
         "--entity-name", client_id],
        check=True, capture_output=True, cwd=ROOT, timeout=60,
    )  # fmt: skip


def throttled_produce(bootstrap: str, topic: str, client_id: str, seconds: float) -> float:
    """Bytes/s acknowledged to a producer that always has 4 MB outstanding."""
    value = b"q" * 1000
    acked = [0]

    def delivered(error: object, message: object) -> None:
        if error is None:
            acked[0] += len(value)

    producer = Producer(
        {"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "1",
         "linger.ms": 5, "batch.size": 4096}
    )  # fmt: skip
    sent = 0
    started = time.monotonic()
    while (now := time.monotonic()) - started < seconds:
        if sent - acked[0] < 4 << 20:
            try:
                producer.produce(topic, value, on_delivery=delivered)
                sent += len(value)
                continue
            except BufferError:
                pass
        producer.poll(0.01)
    rate = acked[0] / (now - started)
    producer.purge()
    producer.flush(5)
    return rate


def throttled_consume(bootstrap: str, topic: str, client_id: str, seconds: float) -> float:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": client_id, "client.id": client_id,
         "enable.auto.commit": False, "max.partition.fetch.bytes": 8192,
         "fetch.max.bytes": 8192, "message.max.bytes": 8192}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    received = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            received += len(message.value() or b"")
    consumer.close()
    return received / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--rate", type=int, default=200 * 1024)
    parser.add_argument("--seconds", type=float, default=11.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="odradek-quotas-") as directory:
        cluster = LocalCluster.up(Path(directory), 1)
        try:
            broker = cluster.brokers[0]
            assert broker.pid is not None
            bootstrap = cluster.bootstrap_servers
            admin = AdminClient({"bootstrap.servers": bootstrap})
            topics = [NewTopic("cost", args.partitions, 1), NewTopic("held", 1, 1)]
            for future in admin.create_topics(topics).values():
                future.result(60)
            del admin
            produce(bootstrap, "cost", 20_000, "bench")  # warm-up
            # 3 MB in small batches for the held consumer (a fetch returns whole batches).
            produce(bootstrap, "held", 30_000, "bench", batch_size=4096)
            results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
            for mode in ("off", "on"):
                if mode == "on":
                    set_quota(bootstrap, "producer_byte_rate", 10**12, "bench")
                for round_ in range(args.rounds):
                    cpu = cpu_seconds(broker.pid)
                    rate = produce(bootstrap, "cost", args.records, "bench")
                    per_million = (cpu_seconds(broker.pid) - cpu) / args.records * 1e6
                    results[mode].append((rate, per_million))
                    print(json.dumps({"round": round_, "quotas": mode, "records_per_s": round(rate),
                                      "broker_cpu_s_per_million_records": round(per_million, 2)}),
                          flush=True)  # fmt: skip
            set_quota(bootstrap, "producer_byte_rate", args.rate, "held-producer")
            produced = throttled_produce(bootstrap, "held", "held-producer", args.seconds)
            set_quota(bootstrap, "consumer_byte_rate", args.rate, "held-consumer")
            consumed = throttled_consume(bootstrap, "held", "held-consumer", args.seconds)
        finally:
            cluster.down()
            cluster.kill_all()
    off_rate = statistics.median(r for r, _ in results["off"])
    on_rate = statistics.median(r for r, _ in results["on"])
    off_cpu = statistics.median(c for _, c in results["off"])
    on_cpu = statistics.median(c for _, c in results["on"])
    print(
        json.dumps(
            {
                "records_per_s_without_quotas": round(off_rate),
                "records_per_s_with_quotas": round(on_rate),
                "throughput_ratio_with_over_without": round(on_rate / off_rate, 4),
                "broker_cpu_ratio_with_over_without": round(on_cpu / off_cpu, 4),
                "quota_bytes_per_s": args.rate,
                "seconds": args.seconds,
                "producer_acked_over_quota": round(produced / args.rate, 3),
                "consumer_received_over_quota": round(consumed / args.rate, 3),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
