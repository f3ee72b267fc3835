"""The console's Kafka-protocol side through confluent-kafka's AdminClient.

Everything here blocks (librdkafka's futures); the app calls it through `asyncio.to_thread`. One
AdminClient is kept and replaced after a failure (librdkafka can keep a dead broker's handle and
stale metadata for minutes after a broker dies, see FACTS.md). (The record browser and the
high watermarks of the topic and group pages ask the leaders directly: `record_browser`,
`leader_offsets`.)

Errors reach the pages as `ConsoleError` with Kafka's error name and message (what an operator
reads in Kafka's own tools), never a traceback.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    ElectionType,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from odradek.errors import OdradekError

log = logging.getLogger(__name__)
librdkafka_log = logging.getLogger("odradek.console.librdkafka")
librdkafka_log.addHandler(logging.NullHandler())

TIMEOUT_S = 10.0


class ConsoleError(OdradekError):
    """A request the cluster refused or could not answer, in one line for the page."""


def _describe(error: Any) -> str:
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    if isinstance(error, KafkaError):
        return f"{error.name()}: {error.str()}"
    return str(error)


@dataclass(frozen=True, slots=True)
class ConfigRow:
    name: str
    value: str | None
    source: str
    is_default: bool
    sensitive: bool
    read_only: bool


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: str
    simple: bool


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    client_id: str
    host: str
    instance_id: str | None
    assignment: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    assignor: str
    coordinator: int | None
    members: tuple[GroupMember, ...]
    committed: Mapping[tuple[str, int], int | None] = field(default_factory=dict)


def _source_name(source: Any) -> str:
    """Kafka's name of a config's source (DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG, ...)."""
    try:
        return ConfigSource(source).name
    except ValueError:
        return str(source)


def _state_name(state: Any) -> str:
    name = getattr(state, "name", None) or str(state)
    return name.replace("_", " ").title().replace(" ", "") if name.isupper() else name


class KafkaAccess:
    """The cluster through the protocol. Thread-safe: callers run it in worker threads."""

    def __init__(self, bootstrap_servers: str, config: Mapping[str, str] | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.config = dict(config or {})
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()

    def _client_config(self, client_id: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": client_id,
            "logger": librdkafka_log,
            **self.config,
        }

    @property
    def admin(self) -> AdminClient:
        with self._lock:
            if self._admin is None:
                self._admin = AdminClient(self._client_config("odradek-console"))
            return self._admin

    def _forget_admin(self) -> None:
        with self._lock:
            self._admin = None

    def _result(self, future: Any) -> Any:
        try:
            return future.result(timeout=TIMEOUT_S)
        except KafkaException as e:
            error = e.args[0] if e.args else None
            if isinstance(error, KafkaError) and error.code() in (
                KafkaError._TRANSPORT,
                KafkaError._TIMED_OUT,
                KafkaError._ALL_BROKERS_DOWN,
            ):
                self._forget_admin()
            raise ConsoleError(_describe(e)) from None
        except TimeoutError:
            self._forget_admin()
            raise ConsoleError(f"no answer within {TIMEOUT_S:g} s") from None

    # -- reads ------------------------------------------------------------------------------

    def topic_configs(self, topic: str) -> list[ConfigRow]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        entries = self._result(self.admin.describe_configs([resource])[resource])
        return sorted(
            (
                ConfigRow(
                    e.name,
                    e.value,
                    _source_name(e.source),
                    bool(e.is_default),
                    bool(e.is_sensitive),
                    bool(e.is_read_only),
                )
                for e in entries.values()
            ),
            key=lambda row: (row.is_default, row.name),  # the topic's overrides first
        )

    def broker_config(self, broker_id: int, name: str) -> str | None:
        resource = ConfigResource(ResourceType.BROKER, str(broker_id))
        entries = self._result(self.admin.describe_configs([resource])[resource])
        entry = entries.get(name)
        return entry.value if entry is not None else None

    def list_offsets(
        self, partitions: Iterable[tuple[str, int]], spec: str = "latest"
    ) -> dict[tuple[str, int], int]:
        """ListOffsets of each partition (`latest`: its high watermark, `earliest`: its log
        start); a partition whose leader did not answer is left out."""
        offset_spec = OffsetSpec.latest() if spec == "latest" else OffsetSpec.earliest()
        request = {TopicPartition(t, p): offset_spec for t, p in partitions}
        if not request:
            return {}
        futures = self.admin.list_offsets(request, request_timeout=TIMEOUT_S)
        result: dict[tuple[str, int], int] = {}
        for tp, future in futures.items():
            try:
                result[(tp.topic, tp.partition)] = future.result(timeout=TIMEOUT_S).offset
            except (KafkaException, TimeoutError) as e:
                log.info("no %s offset for %s-%d: %s", spec, tp.topic, tp.partition, e)
        return result

    def groups(self) -> list[GroupListing]:
        answer = self._result(self.admin.list_consumer_groups(request_timeout=TIMEOUT_S))
        return sorted(
            (
                GroupListing(g.group_id, _state_name(g.state), bool(g.is_simple_consumer_group))
                for g in answer.valid
            ),
            key=lambda g: g.group_id,
        )

    def describe_group(self, group_id: str) -> GroupDescription:
        described = self._result(
            self.admin.describe_consumer_groups([group_id], request_timeout=TIMEOUT_S)[group_id]
        )
        offsets = self._result(
            self.admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group_id)], request_timeout=TIMEOUT_S
            )[group_id]
        )
        members = tuple(
            GroupMember(
                m.member_id,
                m.client_id,
                m.host,
                m.group_instance_id,
                tuple(
                    sorted(
                        (tp.topic, tp.partition)
                        for tp in (m.assignment.topic_partitions if m.assignment else [])
                    )
                ),
            )
            for m in described.members
        )
        committed = {
            (tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None)
            for tp in offsets.topic_partitions or []
        }
        return GroupDescription(
            group_id=group_id,
            state=_state_name(described.state),
            assignor=described.partition_assignor or "",
            coordinator=described.coordinator.id if described.coordinator else None,
            members=members,
            committed=committed,
        )

    # -- operator actions -------------------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int, replication_factor: int, configs: Mapping[str, str]
    ) -> None:
        topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config=dict(configs),
        )
        self._result(self.admin.create_topics([topic], request_timeout=TIMEOUT_S)[name])

    def delete_topic(self, name: str) -> None:
        self._result(self.admin.delete_topics([name], request_timeout=TIMEOUT_S)[name])

    def add_partitions(self, name: str, total: int) -> None:
        self._result(
            self.admin.create_partitions([NewPartitions(name, total)], request_timeout=TIMEOUT_S)[
                name
            ]
        )

    def alter_topic_config(self, topic: str, name: str, value: str | None) -> None:
        """Set (`value`) or delete (None: back to the default) one config of a topic with
        IncrementalAlterConfigs."""
        operation = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
        resource = ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[ConfigEntry(name, value, incremental_operation=operation)],
        )
        self._result(self.admin.incremental_alter_configs([resource])[resource])

    def elect_preferred(self, partitions: Sequence[tuple[str, int]]) -> dict[str, str]:
        """Preferred-leader election of `partitions`: partition name -> "elected" or the error
        (ELECTION_NOT_NEEDED when the preferred replica already leads)."""
        answer = self._result(
            # No request_timeout: confluent-kafka 2.16's elect_leaders fails on any keyword
            # argument (SystemError from its C binding); `_result` bounds the wait.
            self.admin.elect_leaders(
                ElectionType.PREFERRED, [TopicPartition(t, p) for t, p in partitions]
            )
        )
        return {
            f"{tp.topic}-{tp.partition}": ("elected" if error is None else _describe(error))
            for tp, error in sorted(answer.items(), key=lambda kv: (kv[0].topic, kv[0].partition))
        }

    def reset_group_offsets(
        self, group_id: str, topic: str, partitions: Sequence[int], to: str, offset: int = 0
    ) -> dict[int, int]:
        """Commit new offsets for an inactive group: `to` is earliest, latest or offset (clamped
        into each partition's [log start, high watermark], as kafka-consumer-groups does).
        Returns partition -> committed offset."""
        keys = [(topic, p) for p in partitions]
        low = self.list_offsets(keys, "earliest")
        high = self.list_offsets(keys, "latest")
        missing = [p for p in partitions if (topic, p) not in low or (topic, p) not in high]
        if missing:
            raise ConsoleError(f"no offsets for partitions {missing} of {topic}")
        targets: dict[int, int] = {}
        for p in partitions:
            start, end = low[(topic, p)], high[(topic, p)]
            wanted = start if to == "earliest" else end if to == "latest" else offset
            targets[p] = min(max(wanted, start), end)
        request = ConsumerGroupTopicPartitions(
            group_id, [TopicPartition(topic, p, o) for p, o in targets.items()]
        )
        answer = self._result(
            self.admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group_id]
        )
        for tp in answer.topic_partitions or []:
            if tp.error is not None:
                raise ConsoleError(f"{tp.topic}-{tp.partition}: {_describe(tp.error)}")
        return targets
