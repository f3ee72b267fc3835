"""ACLs through the Kafka protocol (CreateAcls, DescribeAcls, DeleteAcls v1-3), for `odradek acls`
and the console's ACLs page.

`AclAdmin.describe` answers the bindings matching a filter, grouped by resource pattern;
`create` adds bindings; `delete` removes those matching `delete_filter`s. A broker without an
authorizer answers SECURITY_DISABLED, raised as `KafkaResponseError` like every refusal. The
principal asking needs Describe (listing) or Alter (changes) on the cluster.

Concurrency: owned by one event loop, like `AdminClient`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.admin.client import AdminClient, KafkaResponseError
from odradek.errors import OperatorError
from odradek.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from odradek.security.api_acls import CREATE_ACLS, DELETE_ACLS, DESCRIBE_ACLS

MAX_VERSION = 3
Op = AclOperation


class AclAdmin(AdminClient):
    async def _version(self, api_key: int) -> int:
        version = await self.supported_version(api_key, MAX_VERSION)
        if version is None or version < 1:
            raise OperatorError("the broker does not offer the ACL APIs (v1+)")
        return version

    async def describe(
        self,
        resource_type: ResourceType = ResourceType.ANY,
        name: str | None = None,
        pattern_type: PatternType = PatternType.ANY,
        principal: str | None = None,
    ) -> dict[ResourcePattern, list[AccessControlEntry]]:
        response = await self._send(
            self.bootstrap,
            DESCRIBE_ACLS,
            await self._version(DESCRIBE_ACLS),
            {
                "resource_type_filter": int(resource_type),
                "resource_name_filter": name,
                "pattern_type_filter": int(pattern_type),
                "principal_filter": principal,
                "host_filter": None,
                "operation": int(Op.ANY),
                "permission_type": int(AclPermissionType.ANY),
            },
        )
        if response.error_code != ErrorCode.none:
            raise KafkaResponseError(response.error_code, response.error_message)
        found: dict[ResourcePattern, list[AccessControlEntry]] = {}
        for resource in response.resources:
            pattern = ResourcePattern(
                ResourceType(resource.resource_type),
                resource.resource_name,
                PatternType(resource.pattern_type),
            )
            found[pattern] = sorted(
                AccessControlEntry(
                    acl.principal,
                    acl.host,
                    AclOperation(acl.operation),
                    AclPermissionType(acl.permission_type),
                )
                for acl in resource.acls
            )
        return found

    async def create(self, bindings: Sequence[AclBinding]) -> None:
        response = await self._send(
            self.bootstrap,
            CREATE_ACLS,
            await self._version(CREATE_ACLS),
            {
                "creations": [
                    {
                        "resource_type": int(b.pattern.resource_type),
                        "resource_name": b.pattern.name,
                        "resource_pattern_type": int(b.pattern.pattern_type),
                        "principal": b.entry.principal,
                        "host": b.entry.host,
                        "operation": int(b.entry.operation),
                        "permission_type": int(b.entry.permission_type),
                    }
                    for b in bindings
                ]
            },
        )
        for result in response.results:
            if result.error_code != ErrorCode.none:
                raise KafkaResponseError(result.error_code, result.error_message)

    async def delete(self, filters: Sequence[dict[str, Any]]) -> int:
        response = await self._send(
            self.bootstrap, DELETE_ACLS, await self._version(DELETE_ACLS), {"filters": filters}
        )
        deleted = 0
        for result in response.filter_results:
            if result.error_code != ErrorCode.none:
                raise KafkaResponseError(result.error_code, result.error_message)
            for acl in result.matching_acls:
                if acl.error_code != ErrorCode.none:
                    raise KafkaResponseError(acl.error_code, acl.error_message)
                deleted += 1
        return deleted


def delete_filter(pattern: ResourcePattern, entry: AccessControlEntry | None) -> dict[str, Any]:
    """A DeleteAcls filter matching exactly `pattern` and `entry` (every entry when None)."""
    return {
        "resource_type_filter": int(pattern.resource_type),
        "resource_name_filter": pattern.name,
        "pattern_type_filter": int(pattern.pattern_type),
        "principal_filter": entry.principal if entry else None,
        "host_filter": entry.host if entry else None,
        "operation": int(entry.operation) if entry else int(Op.ANY),
        "permission_type": int(entry.permission_type) if entry else int(AclPermissionType.ANY),
    }
