"""Helpers for the streaming tests: start a query into Parquet, follow its progress."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from tests.fixtures.cluster import wait_until


def stream(spark: SparkSession, bootstrap: str, **options: str) -> Any:
    reader = spark.readStream.format("odradek").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def to_parquet(
    df: Any, out: Path, checkpoint: Path, trigger: dict[str, Any] | None = None
) -> StreamingQuery:
    return (
        df.select("topic", "partition", "offset", "key", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(**(trigger or {"processingTime": "200 milliseconds"}))
        .start()
    )


def rows_processed(query: StreamingQuery) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


def end_offsets(query: StreamingQuery) -> dict[str, dict[str, int]]:
    """The end offsets of the query's last micro-batch ({} before the first one)."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return {}
    end = progress["sources"][0]["endOffset"]
    return json.loads(end) if isinstance(end, str) else dict(end or {})


def check_alive(query: StreamingQuery) -> None:
    if not query.isActive:
        raise AssertionError(f"query stopped: {query.exception()}")


def wait_caught_up(
    query: StreamingQuery, topic: str, high_watermarks: dict[int, int], timeout: float = 120
) -> None:
    """Wait until the query's last batch ended at `high_watermarks` (failing fast if it died)."""
    expected = {str(p): o for p, o in high_watermarks.items()}

    def caught_up() -> bool:
        check_alive(query)
        return end_offsets(query).get(topic) == expected

    wait_until(caught_up, timeout, f"the query to reach {expected}", interval=0.2)
