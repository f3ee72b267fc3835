"""The fast path of a sink task: Arrow record batches encoded natively into Kafka record batches
and produced straight to each partition's leader, several Produce requests in flight.

`FastProducer.write(batches)` takes a task's Arrow record batches as Spark hands them over and,
for each, passes the buffers of its `key`, `value`, `headers` and `partition` columns to
`odradek.protocol._encoder.Accumulator` (one per topic), which appends every row as a record to
the open batch of its partition -- no Python work per record:

* partition: the row's `partition` column when given and not null; else, for a key, Kafka's
  default partitioner, toPositive(murmur2(key)) % partitions (the partition Spark's
  `format("kafka")` and any Java producer choose, and librdkafka's `murmur2_random`); keyless
  rows stick to one partition until its batch is full, then move to the next (the Java client's
  sticky partitioner does the same; librdkafka picks a random partition per record);
* batches of about `BATCH_BYTES` (below a broker's default message.max.bytes), CreateTime (the
  time the Arrow batch was appended), no producer id; compressed with `kafka.compression.type`
  (the project's codecs, `protocol.compression`) when set;
* a sealed batch joins the next Produce request (v9, acks=all, the request's timeout from
  `kafka.request.timeout.ms`, default 30 s) to its partition's leader; a request goes out when it
  holds `REQUEST_BYTES` or a second batch of the same partition comes, with at most
  `MAX_IN_FLIGHT` requests in flight per broker (the oldest answer is read before another is
  sent). The leaders come from one Metadata lookup per topic (`layout_of`).

The fast path does not handle trouble. Any partition error in an answer, a connection failure or
timeout, a partition without a leader, a `partition` value outside the topic, a null header key,
a column of another type: the path stops, reads what answers it still can (batches answered
without error are written), and returns a `Leftover`: the batches not known to be written, and
the Arrow batches not encoded yet. The caller (`spark.writer`) produces those with the
confluent-kafka Producer, which retries and reports as before: a batch whose answer was lost may
have been written, so its records may be written twice -- the sink's at-least-once guarantee,
unchanged. Leftover batches go back to the partition they were built for.

Concurrency: one task thread; every socket is closed before `write` returns.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from odradek.protocol._encoder import Accumulator

from odradek.protocol import compression
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class
from odradek.spark.wire import BrokerSocket, WireError

__all__ = [
    "BATCH_BYTES",
    "CODECS",
    "MAX_IN_FLIGHT",
    "REQUEST_BYTES",
    "FastPathStop",
    "FastProducer",
    "Leftover",
    "SealedBatch",
    "TopicLayout",
]

log = logging.getLogger(__name__)

PRODUCE_VERSION = 9
BATCH_BYTES = 512 * 1024
REQUEST_BYTES = 4 * 1024 * 1024
MAX_IN_FLIGHT = 5
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_MAX_RESPONSE = 1 << 20


@dataclass(frozen=True)
class TopicLayout:
    """A topic's partition count and each partition's leader (host, port)."""

    partitions: int
    leaders: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class SealedBatch:
    """One encoded batch of one partition: `records` records in `batch` (a whole v2 batch)."""

    topic: str
    partition: int
    records: int
    batch: bytes


@dataclass
class Leftover:
    """What the fast path did not write: batches not known to be written, then Arrow batches."""

    unconfirmed: list[SealedBatch]
    remaining: Iterator[pa.RecordBatch]

    @property
    def unconfirmed_records(self) -> int:
        return sum(b.records for b in self.unconfirmed)


class FastPathStop(Exception):
    """Leave the fast path (the message says why); `layout_of` raises it for a topic the fast
    path cannot write (a partition without a leader)."""


@dataclass
class _Leader:
    """One broker: its connection, the request being filled, the requests in flight."""

    connection: BrokerSocket
    pending: dict[tuple[str, int], SealedBatch] = field(default_factory=dict)
    pending_bytes: int = 0
    in_flight: deque[list[SealedBatch]] = field(default_factory=deque)


def _binary(array: pa.Array) -> tuple[Any, ...] | None:
    """A binary or string column's buffers as `_encoder` takes them; None when all null."""
    if array.null_count == len(array):
        return None
    if pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(pa.binary())
    elif not (pa.types.is_binary(array.type) or pa.types.is_string(array.type)):
        raise FastPathStop(f"a column of type {array.type}")
    validity, offsets, data = array.buffers()
    return (validity if array.null_count else None, offsets, data, array.offset)


def _headers(array: pa.Array) -> tuple[Any, ...] | None:
    if array.null_count == len(array):
        return None
    if not pa.types.is_list(array.type):
        raise FastPathStop(f"headers of type {array.type}")
    entries = array.values
    if entries.null_count:
        raise FastPathStop("a null header")
    keys, values = entries.field(0), entries.field(1)
    key_spec = _binary(keys)
    if key_spec is None and len(keys):
        raise FastPathStop("a null header key")
    empty = (None, pa.py_buffer(b"\0\0\0\0"), None, 0)
    return (
        array.buffers()[0] if array.null_count else None,
        array.buffers()[1],
        array.offset,
        key_spec or empty,
        _binary(values),
    )


def _partitions(array: pa.Array) -> tuple[Any, ...] | None:
    if array.null_count == len(array):
        return None
    if not pa.types.is_int32(array.type):
        raise FastPathStop(f"partition of type {array.type}")
    validity, values = array.buffers()
    return (validity if array.null_count else None, values, array.offset)


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


class FastProducer:
    """Writes a task's rows on the fast path; see the module docstring. One task thread."""

    def __init__(
        self,
        layout_of: Callable[[str], TopicLayout],
        on_written: Callable[[SealedBatch, int], None],
        topic: str | None,
        codec: str = "none",
        request_timeout_ms: int = 30_000,
        client_id: str = "odradek-spark-writer",
    ) -> None:
        self.layout_of = layout_of
        self.on_written = on_written
        self.topic = topic
        self.codec = CODECS[codec]
        self.request_timeout_ms = request_timeout_ms
        self.client_id = client_id
        self.written_records = 0
        self._topics: dict[str, tuple[TopicLayout, Accumulator]] = {}
        self._leaders: dict[tuple[str, int], _Leader] = {}
        self._request = request_class(ApiKey.PRODUCE, PRODUCE_VERSION)
        self._failed: list[SealedBatch] = []
        self._undispatched: deque[SealedBatch] = deque()

    # -- encoding ---------------------------------------------------------------------------

    def _topic(self, topic: str) -> tuple[TopicLayout, Accumulator]:
        found = self._topics.get(topic)
        if found is None:
            layout = self.layout_of(topic)
            accumulator = Accumulator(
                layout.partitions,
                BATCH_BYTES,
                random.randrange(layout.partitions),
                self.codec,
                partial(compression.compress, self.codec) if self.codec else None,
            )
            found = self._topics[topic] = (layout, accumulator)
        return found

    def _split(self, batch: pa.RecordBatch) -> list[tuple[str, pa.RecordBatch]]:
        """The batch's rows per topic (the `topic` option, or the `topic` column's values)."""
        if self.topic is not None:
            return [(self.topic, batch)]
        column = _column(batch, "topic")
        if column is None or column.null_count:
            raise FastPathStop("rows without a topic")
        topics = pc.unique(column).to_pylist()
        if len(topics) == 1:
            return [(topics[0], batch)]
        return [(t, batch.filter(pc.equal(column, t))) for t in topics]

    def _append(self, topic: str, batch: pa.RecordBatch) -> None:
        """Encode the rows of `batch` into `topic`'s batches: all of them, or (FastPathStop)
        none."""
        _, accumulator = self._topic(topic)
        key, headers, partition = (_column(batch, n) for n in ("key", "headers", "partition"))
        value = _column(batch, "value")
        try:
            accumulator.append(
                batch.num_rows,
                None if key is None else _binary(key),
                None if value is None else _binary(value),
                None if headers is None else _headers(headers),
                None if partition is None else _partitions(partition),
                time.time_ns() // 1_000_000,
            )
        except ValueError as e:
            raise FastPathStop(f"{topic}: {e}") from None

    # -- sending ----------------------------------------------------------------------------

    def _dispatch(self, topic: str) -> None:
        """Sealed batches of `topic` into requests to their leaders. A batch leaves
        `_undispatched` only once it is in a request, so a stop midway loses none."""
        accumulator = self._topics[topic][1]
        self._undispatched.extend(SealedBatch(topic, *taken) for taken in accumulator.take())
        while self._undispatched:
            sealed = self._undispatched[0]
            layout = self._topics[sealed.topic][0]
            leader = self._leader(layout.leaders[sealed.partition])
            key = (sealed.topic, sealed.partition)
            if key in leader.pending:
                self._flush(leader)
            leader.pending[key] = sealed
            leader.pending_bytes += len(sealed.batch)
            self._undispatched.popleft()
            if leader.pending_bytes >= REQUEST_BYTES:
                self._flush(leader)

    def _leader(self, address: tuple[str, int]) -> _Leader:
        leader = self._leaders.get(address)
        if leader is None:
            connection = BrokerSocket(
                address[0],
                address[1],
                self.request_timeout_ms / 1000 + 15,
                ApiKey.PRODUCE,
                PRODUCE_VERSION,
                self.client_id,
                _MAX_RESPONSE,
            )
            leader = self._leaders[address] = _Leader(connection)
        return leader

    def _flush(self, leader: _Leader) -> None:
        if not leader.pending:
            return
        while leader.connection.in_flight >= MAX_IN_FLIGHT:
            self._settle(leader)
        batches = list(leader.pending.values())
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for b in batches:
            by_topic.setdefault(b.topic, []).append({"index": b.partition, "records": b.batch})
        request = build(
            self._request,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout": self.request_timeout_ms,
                "topic_data": [
                    {"name": t, "partition_data": parts} for t, parts in by_topic.items()
                ],
            },
        )
        leader.in_flight.append(batches)
        leader.pending.clear()
        leader.pending_bytes = 0
        leader.connection.send(request)

    def _settle(self, leader: _Leader) -> None:
        """Read the oldest answer of `leader`; FastPathStop when a partition was refused."""
        response = leader.connection.receive()
        sent = {(b.topic, b.partition): b for b in leader.in_flight.popleft()}
        refused = []
        for topic in response.responses:
            for answer in topic.partition_responses:
                b = sent.pop((topic.name, answer.index), None)
                if b is None:
                    continue
                if int(answer.error_code) != 0:
                    refused.append(f"{b.topic}-{b.partition}: {answer.error_code.name}")
                    self._failed.append(b)
                else:
                    self.written_records += b.records
                    self.on_written(b, int(answer.base_offset))
        self._failed.extend(sent.values())
        if refused or sent:
            raise FastPathStop("; ".join(refused) or "an answer without every partition")

    # -- the task ---------------------------------------------------------------------------

    def write(self, batches: Iterator[pa.RecordBatch]) -> Leftover | None:
        """Write `batches`; None when every row was written, else what is left (module doc)."""
        current: list[tuple[str, pa.RecordBatch]] = []
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                current = [("", batch)]  # until it is split, a stop leaves all of it
                current = self._split(batch)
                while current:
                    topic, rows = current[0]
                    self._append(topic, rows)
                    current.pop(0)  # encoded: from here on, its rows are in the accumulator
                    self._dispatch(topic)
            for topic, (_, accumulator) in self._topics.items():
                accumulator.seal_all()
                self._dispatch(topic)
            for leader in self._leaders.values():
                self._flush(leader)
                while leader.in_flight:
                    self._settle(leader)
            return None
        except (FastPathStop, WireError) as e:
            log.info("fast write path stopped (%s): the producer writes the rest", e)
            return self._leftover([b for _, b in current], batches)
        finally:
            for leader in self._leaders.values():
                leader.connection.close()

    def _leftover(self, current: list[pa.RecordBatch], rest: Iterator[pa.RecordBatch]) -> Leftover:
        """After a stop: settle what can still be settled, gather every batch not written."""
        for leader in self._leaders.values():
            while leader.in_flight:
                try:
                    self._settle(leader)
                except FastPathStop:
                    continue  # that request's refused batches are in _failed; go on
                except WireError:
                    break  # the rest of this broker's requests stay unconfirmed
        unconfirmed = list(self._failed) + list(self._undispatched)
        self._undispatched.clear()
        for leader in self._leaders.values():
            for sent in leader.in_flight:
                unconfirmed.extend(sent)
            unconfirmed.extend(leader.pending.values())
            leader.in_flight.clear()
            leader.pending.clear()
        for topic, (_, accumulator) in self._topics.items():
            accumulator.seal_all()
            unconfirmed.extend(SealedBatch(topic, *t) for t in accumulator.take())
        self._failed = []

        def remaining() -> Iterator[pa.RecordBatch]:
            yield from current
            yield from rest

        return Leftover(unconfirmed, remaining())
