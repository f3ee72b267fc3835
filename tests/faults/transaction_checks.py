"""The checks of a fault run's transactions (checks 6-9 of `history`'s docstring), each a pure
function of the recorded events (`history.Event`, in time order) returning a `CheckResult`.

What an outcome promises (`transactions` records it):

| outcome | a read_committed reader sees |
|---|---|
| committed | every record, exactly once, in the partition it was sent to |
| aborted, fenced, failed | none of its records, ever |
| unknown (commit tried, no answer) | all of its records once, or none |
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tests.faults.checker import CheckResult, _result

if TYPE_CHECKING:
    from tests.faults.history import Event

INVISIBLE = ("aborted", "fenced", "failed")


@dataclass
class Transaction:
    name: str
    outcome: str = "unknown"  # no outcome recorded (the run was abandoned): all or nothing
    note: str | None = None
    records: dict[str, int] = field(default_factory=dict)  # value -> partition sent to


def transactions_of(events: Sequence[Event]) -> dict[str, Transaction]:
    found: dict[str, Transaction] = {}
    for e in events:
        if e.kind == "txn_send" and e.value is not None:
            found.setdefault(e.process, Transaction(e.process)).records[e.value] = e.partition
        elif e.kind == "txn_outcome" and e.error is not None:
            transaction = found.setdefault(e.process, Transaction(e.process))
            transaction.outcome, transaction.note = e.error, e.value
    return found


def _reads(events: Sequence[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind and e.value is not None]


def committed_transactions_visible_once(events: Sequence[Event]) -> CheckResult:
    transactions = transactions_of(events)
    final = _reads(events, "txn_final")
    seen = Counter(e.value for e in final)
    partition_of = {e.value: e.partition for e in final}
    violations = [f"{value} read {n} times at the end" for value, n in seen.items() if n > 1]
    checked = 0
    for transaction in transactions.values():
        if transaction.outcome not in ("committed", "unknown"):
            continue
        visible = [v for v in transaction.records if seen[v]]
        checked += len(transaction.records)
        if transaction.outcome == "unknown" and not visible:
            continue
        missing = sorted(set(transaction.records) - set(visible))
        if missing:
            violations.append(
                f"{transaction.name} ({transaction.outcome}): {len(missing)} of "
                f"{len(transaction.records)} records not visible, e.g. {missing[0]}"
            )
        moved = [v for v in visible if partition_of[v] != transaction.records[v]]
        if moved:
            violations.append(
                f"{moved[0]} sent to partition {transaction.records[moved[0]]}, read in "
                f"partition {partition_of[moved[0]]}"
            )
    if not any(t.outcome == "committed" for t in transactions.values()):
        violations.append("no transaction committed: nothing was checked")
    return _result("committed_transactions_visible_once", checked, violations)


def aborted_transactions_invisible(events: Sequence[Event]) -> CheckResult:
    transactions = transactions_of(events)
    owner = {v: t for t in transactions.values() for v in t.records}
    violations = []
    checked = 0
    for e in _reads(events, "txn_read") + _reads(events, "txn_final"):
        checked += 1
        transaction = owner.get(e.value)
        if transaction is None:
            violations.append(f"{e.process} read {e.value}, which no transaction sent")
        elif transaction.outcome in INVISIBLE:
            violations.append(
                f"{e.process} read {e.value} at partition {e.partition} offset {e.offset} "
                f"(t={e.time:.3f}): its transaction was {transaction.outcome}"
            )
    for transaction in transactions.values():
        if transaction.outcome == "fenced" and transaction.note == "zombie commit accepted":
            violations.append(f"{transaction.name}: the fenced producer's commit was accepted")
    if not any(t.outcome == "aborted" for t in transactions.values()):
        violations.append("no transaction aborted: nothing was checked")
    return _result("aborted_transactions_invisible", checked, violations)


def read_committed_reads_stable(events: Sequence[Event]) -> CheckResult:
    final = {(e.partition, e.offset): e.value for e in _reads(events, "txn_final")}
    violations = []
    delivered: Counter[tuple[str, str]] = Counter()
    reads = _reads(events, "txn_read")
    for e in reads:
        found = final.get((e.partition, e.offset))
        if found != e.value:
            violations.append(
                f"{e.process} read {e.value} at partition {e.partition} offset {e.offset} "
                f"(t={e.time:.3f}); the final read has {found!r} there"
            )
        delivered[(e.process, e.value)] += 1  # type: ignore[index]
    violations += [f"{who} got {value} {n} times" for (who, value), n in delivered.items() if n > 1]
    return _result("read_committed_reads_stable", len(reads), violations)


def lso_monotonic(events: Sequence[Event]) -> CheckResult:
    violations = []
    checked = 0
    last: dict[tuple[int, int], tuple[int, str]] = {}
    for e in events:
        if e.kind != "lso" or e.offset is None or e.leader_epoch is None:
            continue
        checked += 1
        key = (e.partition, e.leader_epoch)
        previous = last.get(key)
        if previous is not None and e.offset < previous[0]:
            violations.append(
                f"partition {e.partition} leader epoch {e.leader_epoch}: LSO {e.offset} from "
                f"{e.process} (t={e.time:.3f}) after {previous[0]} from {previous[1]}"
            )
        if previous is None or e.offset >= previous[0]:
            last[key] = (e.offset, e.process)
    if not checked:
        violations.append("no LSO observed: nothing was checked")
    return _result("lso_monotonic", checked, violations)


def check_transactions(events: Sequence[Event], transactional: bool) -> list[CheckResult]:
    names = (
        "committed_transactions_visible_once",
        "aborted_transactions_invisible",
        "read_committed_reads_stable",
        "lso_monotonic",
    )
    if not transactional:
        skipped = ("skipped: the run had no transactional writer",)
        return [CheckResult(name, True, 0, skipped) for name in names]
    return [
        committed_transactions_visible_once(events),
        aborted_transactions_invisible(events),
        read_committed_reads_stable(events),
        lso_monotonic(events),
    ]
