"""The ACL authorizer: one question, `authorize(principal, host, operation, resource)`, answered from
an in-memory cache of every ACL in the cluster, with Kafka's AclAuthorizer semantics (ZooKeeper mode,
3.x).

The decision for a literal resource `R` of type `T` named `n` (the order matters):

1. A principal in `super.users` is allowed everything.
2. The ACLs that apply to `R` are those on the patterns `T` LITERAL `n`, `T` LITERAL `*` and
   every `T` PREFIXED `p` where `n` starts with `p`, whatever their principal. If there are none,
   the answer is `allow.everyone.if.no.acl.found` (default false).
3. An ACL *matches* when its principal is the asker's or `User:*`, its host is the asker's IP or
   `*`, and its operation is the one asked or ALL.
4. Any matching DENY refuses (deny beats allow, whatever the patterns' specificity).
5. Otherwise a matching ALLOW permits. An ALLOW of READ, WRITE, DELETE or ALTER also permits
   DESCRIBE; an ALLOW of ALTER_CONFIGS also permits DESCRIBE_CONFIGS. Implication works only for
   ALLOW: DENY READ does not deny DESCRIBE.
6. No matching ALLOW: refused.

`authorize_by_resource_type` answers "may the principal do `operation` on *some* resource of this
type?" (KIP-679: an idempotent producer needs IDEMPOTENT_WRITE on the cluster *or* WRITE on any
topic), with Kafka's rule, including its quirks: DENY on the LITERAL `*` refuses; else
`allow.everyone.if.no.acl.found` allows (even if other ACLs exist); else an ALLOW on a literal name
or prefix that no DENY prefix dominates (a DENY prefix that is a prefix of it) and, for a literal, no
DENY on the same literal, allows. Implied operations are not considered here.

Host matching compares the ACL's host with the client's IP address as text; when both are IP
addresses they are compared as addresses, so `::1` and `0:0:0:0:0:0:0:1` (Java's spelling) agree.

Concurrency: single-threaded. The cache is mutated only by the task that applies ZooKeeper change
notifications (`odradek.security.acl_store`), on the event loop that also calls `authorize`; since
`authorize` never awaits, it always sees a consistent cache.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache

from odradek.security.acl import (
    WILDCARD_HOST,
    WILDCARD_RESOURCE,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    Resource,
    ResourcePattern,
    ResourceType,
    allowing_operations,
)
from odradek.security.principal import WILDCARD_PRINCIPAL, KafkaPrincipal, parse_super_users

# Kafka logs every decision to `kafka.authorizer.logger`: denials of explicitly requested resources
# at INFO, the rest at DEBUG. Operators grep for this logger name.
audit_log = logging.getLogger("odradek.authorizer")

UNKNOWN_ZK_VERSION = -1
_WILDCARD_PRINCIPAL_TEXT = str(WILDCARD_PRINCIPAL)


@dataclass(frozen=True, slots=True)
class VersionedAcls:
    """The ACLs stored in one resource znode and the znode's version (-1: no znode), which the next
    conditional write names."""

    acls: frozenset[AccessControlEntry]
    zk_version: int

    @property
    def exists(self) -> bool:
        return self.zk_version != UNKNOWN_ZK_VERSION


NO_ACLS = VersionedAcls(frozenset(), UNKNOWN_ZK_VERSION)


class AclCache:
    """Every ACL of the cluster, by resource pattern, as last read from ZooKeeper.

    Literal and prefixed patterns are indexed per resource type by name, so the ACLs that apply to
    a resource are found with one lookup per prefix length of its name (topic names have at most
    249 characters), not by scanning every pattern.
    """

    def __init__(self) -> None:
        # Incremented by every update: answers memoised per principal (Metadata) are keyed by it.
        self.version = 0
        self._by_pattern: dict[ResourcePattern, VersionedAcls] = {}
        self._literal: dict[ResourceType, dict[str, frozenset[AccessControlEntry]]] = {}
        self._prefixed: dict[ResourceType, dict[str, frozenset[AccessControlEntry]]] = {}

    def _index(
        self, pattern_type: PatternType
    ) -> dict[ResourceType, dict[str, frozenset[AccessControlEntry]]]:
        return self._literal if pattern_type is PatternType.LITERAL else self._prefixed

    def update(self, pattern: ResourcePattern, acls: VersionedAcls) -> None:
        """Store what ZooKeeper holds for `pattern` (an empty set removes it)."""
        index = self._index(pattern.pattern_type).setdefault(pattern.resource_type, {})
        self.version += 1
        if acls.acls:
            self._by_pattern[pattern] = acls
            index[pattern.name] = acls.acls
        else:
            self._by_pattern.pop(pattern, None)
            index.pop(pattern.name, None)

    def get(self, pattern: ResourcePattern) -> VersionedAcls:
        return self._by_pattern.get(pattern, NO_ACLS)

    def __contains__(self, pattern: object) -> bool:
        return pattern in self._by_pattern

    def __len__(self) -> int:
        return len(self._by_pattern)

    def patterns(self) -> list[ResourcePattern]:
        return sorted(self._by_pattern)

    def items(self) -> Iterator[tuple[ResourcePattern, VersionedAcls]]:
        return iter(sorted(self._by_pattern.items()))

    def acls_for(self, resource: Resource) -> list[AccessControlEntry]:
        """Every ACL that applies to `resource` (rule 2 above), whatever its principal."""
        result: list[AccessControlEntry] = []
        literal = self._literal.get(resource.resource_type)
        if literal:
            result.extend(literal.get(WILDCARD_RESOURCE, ()))
            if resource.name != WILDCARD_RESOURCE:
                result.extend(literal.get(resource.name, ()))
        prefixed = self._prefixed.get(resource.resource_type)
        if prefixed:
            name = resource.name
            for length in range(1, len(name) + 1):
                acls = prefixed.get(name[:length])
                if acls:
                    result.extend(acls)
        return result

    def entries_of_type(
        self, resource_type: ResourceType
    ) -> Iterator[tuple[ResourcePattern, AccessControlEntry]]:
        for pattern_type, index in (
            (PatternType.LITERAL, self._literal),
            (PatternType.PREFIXED, self._prefixed),
        ):
            for name, acls in index.get(resource_type, {}).items():
                pattern = ResourcePattern(resource_type, name, pattern_type)
                for acl in acls:
                    yield pattern, acl

    def bindings(self, binding_filter: AclBindingFilter) -> list[AclBinding]:
        """DescribeAcls: every stored binding the filter matches, sorted."""
        result = []
        for pattern, versioned in self._by_pattern.items():
            if not binding_filter.pattern.matches(pattern):
                continue
            for entry in versioned.acls:
                if binding_filter.entry.matches(entry):
                    result.append(AclBinding(pattern, entry))
        return sorted(result)


@lru_cache(maxsize=4096)
def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def host_matches(acl_host: str, client_host: str) -> bool:
    if acl_host in (WILDCARD_HOST, client_host):
        return True
    acl_ip = _ip(acl_host)
    return acl_ip is not None and acl_ip == _ip(client_host)


def entry_matches(
    entry: AccessControlEntry,
    principal_text: str,
    host: str,
    operation: AclOperation,
    permission_type: AclPermissionType,
) -> bool:
    """Rule 3: permission, principal (or `User:*`), operation (or ALL) and host (or `*`)."""
    return (
        entry.permission_type == permission_type
        and (entry.principal == principal_text or entry.principal == _WILDCARD_PRINCIPAL_TEXT)
        and (entry.operation == operation or entry.operation is AclOperation.ALL)
        and host_matches(entry.host, host)
    )


def decide(
    acls: Iterable[AccessControlEntry],
    principal: KafkaPrincipal,
    host: str,
    operation: AclOperation,
    *,
    allow_everyone_if_no_acl_found: bool,
) -> bool:
    """Rules 2-6 for the ACLs that apply to one resource (super users are the caller's job)."""
    acls = list(acls)
    if not acls:
        return allow_everyone_if_no_acl_found
    text = str(principal)
    for entry in acls:
        if entry_matches(entry, text, host, operation, AclPermissionType.DENY):
            return False
    allowing = allowing_operations(operation)
    return any(
        entry_matches(entry, text, host, allowed, AclPermissionType.ALLOW)
        for entry in acls
        for allowed in allowing
    )


class AclAuthorizer:
    """`authorize` and `authorize_by_resource_type` over an `AclCache`.

    Built from broker properties with `from_properties` (`super.users`,
    `allow.everyone.if.no.acl.found`); the cache is shared with the `AclStore` that keeps it
    current. Call from the event loop thread only (see the module docstring).
    """

    def __init__(
        self,
        cache: AclCache,
        *,
        super_users: Iterable[KafkaPrincipal] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self.cache = cache
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found

    @classmethod
    def from_properties(cls, properties: Mapping[str, str], cache: AclCache) -> AclAuthorizer:
        allow = str(properties.get("allow.everyone.if.no.acl.found", "false")).strip().lower()
        return cls(
            cache,
            super_users=parse_super_users(properties.get("super.users")),
            allow_everyone_if_no_acl_found=allow == "true",
        )

    def is_super_user(self, principal: KafkaPrincipal) -> bool:
        return principal in self.super_users

    def authorize(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource: Resource,
        *,
        log_if_denied: bool = True,
    ) -> bool:
        """May `principal`, connected from `host` (an IP address as text), do `operation` on
        `resource`? `log_if_denied=False` for filtering (Metadata of all topics, ListGroups),
        where a refusal is expected and logged at DEBUG only, as Kafka does."""
        allowed = self.is_super_user(principal) or decide(
            self.cache.acls_for(resource),
            principal,
            host,
            operation,
            allow_everyone_if_no_acl_found=self.allow_everyone_if_no_acl_found,
        )
        self._audit(principal, host, operation, str(resource), allowed, log_if_denied)
        return allowed

    def authorize_by_resource_type(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        """May `principal` do `operation` on at least one resource of `resource_type`? (KIP-679;
        the rule is in the module docstring.)"""
        if operation in (AclOperation.ANY, AclOperation.UNKNOWN):
            raise ValueError(f"operation {operation.name} cannot be authorized")
        if resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            raise ValueError(f"resource type {resource_type.name} cannot be authorized")
        allowed = self._by_resource_type(principal, host, operation, resource_type)
        self._audit(principal, host, operation, f"{resource_type.pascal_name}:*any*", allowed, True)
        return allowed

    def _by_resource_type(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        if self.is_super_user(principal):
            return True
        text = str(principal)
        deny_literals: set[str] = set()
        deny_prefixes: set[str] = set()
        allow_literals: set[str] = set()
        allow_prefixes: set[str] = set()
        for pattern, entry in self.cache.entries_of_type(resource_type):
            literal = pattern.pattern_type is PatternType.LITERAL
            if entry_matches(entry, text, host, operation, AclPermissionType.DENY):
                (deny_literals if literal else deny_prefixes).add(pattern.name)
            elif entry_matches(entry, text, host, operation, AclPermissionType.ALLOW):
                (allow_literals if literal else allow_prefixes).add(pattern.name)
        if WILDCARD_RESOURCE in deny_literals:
            return False
        if self.allow_everyone_if_no_acl_found:
            return True

        def dominated(name: str) -> bool:
            return any(name[:length] in deny_prefixes for length in range(len(name) + 1))

        if any(not dominated(prefix) for prefix in allow_prefixes):
            return True
        return any(
            literal == WILDCARD_RESOURCE
            or (literal not in deny_literals and not dominated(literal))
            for literal in allow_literals
        )

    @staticmethod
    def _audit(
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource: str,
        allowed: bool,
        log_if_denied: bool,
    ) -> None:
        if allowed:
            if audit_log.isEnabledFor(logging.DEBUG):
                audit_log.debug(
                    "Principal = %s is Allowed Operation = %s from host = %s on resource = %s",
                    principal,
                    operation.pascal_name,
                    host,
                    resource,
                )
            return
        level = logging.INFO if log_if_denied else logging.DEBUG
        if audit_log.isEnabledFor(level):
            audit_log.log(
                level,
                "Principal = %s is Denied Operation = %s from host = %s on resource = %s",
                principal,
                operation.pascal_name,
                host,
                resource,
            )
