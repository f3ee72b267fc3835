"""`odradek.spark`: a PySpark data source named `odradek`, batch and streaming, read and write.

Its options and schema are those of Spark's built-in Kafka source and sink, so a pipeline moves
between Kafka and Odradek by changing the format name (and it reads and writes any Kafka cluster
too: the clients are confluent-kafka's).

Usage::

    from odradek.spark import register
    from odradek.spark.session import local_session

    spark = local_session("my-app")         # or any SparkSession, then register(spark)
    # register(spark) is spark.dataSource.register(OdradekDataSource)

    df = (spark.readStream.format("odradek")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "pageviews")
          .load())
    query = (df.selectExpr("CAST(value AS STRING) AS value")
             .writeStream.format("parquet")
             .option("path", "out/").option("checkpointLocation", "chk/")
             .start())

    spark.read.format("odradek").option("kafka.bootstrap.servers", ...).option(
        "subscribe", "pageviews").option("startingOffsets", "earliest").load()
    df.write.format("odradek").option("kafka.bootstrap.servers", ...).option(
        "topic", "out").mode("append").save()

Source options (names are case-insensitive, as in Spark):

=============================  ===============================================================
`kafka.bootstrap.servers`      required; comma-separated host:port list
`subscribe`                    comma-separated topics          } exactly one of
`subscribePattern`             regular expression, full match  } these three
`assign`                       JSON `{"t":[0,1]}`              }
`startingOffsets`              `earliest`, `latest` or JSON `{"t":{"0":23,"1":-2}}` (-2 =
                               earliest, -1 = latest). Default: latest for a stream, earliest
                               for a batch read. Only used when a query starts without a
                               checkpoint. Partitions a JSON spec leaves out take the default.
`endingOffsets`                batch reads only: `latest` (default) or JSON (-1 = latest)
`maxOffsetsPerTrigger`         stream: at most this many records per micro-batch, shared among
                               partitions by backlog
`minPartitions`                at least this many Spark tasks: large ranges are split
`maxRecordsPerPartition`       at most this many records per Spark task
`failOnDataLoss`               default true: fail when records a query was to read are gone
                               (retention, a deleted topic or partition); false: skip to what
                               exists with a warning
`includeHeaders`               default false: add the `headers` column
`kafkaConsumer.pollTimeoutMs`  how long a task waits without progress (default 120000)
`fetchOffset.numRetries`,      retries of offset requests on the driver (default 3, 1000 ms)
`fetchOffset.retryIntervalMs`
`kafka.isolation.level`        `read_uncommitted` (default, as Spark's) or `read_committed`:
                               offsets end at the last stable offset, records of aborted
                               transactions are skipped (control batches never are rows)
`kafka.*`                      passed to the clients without the prefix (librdkafka names,
                               which match the Java client's for common settings such as
                               `kafka.security.protocol`); settings the source owns are refused
                               (`kafka.auto.offset.reset`, `kafka.enable.auto.commit`,
                               (de)serializers, ...). `kafka.group.id` only names the
                               readers' consumers: no group is joined, nothing committed
=============================  ===============================================================

Source schema::

    key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp,
    timestampType int, headers array<struct<key:string,value:binary>> (only with includeHeaders)

Reads see only replicated records: "latest" is a partition's high watermark, never beyond it
(under read_committed, its last stable offset: a batch stops before the first undecided
transaction and a later one reads it once it is decided). A stream picks up new partitions of its topics (and new topics matching `subscribePattern`) from the
next trigger on, reading them from their first offset. `Trigger.AvailableNow` reads what existed
when the query started (its high watermarks) in one or more batches and stops.

Sink options: `kafka.bootstrap.servers` (required), `topic` (optional; wins over a `topic` column),
`exactlyOnce` (streaming writes, default false; needs `topic`), `odradek.writePath` (`auto`, the
default: record batches encoded natively from the Arrow columns and produced straight to the
leaders, `odradek.spark.produce`, handing over to a confluent-kafka Producer on any trouble;
`producer`: the Producer for every row), `kafka.compression.type` (none, gzip, snappy, lz4,
zstd), `kafka.*`. Sink columns: `value` (string or binary, required), `key` (string or binary),
`topic` (string), `partition` (int), `headers` (as in the source schema). Records are produced
with `acks=all`, keys partitioned with murmur2 as Kafka's default partitioner; a batch write
supports mode append only.

Delivery guarantees: a stream reading from Odradek into a file sink (Parquet, ...) is exactly-once:
offsets are Spark's checkpointed offsets, so a restarted query replays an unfinished micro-batch
over exactly the same ranges and Spark's file sink log keeps one copy. Writing into a topic is
at-least-once by default: a retried task or a replayed micro-batch writes its records again (the
job's abort logs what had already been written). A streaming write with `exactlyOnce=true` is
exactly-once for read_committed readers of the topic: each task writes its rows in one Kafka
transaction that also records the micro-batch as committed, and a replayed task whose batch is
recorded writes nothing (see `odradek.spark.exactly_once`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from odradek.spark.worker import in_pyspark_worker

# A worker imports this package when it unpickles the data source: there, as in the `odradek`
# command (`odradek.cli.entry.without_test_strategies`), kio's optional import of hypothesis
# (0.35 s of CPU) is skipped, as if hypothesis were not installed. A driver, a user's process,
# keeps hypothesis importable.
if in_pyspark_worker():
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]

from odradek.spark.source import OdradekDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["OdradekDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Register the `odradek` format on `spark` (`spark.dataSource.register(OdradekDataSource)`).

    Registration is per session; the class is pickled to the Python workers, which import
    `odradek.spark` from the installed package."""
    spark.dataSource.register(OdradekDataSource)
