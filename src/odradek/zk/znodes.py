"""Kafka's ZooKeeper data model: one small class per znode.

Every path and payload here is byte-compatible with Apache Kafka in ZooKeeper mode (2.x/3.x,
`kafka.zk.ZkData`), so Kafka-aware tools (zookeeper-shell, kafka-topics --zookeeper, Burrow, ...)
read an Odradek cluster and vice versa. Each class is a namespace of static methods:

* `path(...)` builds the znode path;
* `encode(...)` returns the payload bytes: compact JSON in UTF-8 (no spaces, as Jackson writes it),
  except `/controller_epoch`, whose payload is the epoch as decimal text;
* `decode(data, stat_version, ...)` parses a payload into a frozen dataclass that carries the
  znode's version (`zk_version`), because every conditional write in Kafka names the version it
  read. A payload that is not what the class expects raises `InvalidZNodeDataError`.

Nothing here does I/O; the classes are safe to use from any thread.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from odradek.zk.errors import InvalidZNodeDataError


class TopicPartition(NamedTuple):
    """A topic name and partition index (Kafka's `TopicPartition`); compares equal to a tuple."""

    topic: str
    partition: int


# ---------------------------------------------------------------------------------------------
# JSON helpers: decode errors become InvalidZNodeDataError naming the znode and the bad field.


def _dumps(value: object) -> bytes:
    # Compact separators and raw UTF-8 match what Kafka's Jackson writer produces.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _loads(data: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidZNodeDataError(f"{where}: not valid JSON ({exc})", path=where) from None
    if not isinstance(value, dict):
        raise InvalidZNodeDataError(f"{where}: expected a JSON object", path=where)
    return value


def _field(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise InvalidZNodeDataError(f"{where}: missing field {key!r}", path=where)
    return obj[key]


def _int(obj: Mapping[str, Any], key: str, where: str) -> int:
    value = _field(obj, key, where)
    # bool is an int in Python but never a valid number in these payloads.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidZNodeDataError(f"{where}: field {key!r} is not an integer", path=where)
    return value


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = _field(obj, key, where)
    if not isinstance(value, str):
        raise InvalidZNodeDataError(f"{where}: field {key!r} is not a string", path=where)
    return value


def _int_list(value: Any, what: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise InvalidZNodeDataError(f"{where}: {what} is not a list of integers", path=where)
    return tuple(value)


def _object(value: Any, what: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidZNodeDataError(f"{where}: {what} is not a JSON object", path=where)
    return value


def _now_ms() -> int:
    return int(time.time() * 1000)


def _sequence_number(child: str, prefix: str) -> str:
    """The counter ZooKeeper appended to a sequential child's name (`isr_change_0000000042`)."""
    index = child.rfind(prefix)
    if index < 0:
        raise InvalidZNodeDataError(f"{child!r} is not a {prefix}<seq> node", path=child)
    return child[index + len(prefix) :]


def _partition_list(partitions: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    return [{"topic": tp.topic, "partition": tp.partition} for tp in partitions]


def _decode_partition_list(obj: Mapping[str, Any], where: str) -> frozenset[TopicPartition]:
    entries = _field(obj, "partitions", where)
    if not isinstance(entries, list):
        raise InvalidZNodeDataError(f"{where}: 'partitions' is not a list", path=where)
    result = set()
    for entry in entries:
        entry = _object(entry, "a partitions entry", where)
        result.add(TopicPartition(_str(entry, "topic", where), _int(entry, "partition", where)))
    return frozenset(result)


# ---------------------------------------------------------------------------------------------
# Brokers


@dataclass(frozen=True, slots=True)
class EndPoint:
    """One advertised listener: `LISTENER_NAME://host:port` plus its security protocol."""

    listener_name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    @classmethod
    def plaintext(cls, host: str, port: int) -> EndPoint:
        return cls("PLAINTEXT", host, port, "PLAINTEXT")

    @property
    def connection_string(self) -> str:
        # IPv6 literals are bracketed so the last colon still separates the port.
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.listener_name}://{host}:{self.port}"

    @classmethod
    def parse(
        cls, connection_string: str, protocol_map: Mapping[str, str] | None, where: str
    ) -> EndPoint:
        """Parse `NAME://host:port`; the security protocol comes from the listener map.

        Without a map (registrations older than version 4), the listener name must itself be a
        security protocol name, as in Kafka.
        """
        name, sep, rest = connection_string.partition("://")
        host, colon, port_text = rest.rpartition(":")
        if not sep or not name or not colon:
            raise InvalidZNodeDataError(f"{where}: bad endpoint {connection_string!r}", path=where)
        try:
            port = int(port_text)
        except ValueError:
            raise InvalidZNodeDataError(
                f"{where}: bad port in endpoint {connection_string!r}", path=where
            ) from None
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        protocol = protocol_map.get(name) if protocol_map is not None else name
        if protocol is None:
            raise InvalidZNodeDataError(
                f"{where}: listener {name!r} missing from listener_security_protocol_map",
                path=where,
            )
        return cls(name, host, port, protocol)


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A decoded `/brokers/ids/<id>` registration.

    `broker_epoch` is the registration znode's czxid: it grows every time the broker registers
    again (after a restart or a session expiry), so the controller can refuse requests meant for a
    previous incarnation of the broker.
    """

    id: int
    host: str | None
    port: int
    endpoints: tuple[EndPoint, ...]
    rack: str | None
    broker_epoch: int
    jmx_port: int = -1
    features: Mapping[str, Any] = field(default_factory=dict)
    version: int = 5

    def endpoint(self, listener_name: str) -> EndPoint | None:
        for endpoint in self.endpoints:
            if endpoint.listener_name == listener_name:
                return endpoint
        return None


class BrokersZNode:
    @staticmethod
    def path() -> str:
        return "/brokers"


class BrokerIdsZNode:
    """Parent of the ephemeral broker registrations; its children are broker ids as text."""

    @staticmethod
    def path() -> str:
        return "/brokers/ids"


class BrokerIdZNode:
    """`/brokers/ids/<id>`: the ephemeral registration of a live broker (JSON version 5).

    Fields: version, host and port (of the first PLAINTEXT endpoint, for pre-0.10 clients; null
    and -1 when there is none), endpoints (`NAME://host:port`), listener_security_protocol_map,
    jmx_port, timestamp (milliseconds, as a string), features (KIP-584 supported features), and rack
    only when the broker has one -- Kafka omits the key rather than writing null.
    """

    VERSION = 5

    @staticmethod
    def path(broker_id: int) -> str:
        return f"{BrokerIdsZNode.path()}/{broker_id}"

    @staticmethod
    def encode(
        endpoints: Sequence[EndPoint],
        *,
        rack: str | None = None,
        jmx_port: int = -1,
        features: Mapping[str, Any] | None = None,
        timestamp_ms: int | None = None,
    ) -> bytes:
        plaintext = next((e for e in endpoints if e.security_protocol == "PLAINTEXT"), None)
        payload: dict[str, Any] = {
            "version": BrokerIdZNode.VERSION,
            "host": plaintext.host if plaintext else None,
            "port": plaintext.port if plaintext else -1,
            "endpoints": [e.connection_string for e in endpoints],
            "listener_security_protocol_map": {
                e.listener_name: e.security_protocol for e in endpoints
            },
            "jmx_port": jmx_port,
            "features": dict(features or {}),
            "timestamp": str(_now_ms() if timestamp_ms is None else timestamp_ms),
        }
        if rack is not None:
            payload["rack"] = rack
        return _dumps(payload)

    @staticmethod
    def decode(broker_id: int, data: bytes, czxid: int) -> BrokerInfo:
        """Decode a registration; `czxid` is the znode's creation zxid (the broker epoch)."""
        where = BrokerIdZNode.path(broker_id)
        obj = _loads(data, where)
        version = _int(obj, "version", where)
        host = obj.get("host")
        if host is not None and not isinstance(host, str):
            raise InvalidZNodeDataError(f"{where}: field 'host' is not a string", path=where)
        port = _int(obj, "port", where) if obj.get("port") is not None else -1
        if version <= 1:
            if host is None:
                raise InvalidZNodeDataError(f"{where}: version 1 without a host", path=where)
            endpoints: tuple[EndPoint, ...] = (EndPoint.plaintext(host, port),)
        else:
            raw_map = obj.get("listener_security_protocol_map")
            protocol_map = None
            if raw_map is not None:
                protocol_map = _object(raw_map, "listener_security_protocol_map", where)
            raw_endpoints = _field(obj, "endpoints", where)
            if not isinstance(raw_endpoints, list) or not all(
                isinstance(e, str) for e in raw_endpoints
            ):
                raise InvalidZNodeDataError(f"{where}: 'endpoints' is not a list", path=where)
            endpoints = tuple(EndPoint.parse(e, protocol_map, where) for e in raw_endpoints)
        rack = obj.get("rack")
        if rack is not None and not isinstance(rack, str):
            raise InvalidZNodeDataError(f"{where}: field 'rack' is not a string", path=where)
        jmx_port = obj.get("jmx_port", -1)
        features = obj.get("features") or {}
        return BrokerInfo(
            id=broker_id,
            host=host,
            port=port,
            endpoints=endpoints,
            rack=rack,
            broker_epoch=czxid,
            jmx_port=jmx_port if isinstance(jmx_port, int) else -1,
            features=_object(features, "features", where),
            version=version,
        )


# ---------------------------------------------------------------------------------------------
# Topics and partitions


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    """A partition's assigned replicas (AR), with the replicas being added or removed by an
    in-flight reassignment (KIP-455). Outside a reassignment both extra lists are empty."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """A decoded `/brokers/topics/<topic>`: partition index -> replica assignment."""

    topic: str
    partitions: Mapping[int, ReplicaAssignment]
    zk_version: int
    topic_id: str | None = None


class TopicsZNode:
    @staticmethod
    def path() -> str:
        return "/brokers/topics"


class TopicZNode:
    """`/brokers/topics/<topic>`: the replica assignment of every partition of a topic.

    JSON version 2: `partitions` maps the partition index (as a string) to its replica list;
    `adding_replicas` and `removing_replicas` hold only the partitions being reassigned (both
    always present, possibly empty); `topic_id` appears only when the topic has one (Kafka 2.8+).
    """

    VERSION = 2

    @staticmethod
    def path(topic: str) -> str:
        return f"{TopicsZNode.path()}/{topic}"

    @staticmethod
    def encode(
        assignment: Mapping[int, ReplicaAssignment | Sequence[int]], topic_id: str | None = None
    ) -> bytes:
        partitions: dict[str, list[int]] = {}
        adding: dict[str, list[int]] = {}
        removing: dict[str, list[int]] = {}
        for partition in sorted(assignment):
            value = assignment[partition]
            replicas = (
                value if isinstance(value, ReplicaAssignment) else ReplicaAssignment(tuple(value))
            )
            partitions[str(partition)] = list(replicas.replicas)
            if replicas.adding_replicas:
                adding[str(partition)] = list(replicas.adding_replicas)
            if replicas.removing_replicas:
                removing[str(partition)] = list(replicas.removing_replicas)
        payload: dict[str, Any] = {
            "version": TopicZNode.VERSION,
            "partitions": partitions,
            "adding_replicas": adding,
            "removing_replicas": removing,
        }
        if topic_id is not None:
            payload["topic_id"] = topic_id
        return _dumps(payload)

    @staticmethod
    def decode(topic: str, data: bytes, stat_version: int) -> TopicAssignment:
        where = TopicZNode.path(topic)
        obj = _loads(data, where)
        raw_partitions = _object(obj.get("partitions", {}), "'partitions'", where)
        adding = _object(obj.get("adding_replicas") or {}, "'adding_replicas'", where)
        removing = _object(obj.get("removing_replicas") or {}, "'removing_replicas'", where)
        partitions: dict[int, ReplicaAssignment] = {}
        for key, replicas in raw_partitions.items():
            try:
                partition = int(key)
            except ValueError:
                raise InvalidZNodeDataError(
                    f"{where}: partition key {key!r} is not an integer", path=where
                ) from None
            partitions[partition] = ReplicaAssignment(
                _int_list(replicas, f"replicas of partition {key}", where),
                _int_list(adding.get(key, []), f"adding_replicas of {key}", where),
                _int_list(removing.get(key, []), f"removing_replicas of {key}", where),
            )
        topic_id = obj.get("topic_id")
        if topic_id is not None and not isinstance(topic_id, str):
            raise InvalidZNodeDataError(f"{where}: field 'topic_id' is not a string", path=where)
        return TopicAssignment(topic, partitions, stat_version, topic_id)


class TopicPartitionsZNode:
    @staticmethod
    def path(topic: str) -> str:
        return f"{TopicZNode.path(topic)}/partitions"


class TopicPartitionZNode:
    @staticmethod
    def path(topic: str, partition: int) -> str:
        return f"{TopicPartitionsZNode.path(topic)}/{partition}"


@dataclass(frozen=True, slots=True)
class LeaderIsrAndControllerEpoch:
    """A decoded partition state znode. `zk_version` is what the next conditional write names:
    a leader whose ISR write fails on it has been superseded (a zombie) and must stop leading."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    zk_version: int


class TopicPartitionStateZNode:
    """`/brokers/topics/<t>/partitions/<p>/state`: leader, leader epoch, ISR, controller epoch.

    Written by the controller on every leader change and by the leader on ISR changes, always
    conditionally on the znode version. JSON version 1; leader is -1 when there is none.
    """

    VERSION = 1

    @staticmethod
    def path(topic: str, partition: int) -> str:
        return f"{TopicPartitionZNode.path(topic, partition)}/state"

    @staticmethod
    def encode(
        *, leader: int, leader_epoch: int, isr: Sequence[int], controller_epoch: int
    ) -> bytes:
        return _dumps(
            {
                "controller_epoch": controller_epoch,
                "leader": leader,
                "version": TopicPartitionStateZNode.VERSION,
                "leader_epoch": leader_epoch,
                "isr": list(isr),
            }
        )

    @staticmethod
    def decode(
        data: bytes, stat_version: int, where: str = "partition state"
    ) -> LeaderIsrAndControllerEpoch:
        obj = _loads(data, where)
        return LeaderIsrAndControllerEpoch(
            leader=_int(obj, "leader", where),
            leader_epoch=_int(obj, "leader_epoch", where),
            isr=_int_list(_field(obj, "isr", where), "'isr'", where),
            controller_epoch=_int(obj, "controller_epoch", where),
            zk_version=stat_version,
        )


# ---------------------------------------------------------------------------------------------
# Controller


@dataclass(frozen=True, slots=True)
class ControllerInfo:
    broker_id: int
    timestamp_ms: int
    zk_version: int


@dataclass(frozen=True, slots=True)
class ControllerEpoch:
    epoch: int
    zk_version: int


class ControllerZNode:
    """`/controller`: the ephemeral znode whose creator is the controller (JSON version 1)."""

    @staticmethod
    def path() -> str:
        return "/controller"

    @staticmethod
    def encode(broker_id: int, timestamp_ms: int | None = None) -> bytes:
        timestamp = _now_ms() if timestamp_ms is None else timestamp_ms
        return _dumps({"version": 1, "brokerid": broker_id, "timestamp": str(timestamp)})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> ControllerInfo:
        where = ControllerZNode.path()
        obj = _loads(data, where)
        timestamp = obj.get("timestamp", "-1")
        try:
            timestamp_ms = int(timestamp)
        except (TypeError, ValueError):
            timestamp_ms = -1
        return ControllerInfo(_int(obj, "brokerid", where), timestamp_ms, stat_version)


class ControllerEpochZNode:
    """`/controller_epoch`: the controller epoch as decimal text (not JSON).

    Its znode version is the fencing token: every controller write is a transaction that first
    checks this version, so a deposed controller's writes fail (see `ZkClient.checked_multi`).
    """

    @staticmethod
    def path() -> str:
        return "/controller_epoch"

    @staticmethod
    def encode(epoch: int) -> bytes:
        return str(epoch).encode("ascii")

    @staticmethod
    def decode(data: bytes, stat_version: int) -> ControllerEpoch:
        try:
            return ControllerEpoch(int(data.decode("ascii").strip()), stat_version)
        except (UnicodeDecodeError, ValueError):
            raise InvalidZNodeDataError(
                f"/controller_epoch: {data[:40]!r} is not an integer", path="/controller_epoch"
            ) from None


# ---------------------------------------------------------------------------------------------
# Notifications (persistent sequential children that the controller consumes and deletes)


@dataclass(frozen=True, slots=True)
class IsrChangeNotification:
    partitions: frozenset[TopicPartition]
    zk_version: int


class IsrChangeNotificationZNode:
    """`/isr_change_notification`: parent of the leaders' ISR change notifications."""

    @staticmethod
    def path() -> str:
        return "/isr_change_notification"


class IsrChangeNotificationSequenceZNode:
    """`/isr_change_notification/isr_change_<seq>`: partitions whose ISR a leader changed.

    Created persistent-sequential (ZooKeeper appends a 10-digit counter to the prefix); JSON
    `{"version":1,"partitions":[{"topic":..,"partition":..},..]}`.
    """

    PREFIX = "isr_change_"

    @staticmethod
    def path(sequence_number: str = "") -> str:
        """The child's path; with no sequence number, the prefix to create a sequential node."""
        return f"{IsrChangeNotificationZNode.path()}/{IsrChangeNotificationSequenceZNode.PREFIX}{sequence_number}"

    @staticmethod
    def sequence_number(child: str) -> str:
        return _sequence_number(child, IsrChangeNotificationSequenceZNode.PREFIX)

    @staticmethod
    def encode(partitions: Iterable[TopicPartition]) -> bytes:
        return _dumps({"version": 1, "partitions": _partition_list(partitions)})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> IsrChangeNotification:
        obj = _loads(data, IsrChangeNotificationZNode.path())
        return IsrChangeNotification(
            _decode_partition_list(obj, IsrChangeNotificationZNode.path()), stat_version
        )


# ---------------------------------------------------------------------------------------------
# Admin requests


class AdminZNode:
    @staticmethod
    def path() -> str:
        return "/admin"


class DeleteTopicsZNode:
    """`/admin/delete_topics`: parent of the topics queued for deletion."""

    @staticmethod
    def path() -> str:
        return f"{AdminZNode.path()}/delete_topics"


class DeleteTopicsTopicZNode:
    """`/admin/delete_topics/<topic>`: the topic is queued for deletion. Its payload is empty:
    the znode's existence is the request."""

    @staticmethod
    def path(topic: str) -> str:
        return f"{DeleteTopicsZNode.path()}/{topic}"

    @staticmethod
    def encode() -> bytes:
        return b""


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    replicas: Mapping[TopicPartition, tuple[int, ...]]
    zk_version: int


class ReassignPartitionsZNode:
    """`/admin/reassign_partitions`: the legacy (pre-KIP-455) reassignment request.

    JSON `{"version":1,"partitions":[{"topic":..,"partition":..,"replicas":[..]},..]}`: the target
    replica list (RAR) of each partition. The controller removes partitions as they complete and
    deletes the znode when none are left.
    """

    @staticmethod
    def path() -> str:
        return f"{AdminZNode.path()}/reassign_partitions"

    @staticmethod
    def encode(reassignment: Mapping[TopicPartition, Sequence[int]]) -> bytes:
        partitions = [
            {"topic": tp.topic, "partition": tp.partition, "replicas": list(replicas)}
            for tp, replicas in reassignment.items()
        ]
        return _dumps({"version": 1, "partitions": partitions})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> PartitionReassignment:
        where = ReassignPartitionsZNode.path()
        obj = _loads(data, where)
        entries = _field(obj, "partitions", where)
        if not isinstance(entries, list):
            raise InvalidZNodeDataError(f"{where}: 'partitions' is not a list", path=where)
        replicas: dict[TopicPartition, tuple[int, ...]] = {}
        for entry in entries:
            entry = _object(entry, "a partitions entry", where)
            tp = TopicPartition(_str(entry, "topic", where), _int(entry, "partition", where))
            replicas[tp] = _int_list(_field(entry, "replicas", where), "'replicas'", where)
        return PartitionReassignment(replicas, stat_version)


@dataclass(frozen=True, slots=True)
class PreferredReplicaElection:
    partitions: frozenset[TopicPartition]
    zk_version: int


class PreferredReplicaElectionZNode:
    """`/admin/preferred_replica_election`: partitions whose preferred replica (the first of AR)
    should become leader. JSON `{"version":1,"partitions":[{"topic":..,"partition":..},..]}`."""

    @staticmethod
    def path() -> str:
        return f"{AdminZNode.path()}/preferred_replica_election"

    @staticmethod
    def encode(partitions: Iterable[TopicPartition]) -> bytes:
        return _dumps({"version": 1, "partitions": _partition_list(partitions)})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> PreferredReplicaElection:
        obj = _loads(data, PreferredReplicaElectionZNode.path())
        partitions = _decode_partition_list(obj, PreferredReplicaElectionZNode.path())
        return PreferredReplicaElection(partitions, stat_version)


# ---------------------------------------------------------------------------------------------
# Dynamic configuration


@dataclass(frozen=True, slots=True)
class EntityConfig:
    """Config overrides of one entity (a topic, a broker, or the broker default)."""

    config: Mapping[str, str]
    zk_version: int


class ConfigZNode:
    @staticmethod
    def path() -> str:
        return "/config"


def _encode_entity_config(config: Mapping[str, str]) -> bytes:
    return _dumps({"version": 1, "config": {k: str(v) for k, v in config.items()}})


def _decode_entity_config(data: bytes, stat_version: int, where: str) -> EntityConfig:
    # Kafka treats an empty payload as "no overrides", so do we.
    if not data:
        return EntityConfig({}, stat_version)
    obj = _loads(data, where)
    config = _object(obj.get("config") or {}, "'config'", where)
    for key, value in config.items():
        if not isinstance(value, str):
            raise InvalidZNodeDataError(f"{where}: config {key!r} is not a string", path=where)
    return EntityConfig(dict(config), stat_version)


class TopicConfigZNode:
    """`/config/topics/<topic>`: `{"version":1,"config":{"retention.ms":"1000",..}}`; values are
    always strings. Kafka writes this znode (empty config) when it creates a topic."""

    @staticmethod
    def path(topic: str) -> str:
        return f"{ConfigZNode.path()}/topics/{topic}"

    @staticmethod
    def encode(config: Mapping[str, str]) -> bytes:
        return _encode_entity_config(config)

    @staticmethod
    def decode(data: bytes, stat_version: int, topic: str = "") -> EntityConfig:
        return _decode_entity_config(data, stat_version, TopicConfigZNode.path(topic))


class BrokerConfigZNode:
    """`/config/brokers/<id>` (or `/config/brokers/<default>` for the cluster-wide default)."""

    DEFAULT = "<default>"

    @staticmethod
    def path(broker: int | str) -> str:
        return f"{ConfigZNode.path()}/brokers/{broker}"

    @staticmethod
    def encode(config: Mapping[str, str]) -> bytes:
        return _encode_entity_config(config)

    @staticmethod
    def decode(data: bytes, stat_version: int, broker: int | str = "") -> EntityConfig:
        return _decode_entity_config(data, stat_version, BrokerConfigZNode.path(broker))


@dataclass(frozen=True, slots=True)
class ConfigChangeNotification:
    """Which entity's config changed: `entity_type` is the plural directory name ("topics",
    "brokers", ...), `entity_name` the topic name or broker id."""

    entity_type: str
    entity_name: str
    zk_version: int


class ConfigChangeNotificationZNode:
    """`/config/changes`: parent of the config change notifications."""

    @staticmethod
    def path() -> str:
        return f"{ConfigZNode.path()}/changes"


class ConfigChangeNotificationSequenceZNode:
    """`/config/changes/config_change_<seq>`: persistent sequential; JSON version 2,
    `{"version":2,"entity_path":"topics/<topic>"}`. Every broker watches the parent and re-reads
    the named entity's config. Decoding also accepts Kafka's version 1 (entity_type/entity_name).
    """

    PREFIX = "config_change_"

    @staticmethod
    def path(sequence_number: str = "") -> str:
        return f"{ConfigChangeNotificationZNode.path()}/{ConfigChangeNotificationSequenceZNode.PREFIX}{sequence_number}"

    @staticmethod
    def sequence_number(child: str) -> str:
        return _sequence_number(child, ConfigChangeNotificationSequenceZNode.PREFIX)

    @staticmethod
    def encode(entity_type: str, entity_name: str) -> bytes:
        return _dumps({"version": 2, "entity_path": f"{entity_type}/{entity_name}"})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> ConfigChangeNotification:
        where = ConfigChangeNotificationZNode.path()
        obj = _loads(data, where)
        if _int(obj, "version", where) == 1:
            entity_type, entity_name = (
                _str(obj, "entity_type", where),
                _str(obj, "entity_name", where),
            )
        else:
            entity_type, slash, entity_name = _str(obj, "entity_path", where).partition("/")
            if not slash or not entity_name:
                raise InvalidZNodeDataError(f"{where}: bad entity_path", path=where)
        return ConfigChangeNotification(entity_type, entity_name, stat_version)


# ---------------------------------------------------------------------------------------------
# Cluster id


@dataclass(frozen=True, slots=True)
class ClusterId:
    id: str
    zk_version: int


class ClusterZNode:
    @staticmethod
    def path() -> str:
        return "/cluster"


class ClusterIdZNode:
    """`/cluster/id`: `{"version":"1","id":"<cluster id>"}` -- note the version is a string here,
    unlike every other Kafka znode. Created once by the first broker; never changes."""

    @staticmethod
    def path() -> str:
        return f"{ClusterZNode.path()}/id"

    @staticmethod
    def encode(cluster_id: str) -> bytes:
        return _dumps({"version": "1", "id": cluster_id})

    @staticmethod
    def decode(data: bytes, stat_version: int) -> ClusterId:
        where = ClusterIdZNode.path()
        return ClusterId(_str(_loads(data, where), "id", where), stat_version)


# Persistent paths every broker creates at start-up if missing (Kafka's ZkData.PersistentZkPaths,
# plus /cluster, the parent of /cluster/id). The consumer, seqid, producer-id and log-dir paths
# are not used by Odradek but are created so that Kafka's own tools find the layout they expect.
PERSISTENT_PATHS: tuple[str, ...] = (
    "/consumers",
    BrokerIdsZNode.path(),
    TopicsZNode.path(),
    ConfigChangeNotificationZNode.path(),
    DeleteTopicsZNode.path(),
    f"{BrokersZNode.path()}/seqid",
    IsrChangeNotificationZNode.path(),
    "/latest_producer_id_block",
    "/log_dir_event_notification",
    f"{ConfigZNode.path()}/topics",
    f"{ConfigZNode.path()}/clients",
    f"{ConfigZNode.path()}/users",
    f"{ConfigZNode.path()}/brokers",
    ClusterZNode.path(),
)
