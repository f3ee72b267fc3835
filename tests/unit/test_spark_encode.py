"""The native batch encoder of the sink's fast path (`odradek.protocol._encoder`), against the
broker's own validator and the pure-Python record walker, and its partitioner against Kafka's."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from odradek.protocol._encoder import Accumulator, murmur2

from odradek.errors import DataSourceOptionError
from odradek.log.config import LogConfig
from odradek.log.validator import validate_produce_records
from odradek.protocol import compression
from odradek.protocol.record_batch import (
    HEADER_SIZE,
    CompressionType,
    decode_records,
    decompress,
    read_header,
)
from odradek.protocol.records import reference_index
from odradek.spark.options import SinkOptions
from odradek.spark.produce import CODECS, FastPathStop, _binary, _headers, _partitions

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

# Kafka 3.9.1's org.apache.kafka.common.utils.Utils.murmur2 of the UTF-8 bytes, and
# toPositive(h) % 4 and % 7 (computed with kafka-clients-3.9.1.jar).
JAVA_MURMUR2 = [
    ("", 275646681, 1, 2),
    ("a", -1563381124, 0, 5),
    ("ab", 316155434, 2, 0),
    ("abc", 479470107, 3, 4),
    ("abcd", -1323649548, 0, 5),
    ("hello", 2132663229, 1, 4),
    ("kafka", -798503068, 0, 3),
    ("21", -973932308, 0, 3),
    ("foobar", -790332482, 2, 0),
    ("The quick brown fox jumps over the lazy dog", 495243318, 2, 3),
    ("\u00e9t\u00e9", -2101193575, 1, 4),
    ("key-12345", -952703915, 1, 0),
]
JAVA_MURMUR2_BYTES_0_255 = -1948347274


@pytest.mark.parametrize(("key", "hashed", "of4", "of7"), JAVA_MURMUR2)
def test_murmur2_is_kafkas(key: str, hashed: int, of4: int, of7: int) -> None:
    assert murmur2(key.encode()) == hashed
    assert (hashed & 0x7FFFFFFF) % 4 == of4
    assert (hashed & 0x7FFFFFFF) % 7 == of7


def test_murmur2_of_every_byte_value() -> None:
    assert murmur2(bytes(range(256))) == JAVA_MURMUR2_BYTES_0_255


def _java_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


maybe_bytes = st.one_of(st.none(), st.binary(max_size=30))
header_list = st.one_of(
    st.none(), st.lists(st.tuples(st.text(max_size=6), maybe_bytes), max_size=3)
)
row = st.tuples(maybe_bytes, maybe_bytes, header_list, st.one_of(st.none(), st.integers(0, 6)))


def _encode(
    rows: list, partitions: int, batch_bytes: int, codec: int, slice_from: int, with_partition: bool
) -> list[tuple[int, int, bytes]]:
    keys = pa.array([r[0] for r in rows], pa.binary())
    values = pa.array([r[1] for r in rows], pa.binary())
    headers = pa.array(
        [None if r[2] is None else [{"key": k, "value": v} for k, v in r[2]] for r in rows],
        HEADER_TYPE,
    )
    chosen = pa.array([None if r[3] is None else r[3] % partitions for r in rows], pa.int32())
    # Slices: Spark's batches start at offset 0, but arrays with an offset must work too.
    n = len(rows) - slice_from
    keys, values, headers, chosen = (
        a.slice(slice_from, n) for a in (keys, values, headers, chosen)
    )
    accumulator = Accumulator(
        partitions,
        batch_bytes,
        0,
        codec,
        (lambda view, c=codec: compression.compress(c, view)) if codec else None,
    )
    accumulator.append(
        n,
        _binary(keys),
        _binary(values),
        _headers(headers),
        _partitions(chosen) if with_partition else None,
        1_700_000_000_123,
    )
    accumulator.seal_all()
    assert accumulator.pending == n
    taken = accumulator.take()
    assert accumulator.pending == 0
    return taken


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(row, min_size=1, max_size=40),
    partitions=st.integers(1, 5),
    batch_bytes=st.sampled_from([1, 64, 1 << 20]),
    codec=st.sampled_from(sorted(CODECS.values())),
    slice_from=st.integers(0, 3),
    with_partition=st.booleans(),
)
def test_encoded_batches_are_what_the_broker_accepts_and_hold_every_row(
    rows: list,
    partitions: int,
    batch_bytes: int,
    codec: int,
    slice_from: int,
    with_partition: bool,
) -> None:
    slice_from = min(slice_from, len(rows) - 1)
    # A value names its row (null values stay null: those rows are only counted).
    rows = [(k, None if v is None else b"%d:" % i + v, h, c) for i, (k, v, h, c) in enumerate(rows)]
    taken = _encode(rows, partitions, batch_bytes, codec, slice_from, with_partition)
    rows = rows[slice_from:]
    config = LogConfig()
    placed: list[tuple[int, bytes | None, bytes | None, list]] = []
    for partition, count, batch in taken:
        # The broker's produce validation: one batch, header, CRC, every record.
        validated = validate_produce_records(batch, config, int(time.time() * 1000))
        header = read_header(batch)
        assert header.records_count == count == validated.header.records_count
        assert header.compression == codec
        assert header.producer_id == -1 and header.base_sequence == -1
        # The records walked by the pure-Python reference walker (offset deltas 0, 1, ...).
        payload = batch[HEADER_SIZE:]
        if codec:
            payload = decompress(CompressionType(codec), payload)
        assert len(reference_index(payload, count, header.base_timestamp)) == count
        for record in decode_records(batch):
            assert record.timestamp == 1_700_000_000_123
            placed.append((partition, record.key, record.value, record.headers))

    # Every row once.
    def triple(key: bytes | None, value: bytes | None, headers: list | None) -> str:
        return repr((key, value, list(headers or [])))

    assert sorted(triple(k, v, h) for _, k, v, h in placed) == sorted(
        triple(k, v, h) for k, v, h, _ in rows
    )
    # Where the partitioner puts it (the `partition` column, murmur2 of the key, or any), and
    # in input order within a partition.
    last_index: dict[int, int] = {}
    for partition, key, value, _ in placed:
        if value is None:
            continue
        index = int(value.split(b":", 1)[0])
        _, _, _, chosen = rows[index - slice_from]
        if with_partition and chosen is not None:
            assert partition == chosen % partitions
        elif key is not None:
            assert partition == _java_partition(key, partitions)
        assert index > last_index.get(partition, -1)
        last_index[partition] = index


def test_a_partition_outside_the_topic_appends_nothing() -> None:
    accumulator = Accumulator(3, 1 << 20, 0)
    values = pa.array([b"a", b"b", b"c"])
    partitions = pa.array([0, 3, 1], pa.int32())
    with pytest.raises(ValueError, match=r"row 1: partition 3 is not in \[0, 3\)"):
        accumulator.append(3, None, _binary(values), None, _partitions(partitions), 0)
    assert accumulator.pending == 0
    assert accumulator.seal_all() == 0


def test_a_null_header_key_appends_nothing() -> None:
    accumulator = Accumulator(1, 1 << 20, 0)
    values = pa.array([b"a", b"b"])
    headers = pa.array([[{"key": "k", "value": b"v"}], [{"key": None, "value": b"v"}]], HEADER_TYPE)
    with pytest.raises((ValueError, FastPathStop)):
        accumulator.append(2, None, _binary(values), _headers(headers), None, 0)
    assert accumulator.pending == 0


def test_keyless_rows_stick_to_a_partition_until_its_batch_is_sealed() -> None:
    accumulator = Accumulator(3, 1000, 2)
    values = pa.array([b"x" * 100] * 25)
    accumulator.append(25, None, _binary(values), None, None, 0)
    accumulator.seal_all()
    taken = accumulator.take()
    # 107-byte records after a 61-byte header: a batch seals at 1,000 bytes after 9 records,
    # then the keyless rows move to the next partition.
    assert [(p, n) for p, n, _ in taken] == [(2, 9), (0, 9), (1, 7)]


def test_batches_stay_near_their_size_whatever_the_arrow_batch() -> None:
    accumulator = Accumulator(1, 64 * 1024, 0)
    values = pa.array([b"v" * 1000] * 1000)  # 1 MB in one call
    assert accumulator.append(1000, None, _binary(values), None, None, 0) == 15
    sizes = [len(b) for _, _, b in accumulator.take()]
    assert all(64 * 1024 <= s < 64 * 1024 + 1100 for s in sizes)


def test_large_and_string_columns() -> None:
    accumulator = Accumulator(2, 1 << 20, 0)
    keys = pa.array(["ключ", None], pa.large_string())
    values = pa.array([b"v1", b""], pa.large_binary())
    accumulator.append(2, _binary(keys), _binary(values), None, None, 5)
    accumulator.seal_all()
    records = [r for _, _, b in accumulator.take() for r in decode_records(b)]
    assert sorted((r.key or b"", r.value) for r in records) == [
        (b"", b""),
        ("ключ".encode(), b"v1"),
    ]


def test_other_column_types_leave_the_fast_path() -> None:
    with pytest.raises(FastPathStop):
        _binary(pa.array([1, 2]))
    with pytest.raises(FastPathStop):
        _partitions(pa.array([1, 2], pa.int64()))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"odradek.writePath": "fastest"}, "odradek.writePath: expected auto or producer"),
        ({"kafka.compression.type": "brotli"}, "kafka.compression.type: expected none, gzip"),
        ({"kafka.compression.codec": "lz5"}, "kafka.compression.codec: expected none, gzip"),
    ],
)
def test_bad_sink_options_fail_with_one_line(options: dict[str, str], message: str) -> None:
    with pytest.raises(DataSourceOptionError) as raised:
        SinkOptions.parse({"kafka.bootstrap.servers": "h:1", "topic": "t", **options})
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_sink_options_write_path_and_codec() -> None:
    parsed = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": "h:1",
            "topic": "t",
            "ODRADEK.WRITEPATH": " Producer ",
            "kafka.compression.type": "LZ4",
        }
    )
    assert parsed.write_path == "producer"
    assert parsed.compression_type == "lz4"
    assert SinkOptions.parse({"kafka.bootstrap.servers": "h:1", "topic": "t"}).write_path == "auto"
