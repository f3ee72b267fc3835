"""Shared helpers of the replication integration tests (3-broker clusters, real clients).

Four kinds of helpers, each answering one question a replication test asks:

* **What does one broker say?** `broker_metadata`, `latest_offset`, `fetch_records`,
  `produce_raw`: one request to exactly one broker over the project's own `BrokerConnection`, with
  no metadata refresh and no retries, so a test sees that broker's answer (NOT_LEADER_OR_FOLLOWER
  from a follower or a zombie leader, NOT_ENOUGH_REPLICAS from a leader whose ISR is too small)
  instead of a client library hiding it behind a retry.
* **What does ZooKeeper hold?** `zk_partition_state`: the partition state znode, decoded.
* **What is on disk?** `replica_batches`, `replica_records`: a replica's `.log` segment files
  read straight from its data directory (`<data_dir>/<topic>-<partition>/<base offset>.log`, the
  batches exactly as stored: see `odradek.protocol.record_batch`). Comparing these bytes across
  replicas is the strongest check there is that replication copies batches unchanged and that
  truncation left no divergent suffix. The files of a running broker may end in a half-written
  batch; `iter_batches` stops before it.
* **What did a real client get acknowledged?** `AckedProducer` (confluent-kafka, librdkafka) and
  `StreamingProducer` (the same, producing from a thread while a test injects faults) record every
  delivery report, so that "no acknowledged record is lost" can be checked offset by offset.

Every request helper opens its own connection and event loop (`asyncio.run`): tests are
synchronous, and a fresh connection per question cannot carry stale state from one to the next.
Time limits are deadlines (`wait_until`), never fixed sleeps.

Concurrency: module functions are called from the test's thread; `StreamingProducer` runs its
producer in one background thread and guards what it records with a lock.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from odradek.log.naming import log_dir_name, parse_segment_file_name
from odradek.network.client import BrokerConnection
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class
from odradek.protocol.record_batch import Record, build_batch, decode_records, iter_batches
from odradek.testing import LocalBroker, LocalCluster
from odradek.zk.client import ZkClient
from odradek.zk.znodes import LeaderIsrAndControllerEpoch, TopicPartitionStateZNode
from tests.fixtures.cluster import wait_until

log = logging.getLogger(__name__)

PRODUCE_VERSION = 9
FETCH_VERSION = 12
LIST_OFFSETS_VERSION = 6
METADATA_VERSION = 12
LATEST_TIMESTAMP = -1
CONSUMER_REPLICA_ID = -1
REQUEST_TIMEOUT_S = 15.0
ZK_TIMEOUT_S = 10.0


def unique_topic(prefix: str) -> str:
    """A topic name no other test of the session uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------
# One request to one broker


async def _request(
    broker: LocalBroker, api_key: ApiKey, version: int, values: dict[str, Any]
) -> Any:
    connection = await BrokerConnection.connect(
        broker.host, broker.port, timeout=REQUEST_TIMEOUT_S, client_id="replication-test"
    )
    try:
        message = build(request_class(api_key, version), values)
        return await connection.send(api_key, version, message, timeout=REQUEST_TIMEOUT_S)
    finally:
        connection.close()


def request(broker: LocalBroker, api_key: ApiKey, version: int, values: dict[str, Any]) -> Any:
    """Send one request to `broker` on a fresh connection and return the decoded response.

    Raises `odradek.errors.NetworkError` if the broker cannot be reached or does not answer in
    time (a broker paused with SIGSTOP accepts the connection but never answers).
    """
    return asyncio.run(_request(broker, api_key, version, values))


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition as one broker's Metadata response shows it."""

    error: ErrorCode
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def broker_metadata(broker: LocalBroker, topic: str) -> dict[int, PartitionView]:
    """Partition -> view of `topic` in `broker`'s metadata cache ({} if it does not know it)."""
    response = request(
        broker,
        ApiKey.METADATA,
        METADATA_VERSION,
        {"topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": False},
    )
    views: dict[int, PartitionView] = {}
    for entry in response.topics:
        if entry.name != topic or entry.error_code != ErrorCode.none:
            continue
        for p in entry.partitions:
            views[int(p.partition_index)] = PartitionView(
                error=p.error_code,
                leader=int(p.leader_id),
                leader_epoch=int(p.leader_epoch),
                replicas=tuple(int(r) for r in p.replica_nodes),
                isr=tuple(int(r) for r in p.isr_nodes),
            )
    return views


def metadata_of_brokers(
    cluster: LocalCluster, topic: str, partition: int, broker_ids: Iterable[int]
) -> dict[int, PartitionView | None]:
    """What each of `broker_ids` says about one partition (None: it does not know the partition)."""
    return {
        broker_id: broker_metadata(cluster.broker(broker_id), topic).get(partition)
        for broker_id in broker_ids
    }


def wait_for_metadata(
    cluster: LocalCluster,
    topic: str,
    partition: int,
    broker_ids: Iterable[int],
    predicate: Callable[[PartitionView], bool],
    timeout: float,
    what: str,
) -> dict[int, PartitionView]:
    """Wait until every broker of `broker_ids` shows the partition satisfying `predicate`."""
    ids = list(broker_ids)

    def check() -> dict[int, PartitionView] | None:
        views = metadata_of_brokers(cluster, topic, partition, ids)
        if all(v is not None and predicate(v) for v in views.values()):
            return {b: v for b, v in views.items() if v is not None}
        return None

    found = wait_until(check, timeout, f"{what} in the metadata of brokers {ids}")
    assert found is not None
    return found


@dataclass(frozen=True, slots=True)
class ProduceAnswer:
    error: ErrorCode
    base_offset: int
    error_message: str | None = None


def encode_values(values: Sequence[bytes]) -> bytes:
    """One uncompressed v2 batch of records with these values (keys null, no headers)."""
    now_ms = int(time.time() * 1000)
    return build_batch([(None, value, [], now_ms) for value in values])


def produce_raw(
    broker: LocalBroker,
    topic: str,
    partition: int,
    values: Sequence[bytes],
    acks: int,
    timeout_ms: int = 5000,
) -> ProduceAnswer:
    """A hand-built Produce request of one batch, sent to `broker` only (no metadata lookup, no
    retry): the answer is exactly what that broker decided."""
    response = request(
        broker,
        ApiKey.PRODUCE,
        PRODUCE_VERSION,
        {
            "transactional_id": None,
            "acks": acks,
            "timeout": datetime.timedelta(milliseconds=timeout_ms),
            "topic_data": [
                {
                    "name": topic,
                    "partition_data": [{"index": partition, "records": encode_values(values)}],
                }
            ],
        },
    )
    answer = response.responses[0].partition_responses[0]
    return ProduceAnswer(answer.error_code, int(answer.base_offset), answer.error_message)


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    error: ErrorCode
    high_watermark: int
    records: list[Record]


def fetch_records(
    broker: LocalBroker,
    topic: str,
    partition: int,
    offset: int,
    max_bytes: int = 1 << 20,
    max_wait_ms: int = 0,
) -> FetchAnswer:
    """A consumer's Fetch (replica id -1, so reads stop at the HW) sent to `broker` only; the
    records of the returned batches at or after `offset`, and the HW of the same response."""
    response = request(
        broker,
        ApiKey.FETCH,
        FETCH_VERSION,
        {
            "cluster_id": None,
            "replica_id": CONSUMER_REPLICA_ID,
            "max_wait": datetime.timedelta(milliseconds=max_wait_ms),
            "min_bytes": 1,
            "max_bytes": max_bytes,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": partition,
                            "current_leader_epoch": -1,
                            "fetch_offset": offset,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": max_bytes,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": (),
            "rack_id": "",
        },
    )
    data = response.responses[0].partitions[0]
    records: list[Record] = []
    raw = data.records or b""
    for header in iter_batches(raw):
        batch = raw[header.position : header.position + header.size]
        records.extend(r for r in decode_records(batch) if r.offset >= offset)
    return FetchAnswer(data.error_code, int(data.high_watermark), records)


def read_committed(broker: LocalBroker, topic: str, partition: int) -> FetchAnswer:
    """Every record a consumer can read from `broker` (from offset 0 up to the HW), fetched in
    as many requests as it takes; the HW is that of the last response."""
    records: list[Record] = []
    offset = 0
    while True:
        answer = fetch_records(broker, topic, partition, offset)
        if answer.error != ErrorCode.none:
            return FetchAnswer(answer.error, answer.high_watermark, records)
        records.extend(answer.records)
        if not answer.records or answer.records[-1].offset + 1 >= answer.high_watermark:
            return FetchAnswer(answer.error, answer.high_watermark, records)
        offset = answer.records[-1].offset + 1


def latest_offset(broker: LocalBroker, topic: str, partition: int) -> tuple[ErrorCode, int]:
    """ListOffsets(latest) as a consumer sends it to `broker`: the HW, if it leads."""
    response = request(
        broker,
        ApiKey.LIST_OFFSETS,
        LIST_OFFSETS_VERSION,
        {
            "replica_id": CONSUMER_REPLICA_ID,
            "isolation_level": 0,
            "topics": [
                {
                    "name": topic,
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
    answer = response.topics[0].partitions[0]
    return answer.error_code, int(answer.offset)


# ---------------------------------------------------------------------------------------------
# ZooKeeper


def zk_partition_state(
    cluster: LocalCluster, topic: str, partition: int
) -> LeaderIsrAndControllerEpoch:
    """The partition state znode (`/brokers/topics/<t>/partitions/<p>/state`), decoded."""

    async def read() -> LeaderIsrAndControllerEpoch:
        zk = ZkClient(cluster.zookeeper_connect, session_timeout_s=ZK_TIMEOUT_S)
        await zk.start(timeout=ZK_TIMEOUT_S)
        try:
            data, stat = await zk.get(TopicPartitionStateZNode.path(topic, partition))
        finally:
            await zk.close()
        return TopicPartitionStateZNode.decode(data, stat.version)

    return asyncio.run(read())


def rewrite_partition_state(cluster: LocalCluster, topic: str, partition: int) -> int:
    """Write the partition state znode back unchanged, conditionally on its version; returns
    the new version.

    This is what a leader sees when the controller has changed the partition's state and its
    LeaderAndIsr has not reached the leader yet: the content may look the same, but the version
    the leader holds is stale, so the leader's next conditional ISR write is rejected.
    """

    async def rewrite() -> int:
        zk = ZkClient(cluster.zookeeper_connect, session_timeout_s=ZK_TIMEOUT_S)
        await zk.start(timeout=ZK_TIMEOUT_S)
        try:
            path = TopicPartitionStateZNode.path(topic, partition)
            data, stat = await zk.get(path)
            return int((await zk.set(path, data, version=stat.version)).version)
        finally:
            await zk.close()

    return asyncio.run(rewrite())


def wait_for_isr(
    cluster: LocalCluster, topic: str, partition: int, isr: Iterable[int], timeout: float
) -> LeaderIsrAndControllerEpoch:
    """Wait until ZooKeeper's partition state holds exactly the ISR `isr` (in any order)."""
    expected = sorted(isr)

    def check() -> LeaderIsrAndControllerEpoch | None:
        state = zk_partition_state(cluster, topic, partition)
        return state if sorted(state.isr) == expected else None

    return wait_until(
        check, timeout, f"the ISR of {topic}-{partition} to be {expected} in ZooKeeper"
    )


def wait_for_zk_leader(
    cluster: LocalCluster,
    topic: str,
    partition: int,
    predicate: Callable[[LeaderIsrAndControllerEpoch], bool],
    timeout: float,
    what: str,
) -> LeaderIsrAndControllerEpoch:
    def check() -> LeaderIsrAndControllerEpoch | None:
        state = zk_partition_state(cluster, topic, partition)
        return state if predicate(state) else None

    return wait_until(check, timeout, what)


# ---------------------------------------------------------------------------------------------
# Log files on disk


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One batch as a replica stores it, with the header fields the tests compare."""

    base_offset: int
    last_offset: int
    partition_leader_epoch: int
    data: bytes


def partition_dir(broker: LocalBroker, topic: str, partition: int) -> Path:
    return broker.data_dir / log_dir_name(topic, partition)


def replica_batches(broker: LocalBroker, topic: str, partition: int) -> list[StoredBatch]:
    """Every complete batch in the replica's segment files, in offset order.

    Segments are read in base-offset order (their names); a torn tail (a running broker's
    half-written append) is left out by `iter_batches`. [] if the replica has no directory.
    """
    directory = partition_dir(broker, topic, partition)
    segments: list[tuple[int, Path]] = []
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return []
    for entry in entries:
        parsed = parse_segment_file_name(entry.name)
        if parsed is not None and parsed[1] == ".log":
            segments.append((parsed[0], entry))
    batches: list[StoredBatch] = []
    for _, path in sorted(segments):
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # deleted by retention or truncation while we listed
            continue
        for header in iter_batches(data):
            batches.append(
                StoredBatch(
                    base_offset=header.base_offset,
                    last_offset=header.last_offset,
                    partition_leader_epoch=header.partition_leader_epoch,
                    data=bytes(data[header.position : header.position + header.size]),
                )
            )
    return batches


def batches_below(batches: Sequence[StoredBatch], end_offset: int) -> list[StoredBatch]:
    """The batches that lie wholly below `end_offset` (the committed part, for end = the HW)."""
    return [b for b in batches if b.last_offset < end_offset]


def records_of(batches: Sequence[StoredBatch]) -> list[Record]:
    return [record for batch in batches for record in decode_records(batch.data)]


def replica_records(broker: LocalBroker, topic: str, partition: int) -> list[Record]:
    """The decoded records of a replica's log files, in offset order."""
    return records_of(replica_batches(broker, topic, partition))


def log_end_offset(batches: Sequence[StoredBatch]) -> int:
    return batches[-1].last_offset + 1 if batches else 0


def describe_difference(
    cluster: LocalCluster, broker_ids: Sequence[int], topic: str, partition: int
) -> str:
    """A short account of how the replicas' files differ, for assertion messages."""
    lines = []
    for broker_id in broker_ids:
        batches = replica_batches(cluster.broker(broker_id), topic, partition)
        summary = [(b.base_offset, b.last_offset, b.partition_leader_epoch) for b in batches]
        lines.append(f"broker {broker_id}: LEO {log_end_offset(batches)}, batches {summary[-8:]}")
    return "\n".join(lines)


def replicas_identical(
    cluster: LocalCluster,
    broker_ids: Sequence[int],
    topic: str,
    partition: int,
    end_offset: int | None = None,
) -> list[StoredBatch] | None:
    """The common batches if every replica's files hold byte-identical batches (below
    `end_offset` when given, else all of them), None if they differ."""
    views = [
        replica_batches(cluster.broker(broker_id), topic, partition) for broker_id in broker_ids
    ]
    if end_offset is not None:
        views = [batches_below(v, end_offset) for v in views]
    first = views[0]
    if all(v == first for v in views[1:]):
        return first
    return None


def wait_for_identical_replicas(
    cluster: LocalCluster,
    broker_ids: Sequence[int],
    topic: str,
    partition: int,
    timeout: float,
    end_offset: int | None = None,
    min_end_offset: int = 0,
) -> list[StoredBatch]:
    """Wait until the replicas' files are byte-identical (and reach `min_end_offset`)."""

    def check() -> list[StoredBatch] | None:
        common = replicas_identical(cluster, broker_ids, topic, partition, end_offset)
        if common is None or log_end_offset(common) < min_end_offset:
            return None
        return common or None

    try:
        common = wait_until(check, timeout, f"identical replicas {list(broker_ids)}")
    except AssertionError as e:
        raise AssertionError(
            f"{e}\n{describe_difference(cluster, broker_ids, topic, partition)}"
        ) from None
    assert common is not None
    return common


# ---------------------------------------------------------------------------------------------
# Real clients


def create_topic(
    cluster: LocalCluster,
    topic: str,
    assignment: Sequence[Sequence[int]],
    configs: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create `topic` with an explicit replica assignment (partition i on `assignment[i]`, the
    first replica preferred) through confluent-kafka's AdminClient, then wait until every live
    broker's metadata shows the preferred replica leading each partition."""
    config: dict[str, Any] = {"bootstrap.servers": cluster.bootstrap_servers, "logger": log}
    admin = AdminClient(config)
    # librdkafka wants the partition count with an explicit assignment, and no replication factor.
    new_topic = NewTopic(
        topic,
        num_partitions=len(assignment),
        replica_assignment=[list(r) for r in assignment],
        config=dict(configs or {}),
    )
    admin.create_topics([new_topic], operation_timeout=timeout)[topic].result(timeout)
    live = [b for b in cluster.broker_ids if cluster.is_alive(b)]
    for index, replicas in enumerate(assignment):
        preferred = replicas[0]

        def led_by_preferred(view: PartitionView, preferred: int = preferred) -> bool:
            return view.leader == preferred

        wait_for_metadata(
            cluster,
            topic,
            index,
            live,
            led_by_preferred,
            timeout,
            f"{topic}-{index} led by {preferred}",
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery report: the value sent and where it was acknowledged (or the error)."""

    value: bytes | None
    partition: int
    offset: int
    error: ConfluentKafkaError | None

    @classmethod
    def of(cls, error: ConfluentKafkaError | None, message: Message) -> Delivery:
        partition, offset = message.partition(), message.offset()
        return cls(
            message.value(),
            -1 if partition is None else partition,
            -1 if offset is None else offset,
            error,
        )


def producer_config(bootstrap: str, acks: str, **overrides: Any) -> dict[str, Any]:
    """A librdkafka producer configuration (idempotence off unless `enable_idempotence=True`);
    `overrides` use librdkafka's names with dots as underscores."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": acks,
        "linger.ms": 2,
        "message.timeout.ms": 60000,
        "retry.backoff.ms": 100,
        "topic.metadata.refresh.interval.ms": 1000,
        "logger": log,
    }
    config.update({key.replace("_", "."): value for key, value in overrides.items()})
    return config


@dataclass
class Deliveries:
    """Delivery reports collected from one producer."""

    reports: list[Delivery] = field(default_factory=list)

    @property
    def acknowledged(self) -> list[Delivery]:
        return [d for d in self.reports if d.error is None]

    @property
    def failed(self) -> list[Delivery]:
        return [d for d in self.reports if d.error is not None]

    def acknowledged_by_partition(self) -> dict[int, dict[int, bytes | None]]:
        """partition -> {offset: value} of every acknowledged record."""
        result: dict[int, dict[int, bytes | None]] = {}
        for d in self.acknowledged:
            result.setdefault(d.partition, {})[d.offset] = d.value
        return result


class AckedProducer:
    """A confluent-kafka producer that remembers every delivery report. Test thread only."""

    def __init__(self, bootstrap: str, acks: str = "all", **overrides: Any) -> None:
        self.deliveries = Deliveries()
        self._producer = Producer(producer_config(bootstrap, acks, **overrides))

    def _on_delivery(self, error: ConfluentKafkaError | None, message: Message) -> None:
        self.deliveries.reports.append(Delivery.of(error, message))

    def send(
        self,
        topic: str,
        values: Iterable[bytes],
        partition: int | None = None,
        keyed: bool = False,
        timeout: float = 60,
    ) -> Deliveries:
        """Produce `values` (to `partition`, or by the default partitioner) and wait for every
        delivery report; returns all reports collected so far.

        With `keyed` each value is also its record's key, so the default partitioner spreads
        the values over the partitions by hash (without keys librdkafka's sticky partitioner
        would put a fast burst into one partition).
        """
        for value in values:
            kwargs: dict[str, Any] = {"value": value, "on_delivery": self._on_delivery}
            if partition is not None:
                kwargs["partition"] = partition
            if keyed:
                kwargs["key"] = value
            self._produce(topic, kwargs)
        remaining = self._producer.flush(timeout)
        if remaining:
            raise AssertionError(f"{remaining} messages were neither delivered nor failed")
        return self.deliveries

    def _produce(self, topic: str, kwargs: dict[str, Any]) -> None:
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                return
            except BufferError:  # the local queue is full: serve delivery reports first
                self._producer.poll(0.1)


class StreamingProducer:
    """Produces `prefix-<n>` values to one topic from a background thread until stopped, so a
    test can kill or pause brokers mid-stream; every delivery report is kept.

    Concurrency: the producer (and its delivery callbacks) live in the background thread; the
    test thread reads `acknowledged_count()` and calls `stop()`, both under `_lock`.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        prefix: str,
        acks: str = "all",
        partition: int | None = None,
        interval: float = 0.002,
        value_bytes: int = 0,
        **overrides: Any,
    ) -> None:
        self.topic = topic
        self.prefix = prefix
        self.value_bytes = value_bytes  # values are padded with "." to at least this size
        self.partition = partition
        self.interval = interval
        self._config = producer_config(bootstrap, acks, **overrides)
        self._lock = threading.Lock()
        self._deliveries = Deliveries()
        self._stopping = threading.Event()
        self._abandoning = threading.Event()
        self._error: BaseException | None = None
        self._unfinished = 0
        self._thread = threading.Thread(target=self._run, name=f"producer-{prefix}", daemon=True)

    def start(self) -> StreamingProducer:
        self._thread.start()
        return self

    def _on_delivery(self, error: ConfluentKafkaError | None, message: Message) -> None:
        with self._lock:
            self._deliveries.reports.append(Delivery.of(error, message))

    def _run(self) -> None:
        try:
            producer = Producer(self._config)
            sequence = 0
            while not self._stopping.is_set():
                kwargs: dict[str, Any] = {
                    "value": f"{self.prefix}-{sequence}".ljust(self.value_bytes, ".").encode(),
                    "on_delivery": self._on_delivery,
                }
                if self.partition is not None:
                    kwargs["partition"] = self.partition
                try:
                    producer.produce(self.topic, **kwargs)
                    sequence += 1
                except BufferError:
                    pass
                producer.poll(self.interval)
            if self._abandoning.is_set():
                producer.purge()
                self._unfinished = producer.flush(10)
            else:
                self._unfinished = producer.flush(90)
        except BaseException as e:  # reported by stop(), in the test thread
            self._error = e

    def abandon(self) -> None:
        """Stop at once, dropping what is still queued: the test has already failed, and waiting
        out the message timeouts would only delay its report."""
        self._abandoning.set()
        self._stopping.set()
        self._thread.join(30)

    def acknowledged_count(self) -> int:
        with self._lock:
            return len(self._deliveries.acknowledged)

    def stop(self, timeout: float = 120.0) -> Deliveries:
        """Stop producing, wait for every outstanding delivery report, return them all."""
        self._stopping.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"producer {self.prefix} did not finish within {timeout}s")
        if self._error is not None:
            raise AssertionError(f"producer {self.prefix} failed: {self._error!r}")
        if self._unfinished:
            raise AssertionError(f"{self._unfinished} messages got no delivery report")
        with self._lock:
            return Deliveries(list(self._deliveries.reports))


def assert_acknowledged_present(
    acknowledged: Mapping[int, bytes | None], records: Sequence[Record], where: str
) -> None:
    """Every acknowledged (offset, value) is in `records` at that offset."""
    by_offset = {r.offset: r.value for r in records}
    missing = {o: v for o, v in acknowledged.items() if by_offset.get(o) != v}
    if missing:
        sample = sorted(missing.items())[:5]
        found = [(o, by_offset.get(o)) for o, _ in sample]
        raise AssertionError(
            f"{len(missing)} of {len(acknowledged)} acknowledged records are not at their offsets "
            f"in {where}: expected {sample}, found {found}"
        )
