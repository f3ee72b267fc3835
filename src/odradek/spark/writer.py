"""Writing: `df.write.format("odradek")` and `df.writeStream.format("odradek")`.

Columns, as Spark's Kafka sink takes them: `value` (string or binary, required; null writes a
tombstone), `key` (string or binary, optional), `topic` (string; required unless the `topic`
option is given, which then wins over the column), `partition` (int, optional; null or absent lets
the partitioner choose, murmur2 of the key like Java clients), `headers` (array of struct<key
string, value binary>, optional). Other columns are ignored.

Each Spark task writes its rows on the fast path (`odradek.spark.produce`: record batches
encoded natively from the Arrow columns, Produce requests with acks=all straight to the leaders)
when it applies: not with `exactlyOnce`, not with a `security.protocol` other than PLAINTEXT, not
with `odradek.writePath=producer`. Whatever the fast path does not write -- every row after any
trouble, and the batches whose answer did not come back clean -- goes through the Producer path:
one Producer (`acks=all`, retries on, see `odradek.spark.clients`) that flushes and checks the
delivery report of every record before the task returns its commit message. Any failed delivery
raises DeliveryError in the task, so Spark retries the task; if it gives up, the job's (or
micro-batch's) `abort` runs on the driver and logs what the successful tasks had already
written. Records stay written: by default a topic sink is
at-least-once (a retried task writes its rows again), unlike a file sink, which Spark makes
exactly-once. A streaming write with `exactlyOnce=true` writes each task's rows in one Kafka
transaction and skips tasks of a replayed micro-batch that had committed
(`odradek.spark.exactly_once`): exactly-once for read_committed readers.

A topic that does not exist is created by the first write when the cluster allows it
(`auto.create.topics.enable`); when it does not, the write fails at once with
UnknownTopicOrPartitionError, on the driver for the `topic` option and in the task for topics from
the `topic` column, instead of after librdkafka's metadata wait.

Concurrency: writers are created and pickled by Spark on the driver; `write` runs in one task
thread on an executor with its own Producer; `commit` and `abort` run on the driver.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

from odradek.errors import (
    DataSourceOptionError,
    DataSourceSchemaError,
    DeliveryError,
    UnknownTopicOrPartitionError,
)
from odradek.spark.arrow import arrow_schema, source_schema
from odradek.spark.clients import admin_config, producer_config, translate
from odradek.spark.decode import ArrowDecoder
from odradek.spark.exactly_once import (
    TXN_TIMEOUT_S,
    TransactionCallHung,
    TransactionLedger,
    bounded,
    task_identity,
)
from odradek.spark.fetch import fast_path_allowed
from odradek.spark.options import SinkOptions
from odradek.spark.produce import FastPathStop, FastProducer, SealedBatch, TopicLayout
from odradek.spark.worker import freeze_heap_once

__all__ = ["OdradekBatchWriter", "OdradekStreamWriter", "WriteReport", "check_sink_schema"]

log = logging.getLogger(__name__)

# librdkafka's delivery timeout; Spark's Kafka sink inherits 120 s from the Java producer.
DEFAULT_MESSAGE_TIMEOUT_MS = 120_000
_METADATA_TIMEOUT_S = 30.0


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote: the number of records acknowledged, and per (topic, partition) the
    offsets of the first and the last acknowledgement received (with retries and several requests
    in flight, records of a partition may land out of order, so these bound the task's records
    only approximately). Travels back to the driver for commit / abort."""

    records: int = 0
    skipped: int = 0  # rows of a micro-batch this task had committed before (exactlyOnce)
    first_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    last_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def describe(self) -> str:
        parts = ", ".join(
            f"{t}-{p} from offset {first} to {self.last_offsets[(t, p)]}"
            for (t, p), first in sorted(self.first_offsets.items())
        )
        skipped = f", {self.skipped} skipped (committed before)" if self.skipped else ""
        return f"{self.records} records{skipped}" + (f" ({parts})" if parts else "")


def _is_text_or_bytes(t: DataType) -> bool:
    return isinstance(t, StringType | BinaryType)


def check_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """DataSourceSchemaError naming the column when a written DataFrame cannot be produced."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise DataSourceSchemaError("required column 'value' (string or binary) not found")
    for name in ("value", "key"):
        if name in fields and not _is_text_or_bytes(fields[name]):
            raise DataSourceSchemaError(
                f"column '{name}' must be string or binary, not {fields[name].simpleString()}"
            )
    if options.topic is None:
        if "topic" not in fields:
            raise DataSourceSchemaError(
                "no topic: give the 'topic' option or a string column 'topic'"
            )
        if not isinstance(fields["topic"], StringType):
            raise DataSourceSchemaError(
                f"column 'topic' must be string, not {fields['topic'].simpleString()}"
            )
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise DataSourceSchemaError(
            f"column 'partition' must be int, not {fields['partition'].simpleString()}"
        )
    if "headers" in fields:
        headers = fields["headers"]
        element = headers.elementType if isinstance(headers, ArrayType) else None
        names = (
            [(f.name, type(f.dataType)) for f in element.fields]
            if isinstance(element, StructType)
            else None
        )
        if names != [("key", StringType), ("value", BinaryType)]:
            raise DataSourceSchemaError(
                "column 'headers' must be array<struct<key:string,value:binary>>, not "
                f"{headers.simpleString()}"
            )


def check_topic_exists(options: SinkOptions) -> None:
    """For the `topic` option: UnknownTopicOrPartitionError now if the topic does not exist and
    the cluster will not create it (asking for a topic's metadata creates it when allowed)."""
    if options.topic is None:
        return
    admin = AdminClient(admin_config(options.bootstrap_servers, options.client_params))
    _check_topics(admin, [options.topic])


def _check_topics(client: Any, topics: list[str]) -> None:
    for topic in topics:
        _topic_metadata(client, topic)


def _topic_metadata(client: Any, topic: str) -> Any:
    """The cluster's metadata for `topic` (librdkafka's ClusterMetadata), or
    UnknownTopicOrPartitionError when it does not exist and will not be created."""
    try:
        metadata = client.list_topics(topic=topic, timeout=_METADATA_TIMEOUT_S)
    except KafkaException as e:
        raise translate(e, f"reading the metadata of topic {topic!r}") from None
    entry = metadata.topics.get(topic)
    error = entry.error if entry is not None else None
    if entry is None or (
        error is not None
        and error.code() in (RdKafkaError.UNKNOWN_TOPIC_OR_PART, RdKafkaError._UNKNOWN_TOPIC)
    ):
        raise UnknownTopicOrPartitionError(
            f"topic {topic!r} does not exist and the cluster does not create topics on "
            "demand (auto.create.topics.enable=false): create it first"
        )
    return metadata


def fast_write_allowed(options: SinkOptions) -> bool:
    """Whether a task may write on the fast path (`spark.produce`): see the module docstring."""
    return (
        options.write_path == "auto"
        and not options.exactly_once
        and fast_path_allowed(options.client_params)
    )


class _TaskProducer:
    """Produces one task's rows and checks every delivery report. One task thread."""

    def __init__(self, options: SinkOptions, transactional_id: str | None = None) -> None:
        params = dict(options.client_params)
        params.setdefault("message.timeout.ms", str(DEFAULT_MESSAGE_TIMEOUT_MS))
        if transactional_id is not None:
            # librdkafka wants a record's delivery timeout within the transaction's.
            params.setdefault("transaction.timeout.ms", params["message.timeout.ms"])
        self.options = options
        self.flush_timeout_s = int(params["message.timeout.ms"]) / 1000 + 30
        try:
            self.producer = Producer(
                producer_config(options.bootstrap_servers, params, transactional_id)
            )
        except KafkaException as e:
            raise translate(e, "creating the Kafka producer") from None
        self.report = WriteReport()
        self._first = self.report.first_offsets
        self._last = self.report.last_offsets
        self.failures: list[tuple[RdKafkaError, str]] = []
        self.failed = 0
        self.checked_topics: set[str] = set()

    def _on_delivery(self, error: RdKafkaError | None, message: Any) -> None:
        if error is not None:
            self.failed += 1
            if len(self.failures) < 5:
                self.failures.append((error, f"{message.topic()}-{message.partition()}"))
            return
        # Called once per record: kept to two dictionary stores.
        key = (message.topic(), message.partition())
        offset = message.offset()
        self._first.setdefault(key, offset)
        self._last[key] = offset

    def _column(self, batch: pa.RecordBatch, name: str) -> list[Any] | None:
        index = batch.schema.get_field_index(name)
        return None if index < 0 else batch.column(index).to_pylist()

    def _topics(self, batch: pa.RecordBatch) -> list[Any] | None:
        """The topic of each row, or None when the `topic` option names one for all; every
        topic is checked to exist (or be creatable) once per task."""
        if self.options.topic is not None:
            topics = [self.options.topic]
            column = None
        else:
            column = batch.column(batch.schema.get_field_index("topic"))
            if column.null_count:
                raise DataSourceSchemaError(
                    "a row has a null 'topic' and no 'topic' option was given"
                )
            topics = pc.unique(column).to_pylist()
        new = [t for t in topics if t not in self.checked_topics]
        if new:
            _check_topics(self.producer, new)
            self.checked_topics.update(new)
        return None if column is None else column.to_pylist()

    def _produce_slowly(
        self, topic: str, value: Any, key: Any, partition: int, headers: Any
    ) -> None:
        """produce() once the local queue was full: serve delivery reports until there is room."""
        while True:
            self.producer.poll(0.05)
            try:
                self.producer.produce(
                    topic, value, key, partition, on_delivery=self._on_delivery, headers=headers
                )
                return
            except BufferError:
                continue
            except KafkaException as e:
                raise translate(e, f"producing to {topic}") from None

    def write(self, batches: Iterator[pa.RecordBatch]) -> WriteReport:
        produced = 0
        produce = self.producer.produce
        on_delivery = self._on_delivery
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            topics = self._topics(batch)
            values = self._column(batch, "value") or [None] * n
            keys = self._column(batch, "key") or [None] * n
            partitions = self._column(batch, "partition")
            headers = self._column(batch, "headers")
            try:
                if topics is None and partitions is None and headers is None:
                    # The common case, kept to one call per row.
                    only_topic = str(self.options.topic)
                    for value, key in zip(values, keys, strict=True):
                        try:
                            produce(only_topic, value, key, on_delivery=on_delivery)
                        except BufferError:
                            self._produce_slowly(only_topic, value, key, -1, None)
                else:
                    for i in range(n):
                        topic = self.options.topic if topics is None else topics[i]
                        partition = partitions[i] if partitions is not None else None
                        header = headers[i] if headers is not None else None
                        args = (
                            topic,
                            values[i],
                            keys[i],
                            -1 if partition is None else partition,
                            [(h["key"], h["value"]) for h in header] if header else None,
                        )
                        try:
                            produce(*args[:4], on_delivery=on_delivery, headers=args[4])
                        except BufferError:
                            self._produce_slowly(*args)
            except KafkaException as e:
                raise translate(e, "producing") from None
            produced += n
            self.producer.poll(0)
        self._flush(produced)
        self.report.records += produced
        return self.report

    def _layout(self, topic: str) -> TopicLayout:
        """`topic`'s partitions and their leaders, for the fast path (FastPathStop when a
        partition has no leader the metadata names)."""
        metadata = _topic_metadata(self.producer, topic)
        entry = metadata.topics[topic]
        if entry.error is not None or not entry.partitions:
            raise FastPathStop(f"topic {topic}: {entry.error or 'no partitions'}")
        leaders = []
        for partition in range(len(entry.partitions)):
            found = entry.partitions.get(partition)
            broker = metadata.brokers.get(found.leader) if found is not None else None
            if broker is None:
                raise FastPathStop(f"{topic}-{partition} has no leader")
            leaders.append((broker.host, broker.port))
        self.checked_topics.add(topic)
        return TopicLayout(len(leaders), tuple(leaders))

    def _on_fast_write(self, batch: SealedBatch, base_offset: int) -> None:
        key = (batch.topic, batch.partition)
        self._first.setdefault(key, base_offset)
        self._last[key] = base_offset + batch.records - 1

    def write_fast(self, batches: Iterator[pa.RecordBatch]) -> WriteReport:
        """The task's rows on the fast path; what it leaves goes through `write`."""
        params = self.options.client_params
        fast = FastProducer(
            self._layout,
            self._on_fast_write,
            self.options.topic,
            self.options.compression_type,
            _int_param(params, "request.timeout.ms", 30_000),
            params.get("client.id", "odradek-spark-writer"),
        )
        leftover = fast.write(batches)
        self.report.records += fast.written_records
        if leftover is None:
            return self.report
        log.warning(
            "fast write path stopped after %d records; %d records of batches not known to be "
            "written, and the rows not encoded yet, go through the producer",
            fast.written_records,
            leftover.unconfirmed_records,
        )
        return self.write(itertools.chain(_rows(leftover.unconfirmed), leftover.remaining))

    def _flush(self, produced: int) -> None:
        deadline = time.monotonic() + self.flush_timeout_s
        remaining = self.producer.flush(self.flush_timeout_s)
        while remaining and time.monotonic() < deadline:
            remaining = self.producer.flush(max(0.1, deadline - time.monotonic()))
        if self.failed or remaining:
            examples = "; ".join(f"{where}: {e.str()} ({e.name()})" for e, where in self.failures)
            raise DeliveryError(
                f"{self.failed} of {produced} records were not delivered"
                + (f" and {remaining} got no delivery report" if remaining else "")
                + (f" (e.g. {examples})" if examples else ""),
                code=_broker_code(self.failures[0][0]) if self.failures else None,
            )


def _int_param(params: Any, name: str, default: int) -> int:
    try:
        return int(params.get(name, default))
    except ValueError:
        return default  # librdkafka refused it already, when the Producer was created


_LEFTOVER_SCHEMA = arrow_schema(source_schema(include_headers=True))


def _rows(batches: list[SealedBatch]) -> Iterator[pa.RecordBatch]:
    """Encoded batches back into rows (with their topic and partition) for the Producer path."""
    for b in batches:
        decoder = ArrowDecoder(b.topic, b.partition, _LEFTOVER_SCHEMA)
        decoder.add(b.batch, 0, b.records)
        yield decoder.take()


def write_task(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> WriteReport:
    """One task's rows: on the fast path when it applies, else produced as they come, or with
    `exactlyOnce` in one transaction."""
    try:
        return _write_task(options, batches)
    finally:
        freeze_heap_once()  # the worker's modules are all loaded by now (spark.worker)


def _write_task(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> WriteReport:
    if not options.exactly_once:
        task = _TaskProducer(options)
        return task.write_fast(batches) if fast_write_allowed(options) else task.write(batches)
    identity = task_identity()
    assert options.topic is not None  # SinkOptions.parse requires it with exactlyOnce
    task = _TaskProducer(options, identity.transactional_id)
    ledger = TransactionLedger(
        options.bootstrap_servers, dict(options.client_params), identity, options.topic
    )
    producer = task.producer
    try:
        # Fences earlier attempts of this task and settles their open transaction first.
        bounded(lambda: producer.init_transactions(TXN_TIMEOUT_S), "init_transactions")
        if ledger.already_committed():
            task.report.skipped = sum(batch.num_rows for batch in batches)
            log.info(
                "micro-batch %d task %d was committed before: %d rows not written again",
                identity.batch_id,
                identity.partition_id,
                task.report.skipped,
            )
            return task.report
        producer.begin_transaction()
        try:
            report = task.write(batches)
            ledger.record(producer)
            bounded(lambda: producer.commit_transaction(TXN_TIMEOUT_S), "commit_transaction")
        except TransactionCallHung:
            raise  # the producer is held by the blocked call: the retry's init fences it
        except BaseException:
            with contextlib.suppress(KafkaException, TransactionCallHung):
                bounded(lambda: producer.abort_transaction(TXN_TIMEOUT_S), "abort_transaction")
            raise
        return report
    except KafkaException as e:
        raise translate(
            e, f"micro-batch {identity.batch_id}, transaction {identity.transactional_id}"
        ) from None
    finally:
        ledger.close()


def _broker_code(error: RdKafkaError) -> ErrorCode | None:
    """The Kafka error code of a broker error (librdkafka's local errors are negative)."""
    try:
        return ErrorCode(error.code()) if error.code() > 0 else None
    except ValueError:
        return None


def _log_abort(what: str, messages: list[WriterCommitMessage | None]) -> None:
    written = [m for m in messages if isinstance(m, WriteReport)]
    total = sum(m.records for m in written)
    failed_tasks = sum(1 for m in messages if m is None)
    log.warning(
        "%s aborted (%d task(s) failed). Records already written stay in their topics (the "
        "odradek sink is at-least-once): %d records from %d task(s)%s",
        what,
        failed_tasks,
        total,
        len(written),
        "".join(f"\n  {m.describe()}" for m in written),
    )


class OdradekBatchWriter(DataSourceArrowWriter):
    """`df.write.format("odradek")` (append only: a topic cannot be overwritten)."""

    def __init__(self, options: SinkOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise DataSourceOptionError(
                "mode('overwrite') is not supported: a topic is append-only; use mode('append')"
            )
        if options.exactly_once:
            raise DataSourceOptionError(
                "exactlyOnce applies to streaming writes (writeStream), whose micro-batches "
                "Spark may replay; a batch write is at-least-once"
            )
        check_sink_schema(schema, options)
        check_topic_exists(options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return write_task(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.records for m in messages if isinstance(m, WriteReport))
        log.info("odradek write committed: %d records from %d task(s)", total, len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_abort("odradek write", messages)


class OdradekStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("odradek")`: every micro-batch appended to the topic(s)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema, options)
        check_topic_exists(options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return write_task(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        reports = [m for m in messages if isinstance(m, WriteReport)]
        log.info(
            "odradek micro-batch %d committed: %d records (%d skipped: written before a replay)",
            batchId,
            sum(m.records for m in reports),
            sum(m.skipped for m in reports),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            log.warning(
                "odradek micro-batch %d aborted; the tasks that committed their transaction "
                "are skipped when Spark replays it:%s",
                batchId,
                "".join(f"\n  {m.describe()}" for m in messages if isinstance(m, WriteReport)),
            )
            return
        _log_abort(f"odradek micro-batch {batchId}", messages)
