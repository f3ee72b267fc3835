"""RecordBatch v2 view: parsing, validation errors, patching, and the record helpers."""

from __future__ import annotations

import struct

import google_crc32c
import pytest

from odradek.errors import (
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedCompressionTypeError,
)
from odradek.protocol.record_batch import (
    HEADER_SIZE,
    CompressionType,
    TimestampType,
    assign_offsets,
    build_batch,
    compute_crc,
    decode_records,
    find_timestamp_in_batch,
    iter_batches,
    read_header,
    set_create_time,
    set_log_append_time,
    validate_replicated_batches,
)


def batch(n: int = 3, ts: int = 1_000, value_size: int = 10, **kwargs: object) -> bytes:
    records = [(f"k{i}".encode(), bytes([i % 256]) * value_size, [], ts + i) for i in range(n)]
    return build_batch(records, **kwargs)  # type: ignore[arg-type]


def crc_ok(buf: bytes | bytearray, position: int = 0) -> bool:
    header = read_header(buf, position)
    covered = bytes(buf[position + 21 : position + header.size])
    return google_crc32c.value(covered) == header.crc


def test_header_fields_and_derived_properties() -> None:
    data = batch(4, ts=500, base_offset=10, producer_id=7, producer_epoch=2, base_sequence=3)
    header = read_header(data)
    assert header.base_offset == 10
    assert header.size == len(data)
    assert header.batch_length == len(data) - 12
    assert header.magic == 2
    assert header.records_count == 4
    assert header.last_offset_delta == 3
    assert header.last_offset == 13
    assert header.next_offset == 14
    assert header.base_timestamp == 500
    assert header.max_timestamp == 503
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 3)
    assert header.compression == CompressionType.NONE
    assert header.timestamp_type == TimestampType.CREATE_TIME
    assert not header.is_control and not header.is_transactional
    assert crc_ok(data)


def test_transactional_flag() -> None:
    assert read_header(batch(1, is_transactional=True)).is_transactional


def test_iter_batches_positions_and_partial_tail() -> None:
    a, b = batch(2), batch(5)
    buf = a + b + b[:30]
    headers = list(iter_batches(buf))
    assert [h.position for h in headers] == [0, len(a)]
    assert [h.records_count for h in headers] == [2, 5]
    assert list(iter_batches(memoryview(buf), start=len(a))) == [headers[1]]
    # A tail shorter than a header, or a header whose batch is incomplete, is not yielded.
    assert len(list(iter_batches(a + b[: HEADER_SIZE + 3]))) == 1


def test_iter_batches_rejects_impossible_length() -> None:
    bad = bytearray(batch(1))
    struct.pack_into(">i", bad, 8, 10)
    with pytest.raises(CorruptRecordError):
        list(iter_batches(bytes(bad)))


def _with_fields(data: bytes, **fields: int) -> bytes:
    """Rewrite header fields and fix the CRC so that only the named problem remains."""
    offsets = {
        "attributes": (21, ">h"),
        "last_offset_delta": (23, ">i"),
        "records_count": (57, ">i"),
    }
    buf = bytearray(data)
    for name, value in fields.items():
        position, fmt = offsets[name]
        struct.pack_into(fmt, buf, position, value)
    struct.pack_into(">I", buf, 17, compute_crc(buf, read_header(buf)))
    return bytes(buf)


def test_replicated_validation_skips_size_limit_but_checks_crc() -> None:
    data = batch(3, value_size=200, base_offset=40)
    assert validate_replicated_batches(data)[0].base_offset == 40
    bad = bytearray(data)
    bad[100] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        validate_replicated_batches(bytes(bad))


def test_assign_offsets_patches_without_touching_crc() -> None:
    data = batch(2) + batch(3)
    headers = validate_replicated_batches(data)
    buf = bytearray(data)
    patched = assign_offsets(buf, headers, first_offset=100, leader_epoch=7)
    assert [(h.base_offset, h.last_offset) for h in patched] == [(100, 101), (102, 104)]
    reread = list(iter_batches(buf))
    assert [h.base_offset for h in reread] == [100, 102]
    assert all(h.partition_leader_epoch == 7 for h in reread)
    assert [h.crc for h in reread] == [h.crc for h in headers]
    assert crc_ok(buf, 0) and crc_ok(buf, reread[1].position)
    validate_replicated_batches(bytes(buf))
    assert [r.offset for r in decode_records(bytes(buf[reread[1].position :]))] == [102, 103, 104]


def test_log_append_time_recomputes_crc() -> None:
    data = batch(3, ts=1_000)
    buf = bytearray(data)
    headers = validate_replicated_batches(data)
    patched = assign_offsets(buf, headers, 0, 1, log_append_time_ms=99_999)
    header = read_header(buf)
    assert header == patched[0]
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == 99_999
    assert header.crc != headers[0].crc
    assert crc_ok(buf)
    validate_replicated_batches(bytes(buf))
    assert {r.timestamp for r in decode_records(bytes(buf))} == {99_999}


def test_set_log_append_time_single_batch() -> None:
    buf = bytearray(batch(1))
    header = set_log_append_time(buf, read_header(buf), 5)
    assert header.max_timestamp == 5 and crc_ok(buf)


def test_build_and_decode_round_trip_with_headers_and_nulls() -> None:
    records = [
        (None, b"v0", [("h", b"x"), ("empty", None)], 10),
        (b"key", None, [], 8),  # timestamps may go backwards: negative delta
        (b"", b"", [], 2**40),
    ]
    for compression in (CompressionType.NONE, CompressionType.GZIP):
        data = build_batch(records, base_offset=5, compression=compression)
        header = read_header(data)
        assert header.compression == compression
        assert header.max_timestamp == 2**40
        decoded = decode_records(data)
        assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in decoded] == [
            (5, None, b"v0", [("h", b"x"), ("empty", None)], 10),
            (6, b"key", None, [], 8),
            (7, b"", b"", [], 2**40),
        ]


def test_unsupported_codecs_in_helpers() -> None:
    with pytest.raises(UnsupportedCompressionTypeError):
        decode_records(_with_fields(batch(1), attributes=6))  # no such codec


@pytest.mark.parametrize(
    "compression", [CompressionType.SNAPPY, CompressionType.LZ4, CompressionType.ZSTD]
)
def test_every_codec_round_trips_through_the_helpers(compression: CompressionType) -> None:
    records = [(b"k", b"v" * 50, [("h", b"x")], 7), (None, b"w", [], 9)]
    data = build_batch(records, 40, compression)
    assert read_header(data).compression == compression
    assert [(r.offset, r.key, r.value, r.timestamp) for r in decode_records(data)] == [
        (40, b"k", b"v" * 50, 7),
        (41, None, b"w", 9),
    ]
    # A batch claiming the codec but holding garbage is corrupt, not a crash.
    with pytest.raises(CorruptRecordError):
        decode_records(_with_fields(batch(1), attributes=int(compression)))


def test_decode_rejects_garbage_records() -> None:
    data = bytearray(batch(2))
    data[HEADER_SIZE] = 0x7F  # first record claims a length far past the batch
    with pytest.raises(InvalidRecordError):
        decode_records(bytes(data))


def test_find_timestamp_in_batch() -> None:
    data = build_batch([(None, b"a", [], 10), (None, b"b", [], 30), (None, b"c", [], 20)], 100)
    assert find_timestamp_in_batch(data, 5) == (100, 10)
    assert find_timestamp_in_batch(data, 25) == (101, 30)
    assert find_timestamp_in_batch(data, 30) == (101, 30)
    for compression in (CompressionType.SNAPPY, CompressionType.LZ4, CompressionType.ZSTD):
        compressed = build_batch(
            [(None, b"a", [], 10), (None, b"b", [], 30), (None, b"c", [], 20)], 100, compression
        )
        assert find_timestamp_in_batch(compressed, 25) == (101, 30)  # the exact record


def test_snappy_in_xerial_framing_as_kafkas_java_client_writes_it() -> None:
    import cramjam

    from odradek.protocol.record_batch import decompress

    plain = b"records " * 100
    chunks = [plain[:300], plain[300:]]
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for chunk in chunks:
        block = bytes(cramjam.snappy.compress_raw(chunk))
        framed += struct.pack(">i", len(block)) + block
    assert decompress(CompressionType.SNAPPY, framed) == plain


def test_set_create_time_clears_the_log_append_time_bit_and_recomputes_crc() -> None:
    buf = bytearray(_with_fields(batch(2, ts=1_000), attributes=0x08))
    header = set_create_time(buf, read_header(buf), 1_001)
    assert header == read_header(buf)
    assert header.timestamp_type == TimestampType.CREATE_TIME
    assert header.max_timestamp == 1_001 and crc_ok(buf)
