"""Consumer-group APIs: FindCoordinator (10), JoinGroup (11), SyncGroup (14), Heartbeat (12),
LeaveGroup (13), ListGroups (16), DescribeGroups (15) and DeleteGroups (42); the offset APIs are
in `handlers_offsets`.

Membership, groups and offsets are the `GroupCoordinator`'s (and its metadata manager's). These
handlers translate between the wire versions and the coordinator. Every decision that depends on
request order happens synchronously, before a handler returns its awaitable: the socket server
dispatches a connection's requests in order but runs their awaitables concurrently, and a client
that pipelines an OffsetCommit and a LeaveGroup must have its commit judged before it leaves.
Only appends to the offsets topic and parked JoinGroup/SyncGroup answers are awaited.

FindCoordinator answers from any broker: the leader of the group's `__consumer_offsets`
partition, as Kafka does. When the topic does not exist yet, the broker creates it
(`GroupServices.ensure_offsets_topic`) and answers COORDINATOR_NOT_AVAILABLE until it has a
leader; every other group API answers NOT_COORDINATOR unless this broker leads the group's
partition (COORDINATOR_LOAD_IN_PROGRESS while it loads it). Transaction coordinators (key type 1)
do not exist here: INVALID_REQUEST.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kio.schema.errors import ErrorCode

from odradek.coordinator.find_coordinator import (
    ClusterMetadata,
    coordinator_unavailable,
    find_coordinator_response,
    locate_coordinator,
)
from odradek.coordinator.group.coordinator import (
    GroupCoordinator,
    GroupSummary,
    JoinRequest,
    JoinResult,
    LeavingMember,
    SyncResult,
)
from odradek.coordinator.group.placement import OFFSETS_TOPIC
from odradek.protocol.build import build_response

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext

log = logging.getLogger(__name__)

T = TypeVar("T")

GROUP_KEY_TYPE = 0
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
# Kafka's AclOperation codes a group allows: READ (3), DELETE (6), DESCRIBE (8). With no
# authorizer, every one of them is allowed.
GROUP_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)


class GroupServices(Protocol):
    """What the group APIs need from the broker that answers them (`Broker` has all three)."""

    @property
    def group_coordinator(self) -> GroupCoordinator: ...

    @property
    def metadata_cache(self) -> ClusterMetadata: ...

    def ensure_offsets_topic(self) -> None:
        """Start creating `__consumer_offsets` if it does not exist (and enough brokers live)."""
        ...


def _coordinator(services: GroupServices) -> GroupCoordinator:
    return services.group_coordinator


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
    manager = _coordinator(services).manager
    key_type = int(getattr(request, "key_type", GROUP_KEY_TYPE))

    def find(key: str) -> dict[str, Any]:
        if key_type != GROUP_KEY_TYPE:
            found = coordinator_unavailable(key)
            found["error_code"] = ErrorCode.invalid_request
            found["error_message"] = f"coordinator key type {key_type} is not supported"
            return found
        return locate_coordinator(
            cache,
            key,
            OFFSETS_TOPIC,
            manager.partition_of,
            services.ensure_offsets_topic,
            "the group's offsets partition",
        )

    return find_coordinator_response(header, request, find)


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
# ListGroups, DescribeGroups, DeleteGroups


def handle_list_groups(services: GroupServices, context: RequestContext, request: Any) -> Any:
    """The groups whose offsets partition this broker leads: with members, or with committed
    offsets only (Empty, no protocol type, as Kafka lists them)."""
    header = context.header
    states = [s.lower() for s in (getattr(request, "states_filter", None) or ())]
    error, listed = _coordinator(services).list_groups(states)
    groups = [
        {"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state}
        for g in sorted(listed, key=lambda g: g.group_id)
    ]
    return build_response(header, {"throttle_time": 0, "error_code": error, "groups": groups})


def _described(group_id: str, error: ErrorCode, summary: GroupSummary) -> dict[str, Any]:
    return {
        "error_code": error,
        "group_id": group_id,
        "group_state": summary.state if error is ErrorCode.none else "",
        "protocol_type": summary.protocol_type,
        "protocol_data": summary.protocol,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "member_metadata": m.metadata,
                "member_assignment": m.assignment,
            }
            for m in summary.members
        ],
    }


def handle_describe_groups(services: GroupServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    coordinator = _coordinator(services)
    include_operations = bool(getattr(request, "include_authorized_operations", False))
    groups = []
    for group_id in request.groups:
        error, summary = coordinator.describe_group(group_id)
        entry = _described(group_id, error, summary)
        entry["authorized_operations"] = (
            GROUP_AUTHORIZED_OPERATIONS if include_operations else AUTHORIZED_OPERATIONS_OMITTED
        )
        groups.append(entry)
    return build_response(header, {"throttle_time": 0, "groups": groups})


def handle_delete_groups(services: GroupServices, context: RequestContext, request: Any) -> Any:
    """Delete Empty groups with their committed offsets (tombstones in the offsets topic)."""
    header = context.header
    names = list(dict.fromkeys(request.groups_names))
    decided = _coordinator(services).delete_groups(names)
    results = [{"group_id": group_id, "error_code": decided[group_id]} for group_id in names]
    return build_response(header, {"throttle_time": 0, "results": results})
