"""Kafka's ACL vocabulary: resource types, pattern types, operations, permissions, bindings, filters.

The wire codes (CreateAcls, DescribeAcls, DeleteAcls carry them as int8) and the names are Kafka's
(`org.apache.kafka.common.acl`, `org.apache.kafka.common.resource`, 3.x):

| enum | codes |
|---|---|
| ResourceType | UNKNOWN 0, ANY 1, TOPIC 2, GROUP 3, CLUSTER 4, TRANSACTIONAL_ID 5, DELEGATION_TOKEN 6, USER 7 |
| PatternType | UNKNOWN 0, ANY 1, MATCH 2, LITERAL 3, PREFIXED 4 |
| AclOperation | UNKNOWN 0, ANY 1, ALL 2, READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12, CREATE_TOKENS 13, DESCRIBE_TOKENS 14 |
| AclPermissionType | UNKNOWN 0, ANY 1, DENY 2, ALLOW 3 |

Two spellings of each name exist and both matter for ZooKeeper compatibility:

* the *Pascal-case* name (`Topic`, `TransactionalId`, `ClusterAction`, `Allow`), Kafka's
  `SecurityUtils.resourceTypeName/operationName/permissionTypeName`: used in ACL znode paths
  (`/kafka-acl/Topic/t`) and in the ACL JSON (`"operation":"Read"`, `"permissionType":"Allow"`);
* the *enum* name (`TOPIC`, `PREFIXED`), Java's `Enum.toString()`: used in the change notifications
  (`TOPIC:t` under `/kafka-acl-changes`, `"resourceType":"TOPIC"` in the extended ones). Kafka parses
  those case-insensitively (`ResourceType.fromString` upper-cases), and so do we.

ANY and MATCH exist only in filters (DescribeAcls / DeleteAcls); a stored binding is always a concrete
resource type, LITERAL or PREFIXED, a concrete operation and ALLOW or DENY. `ResourcePattern.name` `*`
with LITERAL is the wildcard resource: it matches every resource of its type.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from odradek.security.errors import InvalidAclError
from odradek.security.principal import KafkaPrincipal

WILDCARD_RESOURCE = "*"
WILDCARD_HOST = "*"
CLUSTER_NAME = "kafka-cluster"  # the one Cluster resource's name (Kafka's CLUSTER_NAME)


def _pascal_case(enum_name: str) -> str:
    return "".join(part[:1].upper() + part[1:].lower() for part in enum_name.split("_"))


class _Named(enum.IntEnum):
    """An enum with Kafka's int8 wire code as value and both name spellings."""

    @property
    def pascal_name(self) -> str:
        """`Topic`, `ClusterAction`, `Allow`: as ZooKeeper paths and ACL JSON spell it."""
        return _pascal_case(self.name)

    @classmethod
    def from_pascal_name(cls, name: str) -> _Named:
        """Exact Pascal-case lookup (Kafka's SecurityUtils); UNKNOWN for anything else."""
        for member in cls:
            if member.pascal_name == name:
                return member
        return cls["UNKNOWN"]

    @classmethod
    def from_string(cls, name: str) -> _Named:
        """Case-insensitive enum-name lookup (Kafka's `fromString`); UNKNOWN for anything else."""
        return cls.__members__.get(name.upper(), cls["UNKNOWN"])

    @property
    def is_unknown(self) -> bool:
        return self.name == "UNKNOWN"


class ResourceType(_Named):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(_Named):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4

    @property
    def is_specific(self) -> bool:
        """LITERAL and PREFIXED: the only pattern types a stored ACL can have."""
        return self in (PatternType.LITERAL, PatternType.PREFIXED)


class AclOperation(_Named):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(_Named):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CONCRETE_RESOURCE_TYPES: tuple[ResourceType, ...] = tuple(
    t for t in ResourceType if t not in (ResourceType.UNKNOWN, ResourceType.ANY)
)
CONCRETE_OPERATIONS: tuple[AclOperation, ...] = tuple(
    o for o in AclOperation if o not in (AclOperation.UNKNOWN, AclOperation.ANY)
)

# An ALLOW of any of these operations also allows the key (Kafka's AclOperation javadoc and
# AclAuthorizer.allowAclExists). Only ALLOW implies: DENY READ does not deny DESCRIBE.
IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset(
        {
            AclOperation.DESCRIBE,
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.DELETE,
            AclOperation.ALTER,
        }
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset(
        {AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    ),
}


def allowing_operations(operation: AclOperation) -> frozenset[AclOperation]:
    """The operations whose ALLOW ACL allows `operation` (ALL is handled by the matcher)."""
    return IMPLIED_BY.get(operation, frozenset({operation}))


# Operations an ACL on each resource type may name (Kafka's AclEntry.supportedOperations), plus
# ALL, which Kafka accepts on every type.
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset(
        {
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.CREATE,
            AclOperation.DESCRIBE,
            AclOperation.DELETE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
        }
    ),
    ResourceType.GROUP: frozenset({AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}),
    ResourceType.CLUSTER: frozenset(
        {
            AclOperation.CREATE,
            AclOperation.CLUSTER_ACTION,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
            AclOperation.IDEMPOTENT_WRITE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE,
        }
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset({AclOperation.DESCRIBE, AclOperation.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({AclOperation.DESCRIBE}),
    ResourceType.USER: frozenset({AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS}),
}

_AUTHORIZATION_ERRORS: dict[ResourceType, ErrorCode] = {
    ResourceType.TOPIC: ErrorCode.topic_authorization_failed,
    ResourceType.GROUP: ErrorCode.group_authorization_failed,
    ResourceType.CLUSTER: ErrorCode.cluster_authorization_failed,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
    ResourceType.DELEGATION_TOKEN: ErrorCode.delegation_token_authorization_failed,
}


def authorization_error(resource_type: ResourceType) -> ErrorCode:
    """The error code of a refused operation on `resource_type` (Kafka's
    AclEntry.authorizationError). USER has none in Kafka (token APIs use the DELEGATION_TOKEN
    code), so it maps to DELEGATION_TOKEN_AUTHORIZATION_FAILED as KafkaApis answers it."""
    if resource_type is ResourceType.USER:
        return ErrorCode.delegation_token_authorization_failed
    try:
        return _AUTHORIZATION_ERRORS[resource_type]
    except KeyError:
        raise ValueError(f"no authorization error for resource type {resource_type.name}") from None


@dataclass(frozen=True, slots=True, order=True)
class Resource:
    """A concrete resource a request touches: what `authorize` is asked about (a topic name, a
    group id, the cluster). Never a pattern: `*` here is a topic literally named `*`."""

    resource_type: ResourceType
    name: str

    def __str__(self) -> str:
        return f"{self.resource_type.pascal_name}:{self.name}"


CLUSTER = Resource(ResourceType.CLUSTER, CLUSTER_NAME)


@dataclass(frozen=True, slots=True, order=True)
class ResourcePattern:
    """A stored pattern: a concrete type, a name (or `*`), LITERAL or PREFIXED."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType

    def __str__(self) -> str:
        return f"{self.resource_type.pascal_name}:{self.pattern_type.name}:{self.name}"


@dataclass(frozen=True, slots=True, order=True)
class AccessControlEntry:
    """Who (principal string, `User:*` for everyone), from where (host IP or `*`), may or may not
    (ALLOW/DENY) do what (operation). The principal is kept as the stored string, as Kafka's
    AccessControlEntry does; `kafka_principal` parses it."""

    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    @property
    def kafka_principal(self) -> KafkaPrincipal:
        return KafkaPrincipal.parse(self.principal)

    def __str__(self) -> str:
        return (
            f"(principal={self.principal}, host={self.host}, operation={self.operation.name}, "
            f"permissionType={self.permission_type.name})"
        )


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry


def validate_binding(binding: AclBinding) -> None:
    """Refuse what Kafka's broker refuses in CreateAcls (InvalidAclError, reported as
    INVALID_REQUEST): unknown or filter-only values, an empty resource name, a name containing '/'
    (it would become a znode path level), a Cluster resource not named `kafka-cluster`, a principal
    without a type. Like Kafka's broker, it does not check `SUPPORTED_OPERATIONS` (an ACL for an
    operation a type never asks for is useless but harmless); `check_supported_operation` is for
    the `acls` command, as kafka-acls.sh checks it."""
    pattern, entry = binding.pattern, binding.entry
    if pattern.resource_type not in CONCRETE_RESOURCE_TYPES:
        raise InvalidAclError(f"invalid resource type {pattern.resource_type.name}")
    if not pattern.pattern_type.is_specific:
        raise InvalidAclError(f"invalid pattern type {pattern.pattern_type.name}")
    if entry.operation not in CONCRETE_OPERATIONS:
        raise InvalidAclError(f"invalid operation {entry.operation.name}")
    if entry.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        raise InvalidAclError(f"invalid permission type {entry.permission_type.name}")
    if not pattern.name:
        raise InvalidAclError("empty resource name")
    if "/" in pattern.name:
        raise InvalidAclError(f"ACL binding contains invalid resource name: {pattern.name}")
    if pattern.resource_type is ResourceType.CLUSTER and pattern.name != CLUSTER_NAME:
        raise InvalidAclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if ":" not in entry.principal:
        raise InvalidAclError(f"invalid principal {entry.principal!r}: expected Type:name")
    if not entry.host:
        raise InvalidAclError("empty host")


def check_supported_operation(resource_type: ResourceType, operation: AclOperation) -> None:
    """InvalidAclError if `operation` is not one an ACL on `resource_type` can use (ALL always is)."""
    if operation is AclOperation.ALL:
        return
    supported = SUPPORTED_OPERATIONS.get(resource_type, frozenset())
    if operation not in supported:
        names = ", ".join(sorted(o.pascal_name for o in supported))
        raise InvalidAclError(
            f"ResourceType {resource_type.pascal_name} only supports operations {names}"
        )


@dataclass(frozen=True, slots=True)
class ResourcePatternFilter:
    """Which patterns a DescribeAcls / DeleteAcls filter selects. `name` None matches any name.

    Pattern type semantics (Kafka's ResourcePatternFilter.matches):
    * ANY: patterns of any pattern type whose name equals `name` exactly;
    * MATCH: every pattern that would apply to the literal resource `name`: the LITERAL `name`,
      the LITERAL wildcard `*`, and every PREFIXED pattern that `name` starts with;
    * LITERAL / PREFIXED: that pattern type and exactly that name.
    """

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY

    def matches(self, pattern: ResourcePattern) -> bool:
        if (
            self.resource_type is not ResourceType.ANY
            and self.resource_type != pattern.resource_type
        ):
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and (
            self.pattern_type != pattern.pattern_type
        ):
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, pattern.pattern_type):
            return self.name == pattern.name
        if pattern.pattern_type is PatternType.LITERAL:
            return self.name == pattern.name or pattern.name == WILDCARD_RESOURCE
        if pattern.pattern_type is PatternType.PREFIXED:
            return self.name.startswith(pattern.name)
        return False

    def indefinite_field(self) -> str | None:
        """Why the filter may match more than one pattern, or None if it names exactly one."""
        if self.resource_type is ResourceType.ANY:
            return "Resource type is ANY."
        if self.resource_type is ResourceType.UNKNOWN:
            return "Resource type is UNKNOWN."
        if self.name is None:
            return "Resource name is NULL."
        if self.pattern_type is PatternType.MATCH:
            return "Resource pattern type is MATCH."
        if self.pattern_type is PatternType.UNKNOWN:
            return "Resource pattern type is UNKNOWN."
        return None

    def candidate_patterns(self) -> tuple[ResourcePattern, ...]:
        """For a filter that names one resource (LITERAL, PREFIXED or ANY with a concrete type
        and a name), the stored patterns it can match: what DeleteAcls must read from ZooKeeper
        even when the local cache does not know them yet (Kafka's filterToResources)."""
        if self.indefinite_field() is not None or self.name is None:
            return ()
        if self.pattern_type is PatternType.ANY:
            return (
                ResourcePattern(self.resource_type, self.name, PatternType.LITERAL),
                ResourcePattern(self.resource_type, self.name, PatternType.PREFIXED),
            )
        return (ResourcePattern(self.resource_type, self.name, self.pattern_type),)


@dataclass(frozen=True, slots=True)
class AccessControlEntryFilter:
    """The entry half of a filter: None / ANY match everything (Kafka's AccessControlEntryFilter)."""

    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def matches(self, entry: AccessControlEntry) -> bool:
        if self.principal is not None and self.principal != entry.principal:
            return False
        if self.host is not None and self.host != entry.host:
            return False
        if self.operation is not AclOperation.ANY and self.operation != entry.operation:
            return False
        return self.permission_type is AclPermissionType.ANY or (
            self.permission_type == entry.permission_type
        )


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    pattern: ResourcePatternFilter = ResourcePatternFilter()
    entry: AccessControlEntryFilter = AccessControlEntryFilter()

    def matches(self, binding: AclBinding) -> bool:
        return self.pattern.matches(binding.pattern) and self.entry.matches(binding.entry)


MATCH_ALL = AclBindingFilter()
