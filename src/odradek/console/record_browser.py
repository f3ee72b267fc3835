"""The record browser's reading: one partition's records, fetched from its leader directly.

Why not a librdkafka consumer: a fresh consumer per page first asks for the Metadata of the
whole topic, 0.2-1.2 s on a 10,000-partition topic (`bench/console.py`). Here the partition's
leader comes from the console's ZooKeeper snapshot and the requests go over `LeaderOffsets`'
kept connections (its timeouts and its "ask the current leader once more" rule):

1. ListOffsets EARLIEST and LATEST (read_committed: the last stable offset), at once: the log
   start and the "high watermark" the page shows, as the consumer's `get_watermark_offsets`
   gave them (librdkafka's default isolation is read_committed, and it asks with it);
2. where to start: the `count` latest records (`high - count`), an offset clamped into
   [log start, high], or ListOffsets of a timestamp (read_committed; none after it: `high`);
3. Fetch v11 (read_committed, no wait) at the leader from that offset, again from the offset
   after the last complete batch, until `count` records, `high`, or `BROWSE_TIMEOUT_S`. A
   partition error that means the leader moved (`leader_offsets.should_ask_again`) reads the
   leader again from ZooKeeper and asks it, once;
4. each batch decoded with `protocol.record_batch.decode_records` (every codec; bounded
   decompression). As Kafka's read_committed consumer does: control batches (transaction
   markers) give no record, and the batches of a transaction the response lists as aborted are
   dropped from its first offset up to the producer's abort marker. Records before the wanted
   offset (a fetch starts at the batch that holds it) are trimmed.

Any failure is one line for the page (`ConsoleError`: Kafka's error name first).

Concurrency: loop-thread only, like `LeaderOffsets`.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.admin.client import KafkaResponseError
from odradek.admin.groups import EARLIEST, LATEST
from odradek.console.kafka_client import ConsoleError
from odradek.console.leader_offsets import (
    LeaderOffsets,
    NoLeaderError,
    TopicPartition,
    should_ask_again,
)
from odradek.errors import OdradekError
from odradek.protocol.aborted_transactions import AbortedTransactions
from odradek.protocol.codec import ApiKey
from odradek.protocol.record_batch import decode_records, iter_batches

FETCH_VERSION = 11  # the last with topic names (v13 names topic ids)
READ_COMMITTED = 1
MAX_BROWSE_RECORDS = 500
BROWSE_TIMEOUT_S = 8.0
# One Fetch's bound: 500 records of a few KB fit; a larger first batch still comes whole (KIP-74).
FETCH_MAX_BYTES = 1024 * 1024
TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp_ms: int | None
    timestamp_type: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def fetch_request(topic: str, partition: int, offset: int) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "max_wait": datetime.timedelta(0),  # the records below `high` are there already
        "min_bytes": 1,
        "max_bytes": FETCH_MAX_BYTES,
        "isolation_level": READ_COMMITTED,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "log_start_offset": -1,
                        "partition_max_bytes": FETCH_MAX_BYTES,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def partition_data(answer: Any, key: TopicPartition, broker_id: int) -> Any:
    """The partition's part of a Fetch response, or `KafkaResponseError`."""
    if answer.error_code != ErrorCode.none:
        raise KafkaResponseError(ErrorCode(answer.error_code), f"Fetch at broker {broker_id}")
    for topic in answer.responses:
        for data in topic.partitions:
            if (topic.topic, int(data.partition_index)) == key:
                if data.error_code != ErrorCode.none:
                    raise KafkaResponseError(
                        ErrorCode(data.error_code), f"Fetch at broker {broker_id}"
                    )
                return data
    raise KafkaResponseError(
        ErrorCode.unknown_server_error, f"broker {broker_id} did not answer for it"
    )


def decode(
    records: bytes, start: int, high: int, aborted: AbortedTransactions
) -> tuple[list[Record], int]:
    """The records of the complete batches in `records` at offsets in [start, high) (step 4 of
    the module docstring), and the offset after the last complete batch (`start` if none)."""
    found: list[Record] = []
    position = start
    view = memoryview(records)
    for header in iter_batches(view):
        position = max(position, header.next_offset)
        if header.next_offset <= start or header.base_offset >= high:
            continue
        if header.is_transactional and aborted.skip(header):
            continue
        if header.is_control or header.records_count == 0:
            continue
        kind = TIMESTAMP_TYPES[int(header.timestamp_type)]
        batch = view[header.position : header.position + header.size]
        for r in decode_records(batch):
            if start <= r.offset < high:
                found.append(Record(r.offset, r.timestamp, kind, r.key, r.value, tuple(r.headers)))
    return found, position


class RecordBrowser:
    """Reads one partition's records for the page (see the module docstring). Loop-thread only."""

    def __init__(self, leader_offsets: LeaderOffsets) -> None:
        self.offsets = leader_offsets

    async def browse(
        self,
        key: TopicPartition,
        leader: int,
        count: int,
        *,
        from_offset: int | None = None,
        from_timestamp_ms: int | None = None,
    ) -> tuple[list[Record], int, int]:
        """Up to `count` records of partition `key` (led by `leader` as the snapshot says, -1 for
        none): the latest ones, or from an offset, or from the first at or after a timestamp.
        Returns (records, log start, high watermark)."""
        count = max(1, min(MAX_BROWSE_RECORDS, count))
        low, high = await asyncio.gather(
            self._offset(key, leader, EARLIEST), self._offset(key, leader, LATEST)
        )
        if from_timestamp_ms is not None:
            found = await self._offset(key, leader, from_timestamp_ms)
            start = found if found >= 0 else high
        elif from_offset is not None:
            start = min(max(low, from_offset), high)
        else:
            start = max(low, high - count)
        if start >= high:
            return [], low, high
        try:
            records = await self._read(key, leader, start, high, count)
        except OdradekError as e:
            raise ConsoleError(str(e)) from None
        return records, low, high

    async def _offset(self, key: TopicPartition, leader: int, timestamp: int) -> int:
        result = (await self.offsets.offsets({key: leader}, timestamp, READ_COMMITTED))[key]
        if not isinstance(result, int):
            raise ConsoleError(str(result))
        return result

    async def _read(
        self, key: TopicPartition, leader: int, start: int, high: int, count: int
    ) -> list[Record]:
        records: list[Record] = []
        aborted = AbortedTransactions()
        position = start
        asked_again = False
        deadline = time.monotonic() + BROWSE_TIMEOUT_S
        while len(records) < count and position < high and time.monotonic() < deadline:
            try:
                if leader < 0:
                    raise NoLeaderError("no leader")
                answer = await self.offsets.to_broker(
                    leader, ApiKey.FETCH, FETCH_VERSION, fetch_request(key[0], key[1], position)
                )
                data = partition_data(answer, key, leader)
            except OdradekError as e:
                if asked_again or not should_ask_again(e):
                    raise
                asked_again = True
                leader = await self.offsets.leader_now(key, e)
                continue
            aborted.add(
                (int(a.producer_id), int(a.first_offset)) for a in data.aborted_transactions or ()
            )
            found, following = decode(bytes(data.records or b""), position, high, aborted)
            if following == position:
                break  # nothing complete at `position`: the log ends there for this reader
            records += found
            position = following
        return records[:count]
