"""The native record walker against its pure-Python reference (odradek.protocol.records).

The reference states the rules plainly; the native walker is what the broker runs. They must
agree on every input: on random well-formed records sections (same timestamps, same layouts, same
bytes at the positions the layout names) and on random damage to them (bit flips, cut and spliced
bytes, rewritten varints, wrong record counts, random bytes) — same verdict and same message, and
the native walker never crashes. A few hand-written sections pin each rule.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from odradek.errors import InvalidRecordError
from odradek.protocol import records
from odradek.protocol.records import (
    find_timestamp,
    index_records,
    reference_find_timestamp,
    reference_index,
    reference_scan,
    scan_records,
)
from tests.fuzz.record_batches import RawRecord, encode_record, records_section, varint

INT64 = st.integers(-(2**63), 2**63 - 1)
SMALL_BYTES = st.binary(max_size=40)
NULLABLE = st.none() | SMALL_BYTES
HEADER_KEYS = st.text(max_size=12).map(lambda text: text.encode("utf-8", "surrogatepass"))


def test_the_native_walker_is_built() -> None:
    """CI must run the native walker, not the fallback (`pip install -e .` builds it)."""
    assert records.NATIVE


@st.composite
def well_formed(draw: st.DrawFn) -> tuple[bytes, int, int, list[RawRecord]]:
    """(records section, count, base timestamp, the records)."""
    count = draw(st.integers(0, 12))
    base = draw(INT64)
    raws = [
        RawRecord(
            key=draw(NULLABLE),
            value=draw(NULLABLE),
            headers=draw(st.lists(st.tuples(HEADER_KEYS, NULLABLE), max_size=3)),
            offset_delta=i,
            timestamp_delta=draw(st.integers(-(2**40), 2**40) | INT64),
            attributes=draw(st.integers(0, 255)),
        )
        for i in range(count)
    ]
    return records_section(raws), count, base, raws


def outcome(function, *args):  # type: ignore[no-untyped-def]
    try:
        return function(*args)
    except InvalidRecordError as e:
        return ("refused", str(e))


@given(well_formed(), INT64, INT64)
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_well_formed_sections_agree(
    section: tuple[bytes, int, int, list[RawRecord]], lower: int, upper: int
) -> None:
    payload, count, base, raws = section
    native, reference = scan_records(payload, count, base), reference_scan(payload, count, base)
    assert native == reference
    bounded = scan_records(payload, count, base, lower, upper)
    assert bounded == reference_scan(payload, count, base, lower, upper)
    keyed = scan_records(payload, count, base, lower, upper, require_keys=True)
    assert keyed == reference_scan(payload, count, base, lower, upper, require_keys=True)
    assert keyed.keyless == tuple(i for i, raw in enumerate(raws) if raw.key is None)
    assert keyed.keyless_count == len(keyed.keyless)
    assert not set(keyed.keyless) & {i for i, _ in keyed.outside}
    layouts = index_records(payload, count, base)
    assert layouts == reference_index(payload, count, base)
    for i, (raw, layout) in enumerate(zip(raws, layouts, strict=True)):
        assert layout.offset_delta == i
        assert layout.timestamp == (base + raw.timestamp_delta + 2**63) % 2**64 - 2**63
        key = payload[layout.key_position : layout.key_position + layout.key_length]
        assert (None if layout.key_length < 0 else key) == raw.key
        value = payload[layout.value_position : layout.value_position + layout.value_length]
        assert (None if layout.value_length < 0 else value) == raw.value
        assert layout.header_count == len(raw.headers)
    if layouts:
        assert layouts[-1].end == len(payload)


MUTATIONS = st.sampled_from(
    ["flip", "cut", "insert", "delete", "splice", "varint", "count", "tail", "replace"]
)


@st.composite
def damaged(draw: st.DrawFn) -> tuple[bytes, int, int]:
    payload, count, base, _raws = draw(well_formed())
    data = bytearray(payload)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(MUTATIONS)
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del data[position:]
        elif kind == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and data:
            del data[position : position + draw(st.integers(1, 8))]
        elif kind == "splice":
            data[position : position + 1] = draw(st.binary(max_size=12))
        elif kind == "varint":
            value = draw(st.integers(-(2**40), 2**40) | st.sampled_from([-2, -1, 0, 2**31]))
            raw = varint(value)
            if draw(st.booleans()):
                raw = b"\x80" * draw(st.integers(1, 10)) + raw  # overlong encodings
            data[position : position + draw(st.integers(0, 5))] = raw
        elif kind == "count":
            count = draw(st.integers(-3, 2**31 - 1) | st.integers(max(count - 2, -1), count + 2))
        elif kind == "tail":
            data += draw(st.binary(min_size=1, max_size=8))
        elif kind == "replace":
            data = bytearray(draw(st.binary(max_size=80)))
    return bytes(data), count, base


@given(damaged(), INT64, INT64)
@settings(max_examples=3000, suppress_health_check=[HealthCheck.too_slow])
@example((b"\x80\x80\x80\x80\x10", 1, 0), 0, 0)  # a varint with bits beyond 32
@example((b"\x0c\x00\x00\x00\x03k\x02v\x00", 1, 0), 0, 0)  # key length 1, value runs over
def test_damaged_sections_get_the_same_verdict(
    section: tuple[bytes, int, int], lower: int, upper: int
) -> None:
    payload, count, base = section
    assert outcome(scan_records, payload, count, base, lower, upper) == outcome(
        reference_scan, payload, count, base, lower, upper
    )
    assert outcome(index_records, payload, count, base) == outcome(
        reference_index, payload, count, base
    )


@given(st.binary(max_size=200), st.integers(-5, 40), INT64)
@settings(max_examples=1000)
def test_random_bytes_get_the_same_verdict(payload: bytes, count: int, base: int) -> None:
    assert outcome(scan_records, payload, count, base) == outcome(
        reference_scan, payload, count, base
    )


def test_memoryview_and_bytearray_inputs() -> None:
    payload = records_section([RawRecord(offset_delta=i) for i in range(3)])
    padded = b"xx" + payload + b"yy"
    view = memoryview(padded)[2:-2]
    assert scan_records(view, 3, 5) == scan_records(bytearray(payload), 3, 5)


def one(**fields: object) -> bytes:
    return encode_record(RawRecord(**fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("payload", "count", "message"),
    [
        (one(value=b"x" * 20), 2, "record 1: the length varint is cut short"),
        (one() + b"\x00", 1, "1 bytes follow the last of the 1 records"),
        (one(length_adjust=1), 1, "record 0 has length 9 but only 8 bytes of records remain"),
        (one(length_raw=varint(-3)), 1, "record 0 has a negative length -3"),
        (one(length_raw=b"\x80" * 5 + b"\x00"), 1, "record 0: the length varint is too long"),
        (one(timestamp_raw=b"\x80" * 10 + b"\x00"), 1, "the timestampDelta varint is too long"),
        (one(timestamp_raw=b"\x80" * 9 + b"\x02"), 1, "the timestampDelta varint does not fit"),
        (one(offset_raw=b"\x80\x80\x80\x80\x10"), 1, "the offsetDelta varint does not fit"),
        (one(offset_delta=1), 1, "record 0 has offsetDelta 1"),
        (one(key_raw=varint(-2)), 1, "record 0 has key length -2"),
        (one(value_raw=varint(-9)), 1, "record 0 has value length -9"),
        (one(key_raw=varint(30) + b"k"), 1, "its key of 30 bytes runs past the record"),
        (one(headers_raw=varint(-1)), 1, "record 0 has header count -1"),
        (one(headers_raw=varint(5)), 1, "5 headers cannot fit"),
        (one(headers_raw=varint(1) + varint(-1) + varint(-1)), 1, "header keys cannot be null"),
        (one(headers_raw=varint(1) + varint(1) + b"h" + varint(-2)), 1, "value length -2"),
        (b"", -1, "recordsCount -1 is negative"),
        (one(), 2**31 - 1, "cannot fit in 9 bytes of records"),
    ],
)
def test_each_rule(payload: bytes, count: int, message: str) -> None:
    for function in (scan_records, reference_scan):
        with pytest.raises(InvalidRecordError, match=message.replace("(", r"\(")):
            function(payload, count, 0)


def test_nulls_and_minus_one_timestamps() -> None:
    payload = records_section(
        [
            RawRecord(key=None, value=None, headers=[(b"h", None)]),
            RawRecord(offset_delta=1, timestamp_delta=0),
        ]
    )
    # base -1: both records have "no timestamp", which bounds never refuse
    assert scan_records(payload, 2, -1, 0, 10)[:3] == (-1, -1, ())
    assert scan_records(payload, 2, 20, 0, 10).outside == ((0, 20), (1, 20))
    assert scan_records(payload, 2, 5, 0, 10).outside == ()


def test_at_most_a_thousand_records_outside_the_bounds_are_listed() -> None:
    count = 5000
    payload = records_section(
        [RawRecord(key=None, value=None, offset_delta=i) for i in range(count)]
    )
    for function in (scan_records, reference_scan):
        outside = function(payload, count, 99, 0, 10).outside
        assert len(outside) == 1000 and outside[-1] == (999, 99)


def test_a_huge_count_is_refused_before_any_allocation() -> None:
    with pytest.raises(InvalidRecordError):
        index_records(b"\x00" * 70, 2**31 - 1, 0)


@given(well_formed(), st.data())
@settings(max_examples=400)
def test_every_cut_of_a_well_formed_section_passes_a_prefix_walk(
    section: tuple[bytes, int, int, list[RawRecord]], data: st.DataObject
) -> None:
    payload, count, base, _raws = section
    cut = data.draw(st.integers(0, len(payload)))
    for function in (scan_records, reference_scan):
        function(payload[:cut], count, base, prefix=True)


@given(damaged(), st.integers(0, 200))
@settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
def test_damaged_prefixes_get_the_same_verdict(section: tuple[bytes, int, int], cut: int) -> None:
    payload, count, base = section
    assert outcome(scan_records, payload[:cut], count, base, None, None, True) == outcome(
        reference_scan, payload[:cut], count, base, None, None, True
    )


def test_a_prefix_walk_refuses_garbage_it_has_seen() -> None:
    zeros = bytes(4096)  # record 0 has length 0: no attributes byte
    for function in (scan_records, reference_scan):
        with pytest.raises(InvalidRecordError, match="no attributes byte"):
            function(zeros, 1000, 0, prefix=True)


@given(st.binary(max_size=12) | HEADER_KEYS)
@example(b"\xed\xa0\x80")  # an encoded surrogate
@example(b"\xc0\xaf")  # an overlong "/"
@example(b"\xf4\x90\x80\x80")  # above U+10FFFF
@example(b"\xf0\x9f\x98")  # cut short
def test_header_keys_must_be_utf8_as_python_decodes_it(key: bytes) -> None:
    payload = encode_record(RawRecord(headers=[(key, b"v")]))
    try:
        key.decode()
        valid = True
    except UnicodeDecodeError:
        valid = False
    for function in (scan_records, reference_scan):
        if valid:
            function(payload, 1, 0)
        else:
            with pytest.raises(InvalidRecordError, match="is not UTF-8"):
                function(payload, 1, 0)


@given(well_formed(), INT64, st.integers(-2, 14))
@settings(max_examples=400)
def test_find_timestamp_agrees_with_the_reference(
    section: tuple[bytes, int, int, list[RawRecord]], target: int, min_delta: int
) -> None:
    payload, count, base, _raws = section
    assert find_timestamp(payload, count, base, target, min_delta) == (
        reference_find_timestamp(payload, count, base, target, min_delta)
    )


@given(well_formed(), st.data())
@settings(max_examples=300)
def test_stored_records_may_have_gaps_in_their_offset_deltas(
    section: tuple[bytes, int, int, list[RawRecord]], data: st.DataObject
) -> None:
    """Compaction keeps each record's offset delta and removes records around it: a stored walk
    (what reads of the log use) accepts increasing deltas with gaps, a producer's walk does not."""
    _payload, count, base, raws = section
    gaps = data.draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
    deltas = [sum(gaps[: i + 1]) + i for i in range(count)]
    thinned = [
        dataclasses.replace(raw, offset_delta=delta)
        for raw, delta in zip(raws, deltas, strict=True)
    ]
    payload = records_section(thinned)
    layouts = index_records(payload, count, base, stored=True)
    assert layouts == reference_index(payload, count, base, stored=True)
    assert [layout.offset_delta for layout in layouts] == deltas
    target = data.draw(INT64)
    assert find_timestamp(payload, count, base, target, 0) == (
        reference_find_timestamp(payload, count, base, target, 0)
    )
    if deltas != list(range(count)):
        for function in (scan_records, index_records, reference_scan, reference_index):
            with pytest.raises(InvalidRecordError, match="consecutive offset deltas"):
                function(payload, count, base)


@pytest.mark.parametrize("deltas", [[1, 1], [2, 0], [-1, 3]])
def test_stored_offset_deltas_must_increase(deltas: list[int]) -> None:
    raws = [RawRecord(key=b"k", value=b"v", offset_delta=d) for d in deltas]
    payload = records_section(raws)
    for function in (index_records, reference_index):
        with pytest.raises(InvalidRecordError, match="increasing offset deltas"):
            function(payload, len(raws), 0, True)
