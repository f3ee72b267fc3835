"""The produce-side rules of compacted topics and compression.type (odradek.log.validator).

* A record without a key is refused on a compacted topic with Kafka 3.9's INVALID_RECORD, its
  message and one `record_errors` entry per keyless record; when another record's timestamp is
  also wrong the batch is INVALID_TIMESTAMP listing both kinds, as Kafka's LogValidator does.
  Nothing is appended.
* compression.type: a batch in another codec than the topic's is stored recompressed (every codec
  to every other), its records byte for byte the same, offsets assigned as to any batch; large
  ones are recompressed on a worker thread (NeedsWorkerThread on the loop).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from odradek.errors import InvalidRecordError, InvalidTimestampError, RecordTooLargeError
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.validator import NeedsWorkerThread, validate_produce_records
from odradek.protocol.record_batch import (
    CompressionType,
    build_batch,
    decode_records,
    iter_batches,
    read_header,
    validate_replicated_batches,
)

NOW = int(time.time() * 1000)
COMPACTED = LogConfig(cleanup_policy=("compact",))
HOUR = 3600 * 1000


def records(*keys: bytes | None, timestamp: int = NOW) -> list:  # type: ignore[type-arg]
    return [(key, b"v", [], timestamp) for key in keys]


@pytest.mark.parametrize("codec", list(CompressionType))
def test_keyless_records_to_a_compacted_topic_are_invalid_record(codec: CompressionType) -> None:
    batch = build_batch(records(b"a", None, b"b", None), compression=codec)
    with pytest.raises(InvalidRecordError) as raised:
        validate_produce_records(batch, COMPACTED, NOW, None, "t-3")
    message = "Compacted topic cannot accept message without key in topic partition t-3."
    assert raised.value.record_errors == ((1, message), (3, message))
    assert str(raised.value) == (
        "One or more records have been rejected due to 2 record errors in total, and only "
        f"showing the first three errors at most: [RecordError(batchIndex=1, message='{message}'), "
        f"RecordError(batchIndex=3, message='{message}')]"
    )
    # The same batch is fine where the topic is not compacted, and keyed records are fine here.
    validate_produce_records(batch, LogConfig(), NOW)
    validate_produce_records(build_batch(records(b"a", b"")), COMPACTED, NOW)


def test_a_missing_key_and_a_wrong_timestamp_make_it_invalid_timestamp() -> None:
    config = LogConfig(cleanup_policy=("compact", "delete"), message_timestamp_before_max_ms=HOUR)
    batch = build_batch(
        [(None, b"v", [], NOW - 2 * HOUR), (b"k", b"v", [], NOW - 2 * HOUR), (b"k", b"v", [], NOW)]
    )
    with pytest.raises(InvalidTimestampError) as raised:
        validate_produce_records(batch, config, NOW, None, "t-0")
    errors = raised.value.record_errors
    assert [i for i, _ in errors] == [0, 1]
    assert errors[0][1].startswith("Compacted topic cannot accept message without key")
    assert errors[1][1].startswith(f"Timestamp {NOW - 2 * HOUR} of message with offset 1")


def test_nothing_of_a_refused_batch_is_appended(tmp_path: Path) -> None:
    log = Log.open(
        tmp_path / "t-0",
        COMPACTED,
        recovery_point=0,
        log_start_offset=0,
        clean_shutdown=True,
        now_ms=NOW,
    )
    log.append_as_leader(build_batch(records(b"a")), 0, NOW)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(build_batch(records(b"b", None)), 0, NOW)
    assert log.log_end_offset == 1
    log.close()


@pytest.mark.parametrize("source", list(CompressionType))
@pytest.mark.parametrize("target", ["uncompressed", "gzip", "snappy", "lz4", "zstd", "producer"])
def test_compression_type_recompresses_a_batch(
    tmp_path: Path, source: CompressionType, target: str
) -> None:
    config = LogConfig(compression_type=target)
    log = Log.open(
        tmp_path / "t-0",
        config,
        recovery_point=0,
        log_start_offset=0,
        clean_shutdown=True,
        now_ms=NOW,
    )
    log.append_as_leader(build_batch(records(b"x")), 0, NOW)
    sent = build_batch(
        [(b"k%d" % i, b"value %d" % i, [("h", b"1")], NOW + i) for i in range(50)],
        compression=source,
        producer_id=7,
        producer_epoch=2,
        base_sequence=10,
    )
    info = log.append_as_leader(sent, 5, NOW)
    assert (info.first_offset, info.last_offset) == (1, 50)
    stored = log.read(1, 1 << 20)
    (header,) = validate_replicated_batches(stored)
    expected = (
        source
        if target == "producer"
        else {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[target]
    )
    assert header.compression == expected
    original = read_header(sent)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 10)
    assert header.partition_leader_epoch == 5 and header.base_offset == 1
    assert header.max_timestamp == original.max_timestamp
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in decode_records(stored)] == [
        (r.offset + 1, r.key, r.value, r.timestamp, r.headers) for r in decode_records(sent)
    ]
    log.close()


def test_large_recompressions_go_to_a_worker_and_must_fit() -> None:
    big = build_batch([(b"k", b"x" * 1000, [], NOW)] * 200)
    config = LogConfig(compression_type="zstd")
    with pytest.raises(NeedsWorkerThread):
        validate_produce_records(big, config, NOW, budget=1 << 20)
    validated = validate_produce_records(big, config, NOW, budget=None)
    assert validated.batch is not None and validated.size < len(big)
    assert [h.compression for h in iter_batches(validated.batch)] == [CompressionType.ZSTD]
    small = build_batch([(b"k", b"\0" * 5000, [], NOW)], compression=CompressionType.ZSTD)
    tight = LogConfig(compression_type="uncompressed", max_message_bytes=len(small) + 100)
    with pytest.raises(RecordTooLargeError, match="once recompressed"):
        validate_produce_records(small, tight, NOW)
