"""Segments roll by size, old offsets stay readable, and retention deletes whole old segments.

Each test runs a private one-broker cluster with 4 KiB segments (`log.segment.bytes=4096`), a
sparse index entry every 512 bytes, and the retention check every 200 ms, and writes batches of
known size straight to the broker (`_wire.produce`), so that which offsets land in which segment
is predictable. What is checked is what an operator and a consumer see: the partition directory
(`<20-digit base offset>.log/.index/.timeindex`, Kafka's names), fetches at arbitrary offsets of
old segments (by raw Fetch and by confluent-kafka), and the log start offset that ListOffsets
(earliest) reports as retention -- by bytes, then by age, set per topic through CreateTopics
configs -- deletes segments.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import TopicPartition
from kio.schema.errors import ErrorCode

from odradek.log.naming import log_dir_name
from odradek.protocol.record_batch import build_batch, decode_records, iter_batches
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration import _wire
from tests.integration._clients import confluent_consumer, consume, create_topic, unique_topic

SEGMENT_BYTES = 4096
RECORDS_PER_BATCH = 10
VALUE_BYTES = 60
SEGMENT_FILE = re.compile(r"(\d{20})\.(log|index|timeindex)")


def roll_cluster(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return make_cluster(
        1,
        log_segment_bytes=SEGMENT_BYTES,
        log_index_interval_bytes=512,
        log_retention_check_interval_ms=200,
    )


def value_of(offset: int) -> bytes:
    return f"value-{offset:06d}-".encode().ljust(VALUE_BYTES, b"x")


def write(bootstrap: str, topic: str, first: int, batches: int, timestamp_ms: int) -> int:
    """`batches` batches of RECORDS_PER_BATCH records from offset `first`; the next offset."""
    offset = first
    with _wire.WireConnection.to(bootstrap) as connection:
        for _ in range(batches):
            records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]
            records = [
                (f"k{o}".encode(), value_of(o), [], timestamp_ms)
                for o in range(offset, offset + RECORDS_PER_BATCH)
            ]
            answer = _wire.produce(connection, topic, 0, build_batch(records))
            assert (answer.error_code, answer.base_offset) == (ErrorCode.none, offset)
            offset += RECORDS_PER_BATCH
    return offset


def segment_files(cluster: LocalCluster, topic: str) -> dict[int, set[str]]:
    """Base offset -> the suffixes present, for the segment files of partition 0."""
    directory = Path(cluster.broker(1).data_dir) / log_dir_name(topic, 0)
    found: dict[int, set[str]] = {}
    for path in directory.iterdir():
        if match := SEGMENT_FILE.fullmatch(path.name):
            found.setdefault(int(match.group(1)), set()).add(match.group(2))
    return found


def segment_sizes(cluster: LocalCluster, topic: str) -> dict[int, int]:
    directory = Path(cluster.broker(1).data_dir) / log_dir_name(topic, 0)
    return {
        base: (directory / f"{base:020d}.log").stat().st_size
        for base in segment_files(cluster, topic)
    }


def earliest_and_latest(bootstrap: str, topic: str) -> tuple[int, int]:
    """ListOffsets earliest and latest, through confluent-kafka."""
    consumer = confluent_consumer(bootstrap)
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False)
    finally:
        consumer.close()


def assert_readable_at(bootstrap: str, topic: str, offsets: list[int]) -> None:
    """A raw Fetch at each offset returns the batch holding it, with the right record; and a
    client that starts there reads that record first."""
    with _wire.WireConnection.to(bootstrap) as connection:
        for offset in offsets:
            answer = _wire.fetch(connection, topic, 0, offset)
            assert answer.error_code == ErrorCode.none, offset
            first = next(iter_batches(answer.records))
            assert first.base_offset <= offset <= first.last_offset, offset
            records = {r.offset: r.value for r in decode_records(answer.records)}
            assert records[offset] == value_of(offset)
    for offset in offsets[:5]:
        (record,) = consume("confluent", bootstrap, topic, 0, offset, 1)
        assert (record.offset, record.value) == (offset, value_of(offset))


def test_segments_roll_and_old_offsets_stay_readable(make_cluster: Callable[..., LocalCluster]):
    cluster = roll_cluster(make_cluster)
    bootstrap = cluster.broker(1).bootstrap
    topic = unique_topic("roll")
    create_topic(cluster.bootstrap_servers, topic, replication_factor=1)
    end = write(bootstrap, topic, 0, 120, int(time.time() * 1000))

    files = segment_files(cluster, topic)
    assert len(files) >= 20, f"only {len(files)} segments for {end} records"
    assert all(suffixes == {"log", "index", "timeindex"} for suffixes in files.values()), files
    bases = sorted(files)
    assert bases[0] == 0
    sizes = segment_sizes(cluster, topic)
    directory = Path(cluster.broker(1).data_dir) / log_dir_name(topic, 0)
    for base, following in zip(bases, [*bases[1:], end], strict=True):
        assert 0 < sizes[base] <= SEGMENT_BYTES, (base, sizes[base])
        batches = list(iter_batches((directory / f"{base:020d}.log").read_bytes()))
        # Each segment is named after its first offset and ends where the next one begins.
        assert batches[0].base_offset == base
        assert batches[-1].next_offset == following
    assert earliest_and_latest(bootstrap, topic) == (0, end)

    rng = random.Random(4096)
    assert_readable_at(bootstrap, topic, [0, end - 1, *rng.sample(range(end), 30)])


def test_retention_bytes_deletes_the_oldest_segments(make_cluster: Callable[..., LocalCluster]):
    cluster = roll_cluster(make_cluster)
    bootstrap = cluster.broker(1).bootstrap
    retention = 20_000
    topic = unique_topic("retention-bytes")
    create_topic(
        cluster.bootstrap_servers,
        topic,
        replication_factor=1,
        configs={"retention.bytes": str(retention)},
    )
    end = write(bootstrap, topic, 0, 120, int(time.time() * 1000))
    assert end * VALUE_BYTES > 3 * retention  # (retention may already be at work meanwhile)

    def trimmed() -> bool:
        return sum(segment_sizes(cluster, topic).values()) < retention + SEGMENT_BYTES

    wait_until(trimmed, 30, "retention.bytes to delete old segments")
    remaining = segment_sizes(cluster, topic)
    # Kafka's rule: delete the oldest segment while the log would still be >= retention.bytes.
    assert sum(remaining.values()) >= retention
    start = min(remaining)
    assert start > 0
    assert set(segment_files(cluster, topic)[start]) == {"log", "index", "timeindex"}
    assert earliest_and_latest(bootstrap, topic) == (start, end)

    # The oldest data is gone for readers too; everything from the new start is readable.
    with _wire.WireConnection.to(bootstrap) as connection:
        assert _wire.fetch(connection, topic, 0, 0).error_code == ErrorCode.offset_out_of_range
        assert _wire.fetch(connection, topic, 0, start - 1).error_code == (
            ErrorCode.offset_out_of_range
        )
    assert_readable_at(bootstrap, topic, [start, end - 1, (start + end) // 2])
    newest = consume("confluent", bootstrap, topic, 0, start, end - start)
    assert [r.offset for r in newest] == list(range(start, end))


def test_retention_ms_deletes_segments_of_old_records(make_cluster: Callable[..., LocalCluster]):
    cluster = roll_cluster(make_cluster)
    bootstrap = cluster.broker(1).bootstrap
    topic = unique_topic("retention-ms")
    create_topic(
        cluster.bootstrap_servers,
        topic,
        replication_factor=1,
        configs={"retention.ms": str(10 * 60 * 1000)},
    )
    now = int(time.time() * 1000)
    old_end = write(bootstrap, topic, 0, 60, now - 2 * 3600 * 1000)  # two hours old
    end = write(bootstrap, topic, old_end, 30, now)  # ~12 segments of old records, ~6 of new

    def start_offset() -> int:
        return earliest_and_latest(bootstrap, topic)[0]

    start = wait_until(start_offset, 30, "retention.ms to delete the old segments")
    # Every segment holding only old records goes; the one where new records begin stays.
    wait_until(
        lambda: start_offset() == max(b for b in segment_files(cluster, topic) if b <= old_end),
        30,
        "every segment of only old records to be deleted",
    )
    start = start_offset()
    assert 0 < start <= old_end
    assert min(segment_files(cluster, topic)) == start
    assert earliest_and_latest(bootstrap, topic) == (start, end)
    recent = consume("confluent", bootstrap, topic, 0, old_end, end - old_end)
    assert [(r.offset, r.value) for r in recent] == [(o, value_of(o)) for o in range(old_end, end)]
    assert all(r.timestamp == now for r in recent)
