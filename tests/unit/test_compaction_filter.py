"""The cleaner's native passes (`odradek.protocol.compaction`) against a plain model.

The model of one cleaning: the map holds each key's last offset in [start, end) of the records
mapped; a record stays when it lies past the map's latest offset, or when it has a key, its offset
is the key's last one and it has a value or its batch's delete horizon has not passed; control
records always stay. Random batches (keys from a small alphabet so that they repeat, tombstones,
headers, every codec, random base offsets with gaps) are mapped and filtered, and what comes out
must be exactly the model's records with their offsets, timestamps, headers and values, in valid
batches (CRC, header fields), and the index entries must be what a segment computes itself.
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odradek.errors import CorruptRecordError
from odradek.log.segment import LogSegment
from odradek.protocol import _compaction
from odradek.protocol.compaction import (
    DELETE_HORIZON_BIT,
    DISCARD_RECORDS,
    RETAIN_EMPTY,
    SET_HORIZON,
    BatchDecisions,
    IndexBuilder,
    OffsetMap,
    delete_horizon,
    filter_buffer,
    map_buffer,
)
from odradek.protocol.record_batch import (
    CompressionType,
    Record,
    build_batch,
    decode_records,
    read_header,
    validate_replicated_batches,
)

LIMIT = 1 << 20
CODECS = st.sampled_from(list(CompressionType))
KEYS = st.none() | st.sampled_from([b"a", b"b", b"c", b"d", b"", b"\x00" * 20])
VALUES = st.none() | st.binary(max_size=30)
HEADERS = st.lists(st.tuples(st.sampled_from(["h", "trace"]), st.none() | st.binary(max_size=5)))

RawRecord = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]


@st.composite
def batches(draw: st.DrawFn) -> list[bytes]:
    """Batches at increasing base offsets (with gaps), each with its own codec."""
    out = []
    offset = draw(st.integers(0, 5))
    for _ in range(draw(st.integers(1, 6))):
        records: list[RawRecord] = [
            (draw(KEYS), draw(VALUES), draw(HEADERS), draw(st.integers(0, 10_000)))
            for _ in range(draw(st.integers(1, 8)))
        ]
        out.append(build_batch(records, offset, draw(CODECS)))
        offset += len(records) + draw(st.integers(0, 3))
    return out


def decode_all(data: bytes) -> list[tuple[Record, int]]:
    """(record, attributes of its batch) for every record in `data`."""
    found = []
    for header in validate_replicated_batches(data):
        for record in decode_records(data[header.position : header.position + header.size]):
            found.append((record, header.attributes))
    return found


def clean(
    data: bytes, start: int, now_ms: int, retention_ms: int, decisions: BatchDecisions | None = None
) -> tuple[bytes, OffsetMap, IndexBuilder]:
    offset_map = OffsetMap(1 << 16)
    map_buffer(offset_map, data, start, LIMIT, decisions)
    out = bytearray(len(data) * 2 + 1024)
    builder = IndexBuilder(0, 40, 1000, 1000)
    result = filter_buffer(
        offset_map, data, out, 0, builder, now_ms, retention_ms, LIMIT, decisions
    )
    assert result.consumed == len(data)
    return bytes(out[: result.written]), offset_map, builder


def model(data: bytes, start: int, now_ms: int) -> list[Record]:
    records = decode_all(data)
    last: dict[bytes, int] = {}
    latest = -1
    for header in validate_replicated_batches(data):
        if header.last_offset >= start:
            latest = max(latest, header.last_offset)
    for record, _ in records:
        if record.key is not None and record.offset >= start:
            last[record.key] = record.offset
    kept = []
    for record, attributes in records:
        if record.offset > latest:
            kept.append(record)
            continue
        if record.key is None or record.offset < last.get(record.key, -1):
            continue
        if record.value is None and attributes & DELETE_HORIZON_BIT:
            header = next(
                h
                for h in validate_replicated_batches(data)
                if h.base_offset <= record.offset <= h.last_offset
            )
            if now_ms >= header.base_timestamp:
                continue
        kept.append(record)
    return kept


@given(batches(), st.integers(0, 10), st.integers(0, 20_000))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_cleaning_keeps_exactly_the_latest_record_of_each_key(
    raw: list[bytes], start: int, now_ms: int
) -> None:
    data = b"".join(raw)
    cleaned, _, _ = clean(data, start, now_ms, retention_ms=500)
    assert [record for record, _ in decode_all(cleaned)] == model(data, start, now_ms)
    before = {h.base_offset: h for h in validate_replicated_batches(data)}
    for header in validate_replicated_batches(cleaned):
        original = before[header.base_offset]
        assert header.last_offset_delta == original.last_offset_delta
        assert header.compression == original.compression
        assert header.partition_leader_epoch == original.partition_leader_epoch
        records = decode_records(cleaned[header.position : header.position + header.size])
        if any(r.value is None for r in records) and not original.attributes & DELETE_HORIZON_BIT:
            assert delete_horizon(header) == now_ms + 500
        if records:
            assert header.max_timestamp == max(r.timestamp for r in records)


@given(batches(), st.integers(0, 20_000), st.integers(0, 1_000))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_tombstones_go_once_their_horizon_has_passed(
    raw: list[bytes], now_ms: int, retention_ms: int
) -> None:
    data = b"".join(raw)
    first, _, _ = clean(data, 0, now_ms, retention_ms)
    again, _, _ = clean(first, 0, now_ms + retention_ms - 1, retention_ms)
    assert decode_all(again) == decode_all(first)  # within the horizon: nothing changes
    last, _, _ = clean(first, 0, now_ms + retention_ms, retention_ms)
    records = [record for record, _ in decode_all(last)]
    assert all(record.value is not None for record in records)
    assert records == [record for record, _ in decode_all(first) if record.value is not None]


@given(batches(), st.integers(0, 50))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_index_entries_are_those_a_segment_computes(
    tmp_path_factory: pytest.TempPathFactory, raw: list[bytes], interval: int
) -> None:
    data = b"".join(raw)
    offset_map = OffsetMap(1 << 16)
    map_buffer(offset_map, data, 0, LIMIT)
    out = bytearray(len(data) * 2)
    builder = IndexBuilder(0, interval, 1000, 666)
    result = filter_buffer(offset_map, data, out, 0, builder, 0, 0, LIMIT)
    offsets, times = builder.finish()
    directory = tmp_path_factory.mktemp("segment")
    (directory / f"{0:020d}.log").write_bytes(out[: result.written])
    segment = LogSegment(
        directory,
        0,
        max_index_bytes=8000,
        index_interval_bytes=interval,
        size=result.written,
        created_ms=0,
    )
    segment.rebuild_indexes()
    segment.on_become_inactive()
    assert offsets == segment.offset_index.path.read_bytes()
    assert times == segment.time_index.path.read_bytes()
    segment.close()


def test_a_full_map_covers_only_what_it_holds() -> None:
    records = [(f"k{i}".encode(), b"v", [], 0) for i in range(40)]
    data = build_batch(records[:20], 0) + build_batch(records[20:], 20)
    offset_map = OffsetMap(_compaction.SLOT_SIZE * 30, 0.9)  # 27 keys at most
    result = map_buffer(offset_map, data, 0, LIMIT)
    assert result.map_full and result.consumed == read_header(data).size
    assert offset_map.latest_offset == 19  # the first batch, mapped whole


def test_a_map_too_small_for_one_batch_still_makes_progress() -> None:
    data = build_batch([(f"k{i}".encode(), b"v", [], 0) for i in range(10)], 7)
    offset_map = OffsetMap(_compaction.SLOT_SIZE * 5, 0.9)
    assert map_buffer(offset_map, data, 0, LIMIT).map_full
    assert offset_map.latest_offset == 7 + offset_map.size - 1


def test_decisions_retain_empty_discard_and_set_horizon() -> None:
    data = (
        build_batch([(b"a", b"1", [], 10)], 0, producer_id=7, producer_epoch=1, base_sequence=0)
        + build_batch([(b"a", b"2", [], 11)], 1, CompressionType.LZ4)
        + build_batch([(b"b", b"1", [], 12)], 2)
        + build_batch([(b"c", b"1", [], 13)], 3)
        + build_batch([(b"a", b"3", [], 14)], 4)
    )
    decisions = BatchDecisions([(0, RETAIN_EMPTY), (1, RETAIN_EMPTY), (2, DISCARD_RECORDS)])
    decisions.set(3, SET_HORIZON)
    cleaned, offset_map, _ = clean(data, 0, 1000, 50, decisions)
    headers = validate_replicated_batches(cleaned)
    assert [(h.base_offset, h.records_count) for h in headers] == [(0, 0), (1, 0), (3, 1), (4, 1)]
    empty = headers[0]
    assert (empty.producer_id, empty.producer_epoch, empty.last_offset_delta) == (7, 1, 0)
    assert empty.base_timestamp == empty.max_timestamp == 10
    assert headers[1].compression == CompressionType.NONE
    assert delete_horizon(headers[2]) == 1050
    assert offset_map.get(b"b") == -1  # a discarded batch is not mapped


def test_keyless_records_are_removed_but_unmapped_ones_stay() -> None:
    data = build_batch([(None, b"x", [], 0), (b"a", b"1", [], 0)], 0) + build_batch(
        [(None, b"y", [], 0)], 2
    )
    offset_map = OffsetMap(1 << 12)
    map_buffer(offset_map, data[: read_header(data).size], 0, LIMIT)
    out = bytearray(1024)
    result = filter_buffer(offset_map, data, out, 0, IndexBuilder(0, 0, 10, 10), 0, 0, LIMIT)
    kept = [r.offset for r, _ in decode_all(bytes(out[: result.written]))]
    assert kept == [1, 2]  # offset 2 lies past the map's latest offset (1)


def test_an_output_buffer_too_small_is_reported() -> None:
    data = build_batch([(b"a", b"1" * 100, [], 0)], 0)
    offset_map = OffsetMap(1 << 12)
    map_buffer(offset_map, data, 0, LIMIT)
    result = filter_buffer(
        offset_map, data, bytearray(50), 0, IndexBuilder(0, 0, 10, 10), 0, 0, LIMIT
    )
    assert result.output_full and result.consumed == 0 and result.needed >= len(data)


def test_incomplete_and_corrupt_batches() -> None:
    data = build_batch([(b"a", b"1", [], 0)], 0)
    offset_map = OffsetMap(1 << 12)
    result = map_buffer(offset_map, data[:-1], 0, LIMIT)
    assert result.consumed == 0 and result.needed == len(data)
    broken = bytearray(data)
    broken[-3] = 0x7F  # the record's last varint now claims bytes that are not there
    with pytest.raises(CorruptRecordError):
        map_buffer(offset_map, bytes(broken), 0, LIMIT)
    tiny = bytearray(data)
    struct.pack_into(">i", tiny, 8, 10)
    with pytest.raises(CorruptRecordError, match="batchLength"):
        map_buffer(offset_map, bytes(tiny), 0, LIMIT)


def test_crc_and_digest_against_references() -> None:
    import google_crc32c

    for size in (0, 1, 7, 8, 9, 100, 4096 + 3):
        data = os.urandom(size)
        assert _compaction.crc32c(data) == google_crc32c.value(data)
    # SipHash-2-4-128's first reference vector (key 00..0f, empty message).
    assert _compaction.siphash128(bytes(range(16)), b"").hex() == "a3817f04ba25a8e66df67214c7550293"


def test_the_map_refuses_a_second_thread_and_clears() -> None:
    offset_map = OffsetMap(1 << 20)
    for i in range(1000):
        assert offset_map.put(str(i).encode(), i)
    assert offset_map.size == 1000 and offset_map.get(b"999") == 999
    offset_map.clear(64)
    assert offset_map.size == 0 and offset_map.capacity == 64 and offset_map.get(b"999") == -1
    assert offset_map.max_size == int(64 * 0.9)
