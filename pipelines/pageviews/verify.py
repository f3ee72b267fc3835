"""Check the page-view job's output: every final window exactly once, with the right numbers.

    .venv/bin/python pipelines/pageviews/verify.py --bootstrap 127.0.0.1:9092 \\
        --output-dir out/pageviews [--output-topic pageviews-per-page]

Recomputes the aggregates in batch over the whole input topic (read through the odradek batch
source, same parsing and windows as the job) and compares them with the Parquet output. Only
final windows are expected: those whose end is at or before the job's last possible watermark,
the largest event time in the topic minus the allowed lateness (the end-of-stream event makes that
every window of a complete run). Reported, as one JSON object:

* `missing` -- windows recomputed but not in the output (lost);
* `duplicated` -- windows in the output more than once (doubled);
* `wrong` -- windows in the output whose views or dwell time differ;
* `unexpected` -- windows in the output that the recomputation has no final row for.

With `--output-topic`, the job's topic output is checked too: it is at-least-once, so every
expected window must be there with the right numbers, and repeats are only counted.

Exit status 0 when nothing is missing, duplicated, wrong or unexpected (and there was something
to check); 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from pageviews import DEFAULT_WATERMARK, DEFAULT_WINDOW, aggregate, parse_events


def read_topic(spark: Any, bootstrap: str, topic: str) -> Any:
    return (
        spark.read.format("odradek")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )


def expected_windows(
    spark: Any, args: argparse.Namespace
) -> dict[tuple[Any, ...], tuple[int, int]]:
    from pyspark.sql import functions as F

    events = parse_events(read_topic(spark, args.bootstrap, args.topics)).cache()
    latest = events.agg(F.max("event_time").alias("latest")).collect()[0]["latest"]
    if latest is None:
        return {}
    final = aggregate(events, args.window).filter(
        F.col("window_end")
        <= F.lit(latest).cast("timestamp") - F.expr(f"INTERVAL {args.watermark}")
    )
    return {
        (r["window_start"], r["window_end"], r["page"]): (r["views"], r["dwell_ms"])
        for r in final.collect()
    }


def compare(
    expected: dict[tuple[Any, ...], tuple[int, int]],
    rows: list[tuple[tuple[Any, ...], tuple[int, int]]],
) -> dict[str, Any]:
    counts = Counter(key for key, _ in rows)
    got = dict(rows)
    missing = sorted(k for k in expected if k not in got)
    wrong = sorted(k for k, v in got.items() if k in expected and expected[k] != v)
    unexpected = sorted(k for k in got if k not in expected)
    duplicated = sorted(k for k, n in counts.items() if n > 1)
    return {
        "rows": len(rows),
        "missing": [_show(k) for k in missing[:10]],
        "missing_count": len(missing),
        "duplicated": [_show(k) for k in duplicated[:10]],
        "duplicated_count": len(duplicated),
        "wrong": [_show(k) for k in wrong[:10]],
        "wrong_count": len(wrong),
        "unexpected": [_show(k) for k in unexpected[:10]],
        "unexpected_count": len(unexpected),
    }


def _show(key: tuple[Any, ...]) -> str:
    start, end, page = key
    return f"{start.isoformat()}..{end.isoformat()} {page}"


def parquet_rows(spark: Any, output_dir: str) -> list[tuple[tuple[Any, ...], tuple[int, int]]]:
    return [
        ((r["window_start"], r["window_end"], r["page"]), (r["views"], r["dwell_ms"]))
        for r in spark.read.parquet(output_dir).collect()
    ]


def topic_rows(
    spark: Any, args: argparse.Namespace
) -> list[tuple[tuple[Any, ...], tuple[int, int]]]:
    from pyspark.sql import functions as F

    schema = "window_start STRING, window_end STRING, page STRING, views BIGINT, dwell_ms BIGINT"
    parsed = read_topic(spark, args.bootstrap, args.output_topic).select(
        F.from_json(F.col("value").cast("string"), schema).alias("a")
    )
    return [
        (
            (r["window_start"], r["window_end"], r["page"]),
            (r["views"], r["dwell_ms"]),
        )
        for r in parsed.select(
            F.to_timestamp("a.window_start").alias("window_start"),
            F.to_timestamp("a.window_end").alias("window_end"),
            "a.page",
            "a.views",
            "a.dwell_ms",
        ).collect()
    ]


def check(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The report (see the module docstring); `report["ok"]` is the verdict."""
    expected = expected_windows(spark, args)
    parquet = compare(expected, parquet_rows(spark, args.output_dir))
    report: dict[str, Any] = {
        "verify": "pageviews",
        "expected_windows": len(expected),
        "parquet": parquet,
    }
    ok = all(parquet[f"{k}_count"] == 0 for k in ("missing", "duplicated", "wrong", "unexpected"))
    if args.output_topic:
        topic = compare(expected, topic_rows(spark, args))
        # At-least-once: repeats are reported, not failures.
        ok = ok and all(topic[f"{k}_count"] == 0 for k in ("missing", "wrong", "unexpected"))
        report["topic"] = topic
    report["ok"] = ok and len(expected) > 0
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topics", default="pageviews")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--output-topic", default=None, help="also check the topic output")
    parser.add_argument("--window", default=DEFAULT_WINDOW)
    parser.add_argument("--watermark", default=DEFAULT_WATERMARK)
    parser.add_argument("--master", default="local[2]")
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    from odradek.spark.session import local_session

    spark = local_session("pageviews-verify", master=args.master)
    try:
        report = check(spark, args)
    finally:
        spark.stop()
    print(json.dumps(report, default=str), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
