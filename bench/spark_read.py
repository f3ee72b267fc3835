"""Rows/s read into Spark through the `odradek` source, against Parquet holding the same rows.

Prints one JSON object. Starts a local Odradek cluster (`--brokers`, default 1) unless given
`--bootstrap`; fills a topic with `--records` records of `--record-bytes` bytes (default 10M x
100 B, an equal share in each of `--partitions`), unless `--topic` names one already filled.
Then, in a local SparkSession (`--master`, default local[2]):

* odradek: `spark.read.format("odradek")...load()` written to the `noop` sink, which makes Spark
  produce every row and every column and discard them;
* kafka_connector: Spark's own Kafka connector (`format("kafka")`, spark-sql-kafka-0-10 from the
  jar cache `./dev setup` fills, see `odradek.spark.connector`) reading the same topic the same way;
* parquet: the same rows, first saved as Parquet (not timed), read the same way;
* arrow_ceiling: a Python data source (`arrow-ceiling`, defined here) that emits pre-built Arrow
  batches of the source's schema, as many rows in as many partitions: the most any Python data
  source can deliver through PySpark's Arrow path, the ceiling of the `odradek` source.

Each read runs once untimed on a small slice first, so that JVM and Python worker start-up are
not counted. The JVM's side of every Python data source (Arrow batches to rows) is compiled by its
JIT during the first large read, which then runs 1.5-2x slower whichever source it is: the ceiling
first reads every row once untimed, then `--rounds` rounds (default 3) time the odradek source and
the ceiling, alternating which goes first, and each reports its median round (all rounds are in
the output). The ceiling's batches carry the topic's name, as odradek's rows do. The ratios are
odradek's median rows/s over the ceiling's, over Parquet's and over Spark's Kafka connector's.
`rounds_machine_busy` is the whole machine's busy share of its CPU time during each round (from
/proc/stat; 1.0 is every core busy): whether a read was held back by the CPU or by waiting.

    .venv/bin/python bench/spark_read.py --records 1000000
    .venv/bin/python bench/spark_read.py --bootstrap 127.0.0.1:9092 --topic big --records 5000000

`spark_write.py` and `spark_streaming_latency.py` import the cluster and topic helpers from here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


@contextlib.contextmanager
def target(bootstrap: str | None, brokers: int) -> Iterator[tuple[str, bool]]:
    """(bootstrap servers, started here) of `--bootstrap`, or of a local cluster brought down
    at the end."""
    if bootstrap is not None:
        yield bootstrap, False
        return
    from odradek.testing import LocalCluster

    directory = Path(tempfile.mkdtemp(prefix="odradek-spark-bench-"))
    cluster = LocalCluster.up(directory, brokers=brokers, timeout=120)
    try:
        yield cluster.bootstrap_servers, True
    finally:
        cluster.down()
        shutil.rmtree(directory, ignore_errors=True)


def create_topic(bootstrap: str, topic: str, partitions: int, replication: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, replication)], operation_timeout=60)
    for future in futures.values():
        future.result(timeout=120)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = admin.list_topics(timeout=10).topics.get(topic)
        if found is not None and all(p.leader >= 0 for p in found.partitions.values()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} has no leaders after 60s")


def fill_topic(
    bootstrap: str, topic: str, records: int, record_bytes: int, partitions: int
) -> dict[str, float]:
    """Produce `records` values of `record_bytes` bytes (acks=all), an equal share to each of
    the topic's `partitions` in turn (as the ceiling's rows are: left to librdkafka's sticky
    partitioner, partitions came out up to 20% apart, and with 2 cores and 4 tasks the largest
    decides when the read ends; one partition at a time keeps batches as large as before);
    returns produce rate."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_000_000,
        }
    )
    failures = 0

    def on_delivery(error: Any, _message: Any) -> None:
        nonlocal failures
        if error is not None:
            failures += 1

    value = b"x" * record_bytes
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(
                    topic, value=value, partition=i * partitions // records, on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(600)
    elapsed = time.perf_counter() - started
    if failures or left:
        raise RuntimeError(f"{failures} records failed, {left} unacknowledged")
    return {"records_per_s": round(records / elapsed), "seconds": round(elapsed, 2)}


def ceiling_source() -> type:
    """The `arrow-ceiling` data source: options `rows`, `partitions`, `value_bytes`, `topic`."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from odradek.spark.arrow import arrow_schema, source_schema

    class CeilingReader(DataSourceReader):
        def __init__(self, options: dict[str, str]) -> None:
            self.rows = int(options["rows"])
            self.parts = int(options["partitions"])
            self.value_bytes = int(options["value_bytes"])
            self.topic = options.get("topic", "t")

        def partitions(self) -> list[InputPartition]:
            share = self.rows // self.parts
            return [
                InputPartition(share + (self.rows % self.parts if i == 0 else 0))
                for i in range(self.parts)
            ]

        def read(self, partition: InputPartition) -> Any:
            schema = arrow_schema(source_schema(False))
            size = 100_000
            n = min(size, partition.value)
            value = b"x" * self.value_bytes
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.nulls(n, pa.binary()),
                    pa.array([value] * n, pa.binary()),
                    pa.repeat(pa.scalar(self.topic, pa.string()), n),
                    pa.repeat(pa.scalar(0, pa.int32()), n),
                    pa.array(range(n), pa.int64()),
                    pa.array([1_700_000_000_000_000] * n, pa.int64()).cast(
                        schema.field("timestamp").type
                    ),
                    pa.repeat(pa.scalar(0, pa.int32()), n),
                ],
                schema=schema,
            )
            left = partition.value
            while left > 0:
                yield batch if left >= n else batch.slice(0, left)
                left -= n

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "arrow-ceiling"

        def schema(self) -> Any:
            return source_schema(False)

        def reader(self, schema: Any) -> DataSourceReader:
            return CeilingReader(dict(self.options))

    return CeilingSource


def machine_jiffies() -> tuple[int, int]:
    """(busy, all) CPU time of the whole machine so far, in clock ticks (Linux /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def timed_noop(df: Any) -> float:
    return timed_round(df)[0]


def timed_round(df: Any) -> tuple[float, float]:
    """(seconds, the machine's busy share meanwhile) of writing `df` to the noop sink."""
    busy, total = machine_jiffies()
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - started
    busy_after, total_after = machine_jiffies()
    return elapsed, round((busy_after - busy) / max(1, total_after - total), 3)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="existing cluster; default: a local Odradek cluster")
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--topic", help="an existing topic holding --records records")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of odradek and ceiling")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    from odradek.spark.connector import connector_jars, connector_version
    from odradek.spark.session import local_session

    work = Path(tempfile.mkdtemp(prefix="odradek-spark-read-"))
    with target(args.bootstrap, args.brokers) as (bootstrap, local):
        topic = args.topic
        produced = None
        if topic is None:
            topic = f"bench-read-{uuid.uuid4().hex[:8]}"
            create_topic(bootstrap, topic, args.partitions, args.replication_factor)
            produced = fill_topic(
                bootstrap, topic, args.records, args.record_bytes, args.partitions
            )
        spark = local_session(
            "odradek-bench-read", master=args.master, **{"spark.jars": ",".join(connector_jars())}
        )
        try:

            def source(**options: str) -> Any:
                reader = spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap)
                if "assign" not in options:
                    reader = reader.option("subscribe", topic)
                for key, value in options.items():
                    reader = reader.option(key, value)
                return reader.load()

            # Warm-up: one small task per partition, reading its first records (not a limit()
            # over the whole topic: a task cut short by a limit does not give its Python worker
            # back for reuse, so each would start and import a fresh worker). Every Python worker
            # of the session has then imported the source, as the ceiling's warm-up does.
            first = min(1000, args.records // (8 * args.partitions))
            timed_noop(
                source(
                    endingOffsets=json.dumps(
                        {topic: {str(p): first for p in range(args.partitions)}}
                    ),
                )
            )

            def connector(**options: str) -> Any:
                reader = (
                    spark.read.format("kafka")
                    .option("kafka.bootstrap.servers", bootstrap)
                    .option("subscribe", topic)
                )
                for key, value in options.items():
                    reader = reader.option(key, value)
                return reader.load()

            timed_noop(
                connector(
                    endingOffsets=json.dumps(
                        {topic: {str(p): first for p in range(args.partitions)}}
                    )
                )
            )
            connector_s = timed_noop(connector())
            spark.dataSource.register(ceiling_source())

            def ceiling(rows: int) -> Any:
                return (
                    spark.read.format("arrow-ceiling")
                    .option("rows", str(rows))
                    .option("partitions", str(args.partitions))
                    .option("value_bytes", str(args.record_bytes))
                    .option("topic", topic)
                    .load()
                )

            timed_noop(ceiling(1000))
            parquet_path = str(work / "parquet")
            source().write.parquet(parquet_path)
            rows = spark.read.parquet(parquet_path).count()  # from the footers: no full read
            timed_noop(spark.read.parquet(parquet_path).limit(1000))
            parquet_s = timed_noop(spark.read.parquet(parquet_path))
            timed_noop(ceiling(rows))  # the JIT's warm-up of the Python data source path
            measured: dict[str, list[tuple[float, float]]] = {"odradek": [], "ceiling": []}
            for round_ in range(args.rounds):
                order = ["odradek", "ceiling"] if round_ % 2 == 0 else ["ceiling", "odradek"]
                for name in order:
                    df = source() if name == "odradek" else ceiling(rows)
                    measured[name].append(timed_round(df))
            odradek_rounds = [seconds for seconds, _ in measured["odradek"]]
            ceiling_rounds = [seconds for seconds, _ in measured["ceiling"]]
            odradek_busy = [busy for _, busy in measured["odradek"]]
            ceiling_busy = [busy for _, busy in measured["ceiling"]]
            odradek_s = statistics.median(odradek_rounds)
            ceiling_s = statistics.median(ceiling_rounds)
        finally:
            spark.stop()
            shutil.rmtree(work, ignore_errors=True)
    odradek_rate = rows / odradek_s
    parquet_rate = rows / parquet_s
    ceiling_rate = rows / ceiling_s
    connector_rate = rows / connector_s
    print(
        json.dumps(
            {
                "bench": "spark_read",
                "target": "local odradek" if local else bootstrap,
                "master": args.master,
                "records": rows,
                "record_bytes": args.record_bytes,
                "partitions": args.partitions,
                "produce": produced,
                "odradek": {
                    "rows_per_s": round(odradek_rate),
                    "seconds": round(odradek_s, 2),
                    "rounds_rows_per_s": [round(rows / t) for t in odradek_rounds],
                    "rounds_machine_busy": odradek_busy,
                },
                "arrow_ceiling": {
                    "rows_per_s": round(ceiling_rate),
                    "seconds": round(ceiling_s, 2),
                    "rounds_rows_per_s": [round(rows / t) for t in ceiling_rounds],
                    "rounds_machine_busy": ceiling_busy,
                },
                "parquet": {"rows_per_s": round(parquet_rate), "seconds": round(parquet_s, 2)},
                "kafka_connector": {
                    "version": connector_version(),
                    "rows_per_s": round(connector_rate),
                    "seconds": round(connector_s, 2),
                },
                "odradek_over_ceiling": round(odradek_rate / ceiling_rate, 3),
                "odradek_over_ceiling_by_round": [
                    round(c / o, 3) for o, c in zip(odradek_rounds, ceiling_rounds, strict=True)
                ],
                "odradek_over_parquet": round(odradek_rate / parquet_rate, 3),
                "odradek_over_kafka_connector": round(odradek_rate / connector_rate, 3),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
