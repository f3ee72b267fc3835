"""Consumer-group APIs: FindCoordinator (10), JoinGroup (11), SyncGroup (14), Heartbeat (12),
LeaveGroup (13), OffsetCommit (8), OffsetFetch (9), ListGroups (16), DescribeGroups (15) and
DeleteGroups (42).

Membership is the `GroupCoordinator`'s; committed offsets are the `OffsetStore`'s (ZooKeeper). These
handlers translate between the wire versions and those two. Every decision that depends on request
order happens synchronously, before a handler returns its awaitable: the socket server dispatches a
connection's requests in order but runs their awaitables concurrently, and a client that pipelines
an OffsetCommit and a LeaveGroup must have its commit judged before it leaves. Only ZooKeeper I/O
and parked JoinGroup/SyncGroup answers are awaited.

FindCoordinator answers from any broker (the placement of `coordinator_for`); every other API
answers NOT_COORDINATOR unless this broker coordinates the group. Transaction coordinators
(key type 1) do not exist here: INVALID_REQUEST.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.coordinator import (
    GroupCoordinator,
    GroupSummary,
    JoinRequest,
    JoinResult,
    LeavingMember,
    SyncResult,
    coordinator_for,
)
from odradek.coordinator.group.offset_store import OffsetStore, TopicPartition
from odradek.errors import require
from odradek.protocol.build import build_response
from odradek.protocol.codec import ApiKey
from odradek.zk.errors import ZkError

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext

log = logging.getLogger(__name__)

T = TypeVar("T")

GROUP_KEY_TYPE = 0
NO_OFFSET = -1
NO_LEADER_EPOCH = -1
OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes default
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
# Kafka's AclOperation codes a group allows: READ (3), DELETE (6), DESCRIBE (8). With no
# authorizer, every one of them is allowed.
GROUP_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)


class BrokerEndpoint(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


class ClusterMetadata(Protocol):
    """What the group APIs read of the broker's metadata cache."""

    def alive_broker_ids(self) -> Iterable[int]: ...

    def get_broker(self, broker_id: int) -> BrokerEndpoint | None: ...

    def get_partition(self, topic: str, partition: int) -> object | None: ...


class GroupServices(Protocol):
    """What the group APIs need from the broker that answers them (`Broker` has all three)."""

    @property
    def group_coordinator(self) -> GroupCoordinator: ...

    @property
    def offset_store(self) -> OffsetStore: ...

    @property
    def metadata_cache(self) -> ClusterMetadata: ...


def _coordinator(services: GroupServices) -> GroupCoordinator:
    return services.group_coordinator


def _offsets(services: GroupServices) -> OffsetStore:
    return services.offset_store


def _ms(value: datetime.timedelta | None, default: int = -1) -> int:
    return default if value is None else value // datetime.timedelta(milliseconds=1)


def _client_host(context: RequestContext) -> str:
    """The client's address as Kafka shows it ("/127.0.0.1")."""
    return f"/{context.client_host}"


def _answer_later(
    register: Callable[[Callable[[T], None]], None], answer: Callable[[T], Any]
) -> Any:
    """Run `register(callback)`; answer at once if the callback came back synchronously,
    otherwise return an awaitable that answers when it does."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def done(result: T) -> None:
        if not future.done():  # the request may have been cancelled (client gone)
            future.set_result(result)

    register(done)
    if future.done():
        return answer(future.result())

    async def wait() -> Any:
        return answer(await future)

    return wait()


# ---------------------------------------------------------------------------------------------
# FindCoordinator


def handle_find_coordinator(services: GroupServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    cache = services.metadata_cache
    key_type = int(getattr(request, "key_type", GROUP_KEY_TYPE))

    def find(key: str) -> dict[str, Any]:
        found: dict[str, Any] = {
            "key": key,
            "error_code": ErrorCode.none,
            "error_message": None,
            "node_id": -1,
            "host": "",
            "port": -1,
        }
        if key_type != GROUP_KEY_TYPE:
            found["error_code"] = ErrorCode.invalid_request
            found["error_message"] = f"coordinator key type {key_type} is not supported"
            return found
        node = coordinator_for(key, cache.alive_broker_ids())
        endpoint = cache.get_broker(node) if node is not None else None
        if endpoint is None:
            found["error_code"] = ErrorCode.coordinator_not_available
            found["error_message"] = "no live broker is known yet"
            return found
        found.update(node_id=endpoint.id, host=endpoint.host, port=endpoint.port)
        return found

    if header.api_version >= 4:
        coordinators = [find(key) for key in request.coordinator_keys]
        return build_response(header, {"throttle_time": 0, "coordinators": coordinators})
    return build_response(header, {"throttle_time": 0, **find(request.key)})


# ---------------------------------------------------------------------------------------------
# JoinGroup, SyncGroup, Heartbeat, LeaveGroup


def handle_join_group(services: GroupServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    version = header.api_version
    session_timeout_ms = _ms(request.session_timeout)
    # v0 has no rebalance timeout: the session timeout bounds the rebalance, as in Kafka.
    rebalance_timeout_ms = (
        session_timeout_ms if version == 0 else _ms(request.rebalance_timeout, session_timeout_ms)
    )
    group_instance_id = getattr(request, "group_instance_id", None)
    join = JoinRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=group_instance_id,
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, p.metadata) for p in request.protocols),
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        require_known_member_id=version >= 4 and group_instance_id is None,
        supports_skip_assignment=version >= 9,
        client_id=header.client_id or "",
        client_host=_client_host(context),
        reason=getattr(request, "reason", None),
    )

    def answer(result: JoinResult) -> Any:
        protocol_name = result.protocol_name
        if protocol_name is None and version < 7:
            protocol_name = ""  # nullable only from v7
        return build_response(
            header,
            {
                "throttle_time": 0,
                "error_code": result.error,
                "generation_id": result.generation_id,
                "protocol_type": result.protocol_type,
                "protocol_name": protocol_name,
                "leader": result.leader_id,
                "skip_assignment": result.skip_assignment,
                "member_id": result.member_id,
                "members": [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.group_instance_id,
                        "metadata": m.metadata,
                    }
                    for m in result.members
                ],
            },
        )

    return _answer_later(lambda done: _coordinator(services).join_group(join, done), answer)


def handle_sync_group(services: GroupServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    assignments = {a.member_id: a.assignment for a in request.assignments}

    def answer(result: SyncResult) -> Any:
        return build_response(
            header,
            {
                "throttle_time": 0,
                "error_code": result.error,
                "protocol_type": result.protocol_type,
                "protocol_name": result.protocol_name,
                "assignment": result.assignment,
            },
        )

    return _answer_later(
        lambda done: _coordinator(services).sync_group(
            request.group_id,
            request.generation_id,
            request.member_id,
            getattr(request, "group_instance_id", None),
            getattr(request, "protocol_type", None),
            getattr(request, "protocol_name", None),
            assignments,
            done,
        ),
        answer,
    )


def handle_heartbeat(services: GroupServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    error = _coordinator(services).heartbeat(
        request.group_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        request.generation_id,
    )
    return build_response(header, {"throttle_time": 0, "error_code": error})


def handle_leave_group(services: GroupServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    if header.api_version < 3:
        leaving = [LeavingMember(request.member_id)]
    else:
        leaving = [
            LeavingMember(m.member_id, m.group_instance_id, getattr(m, "reason", None))
            for m in request.members
        ]
    error, member_errors = _coordinator(services).leave_group(request.group_id, leaving)
    if header.api_version < 3:
        # One member and one error field: the group's error, else the member's.
        if error is ErrorCode.none and member_errors:
            error = member_errors[0]
        return build_response(header, {"throttle_time": 0, "error_code": error})
    members = [
        {
            "member_id": member.member_id,
            "group_instance_id": member.group_instance_id,
            "error_code": member_error,
        }
        for member, member_error in zip(leaving, member_errors, strict=False)
    ]
    return build_response(header, {"throttle_time": 0, "error_code": error, "members": members})


# ---------------------------------------------------------------------------------------------
# OffsetCommit, OffsetFetch


def handle_offset_commit(services: GroupServices, context: RequestContext, request: Any) -> Any:
    """1. per partition: unknown partition, oversized metadata; 2. may this member commit now
    (judged synchronously, in request order); 3. write the rest to ZooKeeper."""
    header = context.header
    cache = services.metadata_cache
    group_id = request.group_id
    errors: dict[TopicPartition, ErrorCode] = {}
    valid: dict[TopicPartition, int] = {}
    for topic in request.topics:
        for partition in topic.partitions:
            key = (topic.name, partition.partition_index)
            metadata = partition.committed_metadata or ""
            if cache.get_partition(*key) is None:
                errors[key] = ErrorCode.unknown_topic_or_partition
            elif len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                errors[key] = ErrorCode.offset_metadata_too_large
            else:
                valid[key] = partition.committed_offset
    writing = None
    if valid:
        error = _coordinator(services).validate_offset_commit(
            group_id,
            request.member_id,
            getattr(request, "group_instance_id", None),
            request.generation_id_or_member_epoch,
        )
        if error is ErrorCode.none:
            writing = _offsets(services).commit(group_id, valid)
        else:
            errors.update(dict.fromkeys(valid, error))

    def answer(results: dict[TopicPartition, ErrorCode]) -> Any:
        topics = [
            {
                "name": topic.name,
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": results.get(
                            (topic.name, p.partition_index), ErrorCode.unknown_server_error
                        ),
                    }
                    for p in topic.partitions
                ],
            }
            for topic in request.topics
        ]
        return build_response(header, {"throttle_time": 0, "topics": topics})

    if writing is None:
        return answer(errors)

    async def write() -> Any:
        return answer({**errors, **await require(writing, "the offset commit's write")})

    return write()


def _requested_offsets(topics: Any) -> list[tuple[str, list[int]]] | None:
    if topics is None:
        return None
    return [(t.name, list(t.partition_indexes)) for t in topics]


def _partition_offsets(
    requested: list[tuple[str, list[int]]] | None,
    offsets: dict[TopicPartition, int],
    error: ErrorCode,
) -> list[dict[str, Any]]:
    """The topics of one group's OffsetFetch answer: every requested partition (-1 if never
    committed), or everything committed when all were asked for."""
    if requested is None:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(offsets):
            by_topic.setdefault(topic, []).append(partition)
        requested = list(by_topic.items())
    return [
        {
            "name": topic,
            "partitions": [
                {
                    "partition_index": partition,
                    "committed_offset": offsets.get((topic, partition), NO_OFFSET),
                    "committed_leader_epoch": NO_LEADER_EPOCH,
                    "metadata": "",
                    "error_code": error,
                }
                for partition in partitions
            ],
        }
        for topic, partitions in requested
    ]


def handle_offset_fetch(services: GroupServices, context: RequestContext, request: Any) -> Any:
    """One group (v1-v7) or several (v8). Reads start synchronously, so they see every commit this
    broker accepted before them."""
    header = context.header
    coordinator, store = _coordinator(services), _offsets(services)
    if header.api_version >= 8:
        asked = [(g.group_id, _requested_offsets(g.topics)) for g in request.groups]
    else:
        asked = [(request.group_id, _requested_offsets(request.topics))]
    reads: list[tuple[str, list[tuple[str, list[int]]] | None, ErrorCode, Any]] = []
    for group_id, requested in asked:
        error = coordinator.validate_group_status(group_id, ApiKey.OFFSET_FETCH)
        partitions = None if requested is None else [(t, p) for t, ps in requested for p in ps]
        reading = store.fetch(group_id, partitions) if error is None else None
        reads.append((group_id, requested, error or ErrorCode.none, reading))

    async def fetch() -> Any:
        groups = []
        for group_id, requested, error, reading in reads:
            offsets: dict[TopicPartition, int] = {}
            if reading is not None:
                try:
                    offsets = await reading
                except ZkError as e:
                    log.warning("cannot read committed offsets of group %s: %s", group_id, e)
                    error = ErrorCode.coordinator_not_available
            if error is not ErrorCode.none and requested is None:
                requested = []
            groups.append(
                {
                    "group_id": group_id,
                    "error_code": error,
                    "topics": _partition_offsets(requested, offsets, error),
                }
            )
        if header.api_version >= 8:
            return build_response(header, {"throttle_time": 0, "groups": groups})
        (group,) = groups
        return build_response(
            header,
            {"throttle_time": 0, "error_code": group["error_code"], "topics": group["topics"]},
        )

    return fetch()


# ---------------------------------------------------------------------------------------------
# ListGroups, DescribeGroups, DeleteGroups


def handle_list_groups(services: GroupServices, context: RequestContext, request: Any) -> Any:
    """The groups this broker coordinates: those with members here, and those ZooKeeper holds
    committed offsets for (as Empty groups, the state Kafka gives a group with offsets only)."""
    header = context.header
    coordinator, store = _coordinator(services), _offsets(services)
    states = [s.lower() for s in (getattr(request, "states_filter", None) or ())]
    in_memory = coordinator.list_groups(states)
    listing = store.list_groups()

    async def answer() -> Any:
        groups = [
            {"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state}
            for g in in_memory
        ]
        error = ErrorCode.none
        try:
            stored = await listing
        except ZkError as e:
            log.warning("cannot list the groups in ZooKeeper: %s", e)
            stored, error = [], ErrorCode.coordinator_not_available
        known = {g.group_id for g in in_memory}
        if not states or "empty" in states:
            for group_id in sorted(set(stored) - known):
                if (
                    coordinator.validate_group_status(group_id, ApiKey.LIST_GROUPS) is None
                    and group_id not in coordinator.groups
                ):
                    groups.append(
                        {"group_id": group_id, "protocol_type": "", "group_state": "Empty"}
                    )
        return build_response(header, {"throttle_time": 0, "error_code": error, "groups": groups})

    return answer()


def _described(group_id: str, error: ErrorCode, summary: GroupSummary | None) -> dict[str, Any]:
    return {
        "error_code": error,
        "group_id": group_id,
        "group_state": summary.state if summary is not None else "",
        "protocol_type": summary.protocol_type if summary is not None else "",
        "protocol_data": summary.protocol if summary is not None else "",
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "member_metadata": m.metadata,
                "member_assignment": m.assignment,
            }
            for m in (summary.members if summary is not None else ())
        ],
    }


def handle_describe_groups(services: GroupServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    coordinator, store = _coordinator(services), _offsets(services)
    include_operations = bool(getattr(request, "include_authorized_operations", False))
    described = [(group_id, *coordinator.describe_group(group_id)) for group_id in request.groups]

    async def answer() -> Any:
        groups = []
        for group_id, error, summary in described:
            if error is ErrorCode.none and summary is None:
                # No members here: Empty if ZooKeeper holds its offsets, else Dead (Kafka's answer
                # for a group it does not know).
                try:
                    state = "Empty" if await store.group_exists(group_id) else "Dead"
                    summary = GroupSummary(state, "", "", ())
                except ZkError as e:
                    log.warning("cannot look up group %s in ZooKeeper: %s", group_id, e)
                    error = ErrorCode.coordinator_not_available
            entry = _described(group_id, error, summary)
            entry["authorized_operations"] = (
                GROUP_AUTHORIZED_OPERATIONS if include_operations else AUTHORIZED_OPERATIONS_OMITTED
            )
            groups.append(entry)
        return build_response(header, {"throttle_time": 0, "groups": groups})

    return answer()


def handle_delete_groups(services: GroupServices, context: RequestContext, request: Any) -> Any:
    """Delete groups without members, with their committed offsets. A group with offsets in
    ZooKeeper but no members here is deleted too; one with neither is GROUP_ID_NOT_FOUND."""
    header = context.header
    coordinator, store = _coordinator(services), _offsets(services)
    names = list(dict.fromkeys(request.groups_names))
    decided = coordinator.delete_groups(names)

    async def answer() -> Any:
        results = []
        for group_id in names:
            error = decided[group_id]
            if error in (ErrorCode.none, ErrorCode.group_id_not_found):
                try:
                    if await store.delete_group(group_id):
                        error = ErrorCode.none
                except ZkError as e:
                    log.warning("cannot delete group %s from ZooKeeper: %s", group_id, e)
                    error = ErrorCode.coordinator_not_available
            results.append({"group_id": group_id, "error_code": error})
        return build_response(header, {"throttle_time": 0, "results": results})

    return answer()
