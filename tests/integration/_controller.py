"""Shared helpers of the controller integration tests (real broker processes, real ZooKeeper).

The controller tests ask four kinds of question, and each has its helpers here:

* **What does each broker believe?** `metadata` sends one Metadata v12 request to exactly one
  broker (the project's own `BrokerConnection`, a fresh connection, no retries) and decodes the
  answer into a `MetadataView`: cluster id, controller id, broker list with racks, and per topic
  its id and every partition's leader, leader epoch, replicas, ISR and offline replicas. Views are
  plain frozen values, so "every broker answers identically" is `==`; `wait_for_agreement` polls
  until it holds together with a condition (every partition led, say). Only the topics a test
  names are compared: `cluster3` is shared, and other tests' topics come and go.
* **What does ZooKeeper hold?** `zk_controller`, `zk_topic`, `zk_partition_states`, `zk_exists`,
  `zk_children`, `zk_stat`, `zk_topic_config` read znodes on a fresh session; `zk_write_topic` writes
  `/brokers/topics/<t>` the way an admin tool without a broker would. `zk_call` runs any coroutine
  against a `ZkClient`, for the fencing tests that drive `ControllerZk` themselves.
* **What does a broker do with a controller request?** `send_leader_and_isr`,
  `send_update_metadata` and `send_stop_replica` build the inter-broker requests by hand (any
  controller id and epoch, any partition state) and return the broker's decoded answer, so a test
  can play a deposed controller.
* **Admin answers and what is on disk.** `create_topics` / `delete_topics` send CreateTopics v7 /
  DeleteTopics v6 to one chosen broker and return each topic's answer; `partition_dirs` lists a
  topic's partition directories (live and `-delete`d) in every broker's data directory;
  `state_change_lines` reads a broker's `state-change.log`; `roundtrip` produces with a real
  client (acks=1) through one bootstrap broker and reads the records back through the same one.

Every helper blocks: it opens its own event loop (`asyncio.run`) and connection or ZooKeeper
session, so no state leaks from one question to the next. Waits are deadlines (`wait_until`),
never fixed sleeps.

Concurrency: call from the test's thread only.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from odradek.network.client import BrokerConnection
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class
from odradek.protocol.topic_ids import topic_id_to_uuid
from odradek.testing import LocalBroker, LocalCluster
from odradek.zk.client import ZkClient
from odradek.zk.errors import NoNodeError
from odradek.zk.znodes import (
    BrokerIdZNode,
    ControllerEpochZNode,
    ControllerZNode,
    LeaderIsrAndControllerEpoch,
    TopicAssignment,
    TopicConfigZNode,
    TopicPartitionStateZNode,
    TopicZNode,
)
from tests.fixtures.cluster import wait_until
from tests.integration import _clients

T = TypeVar("T")

METADATA_VERSION = 12
CREATE_TOPICS_VERSION = 7
DELETE_TOPICS_VERSION = 6
LEADER_AND_ISR_VERSION = 5
UPDATE_METADATA_VERSION = 7
STOP_REPLICA_VERSION = 3
ZK_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 15.0
ADMIN_TIMEOUT_MS = 30_000
PLAINTEXT = 0  # UpdateMetadata's security protocol id
STATE_CHANGE_LOG = "state-change.log"


# ---------------------------------------------------------------------------------------------
# One request to one broker


def request(
    broker: LocalBroker,
    api_key: ApiKey,
    version: int,
    values: dict[str, Any],
    timeout: float = REQUEST_TIMEOUT_S,
) -> Any:
    """Send one request to `broker` on a fresh connection; the decoded response. NetworkError
    if the broker cannot be reached or does not answer within `timeout` seconds."""

    async def send() -> Any:
        connection = await BrokerConnection.connect(
            broker.host, broker.port, timeout=timeout, client_id="controller-test"
        )
        try:
            message = build(request_class(api_key, version), values)
            return await connection.send(api_key, version, message, timeout=timeout)
        finally:
            connection.close()

    return asyncio.run(send())


# ---------------------------------------------------------------------------------------------
# What one broker's Metadata says


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as one broker's Metadata response shows it."""

    error: ErrorCode
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """One topic as one broker's Metadata response shows it (partitions by index)."""

    error: ErrorCode
    topic_id: uuid.UUID | None
    partitions: Mapping[int, PartitionInfo]

    def led(self) -> bool:
        """Every partition has a leader, and the answer carries no error."""
        return (
            self.error == ErrorCode.none
            and bool(self.partitions)
            and all(p.error == ErrorCode.none and p.leader >= 0 for p in self.partitions.values())
        )


@dataclass(frozen=True, slots=True)
class BrokerNode:
    id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class MetadataView:
    """One broker's whole answer, decoded: equal views mean identical answers."""

    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerNode, ...]
    topics: Mapping[str, TopicInfo]

    @property
    def broker_ids(self) -> list[int]:
        return [b.id for b in self.brokers]

    def topic(self, name: str) -> TopicInfo | None:
        """The topic if the broker knows it (no error), else None."""
        info = self.topics.get(name)
        return info if info is not None and info.error == ErrorCode.none else None

    def all_led(self, names: Iterable[str], partitions: Mapping[str, int] | None = None) -> bool:
        """Every named topic is known and fully led (with `partitions[name]` partitions if given)."""
        for name in names:
            info = self.topic(name)
            if info is None or not info.led():
                return False
            if partitions is not None and len(info.partitions) != partitions[name]:
                return False
        return True


def _zero_to_none(value: uuid.UUID | None) -> uuid.UUID | None:
    return None if value is None or value.int == 0 else value


def metadata(
    broker: LocalBroker, topics: Sequence[str] | None, allow_auto_topic_creation: bool = False
) -> MetadataView:
    """Metadata v12 from `broker` alone, for `topics` (None: every topic), decoded."""
    response = request(
        broker,
        ApiKey.METADATA,
        METADATA_VERSION,
        {
            "topics": None
            if topics is None
            else [{"name": name, "topic_id": None} for name in topics],
            "allow_auto_topic_creation": allow_auto_topic_creation,
            "include_topic_authorized_operations": False,
        },
    )
    topic_infos = {}
    for entry in response.topics:
        topic_infos[str(entry.name)] = TopicInfo(
            error=ErrorCode(entry.error_code),
            topic_id=_zero_to_none(entry.topic_id),
            partitions={
                int(p.partition_index): PartitionInfo(
                    error=ErrorCode(p.error_code),
                    leader=int(p.leader_id),
                    leader_epoch=int(p.leader_epoch),
                    replicas=tuple(int(r) for r in p.replica_nodes),
                    isr=tuple(int(r) for r in p.isr_nodes),
                    offline_replicas=tuple(int(r) for r in p.offline_replicas),
                )
                for p in entry.partitions
            },
        )
    return MetadataView(
        cluster_id=response.cluster_id,
        controller_id=int(response.controller_id),
        brokers=tuple(
            sorted(
                (
                    BrokerNode(int(b.node_id), str(b.host), int(b.port), b.rack)
                    for b in response.brokers
                ),
                key=lambda b: b.id,
            )
        ),
        topics=topic_infos,
    )


def metadata_by_broker(
    cluster: LocalCluster, topics: Sequence[str] | None, broker_ids: Iterable[int] | None = None
) -> dict[int, MetadataView]:
    """Each broker's own answer (default: every broker of the cluster)."""
    ids = cluster.broker_ids if broker_ids is None else list(broker_ids)
    return {broker_id: metadata(cluster.broker(broker_id), topics) for broker_id in ids}


def describe_views(views: Mapping[int, MetadataView]) -> str:
    """A compact account of how the brokers' answers differ, for assertion messages."""
    lines = []
    for broker_id, view in sorted(views.items()):
        topics = {
            name: (
                info.error.name,
                {p: (i.leader, i.leader_epoch, i.isr) for p, i in sorted(info.partitions.items())},
            )
            for name, info in view.topics.items()
        }
        lines.append(
            f"broker {broker_id}: controller {view.controller_id}, brokers {view.broker_ids}, "
            f"topics {topics}"
        )
    return "\n".join(lines)


def wait_for_agreement(
    cluster: LocalCluster,
    topics: Sequence[str],
    condition: Callable[[MetadataView], bool],
    broker_ids: Iterable[int] | None = None,
    timeout: float = 30.0,
    what: str = "the condition",
) -> MetadataView:
    """Wait until every broker of `broker_ids` answers Metadata for `topics` identically and the
    common answer satisfies `condition`; returns it. The failure message shows each broker's view.
    """
    ids = cluster.broker_ids if broker_ids is None else list(broker_ids)
    last: dict[int, MetadataView] = {}

    def check() -> MetadataView | None:
        last.clear()
        last.update(metadata_by_broker(cluster, topics, ids))
        first = last[ids[0]]
        if all(view == first for view in last.values()) and condition(first):
            return first
        return None

    try:
        agreed = wait_until(check, timeout, f"brokers {ids} to agree on {what}")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{describe_views(last)}") from None
    assert agreed is not None  # wait_until returns only a truthy result
    return agreed


# ---------------------------------------------------------------------------------------------
# ZooKeeper


def zk_call(cluster: LocalCluster, work: Callable[[ZkClient], Awaitable[T]]) -> T:
    """Run `work(zk)` on a fresh ZooKeeper session of the cluster's ensemble; returns its result."""

    async def run() -> T:
        zk = ZkClient(cluster.zookeeper_connect, session_timeout_s=ZK_TIMEOUT_S)
        await zk.start(timeout=ZK_TIMEOUT_S)
        try:
            return await work(zk)
        finally:
            await zk.close()

    return asyncio.run(run())


@dataclass(frozen=True, slots=True)
class ControllerState:
    """`/controller` and `/controller_epoch` as read together."""

    broker_id: int | None
    epoch: int
    epoch_zk_version: int


def zk_controller(cluster: LocalCluster) -> ControllerState:
    async def read(zk: ZkClient) -> ControllerState:
        data, stat = await zk.get(ControllerEpochZNode.path())
        epoch = ControllerEpochZNode.decode(data, stat.version)
        try:
            raw, znode = await zk.get(ControllerZNode.path())
            broker_id: int | None = ControllerZNode.decode(raw, znode.version).broker_id
        except NoNodeError:
            broker_id = None
        return ControllerState(broker_id, epoch.epoch, epoch.zk_version)

    return zk_call(cluster, read)


def zk_broker_epoch(cluster: LocalCluster, broker_id: int) -> int:
    """The broker's epoch: the czxid of its `/brokers/ids/<id>` registration."""

    async def read(zk: ZkClient) -> int:
        _, stat = await zk.get(BrokerIdZNode.path(broker_id))
        return int(stat.czxid)

    return zk_call(cluster, read)


def zk_topic(cluster: LocalCluster, topic: str) -> TopicAssignment | None:
    """`/brokers/topics/<topic>` decoded, or None if it does not exist."""

    async def read(zk: ZkClient) -> TopicAssignment | None:
        try:
            data, stat = await zk.get(TopicZNode.path(topic))
        except NoNodeError:
            return None
        return TopicZNode.decode(topic, data, stat.version)

    return zk_call(cluster, read)


def zk_partition_states(
    cluster: LocalCluster, topic: str, partitions: Iterable[int]
) -> dict[int, LeaderIsrAndControllerEpoch]:
    """The partition state znodes that exist among `partitions`, decoded (with znode versions)."""
    wanted = sorted(partitions)

    async def read(zk: ZkClient) -> dict[int, LeaderIsrAndControllerEpoch]:
        results = await asyncio.gather(
            *(zk.get(TopicPartitionStateZNode.path(topic, p)) for p in wanted),
            return_exceptions=True,
        )
        states = {}
        for partition, result in zip(wanted, results, strict=True):
            if isinstance(result, NoNodeError):
                continue
            if isinstance(result, BaseException):
                raise result
            data, stat = result
            states[partition] = TopicPartitionStateZNode.decode(data, stat.version)
        return states

    return zk_call(cluster, read)


def zk_topic_config(cluster: LocalCluster, topic: str) -> dict[str, str] | None:
    """`/config/topics/<topic>` decoded, or None if it does not exist."""

    async def read(zk: ZkClient) -> dict[str, str] | None:
        try:
            data, stat = await zk.get(TopicConfigZNode.path(topic))
        except NoNodeError:
            return None
        return dict(TopicConfigZNode.decode(data, stat.version, topic).config)

    return zk_call(cluster, read)


def zk_exists(cluster: LocalCluster, paths: Iterable[str]) -> dict[str, bool]:
    wanted = list(paths)

    async def read(zk: ZkClient) -> dict[str, bool]:
        stats = await asyncio.gather(*(zk.exists(p) for p in wanted))
        return {p: s is not None for p, s in zip(wanted, stats, strict=True)}

    return zk_call(cluster, read)


def zk_children(cluster: LocalCluster, path: str) -> list[str]:
    async def read(zk: ZkClient) -> list[str]:
        try:
            return sorted(await zk.get_children(path))
        except NoNodeError:
            return []

    return zk_call(cluster, read)


def zk_stat(cluster: LocalCluster, path: str) -> Any:
    """The znode's stat (kazoo's ZnodeStat: version, cversion, czxid, ...), None if absent."""

    async def read(zk: ZkClient) -> Any:
        return await zk.exists(path)

    return zk_call(cluster, read)


def zk_write_topic(
    cluster: LocalCluster, topic: str, data: bytes, expected_version: int | None = None
) -> None:
    """Write `/brokers/topics/<topic>` as an admin tool would: create it (parents too) when
    `expected_version` is None, else overwrite it conditionally on that version."""

    async def write(zk: ZkClient) -> None:
        if expected_version is None:
            await zk.create(TopicZNode.path(topic), data, makepath=True)
        else:
            await zk.set(TopicZNode.path(topic), data, version=expected_version)

    zk_call(cluster, write)


def assignment_json(partitions: Mapping[int, Sequence[int]], version: int = 1) -> bytes:
    """The assignment JSON older Kafka tools write: no topic id, no reassignment fields."""
    body = ",".join(
        f'"{p}":[{",".join(str(r) for r in replicas)}]'
        for p, replicas in sorted(partitions.items())
    )
    return f'{{"version":{version},"partitions":{{{body}}}}}'.encode()


def topic_uuid(assignment: TopicAssignment) -> uuid.UUID | None:
    """The topic id of a `/brokers/topics/<t>` znode (URL-safe base64 there) as a UUID."""
    return topic_id_to_uuid(assignment.topic_id)


# ---------------------------------------------------------------------------------------------
# Controller requests, sent by the test as if by some controller


def send_leader_and_isr(
    broker: LocalBroker,
    *,
    controller_id: int,
    controller_epoch: int,
    broker_epoch: int,
    topic: str,
    topic_id: uuid.UUID | None,
    partition: int,
    state: LeaderIsrAndControllerEpoch,
    replicas: Sequence[int],
    live_leaders: Sequence[LocalBroker],
) -> Any:
    """One LeaderAndIsr v5 for one partition; the decoded response."""
    return request(
        broker,
        ApiKey.LEADER_AND_ISR,
        LEADER_AND_ISR_VERSION,
        {
            "controller_id": controller_id,
            "controller_epoch": controller_epoch,
            "broker_epoch": broker_epoch,
            "type": 0,
            "topic_states": [
                {
                    "topic_name": topic,
                    "topic_id": topic_id,
                    "partition_states": [
                        {
                            "partition_index": partition,
                            "controller_epoch": state.controller_epoch,
                            "leader": state.leader,
                            "leader_epoch": state.leader_epoch,
                            "isr": state.isr,
                            "zk_version": state.zk_version,
                            "replicas": tuple(replicas),
                            "adding_replicas": (),
                            "removing_replicas": (),
                            "is_new": False,
                        }
                    ],
                }
            ],
            "live_leaders": [
                {"broker_id": b.id, "host_name": b.host, "port": b.port} for b in live_leaders
            ],
        },
    )


def send_update_metadata(
    broker: LocalBroker,
    *,
    controller_id: int,
    controller_epoch: int,
    broker_epoch: int,
    live_brokers: Sequence[LocalBroker],
    topic: str,
    topic_id: uuid.UUID | None,
    partition: int,
    state: LeaderIsrAndControllerEpoch,
    replicas: Sequence[int],
) -> Any:
    """One UpdateMetadata v7 naming `live_brokers` and one partition's state; the response."""
    return request(
        broker,
        ApiKey.UPDATE_METADATA,
        UPDATE_METADATA_VERSION,
        {
            "controller_id": controller_id,
            "controller_epoch": controller_epoch,
            "broker_epoch": broker_epoch,
            "topic_states": [
                {
                    "topic_name": topic,
                    "topic_id": topic_id,
                    "partition_states": [
                        {
                            "partition_index": partition,
                            "controller_epoch": state.controller_epoch,
                            "leader": state.leader,
                            "leader_epoch": state.leader_epoch,
                            "isr": state.isr,
                            "zk_version": state.zk_version,
                            "replicas": tuple(replicas),
                            "offline_replicas": (),
                        }
                    ],
                }
            ],
            "live_brokers": [
                {
                    "id": b.id,
                    "endpoints": [
                        {
                            "port": b.port,
                            "host": b.host,
                            "listener": "PLAINTEXT",
                            "security_protocol": PLAINTEXT,
                        }
                    ],
                    "rack": b.rack,
                }
                for b in live_brokers
            ],
        },
    )


def send_stop_replica(
    broker: LocalBroker,
    *,
    controller_id: int,
    controller_epoch: int,
    broker_epoch: int,
    topic: str,
    partition: int,
    leader_epoch: int,
    delete: bool,
    timeout: float = REQUEST_TIMEOUT_S,
) -> Any:
    """One StopReplica v3 for one partition; the decoded response."""
    return request(
        broker,
        ApiKey.STOP_REPLICA,
        STOP_REPLICA_VERSION,
        {
            "controller_id": controller_id,
            "controller_epoch": controller_epoch,
            "broker_epoch": broker_epoch,
            "topic_states": [
                {
                    "topic_name": topic,
                    "partition_states": [
                        {
                            "partition_index": partition,
                            "leader_epoch": leader_epoch,
                            "delete_partition": delete,
                        }
                    ],
                }
            ],
        },
        timeout,
    )


# ---------------------------------------------------------------------------------------------
# Admin requests to one chosen broker


@dataclass(frozen=True, slots=True)
class CreateAnswer:
    """One topic's CreateTopics answer."""

    error: ErrorCode
    message: str | None
    num_partitions: int
    replication_factor: int
    topic_id: uuid.UUID | None


def topic_spec(
    name: str,
    partitions: int = -1,
    replication_factor: int = -1,
    assignment: Mapping[int, Sequence[int]] | None = None,
    configs: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One CreatableTopic of a CreateTopics request."""
    return {
        "name": name,
        "num_partitions": partitions,
        "replication_factor": replication_factor,
        "assignments": [
            {"partition_index": p, "broker_ids": tuple(r)}
            for p, r in sorted((assignment or {}).items())
        ],
        "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()],
    }


def create_topics(
    broker: LocalBroker,
    specs: Sequence[dict[str, Any]],
    validate_only: bool = False,
    timeout_ms: int = ADMIN_TIMEOUT_MS,
) -> dict[str, CreateAnswer]:
    """CreateTopics v7 sent to `broker` (not necessarily the controller); answer per topic."""
    response = request(
        broker,
        ApiKey.CREATE_TOPICS,
        CREATE_TOPICS_VERSION,
        {
            "topics": list(specs),
            "timeout": datetime.timedelta(milliseconds=timeout_ms),
            "validate_only": validate_only,
        },
    )
    return {
        str(t.name): CreateAnswer(
            ErrorCode(t.error_code),
            t.error_message,
            int(t.num_partitions),
            int(t.replication_factor),
            _zero_to_none(t.topic_id),
        )
        for t in response.topics
    }


def delete_topics(
    broker: LocalBroker, names: Sequence[str], timeout_ms: int = ADMIN_TIMEOUT_MS
) -> dict[str, ErrorCode]:
    """DeleteTopics v6 sent to `broker`; the error code per topic."""
    response = request(
        broker,
        ApiKey.DELETE_TOPICS,
        DELETE_TOPICS_VERSION,
        {
            "topics": [{"name": name, "topic_id": None} for name in names],
            "timeout": datetime.timedelta(milliseconds=timeout_ms),
        },
    )
    return {str(r.name): ErrorCode(r.error_code) for r in response.responses}


# ---------------------------------------------------------------------------------------------
# Placement


def leaders_per_broker(info: TopicInfo, broker_ids: Iterable[int]) -> dict[int, int]:
    counts = Counter(p.leader for p in info.partitions.values())
    return {b: counts.get(b, 0) for b in broker_ids}


def replicas_per_broker(info: TopicInfo, broker_ids: Iterable[int]) -> dict[int, int]:
    counts = Counter(r for p in info.partitions.values() for r in p.replicas)
    return {b: counts.get(b, 0) for b in broker_ids}


# ---------------------------------------------------------------------------------------------
# Files


def partition_dirs(cluster: LocalCluster, topic: str) -> dict[int, list[str]]:
    """Broker id -> names of the directories in its data dir that belong to `topic`: live
    partition logs (`<topic>-<p>`) and logs being deleted (`<topic>-<p>.<id>-delete`)."""
    pattern = re.compile(rf"{re.escape(topic)}-\d+(\..*)?")
    found: dict[int, list[str]] = {}
    for broker in cluster.brokers:
        try:
            entries = sorted(p.name for p in Path(broker.data_dir).iterdir() if p.is_dir())
        except FileNotFoundError:
            entries = []
        found[broker.id] = [name for name in entries if pattern.fullmatch(name)]
    return found


def state_change_lines(broker: LocalBroker) -> list[str]:
    """The lines of the broker's `state-change.log` (FileNotFoundError if it has none)."""
    return (Path(broker.dir) / STATE_CHANGE_LOG).read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------------------------------------
# Real clients


def roundtrip(
    client: str, bootstrap: str, topic: str, partitions: Iterable[int], count: int = 5
) -> None:
    """With `client`, bootstrapped from `bootstrap` only: produce `count` records (acks=1) to
    each partition, then read them back from the offsets the producer was given, and compare.

    The partitions' leaders may be other brokers than the bootstrap one: the client must route by
    the Metadata the bootstrap broker gives it. AssertionError (ClientError) on any difference.
    """
    for partition in partitions:
        records = [
            _clients.Rec(f"k{partition}-{i}".encode(), f"{client}-{topic}-{partition}-{i}".encode())
            for i in range(count)
        ]
        offsets = _clients.produce(client, bootstrap, topic, partition, records, acks=1)
        if offsets is None or len(offsets) != count:
            raise AssertionError(f"{client} acknowledged {offsets} for {count} records")
        if offsets != list(range(offsets[0], offsets[0] + count)):
            raise AssertionError(f"{client} offsets {offsets} are not consecutive")
        got = _clients.consume(client, bootstrap, topic, partition, offsets[0], count)
        expected = [(offsets[0] + i, r.key, r.value) for i, r in enumerate(records)]
        actual = [(c.offset, c.key, c.value) for c in got[:count]]
        if actual != expected:
            raise AssertionError(
                f"{client} via {bootstrap}, {topic}-{partition}: read {actual}, wrote {expected}"
            )
