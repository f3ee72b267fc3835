"""What validating every record costs the produce path, measured two ways in one run.

1. End to end: two one-broker clusters, one validating records as always and one started with
   ODRADEK_BENCH_SKIP_RECORD_VALIDATION=1 (header and CRC checks only). confluent-kafka producers
   (linger 5 ms, acks=1, 6 partitions) write the same records to each, alternating A, B, A, B, ...
   so that both see the same machine load; the ratio of the medians is the cost, both in
   producer throughput and in the broker's CPU seconds for the run (the finer measure: the
   producer's own loop can be the bottleneck).
2. In process: `validate_produce_records` on one 1 MB batch of 100-byte records per codec (the
   native walker, plus decompression where there is any), and the pure-Python reference walk on
   the same records for comparison.

Prints one JSON object per measurement, then a summary.

    .venv/bin/python bench/validation_cost.py --records 1000000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from scratch import temporary_directory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SKIP = "ODRADEK_BENCH_SKIP_RECORD_VALIDATION"
PARTITIONS = 6


def values(size: int, count: int = 1000) -> list[bytes]:
    """Distinct, moderately compressible values (a compressing producer must shrink them)."""
    words = [b"page", b"view", b"user", b"click", b"home", b"cart", b"item", b"search"]
    out = []
    for i in range(count):
        text = b'{"user":%d,"event":"' % (i * 7919 % 100_003)
        j = i
        while len(text) < size - 2:
            text += words[j % len(words)] + b"-"
            j = j * 31 + 7
        out.append((text[: size - 2] + b'"}')[:size])
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(60)


def produce(bootstrap: str, topic: str, records: int, size: int, codec: str) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
            "compression.type": codec,
        }
    )
    pool = values(size)
    failures = 0

    def on_delivery(err, _msg):  # type: ignore[no-untyped-def]
        nonlocal failures
        if err is not None:
            failures += 1

    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=pool[i % 1000], on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10000 == 0:
            producer.poll(0)
    remaining = producer.flush(300)
    elapsed = time.perf_counter() - started
    if failures or remaining:
        raise RuntimeError(f"{failures + remaining} records not acknowledged")
    return records / elapsed


def end_to_end(records: int, rounds: int, size: int, codecs: list[str]) -> dict[str, object]:
    from odradek.testing.local_cluster import LocalCluster

    directory = temporary_directory("odradek-validation-bench-")
    os.environ.pop(SKIP, None)
    validating = LocalCluster.up(directory / "validating", brokers=1)
    os.environ[SKIP] = "1"
    try:
        skipping = LocalCluster.up(directory / "skipping", brokers=1)
    finally:
        os.environ.pop(SKIP, None)
    summary: dict[str, object] = {}
    try:
        for codec in codecs:
            rates: dict[str, list[float]] = {"validating": [], "skipping": []}
            cpu: dict[str, list[float]] = {"validating": [], "skipping": []}
            for _ in range(rounds):
                for name, cluster in (("validating", validating), ("skipping", skipping)):
                    topic = f"cost-{codec}-{uuid.uuid4().hex[:8]}"
                    create_topic(cluster.bootstrap_servers, topic)
                    pid = cluster.brokers[0].pid
                    before = cpu_seconds(pid)
                    rate = produce(cluster.bootstrap_servers, topic, records, size, codec)
                    cpu[name].append(cpu_seconds(pid) - before)
                    rates[name].append(rate)
                    print(
                        json.dumps(
                            {
                                "bench": "validation_cost",
                                "codec": codec,
                                "broker": name,
                                "record_bytes": size,
                                "records": records,
                                "records_per_s": round(rate),
                                "broker_cpu_s": round(cpu[name][-1], 2),
                            }
                        ),
                        flush=True,
                    )
            on, off = statistics.median(rates["validating"]), statistics.median(rates["skipping"])
            cpu_on, cpu_off = (
                statistics.median(cpu["validating"]),
                statistics.median(cpu["skipping"]),
            )
            summary[codec] = {
                "validating_records_per_s": round(on),
                "skipping_records_per_s": round(off),
                "throughput_cost_percent": round(100 * (1 - on / off), 1),
                "validating_broker_cpu_s": round(cpu_on, 2),
                "skipping_broker_cpu_s": round(cpu_off, 2),
                "broker_cpu_cost_percent": round(100 * (cpu_on / cpu_off - 1), 1),
            }
    finally:
        validating.down()
        skipping.down()
    return summary


def in_process(size: int) -> dict[str, object]:
    from tests.fuzz.record_batches import RawRecord, batch_of

    from odradek.log.config import LogConfig
    from odradek.log.validator import validate_produce_records
    from odradek.protocol.records import reference_scan

    pool = values(size)
    count = 1_000_000 // (size + 10)
    records = [RawRecord(key=None, value=pool[i % 1000], offset_delta=i) for i in range(count)]
    config = LogConfig(max_message_bytes=16 << 20)
    now = int(time.time() * 1000)
    out: dict[str, object] = {"records_per_batch": count}
    for codec_name, codec in (("none", 0), ("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4)):
        batch = batch_of(records, compression=codec)
        runs = []
        for _ in range(20):
            started = time.perf_counter()
            validate_produce_records(batch, config, now)
            runs.append(time.perf_counter() - started)
        out[codec_name] = {
            "batch_bytes": len(batch),
            "ms_per_batch": round(1000 * statistics.median(runs), 3),
            "ns_per_record": round(1e9 * statistics.median(runs) / count),
        }
    plain = batch_of(records)
    started = time.perf_counter()
    reference_scan(memoryview(plain)[61:], count, 0)
    out["python_reference_ms_per_batch"] = round(1000 * (time.perf_counter() - started), 1)
    out["large_and_hostile"] = large_and_hostile(now)
    return out


def large_and_hostile(now: int) -> dict[str, object]:
    """How long the event loop works on a bomb or a large batch (at most the inline budget),
    and how long a worker thread then takes over the rest."""
    from tests.fuzz.record_batches import bomb_cases

    from odradek.cluster.append_queue import INLINE_BUDGET
    from odradek.log.config import LogConfig
    from odradek.log.validator import NeedsWorkerThread, validate_produce_records

    config = LogConfig()
    out: dict[str, object] = {}
    for case in bomb_cases():
        timings = {}
        for where, budget in (("event_loop", INLINE_BUDGET), ("worker", None)):
            started = time.perf_counter()
            try:
                validate_produce_records(case.records, config, now, budget)
                verdict = "accepted"
            except NeedsWorkerThread:
                verdict = "handed to a worker"
            except Exception as e:  # the refusal is the point here
                verdict = type(e).__name__
            timings[where] = {
                "ms": round(1000 * (time.perf_counter() - started), 2),
                "verdict": verdict,
            }
            if verdict != "handed to a worker":
                break
        out[case.name] = timings
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--codecs", default="none,lz4")
    args = parser.parse_args()
    local = in_process(args.size)
    print(json.dumps({"bench": "validation_cost", "in_process": local}), flush=True)
    summary = end_to_end(args.records, args.rounds, args.size, args.codecs.split(","))
    print(json.dumps({"bench": "validation_cost", "summary": summary}), flush=True)


if __name__ == "__main__":
    main()
