"""The invariants of the fault-injection suite, each its own checker.

Every checker is a pure function of what the run collected and returns a `CheckResult` (passed,
and a short account of the first violations). None of them talks to the cluster; the test
gathers the inputs (delivery reports, committed records read by a consumer, segment files read
from each replica's data directory, observations of leaders and controllers) and hands them over.

The invariants:

1. `acknowledged_records_readable`: every record whose acks=all produce was acknowledged at
   offset o is what a consumer reads at offset o once the cluster has healed.
2. `producer_order`: per partition, a record a producer sent after one of its records had been
   acknowledged lies at a higher offset than that record. This is the order Kafka promises. The
   stricter "a producer's values increase with offsets" is not a broker property without an
   idempotent producer: librdkafka with one request in flight per connection still reorders when
   a request to a frozen old leader is pending while the partition moves to a new leader, so a
   later batch is acknowledged by the new leader before the earlier one is retried (seen in this
   suite with seed 12345: p0-15798 at offset 7706, p0-15210 at offset 7720, both acknowledged,
   in that order).
3. `replicas_agree_below_high_watermark`: every replica's files hold byte-identical batches below
   the leader's high watermark, so no offset holds two different records in two replicas.
4. `one_leader_per_epoch`: no (partition, leader epoch) was ever seen with two different leaders,
   from any source (partition state znodes, any broker's Metadata, any controller's state-change
   log). A leader of -1 (none) is not a leader and is ignored.
5. `controller_epoch_monotonic`: `/controller_epoch` never went back in the order it was read, and
   no controller epoch was ever held by two different brokers (pairs from the `/controller` znode
   created in the same transaction as the epoch, and from the state-change logs' "[Controller
   id=X epoch=E]" prefixes).
6. `every_partition_led`: at the end, every partition has a registered leader and a full ISR.
7. `brokers_never_crash`: no broker process exited unless the schedule killed or stopped it
   (a start-up that fails, or a broker found dead, is a crash).
8. `idempotent_writes_once`: per partition, the values of each idempotent producer appear in
   the committed log in the order it sent them, each at most once: no retry through a fault
   (a lost answer, a leader change, a restarted leader) stored a batch twice or out of order; and
   a record librdkafka acknowledged without an offset (its implicit acknowledgement of a retried
   batch, once a later batch succeeded) is there.

`LeaderEpochHistory` and `ControllerEpochHistory` accept observations while the run goes on, so
the safety phase can stop at the first violation; their checkers read what they accumulated.

Concurrency: the histories take a lock on every call (the observer thread writes, the test thread
reads); the checker functions touch only their arguments.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from odradek.protocol.record_batch import Record, read_header
from tests.integration._replication import StoredBatch, batches_below

MAX_DETAILS = 5
NO_LEADER = -1

# "[Controller id=1 epoch=7] Changed state of t-0 from X to Y with leader=1, leader_epoch=3, ..."
_STATE_CHANGE = re.compile(
    r"\[Controller id=(?P<controller>\d+) epoch=(?P<epoch>\d+)\] Changed state of "
    r"(?P<subject>\S+) from \w+ to \w+(?: with leader=(?P<leader>-?\d+), "
    r"leader_epoch=(?P<leader_epoch>\d+))?"
)


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    checked: int
    details: tuple[str, ...] = ()

    def describe(self) -> str:
        verdict = "ok" if self.passed else "VIOLATED"
        text = f"{self.name}: {verdict} ({self.checked} checked)"
        if self.details:
            text += "\n    " + "\n    ".join(self.details)
        return text


def _result(name: str, checked: int, violations: Sequence[str]) -> CheckResult:
    details = tuple(violations[:MAX_DETAILS])
    if len(violations) > MAX_DETAILS:
        details += (f"... and {len(violations) - MAX_DETAILS} more",)
    return CheckResult(name, not violations, checked, details)


# ---------------------------------------------------------------------------------------------
# 1-3: records


def acknowledged_records_readable(
    acknowledged: Mapping[int, Mapping[int, bytes]],
    committed: Mapping[int, Sequence[Record]],
) -> CheckResult:
    """Every acknowledged (partition, offset) holds the acknowledged value in the committed log."""
    violations = []
    checked = 0
    for partition, acked in sorted(acknowledged.items()):
        by_offset = {r.offset: r.value for r in committed.get(partition, ())}
        for offset, value in sorted(acked.items()):
            checked += 1
            found = by_offset.get(offset)
            if found != value:
                violations.append(
                    f"partition {partition} offset {offset}: acknowledged {value!r}, read {found!r}"
                )
    return _result("acknowledged_records_readable", checked, violations)


def producer_order(
    acknowledged: Mapping[int, Mapping[int, bytes]],
    floors: Mapping[int, Mapping[int, int]],
) -> CheckResult:
    """partition -> {offset: floor}: every acknowledged record lies above the highest offset its
    producer had seen acknowledged in that partition when it sent it (module docstring)."""
    violations = []
    checked = 0
    for partition, acked in sorted(acknowledged.items()):
        partition_floors = floors.get(partition, {})
        for offset, value in sorted(acked.items()):
            floor = partition_floors.get(offset)
            if floor is None:
                violations.append(f"partition {partition} offset {offset}: no floor recorded")
                continue
            checked += 1
            if offset <= floor:
                violations.append(
                    f"partition {partition}: {value!r} acknowledged at offset {offset}, sent "
                    f"after offset {floor} was acknowledged"
                )
    return _result("producer_order", checked, violations)


def idempotent_writes_once(
    records: Mapping[int, Sequence[Record]],
    producers: Iterable[str],
    persisted: Mapping[int, Iterable[bytes]] | None = None,
    producer_epochs: Mapping[int, Mapping[int, int]] | None = None,
) -> CheckResult:
    """partition -> committed records: for each of `producers` (names of idempotent producers,
    whose values are `<name>-<sequence>`), its sequences increase strictly with the offset; and
    every value of `persisted` (acknowledged without an offset: librdkafka's implicit
    acknowledgement of a retried batch) is stored in its partition.

    `producer_epochs` (partition -> offset -> producer epoch of the batch holding it) tells
    librdkafka's renumbering apart: after an epoch bump it sends its queue again from sequence 0
    under the new epoch, including a record whose earlier attempt may have been stored (README,
    "Idempotent producer"; Kafka stores it twice too, and no broker can tell it from new data).
    A record stored again under a higher epoch than its earlier copy is reported in the details
    but is not a violation; one stored twice under the same epoch is."""
    names = set(producers)
    violations = []
    renumbered = []
    checked = 0
    for partition, values in sorted((persisted or {}).items()):
        stored = {record.value for record in records.get(partition, ())}
        for value in values:
            checked += 1
            if value not in stored:
                violations.append(
                    f"partition {partition}: {value!r} acknowledged (without an offset) but "
                    "not stored"
                )
    for partition, partition_records in sorted(records.items()):
        epochs = (producer_epochs or {}).get(partition, {})
        last: dict[str, tuple[int, int]] = {}
        for record in partition_records:
            name, _, sequence = (record.value or b"").decode(errors="replace").rpartition("-")
            if name not in names or not sequence.isdigit():
                continue
            checked += 1
            previous = last.get(name)
            if previous is not None and int(sequence) <= previous[0]:
                kind = "twice" if int(sequence) == previous[0] else "out of order"
                message = (
                    f"partition {partition}: {name}-{sequence} at offset {record.offset} "
                    f"stored {kind} (after {name}-{previous[0]} at offset {previous[1]})"
                )
                earlier, later = epochs.get(previous[1]), epochs.get(record.offset)
                if earlier is not None and later is not None and later > earlier:
                    renumbered.append(
                        f"{message}, under producer epoch {later} after {earlier}: the client's "
                        "renumbering after an epoch bump, not a broker's"
                    )
                else:
                    violations.append(message)
            last[name] = (int(sequence), record.offset)
    result = _result("idempotent_writes_once", checked, violations)
    if renumbered:
        notes = renumbered[:MAX_DETAILS]
        if len(renumbered) > MAX_DETAILS:
            notes.append(f"... and {len(renumbered) - MAX_DETAILS} more renumbered")
        result = dataclasses.replace(result, details=(*result.details, *notes))
    return result


def producer_epochs_of(batches: Iterable[StoredBatch]) -> dict[int, int]:
    """offset -> the producer epoch of the stored batch that holds it."""
    epochs: dict[int, int] = {}
    for batch in batches:
        epoch = read_header(batch.data).producer_epoch
        for offset in range(batch.base_offset, batch.last_offset + 1):
            epochs[offset] = epoch
    return epochs


def replicas_agree_below_high_watermark(
    replica_batches: Mapping[int, Mapping[int, Sequence[StoredBatch]]],
    high_watermarks: Mapping[int, int],
) -> CheckResult:
    """partition -> {broker: its batches}: identical bytes below the partition's HW everywhere,
    and every replica holds the whole committed range."""
    violations = []
    checked = 0
    for partition, by_broker in sorted(replica_batches.items()):
        high_watermark = high_watermarks[partition]
        views = {b: batches_below(batches, high_watermark) for b, batches in by_broker.items()}
        reference_broker, reference = next(iter(sorted(views.items())))
        for broker_id, view in sorted(views.items()):
            checked += len(view)
            end = view[-1].last_offset + 1 if view else 0
            if end < high_watermark:
                violations.append(
                    f"partition {partition}: broker {broker_id} ends at {end}, below the HW "
                    f"{high_watermark}"
                )
            if view != reference:
                violations.append(
                    f"partition {partition}: broker {broker_id} differs from broker "
                    f"{reference_broker} below the HW {high_watermark}, from offset "
                    f"{_first_difference(reference, view)}"
                )
    return _result("replicas_agree_below_high_watermark", checked, violations)


def _first_difference(a: Sequence[StoredBatch], b: Sequence[StoredBatch]) -> int:
    for left, right in zip(a, b, strict=False):
        if left != right:
            return min(left.base_offset, right.base_offset)
    shorter = a if len(a) < len(b) else b
    return shorter[-1].last_offset + 1 if shorter else 0


# ---------------------------------------------------------------------------------------------
# 4-5: leaders and controllers


@dataclass
class LeaderEpochHistory:
    """Every (partition, leader epoch) -> leaders seen, with where each was seen first."""

    _seen: dict[tuple[int, int], dict[int, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    observations: int = 0

    def observe(self, partition: int, leader_epoch: int, leader: int, source: str) -> None:
        if leader == NO_LEADER or leader_epoch < 0:
            return
        with self._lock:
            self.observations += 1
            self._seen.setdefault((partition, leader_epoch), {}).setdefault(leader, source)

    def violations(self) -> list[str]:
        with self._lock:
            return [
                f"partition {p} leader epoch {e}: leaders {sorted(leaders)} "
                f"(first seen: {', '.join(f'{b} in {s}' for b, s in sorted(leaders.items()))})"
                for (p, e), leaders in sorted(self._seen.items())
                if len(leaders) > 1
            ]


def one_leader_per_epoch(history: LeaderEpochHistory) -> CheckResult:
    return _result("one_leader_per_epoch", history.observations, history.violations())


@dataclass
class ControllerEpochHistory:
    """`/controller_epoch` values in the order read, and epoch -> controllers seen."""

    _epochs: list[int] = field(default_factory=list)
    _holders: dict[int, dict[int, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe_epoch(self, epoch: int) -> None:
        with self._lock:
            self._epochs.append(epoch)

    def observe_holder(self, epoch: int, controller: int, source: str) -> None:
        with self._lock:
            self._holders.setdefault(epoch, {}).setdefault(controller, source)

    @property
    def observations(self) -> int:
        with self._lock:
            return len(self._epochs) + sum(len(h) for h in self._holders.values())

    @property
    def highest(self) -> int:
        with self._lock:
            return max(self._epochs, default=0)

    def violations(self) -> list[str]:
        with self._lock:
            found = [
                f"/controller_epoch went back from {before} to {after} (read {index})"
                for index, (before, after) in enumerate(
                    zip(self._epochs, self._epochs[1:], strict=False), start=1
                )
                if after < before
            ]
            found += [
                f"controller epoch {epoch} held by {sorted(holders)} "
                f"({', '.join(f'{b} in {s}' for b, s in sorted(holders.items()))})"
                for epoch, holders in sorted(self._holders.items())
                if len(holders) > 1
            ]
            return found


def controller_epoch_monotonic(history: ControllerEpochHistory) -> CheckResult:
    return _result("controller_epoch_monotonic", history.observations, history.violations())


def read_state_change_log(
    text: str,
    topic: str,
    source: str,
    leaders: LeaderEpochHistory,
    controllers: ControllerEpochHistory,
) -> int:
    """Feed a broker's state-change log into the histories; returns the lines used."""
    prefix = f"{topic}-"
    used = 0
    for match in _STATE_CHANGE.finditer(text):
        used += 1
        controllers.observe_holder(
            int(match["epoch"]), int(match["controller"]), f"{source} state-change log"
        )
        subject = match["subject"]
        if match["leader"] is None or not subject.startswith(prefix):
            continue
        partition = subject[len(prefix) :]
        if partition.isdigit():
            leaders.observe(
                int(partition),
                int(match["leader_epoch"]),
                int(match["leader"]),
                f"{source} state-change log (controller {match['controller']})",
            )
    return used


# ---------------------------------------------------------------------------------------------
# 6: liveness


@dataclass(frozen=True)
class FinalPartition:
    partition: int
    leader: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]


def every_partition_led(
    partitions: Iterable[FinalPartition], registered: Iterable[int], expected: int
) -> CheckResult:
    live = set(registered)
    violations = []
    seen = 0
    for state in partitions:
        seen += 1
        if state.leader not in live:
            violations.append(f"partition {state.partition}: leader {state.leader} not live")
        if sorted(state.isr) != sorted(state.replicas):
            violations.append(
                f"partition {state.partition}: ISR {list(state.isr)} of {list(state.replicas)}"
            )
    if seen != expected:
        violations.append(f"{seen} partitions found, {expected} expected")
    return _result("every_partition_led", seen, violations)


def brokers_never_crash(crashes: Sequence[str], faults: int) -> CheckResult:
    return _result("brokers_never_crash", faults, list(crashes))
