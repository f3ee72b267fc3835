"""What runs against the cluster while faults are injected: real producers, and an observer that
records who leads what and who controls the cluster.

* `ProducerWorkload`: several confluent-kafka producers, each in its own thread, writing unique
  values `f"{producer}-{seq}"` (seq 0, 1, 2, ...) round-robin over the topic's partitions with
  acks=all, retries on, idempotence off and one request in flight per connection; plus
  `idempotent` producers (`i0`, `i1`, ...) with enable.idempotence=true and librdkafka's default of
  five requests in flight, whose committed values the checker `idempotent_writes_once` reads
  (given `client_log`, their librdkafka `eos` debug lines go to that file). Every delivery report is kept, with the highest offset the producer had
  seen acknowledged in that partition when it handed the record to the client (its "floor").
  Continuously checked: a record acknowledged at or below its floor (Kafka orders what a producer
  sends after an acknowledgement behind it; a broker that lost an acknowledged record and handed
  its offset out again shows up here first). Messages still unreported after the final flush
  (longer than message.timeout.ms) are explained from librdkafka's statistics; if the client never
  handed them to a connection (`client_stall`), a fresh producer writes to their partitions, and
  only if that fails do they count against `producers_finished`.
* `ClusterObserver`: a thread with its own event loop that, about every 200 ms, reads
  `/controller_epoch`, `/controller` and the topic's partition state znodes from ZooKeeper, and
  asks every broker (over its own short-timeout connection, so a frozen broker only delays its
  own answer) for Metadata. Each (partition, leader epoch, leader) it sees goes to a
  `LeaderEpochHistory`, each controller epoch to a `ControllerEpochHistory` (see `checker`).
* `read_partition_states`: the topic's assignment and partition states in one ZooKeeper session.

Concurrency: producers and the observer run in their own threads and touch only their own
objects; what they record is read by the test thread through methods that take their locks.
Neither uses `LocalCluster`, which belongs to the test thread.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import Message, Producer

from odradek.errors import NetworkError, OdradekError, OperatorError
from odradek.network.client import BrokerConnection
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class
from odradek.zk.client import ZkClient
from odradek.zk.errors import NoNodeError, SessionExpiredError, ZkError
from odradek.zk.znodes import (
    ControllerEpochZNode,
    ControllerZNode,
    TopicPartitionStateZNode,
    TopicZNode,
)
from tests.faults.checker import ControllerEpochHistory, LeaderEpochHistory
from tests.faults.history import History
from tests.fixtures.threads import thread_stack
from tests.integration._replication import producer_config

log = logging.getLogger(__name__)

METADATA_VERSION = 12
OBSERVER_INTERVAL_S = 0.2
OBSERVER_REQUEST_TIMEOUT_S = 1.5
STATISTICS_INTERVAL_MS = 5000  # librdkafka statistics, kept to explain unfinished messages
STALL_PROBE_TIMEOUT_S = 60.0
ZK_TIMEOUT_S = 5.0


# ---------------------------------------------------------------------------------------------
# ZooKeeper reads


@dataclass(frozen=True)
class PartitionState:
    partition: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]


async def _read_partition_states(zk: ZkClient, topic: str, partitions: int) -> dict[int, Any]:
    data, stat = await zk.get(TopicZNode.path(topic))
    assignment = TopicZNode.decode(topic, data, stat.version)
    got = await asyncio.gather(
        *(zk.get(TopicPartitionStateZNode.path(topic, p)) for p in range(partitions)),
        return_exceptions=True,
    )
    states = {}
    for partition, result in enumerate(got):
        replicas = tuple(assignment.partitions[partition].replicas)
        if isinstance(result, NoNodeError):
            states[partition] = PartitionState(partition, -1, -1, (), replicas)
            continue
        if isinstance(result, BaseException):
            raise result
        state = TopicPartitionStateZNode.decode(result[0], result[1].version)
        states[partition] = PartitionState(
            partition, state.leader, state.leader_epoch, tuple(state.isr), replicas
        )
    return states


def read_partition_states(connect: str, topic: str, partitions: int) -> dict[int, PartitionState]:
    """The topic's partitions as ZooKeeper holds them; OperatorError if it cannot be read."""

    async def read() -> dict[int, PartitionState]:
        zk = ZkClient(connect, session_timeout_s=10.0, connection_loss_retry_s=ZK_TIMEOUT_S)
        await zk.start(timeout=ZK_TIMEOUT_S)
        try:
            return await _read_partition_states(zk, topic, partitions)
        finally:
            await zk.close()

    try:
        return asyncio.run(read())
    except ZkError as e:
        raise OperatorError(f"ZooKeeper: {e}") from None


# ---------------------------------------------------------------------------------------------
# Producers


@dataclass
class ProducerStats:
    """What one producer thread recorded; read through `ProducerWorkload` under its lock."""

    name: str
    sent: int = 0
    acknowledged: dict[int, dict[int, bytes]] = field(default_factory=dict)
    floors: dict[int, dict[int, int]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    failures_by_partition: dict[int, int] = field(default_factory=dict)
    highest_acked: dict[int, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    unfinished: int = 0
    error: str | None = None
    idempotent: bool = False
    persisted: dict[int, list[bytes]] = field(default_factory=dict)
    """Idempotent producers' records acknowledged without an offset, by partition."""
    unreported: dict[int, int] = field(default_factory=dict)
    """Records handed to the client and not yet reported on, by partition."""
    statistics: str = ""
    """librdkafka's latest statistics (JSON), read only to explain unfinished messages."""
    client_stall: str = ""
    """Set when the unfinished messages were stuck in the client itself (`client_stall`) and a
    fresh producer then wrote to every partition they wait for: what the statistics said."""


class ProducerWorkload:
    """`count` producers writing to `topic` until `stop()` (module docstring)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        count: int,
        interval_s: float = 0.01,
        max_queued: int = 2000,
        history: History | None = None,
        message_timeout_ms: int = 120_000,
        idempotent: int = 0,
        client_log: Path | None = None,
    ) -> None:
        self.history = history
        self.topic = topic
        self.partitions = partitions
        self.interval_s = interval_s
        self.max_queued = max_queued
        self._config = producer_config(
            bootstrap,
            "all",
            enable_idempotence=False,
            max_in_flight_requests_per_connection=1,
            linger_ms=5,
            message_timeout_ms=message_timeout_ms,
            request_timeout_ms=5000,
            socket_timeout_ms=10_000,
        )
        self._idempotent_config = producer_config(
            bootstrap,
            "all",
            enable_idempotence=True,
            linger_ms=5,
            message_timeout_ms=120_000,
            request_timeout_ms=5000,
            socket_timeout_ms=10_000,
        )
        if client_log is not None:
            # librdkafka's idempotence decisions (epoch bumps, drains, retries), so that a
            # duplicate `idempotent_writes_once` finds can be traced to what the client did.
            self._idempotent_config["debug"] = "eos"
            self._idempotent_config["logger"] = file_logger("faults.librdkafka", client_log)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._abandoning = threading.Event()
        self._stats = [ProducerStats(f"p{i}") for i in range(count)]
        self._stats += [ProducerStats(f"i{i}", idempotent=True) for i in range(idempotent)]
        self._threads = [
            threading.Thread(target=self._run, args=(s,), name=f"fault-{s.name}", daemon=True)
            for s in self._stats
        ]

    def start(self) -> ProducerWorkload:
        for thread in self._threads:
            thread.start()
        return self

    def _on_delivery(
        self,
        stats: ProducerStats,
        floor: int,
        error: ConfluentKafkaError | None,
        message: Message,
    ) -> None:
        if self.history is not None:
            value_text = (message.value() or b"").decode(errors="replace")
            if error is not None:
                self.history.record(
                    "fail", stats.name, message.partition() or 0, value=value_text,
                    error=error.name(),
                )  # fmt: skip
            else:
                offset = message.offset()
                self.history.record(
                    "ack", stats.name, message.partition() or 0, value=value_text,
                    # None: librdkafka's implicit acknowledgement (idempotent producers only)
                    offset=offset if offset is not None and offset >= 0 else None,
                )  # fmt: skip
        with self._lock:
            reported = message.partition()
            if reported is not None:
                stats.unreported[reported] = stats.unreported.get(reported, 0) - 1
            if error is not None:
                stats.failures[error.name()] = stats.failures.get(error.name(), 0) + 1
                partition = message.partition()
                if partition is not None:
                    stats.failures_by_partition[partition] = (
                        stats.failures_by_partition.get(partition, 0) + 1
                    )
                return
            partition, offset, value = message.partition(), message.offset(), message.value()
            implicit = offset is None or offset < 0
            if stats.idempotent and implicit and partition is not None and value is not None:
                # librdkafka's implicit acknowledgement: a retried batch whose answer was lost is
                # known to be stored once a later batch of the producer is, but at an offset it
                # never learns. `idempotent_writes_once` checks that it is there.
                stats.persisted.setdefault(partition, []).append(value)
                return
            if partition is None or offset is None or value is None or offset < 0:
                stats.violations.append(f"{stats.name}: acknowledged without an offset: {value!r}")
                return
            stats.acknowledged.setdefault(partition, {})[offset] = value
            stats.floors.setdefault(partition, {})[offset] = floor
            if offset <= floor:
                stats.violations.append(
                    f"partition {partition}: {value.decode(errors='replace')} acknowledged at "
                    f"offset {offset}, though sent after offset {floor} was acknowledged"
                )
            stats.highest_acked[partition] = max(offset, stats.highest_acked.get(partition, -1))

    def _run(self, stats: ProducerStats) -> None:
        try:
            config = dict(self._idempotent_config if stats.idempotent else self._config)
            config["statistics.interval.ms"] = STATISTICS_INTERVAL_MS
            config["stats_cb"] = functools.partial(self._on_statistics, stats)
            producer = Producer(config)
            sequence = 0
            while not self._stopping.is_set():
                if len(producer) < self.max_queued:
                    partition = sequence % self.partitions
                    # Delivery callbacks run in this thread (inside poll), so the floor read
                    # here is exactly what had been acknowledged when the record was handed over.
                    with self._lock:
                        floor = stats.highest_acked.get(partition, -1)
                    try:
                        if self.history is not None:
                            self.history.record(
                                "send", stats.name, partition, value=f"{stats.name}-{sequence}"
                            )
                        producer.produce(
                            self.topic,
                            value=f"{stats.name}-{sequence}".encode(),
                            partition=partition,
                            on_delivery=functools.partial(self._on_delivery, stats, floor),
                        )
                        sequence += 1
                        with self._lock:
                            stats.unreported[partition] = stats.unreported.get(partition, 0) + 1
                    except BufferError:
                        pass
                producer.poll(self.interval_s)
            with self._lock:
                stats.sent = sequence
            if self._abandoning.is_set():
                producer.purge()
                unfinished = producer.flush(10)
            else:
                unfinished = producer.flush(180)
            with self._lock:
                stats.unfinished = unfinished
            if unfinished and not self._abandoning.is_set():
                self._probe_client_stall(stats)
        except BaseException as e:  # reported by stop(), in the test thread
            with self._lock:
                stats.error = repr(e)

    def _probe_client_stall(self, stats: ProducerStats) -> None:
        """After a flush longer than message.timeout.ms left messages unreported: if none of them
        was ever handed to a connection (`client_stall`), write one record to each of their
        partitions with a fresh producer. Delivered everywhere, the partitions were writable and
        the stall was the client's own; `stats.client_stall` then says what its statistics
        showed. Any doubt leaves the messages counted as unfinished."""
        with self._lock:
            waiting = sorted(p for p, n in stats.unreported.items() if n)
            stall = client_stall(stats, self.topic, waiting)
        if not stall:
            return
        probe_name = f"{stats.name}-probe"
        delivered: dict[int, int] = {}

        def on_delivery(error: ConfluentKafkaError | None, message: Message) -> None:
            partition, offset = message.partition(), message.offset()
            if error is None and partition is not None and offset is not None and offset >= 0:
                delivered[partition] = offset
                if self.history is not None:
                    value = (message.value() or b"").decode()
                    self.history.record("ack", probe_name, partition, value=value, offset=offset)

        probe = Producer(dict(self._config))
        for partition in waiting:
            value = f"{probe_name}-{partition}"
            if self.history is not None:
                self.history.record("send", probe_name, partition, value=value)
            probe.produce(self.topic, value=value.encode(), partition=partition,
                          on_delivery=on_delivery)  # fmt: skip
        probe.flush(STALL_PROBE_TIMEOUT_S)
        if sorted(delivered) == waiting:
            with self._lock:
                stats.client_stall = f"{stall}; a fresh producer wrote to {waiting}"

    def _on_statistics(self, stats: ProducerStats, statistics: str) -> None:
        with self._lock:
            stats.statistics = statistics

    @property
    def idempotent_producers(self) -> list[str]:
        return [s.name for s in self._stats if s.idempotent]

    def acknowledged_count(self) -> int:
        with self._lock:
            return sum(len(o) for s in self._stats for o in s.acknowledged.values())

    def violations(self) -> list[str]:
        with self._lock:
            return [v for s in self._stats for v in s.violations]

    def abandon(self) -> None:
        """Stop at once, dropping what is queued (the run has already failed)."""
        self._abandoning.set()
        self._stopping.set()
        for thread in self._threads:
            thread.join(30)

    def stop(self, timeout: float = 240.0) -> list[ProducerStats]:
        """Stop producing and wait for every delivery report; the stats of every producer."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            for thread, stats in zip(self._threads, self._stats, strict=True):
                if thread.is_alive():
                    stats.error = (
                        f"still running {timeout:g}s after stop(), at:\n{thread_stack(thread)}"
                    )
            return list(self._stats)


def _statistics(stats: ProducerStats) -> dict[str, Any]:
    try:
        decoded = json.loads(stats.statistics) if stats.statistics else {}
    except ValueError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _handles(statistics: dict[str, Any], node: int) -> str:
    """Every broker handle librdkafka has for `node` (a decommissioned one may linger beside
    its successor): name and state."""
    found = [
        f"{name} {b.get('state')}"
        for name, b in statistics.get("brokers", {}).items()
        if b.get("nodeid") == node
    ]
    return ", ".join(found) or "none"


def unfinished_report(stats: ProducerStats, topic: str) -> str:
    """One line on where a producer's unreported messages wait: by partition, what librdkafka's
    last statistics say of that partition (its leader, the broker handle it is delegated to,
    queued, in flight), of the leader's connection (state, requests waiting to be sent and for
    an answer) and of every handle of those brokers."""
    waiting = {p: n for p, n in sorted(stats.unreported.items()) if n}
    parts = [f"unreported by partition {waiting}"]
    statistics = _statistics(stats)
    brokers = {b.get("nodeid"): b for b in statistics.get("brokers", {}).values()}
    partitions = statistics.get("topics", {}).get(topic, {}).get("partitions", {})
    for partition in waiting:
        state = partitions.get(str(partition))
        if state is None:
            continue
        leader = state.get("leader", -1)
        delegated = state.get("broker", -1)
        broker = brokers.get(leader, {})
        parts.append(
            f"p{partition}: leader {leader} delegated to {delegated} "
            f"msgq {state.get('msgq_cnt')} "
            f"xmit {state.get('xmit_msgq_cnt')} inflight {state.get('msgs_inflight')}; "
            f"broker {leader} {broker.get('state')} outbuf {broker.get('outbuf_cnt')} "
            f"waitresp {broker.get('waitresp_cnt')} req_timeouts {broker.get('req_timeouts')}; "
            f"handles of {leader}: {_handles(statistics, leader)}"
        )
    if statistics:
        parts.append(f"statistics of {statistics.get('age', 0) / 1e6:.0f}s into the client")
    return "; ".join(parts)


def client_stall(stats: ProducerStats, topic: str, waiting: Sequence[int]) -> str:
    """Why `waiting`'s messages are stuck in the client itself, or "" if the statistics do not
    show that. Called after a flush longer than message.timeout.ms: librdkafka reports every
    message by then (delivered, or failed with _MSG_TIMED_OUT) whatever the brokers do, unless
    a partition is left where no broker thread serves it -- the timeout scan runs only in the
    thread it is delegated to. A stall is: for every waiting partition, nothing in the
    transmit queue or in flight (never handed to a connection), and the partition delegated to
    no broker handle, or to one that is not connected. Seen twice in CI (seeds 1492317846 and
    909483234), both after broker restarts, with the leader's handle idle in INIT."""
    statistics = _statistics(stats)
    partitions = statistics.get("topics", {}).get(topic, {}).get("partitions", {})
    handles = statistics.get("brokers", {}).values()
    seen = []
    for partition in waiting:
        state = partitions.get(str(partition))
        if state is None or state.get("xmit_msgq_cnt") or state.get("msgs_inflight"):
            return ""
        delegated = state.get("broker", -1)
        if any(b.get("nodeid") == delegated and b.get("state") == "UP" for b in handles):
            return ""
        seen.append(
            f"p{partition}: {state.get('msgq_cnt')} queued, delegated to {delegated}, "
            f"leader {state.get('leader')} (handles: {_handles(statistics, state.get('leader'))})"
        )
    return "client stall: " + "; ".join(seen) if seen else ""


class _NeverRaisingLogger(logging.Logger):
    """A logger for librdkafka's `logger` setting whose `log` never raises: confluent-kafka does
    not clear an exception raised by one call, and every later call then fails with SystemError
    (confluent-kafka-python #1708); soak run 13's transactional writer died of that."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        try:
            super().log(level, msg, *args, **kwargs)
        except Exception:  # a lost client log line, never a failed client
            pass


def file_logger(name: str, path: Path) -> logging.Logger:
    """A logger writing to `path` alone, for a librdkafka client's `logger` setting."""
    logger = _NeverRaisingLogger(f"{name}.{path}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    return logger


def merge_acknowledged(stats: Sequence[ProducerStats]) -> dict[int, dict[int, bytes]]:
    """partition -> {offset: value} over every producer; two producers acknowledged at the same
    offset is itself a violation, reported by `duplicate_acknowledgements`."""
    merged: dict[int, dict[int, bytes]] = {}
    for s in stats:
        for partition, acked in s.acknowledged.items():
            merged.setdefault(partition, {}).update(acked)
    return merged


def merge_floors(stats: Sequence[ProducerStats]) -> dict[int, dict[int, int]]:
    """partition -> {offset: floor} of every acknowledged record (see the module docstring)."""
    merged: dict[int, dict[int, int]] = {}
    for s in stats:
        for partition, floors in s.floors.items():
            merged.setdefault(partition, {}).update(floors)
    return merged


def merge_persisted(stats: Sequence[ProducerStats]) -> dict[int, list[bytes]]:
    """partition -> values acknowledged without an offset (idempotent producers only)."""
    merged: dict[int, list[bytes]] = {}
    for s in stats:
        for partition, values in s.persisted.items():
            merged.setdefault(partition, []).extend(values)
    return merged


def duplicate_acknowledgements(stats: Sequence[ProducerStats]) -> list[str]:
    seen: dict[tuple[int, int], bytes] = {}
    duplicates = []
    for s in stats:
        for partition, acked in s.acknowledged.items():
            for offset, value in acked.items():
                other = seen.setdefault((partition, offset), value)
                if other != value:
                    duplicates.append(
                        f"partition {partition} offset {offset} acknowledged for both "
                        f"{other!r} and {value!r}"
                    )
    return duplicates


# ---------------------------------------------------------------------------------------------
# The observer


@dataclass(frozen=True)
class Endpoint:
    broker_id: int
    host: str
    port: int


class ClusterObserver:
    """Polls ZooKeeper and every broker's Metadata into the histories (module docstring)."""

    def __init__(
        self,
        connect: str,
        endpoints: Sequence[Endpoint],
        topic: str,
        partitions: int,
        leaders: LeaderEpochHistory,
        controllers: ControllerEpochHistory,
        interval_s: float = OBSERVER_INTERVAL_S,
    ) -> None:
        self.connect = connect
        self.endpoints = list(endpoints)
        self.topic = topic
        self.partitions = partitions
        self.leaders = leaders
        self.controllers = controllers
        self.interval_s = interval_s
        self.zk_polls = 0
        self.metadata_answers = 0
        self.errors = 0
        # partition -> when ZooKeeper was first seen holding no leader for it (while it lasts),
        # and the longest such stretch seen so far, in seconds.
        self._leaderless_since: dict[int, float] = {}
        self.longest_leaderless: dict[int, float] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, name="observer", daemon=True)

    def start(self) -> ClusterObserver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(30)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:  # the observer must never take the run down; its absence shows
            log.exception("the cluster observer stopped")

    async def _main(self) -> None:
        zk: ZkClient | None = None
        try:
            while not self._stopping.is_set():
                if zk is None:
                    zk = await self._connect()
                results = await asyncio.gather(
                    self._poll_zookeeper(zk) if zk is not None else asyncio.sleep(0),
                    *(self._poll_metadata(e) for e in self.endpoints),
                    return_exceptions=True,
                )
                if isinstance(results[0], SessionExpiredError) and zk is not None:
                    await zk.close()
                    zk = None
                self.errors += sum(isinstance(r, BaseException) for r in results)
                await asyncio.sleep(self.interval_s)
        finally:
            if zk is not None:
                await zk.close()

    async def _connect(self) -> ZkClient | None:
        zk = ZkClient(self.connect, session_timeout_s=10.0, connection_loss_retry_s=1.0)
        try:
            await zk.start(timeout=ZK_TIMEOUT_S)
        except (OperatorError, ZkError):
            self.errors += 1
            await zk.close()
            return None
        return zk

    async def _poll_zookeeper(self, zk: ZkClient) -> None:
        got: list[tuple[bytes, Any] | BaseException] = await asyncio.gather(
            zk.get(ControllerEpochZNode.path()),
            zk.get(ControllerZNode.path()),
            return_exceptions=True,
        )
        epoch_got, controller_got = got
        if not isinstance(epoch_got, BaseException):
            epoch = ControllerEpochZNode.decode(epoch_got[0], epoch_got[1].version).epoch
            self.controllers.observe_epoch(epoch)
            # /controller is created in the transaction that bumps the epoch: same zxid.
            if not isinstance(controller_got, BaseException) and (
                controller_got[1].czxid == epoch_got[1].mzxid
            ):
                holder = ControllerZNode.decode(controller_got[0], controller_got[1].version)
                self.controllers.observe_holder(epoch, holder.broker_id, "/controller")
        states = await _read_partition_states(zk, self.topic, self.partitions)
        now = time.monotonic()
        for partition, state in states.items():
            self.leaders.observe(partition, state.leader_epoch, state.leader, "ZooKeeper")
            if state.leader < 0:
                since = self._leaderless_since.setdefault(partition, now)
                longest = self.longest_leaderless.get(partition, 0.0)
                self.longest_leaderless[partition] = max(longest, now - since)
            else:
                self._leaderless_since.pop(partition, None)
        self.zk_polls += 1

    async def _poll_metadata(self, endpoint: Endpoint) -> None:
        request = build(
            request_class(ApiKey.METADATA, METADATA_VERSION),
            {
                "topics": [{"name": self.topic, "topic_id": None}],
                "allow_auto_topic_creation": False,
            },
        )
        try:
            connection = await BrokerConnection.connect(
                endpoint.host,
                endpoint.port,
                timeout=OBSERVER_REQUEST_TIMEOUT_S,
                client_id="observer",
            )
        except NetworkError:
            return  # down: nothing to observe
        try:
            response = await connection.send(
                ApiKey.METADATA, METADATA_VERSION, request, timeout=OBSERVER_REQUEST_TIMEOUT_S
            )
        except (NetworkError, OdradekError):
            return  # frozen or shutting down
        finally:
            connection.close()
        self.metadata_answers += 1
        source = f"broker {endpoint.broker_id} Metadata"
        for entry in response.topics:
            if entry.name != self.topic:
                continue
            for p in entry.partitions:
                self.leaders.observe(
                    int(p.partition_index), int(p.leader_epoch), int(p.leader_id), source
                )
