"""The page-view pipeline: a Structured Streaming job from a topic to windowed aggregates.

Reads page-view events (`pageviews.py`) from Odradek through the `odradek` source, parses the
JSON, and counts views and dwell time per page per event-time window (default 10 s) with a
watermark (default 30 s of allowed lateness). Each final window is written twice, by two
streaming queries with their own checkpoints under `--checkpoint-dir`:

* `parquet/` -- Parquet files in `--output-dir`, append mode: a window is written once, when the
  watermark passes its end. Exactly-once: Spark's file sink log and the source's checkpointed
  offsets make a restarted job neither lose nor repeat a window.
* `topic/` -- JSON records into `--output-topic` through the odradek sink (key = page). At least
  once: a batch replayed after a failure writes its windows again.

Runs with a local SparkSession:

    .venv/bin/python pipelines/pageviews/job.py --bootstrap 127.0.0.1:9092 \\
        --output-dir out/pageviews --checkpoint-dir out/checkpoints --trigger available-now

or under spark-submit (its master and conf win; the workers must run the project's Python), on
a Spark standalone cluster too (`odradek cluster up --spark-workers 2`; README, "Running a
pipeline on a Spark cluster"):

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master spark://127.0.0.1:7077 \\
        pipelines/pageviews/job.py \\
        --bootstrap 127.0.0.1:9092 --output-dir out/pageviews --checkpoint-dir out/checkpoints

`--format kafka` reads and writes through Spark's own Kafka connector (`format("kafka")`, its jars
on the classpath: `--jars $(.venv/bin/python -m odradek.spark.connector)`) instead of the
`odradek` data source; the options are the same.

`--trigger` is `available-now` (process what the topic holds, then stop), or a processing-time
interval such as `2 seconds` (run until `--run-seconds` pass or the job is interrupted). Queries
that fail before their first batch because Spark's Python worker did not connect back in time (a
busy machine) are started again from their checkpoints, up to START_RETRIES times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pageviews import DEFAULT_WATERMARK, DEFAULT_WINDOW, aggregate, parse_events

WORKER_START_FAILURE = "Python worker failed to connect back"
START_RETRIES = 5


def session(master: str) -> Any:
    """spark-submit's session when launched by it, else a local one; `odradek` registered."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # started by spark-submit
        from pyspark.sql import SparkSession

        from odradek.spark import register
        from odradek.spark.session import use_file_system_checkpoints

        spark = SparkSession.builder.appName("pageviews").getOrCreate()
        use_file_system_checkpoints(spark)  # unless --conf named a checkpoint file manager
        register(spark)
        return spark
    from odradek.spark.session import local_session

    return local_session("pageviews", master=master)


def build(spark: Any, args: argparse.Namespace) -> Any:
    """The aggregate stream (not started)."""
    source = (
        spark.readStream.format(args.format)
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topics)
        .option("startingOffsets", args.starting_offsets)
    )
    if args.max_offsets_per_trigger:
        source = source.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    events = parse_events(source.load()).withWatermark("event_time", args.watermark)
    return aggregate(events, args.window)


def trigger(value: str) -> dict[str, Any]:
    if value == "available-now":
        return {"availableNow": True}
    return {"processingTime": value}


def start(spark: Any, args: argparse.Namespace) -> list[Any]:
    aggregates = build(spark, args)
    checkpoints = Path(args.checkpoint_dir)
    to_parquet = (
        aggregates.writeStream.queryName("pageviews_parquet")
        .format("parquet")
        .outputMode("append")
        .option("path", args.output_dir)
        .option("checkpointLocation", str(checkpoints / "parquet"))
        .trigger(**trigger(args.trigger))
        .start()
    )
    as_json = as_records(aggregates)
    to_topic = (
        as_json.writeStream.queryName("pageviews_topic")
        .format(args.format)
        .outputMode("append")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.output_topic)
        .option("checkpointLocation", str(checkpoints / "topic"))
        .trigger(**trigger(args.trigger))
        .start()
    )
    return [to_parquet, to_topic]


def as_records(aggregates: Any) -> Any:
    """Aggregate rows as sink records: key = page, value = the row as JSON."""
    from pyspark.sql import functions as F

    return aggregates.select(
        F.col("page").alias("key"),
        F.to_json(
            F.struct(
                F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("window_start"),
                F.date_format("window_end", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("window_end"),
                "page",
                "views",
                "dwell_ms",
            )
        ).alias("value"),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topics", default="pageviews", help="input topics, comma separated")
    parser.add_argument("--output-topic", default="pageviews-per-page")
    parser.add_argument("--output-dir", required=True, help="Parquet output directory")
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--trigger", default="2 seconds", help="'available-now' or an interval")
    parser.add_argument("--window", default=DEFAULT_WINDOW)
    parser.add_argument("--watermark", default=DEFAULT_WATERMARK)
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument("--run-seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--master", default="local[2]", help="without spark-submit only")
    parser.add_argument(
        "--format",
        choices=["odradek", "kafka"],
        default="odradek",
        help="the source and sink: the odradek data source or Spark's Kafka connector",
    )
    return parser.parse_args(argv)


def python_worker_start_failed(query: Any) -> bool:
    """Did the query fail before its first batch because a Python worker Spark started for it
    did not connect back within Spark's fixed 10 s (not a setting)? On a busy machine the
    driver's worker for a Python data source can take longer to start; nothing has been read,
    and the query can start again from its checkpoint, as one restarts any failed query."""
    error = query.exception()
    return error is not None and not query.recentProgress and WORKER_START_FAILURE in str(error)


def main() -> int:
    args = parse_args()
    spark = session(args.master)
    queries = start(spark, args)
    deadline = None if args.run_seconds is None else time.monotonic() + args.run_seconds
    failed = None
    restarts = 0
    try:
        while True:
            if restarts < START_RETRIES and any(python_worker_start_failed(q) for q in queries):
                restarts += 1
                print(
                    "pageviews: Spark's Python worker did not connect back within Spark's fixed"
                    f" 10 s (busy machine): starting the queries again from their checkpoints"
                    f" ({restarts} of {START_RETRIES})",
                    file=sys.stderr,
                    flush=True,
                )
                for query in queries:
                    query.stop()
                queries = start(spark, args)
                continue
            if not any(q.isActive for q in queries):
                break
            for query in queries:
                if not query.isActive and query.exception() is not None:
                    failed = query.exception()
            if failed is not None or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(0.5)  # polling the queries' state, not waiting for a condition to hold
    except KeyboardInterrupt:
        pass
    finally:
        for query in queries:
            query.stop()
        for query in queries:
            if failed is None and query.exception() is not None:
                failed = query.exception()
    summary = {
        "job": "pageviews",
        "queries": {
            q.name: {
                "batches": len(q.recentProgress),
                "last": q.lastProgress and q.lastProgress["batchId"],
            }
            for q in queries
        },
        "error": str(failed) if failed is not None else None,
    }
    print(json.dumps(summary), flush=True)
    spark.stop()
    return 1 if failed is not None else 0


if __name__ == "__main__":
    sys.exit(main())
