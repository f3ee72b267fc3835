"""The fast path of a range read: Fetch requests straight to the partition's leader, decoded into
Arrow by `spark.decode`, with the next Fetch in flight while the previous response is decoded.

`fast_read(consumer, r, schema, config)` reads as much of the offset range `r` as a healthy leader
serves and returns (through `StopIteration`'s value, i.e. `yield from`) the offset where it
stopped. It does not handle trouble: any error code, connection failure, timeout, a range the
leader's high watermark does not reach yet, or records it cannot decode ends the fast path
quietly, and the reader's Consumer path (`spark.reader`) carries on from that offset with its
retries, leader changes and `failOnDataLoss` rules. A rows chunk is only yielded once its rows are
all decoded, so the two paths never yield an offset twice.

The leader comes from the reader's Consumer's metadata (one Metadata request), or from what an
earlier task in the same Python worker learnt (`spark.fetch_pool`, which also keeps idle
connections for the next task). Only PLAINTEXT
connections take this path: with `security.protocol` set to anything else the reader uses the
Consumer for everything. `isolation.level=read_committed` in the consumer's configuration fetches
with isolation level 1 and drops aborted transactions' batches (see `spark.decode`).

Each Fetch (v11: topic names, no fetch session) asks for up to `FETCH_MAX_BYTES` of the one
partition; the response is read in place (`spark.fetch_response`: the records stay in the
connection's receive buffer until the decoder copies them into Arrow columns); a response's rows
are appended to the decoder and yielded as a RecordBatch once `CHUNK_ROWS` rows (or `CHUNK_BYTES`
of keys and values) are held, and at the end of the range.

Concurrency: one task thread; the connection is back in the pool, or closed, when `fast_read`
returns.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException

from odradek.errors import OdradekError
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, ProtocolError, request_class
from odradek.protocol.record_batch import BatchHeader, iter_batches
from odradek.spark.decode import ArrowDecoder
from odradek.spark.fetch_pool import POOL, FetchPool
from odradek.spark.fetch_response import FetchedPartition, read_fetch_partition
from odradek.spark.offsets import OffsetRange
from odradek.spark.wire import BrokerSocket, WireError

__all__ = ["CHUNK_BYTES", "CHUNK_ROWS", "FETCH_MAX_BYTES", "fast_path_allowed", "fast_read"]

log = logging.getLogger(__name__)

FETCH_VERSION = 11
# Small fetches and chunks decode faster than large ones: a 4 MiB answer stays in the CPU's
# caches while it is decoded, and ~100K-row chunks (~12 MB of columns) reuse memory the allocator
# already holds. Measured outside Spark on 3M rows of 100 B: 32 MiB fetches with 200K-row chunks
# cost 130-150 ns of reader CPU per row, 4 MiB with 100K-row chunks 67-69 ns; in Spark the JVM
# also spends less per row on 100K-row batches (the Arrow ceiling's batch size) than on 300K.
FETCH_MAX_BYTES = 4 * 1024 * 1024
CHUNK_ROWS = 100_000
CHUNK_BYTES = 64 * 1024 * 1024
_MAX_WAIT_MS = 500
# A batch larger than the fetch size still comes whole (Kafka returns the first batch however
# large): accept responses up to the size the reader always accepted.
_MAX_RESPONSE = 65 * 1024 * 1024


def fast_path_allowed(config: Mapping[str, Any]) -> bool:
    """Whether a reader's consumer configuration allows the fast path (plaintext only)."""
    return str(config.get("security.protocol", "plaintext")).lower() == "plaintext"


class _Stop(Exception):
    """Leave the fast path; the Consumer path continues from the position reached."""


def _leader(consumer: Consumer, topic: str, partition: int, timeout_s: float) -> tuple[str, int]:
    metadata = consumer.list_topics(topic, timeout=timeout_s)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or partition not in found.partitions:
        raise _Stop("no metadata for the partition")
    leader = found.partitions[partition].leader
    broker = metadata.brokers.get(leader)
    if broker is None:
        raise _Stop("the partition has no leader")
    return broker.host, broker.port


def _request(r: OffsetRange, position: int, isolation_level: int) -> Any:
    return build(
        request_class(ApiKey.FETCH, FETCH_VERSION),
        {
            "replica_id": -1,
            "max_wait": datetime.timedelta(milliseconds=_MAX_WAIT_MS),
            "min_bytes": 1,
            "max_bytes": FETCH_MAX_BYTES,
            "isolation_level": isolation_level,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": r.topic,
                    "partitions": [
                        {
                            "partition": r.partition,
                            "current_leader_epoch": -1,
                            "fetch_offset": position,
                            "log_start_offset": -1,
                            "partition_max_bytes": FETCH_MAX_BYTES,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )


def _partition_data(frame: memoryview, r: OffsetRange) -> FetchedPartition:
    error_code, item = read_fetch_partition(frame, r.topic, r.partition)
    if error_code != 0:
        raise _Stop(f"fetch error {error_code}")
    if item is None:
        raise _Stop("the response lacks the partition")
    if item.error_code != 0:
        raise _Stop(f"partition error {item.error_code}")
    return item


def _batches(records: memoryview | None, position: int) -> tuple[list[BatchHeader], int]:
    """The complete batches in `records`, and the offset after the last (`position` if none)."""
    headers = list(iter_batches(records)) if records else []
    return headers, max([position, *(h.next_offset for h in headers)])


def _connect(address: tuple[str, int], timeout_s: float) -> BrokerSocket:
    return BrokerSocket(
        address[0],
        address[1],
        _socket_timeout(timeout_s),
        ApiKey.FETCH,
        FETCH_VERSION,
        "odradek-spark-reader",
        _MAX_RESPONSE,
    )


def _socket_timeout(timeout_s: float) -> float:
    return min(30.0, timeout_s + _MAX_WAIT_MS / 1000)


def fast_read(
    consumer: Callable[[], Consumer],
    r: OffsetRange,
    schema: pa.Schema,
    config: Mapping[str, Any],
    timeout_s: float,
    pool: FetchPool = POOL,
) -> Iterator[pa.RecordBatch]:
    """Yield RecordBatches of `r` from its start; the generator's value is where it stopped.

    `consumer()` gives the reader's Consumer (created on first call): it is asked for the leader
    only when `pool` does not know it. The connection comes from `pool` when one is idle there,
    and goes back to it when the read ended cleanly with nothing in flight."""
    position = r.from_offset
    if position >= r.until_offset:
        return position
    pending_from = position  # where the decoder's rows not yet yielded start
    isolation = 1 if str(config.get("isolation.level", "")).lower() == "read_committed" else 0
    bootstrap = str(config.get("bootstrap.servers", ""))
    decoder = ArrowDecoder(r.topic, r.partition, schema)
    connection: BrokerSocket | None = None
    address = pool.leader(bootstrap, r.topic, r.partition)
    clean = False
    started = time.monotonic()
    try:
        if address is None:
            address = _leader(consumer(), r.topic, r.partition, min(10.0, timeout_s))
        connection = pool.checkout(address)
        reused = connection is not None
        try:
            if connection is None:
                connection = _connect(address, timeout_s)
            else:
                connection.set_timeout(_socket_timeout(timeout_s))
            connection.send(_request(r, position, isolation))
            frame = connection.receive_frame()
        except WireError:
            if not reused or connection is None:
                raise
            # An idle connection the broker has closed since: once more on a new one.
            connection.close()
            connection = _connect(address, timeout_s)
            connection.send(_request(r, position, isolation))
            frame = connection.receive_frame()
        item = _partition_data(frame, r)
        pool.remember_leader(bootstrap, r.topic, r.partition, address)
        while True:
            # `records` is a view of the connection's buffer: decoded (copied) before the next
            # receive overwrites it.
            records = item.records
            headers, following = _batches(records, position)
            if following == position:
                raise _Stop("no complete batch (high watermark below the range's end?)")
            if following < r.until_offset:
                connection.send(_request(r, following, isolation))  # in flight while decoding
            if records is not None:
                decoder.add(records, position, r.until_offset, item.aborted_transactions, headers)
            position = following
            if decoder.rows >= CHUNK_ROWS or decoder.data_bytes >= CHUNK_BYTES:
                pending_from = position
                yield decoder.take()
            if position >= r.until_offset:
                break
            item = _partition_data(connection.receive_frame(), r)
        clean = True
    except OdradekError as e:
        # Records it cannot decode: drop the rows not yet yielded, let the Consumer judge them.
        log.warning("fast read of %s-%s at %d: %s", r.topic, r.partition, position, e)
        decoder.take()
        position = pending_from
    except (_Stop, WireError, OSError, ProtocolError, KafkaException) as e:
        pool.forget_leader(bootstrap, r.topic, r.partition)
        log.debug(
            "fast read of %s-%s stopped at %d after %.1fs: %s",
            r.topic,
            r.partition,
            position,
            time.monotonic() - started,
            e,
        )
    finally:
        if connection is not None:
            if clean and address is not None:
                pool.checkin(address, connection)
            else:
                connection.close()
    if decoder.rows:
        yield decoder.take()
    return min(position, r.until_offset)
