"""The transaction checks of the fault suite (`tests/faults/transaction_checks.py`) without a
cluster: each must be able to fail, on the smallest history that shows its violation. (The
other checkers' own test is beside the suite, in `test_fault_injection.py`.)"""

from __future__ import annotations

from tests.faults.history import Event, History, check_history
from tests.faults.transaction_checks import (
    aborted_transactions_invisible,
    check_transactions,
    committed_transactions_visible_once,
    lso_monotonic,
    read_committed_reads_stable,
)


def test_each_transaction_checker_detects_the_violation_it_exists_for():
    def history(*events: tuple[str, str, int, str | None, int | None, str | None]) -> list[Event]:
        return [
            Event(float(t), kind, process, partition, value, offset, error=error)
            for t, (kind, process, partition, value, offset, error) in enumerate(events)
        ]

    def txn(name: str, outcome: str, *records: tuple[int, str]) -> list[tuple]:
        sends = [("txn_send", name, p, v, None, None) for p, v in records]
        return [*sends, ("txn_outcome", name, -1, None, None, outcome)]

    def final(*records: tuple[int, int, str]) -> list[tuple]:
        return [("txn_final", "final-reader", p, v, o, None) for p, o, v in records]

    sent = [
        *txn("t.1", "committed", (0, "t.1-0"), (1, "t.1-1")),
        *txn("t.2", "aborted", (0, "t.2-0"), (1, "t.2-1")),
    ]
    good = final((0, 0, "t.1-0"), (1, 0, "t.1-1"))
    assert committed_transactions_visible_once(history(*sent, *good)).passed
    assert aborted_transactions_invisible(history(*sent, *good)).passed
    # A committed record missing, read twice, or in the wrong partition.
    assert not committed_transactions_visible_once(history(*sent, *good[:1])).passed
    twice = final((0, 0, "t.1-0"), (0, 1, "t.1-0"), (1, 0, "t.1-1"))
    assert not committed_transactions_visible_once(history(*sent, *twice)).passed
    moved = final((0, 0, "t.1-0"), (0, 1, "t.1-1"))
    assert not committed_transactions_visible_once(history(*sent, *moved)).passed
    # Unknown outcome: all or nothing.
    unknown = txn("t.3", "unknown", (0, "t.3-0"), (1, "t.3-1"))
    assert committed_transactions_visible_once(history(*sent, *unknown, *good)).passed
    all_of_it = final((0, 0, "t.1-0"), (1, 0, "t.1-1"), (0, 1, "t.3-0"), (1, 1, "t.3-1"))
    assert committed_transactions_visible_once(history(*sent, *unknown, *all_of_it)).passed
    half = final((0, 0, "t.1-0"), (1, 0, "t.1-1"), (0, 1, "t.3-0"))
    assert not committed_transactions_visible_once(history(*sent, *unknown, *half)).passed
    # An aborted, fenced or failed transaction's record, read at the end or during the run.
    leaked = final((0, 0, "t.1-0"), (1, 0, "t.1-1"), (0, 1, "t.2-0"))
    assert not aborted_transactions_invisible(history(*sent, *leaked)).passed
    during = ("txn_read", "txn-reader", 1, "t.2-1", 2, None)
    assert not aborted_transactions_invisible(history(*sent, during, *good)).passed
    for outcome in ("fenced", "failed"):
        other = txn("t.4", outcome, (1, "t.4-0"))
        seen = final((0, 0, "t.1-0"), (1, 0, "t.1-1"), (1, 1, "t.4-0"))
        assert not aborted_transactions_invisible(history(*sent, *other, *seen)).passed
    zombie = [*sent, ("txn_outcome", "t.5", -1, "zombie commit accepted", None, "fenced")]
    assert not aborted_transactions_invisible(history(*zombie, *good)).passed
    stranger = final((0, 0, "t.1-0"), (1, 0, "t.1-1"), (1, 1, "p0-7"))
    assert not aborted_transactions_invisible(history(*sent, *stranger)).passed
    # Nothing committed or nothing aborted: the checks would prove nothing.
    assert not committed_transactions_visible_once(history(*sent[3:])).passed
    assert not aborted_transactions_invisible(history(*sent[:3], *good)).passed
    # Reads during the run: in the final read at the same offset, each once.
    read = ("txn_read", "txn-reader", 0, "t.1-0", 0, None)
    assert read_committed_reads_stable(history(*sent, read, *good)).passed
    assert not read_committed_reads_stable(history(*sent, read, read, *good)).passed
    elsewhere = ("txn_read", "txn-reader", 0, "t.1-0", 5, None)
    assert not read_committed_reads_stable(history(*sent, elsewhere, *good)).passed

    def lso(*observations: tuple[str, int, int, int]) -> list[Event]:
        return [
            Event(float(t), "lso", broker, partition, offset=offset, leader_epoch=epoch)
            for t, (broker, partition, epoch, offset) in enumerate(observations)
        ]

    assert lso_monotonic(lso(("b1", 0, 3, 10), ("b1", 0, 3, 12), ("b2", 0, 4, 11))).passed
    assert lso_monotonic(lso(("b1", 0, 3, 10), ("b1", 1, 3, 5))).passed
    assert not lso_monotonic(lso(("b1", 0, 3, 10), ("b1", 0, 3, 9))).passed
    assert not lso_monotonic([]).passed
    skipped = check_transactions([], transactional=False)
    assert all(r.passed and r.details[0].startswith("skipped") for r in skipped)


def test_a_transactional_history_runs_the_transaction_checks():
    history = History(transactional=True)
    history.record("txn_send", "t.1", 0, value="t.1-0")
    history.record("txn_outcome", "t.1", -1, error="committed")
    history.record("txn_send", "t.2", 0, value="t.2-0")
    history.record("txn_outcome", "t.2", -1, error="aborted")
    history.record("lso", "broker1", 0, offset=3, leader_epoch=0)
    history.record("txn_final", "final-reader", 0, value="t.1-0", offset=0)
    results = {r.name: r for r in check_history(history)}
    assert results["committed_transactions_visible_once"].checked == 1
    assert results["aborted_transactions_invisible"].passed
    assert results["lso_monotonic"].checked == 1
    history.record("txn_final", "final-reader", 0, value="t.2-0", offset=2)
    results = {r.name: r for r in check_history(history)}
    assert not results["aborted_transactions_invisible"].passed
