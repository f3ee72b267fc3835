"""Offsets behind latest for a streaming query reading through the `odradek` source.

Spark's Kafka source reports, in each micro-batch's progress, the metrics `minOffsetsBehindLatest`,
`avgOffsetsBehindLatest` and `maxOffsetsBehindLatest` (`sources[i].metrics`): per partition, the
latest offset seen when the batch was planned minus the batch's end offset. A Python data source
cannot report source metrics -- PySpark 4.x's stream reader API has no `metrics()` (its JVM side,
PythonMicroBatchStream, does not implement ReportsSourceMetrics) -- so `sources[i].metrics` stays
empty for `odradek`. The inputs are in the progress all the same: the source reports the latest
offsets it saw (`reportLatestOffset`, shown as `latestOffset`) beside `endOffset`, and
`offsets_behind_latest` computes the three numbers from them, exactly as Spark's source does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["offsets_behind_latest"]


def _offsets(value: Any) -> dict[tuple[str, str], int]:
    if value is None:
        return {}
    obj = json.loads(value) if isinstance(value, str) else value
    return {
        (topic, partition): int(offset)
        for topic, partitions in (obj or {}).items()
        for partition, offset in partitions.items()
    }


def offsets_behind_latest(source_progress: Mapping[str, Any]) -> dict[str, str]:
    """`{"minOffsetsBehindLatest": ..., "avgOffsetsBehindLatest": ..., "maxOffsetsBehindLatest":
    ...}` (strings, as Spark reports metrics) for one entry of a progress's `sources`; {} when the
    progress has no latest or end offsets (no batch yet)."""
    latest = _offsets(source_progress.get("latestOffset"))
    end = _offsets(source_progress.get("endOffset"))
    behind = [offset - end[tp] for tp, offset in latest.items() if tp in end]
    if not behind:
        return {}
    return {
        "minOffsetsBehindLatest": str(min(behind)),
        # Java's Double.toString for values below 10^7 (Python's repr agrees there).
        "avgOffsetsBehindLatest": str(sum(behind) / len(behind)),
        "maxOffsetsBehindLatest": str(max(behind)),
    }
