"""Network partitions, slow links and ZooKeeper failures, each a scenario on one shared cluster.

The cluster (`tests.faults.lab`): a 3-member ZooKeeper ensemble and three brokers, each in a
network namespace of its own, clients in a fourth. Every scenario writes with acks=all through
the fault, heals, requires the cluster to converge, and checks the history Jepsen-style
(`tests.faults.history`): zero acknowledged records lost, nothing read that later disappeared,
per-partition order, HW and leader epochs monotonic. What Kafka guarantees in each scenario and
what Odradek does is in the README's failure-behaviour table.

Needs root, `ip` and `iptables` (skipped, visibly, without them).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from odradek.errors import OperatorError
from odradek.testing import LocalCluster
from odradek.testing.link_emulator import LinkProfile
from odradek.testing.netns import NetworkLab, available, sweep_stale
from tests.faults.lab import SESSION_TIMEOUT_MS, LabCluster, ScenarioContext, run_scenario

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    sweep_stale()
    directory = tmp_path_factory.mktemp("partitions")
    with NetworkLab() as network:
        network.add_node("client")
        with network.entered("client"):
            cluster = LocalCluster.up(
                directory,
                3,
                zookeepers=3,
                network=network,
                overrides={
                    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
                    "replica.lag.time.max.ms": "6000",
                },
                timeout=120,
            )
            try:
                yield LabCluster(network, cluster, Path(directory))
            finally:
                cluster.kill_all()


@pytest.fixture
def seed(fault_seed: int) -> int:
    return fault_seed


def _run(lab: LabCluster, name: str, fault, seed: int, summary: list[str]) -> None:  # type: ignore[no-untyped-def]
    run_scenario(lab, name, fault, seed, summary)


def _restart_wedged_members(
    lab: LabCluster, context: ScenarioContext, all_if_serving: bool
) -> None:
    """What an operator does when ZooKeeper has not recovered a minute after a fault: restart
    the members that do not serve, or, if `all_if_serving`, all of them when every member
    answers `srvr` yet the ensemble does not do its work. What the scenarios check is Odradek's
    behaviour, not ZooKeeper's."""
    ensemble = lab.cluster.ensemble
    stuck = [i for i, mode in ensemble.modes().items() if mode is None]
    if not stuck and all_if_serving:
        stuck = list(ensemble.ids)
    for member in stuck:
        ensemble.restart(member, wait=False)
    if stuck:
        context.notes.append(f"ZooKeeper members {stuck} restarted: not recovered after 60 s")


# ---------------------------------------------------------------------------------------------
# network


def test_zombie_leader_isolated_from_zookeeper_and_brokers(
    lab: LabCluster, seed: int, fault_summary: list[str]
) -> None:
    """The seeds' zombie leader: cut off from ZooKeeper and the other brokers, still reachable
    by producers. Its ZooKeeper session expires, the controller elects another leader; writes
    it takes meanwhile cannot reach the ISR, so they must fail or time out, never be
    acknowledged and lost."""

    def fault(context: ScenarioContext) -> None:
        partition = context.rng.randrange(3)
        zombie = context.leader_of(partition)
        node = lab.broker_node(zombie)
        lab.network.isolate(node, except_=["client"])
        time.sleep(SESSION_TIMEOUT_MS / 1000 * 2.5)
        context.notes.append(f"broker {zombie} isolated (but for clients)")
        moved = context.leader_of(partition)
        assert moved not in (zombie, -1), f"partition {partition} still led by {moved}"

    _run(lab, "zombie-leader", fault, seed, fault_summary)


def test_leader_isolated_from_followers_only(
    lab: LabCluster, seed: int, fault_summary: list[str]
) -> None:
    """The leader still reaches ZooKeeper: it shrinks the ISR to itself, and with
    min.insync.replicas=2 refuses acks=all writes (NOT_ENOUGH_REPLICAS) until healed."""

    def fault(context: ScenarioContext) -> None:
        partition = context.rng.randrange(3)
        leader = context.leader_of(partition)
        others = [lab.broker_node(b) for b in lab.cluster.broker_ids if b != leader]
        lab.network.partition([lab.broker_node(leader)], others)
        time.sleep(10)
        context.notes.append(f"broker {leader} cut off from brokers {others}")

    _run(lab, "leader-from-followers", fault, seed, fault_summary)


def test_controller_isolated_from_brokers_not_zookeeper(
    lab: LabCluster, seed: int, fault_summary: list[str]
) -> None:
    def fault(context: ScenarioContext) -> None:
        controller = lab.cluster.controller_id()
        assert controller is not None
        others = [lab.broker_node(b) for b in lab.cluster.broker_ids if b != controller]
        lab.network.partition([lab.broker_node(controller)], others)
        time.sleep(10)
        context.notes.append(f"controller {controller} cut off from the brokers")

    _run(lab, "controller-from-brokers", fault, seed, fault_summary)


def test_controller_isolated_from_zookeeper(
    lab: LabCluster, seed: int, fault_summary: list[str]
) -> None:
    """Its session expires, another broker becomes controller (epoch + 1); the old one resigns
    and, healed, re-registers."""

    def fault(context: ScenarioContext) -> None:
        controller = lab.cluster.controller_id()
        assert controller is not None
        lab.network.partition([lab.broker_node(controller)], lab.zookeeper_nodes)
        time.sleep(SESSION_TIMEOUT_MS / 1000 * 2.5)
        now = lab.cluster.controller_id()
        context.notes.append(f"controller {controller} cut off from ZooKeeper, now {now}")
        assert now not in (None, controller)

    _run(lab, "controller-from-zookeeper", fault, seed, fault_summary)


def test_broker_on_slow_lossy_link(lab: LabCluster, seed: int, fault_summary: list[str]) -> None:
    """200 ms each way with 20 ms jitter and 5% loss (both directions), some reordering."""

    def fault(context: ScenarioContext) -> None:
        broker = context.rng.choice(lab.cluster.broker_ids)
        profile = LinkProfile(delay_ms=200, jitter_ms=20, loss_percent=5, reorder_percent=2)
        lab.network.set_link(lab.broker_node(broker), profile, seed=seed)
        start = time.monotonic()
        # A TCP handshake is one round trip: ~400 ms through the emulated link (or a lost SYN).
        address = (lab.cluster.broker(broker).host, lab.cluster.broker(broker).port)
        handshakes = []
        for _ in range(3):
            began = time.monotonic()
            with socket.create_connection(address, timeout=10):
                handshakes.append(time.monotonic() - began)
        # A reordered packet skips the delay (netem's rule), so one handshake may be quicker.
        assert sorted(handshakes)[1] > 0.3, f"handshakes took {handshakes}: the link is not slow"
        time.sleep(max(0.0, 15 - (time.monotonic() - start)))
        acks = context.acks_between(start, time.monotonic())
        context.notes.append(
            f"broker {broker} on {profile}: handshake {min(handshakes) * 1000:.0f} ms, "
            f"{acks} acks meanwhile"
        )
        assert acks > 0, "nothing was acknowledged through a slow link"

    _run(lab, "slow-lossy-link", fault, seed, fault_summary)


def test_flapping_links(lab: LabCluster, seed: int, fault_summary: list[str]) -> None:
    """Random brokers' and ZooKeeper members' links go down and up, 0.2-3 s at a time."""

    def fault(context: ScenarioContext) -> None:
        nodes = lab.broker_nodes + lab.zookeeper_nodes
        flaps = 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            node = context.rng.choice(nodes)
            lab.network.flap(node, 1, context.rng.uniform(0.2, 3.0), context.rng.uniform(0.2, 2.0))
            flaps += 1
        context.notes.append(f"{flaps} flaps")

    _run(lab, "flapping-links", fault, seed, fault_summary)


# ---------------------------------------------------------------------------------------------
# ZooKeeper


def test_zookeeper_leader_killed_and_member_partitioned(
    lab: LabCluster, seed: int, fault_summary: list[str]
) -> None:
    """One member killed (the leader), then another cut off from the brokers: a quorum
    remains throughout, brokers only change the member they talk to."""

    def fault(context: ScenarioContext) -> None:
        ensemble = lab.cluster.ensemble
        leader = ensemble.leader()
        assert leader is not None
        ensemble.kill(leader)
        time.sleep(5)
        other = context.rng.choice([i for i in ensemble.ids if i != leader])
        lab.network.partition([f"zk{other}"], lab.broker_nodes)
        time.sleep(8)
        context.notes.append(f"ZooKeeper {leader} killed, {other} cut off from the brokers")

    _run(lab, "zookeeper-member-faults", fault, seed, fault_summary)


def test_zookeeper_quorum_lost_longer_than_session_timeout(
    lab: LabCluster, seed: int, fault_summary: list[str]
) -> None:
    """Both followers of the ensemble paused for three session timeouts: the leader loses its
    quorum and steps down, ZooKeeper serves nobody. As in Kafka, brokers keep serving reads and
    writes that need no metadata change (acks=all writes are acknowledged while the ISR stays
    whole), and when the quorum returns the sessions are still valid (the newly elected
    ZooKeeper leader restarts their clocks), so no broker re-registers and no partition changes
    leader. (Pausing the ZooKeeper *leader* is different: see the next scenario.)"""

    def fault(context: ScenarioContext) -> None:
        ensemble = lab.cluster.ensemble
        before = context.states()
        leader = ensemble.leader()
        paused = [i for i in ensemble.ids if i != leader]
        start = time.monotonic()
        with ensemble.paused(*paused):
            time.sleep(SESSION_TIMEOUT_MS / 1000 * 3)
            acks = context.acks_between(start + 2, time.monotonic())
        context.notes.append(f"ZooKeeper {paused} paused: {acks} acks without a quorum")
        assert acks > 0, "no write was acknowledged while ZooKeeper had no quorum"
        time.sleep(8)
        after = context.states()
        flapped = {
            p: (before[p].leader, before[p].leader_epoch, after[p].leader, after[p].leader_epoch)
            for p in before
            if (before[p].leader, before[p].leader_epoch)
            != (after[p].leader, after[p].leader_epoch)
        }
        assert not flapped, f"leaders changed across the ZooKeeper outage: {flapped}"

    _run(lab, "zookeeper-quorum-lost", fault, seed, fault_summary)


def test_zookeeper_unreachable_from_every_broker(
    lab: LabCluster, seed: int, fault_summary: list[str]
) -> None:
    """The whole ensemble partitioned from every broker for two session timeouts: the
    sessions expire, and when the network heals every broker re-registers and the controller
    is re-elected; writes keep being acknowledged while the ISR is whole."""

    def fault(context: ScenarioContext) -> None:
        lab.network.partition(lab.zookeeper_nodes, lab.broker_nodes)
        start = time.monotonic()
        time.sleep(SESSION_TIMEOUT_MS / 1000 * 2)
        acks = context.acks_between(start + 2, time.monotonic())
        context.notes.append(f"ZooKeeper cut off from every broker: {acks} acks meanwhile")
        assert acks > 0, "no write was acknowledged while ZooKeeper was unreachable"

    _run(lab, "zookeeper-unreachable", fault, seed, fault_summary)


def test_zookeeper_member_cut_off_from_its_peers(
    lab: LabCluster, seed: int, fault_summary: list[str]
) -> None:
    """A minority member stops serving (it has no quorum): the brokers connected to it move to
    the other two within their session, nothing expires and no leader changes."""

    def fault(context: ScenarioContext) -> None:
        ensemble = lab.cluster.ensemble
        member = context.rng.choice(ensemble.ids)
        others = [f"zk{i}" for i in ensemble.ids if i != member]
        before = context.states()
        lab.network.partition([f"zk{member}"], others)
        time.sleep(SESSION_TIMEOUT_MS / 1000 * 2)
        modes = ensemble.modes()
        context.notes.append(f"ZooKeeper {member} cut off from its peers: modes {modes}")
        assert modes[member] is None, f"a member without a quorum still serves: {modes}"
        after = context.states()
        assert {p: s.leader_epoch for p, s in after.items()} == {
            p: s.leader_epoch for p, s in before.items()
        }, "leaders changed though a quorum remained"

    _run(lab, "zookeeper-minority-member", fault, seed, fault_summary)


def test_broker_dies_while_zookeeper_has_no_quorum(
    lab: LabCluster, seed: int, fault_summary: list[str]
) -> None:
    """A metadata change that has to wait: a broker is killed while two ZooKeeper members are
    paused. Nothing can elect new leaders until the quorum returns (as in Kafka); then its
    session expires, the controller moves its leaderships to ISR members, and, restarted, it
    catches up. No acknowledged write may be lost across both faults."""

    def fault(context: ScenarioContext) -> None:
        ensemble = lab.cluster.ensemble
        paused = context.rng.sample(ensemble.ids, 2)
        victim = context.rng.choice(lab.cluster.broker_ids)
        with ensemble.paused(*paused):
            time.sleep(2)
            lab.cluster.kill(victim)
            time.sleep(SESSION_TIMEOUT_MS / 1000 * 1.5)
        resumed = time.monotonic()

        def victim_registered() -> bool:
            try:
                return victim in lab.cluster.registered_epochs()
            except OperatorError:  # the ensemble has not re-formed yet
                return True

        # ZooKeeper's part: the dead broker's session expires; if it has not a minute after the
        # quorum returned, an operator restarts the members (the ZooKeeper 3.8 wedges of the
        # scenario below). The CI run of 2026-12-06 saw the leaderships not move in 60 s while
        # the other brokers' ISR writes went through, without recording which part stalled:
        # the two parts are now waited for, and reported, apart.
        restarted = False
        while victim_registered():
            waited = time.monotonic() - resumed
            if waited > 180:
                raise AssertionError(
                    f"broker {victim}'s ZooKeeper session did not expire in {waited:.0f}s "
                    f"(members: {ensemble.modes()})"
                )
            if not restarted and waited > 60:
                _restart_wedged_members(lab, context, all_if_serving=True)
                restarted = True
            time.sleep(0.5)
        expired = time.monotonic()
        # Odradek's part: the controller moves the dead broker's leaderships to ISR members.
        deadline = expired + 60
        while time.monotonic() < deadline:
            states = context.states()
            if all(s.leader not in (victim, -1) for s in states.values()):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(
                f"broker {victim}'s leaderships did not move in 60 s after its registration "
                f"went (controller {lab.cluster.controller_id()}, registered "
                f"{lab.cluster.registered_epochs()}): {states}"
            )
        context.notes.append(
            f"broker {victim} killed while ZooKeeper {paused} paused; its session expired "
            f"{expired - resumed:.1f}s and leaders moved {time.monotonic() - resumed:.1f}s "
            "after the quorum returned"
        )
        lab.cluster.start_broker(victim, timeout=90)

    _run(lab, "broker-dies-without-quorum", fault, seed, fault_summary)


def test_zookeeper_leader_paused_longer_than_session_timeout(
    lab: LabCluster, seed: int, fault_summary: list[str]
) -> None:
    """The ZooKeeper leader and one follower frozen (SIGSTOP) for three session timeouts. When
    they resume they usually still form a quorum, and the leader's session tracker, which saw no
    heartbeat while frozen, expires every broker's session: that is ZooKeeper's behaviour, and
    Kafka's brokers see the same. Each broker fences its leaderships, re-registers, a controller
    is elected again and leaders may move (found by the scenario above when its random choice
    included the ZooKeeper leader). Sometimes some or all sessions survive instead (the clients'
    pings reach the resumed leader before its tracker runs), and the ensemble may take tens of
    seconds to sync again, or (ZooKeeper 3.8) not re-form at all until its members are
    restarted; either way no acknowledged write may be lost and the cluster must converge."""

    def fault(context: ScenarioContext) -> None:
        ensemble = lab.cluster.ensemble
        leader = ensemble.leader()
        assert leader is not None
        follower = context.rng.choice([i for i in ensemble.ids if i != leader])
        epochs_before = lab.cluster.registered_epochs()
        with ensemble.paused(leader, follower):
            time.sleep(SESSION_TIMEOUT_MS / 1000 * 3)
        resumed = time.monotonic()
        deadline = resumed + 180
        epochs: dict[int, int] = {}
        stable: dict[int, int] = {}
        stable_since = 0.0
        restarted_members = False
        while time.monotonic() < deadline:
            if not restarted_members and time.monotonic() - resumed > 60:
                # ZooKeeper 3.8 sometimes never re-forms after this (a follower stays stuck
                # after "Got zxid ... expected 0x1", seen here for minutes), or every member
                # answers `srvr` but a broker's new session is never answered (the soak's
                # "wedge"; the whole-suite run of 2026-11-28 met it here for 3.5 minutes).
                brokers_missing = False
                with contextlib.suppress(OperatorError):
                    brokers_missing = set(lab.cluster.registered_epochs()) != set(epochs_before)
                _restart_wedged_members(lab, context, all_if_serving=brokers_missing)
                restarted_members = True
            try:  # the resumed leader may step down and the ensemble re-elect first
                epochs = lab.cluster.registered_epochs()
            except OperatorError:
                time.sleep(0.5)
                continue
            if set(epochs) != set(epochs_before) or epochs != stable:
                stable, stable_since = epochs, time.monotonic()
            elif time.monotonic() - stable_since > SESSION_TIMEOUT_MS / 1000 + 2:
                # Every broker registered, and no session expired for a session timeout: the
                # ensemble has settled (all, some or none of the sessions expired).
                again = sorted(b for b in epochs if epochs[b] != epochs_before[b])
                context.notes.append(
                    f"ZooKeeper leader {leader} and {follower} paused: brokers {again} "
                    "re-registered, the others' sessions survived"
                )
                return
            time.sleep(0.5)
        raise AssertionError(f"brokers did not register again: {epochs} after {epochs_before}")

    _run(lab, "zookeeper-leader-paused", fault, seed, fault_summary)
