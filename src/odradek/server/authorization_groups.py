"""Authorization of the consumer-group APIs, in front of the group coordinator's handlers.

The group coordinator (`odradek.coordinator.group`) sits beside `odradek.security` in the layering
and knows nothing of ACLs; `authorized_group_handlers` wraps each of its handlers so that the
coordinator only ever sees what the principal may touch (`odradek.security.api_acls`):

| API | check | refused |
|---|---|---|
| JoinGroup, SyncGroup, Heartbeat, LeaveGroup | READ on the group | the whole request: GROUP_AUTHORIZATION_FAILED |
| OffsetCommit | READ on the group, then READ on each topic | whole request / those topics' partitions: TOPIC_AUTHORIZATION_FAILED |
| OffsetFetch | DESCRIBE on each group, then DESCRIBE on each named topic; all-topics answers leave out undescribable topics | per group / per topic |
| FindCoordinator | DESCRIBE on the group (key type 0) or transactional id (1), per key | that key |

FindCoordinator's answer is also given the coordinator's address on the listener the client came
in on (the coordinator itself knows brokers by their inter-broker address).
| DescribeGroups, DeleteGroups | DESCRIBE / DELETE on each group | that group |
| OffsetDelete | DELETE on the group, then READ on each topic | whole request / those topics' partitions: TOPIC_AUTHORIZATION_FAILED |
| ListGroups | DESCRIBE on the cluster lists every group; otherwise only describable groups | silently left out |

A refused part of a request is taken out before the handler runs and answered here; the handler's
answer and these are merged into one response. Only the wire schemas are relied on (field names
of Kafka's requests and responses), not the coordinator's internals.

Concurrency: event loop thread, like every handler.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.protocol.build import build_response
from odradek.protocol.codec import ApiKey
from odradek.server.authorization import (
    DELETE,
    DESCRIBE,
    GROUP,
    GROUP_AUTHORIZATION_FAILED,
    READ,
    TOPIC,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID,
    error_for,
)

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

Handler = Callable[[Any, "RequestContext", Any], Any]
GROUP_KEY, TRANSACTION_KEY = 0, 1


def _then(result: Any, finish: Callable[[Any], Any]) -> Any:
    """`finish(result)`, after awaiting it if the handler answered later."""
    if not inspect.isawaitable(result):
        return finish(result)

    async def later() -> Any:
        return finish(await result)

    return later()


def _merge(response: Any, field: str, extra: list[Any]) -> Any:
    if not extra:
        return response
    return dataclasses.replace(response, **{field: tuple(getattr(response, field)) + tuple(extra)})


# -- whole-request group checks ------------------------------------------------------------------


def _group_membership(handler: Handler) -> Handler:
    """JoinGroup, SyncGroup, Heartbeat, LeaveGroup: READ on the group."""

    def wrapped(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
        if broker.authorizer.allowed(context, READ, GROUP, request.group_id):
            return handler(broker, context, request)
        return build_response(
            context.header,
            {
                "error_code": GROUP_AUTHORIZATION_FAILED,
                "generation_id": -1,
                "member_id": getattr(request, "member_id", ""),
                "members": (),
                "assignment": b"",
            },
        )

    return wrapped


# -- OffsetCommit ----------------------------------------------------------------------------------


def _partition_errors(topics: Any, code: ErrorCode, **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": topic.name,
            "partitions": [
                {"partition_index": p.partition_index, "error_code": code, **extra}
                for p in topic.partitions
            ],
        }
        for topic in topics
    ]


def _offset_commit(handler: Handler) -> Handler:
    def wrapped(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
        header = context.header
        authorizer = broker.authorizer
        if not authorizer.allowed(context, READ, GROUP, request.group_id):
            return build_response(
                header, {"topics": _partition_errors(request.topics, GROUP_AUTHORIZATION_FAILED)}
            )
        allowed = authorizer.filter(context, READ, TOPIC, {t.name for t in request.topics})
        refused = [t for t in request.topics if t.name not in allowed]
        if not refused:
            return handler(broker, context, request)
        errors = build_response(
            header, {"topics": _partition_errors(refused, TOPIC_AUTHORIZATION_FAILED)}
        ).topics
        kept = tuple(t for t in request.topics if t.name in allowed)
        if not kept:
            return build_response(header, {"topics": errors})
        result = handler(broker, context, dataclasses.replace(request, topics=kept))
        return _then(result, lambda response: _merge(response, "topics", list(errors)))

    return wrapped


def _offset_delete(handler: Handler) -> Handler:
    def wrapped(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
        header = context.header
        authorizer = broker.authorizer
        if not authorizer.allowed(context, DELETE, GROUP, request.group_id):
            return build_response(
                header, {"error_code": GROUP_AUTHORIZATION_FAILED, "throttle_time": 0, "topics": ()}
            )
        allowed = authorizer.filter(context, READ, TOPIC, {t.name for t in request.topics})
        refused = [t for t in request.topics if t.name not in allowed]
        if not refused:
            return handler(broker, context, request)
        errors = build_response(
            header,
            {
                "error_code": ErrorCode.none,
                "throttle_time": 0,
                "topics": _partition_errors(refused, TOPIC_AUTHORIZATION_FAILED),
            },
        ).topics
        kept = tuple(t for t in request.topics if t.name in allowed)
        result = handler(broker, context, dataclasses.replace(request, topics=kept))

        def finish(response: Any) -> Any:
            if response.error_code != ErrorCode.none:
                return response
            return _merge(response, "topics", list(errors))

        return _then(result, finish)

    return wrapped


# -- OffsetFetch -----------------------------------------------------------------------------------


def _fetch_errors(topics: Any, code: ErrorCode) -> list[dict[str, Any]]:
    return [
        {
            "name": topic.name,
            "partitions": [
                {
                    "partition_index": index,
                    "committed_offset": -1,
                    "committed_leader_epoch": -1,
                    "metadata": "",
                    "error_code": code,
                }
                for index in topic.partition_indexes
            ],
        }
        for topic in topics or ()
    ]


def _filter_fetch_group(
    broker: BrokerServices, context: RequestContext, topics: Any
) -> tuple[Any, list[dict[str, Any]], set[str] | None]:
    """(topics to pass on, error entries for refused named topics, names to keep in an
    all-topics answer or None)."""
    if topics is None:
        return None, [], None
    allowed = broker.authorizer.filter(context, DESCRIBE, TOPIC, {t.name for t in topics})
    refused = [t for t in topics if t.name not in allowed]
    return (
        tuple(t for t in topics if t.name in allowed),
        _fetch_errors(refused, TOPIC_AUTHORIZATION_FAILED),
        None,
    )


def _offset_fetch(handler: Handler) -> Handler:
    def wrapped(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
        if context.header.api_version >= 8:
            return _offset_fetch_groups(handler, broker, context, request)
        header = context.header
        authorizer = broker.authorizer
        if not authorizer.allowed(context, DESCRIBE, GROUP, request.group_id):
            return build_response(
                header,
                {
                    "error_code": GROUP_AUTHORIZATION_FAILED,
                    "topics": _fetch_errors(request.topics, GROUP_AUTHORIZATION_FAILED),
                },
            )
        kept, errors, _ = _filter_fetch_group(broker, context, request.topics)
        if request.topics is not None and not errors:
            return handler(broker, context, request)
        if request.topics is not None and not kept:
            return build_response(header, {"error_code": ErrorCode.none, "topics": errors})
        if request.topics is not None:
            request = dataclasses.replace(request, topics=kept)
        error_topics = build_response(header, {"topics": errors}).topics

        def finish(response: Any) -> Any:
            if request.topics is None:  # all topics: leave out what may not be described
                return _only_describable(broker, context, response)
            return _merge(response, "topics", list(error_topics))

        return _then(handler(broker, context, request), finish)

    return wrapped


def _only_describable(broker: BrokerServices, context: RequestContext, entry: Any) -> Any:
    allowed = broker.authorizer.filter(context, DESCRIBE, TOPIC, {t.name for t in entry.topics})
    return dataclasses.replace(entry, topics=tuple(t for t in entry.topics if t.name in allowed))


def _offset_fetch_groups(
    handler: Handler, broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    refused_groups: list[dict[str, Any]] = []
    kept_groups = []
    topic_errors: dict[str, list[dict[str, Any]]] = {}
    for group in request.groups:
        if not broker.authorizer.allowed(context, DESCRIBE, GROUP, group.group_id):
            refused_groups.append(
                {"group_id": group.group_id, "error_code": GROUP_AUTHORIZATION_FAILED, "topics": ()}
            )
            continue
        kept, errors, _ = _filter_fetch_group(broker, context, group.topics)
        topic_errors[group.group_id] = errors
        kept_groups.append(dataclasses.replace(group, topics=kept))
    extra = build_response(header, {"groups": refused_groups}).groups
    if not kept_groups:
        return build_response(header, {"groups": refused_groups})
    all_topics = {g.group_id for g in request.groups if g.topics is None}

    def finish(response: Any) -> Any:
        groups = []
        for group in response.groups:
            if group.group_id in all_topics:
                group = _only_describable(broker, context, group)
            errors = topic_errors.get(group.group_id)
            if errors:
                nested = build_response(
                    header, {"groups": [{"group_id": group.group_id, "topics": errors}]}
                ).groups[0]
                group = _merge(group, "topics", list(nested.topics))
            groups.append(group)
        return dataclasses.replace(response, groups=tuple(groups) + tuple(extra))

    result = handler(broker, context, dataclasses.replace(request, groups=tuple(kept_groups)))
    return _then(result, finish)


# -- FindCoordinator, DescribeGroups, DeleteGroups, ListGroups -----------------------------------


def _coordinator_key_allowed(
    broker: BrokerServices, context: RequestContext, key_type: int, key: str
) -> tuple[bool, ErrorCode]:
    resource_type = TRANSACTIONAL_ID if key_type == TRANSACTION_KEY else GROUP
    allowed = broker.authorizer.allowed(context, DESCRIBE, resource_type, key)
    return allowed, error_for(resource_type)


def _on_listener(broker: BrokerServices, context: RequestContext, entry: Any) -> Any:
    """A coordinator as reached on the client's own listener: the coordinator answers with the
    inter-broker listener's address, which a client of another listener cannot use."""
    if entry.node_id < 0:
        return entry
    endpoint = broker.metadata_cache.get_broker(entry.node_id, context.listener)
    if endpoint is None:
        return dataclasses.replace(
            entry, error_code=ErrorCode.coordinator_not_available, node_id=-1, host="", port=-1
        )
    return dataclasses.replace(entry, host=endpoint.host, port=endpoint.port)


def _find_coordinator(handler: Handler) -> Handler:
    def wrapped(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
        header = context.header
        key_type = int(getattr(request, "key_type", GROUP_KEY))
        refused_entry = {"node_id": -1, "host": "", "port": -1, "error_message": None}
        if header.api_version < 4:
            allowed, code = _coordinator_key_allowed(broker, context, key_type, request.key)
            if allowed:
                return _then(
                    handler(broker, context, request),
                    lambda response: _on_listener(broker, context, response),
                )
            return build_response(header, {"error_code": code, **refused_entry})
        kept, refused = [], []
        for key in request.coordinator_keys:
            allowed, code = _coordinator_key_allowed(broker, context, key_type, key)
            if allowed:
                kept.append(key)
            else:
                refused.append({"key": key, "error_code": code, **refused_entry})
        extra = build_response(header, {"coordinators": refused}).coordinators
        if not kept:
            return build_response(header, {"coordinators": refused})

        def finish(response: Any) -> Any:
            found = [_on_listener(broker, context, entry) for entry in response.coordinators]
            return dataclasses.replace(response, coordinators=tuple(found) + tuple(extra))

        result = handler(broker, context, dataclasses.replace(request, coordinator_keys=kept))
        return _then(result, finish)

    return wrapped


def _per_group(
    operation: Any, request_field: str, response_field: str, refused: Callable[[str], dict]
) -> Callable[[Handler], Handler]:
    def wrap(handler: Handler) -> Handler:
        def wrapped(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
            header = context.header
            names = list(getattr(request, request_field))
            allowed = [n for n in names if broker.authorizer.allowed(context, operation, GROUP, n)]
            if len(allowed) == len(names):
                return handler(broker, context, request)
            errors = [refused(n) for n in names if n not in allowed]
            extra = getattr(build_response(header, {response_field: errors}), response_field)
            if not allowed:
                return build_response(header, {response_field: errors})
            result = handler(
                broker, context, dataclasses.replace(request, **{request_field: tuple(allowed)})
            )
            return _then(result, lambda response: _merge(response, response_field, list(extra)))

        return wrapped

    return wrap


_describe_groups = _per_group(
    DESCRIBE,
    "groups",
    "groups",
    lambda name: {
        "error_code": GROUP_AUTHORIZATION_FAILED,
        "group_id": name,
        "group_state": "",
        "protocol_type": "",
        "protocol_data": "",
        "members": (),
    },
)
_delete_groups = _per_group(
    DELETE,
    "groups_names",
    "results",
    lambda name: {"group_id": name, "error_code": GROUP_AUTHORIZATION_FAILED},
)


def _list_groups(handler: Handler) -> Handler:
    def wrapped(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
        if broker.authorizer.cluster(context, DESCRIBE, log_if_denied=False):
            return handler(broker, context, request)

        def finish(response: Any) -> Any:
            allowed = broker.authorizer.filter(
                context, DESCRIBE, GROUP, {g.group_id for g in response.groups}
            )
            return dataclasses.replace(
                response, groups=tuple(g for g in response.groups if g.group_id in allowed)
            )

        return _then(handler(broker, context, request), finish)

    return wrapped


_WRAPPERS: dict[int, Callable[[Handler], Handler]] = {
    ApiKey.JOIN_GROUP: _group_membership,
    ApiKey.SYNC_GROUP: _group_membership,
    ApiKey.HEARTBEAT: _group_membership,
    ApiKey.LEAVE_GROUP: _group_membership,
    ApiKey.OFFSET_COMMIT: _offset_commit,
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.OFFSET_DELETE: _offset_delete,
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.DESCRIBE_GROUPS: _describe_groups,
    ApiKey.DELETE_GROUPS: _delete_groups,
    ApiKey.LIST_GROUPS: _list_groups,
}


def authorized_group_handlers(handlers: dict[int, Handler]) -> dict[int, Handler]:
    """`handlers` with every group API wrapped by its authorization (module docstring)."""
    return {
        api_key: (_WRAPPERS[api_key](handler) if api_key in _WRAPPERS else handler)
        for api_key, handler in handlers.items()
    }
