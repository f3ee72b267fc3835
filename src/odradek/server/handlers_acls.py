"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31): ACL administration, on any broker.

ACLs live in ZooKeeper (`odradek.security.acl_store`): CreateAcls and DeleteAcls write there
(compare-and-set per resource) and leave a change notification, so every broker's cache follows
within moments; DescribeAcls answers from this broker's cache. All three need the cluster's
DESCRIBE (DescribeAcls) or ALTER (the others); without an authorizer
(`authorizer.class.name` unset) they answer SECURITY_DISABLED, as Kafka does.

Codes are Kafka's (`odradek.security.acl`): resource types, pattern types, operations and permission
types travel as int8. A binding with an unknown or filter-only value, an empty name, a `/` in the
name or a Cluster resource not named `kafka-cluster` is refused with INVALID_REQUEST; a filter with
UNKNOWN values likewise.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.errors import KafkaError
from odradek.protocol.build import build_response
from odradek.security.acl import (
    AccessControlEntry,
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from odradek.server.authorization import ALTER, CLUSTER_AUTHORIZATION_FAILED, DESCRIBE

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

log = logging.getLogger(__name__)

SECURITY_DISABLED_MESSAGE = "No Authorizer is configured on the broker"


def _enum(cls: Any, value: int) -> Any:
    try:
        return cls(int(value))
    except ValueError:
        return cls.UNKNOWN


def _pattern_type(request: Any, field: str, version: int) -> PatternType:
    return _enum(PatternType, getattr(request, field, 3)) if version >= 1 else PatternType.LITERAL


def _error(e: Exception) -> tuple[ErrorCode, str]:
    if isinstance(e, KafkaError):
        return e.code, str(e)
    log.error("ACL update failed: %s", e)
    return ErrorCode.unknown_server_error, str(e)


def _filter(item: Any, version: int) -> AclBindingFilter:
    return AclBindingFilter(
        ResourcePatternFilter(
            _enum(ResourceType, item.resource_type_filter),
            item.resource_name_filter,
            _pattern_type(item, "pattern_type_filter", version),
        ),
        AccessControlEntryFilter(
            item.principal_filter,
            item.host_filter,
            _enum(AclOperation, item.operation),
            _enum(AclPermissionType, item.permission_type),
        ),
    )


def _unknown_in(binding_filter: AclBindingFilter) -> str | None:
    pattern, entry = binding_filter.pattern, binding_filter.entry
    for value in (
        pattern.resource_type,
        pattern.pattern_type,
        entry.operation,
        entry.permission_type,
    ):
        if value.is_unknown:
            return f"filter contains UNKNOWN elements ({type(value).__name__})"
    return None


def handle_describe_acls(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header

    def refuse(code: ErrorCode, message: str) -> Any:
        return build_response(header, {"error_code": code, "error_message": message})

    if not broker.authorizer.cluster(context, DESCRIBE):
        return refuse(CLUSTER_AUTHORIZATION_FAILED, "Authorization failed.")
    authorizer = broker.authorizer.authorizer
    if authorizer is None:
        return refuse(ErrorCode.security_disabled, SECURITY_DISABLED_MESSAGE)
    binding_filter = _filter(request, header.api_version)
    problem = _unknown_in(binding_filter)
    if problem is not None:
        return refuse(ErrorCode.invalid_request, problem)
    by_pattern: dict[ResourcePattern, list[AccessControlEntry]] = {}
    for binding in authorizer.cache.bindings(binding_filter):
        by_pattern.setdefault(binding.pattern, []).append(binding.entry)
    resources = [
        {
            "resource_type": int(pattern.resource_type),
            "resource_name": pattern.name,
            "pattern_type": int(pattern.pattern_type),
            "acls": [
                {
                    "principal": entry.principal,
                    "host": entry.host,
                    "operation": int(entry.operation),
                    "permission_type": int(entry.permission_type),
                }
                for entry in entries
            ],
        }
        for pattern, entries in by_pattern.items()
    ]
    return build_response(
        header,
        {"error_code": ErrorCode.none, "error_message": None, "resources": resources},
    )


def handle_create_acls(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    version = header.api_version

    def all_refused(code: ErrorCode, message: str) -> Any:
        return build_response(
            header,
            {
                "results": [
                    {"error_code": code, "error_message": message} for _ in request.creations
                ]
            },
        )

    if not broker.authorizer.cluster(context, ALTER):
        return all_refused(CLUSTER_AUTHORIZATION_FAILED, "Authorization failed.")
    store = broker.acl_store
    if store is None:
        return all_refused(ErrorCode.security_disabled, SECURITY_DISABLED_MESSAGE)
    bindings = [
        AclBinding(
            ResourcePattern(
                _enum(ResourceType, item.resource_type),
                item.resource_name,
                _pattern_type(item, "resource_pattern_type", version),
            ),
            AccessControlEntry(
                item.principal,
                item.host,
                _enum(AclOperation, item.operation),
                _enum(AclPermissionType, item.permission_type),
            ),
        )
        for item in request.creations
    ]

    async def create() -> Any:
        outcomes = await store.create_acls(bindings)
        results = []
        for outcome in outcomes:
            if outcome is None:
                results.append({"error_code": ErrorCode.none, "error_message": None})
            else:
                code, message = _error(outcome)
                results.append({"error_code": code, "error_message": message})
        return build_response(header, {"results": results})

    return create()


def handle_delete_acls(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    version = header.api_version

    def all_refused(code: ErrorCode, message: str) -> Any:
        return build_response(
            header,
            {
                "filter_results": [
                    {"error_code": code, "error_message": message, "matching_acls": ()}
                    for _ in request.filters
                ]
            },
        )

    if not broker.authorizer.cluster(context, ALTER):
        return all_refused(CLUSTER_AUTHORIZATION_FAILED, "Authorization failed.")
    store = broker.acl_store
    if store is None:
        return all_refused(ErrorCode.security_disabled, SECURITY_DISABLED_MESSAGE)
    filters = [_filter(item, version) for item in request.filters]

    async def delete() -> Any:
        valid = [f for f in filters if _unknown_in(f) is None]
        outcomes = iter(await store.delete_acls(valid) if valid else [])
        results = []
        for binding_filter in filters:
            problem = _unknown_in(binding_filter)
            if problem is not None:
                results.append(
                    {
                        "error_code": ErrorCode.invalid_request,
                        "error_message": problem,
                        "matching_acls": (),
                    }
                )
                continue
            matching = []
            for binding, error in next(outcomes):
                code, message = (ErrorCode.none, None) if error is None else _error(error)
                matching.append(
                    {
                        "error_code": code,
                        "error_message": message,
                        "resource_type": int(binding.pattern.resource_type),
                        "resource_name": binding.pattern.name,
                        "pattern_type": int(binding.pattern.pattern_type),
                        "principal": binding.entry.principal,
                        "host": binding.entry.host,
                        "operation": int(binding.entry.operation),
                        "permission_type": int(binding.entry.permission_type),
                    }
                )
            results.append(
                {"error_code": ErrorCode.none, "error_message": None, "matching_acls": matching}
            )
        return build_response(header, {"filter_results": results})

    return delete()
