"""The leader's validation of produce requests (odradek.log.validator), case by case.

Every case of the catalogue in tests/fuzz/record_batches.py goes through the validator with the
topic config it names and must get the error code Odradek answers for it (the broker-level and
Kafka differential tests send the same cases over the wire). Then the inline budget, the bombs,
the header corrections and the timestamp rules one by one.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from odradek.errors import InvalidTimestampError, KafkaError
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.validator import NeedsWorkerThread, validate_produce_records
from odradek.protocol.record_batch import TimestampType, decode_records, read_header
from tests.fuzz.record_batches import (
    BASE_TIMESTAMP,
    BOMB_NAMES,
    Case,
    RawRecord,
    batch_of,
    bomb_cases,
    cases,
    numbered,
    records_section,
)

HOUR_MS = 3600 * 1000
NOW_MS = int(time.time() * 1000)
TOPICS = {
    "create": LogConfig(),
    "bounded": LogConfig(
        message_timestamp_before_max_ms=HOUR_MS, message_timestamp_after_max_ms=HOUR_MS
    ),
    "append": LogConfig(message_timestamp_type="LogAppendTime"),
}
HANDLER_LEVEL = {"transactional without a transactional id"}
"""Refused by the produce handler for the whole request, before the validator sees the records."""


def answer(case: Case, budget: int | None = None) -> str:
    try:
        validate_produce_records(case.records, TOPICS[case.topic], NOW_MS, budget)
    except KafkaError as e:
        return ErrorCode(e.code).name
    return "none"


SMALL = [c for c in cases(NOW_MS) if c.name not in HANDLER_LEVEL]


@pytest.mark.parametrize("case", SMALL, ids=[c.name for c in SMALL])
def test_each_case_gets_its_code(case: Case) -> None:
    assert answer(case) == case.expected


@pytest.mark.parametrize("case", SMALL, ids=[c.name for c in SMALL])
def test_a_small_budget_defers_or_answers_the_same(case: Case) -> None:
    try:
        got = answer(case, budget=64)
    except NeedsWorkerThread:
        return
    assert got == case.expected


@cache
def bombs() -> list[Case]:
    return bomb_cases()


@pytest.mark.parametrize("name", BOMB_NAMES)
def test_bombs_and_honest_large_batches(name: str) -> None:
    case = bombs()[BOMB_NAMES.index(name)]
    started = time.perf_counter()
    assert answer(case) == case.expected, case.name
    assert time.perf_counter() - started < 10
    # Inline, at most the budget is decompressed: garbage is refused at once from the prefix it
    # has seen, anything well-formed goes to a worker thread.
    try:
        inline = answer(case, budget=1024 * 1024)
    except NeedsWorkerThread:
        assert case.expected != "invalid_record" or case.name.startswith("snappy")
    else:
        assert inline == case.expected


def test_the_limit_is_inclusive() -> None:
    records = [RawRecord(value=bytes(1000), offset_delta=i) for i in range(100)]
    batch = batch_of(records, compression=2)  # snappy, xerial framing
    size = len(records_section(records))
    assert answer(Case("exact", batch, "none")) == "none"
    exact = replace(TOPICS["create"], decompressed_limit=size)
    validate_produce_records(batch, exact, NOW_MS)
    with pytest.raises(KafkaError) as refused:
        validate_produce_records(batch, replace(exact, decompressed_limit=size - 1), NOW_MS)
    assert refused.value.code == ErrorCode.message_too_large


def test_timestamp_errors_list_each_record() -> None:
    records = [
        replace(r, timestamp_delta=-3 * HOUR_MS if r.offset_delta == 1 else 0) for r in numbered(3)
    ]
    with pytest.raises(InvalidTimestampError) as refused:
        validate_produce_records(
            batch_of(records, base_timestamp=NOW_MS), TOPICS["bounded"], NOW_MS
        )
    ((index, message),) = refused.value.record_errors
    assert index == 1 and f"Timestamp {NOW_MS - 3 * HOUR_MS} " in message
    assert str(refused.value) == "One or more records have been rejected due to invalid timestamp"


def test_the_older_difference_setting_bounds_both_sides() -> None:
    config = LogConfig(message_timestamp_difference_max_ms=HOUR_MS)
    assert config.effective_timestamp_before_max_ms == HOUR_MS
    assert config.effective_timestamp_after_max_ms == HOUR_MS
    with pytest.raises(InvalidTimestampError):
        validate_produce_records(batch_of(numbered(1)), config, NOW_MS)
    both = replace(config, message_timestamp_after_max_ms=10)
    assert both.effective_timestamp_after_max_ms == 10
    future = batch_of(numbered(1), base_timestamp=NOW_MS + 1000)
    with pytest.raises(InvalidTimestampError):
        validate_produce_records(future, both, NOW_MS)


def test_create_time_corrections(tmp_path: Path) -> None:
    config = LogConfig()
    log = Log.open(
        tmp_path / "t-0",
        config,
        recovery_point=0,
        log_start_offset=0,
        clean_shutdown=True,
        now_ms=0,
    )
    low = batch_of(numbered(3, timestamp_delta=50), max_timestamp=BASE_TIMESTAMP)
    info = log.append_as_leader(low, 0, NOW_MS)
    assert info.max_timestamp == BASE_TIMESTAMP + 50
    flagged = batch_of(numbered(2), attributes=0x08, max_timestamp=BASE_TIMESTAMP + 7)
    log.append_as_leader(flagged, 0, NOW_MS)
    stored = log.read(0, 1 << 20)
    first = read_header(stored)
    assert first.max_timestamp == BASE_TIMESTAMP + 50
    second = read_header(stored, first.size)
    assert second.timestamp_type == TimestampType.CREATE_TIME
    assert second.max_timestamp == BASE_TIMESTAMP + 7
    # Both still pass a follower's CRC check and decode.
    follower = Log.open(
        tmp_path / "t-1",
        config,
        recovery_point=0,
        log_start_offset=0,
        clean_shutdown=True,
        now_ms=0,
    )
    follower.append_as_follower(stored)
    assert [r.offset for r in decode_records(stored)] == [0, 1, 2]
    log.close()
    follower.close()
