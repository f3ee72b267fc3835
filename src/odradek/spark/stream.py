"""`spark.readStream.format("odradek")`: the micro-batch stream reader.

Spark drives it from the driver, in one long-lived Python process per query, in this order for
each trigger: `latestOffset(start, limit)` (the end of the next batch), `partitions(start, end)`
(the tasks; `read` then runs on the executors), and, when the batch has been written,
`commit(end)` -- which Spark calls at the start of the *next* batch, not at the end of this one.
Offsets are Spark's checkpointed offsets, `{"topic": {"0": 23}}`, the next offset to read per
partition (see `odradek.spark.offsets`). Spark writes the end of a batch to its offset log before
the batch runs and replays an unfinished batch with the same start and end after a restart, so a
file sink downstream receives every record exactly once.

* `initialOffset()` -- only for a query without a checkpoint: `startingOffsets` (default latest)
  resolved to real offsets for the partitions that exist now, once per run (Spark asks again
  when it runs the first batch). Spark's own Kafka source also keeps them in the checkpoint so
  that a first batch replayed after a restart starts where it first did; a Python source has no
  access to the checkpoint, so a first batch that never completed is replayed from the newly
  resolved offsets, never past its logged end (see `partitions`).
* `latestOffset(start, limit)` -- the high watermark of every partition the subscription matches
  now, never below `start` (a new leader's HW may briefly trail the old one's: that is no reason
  to go back), capped by `maxOffsetsPerTrigger` when Spark passes it as `ReadMaxRows`, shared
  among partitions by backlog; with `minOffsetsPerTrigger`, the start itself (no batch) while
  fewer records than that wait, until `maxTriggerDelay` (default 15m) has passed since the
  last batch (Spark's rule; PySpark has no composite read limit, so with both options the
  minimum is taken from the options). A partition whose HW cannot be had this time (its leader is
  moving) stays where it is. Partitions that appeared since `start` (new partitions, new topics
  matching `subscribePattern`) are included and start from offset 0, i.e. the earliest.
  With `kafka.isolation.level=read_committed` "high watermark" means the last stable offset
  throughout (ListOffsets under read_committed): a batch ends before the first open transaction
  and the next batch picks it up once it is decided.
* `partitions(start, end)` -- one range per partition with records, split for `minPartitions`.
  A partition in `start` but not in `end` has been deleted: data loss, reported per
  `failOnDataLoss` (raise, or warn and drop it).
* `prepareForTriggerAvailableNow()` -- `Trigger.AvailableNow`: the HWs at that moment become a
  ceiling; later batches never pass them and partitions created afterwards are ignored, so the
  query drains what existed and stops. `maxOffsetsPerTrigger` still splits the drain.
* `commit(end)` -- nothing to do: no offsets are committed to the cluster.

Concurrency: Spark calls one method at a time on the driver. The object is also pickled into the
read function shipped to executors, where only `read` runs; the admin client is not pickled.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from odradek.errors import DataSourceOptionError
from odradek.spark.arrow import arrow_schema
from odradek.spark.offsets import (
    LATEST,
    OffsetRange,
    OffsetSpec,
    PartitionOffsets,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    rate_limit,
)
from odradek.spark.options import SourceOptions
from odradek.spark.reader import (
    RangeReader,
    cluster_offsets,
    report_data_loss,
    resolve_by_time,
    resolve_offsets,
)

__all__ = ["OdradekStreamReader"]

log = logging.getLogger(__name__)

# A partition that appears after the query started is read from here: the first offset of a new
# partition. Were its log start higher (retention already ran), the range reader reports it.
NEW_PARTITION_START = 0


class OdradekStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream reader (see the module docstring)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.view = cluster_offsets(options)
        self._initial: PartitionOffsets | None = None
        self._available_now: PartitionOffsets | None = None
        self._latest_seen: PartitionOffsets | None = None
        # When the last micro-batch was let through (minOffsetsPerTrigger / maxTriggerDelay);
        # 0 lets the first trigger of a run through, as in Spark's Kafka source.
        self._last_trigger_ms = 0

    # -- planning, on the driver ------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks more than once (planning the first batch, then running it): the answer
        # must not move, or the first batch would start after its own end.
        if self._initial is None:
            self._initial = self._resolve_initial()
        return offsets_to_json(self._initial)

    def _resolve_initial(self) -> PartitionOffsets:
        spec = self.options.starting_offsets or OffsetSpec("latest")
        partitions = self.options.subscription.resolve(self.view.topics())
        low = self.view.list_offsets(partitions, "earliest").require()
        high = self.view.list_offsets(partitions, "latest").require()
        if spec.by_time:
            spec = resolve_by_time(
                self.view, spec, partitions, True, self.options.timestamp_strategy
            )
        start = resolve_offsets(spec, partitions, low, high, "startingOffsets", LATEST)
        for tp in partitions:
            if start[tp] < low[tp]:
                report_data_loss(
                    self.options,
                    f"startingOffsets: {start[tp]} for {tp} is below its log start offset "
                    f"{low[tp]}",
                )
                start[tp] = low[tp]
        log.info("initial offsets for %s: %s", self.options.subscription.describe(), start)
        return start

    def _high_watermarks(self, start: PartitionOffsets) -> PartitionOffsets:
        """The HW of every partition the subscription matches now; a partition whose HW cannot
        be listed keeps its `start` (or, if new, waits for a later trigger)."""
        topics = self.view.topics(expect=start)
        partitions = self.options.subscription.resolve(topics)
        # No retries here: a partition without an answer simply waits for the next trigger.
        result = self.view.list_offsets(partitions, "latest", retries=0)
        for tp, error in sorted(result.failed.items()):
            log.warning("no latest offset for %s this trigger (%s): not advancing it", tp, error)
        latest = {}
        for tp in partitions:
            if tp in result.offsets:
                latest[tp] = result.offsets[tp]
            elif tp in start:
                latest[tp] = start[tp]
        return latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets_from_json(start, "start offset")
        latest = self._high_watermarks(begin)
        self._latest_seen = dict(latest)
        if self._available_now is not None:
            ceiling = self._available_now
            latest = {tp: min(hw, ceiling[tp]) for tp, hw in latest.items() if tp in ceiling}
        # Never behind the start: after a leader change the HW may trail for a moment.
        latest = {tp: max(hw, begin.get(tp, NEW_PARTITION_START)) for tp, hw in latest.items()}
        if isinstance(limit, ReadAllAvailable):
            return offsets_to_json(latest)
        if not isinstance(limit, ReadMaxRows | ReadMinRows):
            raise DataSourceOptionError(f"read limit {limit!r} is not supported by odradek")
        # PySpark has no composite read limit: with both options Spark passes ReadMaxRows and
        # the minimum comes from the options here.
        min_rows = (
            limit.min_rows
            if isinstance(limit, ReadMinRows)
            else self.options.min_offsets_per_trigger
        )
        if min_rows is not None and self._delay_batch(min_rows, begin, latest):
            return start
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows, NEW_PARTITION_START)
        return offsets_to_json(latest)

    def _delay_batch(
        self, min_rows: int, begin: PartitionOffsets, latest: PartitionOffsets
    ) -> bool:
        """Spark's `minOffsetsPerTrigger` rule: skip this trigger while fewer than `min_rows`
        records wait, unless `maxTriggerDelay` has passed since the last batch let through.
        `Trigger.AvailableNow` never waits (it must drain and stop; Spark's own source would
        wait up to maxTriggerDelay there)."""
        if self._available_now is not None:
            return False
        now_ms = int(time.time() * 1000)
        if now_ms - self._last_trigger_ms >= self.options.max_trigger_delay_ms:
            self._last_trigger_ms = now_ms
            return False
        waiting = sum(max(0, hw - begin.get(tp, NEW_PARTITION_START)) for tp, hw in latest.items())
        if waiting < min_rows:
            log.debug(
                "delaying the batch: %d records waiting, minOffsetsPerTrigger %d", waiting, min_rows
            )
            return True
        self._last_trigger_ms = now_ms
        return False

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return offsets_to_json(self._latest_seen) if self._latest_seen is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        partitions = self.options.subscription.resolve(self.view.topics())
        self._available_now = self.view.list_offsets(partitions, "latest").require()
        log.info("Trigger.AvailableNow: reading up to %s", self._available_now)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = offsets_from_json(start, "start offset")
        until = offsets_from_json(end, "end offset")
        gone = sorted(set(begin) - set(until))
        if gone:
            last_read = json.dumps(offsets_to_json({tp: begin[tp] for tp in gone}))
            report_data_loss(
                self.options,
                f"{', '.join(str(tp) for tp in gone)} no longer exist (topic deleted?); "
                f"records after offsets {last_read} were not read",
            )
        ranges = []
        for tp, end_offset in sorted(until.items()):
            from_offset = begin.get(tp, NEW_PARTITION_START)
            if end_offset < from_offset and begin == self._initial:
                # The first batch replayed after a restart: its start is `initialOffset` resolved
                # again, and "latest" has moved on since the batch's end was logged (Spark keeps
                # no start for a first batch, and a Python source cannot reach the checkpoint to
                # keep one itself). Read nothing more of this partition in this batch.
                log.warning(
                    "first batch replayed: %s starts at its logged end %d, not at the newly "
                    "resolved initial offset %d; offsets before %d that arrived before the "
                    "first run are not read",
                    tp,
                    end_offset,
                    from_offset,
                    end_offset,
                )
                continue
            if end_offset < from_offset:
                report_data_loss(
                    self.options,
                    f"the offset of {tp} went back from {from_offset} to {end_offset}",
                )
                continue
            ranges.append(OffsetRange(tp.topic, tp.partition, from_offset, end_offset))
        return list(
            plan_ranges(ranges, self.options.min_partitions, self.options.max_records_per_partition)
        )

    def commit(self, end: dict[str, Any]) -> None:
        # Offsets are Spark's to keep (its checkpoint); nothing is committed to the cluster.
        log.debug("batch up to %s committed by Spark", end)

    def stop(self) -> None:
        self.view.close()

    # -- reading, on the executors ----------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return RangeReader(self.options, arrow_schema(self.schema)).batches(partition)
