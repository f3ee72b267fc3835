"""The Kafka-protocol client behind `odradek consumer-groups`, `delete-records`, `log-dirs` and
`transactions` (and the console's transactions page).

It extends `AdminClient` with what those tools ask of a cluster, the way
Kafka's admin client asks it: groups are listed from every broker (ListGroups) and described,
fetched, committed to and deleted through their coordinator (FindCoordinator, then DescribeGroups,
OffsetFetch, OffsetCommit, DeleteGroups, OffsetDelete; asked again while the coordinator is
loading or moved); end offsets come from each partition's leader (ListOffsets); DeleteRecords
goes to the leaders and DescribeLogDirs to each broker asked for.

Concurrency: owned by one event loop, like `AdminClient`.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.admin.client import AdminClient, KafkaResponseError
from odradek.errors import NetworkError, OperatorError
from odradek.network.client import BrokerConnection
from odradek.protocol.codec import ApiKey

TopicPartition = tuple[str, int]

FIND_COORDINATOR_VERSION = 3
LIST_GROUPS_VERSION = 4
DESCRIBE_GROUPS_VERSION = 5
OFFSET_FETCH_VERSION = 7
OFFSET_COMMIT_VERSION = 8
OFFSET_DELETE_VERSION = 0
LIST_OFFSETS_VERSION = 7
DELETE_GROUPS_VERSION = 2
DELETE_RECORDS_VERSION = 2
DESCRIBE_LOG_DIRS_VERSION = 4
EARLIEST = -2
LATEST = -1
RETRIABLE = frozenset(
    {
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.not_coordinator,
    }
)
RETRY_BACKOFF_S = 0.2

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    coordinator: tuple[int, str, int]
    members: tuple[Member, ...] = field(default=())


def consumer_assignment(data: bytes) -> tuple[TopicPartition, ...]:
    """The partitions of a ConsumerProtocolAssignment (int16 version, then topics, each a string
    and an int32 array); () when the bytes are not one (another protocol type)."""
    try:
        (count,) = _INT32.unpack_from(data, 2)
        position, partitions = 6, []
        for _ in range(max(count, 0)):
            (length,) = _INT16.unpack_from(data, position)
            topic = data[position + 2 : position + 2 + length].decode()
            position += 2 + length
            (n,) = _INT32.unpack_from(data, position)
            position += 4
            for _ in range(max(n, 0)):
                (index,) = _INT32.unpack_from(data, position)
                position += 4
                partitions.append((topic, index))
    except (struct.error, UnicodeDecodeError):
        return ()
    return tuple(sorted(partitions))


@dataclass
class GroupAdminClient(AdminClient):
    """The topics command's connections, plus connections to any broker by id."""

    connections: dict[int, BrokerConnection] = field(default_factory=dict)
    addresses: dict[int, tuple[str, int]] | None = None
    # Tasks that need a broker at once (the console asks every leader in parallel) wait for one
    # connection to it rather than each opening one and all but the last leaking.
    _connecting: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    async def _broker_connection(self, broker_id: int) -> BrokerConnection:
        found = self.connections.get(broker_id)
        if found is not None and not found.closed:
            return found
        async with self._connecting:
            return await self._connect_to(broker_id)

    async def _connect_to(self, broker_id: int) -> BrokerConnection:
        connections = self.connections
        found = connections.get(broker_id)
        if found is not None and not found.closed:
            return found  # another task connected while this one waited
        brokers = await self.brokers()
        if broker_id not in brokers:
            raise OperatorError(f"broker {broker_id} is not in the cluster's metadata")
        host, port = brokers[broker_id]
        try:
            connection = await BrokerConnection.connect(
                host,
                port,
                timeout=self.timeout,
                client_id="odradek-consumer-groups",
                security=self.security,  # the bootstrap connection's: --command-config
            )
        except NetworkError as e:
            raise OperatorError(str(e)) from None
        connections[broker_id] = connection
        return connection

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()
        super().close()

    async def brokers(self, refresh: bool = False) -> dict[int, tuple[str, int]]:
        if refresh or self.addresses is None:
            metadata = await self.metadata([])
            self.addresses = {b.node_id: (b.host, b.port) for b in metadata.brokers}
        return self.addresses

    async def to_broker(self, broker_id: int, api_key: int, version: int, values: Any) -> Any:
        return await self._send(await self._broker_connection(broker_id), api_key, version, values)

    # -- groups ----------------------------------------------------------------------------------

    async def _retrying(self, attempt: Any) -> Any:
        """Call `attempt()` (which returns (error code, result)) until its error is not one that a
        coordinator move or load explains, or the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            code, result = await attempt()
            if code not in RETRIABLE or time.monotonic() >= deadline:
                return code, result
            await asyncio.sleep(RETRY_BACKOFF_S)

    async def coordinator(self, group_id: str) -> tuple[int, str, int]:
        async def attempt() -> tuple[ErrorCode, Any]:
            answer = await self._send(
                self.bootstrap,
                ApiKey.FIND_COORDINATOR,
                FIND_COORDINATOR_VERSION,
                {"key": group_id, "key_type": 0},
            )
            return ErrorCode(answer.error_code), answer

        code, answer = await self._retrying(attempt)
        if code is not ErrorCode.none:
            raise KafkaResponseError(code, answer.error_message)
        return int(answer.node_id), answer.host, int(answer.port)

    async def _to_coordinator(
        self, group_id: str, api_key: int, version: int, values: Any, error_of: Any
    ) -> Any:
        async def attempt() -> tuple[ErrorCode, Any]:
            node, _host, _port = await self.coordinator(group_id)
            answer = await self.to_broker(node, api_key, version, values)
            return ErrorCode(error_of(answer)), answer

        _code, answer = await self._retrying(attempt)
        return answer

    async def list_groups(self, states: Sequence[str] = ()) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group of every broker."""
        found: dict[str, tuple[str, str, str]] = {}
        for broker_id in sorted(await self.brokers()):
            answer = await self.to_broker(
                broker_id, ApiKey.LIST_GROUPS, LIST_GROUPS_VERSION, {"states_filter": list(states)}
            )
            if answer.error_code not in (ErrorCode.none, ErrorCode.coordinator_load_in_progress):
                raise KafkaResponseError(ErrorCode(answer.error_code), f"from broker {broker_id}")
            for group in answer.groups:
                found[group.group_id] = (group.group_id, group.protocol_type, group.group_state)
        return sorted(found.values())

    async def describe_group(self, group_id: str) -> GroupDescription:
        answer = await self._to_coordinator(
            group_id,
            ApiKey.DESCRIBE_GROUPS,
            DESCRIBE_GROUPS_VERSION,
            {"groups": [group_id], "include_authorized_operations": False},
            lambda a: a.groups[0].error_code,
        )
        (described,) = answer.groups
        if described.error_code != ErrorCode.none:
            raise KafkaResponseError(ErrorCode(described.error_code), f"group {group_id}")
        consumer = described.protocol_type in ("consumer", "")
        members = tuple(
            Member(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                consumer_assignment(m.member_assignment) if consumer else (),
            )
            for m in described.members
        )
        return GroupDescription(
            group_id,
            described.group_state,
            described.protocol_type,
            described.protocol_data,
            await self.coordinator(group_id),
            members,
        )

    async def committed_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        answer = await self._to_coordinator(
            group_id,
            ApiKey.OFFSET_FETCH,
            OFFSET_FETCH_VERSION,
            {"group_id": group_id, "topics": None, "require_stable": False},
            lambda a: a.error_code,
        )
        if answer.error_code != ErrorCode.none:
            raise KafkaResponseError(ErrorCode(answer.error_code), f"group {group_id}")
        return {
            (t.name, p.partition_index): int(p.committed_offset)
            for t in answer.topics
            for p in t.partitions
            if p.committed_offset >= 0
        }

    async def commit_offsets(
        self, group_id: str, offsets: dict[TopicPartition, int]
    ) -> dict[TopicPartition, ErrorCode]:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "committed_offset": offset,
                    "committed_leader_epoch": -1,
                    "committed_metadata": "",
                }
            )
        answer = await self._to_coordinator(
            group_id,
            ApiKey.OFFSET_COMMIT,
            OFFSET_COMMIT_VERSION,
            {
                "group_id": group_id,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
            },
            lambda a: next((p.error_code for t in a.topics for p in t.partitions), ErrorCode.none),
        )
        return {
            (t.name, p.partition_index): ErrorCode(p.error_code)
            for t in answer.topics
            for p in t.partitions
        }

    async def delete_group(self, group_id: str) -> ErrorCode:
        answer = await self._to_coordinator(
            group_id,
            ApiKey.DELETE_GROUPS,
            DELETE_GROUPS_VERSION,
            {"groups_names": [group_id]},
            lambda a: a.results[0].error_code,
        )
        return ErrorCode(answer.results[0].error_code)

    async def delete_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        by_topic: dict[str, list[dict[str, int]]] = {}
        for topic, partition in sorted(partitions):
            by_topic.setdefault(topic, []).append({"partition_index": partition})
        answer = await self._to_coordinator(
            group_id,
            ApiKey.OFFSET_DELETE,
            OFFSET_DELETE_VERSION,
            {
                "group_id": group_id,
                "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
            },
            lambda a: a.error_code,
        )
        return ErrorCode(answer.error_code), {
            (t.name, p.partition_index): ErrorCode(p.error_code)
            for t in answer.topics
            for p in t.partitions
        }

    # -- partitions ------------------------------------------------------------------------------

    async def partitions_of(self, topics: Sequence[str] | None) -> dict[TopicPartition, int]:
        """partition -> leader id, for `topics` (every topic when None); OperatorError for a
        topic the cluster does not have."""
        metadata = await self.metadata(topics)
        leaders: dict[TopicPartition, int] = {}
        for topic in metadata.topics:
            if topic.error_code != ErrorCode.none:
                raise KafkaResponseError(ErrorCode(topic.error_code), f"topic {topic.name}")
            for partition in topic.partitions:
                leaders[(topic.name, partition.partition_index)] = int(partition.leader_id)
        return leaders

    async def list_offsets(
        self, partitions: Iterable[TopicPartition], timestamp: int, isolation_level: int = 0
    ) -> dict[TopicPartition, int]:
        """Each partition's offset for `timestamp` (LATEST, EARLIEST, or ms: -1 if none); LATEST
        under isolation level 1 (read_committed) is the last stable offset."""
        wanted = sorted(set(partitions))
        leaders = await self.partitions_of(sorted({t for t, _ in wanted}))
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in wanted:
            if leaders.get(tp, -1) < 0:
                raise OperatorError(f"partition {tp[0]}-{tp[1]} has no leader")
            by_leader.setdefault(leaders[tp], []).append(tp)
        offsets: dict[TopicPartition, int] = {}
        for leader, tps in by_leader.items():
            by_topic: dict[str, list[dict[str, int]]] = {}
            for topic, partition in tps:
                by_topic.setdefault(topic, []).append(
                    {
                        "partition_index": partition,
                        "current_leader_epoch": -1,
                        "timestamp": timestamp,
                    }
                )
            answer = await self.to_broker(
                leader,
                ApiKey.LIST_OFFSETS,
                LIST_OFFSETS_VERSION,
                {
                    "replica_id": -1,
                    "isolation_level": isolation_level,
                    "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
                },
            )
            for topic in answer.topics:
                for partition in topic.partitions:
                    if partition.error_code != ErrorCode.none:
                        raise KafkaResponseError(
                            ErrorCode(partition.error_code),
                            f"ListOffsets of {topic.name}-{partition.partition_index}",
                        )
                    offsets[(topic.name, partition.partition_index)] = int(partition.offset)
        return offsets

    async def delete_records(
        self, offsets: dict[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, ErrorCode]]:
        leaders = await self.partitions_of(sorted({t for t, _ in offsets}))
        results: dict[TopicPartition, tuple[int, ErrorCode]] = {}
        by_leader: dict[int, dict[TopicPartition, int]] = {}
        for tp, offset in offsets.items():
            leader = leaders.get(tp)
            if leader is None:
                results[tp] = (-1, ErrorCode.unknown_topic_or_partition)
            elif leader < 0:
                results[tp] = (-1, ErrorCode.leader_not_available)
            else:
                by_leader.setdefault(leader, {})[tp] = offset
        for leader, wanted in by_leader.items():
            by_topic: dict[str, list[dict[str, int]]] = {}
            for (topic, partition), offset in sorted(wanted.items()):
                by_topic.setdefault(topic, []).append(
                    {"partition_index": partition, "offset": offset}
                )
            answer = await self.to_broker(
                leader,
                ApiKey.DELETE_RECORDS,
                DELETE_RECORDS_VERSION,
                {
                    "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
                    "timeout": int(self.timeout * 1000),
                },
            )
            for topic in answer.topics:
                for partition in topic.partitions:
                    results[(topic.name, partition.partition_index)] = (
                        int(partition.low_watermark),
                        ErrorCode(partition.error_code),
                    )
        return results

    async def describe_log_dirs(self, broker_id: int, topics: Sequence[str] | None) -> Any:
        wanted = None
        if topics is not None:
            leaders = await self.partitions_of(topics)
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(leaders):
                by_topic.setdefault(topic, []).append(partition)
            wanted = [{"topic": t, "partitions": p} for t, p in by_topic.items()]
        return await self.to_broker(
            broker_id, ApiKey.DESCRIBE_LOG_DIRS, DESCRIBE_LOG_DIRS_VERSION, {"topics": wanted}
        )
