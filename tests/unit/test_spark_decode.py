"""The native Arrow decoder (`odradek.spark.decode`) against the Python decoder (`decode_records`)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odradek.coordinator.transaction.log_records import build_marker_batch
from odradek.errors import CorruptRecordError
from odradek.protocol.record_batch import (
    CompressionType,
    assign_offsets,
    build_batch,
    decode_records,
    iter_batches,
)
from odradek.spark.arrow import arrow_schema, source_schema
from odradek.spark.decode import ArrowDecoder

SCHEMA = arrow_schema(source_schema(True))
SCHEMA_NO_HEADERS = arrow_schema(source_schema(False))

maybe_bytes = st.one_of(st.none(), st.binary(max_size=40))
record = st.tuples(
    maybe_bytes,
    maybe_bytes,
    st.lists(st.tuples(st.text(max_size=8), maybe_bytes), max_size=3),
    st.integers(min_value=-1, max_value=2**41),
)
data_batch = st.tuples(
    st.just("data"),
    st.lists(record, min_size=1, max_size=12),
    st.sampled_from(list(CompressionType)),
    st.booleans(),  # LogAppendTime
)
control_batch = st.tuples(st.just("control"), st.booleans(), st.none(), st.none())


def _log(batches: list[tuple]) -> tuple[bytes, list[bytes]]:
    """The batches back to back with consecutive offsets from 5, as a Fetch returns them."""
    out = bytearray()
    pieces = []
    offset = 5
    for kind, records, codec, log_append in batches:
        if kind == "data":
            raw = bytearray(build_batch(records, compression=codec))
        else:
            raw = bytearray(build_marker_batch(7, 0, records, 3, 1_700_000_000_000))
        headers = list(iter_batches(raw))
        (header,) = assign_offsets(raw, headers, offset, 0, 1_234_567 if log_append else None)
        offset = header.next_offset
        pieces.append(bytes(raw))
        out += raw
    return bytes(out), pieces


def _expected(pieces: list[bytes], low: int, high: int, headers: bool) -> list[dict]:
    rows = []
    for piece in pieces:
        (header,) = iter_batches(piece)
        if header.is_control:
            continue
        for r in decode_records(piece):
            if low <= r.offset < high:
                row = {
                    "key": r.key,
                    "value": r.value,
                    "topic": "t",
                    "partition": 3,
                    "offset": r.offset,
                    "timestamp": r.timestamp * 1000,
                    "timestampType": int(header.timestamp_type),
                }
                if headers:
                    row["headers"] = [{"key": k, "value": v} for k, v in r.headers] or None
                rows.append(row)
    return rows


def _rows(batch: pa.RecordBatch) -> list[dict]:
    table = pa.Table.from_batches([batch])
    table = table.set_column(
        table.schema.get_field_index("timestamp"),
        "timestamp",
        table.column("timestamp").cast(pa.int64()),
    )
    return table.to_pylist()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.one_of(data_batch, control_batch), min_size=1, max_size=6),
    st.integers(min_value=0, max_value=80),
    st.integers(min_value=0, max_value=80),
    st.integers(min_value=0, max_value=60),
    st.booleans(),
)
def test_rows_match_the_python_decoder(batches, low, width, cut, headers) -> None:
    buf, pieces = _log(batches)
    high = low + width
    schema = SCHEMA if headers else SCHEMA_NO_HEADERS
    decoder = ArrowDecoder("t", 3, schema)
    # A fetch response may end in a partial batch: it is left for the next fetch.
    truncated = buf[: len(buf) - cut] if cut < len(pieces[-1]) else buf
    complete = pieces if truncated == buf else pieces[:-1]
    following = decoder.add(truncated, low, high)
    nexts = [h.next_offset for p in complete for h in iter_batches(p)]
    if nexts and nexts[-1] - 1 >= high:
        assert following >= high  # the decoder may stop at the first batch past the range
    else:
        assert following == max([low, *nexts])
    batch = decoder.take()
    assert batch.schema == schema
    assert _rows(batch) == _expected(complete, low, high, headers)
    assert decoder.rows == 0


def test_next_offset_is_after_the_last_complete_batch() -> None:
    buf, _pieces = _log([("data", [(b"k", b"v", [], 1)] * 3, CompressionType.NONE, False)] * 2)
    decoder = ArrowDecoder("t", 3, SCHEMA)
    assert decoder.add(buf, 0, 100) == 11
    assert decoder.add(buf[:-1], 0, 100) == 8
    assert decoder.add(b"", 9, 100) == 9


def test_chunks_accumulate_across_adds() -> None:
    buf, _pieces = _log(
        [("data", [(b"k", b"v" * 10, [("h", None)], 1)] * 4, CompressionType.ZSTD, False)]
    )
    decoder = ArrowDecoder("t", 0, SCHEMA)
    decoder.add(buf, 0, 7)
    decoder.add(buf, 7, 100)
    rows = decoder.take().to_pylist()
    assert [r["offset"] for r in rows] == [5, 6, 7, 8]
    assert rows[0]["headers"] == [{"key": "h", "value": None}]


def _transactional(producer_id: int, records: int) -> bytearray:
    return bytearray(
        build_batch(
            [(None, b"x", [], 1)] * records,
            producer_id=producer_id,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        )
    )


def _marker(producer_id: int, commit: bool) -> bytearray:
    return bytearray(build_marker_batch(producer_id, 0, commit, 1, 2))


def _at_offsets_from_zero(parts: list[bytearray]) -> bytes:
    """The batches back to back with consecutive offsets from 0."""
    out = bytearray()
    offset = 0
    for raw in parts:
        (header,) = assign_offsets(raw, list(iter_batches(raw)), offset, 0)
        offset = header.next_offset
        out += raw
    return bytes(out)


def test_aborted_transactions_are_dropped() -> None:
    out = _at_offsets_from_zero(
        [_transactional(7, 2), _marker(7, False), _transactional(7, 3), _marker(7, True)]
    )
    decoder = ArrowDecoder("t", 0, SCHEMA_NO_HEADERS)
    assert decoder.add(out, 0, 100, aborted=[(7, 0)]) == 7
    assert decoder.take().column("offset").to_pylist() == [3, 4, 5]
    decoder.add(out, 0, 100)
    assert decoder.take().column("offset").to_pylist() == [0, 1, 3, 4, 5]


def test_aborted_transactions_of_several_producers_are_dropped_in_offset_order() -> None:
    """The Fetch response lists aborted transactions in any order: a later transaction of a
    smaller producer id must not hide an earlier one of a larger id (the decoder once kept its
    heap ordered by producer id, and returned producer 9's aborted records)."""
    out = _at_offsets_from_zero(
        [
            _transactional(9, 2),  # offsets 0-1, aborted
            _marker(9, False),  # 2
            _transactional(5, 2),  # 3-4, aborted
            _marker(5, False),  # 5
            _transactional(5, 1),  # 6, committed
            _marker(5, True),  # 7
        ]
    )
    for aborted in ([(9, 0), (5, 3)], [(5, 3), (9, 0)]):
        decoder = ArrowDecoder("t", 0, SCHEMA_NO_HEADERS)
        decoder.add(out, 0, 100, aborted=aborted)
        assert decoder.take().column("offset").to_pylist() == [6]


def test_malformed_records_are_a_corrupt_record_error() -> None:
    raw = bytearray(build_batch([(b"k", b"v", [], 1)] * 2))
    raw[-3] = 0x7F  # the second record's value length now runs past its end
    decoder = ArrowDecoder("t", 0, SCHEMA)
    with pytest.raises(CorruptRecordError, match="t-0: batch at offset 0"):
        decoder.add(bytes(raw), 0, 10)
    assert decoder.rows == 0


def test_batches_taken_stay_whole_while_later_chunks_reuse_freed_memory() -> None:
    """Column memory of dropped batches is kept for the next chunks (`_arrow`'s pool), and the
    topic and partition columns are slices of arrays built once: a batch still held must not
    change however many chunks of other sizes come after it."""
    decoder = ArrowDecoder("a-topic", 3, SCHEMA_NO_HEADERS)
    kept: list[tuple[pa.RecordBatch, list[dict]]] = []
    offset = 0
    for chunk, rows in enumerate([3000, 1000, 5000, 800, 4000, 3000, 200, 6000]):
        records = [(None, bytes([chunk]) * 100 + i.to_bytes(4, "big"), [], 7) for i in range(rows)]
        raw = bytearray(build_batch(records))
        assign_offsets(raw, list(iter_batches(raw)), offset, 0, None)
        decoder.add(bytes(raw), offset, offset + rows)
        batch = decoder.take()
        expected = [
            {
                "key": None,
                "value": value,
                "topic": "a-topic",
                "partition": 3,
                "offset": offset + i,
                "timestamp": 7000,
                "timestampType": 0,
            }
            for i, (_, value, _, _) in enumerate(records)
        ]
        offset += rows
        if chunk % 2 == 0:
            kept.append((batch, expected))  # the odd chunks' memory goes back to the pool
    for batch, expected in kept:
        assert _rows(batch) == expected


def test_timestamps_wrap_as_before_when_milliseconds_overflow_microseconds() -> None:
    """Microseconds are computed natively with the wrap-around of an unchecked int64 multiply
    (what `pyarrow.compute.multiply` gave before): no crash, and the same value."""
    huge = 2**62 + 12345
    raw = bytearray(build_batch([(None, b"v", [], huge)]))
    assign_offsets(raw, list(iter_batches(raw)), 0, 0, None)
    decoder = ArrowDecoder("t", 0, SCHEMA_NO_HEADERS)
    decoder.add(bytes(raw), 0, 1)
    [row] = _rows(decoder.take())
    wrapped = (huge * 1000 + 2**63) % 2**64 - 2**63
    assert row["timestamp"] == wrapped
