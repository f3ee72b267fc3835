"""The fault schedule: which faults, in which order, with which pauses, from one seed; and the
injector that plays it against a `LocalCluster`.

`make_schedule(seed, settings)` is pure: the same seed gives the same list of `Fault`s, so a run
that failed can be repeated (`ODRADEK_FAULT_SEED=<seed>`). A fault names its target abstractly
("the leader of partition 3", "the second follower of partition 1") and carries the seeded numbers
it needs (how long to hold it, where to tear a segment); the injector resolves the target against
the cluster as it is when the fault starts. Timing decides the rest (which broker leads partition 3
at that moment), so a repeated run replays the same schedule, not necessarily the same history.

Fault kinds and what the injector does (every wait is a deadline on a condition or on the clock):

* `kill_leader` / `kill_follower` / `kill_controller`: SIGKILL that broker, hold (sometimes less
  than the session timeout, so the controller sees it come back with a new epoch before it saw it
  die), start it again.
* `pause_past_session`: SIGSTOP a broker until ZooKeeper has expired its session (its registration
  is gone), hold a little longer, SIGCONT: a GC pause or a stalled VM, and a zombie leader.
* `pause_short`: SIGSTOP for less than half the session timeout: a slow broker, ISR churn.
* `zookeeper_restart`: stop (SIGTERM) or crash (SIGKILL) the private ZooKeeper, hold, start it
  again on the same port and data (sessions survive, connections do not).
* `rolling_restart`: controlled shutdown (SIGTERM) and restart of every broker in turn, waiting for
  the ISR to be full again between brokers.
* `torn_write`: once every ISR is full, SIGKILL a broker that is not the controller, wait until
  the controller has taken it out of every ISR, then damage the tail of one of its active segments
  (cut it inside one of the last batches written after the recovery point, or append garbage), and
  start it again. Only data that was never fsynced is cut, and only while another ISR member holds
  it: what a crash with a torn page cache does, within the model in which Kafka promises not to
  lose acknowledged records. If a precondition does not hold in time it is a plain kill.

Before each fault the injector looks for brokers that died on their own; a restart that fails
is recorded too (and the broker started again). Both are crashes (`FaultInjector.crashes`), which
the `brokers_never_crash` check turns into a failure.

Faults run one at a time: each is healed before the next starts, so at most one broker is ever
down or frozen (RF=3 with min.insync.replicas=2 keeps accepting writes), and a torn write never
meets another failure that would make its victim the last ISR member.

Concurrency: `FaultInjector` is used from the test's thread only (it drives `LocalCluster`, which
belongs to that thread).
"""

from __future__ import annotations

import enum
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from odradek.errors import ClusterTimeoutError, OperatorError
from odradek.log.checkpoints import read_offset_checkpoint
from odradek.log.naming import RECOVERY_POINT_CHECKPOINT, log_dir_name, parse_segment_file_name
from odradek.protocol.record_batch import iter_batches
from odradek.testing import CLUSTER_FILE, LocalCluster, ProcessState
from odradek.zk.server import ZooKeeperServer
from tests.faults.workload import PartitionState, read_partition_states

T = TypeVar("T")


class FaultKind(enum.Enum):
    KILL_LEADER = "kill_leader"
    KILL_FOLLOWER = "kill_follower"
    KILL_CONTROLLER = "kill_controller"
    PAUSE_PAST_SESSION = "pause_past_session"
    PAUSE_SHORT = "pause_short"
    ZOOKEEPER_RESTART = "zookeeper_restart"
    ROLLING_RESTART = "rolling_restart"
    TORN_WRITE = "torn_write"


# How often each kind is drawn after the first round (which has every kind once).
DEFAULT_WEIGHTS: dict[FaultKind, int] = {
    FaultKind.KILL_LEADER: 6,
    FaultKind.KILL_FOLLOWER: 4,
    FaultKind.KILL_CONTROLLER: 4,
    FaultKind.PAUSE_PAST_SESSION: 4,
    FaultKind.PAUSE_SHORT: 4,
    FaultKind.ZOOKEEPER_RESTART: 3,
    FaultKind.ROLLING_RESTART: 1,
    FaultKind.TORN_WRITE: 5,
}


@dataclass(frozen=True)
class ScheduleSettings:
    """The shape of a run; `mode` is "ci" or "soak"."""

    mode: str
    faults: int
    min_brokers: int
    max_brokers: int
    partitions: int
    producers: int
    session_timeout_ms: int
    weights: dict[FaultKind, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))


@dataclass(frozen=True)
class Fault:
    """One scheduled fault. `partition` picks the leader/follower/segment it is about, `choice`
    picks among several candidates (followers, brokers), `hold_s` is how long it lasts before it
    is healed (for pauses past the session: after the expiry), `gap_s` the pause before the next
    fault, `crash` chooses SIGKILL over SIGTERM for ZooKeeper, `tear_append` garbage over a cut,
    `tear_fraction` where in the damaged region the cut falls."""

    index: int
    kind: FaultKind
    partition: int
    choice: int
    hold_s: float
    gap_s: float
    crash: bool
    tear_append: bool
    tear_fraction: float

    def describe(self) -> str:
        return f"#{self.index} {self.kind.value} (partition {self.partition}, choice {self.choice})"


@dataclass(frozen=True)
class Schedule:
    seed: int
    brokers: int
    faults: list[Fault]


def make_schedule(seed: int, settings: ScheduleSettings) -> Schedule:
    """The schedule of a seed (pure). The first faults cover every kind once, in a seeded order;
    the rest are drawn by weight."""
    rng = random.Random(seed)
    brokers = rng.randint(settings.min_brokers, settings.max_brokers)
    kinds = [k for k in FaultKind if settings.weights.get(k, 0) > 0]
    rng.shuffle(kinds)
    population = list(settings.weights)
    weights = [settings.weights[k] for k in population]
    while len(kinds) < settings.faults:
        kinds.append(rng.choices(population, weights)[0])
    session_s = settings.session_timeout_ms / 1000
    faults = []
    for index, kind in enumerate(kinds[: settings.faults]):
        if kind is FaultKind.PAUSE_SHORT:
            hold = rng.uniform(0.3, session_s / 2)
        elif kind is FaultKind.PAUSE_PAST_SESSION:
            hold = rng.uniform(0.0, 2.0)
        elif kind is FaultKind.ZOOKEEPER_RESTART:
            hold = rng.uniform(0.0, 3.0)
        else:  # kills: sometimes back before the session expires, sometimes well after
            hold = rng.uniform(0.2, session_s + 2.0)
        faults.append(
            Fault(
                index=index,
                kind=kind,
                partition=rng.randrange(settings.partitions),
                choice=rng.randrange(1 << 16),
                hold_s=round(hold, 2),
                gap_s=round(rng.uniform(0.0, 2.0), 2),
                crash=rng.random() < 0.5,
                tear_append=rng.random() < 0.4,
                tear_fraction=rng.random(),
            )
        )
    return Schedule(seed, brokers, faults)


# ---------------------------------------------------------------------------------------------
# ZooKeeper restarts


class ZooKeeperControl:
    """Stop and start a local cluster's private ZooKeeper on the same port and data directory.

    Drives the single server of the `ZooKeeperEnsemble` that `LocalCluster.up` started (the
    cluster's `ensemble`), so that `down()` and `kill_all()` stop whichever process runs at the
    end, and records the new pid in cluster.json.
    """

    def __init__(self, cluster: LocalCluster) -> None:
        info = json.loads((cluster.directory / CLUSTER_FILE).read_text())["zookeeper"]
        if info.get("external") or info.get("dir") is None:
            raise OperatorError("the cluster uses an external ZooKeeper: it cannot be restarted")
        self.cluster = cluster
        self.port = int(info["port"])
        self.data_dir = Path(info["dir"])
        self.log = Path(info["log"]) if info.get("log") else None

    def _server(self) -> ZooKeeperServer:
        return self.cluster.ensemble.server(1)

    def stop(self, crash: bool) -> None:
        server = self._server()
        if crash:
            server.kill()
        else:
            server.stop()

    def start(self, timeout: float = 60.0) -> None:
        server = self._server()
        server.start(timeout=timeout)
        self.cluster.zookeeper.pid = server.pid
        self.cluster._save()

    @property
    def running(self) -> bool:
        return self._server().is_running


# ---------------------------------------------------------------------------------------------
# Torn writes


@dataclass(frozen=True)
class TearResult:
    segment: Path
    action: str  # "cut <old size> -> <new size>" or "appended <n> bytes"


def tear_segment(
    data_dir: Path, topic: str, partition: int, append: bool, fraction: float, seed: int
) -> TearResult | None:
    """Damage the tail of the partition's active (last) segment in `data_dir`; None if the
    replica has no segment. A cut falls inside the batches that start at or after the recovery
    point (never-fsynced data); with none there, garbage is appended instead."""
    directory = data_dir / log_dir_name(topic, partition)
    segments = sorted(
        (parsed[0], entry)
        for entry in (directory.iterdir() if directory.exists() else ())
        if (parsed := parse_segment_file_name(entry.name)) is not None and parsed[1] == ".log"
    )
    if not segments:
        return None
    segment = segments[-1][1]
    data = segment.read_bytes()
    recovery_points = read_offset_checkpoint(data_dir / RECOVERY_POINT_CHECKPOINT)
    recovery_point = recovery_points.get((topic, partition), 0)
    unflushed = [h for h in iter_batches(data) if h.base_offset >= recovery_point][-3:]
    rng = random.Random(seed)
    if append or not unflushed:
        garbage = rng.randbytes(rng.randint(1, 300))
        with open(segment, "ab") as file:
            file.write(garbage)
        return TearResult(segment, f"appended {len(garbage)} bytes")
    start = unflushed[0].position
    end = unflushed[-1].position + unflushed[-1].size
    cut = start + 1 + int(fraction * (end - start - 1))
    os.truncate(segment, cut)
    return TearResult(segment, f"cut {len(data)} -> {cut} bytes")


# ---------------------------------------------------------------------------------------------
# The injector


@dataclass
class FaultRecord:
    """What one fault did, for the summary and for failure reports."""

    fault: Fault
    target: int | None = None
    note: str = ""
    seconds: float = 0.0
    slow: list[str] = field(default_factory=list)

    def describe(self) -> str:
        target = f" on broker {self.target}" if self.target is not None else ""
        note = f": {self.note}" if self.note else ""
        slow = f" [slow: {'; '.join(self.slow)}]" if self.slow else ""
        return f"{self.fault.describe()}{target}{note} ({self.seconds:.1f}s){slow}"


class FaultInjector:
    """Plays faults against one cluster and heals each before returning (module docstring).

    A condition that does not hold within its deadline while a fault is on is noted as "slow" and
    the fault is healed anyway: liveness is judged in the healing phase, not mid-fault.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        topic: str,
        partitions: int,
        session_timeout_ms: int,
        seed: int,
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        self.session_s = session_timeout_ms / 1000
        self.seed = seed
        self.zookeeper = ZooKeeperControl(cluster)
        self.step_timeout_s = self.session_s + 30.0
        # Brokers that exited without being told to (a crash, or a failed start-up): every one
        # is a bug, reported by the `brokers_never_crash` check.
        self.crashes: list[str] = []

    # -- what the cluster looks like now -----------------------------------------------------

    def states(self) -> dict[int, PartitionState]:
        return read_partition_states(self.cluster.zookeeper_connect, self.topic, self.partitions)

    def running(self) -> list[int]:
        return [
            b
            for b in self.cluster.broker_ids
            if self.cluster.process_state(b) is ProcessState.RUNNING
        ]

    def _wait(self, condition: Callable[[], T], timeout: float, what: str, record: FaultRecord):
        """Wait for `condition`; note it as slow (and return None) if it never holds."""
        try:
            return self.cluster.wait_for(condition, timeout, what, interval=0.1)
        except (ClusterTimeoutError, OperatorError) as e:
            record.slow.append(f"{what}: {e}")
            return None

    def pause(self, seconds: float) -> None:
        """Let a fault last: a bounded pause on the clock, never a wait for something."""
        deadline = time.monotonic() + max(0.0, seconds)
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))

    def _registered(self, broker_id: int) -> bool:
        try:
            return broker_id in self.cluster.registered_brokers()
        except OperatorError:
            return False

    def _isr_full(self) -> bool:
        try:
            states = self.states()
        except OperatorError:
            return False
        return all(s.leader >= 0 and sorted(s.isr) == sorted(s.replicas) for s in states.values())

    def _start(self, broker_id: int, record: FaultRecord) -> None:
        try:
            self.cluster.start_broker(broker_id, timeout=self.step_timeout_s)
        except (ClusterTimeoutError, OperatorError) as e:
            record.slow.append(f"start broker {broker_id}: {e}")
            if not self.cluster.is_alive(broker_id):
                self.crashes.append(f"{record.fault.describe()}: {_first_line(str(e))}")
                # A start that failed must not leave the broker down for the next fault.
                self.cluster.start_broker(broker_id, timeout=self.step_timeout_s, wait=False)

    def _restart_crashed(self, record: FaultRecord) -> None:
        """Before a fault: any broker that died on its own is a crash; start it again."""
        for broker_id in self.cluster.broker_ids:
            if self.cluster.process_state(broker_id) is ProcessState.DEAD:
                self.crashes.append(
                    f"before {record.fault.describe()}: broker {broker_id} had exited; last "
                    f"log line: {_last_line(self.cluster.broker(broker_id).log)}"
                )
                self._start(broker_id, record)

    # -- playing one fault -------------------------------------------------------------------

    def inject(self, fault: Fault) -> FaultRecord:
        record = FaultRecord(fault)
        started = time.monotonic()
        self._restart_crashed(record)
        handler = {
            FaultKind.KILL_LEADER: self._kill_leader,
            FaultKind.KILL_FOLLOWER: self._kill_follower,
            FaultKind.KILL_CONTROLLER: self._kill_controller,
            FaultKind.PAUSE_PAST_SESSION: self._pause_past_session,
            FaultKind.PAUSE_SHORT: self._pause_short,
            FaultKind.ZOOKEEPER_RESTART: self._zookeeper_restart,
            FaultKind.ROLLING_RESTART: self._rolling_restart,
            FaultKind.TORN_WRITE: self._torn_write,
        }[fault.kind]
        handler(fault, record)
        record.seconds = time.monotonic() - started
        return record

    def _pick(self, candidates: list[int], fault: Fault) -> int | None:
        candidates = sorted(set(candidates) & set(self.running()))
        return candidates[fault.choice % len(candidates)] if candidates else None

    def _kill_and_restart(self, broker_id: int, fault: Fault, record: FaultRecord) -> None:
        record.target = broker_id
        self.cluster.kill(broker_id)
        self.pause(fault.hold_s)
        self._start(broker_id, record)

    def _kill_leader(self, fault: Fault, record: FaultRecord) -> None:
        state = self.states()[fault.partition]
        target = self._pick([state.leader], fault)
        if target is None:  # no running leader: anyone
            target = self._pick(self.running(), fault)
        record.note = f"leader of partition {fault.partition} was {state.leader}"
        if target is not None:
            self._kill_and_restart(target, fault, record)

    def _kill_follower(self, fault: Fault, record: FaultRecord) -> None:
        state = self.states()[fault.partition]
        followers = [r for r in state.replicas if r != state.leader]
        target = self._pick(followers, fault)
        record.note = f"followers of partition {fault.partition}: {followers}"
        if target is not None:
            self._kill_and_restart(target, fault, record)

    def _kill_controller(self, fault: Fault, record: FaultRecord) -> None:
        controller = self.cluster.controller_id()
        target = self._pick([controller] if controller is not None else [], fault)
        if target is not None:
            self._kill_and_restart(target, fault, record)
        else:
            record.note = "no controller to kill"

    def _pause_past_session(self, fault: Fault, record: FaultRecord) -> None:
        state = self.states()[fault.partition]
        # Half the time the leader of the partition (a zombie leader), else anyone.
        candidates = [state.leader] if fault.choice % 2 == 0 else self.running()
        target = self._pick(candidates, fault)
        if target is None:
            target = self._pick(self.running(), fault)
        if target is None:
            return
        record.target = target
        self.cluster.stop(target)
        try:
            self._wait(
                lambda: not self._registered(target),
                self.step_timeout_s,
                f"the session of broker {target} to expire",
                record,
            )
            self.pause(fault.hold_s)
        finally:
            self.cluster.cont(target)

    def _pause_short(self, fault: Fault, record: FaultRecord) -> None:
        target = self._pick(self.running(), fault)
        if target is None:
            return
        record.target = target
        self.cluster.stop(target)
        try:
            self.pause(fault.hold_s)
        finally:
            self.cluster.cont(target)

    def _zookeeper_restart(self, fault: Fault, record: FaultRecord) -> None:
        record.note = "crash (SIGKILL)" if fault.crash else "clean stop (SIGTERM)"
        self.zookeeper.stop(crash=fault.crash)
        self.pause(fault.hold_s)
        self.zookeeper.start(timeout=self.step_timeout_s)

    def _rolling_restart(self, fault: Fault, record: FaultRecord) -> None:
        unclean = []
        for broker_id in self.cluster.broker_ids:
            if not self.cluster.terminate(broker_id, timeout=self.step_timeout_s):
                unclean.append(broker_id)
            self._start(broker_id, record)
            self._wait(self._isr_full, self.step_timeout_s, f"full ISR after {broker_id}", record)
        record.note = f"brokers that had to be killed: {unclean}" if unclean else "all clean"

    def _torn_write(self, fault: Fault, record: FaultRecord) -> None:
        # Two preconditions keep the damage inside Kafka's promise: every ISR is full when the
        # victim dies (another live member holds all it has), and the controller has taken it out
        # of every ISR before its tail is cut (it comes back as a follower that must catch up).
        # If either does not hold in time, the fault degrades to a plain kill and restart.
        isr_full = self._wait(
            self._isr_full, self.step_timeout_s, "full ISR before tearing", record
        )
        states = self.states()
        controller = self.cluster.controller_id()
        replicas = [r for r in states[fault.partition].replicas if r != controller]
        target = self._pick(replicas, fault)
        if target is None:
            record.note = "no replica to tear"
            return
        record.target = target
        self.cluster.kill(target)
        removed = isr_full and self._wait(
            lambda: all(target not in s.isr and s.leader != target for s in self.states().values()),
            self.step_timeout_s,
            f"the controller to take broker {target} out of every ISR",
            record,
        )
        if not isr_full:
            record.note = "not torn: an ISR was not full"
        elif not removed:
            record.note = "not torn: the broker stayed in an ISR"
        else:
            torn = tear_segment(
                self.cluster.broker(target).data_dir,
                self.topic,
                fault.partition,
                fault.tear_append,
                fault.tear_fraction,
                self.seed * 1000 + fault.index,
            )
            record.note = f"{torn.segment.name}: {torn.action}" if torn else "no segment"
        self._start(target, record)

    # -- healing -----------------------------------------------------------------------------

    def heal_everything(self) -> list[str]:
        """ZooKeeper up, every broker running (SIGCONT the frozen, start the dead); what it did."""
        actions = []
        if not self.zookeeper.running:
            self.zookeeper.start(timeout=self.step_timeout_s)
            actions.append("started ZooKeeper")
        for broker_id in self.cluster.broker_ids:
            state = self.cluster.process_state(broker_id)
            if state is ProcessState.STOPPED:
                self.cluster.cont(broker_id)
                actions.append(f"resumed broker {broker_id}")
            elif state is ProcessState.DEAD:
                self.cluster.start_broker(broker_id, timeout=self.step_timeout_s)
                actions.append(f"started broker {broker_id}")
        return actions


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def describe_counts(records: list[FaultRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        counts[record.fault.kind.value] = counts.get(record.fault.kind.value, 0) + 1
    return counts
