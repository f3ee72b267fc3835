"""The copy check of the Spark sink tests (`tests.spark.duplicates.copy_problems`), on hand-made
records: it must fail on what a broker fault or a lost record leaves, and pass what an
at-least-once sink may leave."""

from __future__ import annotations

from tests.spark.duplicates import StoredAs, copy_problems
from tests.spark.topics import Record

PRODUCER = 7


def _record(partition: int, offset: int, value: bytes) -> Record:
    return Record(partition, offset, value, value, None, 0, 0)


def _copy(*rows: tuple[int, int, bytes, int, int]) -> tuple[list[Record], dict]:
    """(partition, offset, value, epoch, sequence) -> the copy's records and how each is stored."""
    records = [_record(p, o, v) for p, o, v, _, _ in rows]
    stored = {(p, o): StoredAs(p, PRODUCER, e, s, 1, o, 1) for p, o, _, e, s in rows}
    return records, stored


INPUTS = [_record(0, 0, b"a"), _record(0, 1, b"b"), _record(1, 0, b"c")]


def test_a_faithful_copy_passes() -> None:
    # Sequences are per partition: partition 1's sequence 0 is not partition 0's.
    copy, stored = _copy((0, 0, b"a", 0, 0), (0, 1, b"b", 0, 1), (1, 0, b"c", 0, 0))
    assert copy_problems(INPUTS, copy, stored, failed_tasks=0) == []


def test_a_value_the_input_holds_twice_is_copied_twice() -> None:
    inputs = [*INPUTS, _record(0, 2, b"b")]  # a non-idempotent producer's retry
    copy, stored = _copy(
        (0, 0, b"a", 0, 0), (0, 1, b"b", 0, 1), (0, 2, b"b", 0, 2), (1, 0, b"c", 0, 0)
    )
    assert copy_problems(inputs, copy, stored, failed_tasks=0) == []
    problems = copy_problems(inputs, copy[:2] + copy[3:], stored, failed_tasks=0)
    assert problems == ["input values missing from the copy: {b'b': 1}"]


def test_a_retry_stored_again_fails_even_after_a_task_failure() -> None:
    copy, stored = _copy(
        (0, 0, b"a", 0, 0), (0, 1, b"b", 0, 1), (0, 2, b"b", 0, 1), (1, 0, b"c", 0, 0)
    )
    [problem] = copy_problems(INPUTS, copy, stored, failed_tasks=1)
    assert problem.startswith("stored twice under one producer sequence")


def test_a_resend_needs_a_failed_task() -> None:
    # A retried task's rows come back under new sequences (or a new epoch).
    copy, stored = _copy(
        (0, 0, b"a", 0, 0), (0, 1, b"b", 0, 1), (0, 2, b"b", 1, 0), (1, 0, b"c", 0, 0)
    )
    assert copy_problems(INPUTS, copy, stored, failed_tasks=1) == []
    [problem] = copy_problems(INPUTS, copy, stored, failed_tasks=0)
    assert problem.startswith("copied more often than the input holds them")


def test_a_lost_record_fails() -> None:
    copy, stored = _copy((0, 0, b"a", 0, 0), (1, 0, b"c", 0, 0))
    assert copy_problems(INPUTS, copy, stored, failed_tasks=1) == [
        "input values missing from the copy: {b'b': 1}"
    ]


def test_a_sink_without_idempotence_is_reported() -> None:
    copy, stored = _copy((0, 0, b"a", -1, -1), (0, 1, b"b", -1, -1), (1, 0, b"c", -1, -1))
    stored = {k: StoredAs(s.partition, -1, -1, -1, 1, k[1], 1) for k, s in stored.items()}
    [problem] = copy_problems(INPUTS, copy, stored, failed_tasks=0)
    assert problem.startswith("3 records written without a producer id")
