"""Client quotas, one run: what they cost the produce path, and how closely they hold a client.

One broker (a local cluster), a topic of `--partitions` partitions, confluent-kafka writing
`--records` 100-byte records per round (acks=1, linger 5 ms).

1. Cost. `--rounds` rounds with no quota configured anywhere (the broker's quick "no quotas"
   check); then, once a `producer_byte_rate` far above what any producer reaches is set for
   client id `quoted` (every request of it is recorded against its rate, none is throttled),
   rounds alternating between client id `quoted` and client id `unquoted` (quotas on, none
   applies to it), so that both see the same machine load. A broker stays in "quotas on" once
   one was configured, as Kafka's does, so the first phase cannot alternate with the others.
   Reported: records/s and the broker's CPU seconds per million records, medians. Requests
   carry 16 KB batches (Java's default), so the per-request work shows.
   Also, in process and without the noise of a shared machine: the microseconds one Produce
   request spends in the quota code (`produce_throttle_ms`) with no quota configured, with quotas
   on but none for this client, and with its rate recorded.
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
    bootstrap: str,
    topic: str,
    records: int,
    client_id: str,
    batch_size: int = 1_000_000,
    value_size: int = 100,
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
    value = b"v" * value_size
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


def per_request_us(calls: int = 200_000) -> dict[str, float]:
    """Microseconds per Produce request in `produce_throttle_ms`, by quota state."""
    from types import SimpleNamespace

    from odradek.network.request_context import RequestContext
    from odradek.server.quota.entities import QuotaEntity
    from odradek.server.quota.manager import ClientQuotas
    from odradek.server.quota.throttling import produce_throttle_ms

    def context(client_id: str) -> RequestContext:
        header = SimpleNamespace(api_key=0, api_version=9, correlation_id=1, client_id=client_id)
        return RequestContext(header, "h:1", "h", "User:u", size=16384)  # type: ignore[arg-type]

    quotas = ClientQuotas()
    timings = {}
    for state in ("no_quotas", "quotas_on_none_for_client", "rate_recorded"):
        if state == "quotas_on_none_for_client":
            quotas.update_entity(QuotaEntity(client_id="other"), {"producer_byte_rate": "1"})
        if state == "rate_recorded":
            quotas.update_entity(QuotaEntity(client_id="c"), {"producer_byte_rate": "1e15"})
        request = context("c")
        started = time.perf_counter()
        for _ in range(calls):
            produce_throttle_ms(quotas, request, 1, 1000)
        timings[state] = round((time.perf_counter() - started) / calls * 1e6, 3)
    return timings


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
            produce(bootstrap, "held", 3_000, "bench", batch_size=4096, value_size=1000)
            results: dict[str, list[tuple[float, float]]] = {
                "none": [], "unquoted": [], "quoted": []
            }  # fmt: skip
            schedule = [("none", "bench")] * args.rounds
            schedule += [("unquoted", "unquoted"), ("quoted", "quoted")] * args.rounds
            for round_, (mode, client_id) in enumerate(schedule):
                if round_ == args.rounds:
                    set_quota(bootstrap, "producer_byte_rate", 10**12, "quoted")
                cpu = cpu_seconds(broker.pid)
                rate = produce(bootstrap, "cost", args.records, client_id, batch_size=16384)
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

    def median(mode: str, index: int) -> float:
        return statistics.median(r[index] for r in results[mode])

    print(
        json.dumps(
            {
                "records_per_s": {mode: round(median(mode, 0)) for mode in results},
                "broker_cpu_s_per_million_records": {
                    mode: round(median(mode, 1), 3) for mode in results
                },
                "quoted_over_unquoted_throughput": round(
                    median("quoted", 0) / median("unquoted", 0), 4
                ),
                "quoted_over_unquoted_broker_cpu": round(
                    median("quoted", 1) / median("unquoted", 1), 4
                ),
                "per_produce_request_us": per_request_us(),
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
