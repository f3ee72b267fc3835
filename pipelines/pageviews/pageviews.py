"""The page-view events and their windowed aggregates, shared by the generator, job and verifier.

An event is one JSON object per record (the record key is the user id, so one user's events stay
in order within a partition):

    {"event_id": "e-000042", "event_type": "view", "user_id": "u0123", "page": "/products/17",
     "referrer": "search", "device": "mobile", "dwell_ms": 5300,
     "event_time": "2026-01-01T12:00:04.250Z"}

`event_time` is when the view happened (ISO-8601, UTC, milliseconds), not when it was produced:
some events arrive out of order and a few arrive late, up to the generator's maximum lateness.
The stream ends with one `event_type: "end_of_stream"` event timed one hour after the last view:
it moves the event-time watermark past every real window, so a query in append mode emits them
all, and it is not itself counted.

The aggregate is views and total dwell time per page per tumbling event-time window; a window is
final once the watermark (the largest event time seen, minus the allowed lateness) passes its end.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the generator runs without Spark; only the functions below need it
    from pyspark.sql import DataFrame

EVENT_SCHEMA = (
    "event_id STRING, event_type STRING, user_id STRING, page STRING, referrer STRING, "
    "device STRING, dwell_ms BIGINT, event_time STRING"
)

VIEW = "view"
END_OF_STREAM = "end_of_stream"
DEFAULT_WINDOW = "10 seconds"
DEFAULT_WATERMARK = "30 seconds"


def parse_events(records: DataFrame) -> DataFrame:
    """Records of the source (`value` binary) -> typed events with a timestamp `event_time`."""
    from pyspark.sql import functions as F

    parsed = F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")
    return (
        records.select(parsed)
        .select("e.*", F.to_timestamp(F.col("e.event_time")).alias("event_ts"))
        .drop("event_time")
        .withColumnRenamed("event_ts", "event_time")
    )


def aggregate(events: DataFrame, window: str = DEFAULT_WINDOW) -> DataFrame:
    """Views and dwell time per page per tumbling `window` of event time (views only).

    Every event goes into the aggregation and only views are counted in it; the groups with no
    view (the end-of-stream marker's) are dropped afterwards. Filtering views out *before*
    grouping would not do: Spark pushes such a filter below the watermark, and the marker would
    then never move it.
    """
    from pyspark.sql import functions as F

    is_view = F.col("event_type") == VIEW
    return (
        events.groupBy(F.window("event_time", window).alias("window"), F.col("page"))
        .agg(
            F.sum(F.when(is_view, 1).otherwise(0)).alias("views"),
            F.sum(F.when(is_view, F.col("dwell_ms")).otherwise(0)).alias("dwell_ms"),
        )
        .filter(F.col("views") > 0)
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "page",
            "views",
            "dwell_ms",
        )
    )


def window_seconds(window: str) -> float:
    """A Spark interval such as `10 seconds` or `1 minute`, in seconds."""
    amount, unit = window.split()
    scale = {"second": 1, "minute": 60, "hour": 3600}[unit.rstrip("s")]
    return float(amount) * scale


def window_end(event_time: str, window: str = DEFAULT_WINDOW) -> dt.datetime:
    """The end of the tumbling `window` (aligned to the epoch, as Spark's) holding an event
    time given in the events' ISO form (`2026-01-01T12:00:04.250Z`)."""
    moment = dt.datetime.fromisoformat(event_time.replace("Z", "+00:00"))
    size = window_seconds(window)
    start = math.floor(moment.timestamp() / size) * size
    return dt.datetime.fromtimestamp(start + size, dt.UTC)


def row_key(row: Any) -> tuple[Any, Any, str]:
    """How verify identifies an aggregate row."""
    return (row["window_start"], row["window_end"], row["page"])
