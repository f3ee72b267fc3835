"""Structured Streaming micro-batch latency through the `odradek` source at a fixed input rate.

Prints one JSON object. Starts a local Odradek cluster (`--brokers`, default 1) unless given
`--bootstrap`. A producer thread writes `--rate` records/s (acks=all), each stamped with its
create time; a streaming query (`startingOffsets=latest`, trigger every `--trigger-ms`, 0 = as
fast as Spark can) hands every micro-batch to `foreachBatch`, which collects the records'
timestamps on the driver. Measured, after `--warmup` seconds and for `--duration` seconds:

* end-to-end latency per record: from the producer's timestamp to the moment its micro-batch
  had been read into Spark and collected (percentiles over all records);
* micro-batch duration: Spark's `triggerExecution` time per batch (percentiles), and the median
  of each of its phases (`durationMs`: latestOffset, queryPlanning, addBatch, walCommit, ...),
  to show where a batch's time goes.

    .venv/bin/python bench/spark_streaming_latency.py --rate 1000 --duration 30
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from spark_read import create_topic, target


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {
        "p50": at(0.50),
        "p95": at(0.95),
        "p99": at(0.99),
        "max": round(ordered[-1], 1),
        "mean": round(statistics.fmean(ordered), 1),
    }


class RateProducer(threading.Thread):
    """Produces `rate` records/s until stopped, each record's timestamp its creation time."""

    def __init__(self, bootstrap: str, topic: str, rate: float, record_bytes: int) -> None:
        super().__init__(daemon=True, name="rate-producer")
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "linger.ms": 1,
            }
        )
        self.topic = topic
        self.rate = rate
        self.value = b"x" * record_bytes
        self.sent = 0
        self.halt = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.halt.is_set():
            due = int((time.monotonic() - started) * self.rate) - self.sent
            for _ in range(max(0, due)):
                self.producer.produce(self.topic, value=self.value)
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.001)
        self.producer.flush(30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="existing cluster; default: a local Odradek cluster")
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--rate", type=float, default=1000, help="records per second")
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--trigger-ms", type=int, default=0)
    parser.add_argument("--warmup", type=float, default=15, help="seconds not measured")
    parser.add_argument("--duration", type=float, default=30, help="seconds measured")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from odradek.spark.session import local_session

    work = Path(tempfile.mkdtemp(prefix="odradek-spark-latency-"))
    latencies: list[float] = []
    measuring = threading.Event()

    def on_batch(df: Any, _batch_id: int) -> None:
        stamps = df.select((F.col("timestamp").cast("double") * 1000).alias("ms")).collect()
        now_ms = time.time() * 1000
        if measuring.is_set():
            latencies.extend(now_ms - row["ms"] for row in stamps)

    with target(args.bootstrap, args.brokers) as (bootstrap, local):
        topic = f"bench-latency-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions, args.replication_factor)
        spark = local_session("odradek-bench-latency", master=args.master)
        producer = RateProducer(bootstrap, topic, args.rate, args.record_bytes)
        try:
            query = (
                spark.readStream.format("odradek")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic)
                .load()
                .writeStream.foreachBatch(on_batch)
                .option("checkpointLocation", str(work / "checkpoint"))
                .trigger(processingTime=f"{args.trigger_ms} milliseconds")
                .start()
            )
            producer.start()
            time.sleep(args.warmup)  # a benchmark's fixed schedule, not a test's wait
            first_batch = len(query.recentProgress)
            sent_before = producer.sent
            measuring.set()
            time.sleep(args.duration)
            measuring.clear()
            sent = producer.sent - sent_before
            progress = query.recentProgress[first_batch:]
            query.stop()
        finally:
            producer.halt.set()
            producer.join(30)
            spark.stop()
            shutil.rmtree(work, ignore_errors=True)
    durations = [float(p["durationMs"]["triggerExecution"]) for p in progress]
    phases = sorted({name for p in progress for name in p["durationMs"]})
    phase_medians = {
        name: statistics.median(float(p["durationMs"].get(name, 0)) for p in progress)
        for name in phases
    }
    print(
        json.dumps(
            {
                "bench": "spark_streaming_latency",
                "target": "local odradek" if local else bootstrap,
                "master": args.master,
                "rate": args.rate,
                "produced_per_s": round(sent / args.duration, 1),
                "trigger_ms": args.trigger_ms,
                "record_bytes": args.record_bytes,
                "partitions": args.partitions,
                "seconds": args.duration,
                "records_measured": len(latencies),
                "batches": len(progress),
                "latency_ms": percentiles(latencies),
                "batch_duration_ms": percentiles(durations),
                "batch_phase_median_ms": phase_medians,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
