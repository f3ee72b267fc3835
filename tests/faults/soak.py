"""Mixed faults for the soak (`./dev soak`, never CI): network, ZooKeeper and process faults one
after another on the namespaced cluster of `tests.faults.lab`.

A seeded schedule picks each fault's kind and victims and how long it lasts (0.5-4 s); after
each one everything is healed and killed processes are started again, and every
`CONVERGE_EVERY` faults the cluster must converge before the next. The kinds:

* network: a random split of all brokers and ZooKeeper members into two sides (symmetric or
  one-way), one node isolated (optionally but for the clients), a slow/lossy/reordering link
  on one node, a link flap;
* ZooKeeper: a member killed (restarted at heal), a member paused, a majority paused (quorum
  lost);
* process: a broker SIGKILLed (restarted at heal), a broker paused (SIGSTOP), a broker
  restarted with a controlled shutdown;
* disk: a broker crashed with the tail of its active segment torn (`tear_segment`: cut inside
  its never-fsynced batches, or garbage appended), restarted at heal.

Faults run in rounds (`FAULTS_PER_ROUND`), each round a `run_scenario` on a fresh topic whose
history is checked; `SoakReport` collects the counts for the JSON summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from odradek.errors import ClusterTimeoutError, OperatorError
from odradek.testing.cluster_files import tail
from odradek.testing.link_emulator import LinkProfile
from odradek.zk.client import ZkClient
from odradek.zk.errors import ZkError
from odradek.zk.server import server_mode
from tests.faults.lab import LabCluster, ScenarioContext, restart_stopped_brokers, wait_converged
from tests.faults.schedule import tear_segment
from tests.faults.workload import ZK_TIMEOUT_S

FAULTS_PER_ROUND = 100
CONVERGE_EVERY = 10
# How long an ensemble may serve no client after a heal before the soak calls it wedged.
ZOOKEEPER_WEDGED_S = 60.0


@dataclass
class SoakReport:
    faults: Counter[str] = field(default_factory=Counter)
    rounds: list[dict[str, object]] = field(default_factory=list)
    nemesis_errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "faults": sum(self.faults.values()),
            "faults_by_kind": dict(sorted(self.faults.items())),
            "rounds": self.rounds,
            "acknowledged": sum(int(r["acknowledged"]) for r in self.rounds),  # type: ignore[call-overload]
            "anomalies": sum(int(r["anomalies"]) for r in self.rounds),  # type: ignore[call-overload]
            "nemesis_errors": self.nemesis_errors,
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def _inject_one(lab: LabCluster, context: ScenarioContext, report: SoakReport) -> str:
    rng = context.rng
    network = lab.network
    cluster = lab.cluster
    ensemble = cluster.ensemble
    nodes = lab.broker_nodes + lab.zookeeper_nodes
    hold = rng.uniform(0.5, 4.0)
    kind = rng.choice(
        [
            "partition", "one-way-partition", "isolate", "isolate-but-clients", "slow-link",
            "flap", "zookeeper-kill", "zookeeper-pause", "zookeeper-quorum-loss",
            "broker-kill", "broker-pause", "broker-restart", "torn-tail",
        ]
    )  # fmt: skip
    killed_brokers: list[int] = []
    paused_brokers: list[int] = []
    if kind in ("partition", "one-way-partition"):
        shuffled = rng.sample(nodes, len(nodes))
        cut = rng.randrange(1, len(nodes))
        network.partition(shuffled[:cut], shuffled[cut:], one_way=kind == "one-way-partition")
    elif kind in ("isolate", "isolate-but-clients"):
        network.isolate(rng.choice(nodes), except_=["client"] if kind.endswith("clients") else [])
    elif kind == "slow-link":
        profile = LinkProfile(
            delay_ms=rng.choice([20, 100, 200]),
            jitter_ms=rng.choice([0, 10, 50]),
            loss_percent=rng.choice([0, 1, 5, 20]),
            reorder_percent=rng.choice([0, 5]),
        )
        network.set_link(rng.choice(nodes), profile, seed=rng.randrange(1 << 30))
    elif kind == "flap":
        network.flap(rng.choice(nodes), rng.randint(1, 4), rng.uniform(0.1, 1.0), 0.3)
        hold = 0.0
    elif kind == "zookeeper-kill":
        ensemble.kill(rng.choice(ensemble.ids))
    elif kind == "zookeeper-pause":
        ensemble.pause(rng.choice(ensemble.ids))
    elif kind == "zookeeper-quorum-loss":
        for server_id in rng.sample(ensemble.ids, 2):
            ensemble.pause(server_id)
        hold = rng.uniform(2.0, 9.0)  # sometimes longer than the session timeout
    elif kind == "broker-kill":
        broker = rng.choice(cluster.broker_ids)  # all run: _require_no_crash checked
        cluster.kill(broker)
        killed_brokers.append(broker)
    elif kind == "broker-pause":
        broker = rng.choice(cluster.broker_ids)
        cluster.stop(broker)
        paused_brokers.append(broker)
    elif kind == "broker-restart":
        cluster.restart(rng.choice(cluster.broker_ids), timeout=90)
        hold = 0.0
    elif kind == "torn-tail":
        killed_brokers.append(_kill_and_tear(lab, context))
        hold = 0.0
    context.nemesis(
        f"{kind} for {hold:.1f}s: cuts {[(sorted(a), sorted(b)) for a, b in network.partitions]}, "
        f"links {[n.name for n in network.nodes.values() if n.emulator]}, "
        f"brokers killed {killed_brokers} paused {paused_brokers}, "
        f"ZooKeeper modes {ensemble.modes() if kind.startswith('zookeeper') else 'unchanged'}"
    )
    time.sleep(hold)
    for broker in paused_brokers:
        cluster.cont(broker)
    lab.heal()
    for broker in killed_brokers:
        cluster.start_broker(broker, wait=False)
    report.faults[kind] += 1
    context.nemesis("heal")
    return kind


def _kill_and_tear(lab: LabCluster, context: ScenarioContext) -> int:
    """A disk fault: a broker crashes in the middle of writing, so the tail of its active
    segment is torn (cut inside never-fsynced batches, or garbage appended), and it must recover
    and catch up. Only inside Kafka's promise: every ISR is full when it dies and the controller
    has taken it out of every ISR before the tail is damaged (another member holds all it had);
    otherwise it degrades to a plain kill. Returns the victim (restarted by the heal)."""
    rng = context.rng
    cluster = lab.cluster
    states = context.states()
    victim = rng.choice([b for b in cluster.broker_ids if b != cluster.controller_id()])
    isr_full = all(sorted(s.isr) == sorted(s.replicas) for s in states.values())
    cluster.kill(victim)
    deadline = time.monotonic() + 30
    removed = False
    while isr_full and time.monotonic() < deadline:
        current = context.states()
        if all(victim not in s.isr and s.leader != victim for s in current.values()):
            removed = True
            break
        time.sleep(0.2)
    if not removed:
        context.nemesis(f"broker {victim} killed, not torn (ISRs not full or not shrunk in time)")
        return victim
    partition = rng.randrange(len(states))
    torn = tear_segment(
        cluster.broker(victim).data_dir,
        context.topic,
        partition,
        append=rng.random() < 0.3,
        fraction=rng.random(),
        seed=rng.randrange(1 << 30),
    )
    what = f"{torn.segment.name}: {torn.action}" if torn else "no segment"
    context.nemesis(f"broker {victim} killed, tail of partition {partition} torn ({what})")
    return victim


# What a broker prints when it gives up at start-up because ZooKeeper did not answer within
# zookeeper.connection.timeout.ms: Kafka's broker exits the same way (ZooKeeperClientTimeoutException).
_ZOOKEEPER_UNREACHABLE_AT_START = "odradek: error: ZooKeeper at "


def _require_no_crash(lab: LabCluster, context: ScenarioContext, index: int) -> None:
    """Every broker runs before each fault (the previous heal restarted the ones the nemesis
    killed). One that does not either gave up at start-up because ZooKeeper had no quorum then
    (restarted, and recorded: Kafka does the same), or crashed (the soak fails)."""
    dead = [b for b in lab.cluster.broker_ids if not lab.cluster.is_alive(b)]
    for broker in list(dead):
        last = tail(lab.cluster.broker(broker).log, 3)
        if _ZOOKEEPER_UNREACHABLE_AT_START in last and "unreachable" in last:
            context.nemesis(
                f"broker {broker} gave up at start-up, ZooKeeper unreachable: restarted"
            )
            lab.cluster.start_broker(broker, wait=False)
            dead.remove(broker)
    if dead:
        logs = {b: tail(lab.cluster.broker(b).log, 15) for b in dead}
        raise AssertionError(f"before fault {index}: brokers {dead} are not running: {logs}")


def _zookeeper_answers(lab: LabCluster) -> bool:
    """Whether a client can open a session (a write the quorum commits) and read now."""

    async def probe() -> None:
        zk = ZkClient(lab.cluster.zookeeper_connect, session_timeout_s=10.0)
        await zk.start(timeout=ZK_TIMEOUT_S)
        try:
            await zk.exists("/")
        finally:
            await zk.close()

    try:
        asyncio.run(probe())
    except (ZkError, OperatorError, OSError, TimeoutError):
        return False
    return True


def _zookeeper_diagnosis(lab: LabCluster) -> str:
    """Each member's process state (/proc: R running, S sleeping, T stopped) and `srvr` mode; a
    JVM thread dump goes to each member's log (SIGQUIT), for the post-mortem."""
    parts = []
    ensemble = lab.cluster.ensemble
    for peer in ensemble.peers:
        pid = ensemble.servers[peer.id].pid
        state = "-"
        if pid is not None:
            with contextlib.suppress(OSError, IndexError):
                state = Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1]
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGQUIT)
        parts.append(
            f"{peer.id}: pid {pid} state {state} mode {server_mode(peer.host, peer.client_port, 2.0)}"
        )
    return "; ".join(parts)


def _converge(lab: LabCluster, context: ScenarioContext, report: SoakReport, index: int) -> None:
    """Wait for the cluster to converge, restarting (once ZooKeeper serves) a broker that gave
    up at start-up during a ZooKeeper outage. An ensemble that has served no client for
    `ZOOKEEPER_WEDGED_S` after the heal, with every member running and the network healed, is
    diagnosed, recorded and restarted member by member, as an operator would: what brokers do
    while ZooKeeper is gone is under test, a ZooKeeper that never comes back is not."""
    deadline = time.monotonic() + 180
    unanswered_since: float | None = None
    while True:
        _require_no_crash(lab, context, index)
        try:
            wait_converged(lab, context.topic, min(30.0, max(1.0, deadline - time.monotonic())))
            return
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        if _zookeeper_answers(lab):
            unanswered_since = None
            continue
        now = time.monotonic()
        unanswered_since = unanswered_since or now
        if now - unanswered_since >= ZOOKEEPER_WEDGED_S:
            diagnosis = _zookeeper_diagnosis(lab)
            report.nemesis_errors.append(
                f"fault {index}: ZooKeeper served no client for {ZOOKEEPER_WEDGED_S:g}s after "
                f"the heal ({diagnosis}); members restarted"[:600]
            )
            context.nemesis(f"ZooKeeper wedged ({diagnosis}): members restarted")
            lab.heal()
            for server_id in lab.cluster.ensemble.ids:
                lab.cluster.ensemble.restart(server_id, wait=False)
            unanswered_since = None
            deadline = time.monotonic() + 180


def mixed_faults(lab: LabCluster, report: SoakReport, count: int):  # type: ignore[no-untyped-def]
    """A `run_scenario` fault function injecting `count` mixed faults."""

    def fault(context: ScenarioContext) -> None:
        for index in range(1, count + 1):
            _require_no_crash(lab, context, index)
            try:
                _inject_one(lab, context, report)
            except (OperatorError, ClusterTimeoutError, subprocess.SubprocessError) as e:
                # The nemesis could not do what it meant to (a restart that waited too long on a
                # loaded machine): recorded and counted, the soak goes on; a broker that really
                # died is caught by _require_no_crash before the next fault.
                report.nemesis_errors.append(f"fault {index}: {e}"[:300])
                context.nemesis(f"nemesis error: {e}")
                lab.heal()
                restart_stopped_brokers(lab)
            if index % CONVERGE_EVERY == 0:
                lab.heal()
                _converge(lab, context, report, index)
        context.notes.append(f"{count} mixed faults")

    return fault


def keep_logs(lab: LabCluster, destination: Path) -> Path:
    """Copy the cluster's logs and histories (broker, state-change and ZooKeeper logs, history
    dumps) to `destination`, for the post-mortem of a failed round: the lab's own directory is
    reused by the next round and removed with the test's temporary directory."""
    destination.mkdir(parents=True, exist_ok=True)
    for path in lab.directory.rglob("*"):
        if path.is_file() and (path.suffix in (".log", ".jsonl") or path.name == "cluster.json"):
            if "data" in path.relative_to(lab.directory).parts:
                continue  # segments are not logs
            target = destination / path.relative_to(lab.directory)
            target.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copy2(path, target)
    return destination
