"""What the README's demo (`odradek.demo`) watches while its pipeline runs: the input topic (end
offsets, leaders and ISRs) and each streaming query of the job (read offsets, micro-batches,
watermark), and from those when a query has drained -- the condition the demo's docstring explains.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

log = logging.getLogger("odradek.demo")

INPUT_TOPIC = "pageviews"
PARTITIONS = 3
WORKER_START_FAILURE = "Python worker failed to connect back"


class TopicWatch:
    """What the demo reports about the input topic: end offsets, leaders and ISRs.

    End offsets come from ListOffsets through an AdminClient that is replaced after any failure
    (`ClusterOffsets`): a consumer's `get_watermark_offsets` can keep failing locally for minutes
    after a broker dies (librdkafka drops the dead broker's handle and keeps the stale leader), so
    the demo never relies on one client's cached metadata.
    """

    def __init__(self, bootstrap: str) -> None:
        from odradek.spark.clients import ClusterOffsets
        from odradek.spark.offsets import TopicPartition

        self.view = ClusterOffsets(bootstrap, {}, timeout_s=2.0, retries=0)
        self.partitions = [TopicPartition(INPUT_TOPIC, p) for p in range(PARTITIONS)]
        self.last_known: dict[int, int] = {}

    def end_offsets(self) -> tuple[int, list[int]]:
        """(records in the topic, counting the last known count of a partition that did not
        answer; the partitions that did not answer)."""
        result = self.view.list_offsets(self.partitions, "latest", retries=0)
        for tp, offset in result.offsets.items():
            self.last_known[tp.partition] = offset
        missing = sorted(tp.partition for tp in result.failed)
        for tp, error in sorted(result.failed.items()):
            log.info("no end offset for %s this round: %s", tp, error)
        return sum(self.last_known.values()), missing

    def exact_end_offsets(self) -> dict[int, int]:
        """Every partition's end offset, asking again while a leader moves."""
        result = self.view.list_offsets(self.partitions, "latest", retries=10)
        return {tp.partition: offset for tp, offset in result.require().items()}

    def layout(self) -> dict[int, tuple[int, list[int]]]:
        """partition -> (leader, ISR); {} if metadata cannot be had right now."""
        try:
            topic = self.view.admin.list_topics(INPUT_TOPIC, timeout=2).topics[INPUT_TOPIC]
        except Exception:
            self.view._admin = None
            return {}
        return {p.id: (p.leader, sorted(p.isrs)) for p in topic.partitions.values()}


class Query:
    """One streaming query of the job, as its progress reports describe it."""

    def __init__(self, query: Any) -> None:
        self.query = query
        self.name = query.name

    def batches(self) -> int:
        return int((self.query.lastProgress or {}).get("batchId", -1)) + 1

    def read_offsets(self) -> dict[int, int]:
        """The input topic's end offsets of the last completed micro-batch."""
        progress = self.query.lastProgress
        if not progress:
            return {}
        end = progress["sources"][0].get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        return {int(p): int(o) for p, o in ((end or {}).get(INPUT_TOPIC) or {}).items()}

    def watermark(self) -> dt.datetime | None:
        """The highest watermark a completed micro-batch ran with."""
        marks = [
            p["eventTime"]["watermark"]
            for p in self.query.recentProgress
            if "watermark" in p.get("eventTime", {})
        ]
        if not marks:
            return None
        return max(dt.datetime.fromisoformat(m.replace("Z", "+00:00")) for m in marks)

    def dropped_as_late(self) -> int:
        """Records its micro-batches dropped for arriving behind the watermark (as reported)."""
        return sum(
            int(operator.get("numRowsDroppedByWatermark", 0))
            for p in self.query.recentProgress
            for operator in p.get("stateOperators", [])
        )

    def drained(self, target: dict[int, int], last_window_end: dt.datetime) -> str | None:
        """None if this query is done; else what it is still waiting for."""
        read = self.read_offsets()
        behind = {p: (read.get(p, 0), end) for p, end in target.items() if read.get(p, 0) < end}
        if behind:
            shown = ", ".join(f"{INPUT_TOPIC}-{p} at {r} of {e}" for p, (r, e) in behind.items())
            return f"{self.name}: reading ({shown})"
        mark = self.watermark()
        if mark is None or mark < last_window_end:
            return (
                f"{self.name}: the watermark ({clock(mark)}) has not passed the end of the "
                f"last window ({clock(last_window_end)})"
            )
        return None

    def worker_start_timed_out(self) -> bool:
        """Did the query fail before its first batch because Spark's Python worker did not
        connect back within Spark's fixed timeout (a busy machine, not a pipeline fault)?"""
        error = self.query.exception()
        return error is not None and self.batches() == 0 and WORKER_START_FAILURE in str(error)

    def raise_if_failed(self) -> None:
        if self.query.exception() is not None:
            raise RuntimeError(f"query {self.name} failed: {self.query.exception()}")


def clock(moment: dt.datetime | None) -> str:
    return "none yet" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")
