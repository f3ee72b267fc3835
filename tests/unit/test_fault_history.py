"""The Jepsen-style history checker (tests/faults/history.py) on hand-made histories: each
check passes on a clean history and catches the anomaly it exists for."""

from __future__ import annotations

from pathlib import Path

from tests.faults.history import Event, History, check_history, load_history


def _history(*events: tuple, idempotent: bool = False) -> History:
    history = History(idempotent=idempotent)
    for index, (kind, process, partition, fields) in enumerate(events):
        history.events.append(Event(float(index), kind, process, partition, **fields))
    return history


def _verdicts(history: History) -> dict[str, bool]:
    return {r.name: r.passed for r in check_history(history)}


CLEAN = (
    ("send", "p0", 0, {"value": "p0-0"}),
    ("ack", "p0", 0, {"value": "p0-0", "offset": 0}),
    ("send", "p0", 0, {"value": "p0-1"}),
    ("ack", "p0", 0, {"value": "p0-1", "offset": 1}),
    ("hw", "broker1", 0, {"offset": 1, "leader_epoch": 0}),
    ("read", "reader", 0, {"value": "p0-0", "offset": 0}),
    ("hw", "broker1", 0, {"offset": 2, "leader_epoch": 0}),
    ("hw", "broker2", 0, {"offset": 1, "leader_epoch": 1}),
    ("final", "final", 0, {"value": "p0-0", "offset": 0}),
    ("final", "final", 0, {"value": "p0-1", "offset": 1}),
)


def test_a_clean_history_passes_every_check() -> None:
    results = check_history(_history(*CLEAN))
    assert all(r.passed for r in results), [r.describe() for r in results]
    assert {r.name: r.checked for r in results}["no_lost_acknowledged_write"] == 2


def test_a_lost_acknowledged_write_is_caught() -> None:
    events = [e for e in CLEAN if not (e[0] == "final" and e[3]["offset"] == 1)]
    assert _verdicts(_history(*events))["no_lost_acknowledged_write"] is False


def test_an_acknowledged_offset_holding_another_value_is_caught() -> None:
    events = [*CLEAN[:-1], ("final", "final", 0, {"value": "p1-7", "offset": 1})]
    assert _verdicts(_history(*events))["no_lost_acknowledged_write"] is False


def test_duplicates_are_checked_only_for_idempotent_producers() -> None:
    events = [*CLEAN, ("final", "final", 0, {"value": "p0-1", "offset": 2})]
    skipped = {r.name: r for r in check_history(_history(*events))}["no_duplicate"]
    assert skipped.checked == 0 and "skipped" in skipped.details[0]
    assert _verdicts(_history(*events, idempotent=True))["no_duplicate"] is False
    assert _verdicts(_history(*CLEAN, idempotent=True))["no_duplicate"] is True


def test_a_record_acknowledged_below_an_earlier_acknowledgement_is_caught() -> None:
    events = (
        ("send", "p0", 0, {"value": "p0-0"}),
        ("ack", "p0", 0, {"value": "p0-0", "offset": 5}),
        ("send", "p0", 0, {"value": "p0-1"}),
        ("ack", "p0", 0, {"value": "p0-1", "offset": 3}),
        ("final", "final", 0, {"value": "p0-1", "offset": 3}),
        ("final", "final", 0, {"value": "p0-0", "offset": 5}),
    )
    assert _verdicts(_history(*events))["per_partition_order"] is False


def test_reads_of_records_that_later_disappeared_are_caught() -> None:
    events = [*CLEAN, ("read", "reader", 0, {"value": "p0-9", "offset": 1})]
    assert _verdicts(_history(*events))["no_read_of_lost_record"] is False


def test_a_high_watermark_going_back_within_an_epoch_is_caught() -> None:
    events = [*CLEAN, ("hw", "broker1", 0, {"offset": 1, "leader_epoch": 0})]
    assert _verdicts(_history(*events))["monotonic_hw_and_epochs"] is False


def test_a_broker_going_back_to_an_older_leader_epoch_is_caught() -> None:
    events = [*CLEAN, ("hw", "broker2", 0, {"offset": 5, "leader_epoch": 0})]
    assert _verdicts(_history(*events))["monotonic_hw_and_epochs"] is False


def test_a_dumped_history_loads_back_identical(tmp_path: Path) -> None:
    history = _history(*CLEAN, idempotent=True)
    history.dump(tmp_path / "h.jsonl")
    loaded = load_history(tmp_path / "h.jsonl")
    assert loaded.idempotent and loaded.events == history.events


def test_an_acknowledgement_without_an_offset_must_be_somewhere_in_the_partition() -> None:
    implicit = ("ack", "i0", 0, {"value": "p0-1", "offset": None})
    assert _verdicts(_history(*CLEAN, implicit))["no_lost_acknowledged_write"] is True
    missing = ("ack", "i0", 0, {"value": "i0-9", "offset": None})
    assert _verdicts(_history(*CLEAN, missing))["no_lost_acknowledged_write"] is False
