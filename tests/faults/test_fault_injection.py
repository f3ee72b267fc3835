"""Seeded fault injection against a real local cluster (VOPR-style), while real clients write.

One run:

1. *Set-up.* A seeded schedule (`schedule.make_schedule`) decides the cluster size and the faults.
   `make_cluster` starts a private ZooKeeper and the brokers; one topic, RF=3,
   min.insync.replicas=2, unclean leader election off. Producers (`workload.ProducerWorkload`,
   confluent-kafka, acks=all) write unique values to every partition from their own threads; the
   observer (`workload.ClusterObserver`) records every leader, leader epoch and controller epoch
   it sees.
2. *Safety phase.* The faults run one after another (`schedule.FaultInjector`). After each one
   the continuously checked invariants are consulted (one leader per leader epoch, controller
   epoch monotonic, no record acknowledged below what its producer had already seen acknowledged);
   the first violation ends the phase.
3. *Liveness phase.* Faults off: ZooKeeper up, every broker running. The cluster must converge:
   every partition led by a registered broker with its full ISR; then the producers stop and
   every replica must hold identical batches up to the high watermark.
4. *Checks.* Each invariant of `checker` runs on what was collected, plus the state-change logs of
   every broker; all must pass. The summary line (seed, faults by kind, records acknowledged,
   checks passed) is printed at the end of the session; a failure names the seed, and
   `ODRADEK_FAULT_SEED=<seed>` repeats the schedule.

CI mode runs about three dozen faults on 3-4 brokers in about six minutes. Soak mode
(`ODRADEK_SOAK=1`; `ODRADEK_SOAK_FAULTS` to choose how many) runs many more on five brokers, with
more partitions and producers; without the variable it is skipped, visibly.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from kio.schema.errors import ErrorCode

from odradek.cli.launcher import LocalCluster
from odradek.errors import OdradekError
from odradek.protocol.record_batch import Record
from tests.faults.checker import (
    CheckResult,
    ControllerEpochHistory,
    FinalPartition,
    LeaderEpochHistory,
    acknowledged_records_readable,
    controller_epoch_monotonic,
    every_partition_led,
    one_leader_per_epoch,
    producer_order,
    read_state_change_log,
    replicas_agree_below_high_watermark,
)
from tests.faults.schedule import (
    FaultInjector,
    FaultRecord,
    ScheduleSettings,
    describe_counts,
    make_schedule,
)
from tests.faults.workload import (
    ClusterObserver,
    Endpoint,
    PartitionState,
    ProducerStats,
    ProducerWorkload,
    duplicate_acknowledgements,
    merge_acknowledged,
    merge_floors,
    read_partition_states,
)
from tests.fixtures.cluster import wait_until
from tests.integration._replication import (
    StoredBatch,
    create_topic,
    read_committed,
    replica_batches,
)

SESSION_TIMEOUT_MS = 5000
CI = ScheduleSettings(
    mode="ci",
    faults=34,
    min_brokers=3,
    max_brokers=4,
    partitions=6,
    producers=3,
    session_timeout_ms=SESSION_TIMEOUT_MS,
)
SOAK = ScheduleSettings(
    mode="soak",
    faults=int(os.environ.get("ODRADEK_SOAK_FAULTS", "200")),
    min_brokers=5,
    max_brokers=5,
    partitions=12,
    producers=5,
    session_timeout_ms=SESSION_TIMEOUT_MS,
)


@dataclass(frozen=True)
class Budget:
    """Time limits of one run, in seconds: faults stop being injected once `safety` has passed
    (so that CI stays inside pytest's timeout), the cluster has `liveness` to converge."""

    safety: float
    liveness: float


CI_BUDGET = Budget(safety=330.0, liveness=120.0)
SOAK_BUDGET = Budget(safety=float(os.environ.get("ODRADEK_SOAK_SECONDS", "3600")), liveness=300.0)


def _assignment(brokers: list[int], partitions: int) -> list[list[int]]:
    """RF=3, preferred leaders spread over the brokers (partition p starts at broker p mod n)."""
    count = len(brokers)
    return [[brokers[(p + i) % count] for i in range(3)] for p in range(partitions)]


def _say(config: pytest.Config, text: str) -> None:
    reporter = config.pluginmanager.getplugin("terminalreporter")
    capture = config.pluginmanager.getplugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(text)


def _converged(cluster: LocalCluster, topic: str, partitions: int) -> dict[int, PartitionState]:
    """Every partition led by a registered broker with its whole ISR ({} if not yet)."""
    try:
        states = read_partition_states(cluster.zookeeper_connect, topic, partitions)
        registered = set(cluster.registered_brokers())
    except OdradekError:
        return {}
    ok = all(
        s.leader in registered and sorted(s.isr) == sorted(s.replicas) for s in states.values()
    )
    return states if ok else {}


@dataclass
class Committed:
    """What the healed cluster holds: per partition, what a consumer reads from the leader (up
    to the HW), the HW, and every replica's batches read from its files."""

    records: dict[int, list[Record]]
    high_watermarks: dict[int, int]
    replicas: dict[int, dict[int, list[StoredBatch]]]


def _read_committed(
    cluster: LocalCluster, topic: str, states: dict[int, PartitionState]
) -> Committed | None:
    records, high_watermarks, replicas = {}, {}, {}
    for partition, state in states.items():
        try:
            read = read_committed(cluster.broker(state.leader), topic, partition)
        except OdradekError:
            return None
        if read.error != ErrorCode.none:
            return None
        records[partition] = read.records
        high_watermarks[partition] = read.high_watermark
        replicas[partition] = {
            b: replica_batches(cluster.broker(b), topic, partition) for b in state.replicas
        }
    return Committed(records, high_watermarks, replicas)


def _replicas_caught_up(committed: Committed) -> bool:
    return replicas_agree_below_high_watermark(committed.replicas, committed.high_watermarks).passed


def _producer_checks(stats: list[ProducerStats]) -> list[CheckResult]:
    problems = [f"{s.name}: {s.error}" for s in stats if s.error]
    problems += [
        f"{s.name}: {s.unfinished} messages without a report" for s in stats if s.unfinished
    ]
    duplicates = duplicate_acknowledgements(stats)
    acknowledged = sum(len(o) for s in stats for o in s.acknowledged.values())
    return [
        CheckResult("producers_finished", not problems, len(stats), tuple(problems[:5])),
        CheckResult("acknowledgements_unique", not duplicates, acknowledged, tuple(duplicates[:5])),
    ]


def run_faults(
    make_cluster: Callable[..., LocalCluster],
    seed: int,
    settings: ScheduleSettings,
    budget: Budget,
    config: pytest.Config,
    summary: list[str],
) -> None:
    started = time.monotonic()
    schedule = make_schedule(seed, settings)
    cluster = make_cluster(
        brokers=schedule.brokers,
        min_insync_replicas=2,
        unclean_leader_election_enable=False,
        zookeeper_session_timeout_ms=settings.session_timeout_ms,
        replica_lag_time_max_ms=5000,
    )
    topic = f"faults-{seed}"
    create_topic(
        cluster,
        topic,
        _assignment(cluster.broker_ids, settings.partitions),
        {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"},
    )
    leaders, controllers = LeaderEpochHistory(), ControllerEpochHistory()
    endpoints = [Endpoint(b.id, b.host, b.port) for b in cluster.brokers]
    observer = ClusterObserver(
        cluster.zookeeper_connect, endpoints, topic, settings.partitions, leaders, controllers
    ).start()
    workload = ProducerWorkload(
        cluster.bootstrap_servers, topic, settings.partitions, settings.producers
    ).start()
    injector = FaultInjector(cluster, topic, settings.partitions, settings.session_timeout_ms, seed)
    records: list[FaultRecord] = []
    stopped_early = ""
    try:
        wait_until(lambda: workload.acknowledged_count() >= 200, 60, "the workload to start")
        # 2. Safety phase.
        for fault in schedule.faults:
            if time.monotonic() - started > budget.safety:
                stopped_early = f"time budget of {budget.safety:g}s reached"
                break
            record = injector.inject(fault)
            records.append(record)
            _say(config, f"  fault {record.describe()}")
            early = leaders.violations() + controllers.violations() + workload.violations()
            if early:
                stopped_early = f"invariant violated after fault #{fault.index}: {early[0]}"
                break
            injector.pause(fault.gap_s)
        # 3. Liveness phase.
        healed = injector.heal_everything()
        try:
            wait_until(
                lambda: _converged(cluster, topic, settings.partitions),
                budget.liveness,
                "every partition led with a full ISR",
                interval=0.2,
            )
        except AssertionError as e:
            _say(config, f"  liveness: {e}")
        stats = workload.stop()
    except BaseException:
        workload.abandon()
        observer.stop()
        raise
    observer.stop()

    states = read_partition_states(cluster.zookeeper_connect, topic, settings.partitions)
    committed: Committed | None = None

    def caught_up() -> bool:
        nonlocal committed
        committed = _read_committed(cluster, topic, states)
        return committed is not None and _replicas_caught_up(committed)

    try:
        wait_until(caught_up, budget.liveness, "replicas identical up to the HW", interval=0.5)
    except AssertionError as e:
        _say(config, f"  liveness: {e}")
    for broker in cluster.brokers:
        path = broker.dir / "state-change.log"
        if path.exists():
            read_state_change_log(
                path.read_text(errors="replace"), topic, f"broker {broker.id}", leaders, controllers
            )

    # 4. Checks.
    acknowledged = merge_acknowledged(stats)
    final = [
        FinalPartition(p, s.leader, s.isr, s.replicas)
        for p, s in read_partition_states(
            cluster.zookeeper_connect, topic, settings.partitions
        ).items()
    ]
    results = [
        *_producer_checks(stats),
        acknowledged_records_readable(acknowledged, committed.records if committed else {}),
        producer_order(acknowledged, merge_floors(stats)),
        replicas_agree_below_high_watermark(
            committed.replicas if committed else {}, committed.high_watermarks if committed else {}
        ),
        one_leader_per_epoch(leaders),
        controller_epoch_monotonic(controllers),
        every_partition_led(final, cluster.registered_brokers(), settings.partitions),
    ]
    if committed is None:
        results.append(CheckResult("committed_records_read", False, 0, ("could not read",)))
    failed = [r for r in results if not r.passed]
    failures = sum(n for s in stats for n in s.failures.values())
    slow = sum(1 for r in records if r.slow)
    line = (
        f"fault-injection {settings.mode} seed={seed}: {schedule.brokers} brokers, "
        f"{settings.partitions} partitions, {len(records)} faults {describe_counts(records)}, "
        f"{sum(len(o) for o in acknowledged.values())} records acknowledged "
        f"({failures} not: {_failure_names(stats)}), checks passed "
        f"{len(results) - len(failed)}/{len(results)}, controller epoch "
        f"{controllers.highest}, {slow} slow faults, {time.monotonic() - started:.0f}s"
    )
    if stopped_early:
        line += f"; stopped early: {stopped_early}"
    summary.append(line)
    _say(config, line)
    if healed:
        _say(config, f"  healing: {', '.join(healed)}")
    for result in results:
        _say(config, f"  {result.describe()}")
    if failed or stopped_early.startswith("invariant"):
        history = "\n".join(r.describe() for r in records)
        pytest.fail(
            f"seed {seed}: {len(failed)} invariant(s) violated "
            f"(repeat with ODRADEK_FAULT_SEED={seed})\n"
            + "\n".join(r.describe() for r in failed)
            + f"\nfaults:\n{history}",
            pytrace=False,
        )


def _failure_names(stats: list[ProducerStats]) -> str:
    names: dict[str, int] = {}
    for s in stats:
        for name, count in s.failures.items():
            names[name] = names.get(name, 0) + count
    return ", ".join(f"{k}={v}" for k, v in sorted(names.items())) or "none"


def test_fault_injection(
    make_cluster: Callable[..., LocalCluster],
    fault_seed: int,
    fault_summary: list[str],
    request: pytest.FixtureRequest,
):
    run_faults(make_cluster, fault_seed, CI, CI_BUDGET, request.config, fault_summary)


@pytest.mark.soak
@pytest.mark.timeout(0)
@pytest.mark.skipif(
    os.environ.get("ODRADEK_SOAK") != "1", reason="soak mode runs only with ODRADEK_SOAK=1"
)
def test_fault_injection_soak(
    make_cluster: Callable[..., LocalCluster],
    fault_seed: int,
    fault_summary: list[str],
    request: pytest.FixtureRequest,
):
    run_faults(make_cluster, fault_seed, SOAK, SOAK_BUDGET, request.config, fault_summary)
