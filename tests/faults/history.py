"""A Jepsen-style history of a fault run, and the checker that judges it.

While faults are injected, every client operation goes into a `History` with its time:

* `send`: a producer handed a value to its client for a partition;
* `ack` / `fail`: the delivery report (the offset, or the error name);
* `read`: a record a reader got from some broker during the run (below that broker's HW);
* `hw`: a broker answered ListOffsets(latest) for a partition it leads: its HW and leader epoch;
* `final`: the records read from the healed cluster at the end, the reference of every check.

Values are unique per producer (`f"{producer}-{seq}"`), so a value names one send. The checks
(`check_history`), each its own `CheckResult`:

1. `no_lost_acknowledged_write`: every acknowledged (partition, offset, value) is in the final
   log at that offset (a value acknowledged without an offset, an idempotent producer's implicit
   acknowledgement, anywhere in its partition);
2. `no_duplicate`: no value appears twice in the final log. A producer without idempotence may
   legitimately write a retried batch twice (Kafka's at-least-once), so this check is skipped --
   reported as such, never silently passed -- unless the history says the producers were
   idempotent;
3. `per_partition_order`: offsets in the final log increase, and a value its producer sent after
   an earlier value of the same partition was acknowledged lies at a higher offset;
4. `no_read_of_lost_record`: every record read during the run is in the final log, at the same
   offset with the same value (nothing a consumer saw was later taken back);
5. `monotonic_hw_and_epochs`: for each partition and broker, the leader epoch a broker answers
   with never goes back, and within one leader epoch the HW never goes back.

A history with a transactional writer (`transactions`) also holds `txn_send` (a record of a
transaction, the process naming the transaction), `txn_outcome` (how it ended: committed,
aborted, fenced, failed or unknown, in `error`), `txn_read` (a record a read_committed consumer
got during the run), `txn_final` (what a read_committed consumer reads from the healed cluster)
and `lso` (a leader's ListOffsets under read_committed: the last stable offset, with its leader
epoch). Its checks, run when the history says it is transactional (else reported as skipped):

6. `committed_transactions_visible_once`: every record of a committed transaction is in the final
   read_committed read exactly once, in the partition it was sent to; a transaction whose
   outcome is unknown (its commit was tried and not answered) is all there or not at all; no
   value is read twice. At least one transaction must have committed.
7. `aborted_transactions_invisible`: no record of an aborted, fenced or failed transaction is
   ever read by a read_committed consumer, during the run or at the end; a fenced producer's
   commit was refused; every value read was sent by the writer. At least one transaction must
   have been aborted.
8. `read_committed_reads_stable`: every record a read_committed consumer read during the run is
   in the final read at the same offset, and no consumer got a value twice.
9. `lso_monotonic`: per partition and leader epoch, the LSO never goes back.

`History.dump` writes the events as JSON lines (attached to a failed test's directory), and
`load_history` reads them back so a checker change can be replayed on a recorded run.

Concurrency: `History.record` takes a lock; producers and readers call it from their threads.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.faults.checker import CheckResult, _result
from tests.faults.transaction_checks import check_transactions


@dataclass(frozen=True)
class Event:
    time: float
    kind: str  # send, ack, fail, read, hw, final
    process: str  # the producer, reader or broker that did or saw it
    partition: int
    value: str | None = None
    offset: int | None = None
    leader_epoch: int | None = None
    error: str | None = None


@dataclass
class History:
    idempotent: bool = False
    transactional: bool = False
    events: list[Event] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, kind: str, process: str, partition: int, **fields: object) -> None:
        event = Event(time.monotonic(), kind, process, partition, **fields)  # type: ignore[arg-type]
        with self._lock:
            self.events.append(event)

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(e.kind == kind for e in self.events)

    def dump(self, path: Path) -> None:
        with open(path, "w") as out:
            header = {"idempotent": self.idempotent, "transactional": self.transactional}
            out.write(json.dumps(header) + "\n")
            for event in self.snapshot():
                out.write(json.dumps(asdict(event)) + "\n")


def load_history(path: Path) -> History:
    lines = Path(path).read_text().splitlines()
    header = json.loads(lines[0])
    history = History(header["idempotent"], header.get("transactional", False))
    history.events = [Event(**json.loads(line)) for line in lines[1:]]
    return history


def _final_log(events: Sequence[Event]) -> dict[int, dict[int, str]]:
    final: dict[int, dict[int, str]] = {}
    for e in events:
        if e.kind == "final" and e.offset is not None and e.value is not None:
            final.setdefault(e.partition, {})[e.offset] = e.value
    return final


def no_lost_acknowledged_write(events: Sequence[Event]) -> CheckResult:
    final = _final_log(events)
    violations = []
    checked = 0
    values_by_partition = {p: set(log.values()) for p, log in final.items()}
    for e in events:
        if e.kind != "ack":
            continue
        checked += 1
        if e.offset is None:
            # Acknowledged without an offset (an idempotent producer's implicit acknowledgement
            # of a retried batch): it must be somewhere in the partition.
            if e.value not in values_by_partition.get(e.partition, set()):
                violations.append(
                    f"{e.value} acknowledged (offset unknown) in partition {e.partition} "
                    f"(t={e.time:.3f}), not in the final log"
                )
            continue
        found = final.get(e.partition, {}).get(e.offset)
        if found != e.value:
            violations.append(
                f"{e.value} acknowledged at partition {e.partition} offset {e.offset} "
                f"(t={e.time:.3f}), final log has {found!r}"
            )
    return _result("no_lost_acknowledged_write", checked, violations)


def no_duplicate(events: Sequence[Event], idempotent: bool) -> CheckResult:
    if not idempotent:
        return CheckResult("no_duplicate", True, 0, ("skipped: the producers are not idempotent",))
    seen: dict[str, tuple[int, int]] = {}
    violations = []
    for partition, log in sorted(_final_log(events).items()):
        for offset, value in sorted(log.items()):
            first = seen.setdefault(value, (partition, offset))
            if first != (partition, offset):
                violations.append(f"{value} at {first} and at ({partition}, {offset})")
    return _result("no_duplicate", len(seen), violations)


def per_partition_order(events: Sequence[Event]) -> CheckResult:
    """Floors from the history itself: the highest offset a producer had seen acknowledged in
    the partition when it sent a value (events of one producer are recorded by one thread, in
    order)."""
    violations = []
    checked = 0
    highest: dict[tuple[str, int], int] = {}
    floor_of: dict[str, int] = {}
    for e in events:
        key = (e.process, e.partition)
        if e.kind == "send" and e.value is not None:
            floor_of[e.value] = highest.get(key, -1)
        elif e.kind == "ack" and e.offset is not None and e.value is not None:
            checked += 1
            floor = floor_of.get(e.value, -1)
            if e.offset <= floor:
                violations.append(
                    f"partition {e.partition}: {e.value} acknowledged at offset {e.offset}, sent "
                    f"after offset {floor} was acknowledged"
                )
            highest[key] = max(highest.get(key, -1), e.offset)
    for partition, log in _final_log(events).items():
        offsets = sorted(log)
        if len(set(offsets)) != len(offsets):
            violations.append(f"partition {partition}: an offset appears twice in the final log")
    return _result("per_partition_order", checked, violations)


def no_read_of_lost_record(events: Sequence[Event]) -> CheckResult:
    final = _final_log(events)
    violations = []
    checked = 0
    for e in events:
        if e.kind != "read":
            continue
        checked += 1
        found = final.get(e.partition, {}).get(e.offset)  # type: ignore[arg-type]
        if found != e.value:
            violations.append(
                f"{e.process} read {e.value} at partition {e.partition} offset {e.offset} "
                f"(t={e.time:.3f}); the final log has {found!r}"
            )
    return _result("no_read_of_lost_record", checked, violations)


def monotonic_hw_and_epochs(events: Sequence[Event]) -> CheckResult:
    violations = []
    checked = 0
    last: dict[tuple[str, int], tuple[int, int]] = {}
    for e in events:
        if e.kind != "hw" or e.offset is None or e.leader_epoch is None:
            continue
        checked += 1
        key = (e.process, e.partition)
        previous = last.get(key)
        if previous is not None:
            epoch, hw = previous
            if e.leader_epoch < epoch:
                violations.append(
                    f"{e.process} partition {e.partition}: leader epoch {e.leader_epoch} after "
                    f"{epoch} (t={e.time:.3f})"
                )
            elif e.leader_epoch == epoch and e.offset < hw:
                violations.append(
                    f"{e.process} partition {e.partition} leader epoch {epoch}: HW {e.offset} "
                    f"after {hw} (t={e.time:.3f})"
                )
        last[key] = (max(e.leader_epoch, previous[0]) if previous else e.leader_epoch, e.offset)
    return _result("monotonic_hw_and_epochs", checked, violations)


def check_history(history: History) -> list[CheckResult]:
    events = sorted(history.snapshot(), key=lambda e: e.time)
    return [
        no_lost_acknowledged_write(events),
        no_duplicate(events, history.idempotent),
        per_partition_order(events),
        no_read_of_lost_record(events),
        monotonic_hw_and_epochs(events),
        *check_transactions(events, history.transactional),
    ]


def record_final(history: History, partition: int, records: Iterable[tuple[int, str]]) -> None:
    for offset, value in records:
        history.record("final", "final-reader", partition, value=value, offset=offset)
