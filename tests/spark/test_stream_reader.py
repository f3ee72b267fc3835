"""The stream reader's planning methods called directly, as Spark's driver calls them, against a
real cluster but without a SparkSession: fast, and exact about offsets."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from odradek.errors import DataLossError
from odradek.spark.arrow import source_schema
from odradek.spark.offsets import OffsetRange
from odradek.spark.options import SourceOptions
from odradek.spark.stream import OdradekStreamReader
from odradek.testing import LocalCluster
from tests.spark.topics import create_topic, produce, unique_topic


def _reader(bootstrap: str, **options: str) -> OdradekStreamReader:
    parsed = SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, **options}).for_stream()
    return OdradekStreamReader(parsed, source_schema(False))


def _fill(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    produce(
        bootstrap,
        topic,
        ({"value": b"x", "partition": p} for p, n in per_partition.items() for _ in range(n)),
    )


def test_initial_offset_is_resolved_once(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("reader-initial")
    create_topic(bootstrap, topic, 2)
    _fill(bootstrap, topic, {0: 3, 1: 5})
    reader = _reader(bootstrap, subscribe=topic)  # startingOffsets: latest
    initial = reader.initialOffset()
    assert initial == {topic: {"0": 3, "1": 5}}
    _fill(bootstrap, topic, {0: 4})
    assert reader.initialOffset() == initial  # asked again while planning the first batch
    end = reader.latestOffset(initial, ReadAllAvailable())
    assert end == {topic: {"0": 7, "1": 5}}
    assert reader.partitions(initial, end) == [OffsetRange(topic, 0, 3, 7)]
    # A first batch replayed after a restart: a new reader resolves "latest" again, past the
    # logged end. It reads nothing it cannot place, and raises no data loss.
    _fill(bootstrap, topic, {0: 2})
    restarted = _reader(bootstrap, subscribe=topic)
    assert restarted.initialOffset() == {topic: {"0": 9, "1": 5}}
    assert restarted.partitions(restarted.initialOffset(), end) == []
    assert _reader(bootstrap, subscribe=topic, startingOffsets="earliest").initialOffset() == {
        topic: {"0": 0, "1": 0}
    }


def test_latest_offset_never_goes_back_and_honours_max_rows(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    topic = unique_topic("reader-latest")
    create_topic(bootstrap, topic, 2)
    _fill(bootstrap, topic, {0: 30, 1: 10})
    reader = _reader(bootstrap, subscribe=topic, maxOffsetsPerTrigger="8")
    assert reader.getDefaultReadLimit() == ReadMaxRows(8)
    start = {topic: {"0": 0, "1": 0}}
    assert reader.latestOffset(start, ReadMaxRows(8)) == {topic: {"0": 6, "1": 2}}
    assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 30, "1": 10}}
    assert reader.reportLatestOffset() == {topic: {"0": 30, "1": 10}}
    # A start past the HW (a new leader's HW trailing for a moment) is kept, not undone.
    ahead = {topic: {"0": 35, "1": 10}}
    assert reader.latestOffset(ahead, ReadAllAvailable()) == ahead


def test_available_now_is_a_ceiling(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    prefix = unique_topic("reader-now")
    create_topic(bootstrap, f"{prefix}-a", 1)
    _fill(bootstrap, f"{prefix}-a", {0: 5})
    reader = _reader(bootstrap, subscribePattern=f"{prefix}-.*", startingOffsets="earliest")
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    _fill(bootstrap, f"{prefix}-a", {0: 5})
    create_topic(bootstrap, f"{prefix}-b", 1)
    _fill(bootstrap, f"{prefix}-b", {0: 5})
    end = reader.latestOffset(start, ReadMaxRows(3))
    assert end == {f"{prefix}-a": {"0": 3}}
    end = reader.latestOffset(end, ReadAllAvailable())
    assert end == {f"{prefix}-a": {"0": 5}}
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # drained: the query stops
    # Without the ceiling the new topic is picked up, from its first offset.
    fresh = _reader(bootstrap, subscribePattern=f"{prefix}-.*")
    latest = fresh.latestOffset(end, ReadAllAvailable())
    assert latest == {f"{prefix}-a": {"0": 10}, f"{prefix}-b": {"0": 5}}
    assert fresh.partitions(end, latest) == [
        OffsetRange(f"{prefix}-a", 0, 5, 10),
        OffsetRange(f"{prefix}-b", 0, 0, 5),
    ]


def test_partitions_report_gone_partitions(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap_servers
    start = {"gone-topic": {"0": 4}, "kept": {"0": 1}}
    end = {"kept": {"0": 9}}
    strict = _reader(bootstrap, subscribe="kept,gone-topic")
    with pytest.raises(DataLossError, match=r"gone-topic-0 no longer exist"):
        strict.partitions(start, end)
    lenient = _reader(bootstrap, subscribe="kept,gone-topic", failOnDataLoss="false")
    assert lenient.partitions(start, end) == [OffsetRange("kept", 0, 1, 9)]
    split = _reader(bootstrap, subscribe="kept", minPartitions="4").partitions(
        {"kept": {"0": 1}}, end
    )
    assert [(r.from_offset, r.until_offset) for r in split] == [(1, 3), (3, 5), (5, 7), (7, 9)]
