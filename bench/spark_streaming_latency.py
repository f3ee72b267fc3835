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

`--source both` runs a second query in the same session over `stream-ceiling` (defined here):
a Python streaming source that reads nothing from anywhere -- its offset N is the record "sent"
at start + N/rate, and it emits Arrow batches of the source's schema with those timestamps. Its
latency is what Spark's micro-batches cost by themselves (planning, tasks, Python workers,
offset and commit logs, `foreachBatch`) at the same trigger and rate: the floor of any Python
source. Its tasks freeze the worker's heap for the collector as odradek's do
(`odradek.spark.worker`), so the two differ only in what they read.

    .venv/bin/python bench/spark_streaming_latency.py --rate 1000 --duration 30
    .venv/bin/python bench/spark_streaming_latency.py --rate 1000 --trigger-ms 100 --source both

`--conf KEY=VALUE` (repeatable) sets a Spark property on the session, e.g. Spark's default
checkpoint file manager in place of the one `local_session` picks, for a side-by-side run:
`--conf spark.sql.streaming.checkpointFileManagerClass=org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager`.
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


def ceiling_stream_source() -> type:
    """`stream-ceiling`: options `rate` (records/s), `start` (epoch seconds of offset 0),
    `partitions`, `value_bytes`."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        InputPartition,
    )

    from odradek.spark.arrow import arrow_schema, source_schema
    from odradek.spark.worker import freeze_heap_once

    class Range(InputPartition):
        def __init__(self, first: int, end: int) -> None:
            self.first, self.end = first, end

    class CeilingStreamReader(DataSourceStreamReader):
        def __init__(self, options: dict[str, str]) -> None:
            self.rate = float(options["rate"])
            self.start = float(options["start"])
            self.parts = int(options["partitions"])
            self.value = b"x" * int(options["value_bytes"])

        def initialOffset(self) -> dict:
            return {"offset": self._now_offset()}

        def _now_offset(self) -> int:
            return max(0, int((time.time() - self.start) * self.rate))

        def latestOffset(self, start: dict, limit: Any) -> dict:
            return {"offset": max(int(start["offset"]), self._now_offset())}

        def partitions(self, start: dict, end: dict) -> list:
            first, last = int(start["offset"]), int(end["offset"])
            step = max(1, -(-(last - first) // self.parts))
            return [Range(a, min(a + step, last)) for a in range(first, last, step)] or [
                Range(first, first)
            ]

        def read(self, partition: Any) -> Any:
            n = partition.end - partition.first
            if n <= 0:
                return
            schema = arrow_schema(source_schema(False))
            offsets = pa.array(range(partition.first, partition.end), pa.int64())
            # offset i was "sent" at start + i / rate
            seconds = pc.add(pc.divide(pc.cast(offsets, pa.float64()), self.rate), self.start)
            micros = pc.cast(pc.multiply(seconds, 1_000_000), pa.int64(), safe=False)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.nulls(n, pa.binary()),
                    pa.array([self.value] * n, pa.binary()),
                    pa.repeat(pa.scalar("t", pa.string()), n),
                    pa.repeat(pa.scalar(0, pa.int32()), n),
                    offsets,
                    micros.cast(schema.field("timestamp").type),
                    pa.repeat(pa.scalar(0, pa.int32()), n),
                ],
                schema=schema,
            )
            # As odradek's tasks do (odradek.spark.worker): both then skip PySpark's full
            # collection of the worker's long-lived objects after each task.
            freeze_heap_once()

        def commit(self, end: dict) -> None:
            pass

    class CeilingStreamSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "stream-ceiling"

        def schema(self) -> Any:
            return source_schema(False)

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return CeilingStreamReader(dict(self.options))

    return CeilingStreamSource


def measure(
    reader: Any,
    work: Path,
    name: str,
    args: argparse.Namespace,
    sent: Any,
) -> dict[str, Any]:
    """Run one streaming query over `reader` (a DataStreamReader, loaded) and measure it."""
    from pyspark.sql import functions as F

    latencies: list[float] = []
    measuring = threading.Event()

    def on_batch(df: Any, _batch_id: int) -> None:
        stamps = df.select((F.col("timestamp").cast("double") * 1000).alias("ms")).collect()
        now_ms = time.time() * 1000
        if measuring.is_set():
            latencies.extend(now_ms - row["ms"] for row in stamps)

    query = (
        reader.writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(work / f"checkpoint-{name}"))
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .start()
    )
    try:
        time.sleep(args.warmup)  # a benchmark's fixed schedule, not a test's wait
        first_batch = len(query.recentProgress)
        sent_before = sent()
        measuring.set()
        time.sleep(args.duration)
        measuring.clear()
        produced = sent() - sent_before
        progress = query.recentProgress[first_batch:]
    finally:
        query.stop()
    durations = [float(p["durationMs"]["triggerExecution"]) for p in progress]
    phases = sorted({name for p in progress for name in p["durationMs"]})
    return {
        "produced_per_s": round(produced / args.duration, 1),
        "records_measured": len(latencies),
        "batches": len(progress),
        "latency_ms": percentiles(latencies),
        "batch_duration_ms": percentiles(durations),
        "batch_phase_median_ms": {
            phase: statistics.median(float(p["durationMs"].get(phase, 0)) for p in progress)
            for phase in phases
        },
    }


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
    parser.add_argument(
        "--source",
        choices=("odradek", "ceiling", "both"),
        default="odradek",
        help="odradek, the stream-ceiling source (Spark's own floor), or both in one run",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark property for the session (repeatable)",
    )
    args = parser.parse_args()
    conf = {}
    for setting in args.conf:
        key, equals, value = setting.partition("=")
        if not equals or not key.strip():
            parser.error(f"--conf takes KEY=VALUE, got {setting!r}")
        conf[key.strip()] = value

    from odradek.spark.session import local_session

    work = Path(tempfile.mkdtemp(prefix="odradek-spark-latency-"))
    results: dict[str, Any] = {}
    spark = None
    try:
        if args.source in ("ceiling", "both"):
            spark = local_session("odradek-bench-latency", master=args.master, **conf)
            spark.dataSource.register(ceiling_stream_source())
            started = time.time()
            reader = (
                spark.readStream.format("stream-ceiling")
                .option("rate", str(args.rate))
                .option("start", str(started))
                .option("partitions", str(args.partitions))
                .option("value_bytes", str(args.record_bytes))
                .load()
            )
            results["ceiling"] = measure(
                reader,
                work,
                "ceiling",
                args,
                lambda: int((time.time() - started) * args.rate),
            )
        if args.source in ("odradek", "both"):
            with target(args.bootstrap, args.brokers) as (bootstrap, local):
                topic = f"bench-latency-{uuid.uuid4().hex[:8]}"
                create_topic(bootstrap, topic, args.partitions, args.replication_factor)
                if spark is None:
                    spark = local_session("odradek-bench-latency", master=args.master, **conf)
                producer = RateProducer(bootstrap, topic, args.rate, args.record_bytes)
                producer.start()
                try:
                    reader = (
                        spark.readStream.format("odradek")
                        .option("kafka.bootstrap.servers", bootstrap)
                        .option("subscribe", topic)
                        .load()
                    )
                    results["odradek"] = measure(
                        reader, work, "odradek", args, lambda: producer.sent
                    )
                    results["odradek"]["target"] = "local odradek" if local else bootstrap
                finally:
                    producer.halt.set()
                    producer.join(30)
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary: dict[str, Any] = {
        "bench": "spark_streaming_latency",
        "master": args.master,
        "rate": args.rate,
        "trigger_ms": args.trigger_ms,
        "record_bytes": args.record_bytes,
        "partitions": args.partitions,
        "seconds": args.duration,
        "conf": conf,
        **results,
    }
    if "odradek" in results and "ceiling" in results:
        odradek_p50 = results["odradek"]["latency_ms"].get("p50")
        ceiling_p50 = results["ceiling"]["latency_ms"].get("p50")
        if odradek_p50 and ceiling_p50:
            summary["odradek_p50_over_ceiling_p50"] = round(odradek_p50 / ceiling_p50, 2)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
