"""The record browser's decoding (`odradek.console.record_browser.decode`) without a cluster:
trimming to [start, high), compressed batches, control batches and aborted transactions as
Kafka's read_committed consumer drops them (tests/integration/test_console_records.py compares
with a real consumer)."""

from __future__ import annotations

from odradek.console.record_browser import Record, decode
from odradek.coordinator.transaction.log_records import build_marker_batch
from odradek.protocol.aborted_transactions import AbortedTransactions
from odradek.protocol.record_batch import CompressionType, build_batch, read_header


def batch(base: int, n: int, producer_id: int = -1, codec: int = CompressionType.NONE) -> bytes:
    rows = [
        (b"k%d" % (base + i), b"v%d" % (base + i), [("h", b"x")], 1000 + base + i) for i in range(n)
    ]
    return build_batch(
        rows,
        base,
        CompressionType(codec),
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        is_transactional=producer_id >= 0,
    )


def marker(offset: int, producer_id: int, commit: bool) -> bytes:
    data = bytearray(build_marker_batch(producer_id, 0, commit, 0, 5000))
    data[0:8] = offset.to_bytes(8, "big")  # the base offset is outside the CRC's range
    assert read_header(bytes(data)).base_offset == offset
    return bytes(data)


def row(offset: int) -> Record:
    return Record(
        offset, 1000 + offset, "CreateTime", b"k%d" % offset, b"v%d" % offset, (("h", b"x"),)
    )


def test_trims_to_the_range_and_decompresses() -> None:
    records = batch(0, 5, codec=CompressionType.ZSTD) + batch(5, 5, codec=CompressionType.GZIP)
    found, following = decode(records, 3, 8, AbortedTransactions())
    assert found == [row(o) for o in range(3, 8)]
    assert following == 10


def test_a_partial_tail_is_left_for_the_next_fetch() -> None:
    records = batch(0, 3) + batch(3, 3)[:-4]
    found, following = decode(records, 0, 6, AbortedTransactions())
    assert [r.offset for r in found] == [0, 1, 2] and following == 3


def test_aborted_transactions_and_markers_give_no_record() -> None:
    records = (
        batch(0, 2, producer_id=7)  # committed
        + marker(2, 7, commit=True)
        + batch(3, 2, producer_id=8)  # aborted
        + batch(5, 1)  # not transactional, between
        + marker(6, 8, commit=False)
        + batch(7, 2, producer_id=8)  # a later transaction of the same producer, committed
        + marker(9, 8, commit=True)
    )
    aborted = AbortedTransactions()
    aborted.add([(8, 3)])
    found, following = decode(records, 0, 10, aborted)
    assert [r.offset for r in found] == [0, 1, 5, 7, 8]
    assert following == 10
