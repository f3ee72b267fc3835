"""Reading: one offset range per Spark task on the executors, and the batch reader's planning.

`RangeReader.batches(range)` runs in a Spark task. It creates at most one Consumer. First the
fast path (`spark.fetch`) sends Fetch requests to the partition's leader itself and decodes the
record batches natively into Arrow (`spark.decode`); on anything but a healthy read it stops, and
the Consumer carries on from there: it assigns the range's partition at that offset and consumes
until the range's end, yielding an Arrow RecordBatch per chunk of up to `CHUNK_RECORDS` messages.
The Consumer path's steps:

1. Assign at the start offset and consume. Records at or past the range's end are dropped (the
   plan fixed the end; anything later belongs to the next micro-batch). Nothing is asked of the
   leader first: a healthy read costs no extra round trip, and a start below the log start shows
   up as an out-of-range event (step 3).
2. An end-of-partition event before the end is not an error: after a leader change the new
   leader's high watermark can trail the old one for a moment. The reader waits, and gives up
   only after `kafkaConsumer.pollTimeoutMs` without progress (ReadTimeoutError), or, when the
   records are known to be gone and `failOnDataLoss` is false, with a warning.
3. An out-of-range event (the consumer's `auto.offset.reset=error`) is data loss when the position
   is below the log start (retention deleted records the range was planned to include) or the
   topic is gone: with `failOnDataLoss` a DataLossError, otherwise a warning, and the reader
   skips to the log start or stops.

With `kafka.isolation.level=read_committed` the consumer returns only committed records: records
of aborted transactions and control batches (transaction markers) are skipped by librdkafka (from
the aborted-transaction list of each Fetch answer), so the offsets of a range can end in records
that never arrive; a record or an end-of-partition event at or past the range's end ends it.

The batch reader (`spark.read.format("odradek")`) plans on the driver: it resolves the topic
partitions and their earliest and latest offsets once (the high watermark, or under
read_committed the last stable offset, so a range never reaches into an open transaction),
turns `startingOffsets` and `endingOffsets` into one range per partition, and splits them for
`minPartitions`.

Concurrency: a RangeReader belongs to one task (one thread). The batch reader is created, planned
and pickled by Spark; it keeps no client across the pickle.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, Message
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import TopicPartition as RdTopicPartition
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from odradek.errors import (
    DataLossError,
    DataSourceOptionError,
    OdradekError,
    ReadTimeoutError,
    UnknownTopicOrPartitionError,
)
from odradek.spark.arrow import arrow_schema, record_batch
from odradek.spark.clients import ClusterOffsets, consumer_config, translate
from odradek.spark.fetch import fast_path_allowed, fast_read
from odradek.spark.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    OffsetSpec,
    TopicPartition,
    plan_ranges,
)
from odradek.spark.options import SourceOptions
from odradek.spark.worker import freeze_heap_once

__all__ = [
    "CHUNK_RECORDS",
    "OdradekBatchReader",
    "RangeReader",
    "cluster_offsets",
    "report_data_loss",
    "resolve_by_time",
    "resolve_offsets",
]

log = logging.getLogger(__name__)

CHUNK_RECORDS = 10_000
_POLL_S = 0.5


def report_data_loss(options: SourceOptions, message: str) -> None:
    """Spark's `failOnDataLoss`: raise DataLossError, or log a warning and carry on."""
    if options.fail_on_data_loss:
        raise DataLossError(
            f"{message}. Some data may have been lost. If you want the query to continue "
            "regardless, set the source option failOnDataLoss to false."
        )
    log.warning("%s. Some data may have been lost (failOnDataLoss=false: continuing).", message)


def cluster_offsets(options: SourceOptions) -> ClusterOffsets:
    return ClusterOffsets(
        options.bootstrap_servers,
        options.client_params,
        timeout_s=min(10.0, options.poll_timeout_ms / 1000),
        retries=options.fetch_offset_num_retries,
        retry_interval_s=options.fetch_offset_retry_interval_ms / 1000,
        read_committed=options.read_committed,
    )


class RangeReader:
    """Reads offset ranges with one Consumer (see the module docstring). One task thread."""

    def __init__(self, options: SourceOptions, schema: pa.Schema) -> None:
        self.options = options
        self.schema = schema
        self.timeout_s = options.poll_timeout_ms / 1000

    def batches(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange) or partition.size == 0:
            return  # PySpark substitutes InputPartition(None) when a plan has no ranges
        config = consumer_config(
            self.options.bootstrap_servers,
            self.options.client_params,
            self.options.isolation_level,
        )
        created: list[Consumer] = []

        def consumer() -> Consumer:
            # Created when first needed: a fast read whose leader and connection the worker
            # already holds (spark.fetch_pool) needs none.
            if not created:
                try:
                    created.append(Consumer(config))
                except KafkaException as e:
                    raise translate(e, "creating the Kafka consumer") from None
            return created[0]

        try:
            if fast_path_allowed(config):
                # Fetch + native Arrow decoding while the leader is healthy (spark.fetch); the
                # Consumer below takes over from wherever that stops.
                start = yield from fast_read(
                    consumer, partition, self.schema, config, self.timeout_s
                )
                if start >= partition.until_offset:
                    return
                partition = OffsetRange(
                    partition.topic, partition.partition, start, partition.until_offset
                )
            yield from self._read(consumer(), partition)
        finally:
            for client in created:
                client.close()
            freeze_heap_once()  # the worker's modules are all loaded by now (spark.worker)

    def _watermarks(self, consumer: Consumer, tp: RdTopicPartition) -> tuple[int, int] | None:
        """(log start offset, high watermark) from the leader; None if the partition is unknown."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                low, high = consumer.get_watermark_offsets(
                    tp, timeout=min(10.0, self.timeout_s), cached=False
                )
                return int(low), int(high)
            except KafkaException as e:
                error = e.args[0] if e.args else None
                if (
                    isinstance(error, RdKafkaError)
                    and error.code()
                    in (
                        RdKafkaError.UNKNOWN_TOPIC_OR_PART,
                        RdKafkaError._UNKNOWN_PARTITION,
                        RdKafkaError._UNKNOWN_TOPIC,
                    )
                    and self._gone(consumer, tp)
                ):
                    return None
                if time.monotonic() >= deadline:
                    raise translate(
                        e, f"reading the offsets of {tp.topic}-{tp.partition}"
                    ) from None
                # The cached leader may be dead: a metadata request refreshes librdkafka's cache.
                with contextlib.suppress(KafkaException):
                    consumer.list_topics(tp.topic, timeout=_POLL_S * 4)
                time.sleep(_POLL_S)

    def _gone(self, consumer: Consumer, tp: RdTopicPartition) -> bool:
        """Whether fresh metadata confirms that `tp` does not exist. An unknown-partition error
        alone does not say so: librdkafka also raises it locally, without asking any broker, when
        the partition's cached leader was a broker it has since dropped from its metadata (a
        broker that died), and it can keep doing so for minutes."""
        try:
            metadata = consumer.list_topics(tp.topic, timeout=min(10.0, self.timeout_s))
        except KafkaException:
            return False  # no answer is no proof: ask again
        topic = metadata.topics.get(tp.topic)
        if topic is None:
            return False
        if topic.error is not None:
            return bool(topic.error.code() == RdKafkaError.UNKNOWN_TOPIC_OR_PART)
        return tp.partition not in topic.partitions

    def _start_offset(self, consumer: Consumer, r: OffsetRange, position: int) -> int | None:
        """Where reading can start for `r` at `position`: position itself, the log start if
        records were deleted and data loss is tolerated, or None if nothing can be read."""
        tp = RdTopicPartition(r.topic, r.partition)
        marks = self._watermarks(consumer, tp)
        if marks is None:
            report_data_loss(
                self.options,
                f"{r.topic}-{r.partition} no longer exists, offsets [{position}, "
                f"{r.until_offset}) cannot be read",
            )
            return None
        low, _ = marks
        if position < low:
            report_data_loss(
                self.options,
                f"offsets [{position}, {min(low, r.until_offset)}) of {r.topic}-{r.partition} "
                f"were deleted (the log now starts at {low}) before they were read",
            )
            position = low
        return position if position < r.until_offset else None

    def _read(self, consumer: Consumer, r: OffsetRange) -> Iterator[pa.RecordBatch]:
        position = r.from_offset
        consumer.assign([RdTopicPartition(r.topic, r.partition, position)])
        deadline = time.monotonic() + self.timeout_s
        while position < r.until_offset:
            messages = consumer.consume(
                min(CHUNK_RECORDS, r.until_offset - position), timeout=_POLL_S
            )
            # One partition per consumer: records arrive in offset order, events after the
            # records fetched before them.
            records = [
                m for m in messages if m.error() is None and position <= m.offset() < r.until_offset
            ]
            if records:
                # A record (not an event) always has an offset.
                position = records[-1].offset() + 1  # type: ignore[operator]
                deadline = time.monotonic() + self.timeout_s
                yield record_batch(records, r.topic, r.partition, self.schema)
            if any(_reached(m, r.until_offset) for m in messages):
                # Under read_committed the offsets up to the end may hold no record this
                # consumer returns (aborted records, control batches): a later record, or the
                # end of the partition at or past the range's end, says the range is done.
                return
            for message in messages:
                error = message.error()
                if error is None:
                    continue
                resume = self._on_error(consumer, r, position, error)
                if resume is None:
                    return
                if resume != position:
                    position = resume
                    consumer.assign([RdTopicPartition(r.topic, r.partition, position)])
                    break
            if position < r.until_offset and time.monotonic() >= deadline:
                self._timed_out(consumer, r, position)
                return

    def _on_error(
        self, consumer: Consumer, r: OffsetRange, position: int, error: RdKafkaError
    ) -> int | None:
        """Handle a consumer event: the position to continue from, or None to stop reading."""
        code = error.code()
        if code == RdKafkaError._PARTITION_EOF:
            return position  # HW below the planned end for now: keep waiting (step 3)
        if code in (RdKafkaError._AUTO_OFFSET_RESET, RdKafkaError.OFFSET_OUT_OF_RANGE):
            return self._start_offset(consumer, r, position)
        if code in (RdKafkaError.UNKNOWN_TOPIC_OR_PART, RdKafkaError._UNKNOWN_PARTITION):
            if self._watermarks(consumer, RdTopicPartition(r.topic, r.partition)) is None:
                return self._start_offset(consumer, r, position)
            return position
        if error.fatal():
            raise translate(error, f"reading {r.topic}-{r.partition}")
        log.debug("consumer event while reading %s-%s: %s", r.topic, r.partition, error.str())
        return position

    def _timed_out(self, consumer: Consumer, r: OffsetRange, position: int) -> None:
        """No progress for pollTimeoutMs: a timeout, unless the records are known to be gone."""
        where = f"reading {r.topic}-{r.partition} (range [{r.from_offset}, {r.until_offset}))"
        try:
            marks = self._watermarks(consumer, RdTopicPartition(r.topic, r.partition))
        except OdradekError as e:
            raise ReadTimeoutError(
                f"{where}: no record at offset {position} within kafkaConsumer.pollTimeoutMs="
                f"{self.options.poll_timeout_ms} and the leader does not answer: {e}"
            ) from None
        if marks is None:
            report_data_loss(self.options, f"{r.topic}-{r.partition} no longer exists")
            return
        high = marks[1]
        if high > position:
            raise ReadTimeoutError(
                f"{where}: no record at offset {position} within kafkaConsumer.pollTimeoutMs="
                f"{self.options.poll_timeout_ms} although the high watermark is {high}"
            )
        report_data_loss(
            self.options,
            f"offsets [{position}, {r.until_offset}) of {r.topic}-{r.partition} are gone "
            f"(its high watermark is now {high})",
        )


def _reached(message: Message, until_offset: int) -> bool:
    """Whether `message` (a record, or an end-of-partition event, which carries the offset the
    fetch reached) shows the consumer at or past `until_offset`."""
    error = message.error()
    if error is not None and error.code() != RdKafkaError._PARTITION_EOF:
        return False
    offset = message.offset()
    return offset is not None and offset >= until_offset


def resolve_offsets(
    spec: OffsetSpec,
    partitions: list[TopicPartition],
    low: Mapping[TopicPartition, int],
    high: Mapping[TopicPartition, int],
    option: str,
    default: int,
) -> dict[TopicPartition, int]:
    """`spec` as real offsets for `partitions`, -2 / -1 resolved to the log start (`low`) and
    the high watermark (`high`). Partitions a JSON spec leaves out take `default` (EARLIEST or
    LATEST); offsets named for partitions that do not exist are an error naming `option`."""
    given = spec.offsets or {}
    missing = sorted(set(given) - set(partitions))
    if missing:
        raise UnknownTopicOrPartitionError(
            f"{option}: {', '.join(str(tp) for tp in missing)} do not exist"
        )
    result = {}
    for tp in partitions:
        if spec.kind == "earliest":
            offset = EARLIEST
        elif spec.kind == "latest":
            offset = LATEST
        else:
            offset = given.get(tp, default)
        result[tp] = low[tp] if offset == EARLIEST else high[tp] if offset == LATEST else offset
    return result


def resolve_by_time(
    view: ClusterOffsets,
    spec: OffsetSpec,
    partitions: list[TopicPartition],
    starting: bool,
    strategy: str = "error",
) -> OffsetSpec:
    """A `timestamp` or `by_timestamp` spec as specific offsets, as Spark's Kafka source resolves
    them: for each partition the first offset whose timestamp is at or after the given one
    (ListOffsets by timestamp). Where no record is that late, an end is the latest offset, and a
    start fails (`startingOffsetsByTimestampStrategy=error`, Spark's default) or is the latest
    offset (`latest`). A `by_timestamp` spec must name every partition read, as Spark requires."""
    if spec.kind == "timestamp":
        timestamps = {tp: spec.timestamp or 0 for tp in partitions}
    else:
        timestamps = dict(spec.offsets or {})
        if set(timestamps) != set(partitions):
            missing = sorted(set(partitions) - set(timestamps))
            unknown = sorted(set(timestamps) - set(partitions))
            raise DataSourceOptionError(
                f"{spec.option}: a timestamp is needed for every partition read and only for "
                "those"
                + (f"; missing: {', '.join(map(str, missing))}" if missing else "")
                + (f"; not read: {', '.join(map(str, unknown))}" if unknown else "")
            )
    found = view.offsets_for_times(timestamps).require()
    offsets = {}
    for tp in partitions:
        offset = found[tp]
        if offset == LATEST and starting and strategy == "error":
            raise DataSourceOptionError(
                f"{spec.option}: no record of {tp} has a timestamp at or after "
                f"{timestamps[tp]} (set startingOffsetsByTimestampStrategy to 'latest' to "
                "start such partitions at their latest offset)"
            )
        offsets[tp] = offset
    return OffsetSpec("specific", offsets, option=spec.option)


class OdradekBatchReader(DataSourceReader):
    """`spark.read.format("odradek")`: a bounded read planned on the driver."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.view = cluster_offsets(options)

    def partitions(self) -> list[InputPartition]:  # type: ignore[override]
        options = self.options
        starting = options.starting_offsets or OffsetSpec("earliest")
        ending = options.ending_offsets or OffsetSpec("latest")
        try:
            topics = self.view.topics()
            partitions = options.subscription.resolve(topics)
            if options.subscription.kind == "assign":
                missing = sorted(set(options.subscription.assignment) - set(partitions))
                if missing:
                    raise UnknownTopicOrPartitionError(
                        f"assign: {', '.join(str(tp) for tp in missing)} do not exist"
                    )
            if not partitions:
                return []
            low = self.view.list_offsets(partitions, "earliest").require()
            high = self.view.list_offsets(partitions, "latest").require()
            by_time = starting.by_time or ending.by_time
            if starting.by_time:
                starting = resolve_by_time(
                    self.view, starting, partitions, True, options.timestamp_strategy
                )
            if ending.by_time:
                ending = resolve_by_time(self.view, ending, partitions, False)
        finally:
            self.view.close()
        start = resolve_offsets(starting, partitions, low, high, "startingOffsets", EARLIEST)
        end = resolve_offsets(ending, partitions, low, high, "endingOffsets", LATEST)
        ranges = []
        for tp in partitions:
            if end[tp] > high[tp]:
                raise DataSourceOptionError(
                    f"endingOffsets: {end[tp]} for {tp} is past its latest offset {high[tp]}"
                )
            if start[tp] > end[tp] and by_time:
                # A start by timestamp after the end (by timestamp or offset): Spark's Kafka
                # source drops such a range and reads nothing of the partition.
                log.info("%s: start %d after end %d: nothing to read", tp, start[tp], end[tp])
                continue
            if start[tp] > end[tp]:
                raise DataSourceOptionError(
                    f"startingOffsets: {start[tp]} for {tp} is after its ending offset {end[tp]}"
                )
            if start[tp] < low[tp]:
                report_data_loss(
                    options,
                    f"startingOffsets: {start[tp]} for {tp} is below its log start offset "
                    f"{low[tp]}",
                )
                start[tp] = low[tp]
            ranges.append(OffsetRange(tp.topic, tp.partition, start[tp], end[tp]))
        return list(plan_ranges(ranges, options.min_partitions, options.max_records_per_partition))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return RangeReader(self.options, arrow_schema(self.schema)).batches(partition)
