"""Controlled shutdown (SIGTERM) and rolling restarts against real brokers and real clients.

* *One broker leading partitions is terminated* while a confluent-kafka producer writes with
  acks=all. The broker asks the controller to move its leaderships before it closes anything
  (its log says the controlled shutdown succeeded before it says it shut down), every partition
  it led is led by another ISR member one leader epoch later, and `odradek cluster status`, polled
  throughout, never shows a partition offline. It exits with code 0, leaves the clean-shutdown
  marker in its log dir, and on restart loads its logs as cleanly shut down (no recovery).
* *A rolling restart of all three brokers* (terminate, restart, wait until every ISR is full
  again, next broker; the controller is restarted in its turn, so its own controlled shutdown and
  the controller failover that follows happen under load). The producer never gets an error it
  does not retry, status never shows a partition offline, and every acknowledged record is read
  back at its offset from the final leaders and is in every replica's files.

A partition shows as offline in status when its leader is -1 or not registered, exactly what a
client would see as "no leader"; the poller reads it through `read_status`, the function behind
`odradek cluster status`, about every 20 ms.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from odradek.errors import OdradekError
from odradek.log.naming import CLEAN_SHUTDOWN_FILE
from odradek.testing import LocalCluster, read_status
from tests.fixtures.cluster import wait_until
from tests.integration._replication import (
    Deliveries,
    StreamingProducer,
    assert_acknowledged_present,
    create_topic,
    read_committed,
    records_of,
    unique_topic,
    wait_for_identical_replicas,
    zk_partition_state,
)

TIMEOUT_S = 60.0
START_MARKER = "=== odradek cluster: starting broker"
STATUS_POLL_INTERVAL_S = 0.02


@dataclass
class OfflineObservation:
    at: float
    partitions: list[tuple[str, int, int]]  # topic, partition, leader


@dataclass
class StatusPoller:
    """Polls the cluster's health from ZooKeeper in a background thread and keeps every moment a
    partition of `topics` was offline. Concurrency: the thread appends under `_lock`; the test
    thread reads after `stop()`."""

    connect: str
    topics: set[str]
    polls: int = 0
    offline: list[OfflineObservation] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> StatusPoller:
        self._thread = threading.Thread(target=self._run, name="status-poller", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                status = asyncio.run(read_status(self.connect, 5.0))
            except OdradekError:  # ZooKeeper busy or a session refused: try again
                continue
            offline = [
                (d["topic"], d["partition"], d["leader"])
                for topic, entry in status["topics"].items()
                if topic in self.topics
                for d in entry["offline_partitions"]
            ]
            with self._lock:
                self.polls += 1
                if offline:
                    self.offline.append(OfflineObservation(time.monotonic(), offline))
            self._stopping.wait(STATUS_POLL_INTERVAL_S)

    def stop(self) -> StatusPoller:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(30)
        return self


def _terminate(cluster: LocalCluster, broker_id: int) -> int | None:
    """SIGTERM the broker (controlled shutdown) and return its exit code (None if it had to be
    killed). `LocalCluster.terminate` only says whether it exited by itself; the code comes from
    the process handle the cluster holds, read before the cluster forgets it."""
    process = cluster._processes[broker_id]
    assert process.popen is not None, "the cluster did not start this broker itself"
    popen = process.popen
    exited = cluster.terminate(broker_id, timeout=TIMEOUT_S)
    return popen.returncode if exited else None


def _last_run_log(cluster: LocalCluster, broker_id: int) -> str:
    """The broker's log since its most recent start."""
    text = cluster.broker(broker_id).log.read_text(errors="replace")
    return text[text.rfind(START_MARKER) :]


def _ordered(text: str, *fragments: str) -> bool:
    """True if every fragment appears in `text`, in this order."""
    position = 0
    for fragment in fragments:
        found = text.find(fragment, position)
        if found < 0:
            return False
        position = found + len(fragment)
    return True


def _full_isr(cluster: LocalCluster, topic: str) -> bool:
    entry = cluster.status()["topics"].get(topic)
    return entry is not None and entry["under_replicated"] == 0 and entry["offline"] == 0


def _assert_acknowledged_readable(
    cluster: LocalCluster, topic: str, deliveries: Deliveries
) -> None:
    """Every acknowledged record is at its offset on the partition's leader and in every
    replica's files."""
    for partition, acked in deliveries.acknowledged_by_partition().items():
        state = zk_partition_state(cluster, topic, partition)
        read = read_committed(cluster.broker(state.leader), topic, partition)
        assert read.error == ErrorCode.none, read.error
        assert_acknowledged_present(acked, read.records, f"the leader of {topic}-{partition}")
        common = wait_for_identical_replicas(
            cluster, list(state.isr), topic, partition, TIMEOUT_S, min_end_offset=max(acked) + 1
        )
        assert_acknowledged_present(acked, records_of(common), f"{topic}-{partition} replicas")


def test_a_terminated_leader_hands_over_before_it_exits_and_restarts_without_recovery(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(brokers=3, min_insync_replicas=2)
    controller = cluster.controller_id()
    victim = next(b for b in cluster.broker_ids if b != controller)
    first, second = (b for b in cluster.broker_ids if b != victim)
    assignment = [
        [victim, first, second],
        [first, victim, second],
        [victim, second, first],
        [second, first, victim],
        [victim, first, second],
        [first, second, victim],
    ]
    topic = unique_topic("terminated")
    create_topic(cluster, topic, assignment)
    before = {p: zk_partition_state(cluster, topic, p) for p in range(len(assignment))}
    led = {p for p, s in before.items() if s.leader == victim}
    assert led == {0, 2, 4}

    poller = StatusPoller(cluster.zookeeper_connect, {topic}).start()
    stream = StreamingProducer(cluster.bootstrap_servers, topic, "cs", acks="all").start()
    try:
        wait_until(lambda: stream.acknowledged_count() >= 500, TIMEOUT_S, "500 acknowledged")
        exit_code = _terminate(cluster, victim)
        acknowledged = stream.acknowledged_count()
        wait_until(
            lambda: stream.acknowledged_count() >= acknowledged + 500,
            TIMEOUT_S,
            "500 more acknowledged after the shutdown",
        )
    except BaseException:
        stream.abandon()
        poller.stop()
        raise
    deliveries = stream.stop()
    poller.stop()

    assert exit_code == 0
    # The controller moved the leaderships, and said so, before the broker closed its session.
    shutdown_log = _last_run_log(cluster, victim)
    assert _ordered(
        shutdown_log,
        f"broker {victim} shutting down",
        "controlled shutdown succeeded",
        f"broker {victim} shut down cleanly",
    ), shutdown_log[-3000:]
    for partition in led:
        state = zk_partition_state(cluster, topic, partition)
        assert state.leader in before[partition].isr and state.leader != victim, state
        assert state.leader_epoch > before[partition].leader_epoch
        assert victim not in state.isr
    # Clients saw no offline partition and no error they would not retry.
    assert poller.polls > 10
    assert not poller.offline, poller.offline[:5]
    assert not deliveries.failed, deliveries.failed[:5]
    assert (cluster.broker(victim).data_dir / CLEAN_SHUTDOWN_FILE).exists()

    # On restart the logs load as cleanly shut down: no recovery.
    cluster.start_broker(victim)
    started_log = _last_run_log(cluster, victim)
    data_dir = cluster.broker(victim).data_dir
    assert f"loaded {len(assignment)} logs from {data_dir} (clean shutdown)" in started_log, (
        started_log[:3000]
    )
    assert "(unclean shutdown)" not in started_log
    wait_until(lambda: _full_isr(cluster, topic), TIMEOUT_S, "the victim back in every ISR")
    _assert_acknowledged_readable(cluster, topic, deliveries)


def test_a_rolling_restart_under_load_loses_nothing_and_never_takes_a_partition_offline(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(brokers=3, min_insync_replicas=2)
    ids = cluster.broker_ids
    assignment = [[ids[(p + i) % 3] for i in range(3)] for p in range(6)]
    topic = unique_topic("rolling")
    create_topic(cluster, topic, assignment)
    controllers = [cluster.controller_id()]

    poller = StatusPoller(cluster.zookeeper_connect, {topic}).start()
    stream = StreamingProducer(cluster.bootstrap_servers, topic, "roll", acks="all").start()
    exit_codes = {}
    try:
        wait_until(lambda: stream.acknowledged_count() >= 300, TIMEOUT_S, "300 acknowledged")
        for broker_id in ids:
            exit_codes[broker_id] = _terminate(cluster, broker_id)
            cluster.start_broker(broker_id, timeout=TIMEOUT_S)
            wait_until(lambda: _full_isr(cluster, topic), TIMEOUT_S, f"full ISR after {broker_id}")
            controllers.append(cluster.controller_id())
            target = stream.acknowledged_count() + 200
            wait_until(
                lambda: stream.acknowledged_count() >= target,  # noqa: B023 (used at once)
                TIMEOUT_S,
                f"200 more acknowledged after restarting {broker_id}",
            )
    except BaseException:
        stream.abandon()
        poller.stop()
        raise
    deliveries = stream.stop()
    poller.stop()

    assert exit_codes == dict.fromkeys(ids, 0)
    for broker_id in ids:
        assert "(clean shutdown)" in _last_run_log(cluster, broker_id)
    # The first controller was restarted too: someone else took over, and stayed.
    assert controllers[0] is not None and controllers[-1] is not None
    assert len(set(controllers)) > 1, controllers
    assert poller.polls > 10
    assert not poller.offline, poller.offline[:5]
    assert not deliveries.failed, deliveries.failed[:5]
    assert len(deliveries.acknowledged) >= 900
    _assert_acknowledged_readable(cluster, topic, deliveries)
