"""Scenario harness of the network and ZooKeeper fault tests: one cluster in a `NetworkLab`.

`LabCluster` is a 3-member ZooKeeper ensemble (nodes `zk1`..`zk3`) and three brokers (`broker1`..
`broker3`), each in its own network namespace, and the test's clients in a fourth (`client`): the
test thread enters `client` for the whole module, so every client it starts (confluent-kafka's
threads, the readers, the harness's own ZooKeeper reads) lives there too.

`run_scenario(lab, name, fault, seed)` runs one scenario on a fresh topic (3 partitions, RF=3,
min.insync.replicas=2, unclean election off):

1. producers (`ProducerWorkload`, acks=all, not idempotent) and one `HistoryReader` per broker
   (ListOffsets for the HW and leader epoch of what it leads, Fetch below the HW) start writing
   everything into a `History`; so do a transactional writer on a second topic
   (`transactions.TransactionalWriter`: commits, deliberate aborts, now and then a fenced
   zombie), a read_committed consumer of that topic, and the readers' ListOffsets under
   read_committed (its last stable offsets);
2. after a short warm-up `fault(context)` runs: it injects the fault, waits as long as the
   scenario needs, and may assert things about the cluster while the fault lasts;
3. everything heals (`NetworkLab.heal`, every ZooKeeper member resumed and running); the cluster
   must converge (every partition led by a live broker with its full ISR) within a deadline;
4. producers stop and drain, the final log of every partition is read from its leader, the
   transactional topic's LSO must reach its HW and a read_committed consumer reads it, and
   `check_history` judges the history. On failure the history is dumped next to the cluster's
   logs and the seed printed (`ODRADEK_FAULT_SEED` repeats the scenario's random choices).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.errors import ErrorCode

from odradek.errors import NetworkError, OdradekError, OperatorError
from odradek.protocol.codec import ApiKey
from odradek.testing import LocalCluster, ProcessState
from odradek.testing.cluster_files import LocalBroker
from odradek.testing.netns import NetworkLab
from tests.faults.checker import CheckResult, replicas_agree_below_high_watermark
from tests.faults.history import History, check_history, record_final
from tests.faults.transactions import CommittedReader, TransactionalWriter, read_final_committed
from tests.faults.workload import PartitionState, ProducerWorkload, read_partition_states
from tests.integration._replication import (
    CONSUMER_REPLICA_ID,
    LATEST_TIMESTAMP,
    LIST_OFFSETS_VERSION,
    FetchAnswer,
    create_topic,
    fetch_records,
    read_committed,
    replica_batches,
    request,
)

PARTITIONS = 3
SESSION_TIMEOUT_MS = 6000
CONVERGE_TIMEOUT_S = 90.0
WARM_UP_S = 3.0
READER_INTERVAL_S = 0.3


@dataclass
class LabCluster:
    network: NetworkLab
    cluster: LocalCluster
    directory: Path

    def broker_node(self, broker_id: int) -> str:
        return f"broker{broker_id}"

    @property
    def zookeeper_nodes(self) -> list[str]:
        return [f"zk{i}" for i in self.cluster.ensemble.ids]

    @property
    def broker_nodes(self) -> list[str]:
        return [self.broker_node(i) for i in self.cluster.broker_ids]

    def heal(self) -> None:
        self.network.heal()
        ensemble = self.cluster.ensemble
        for server_id, server in ensemble.servers.items():
            server.resume()
            if not server.is_running:
                ensemble.restart(server_id, wait=False)


def restart_stopped_brokers(lab: LabCluster, wait_s: float = 0.0) -> None:
    """Continue paused brokers and start dead ones; with `wait_s`, wait that long for each
    started broker to register (a round that starts before it has would fail creating its
    topic: run 6 lost rounds 7-9 so, each within a second of broker 1's start)."""
    for broker in lab.cluster.broker_ids:
        if lab.cluster.process_state(broker) is ProcessState.STOPPED:
            lab.cluster.cont(broker)
        if not lab.cluster.is_alive(broker):
            lab.cluster.start_broker(broker, timeout=wait_s, wait=wait_s > 0)


@dataclass
class ScenarioContext:
    lab: LabCluster
    topic: str
    rng: random.Random
    history: History
    notes: list[str] = field(default_factory=list)

    def states(self) -> dict[int, PartitionState]:
        return read_partition_states(self.lab.cluster.zookeeper_connect, self.topic, PARTITIONS)

    def leader_of(self, partition: int) -> int:
        return self.states()[partition].leader

    def nemesis(self, description: str) -> None:
        """Record a fault in the history (Jepsen's nemesis operations), so that a dumped history
        shows what happened when."""
        self.history.record("nemesis", "nemesis", -1, error=description)

    def acks_between(self, start: float, end: float) -> int:
        return sum(1 for e in self.history.snapshot() if e.kind == "ack" and start <= e.time <= end)


class HistoryReader:
    """Polls one broker for the HW and leader epoch of each partition it leads and reads the
    records below the HW from where it left off, into the history; and, given a transactional
    topic, the last stable offset of each of its partitions the broker leads."""

    def __init__(
        self,
        broker: LocalBroker,
        topic: str,
        history: History,
        partitions: int = PARTITIONS,
        lso_topic: str | None = None,
        lso_partitions: int = 0,
    ) -> None:
        self.broker = broker
        self.topic = topic
        self.history = history
        self.partitions = partitions
        # A transactional topic whose last stable offsets (ListOffsets with isolation_level=1)
        # are recorded as `lso` events, with the leader epoch of the answer.
        self.lso_topic = lso_topic
        self.lso_partitions = lso_partitions if lso_topic else 0
        self.positions = dict.fromkeys(range(partitions), 0)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reader-{broker.id}", daemon=True)

    def start(self) -> HistoryReader:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(60)

    def _run(self) -> None:
        name = f"broker{self.broker.id}"
        while not self._stopping.wait(READER_INTERVAL_S):
            for partition in range(self.partitions):
                try:
                    answer = self._list_offsets(partition)
                    if answer.error_code != ErrorCode.none:
                        continue
                    self.history.record(
                        "hw", name, partition, offset=int(answer.offset),
                        leader_epoch=int(answer.leader_epoch),
                    )  # fmt: skip
                    fetched = fetch_records(
                        self.broker, self.topic, partition, self.positions[partition]
                    )
                except (NetworkError, OdradekError, OSError):
                    continue
                if fetched.error != ErrorCode.none:
                    # A leader whose log was truncated under the reader: start again.
                    if fetched.error == ErrorCode.offset_out_of_range:
                        self.positions[partition] = 0
                    continue
                for record in fetched.records:
                    self.history.record(
                        "read", f"reader-{name}", partition,
                        value=(record.value or b"").decode(errors="replace"), offset=record.offset,
                    )  # fmt: skip
                    self.positions[partition] = record.offset + 1
            for partition in range(self.lso_partitions):
                try:
                    answer = self._list_offsets(partition, self.lso_topic, isolation_level=1)
                except (NetworkError, OdradekError, OSError):
                    continue
                if answer.error_code == ErrorCode.none:
                    self.history.record(
                        "lso", name, partition, offset=int(answer.offset),
                        leader_epoch=int(answer.leader_epoch),
                    )  # fmt: skip

    def _list_offsets(  # type: ignore[no-untyped-def]
        self, partition: int, topic: str | None = None, isolation_level: int = 0
    ):
        response = request(
            self.broker,
            ApiKey.LIST_OFFSETS,
            LIST_OFFSETS_VERSION,
            {
                "replica_id": CONSUMER_REPLICA_ID,
                "isolation_level": isolation_level,
                "topics": [
                    {
                        "name": topic or self.topic,
                        "partitions": [
                            {
                                "partition_index": partition,
                                "current_leader_epoch": -1,
                                "timestamp": LATEST_TIMESTAMP,
                            }
                        ],
                    }
                ],
            },
        )
        return response.topics[0].partitions[0]


def wait_converged(lab: LabCluster, topic: str, timeout: float) -> dict[int, PartitionState]:
    live = set(lab.cluster.broker_ids)
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            states = read_partition_states(lab.cluster.zookeeper_connect, topic, PARTITIONS)
            registered = set(lab.cluster.registered_brokers())
        except OperatorError as e:
            last = e
        else:
            last = states
            if (
                all(
                    s.leader in live & registered and sorted(s.isr) == sorted(s.replicas)
                    for s in states.values()
                )
                and live <= registered
            ):
                return states
        time.sleep(0.5)
    raise AssertionError(f"the cluster did not converge in {timeout:g}s: {last}")


def read_final(lab: LabCluster, topic: str, partition: int, timeout: float = 60.0) -> FetchAnswer:
    """Everything committed in `partition`, read from its leader. Leadership may still move after
    the cluster converged (the auto-rebalance task hands partitions back to their preferred
    leaders), so a NOT_LEADER answer re-reads the partition state and asks the new leader."""
    deadline = time.monotonic() + timeout
    while True:
        state = read_partition_states(lab.cluster.zookeeper_connect, topic, PARTITIONS)[partition]
        answer = read_committed(lab.cluster.broker(state.leader), topic, partition)
        if answer.error == ErrorCode.none:
            return answer
        if answer.error not in _LEADER_MOVED or time.monotonic() > deadline:
            raise AssertionError(f"final read of partition {partition}: {answer.error!r}")
        time.sleep(0.5)


_LEADER_MOVED = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)


def wait_replicas_agree(
    lab: LabCluster, topic: str, states: dict[int, PartitionState], timeout: float = 60.0
) -> CheckResult:
    """Every replica's files byte-identical below the leader's HW (followers fetch what they
    lack after a heal; a replica that diverged would never agree)."""
    deadline = time.monotonic() + timeout
    while True:
        high_watermarks = {}
        with contextlib.suppress(OperatorError):  # leadership may move on (auto-rebalance)
            states = read_partition_states(lab.cluster.zookeeper_connect, topic, PARTITIONS)
        for partition, state in states.items():
            try:
                answer = read_committed(lab.cluster.broker(state.leader), topic, partition)
            except (NetworkError, OdradekError):
                answer = None
            high_watermarks[partition] = answer.high_watermark if answer else 0
        batches = {
            p: {b: replica_batches(lab.cluster.broker(b), topic, p) for b in s.replicas}
            for p, s in states.items()
        }
        result = replicas_agree_below_high_watermark(batches, high_watermarks)
        if result.passed or time.monotonic() >= deadline:
            return result
        time.sleep(0.5)


def log_excerpt(lab: LabCluster, topic: str, lines: int = 40) -> str:
    """What each broker logged about `topic`, its ZooKeeper session and the controller: the
    lines a failed scenario is diagnosed from (CI keeps only the end of the output)."""
    words = (topic, "session", "controller", "fenced", "brokers changed", "ISR")
    parts = []
    for broker in lab.cluster.brokers:
        try:
            text = broker.log.read_text(errors="replace").splitlines()
        except OSError as e:
            parts.append(f"----- broker {broker.id}: {e}")
            continue
        kept = [line for line in text if any(w in line for w in words)][-lines:]
        parts.append(f"----- broker {broker.id} ({broker.log}):\n" + "\n".join(kept))
    return "\n".join(parts)


def run_scenario(
    lab: LabCluster,
    name: str,
    fault: Callable[[ScenarioContext], None],
    seed: int,
    summary: list[str],
    producers: int = 2,
) -> list[CheckResult]:
    topic = f"{name[:40]}-{seed % 100000}"
    try:
        return _scenario(lab, name, topic, fault, seed, summary, producers)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{log_excerpt(lab, topic)}") from None


def _scenario(
    lab: LabCluster,
    name: str,
    topic: str,
    fault: Callable[[ScenarioContext], None],
    seed: int,
    summary: list[str],
    producers: int,
) -> list[CheckResult]:
    assignment = [[(p + i) % 3 + 1 for i in range(3)] for p in range(PARTITIONS)]
    txn_topic = f"{topic}-txn"
    for each_topic in (topic, txn_topic):
        create_topic(
            lab.cluster,
            each_topic,
            assignment,
            {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"},
        )
    history = History(idempotent=False, transactional=True)
    context = ScenarioContext(lab, topic, random.Random(seed), history)
    workload = ProducerWorkload(
        lab.cluster.bootstrap_servers, topic, PARTITIONS, producers, interval_s=0.02,
        history=history, message_timeout_ms=60_000,
    ).start()  # fmt: skip
    bootstrap = lab.cluster.bootstrap_servers
    writer = TransactionalWriter(bootstrap, txn_topic, PARTITIONS, history, seed).start()
    txn_reader = CommittedReader(bootstrap, txn_topic, PARTITIONS, history).start()
    readers = [
        HistoryReader(b, topic, history, lso_topic=txn_topic, lso_partitions=PARTITIONS).start()
        for b in lab.cluster.brokers
    ]
    started = time.monotonic()
    try:
        time.sleep(WARM_UP_S)
        fault(context)
    except BaseException:
        # Everything this scenario started stops, and the brokers it left dead run again, so
        # that the next scenario on the shared cluster (or a soak's next round) starts whole.
        writer.abandon()
        workload.abandon()
        txn_reader.stop()
        for reader in readers:
            reader.stop()
        history.dump(lab.directory / f"history-{name}-{seed}.jsonl")
        with contextlib.suppress(Exception):
            lab.heal()
            restart_stopped_brokers(lab, wait_s=90)
        raise
    finally:
        lab.heal()
        # Nothing the faults paused stays paused while the cluster must converge (a soak round
        # once failed to converge with a broker that resumed only after the round).
        for broker in lab.cluster.broker_ids:
            if lab.cluster.process_state(broker) is ProcessState.STOPPED:
                lab.cluster.cont(broker)
    try:
        states = wait_converged(lab, topic, CONVERGE_TIMEOUT_S)
        time.sleep(1.0)  # a little writing on the healed cluster
    finally:
        stats = workload.stop(timeout=120)
        writer.stop()
        txn_reader.stop()
        for reader in readers:
            reader.stop()
    states = wait_converged(lab, topic, CONVERGE_TIMEOUT_S)
    agreement = wait_replicas_agree(lab, topic, states)
    for partition in states:
        answer = read_final(lab, topic, partition)
        record_final(
            history,
            partition,
            ((r.offset, (r.value or b"").decode(errors="replace")) for r in answer.records),
        )
    lso_check = read_final_committed(bootstrap, txn_topic, PARTITIONS, history)
    results = [*check_history(history), agreement, lso_check]
    errors = [s.error for s in stats if s.error]
    errors += [f"transactional {e}" for e in (writer.error, txn_reader.error) if e]
    outcomes = writer.outcomes()
    failures: dict[str, int] = {}
    for s in stats:
        for kind, n in s.failures.items():
            failures[kind] = failures.get(kind, 0) + n
    line = (
        f"{name}: seed {seed}, {time.monotonic() - started:.0f}s, "
        f"{history.count('send')} sent, {history.count('ack')} acknowledged, "
        f"{history.count('read')} read during the fault run, failed {failures or 'none'}; "
        f"transactions {dict(sorted(outcomes.items()))}, "
        f"{history.count('txn_read')} read_committed reads; "
        + "; ".join(context.notes)
        + "; checks: "
        + ", ".join(f"{r.name} {'ok' if r.passed else 'VIOLATED'}" for r in results)
    )
    summary.append(line)
    if errors or not all(r.passed for r in results):
        dump = lab.directory / f"history-{name}-{seed}.jsonl"
        history.dump(dump)
        raise AssertionError(
            f"{line}\nproducer errors: {errors}\n"
            + "\n".join(r.describe() for r in results)
            + f"\nhistory: {dump}"
        )
    return results
