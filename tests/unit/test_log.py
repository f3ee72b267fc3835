"""Log: appends, reads, rolling, indexes, ListOffsets, retention, truncation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from odradek.errors import (
    CorruptRecordError,
    InvalidRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    RecordTooLargeError,
)
from odradek.log.config import LogConfig
from odradek.log.leader_epoch import EpochEntry
from odradek.log.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, Log
from odradek.protocol.record_batch import (
    TimestampType,
    build_batch,
    decode_records,
    iter_batches,
    read_header,
)

SMALL = LogConfig(segment_bytes=600, index_interval_bytes=64)


def records(
    n: int, ts: int = 1_000, tag: str = "", value_size: int = 8, keyed: bool = False
) -> bytes:
    """A producer batch of `n` records with timestamps ts, ts+1, ... and tagged values (keyed
    ones, as a compacted topic needs, have the keys k0, k1, ...)."""
    return build_batch(
        [
            (
                f"k{i}".encode() if keyed else None,
                f"{tag}{i}".encode().ljust(value_size, b"."),
                [],
                ts + i,
            )
            for i in range(n)
        ]
    )


def open_log(path: Path, config: LogConfig = SMALL, name: str = "topic-0", **kwargs: object) -> Log:
    options: dict[str, object] = {
        "recovery_point": 0,
        "log_start_offset": 0,
        "clean_shutdown": True,
        "now_ms": 0,
    }
    options.update(kwargs)
    return Log.open(path / name, config, **options)  # type: ignore[arg-type]


def values(data: bytes) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    for header in iter_batches(data):
        out += [(r.offset, r.value) for r in decode_records(data[header.position :])]
    return out


def fill(
    log: Log,
    batches: int,
    per_batch: int = 3,
    epoch: int = 0,
    ts: int = 1_000,
    keyed: bool = False,
) -> None:
    for i in range(batches):
        batch = records(per_batch, ts + i * per_batch, tag=f"b{i}-", keyed=keyed)
        log.append_as_leader(batch, epoch, 0)


# -- appends and reads ------------------------------------------------------------------------


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig())
    assert (log.log_start_offset, log.log_end_offset, log.size_in_bytes) == (0, 0, 0)
    first = log.append_as_leader(records(3, ts=10, tag="a"), leader_epoch=4, now_ms=99)
    second = log.append_as_leader(records(2, ts=5, tag="b"), 4, 99)
    third = log.append_as_leader(records(1, ts=50, tag="c"), 4, 99)
    assert (first.first_offset, first.last_offset, first.batch_count) == (0, 2, 1)
    assert (first.max_timestamp, first.offset_of_max_timestamp, first.log_append_time) == (
        12,
        2,
        -1,
    )
    assert (second.first_offset, second.last_offset, second.batch_count) == (3, 4, 1)
    assert (third.max_timestamp, third.offset_of_max_timestamp) == (50, 5)
    assert log.log_end_offset == 6
    assert log.size_in_bytes == first.size + second.size + third.size
    data = log.read(0, 1 << 20)
    assert values(data) == [
        (0, b"a0......"),
        (1, b"a1......"),
        (2, b"a2......"),
        (3, b"b0......"),
        (4, b"b1......"),
        (5, b"c0......"),
    ]
    assert all(h.partition_leader_epoch == 4 for h in iter_batches(data))
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(4, 0)]


def test_topic_and_partition_come_from_the_last_dash(tmp_path: Path) -> None:
    log = open_log(tmp_path, name="my.topic-with-dashes-12")
    assert (log.topic, log.partition) == ("my.topic-with-dashes", 12)
    assert log.dir == tmp_path / "my.topic-with-dashes-12"
    with pytest.raises(KafkaStorageError):
        open_log(tmp_path, name="no_partition")


def test_reads_at_every_offset_across_many_small_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 60, per_batch=3)
    assert log.segment_count > 10
    assert log.log_end_offset == 180
    for offset in range(180):
        single = log.read(offset, 1)
        headers = list(iter_batches(single))
        assert len(headers) == 1 and headers[0].size == len(single)
        assert headers[0].base_offset <= offset <= headers[0].last_offset
        batch_index = offset // 3
        assert values(single)[0] == (batch_index * 3, f"b{batch_index}-0".encode().ljust(8, b"."))
        more = log.read(offset, 10_000)
        bases = [h.base_offset for h in iter_batches(more)]
        assert bases[0] == batch_index * 3
        assert bases == list(range(bases[0], bases[0] + 3 * len(bases), 3))
    assert log.read(180, 100) == b""


def test_read_respects_max_bytes_with_whole_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig())
    fill(log, 10)
    batch_size = read_header(log.read(0, 1)).size
    data = log.read(0, batch_size * 3 + batch_size // 2)
    assert len(data) == batch_size * 3
    assert [h.base_offset for h in iter_batches(data)] == [0, 3, 6]


def test_min_one_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig())
    log.append_as_leader(records(5, value_size=100), 0, 0)
    whole = log.read(0, 10, min_one_batch=True)
    assert read_header(whole).size == len(whole) > 10
    assert log.read(0, 10, min_one_batch=False) == b""
    assert log.read(0, 0, min_one_batch=True) == whole


def test_max_offset_limits_reads(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig())
    fill(log, 5)  # batches at 0, 3, 6, 9, 12
    assert [h.base_offset for h in iter_batches(log.read(0, 1 << 20, max_offset=9))] == [0, 3, 6]
    assert [h.base_offset for h in iter_batches(log.read(0, 1 << 20, max_offset=7))] == [0, 3, 6]
    assert log.read(9, 1 << 20, max_offset=9) == b""
    assert log.read(12, 1 << 20, max_offset=3) == b""
    assert log.read(9, 1 << 20, max_offset=None) != b""


def test_offset_out_of_range_at_both_ends(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 30)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(91, 100)
    assert log.read(90, 100) == b""
    log.maybe_increment_log_start_offset(20)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(19, 100)
    assert read_header(log.read(20, 1)).base_offset == 18  # the batch holding offset 20
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(91)


def test_invalid_append_writes_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(max_message_bytes=200))
    log.append_as_leader(records(1), 0, 0)
    size, end = log.size_in_bytes, log.log_end_offset
    corrupt = bytearray(records(2))
    corrupt[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(bytes(corrupt), 0, 0)
    with pytest.raises(RecordTooLargeError):
        log.append_as_leader(records(1, value_size=300), 0, 0)
    with pytest.raises(InvalidRecordError):  # one batch per produce, as in Kafka
        log.append_as_leader(records(1) + records(1), 0, 0)
    assert (log.size_in_bytes, log.log_end_offset) == (size, end)
    assert os.path.getsize(log.active_segment.log_path) == size


def test_append_larger_than_a_segment_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(segment_bytes=300))
    with pytest.raises(RecordBatchTooLargeError):
        log.append_as_leader(records(10, value_size=20), 0, 0)
    assert log.log_end_offset == 0


def test_log_append_time(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(message_timestamp_type="LogAppendTime"))
    info = log.append_as_leader(records(3, ts=5), 0, now_ms=123_456)
    assert info.log_append_time == 123_456 and info.max_timestamp == 123_456
    header = read_header(log.read(0, 1000))
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == 123_456
    # A follower copying the batch keeps it as is (and its CRC still holds).
    follower = open_log(tmp_path, LogConfig(), name="topic-1")
    follower.append_as_follower(log.read(0, 1000))
    assert follower.read(0, 1000) == log.read(0, 1000)


# -- rolling ----------------------------------------------------------------------------------


def test_roll_by_size(tmp_path: Path) -> None:
    one = len(records(3))
    log = open_log(tmp_path, LogConfig(segment_bytes=one * 3))
    fill(log, 10)
    bases = [s.base_offset for s in log.segments()]
    assert bases == [0, 9, 18, 27]
    assert [s.size for s in log.segments()] == [one * 3] * 3 + [one]
    assert sorted(p.name for p in log.dir.glob("*.log")) == [f"{b:020d}.log" for b in bases]


def test_roll_by_time_uses_batch_timestamps(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(segment_ms=1_000))
    log.append_as_leader(records(1, ts=10_000), 0, now_ms=0)
    log.append_as_leader(records(1, ts=10_900), 0, now_ms=0)
    assert log.segment_count == 1
    log.append_as_leader(records(1, ts=11_001), 0, now_ms=0)
    assert [s.base_offset for s in log.segments()] == [0, 2]


def test_roll_by_time_without_timestamps_uses_segment_age(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(segment_ms=1_000), now_ms=5_000)
    log.append_as_leader(records(1, ts=-1), 0, now_ms=5_000)
    log.append_as_leader(records(1, ts=-1), 0, now_ms=6_000)
    assert log.segment_count == 1
    log.append_as_leader(records(1, ts=-1), 0, now_ms=6_001)
    assert log.segment_count == 2
    assert log.active_segment.created_ms == 6_001


def test_roll_when_index_is_full(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(segment_index_bytes=24, index_interval_bytes=0))
    fill(log, 12)
    assert log.segment_count > 1
    for segment in log.segments():
        assert len(segment.offset_index.entries()) <= 3
    assert values(log.read(0, 1 << 20))[0][0] == 0


def test_explicit_roll_and_empty_roll(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig())
    assert log.roll(now_ms=0).base_offset == 0 and log.segment_count == 1
    fill(log, 2)
    log.roll(now_ms=0)
    assert [s.base_offset for s in log.segments()] == [0, 6]
    assert log.recovery_point == 6


# -- indexes ----------------------------------------------------------------------------------


def test_offset_index_entries_point_at_their_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(index_interval_bytes=200))
    fill(log, 40)
    segment = log.active_segment
    entries = segment.offset_index.entries()
    assert len(entries) > 5
    assert entries == sorted(entries)
    for offset, position in entries:
        assert read_header(segment.read_at(position, 61)).last_offset == offset
    for target in range(120):
        found_offset, position = segment.offset_index.lookup(target)
        assert found_offset <= target or (found_offset, position) == (0, 0)
    time_entries = segment.time_index.entries()
    assert [t for t, _ in time_entries] == sorted({t for t, _ in time_entries})


def test_flush_advances_recovery_point(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig())
    fill(log, 3)
    assert log.recovery_point == 0
    log.flush(4)
    assert log.recovery_point == 4
    log.flush()
    assert log.recovery_point == 9
    log.flush(2)
    assert log.recovery_point == 9


# -- ListOffsets ------------------------------------------------------------------------------


def test_fetch_offset_by_timestamp(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 50, per_batch=3, ts=1_000)  # offset o has timestamp 1000 + o
    assert log.segment_count > 5
    for target in (0, 1_000, 1_001, 1_077, 1_100, 1_149):
        expected = max(target - 1_000, 0)
        assert log.fetch_offset_by_timestamp(target) == (expected, 1_000 + expected)
    assert log.fetch_offset_by_timestamp(1_150) is None
    assert log.fetch_offset_by_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
    assert log.fetch_offset_by_timestamp(LATEST_TIMESTAMP) == (150, -1)
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == (149, 1_149)
    log.maybe_increment_log_start_offset(31)
    assert log.fetch_offset_by_timestamp(1_010) == (31, 1_031)
    assert log.fetch_offset_by_timestamp(EARLIEST_TIMESTAMP) == (31, -1)


def test_fetch_offset_by_timestamp_out_of_order_timestamps(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig())
    log.append_as_leader(build_batch([(None, b"a", [], 500), (None, b"b", [], 100)]), 0, 0)
    log.append_as_leader(build_batch([(None, b"c", [], 300)]), 0, 0)
    assert log.fetch_offset_by_timestamp(200) == (0, 500)
    assert log.fetch_offset_by_timestamp(50) == (0, 500)
    assert log.fetch_offset_by_timestamp(501) is None


def test_fetch_offset_by_timestamp_log_append_time_is_batch_level(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(message_timestamp_type="LogAppendTime"))
    log.append_as_leader(records(3), 0, now_ms=100)
    log.append_as_leader(records(3), 0, now_ms=200)
    assert log.fetch_offset_by_timestamp(150) == (3, 200)
    assert log.fetch_offset_by_timestamp(100) == (0, 100)


# -- retention --------------------------------------------------------------------------------


def test_retention_by_size(tmp_path: Path) -> None:
    one = len(records(3))
    log = open_log(tmp_path, LogConfig(segment_bytes=one * 2, retention_bytes=one * 5))
    fill(log, 10)  # 5 segments of 2 batches
    assert log.segment_count == 5
    assert log.delete_retention_segments(now_ms=0) == 2
    assert [s.base_offset for s in log.segments()] == [12, 18, 24]
    assert log.log_start_offset == 12
    assert log.size_in_bytes == one * 6
    with pytest.raises(OffsetOutOfRangeError):
        log.read(11, 100)
    assert read_header(log.read(12, 1)).base_offset == 12
    assert log.delete_retention_segments(now_ms=0) == 0


def test_retention_by_size_never_deletes_the_active_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(retention_bytes=0))
    fill(log, 4)
    assert log.delete_retention_segments(now_ms=0) == 0
    assert log.log_start_offset == 0 and log.segment_count == 1


def test_retention_by_time(tmp_path: Path) -> None:
    one = len(records(3))
    log = open_log(tmp_path, LogConfig(segment_bytes=one, retention_ms=1_000))
    for i in range(4):  # one batch per segment, timestamps 10_000, 20_000, ...
        log.append_as_leader(records(3, ts=(i + 1) * 10_000), 0, 0)
    assert log.segment_count == 4
    assert log.delete_retention_segments(now_ms=10_002 + 1_000) == 0
    assert log.delete_retention_segments(now_ms=20_002 + 1_001) == 2
    assert log.log_start_offset == 6
    assert [s.base_offset for s in log.segments()] == [6, 9]
    assert log.delete_retention_segments(now_ms=10**9) == 1  # never the active one
    assert log.log_start_offset == 9


def test_a_compacted_log_keeps_old_segments_but_honours_the_log_start_offset(
    tmp_path: Path,
) -> None:
    one = len(records(3, keyed=True))
    config = LogConfig(
        segment_bytes=one, retention_ms=0, retention_bytes=0, cleanup_policy=("compact",)
    )
    log = open_log(tmp_path, config)
    fill(log, 4, keyed=True)
    assert log.delete_retention_segments(now_ms=10**9) == 0
    log.maybe_increment_log_start_offset(6)
    assert log.delete_retention_segments(now_ms=10**9) == 2
    assert log.log_start_offset == 6


def test_retention_stops_at_the_high_watermark(tmp_path: Path) -> None:
    one = len(records(3))
    log = open_log(tmp_path, LogConfig(segment_bytes=one, retention_ms=0))
    fill(log, 4)
    assert log.delete_retention_segments(now_ms=10**9, high_watermark=6) == 2
    assert log.log_start_offset == 6


def test_retention_removes_segments_below_the_log_start_offset(tmp_path: Path) -> None:
    one = len(records(3))
    log = open_log(tmp_path, LogConfig(segment_bytes=one))
    fill(log, 4, epoch=0)
    log.append_as_leader(records(3), 2, 0)
    log.maybe_increment_log_start_offset(7)
    assert log.segment_count == 5
    assert log.delete_retention_segments(now_ms=0) == 2
    assert [s.base_offset for s in log.segments()] == [6, 9, 12]
    assert log.log_start_offset == 7
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(0, 7), EpochEntry(2, 12)]


# -- truncation -------------------------------------------------------------------------------


def test_truncate_to_batch_boundary_and_mid_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 20, epoch=1)  # batches at 0, 3, ..., 57 over several segments
    log.append_as_leader(records(3), 2, 0)  # epoch 2 starts at 60
    segments_before = log.segment_count
    assert log.truncate_to(60)
    assert log.log_end_offset == 60
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0)]
    assert log.truncate_to(31)  # inside the batch 30..32: the whole batch goes
    assert log.log_end_offset == 30
    assert log.segment_count < segments_before
    assert not log.truncate_to(30) and not log.truncate_to(100)
    assert values(log.read(27, 1 << 20))[-1][0] == 29
    info = log.append_as_leader(records(2, tag="new"), 3, 0)
    assert info.first_offset == 30
    assert values(log.read(30, 1 << 20)) == [(30, b"new0...."), (31, b"new1....")]
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(3, 30)]
    assert log.size_in_bytes == sum(s.size for s in log.segments())
    assert log.recovery_point <= 30


def test_truncate_to_segment_base_keeps_an_empty_active_segment(tmp_path: Path) -> None:
    one = len(records(3))
    log = open_log(tmp_path, LogConfig(segment_bytes=one * 2))
    fill(log, 5)
    assert [s.base_offset for s in log.segments()] == [0, 6, 12]
    log.truncate_to(6)
    assert [s.base_offset for s in log.segments()] == [0, 6]
    assert log.active_segment.size == 0 and log.log_end_offset == 6
    log.append_as_leader(records(3), 0, 0)
    assert log.segment_count == 2 and log.log_end_offset == 9


def test_truncate_below_the_first_segment_restarts_the_log(tmp_path: Path) -> None:
    one = len(records(3))
    log = open_log(tmp_path, LogConfig(segment_bytes=one, retention_bytes=0))
    fill(log, 4)
    log.delete_retention_segments(now_ms=0)
    assert log.log_start_offset == 9
    log.truncate_to(5)
    assert (log.log_start_offset, log.log_end_offset, log.segment_count) == (5, 5, 1)
    assert log.leader_epoch_cache.epoch_entries() == []


def test_truncate_fully_and_start_at(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 20)
    log.truncate_fully_and_start_at(1_000, now_ms=0)
    assert (log.log_start_offset, log.log_end_offset, log.recovery_point) == (1_000, 1_000, 1_000)
    assert log.segment_count == 1 and log.size_in_bytes == 0
    assert [p.name for p in log.dir.glob("*.log")] == [f"{1000:020d}.log"]
    assert log.append_as_leader(records(1), 5, 0).first_offset == 1_000
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(5, 1_000)]


# -- followers --------------------------------------------------------------------------------


def test_follower_append_keeps_offsets_and_records_epochs(tmp_path: Path) -> None:
    leader = open_log(tmp_path, name="t-0")
    fill(leader, 4, epoch=1)
    leader.append_as_leader(records(2), 3, 0)
    follower = open_log(tmp_path, name="t-1")
    offset = 0
    while offset < leader.log_end_offset:
        chunk = leader.read(offset, 1 << 20)
        info = follower.append_as_follower(chunk)
        assert info.first_offset == offset
        offset = info.last_offset + 1
    assert follower.log_end_offset == leader.log_end_offset == 14
    assert follower.read(0, 1 << 20) == leader.read(0, 1 << 20)
    assert follower.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(3, 12)]


def test_follower_append_checks_offsets_and_crc(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig())
    log.append_as_follower(build_batch([(None, b"x", [], 0)], base_offset=0))
    with pytest.raises(InvalidRecordError):
        log.append_as_follower(build_batch([(None, b"x", [], 0)], base_offset=0))
    with pytest.raises(InvalidRecordError):  # not increasing within the request
        log.append_as_follower(
            build_batch([(None, b"x", [], 0)], base_offset=5)
            + build_batch([(None, b"x", [], 0)], base_offset=5)
        )
    corrupt = bytearray(build_batch([(None, b"x", [], 0)], base_offset=1))
    corrupt[-1] ^= 0x40
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(bytes(corrupt))
    assert log.log_end_offset == 1
    log.append_as_follower(build_batch([(None, b"gap", [], 0)], base_offset=10))  # gaps allowed
    assert log.log_end_offset == 11
    assert values(log.read(1, 1000)) == [(10, b"gap")]


def test_config_can_change(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig())
    fill(log, 3)
    log.config = LogConfig(segment_bytes=len(records(3)))
    fill(log, 2)
    assert log.segment_count == 3
    assert log.config.segment_bytes == len(records(3))


def test_closed_log_refuses_work(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 1)
    log.close()
    log.close()
    with pytest.raises(KafkaStorageError):
        log.append_as_leader(records(1), 0, 0)
    with pytest.raises(KafkaStorageError):
        log.read(0, 10)


def test_delete_removes_the_directory(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 5)
    log.delete()
    assert not log.dir.exists()


def test_file_records_reads_name_the_same_bytes_as_reads(tmp_path: Path) -> None:
    """Zero-copy reads (`read_file_records`) answer exactly `read`'s batches, at every offset,
    size limit and upper bound, across segments and batches of different sizes."""
    log = open_log(tmp_path, LogConfig(segment_bytes=2000, index_interval_bytes=64))
    for i in range(40):
        log.append_as_leader(records(1 + i % 4, 1_000 + i, tag=f"b{i}-", value_size=8 + i), 0, 0)
    end = log.log_end_offset
    for start in range(end + 1):
        for max_bytes in (0, 50, 120, 400, 5000):
            for limit in (None, start, start + 1, start + 5, end):
                for min_one in (True, False):
                    copied = log.read(start, max_bytes, limit, min_one)
                    ranged = log.read_file_records(start, max_bytes, limit, min_one)
                    got = ranged.read() if not isinstance(ranged, bytes) else ranged
                    assert got == copied, (start, max_bytes, limit, min_one)
    log.close()
