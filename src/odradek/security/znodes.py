"""The security znodes, byte-compatible with Kafka 3.x in ZooKeeper mode (`kafka.zk.ZkData`,
`AclEntry`, `ScramCredentialUtils`), in the style of `odradek.zk.znodes`: one small class per znode
with `path`, `encode` and `decode`; decode raises `InvalidZNodeDataError` and returns a value that
carries the znode version where a conditional write needs it. No I/O.

ACLs (Kafka's AclAuthorizer, verified against 3.6.2):

| path | value |
|---|---|
| `/kafka-acl/<Type>/<name>` | LITERAL patterns: `{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow","operation":"Read","host":"*"}]}` |
| `/kafka-acl-extended/prefixed/<Type>/<name>` | PREFIXED patterns, same JSON |
| `/kafka-acl-changes/acl_changes_<seq>` | persistent sequential; UTF-8 text `<TYPE>:<name>` with the Java enum name (`TOPIC:orders`; Kafka reads it case-insensitively, so `Topic:orders` from Kafka 1.x is read too); split on the first ':' |
| `/kafka-acl-extended-changes/acl_changes_<seq>` | persistent sequential; `{"version":1,"resourceType":"TOPIC","name":"orders-","patternType":"PREFIXED"}` |

`<Type>` in paths is the Pascal-case name (`Topic`, `Group`, `Cluster`, `TransactionalId`,
`DelegationToken`, `User`); the pattern level is the lower-cased pattern type (`prefixed`). Kafka
creates `/kafka-acl/<Type>` and `/kafka-acl-extended/prefixed/<Type>` for every type at start-up.
A resource znode whose last ACL is removed is deleted (conditionally on its version).

Users (SCRAM credentials, Kafka's `ConfigEntityZNode` for entity type `users`):

| path | value |
|---|---|
| `/config/users/<sanitized user>` | `{"version":1,"config":{"SCRAM-SHA-256":"salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=4096"}}` (other user configs, e.g. quotas, live in the same map) |
| `/config/changes/config_change_<seq>` | `{"version":2,"entity_path":"users/<sanitized user>"}` (`odradek.zk.znodes.ConfigChangeNotificationSequenceZNode`) |

`<sanitized user>` is Kafka's `Sanitizer.sanitize`: URL-encoding of UTF-8 (`java.net.URLEncoder`,
space as `%20`, `*` as `%2A`), so that any user name is one path level.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from odradek.security.acl import (
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from odradek.zk.errors import InvalidZNodeDataError


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _loads(data: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidZNodeDataError(f"{where}: not valid JSON ({exc})", path=where) from None
    if not isinstance(value, dict):
        raise InvalidZNodeDataError(f"{where}: expected a JSON object", path=where)
    return value


def _string(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise InvalidZNodeDataError(
            f"{where}: field {key!r} is missing or not a string", path=where
        )
    return value


# ---------------------------------------------------------------------------------------------
# ACL storage


class KafkaAclZNode:
    """`/kafka-acl`: root of the LITERAL ACL store."""

    @staticmethod
    def path() -> str:
        return "/kafka-acl"


class ExtendedAclZNode:
    """`/kafka-acl-extended`: root of the stores of other pattern types (only `prefixed`)."""

    @staticmethod
    def path() -> str:
        return "/kafka-acl-extended"


def acl_store_path(pattern_type: PatternType) -> str:
    """The store root of a pattern type: `/kafka-acl` or `/kafka-acl-extended/prefixed`."""
    if pattern_type is PatternType.LITERAL:
        return KafkaAclZNode.path()
    if pattern_type is PatternType.PREFIXED:
        return f"{ExtendedAclZNode.path()}/{pattern_type.name.lower()}"
    raise ValueError(f"no ACL store for pattern type {pattern_type.name}")


class ResourceTypeZNode:
    """`<store>/<Type>`: parent of the resource znodes of one type and pattern type."""

    @staticmethod
    def path(pattern_type: PatternType, resource_type: ResourceType) -> str:
        return f"{acl_store_path(pattern_type)}/{resource_type.pascal_name}"


@dataclass(frozen=True, slots=True)
class ResourceAcls:
    acls: frozenset[AccessControlEntry]
    zk_version: int


class ResourceZNode:
    """`<store>/<Type>/<name>`: the ACLs of one resource pattern (JSON version 1).

    Entries are written sorted, so the same set always encodes to the same bytes. Decoding is as
    strict as Kafka's (`AclEntry.fromBytes`): version must be 1; an empty payload means no ACLs; an
    entry whose operation or permission type is unknown fails the whole znode, since silently
    dropping a DENY would widen access.
    """

    VERSION = 1

    @staticmethod
    def path(pattern: ResourcePattern) -> str:
        return (
            f"{ResourceTypeZNode.path(pattern.pattern_type, pattern.resource_type)}/{pattern.name}"
        )

    @staticmethod
    def encode(acls: Iterable[AccessControlEntry]) -> bytes:
        return _dumps(
            {
                "version": ResourceZNode.VERSION,
                "acls": [
                    {
                        "principal": acl.principal,
                        "permissionType": acl.permission_type.pascal_name,
                        "operation": acl.operation.pascal_name,
                        "host": acl.host,
                    }
                    for acl in sorted(acls)
                ],
            }
        )

    @staticmethod
    def decode(data: bytes, stat_version: int, where: str = "ACL znode") -> ResourceAcls:
        if not data:
            return ResourceAcls(frozenset(), stat_version)
        obj = _loads(data, where)
        if obj.get("version") != ResourceZNode.VERSION:
            raise InvalidZNodeDataError(f"{where}: unsupported version {obj.get('version')!r}")
        entries = obj.get("acls")
        if not isinstance(entries, list):
            raise InvalidZNodeDataError(f"{where}: 'acls' is not a list", path=where)
        acls = set()
        for item in entries:
            if not isinstance(item, dict):
                raise InvalidZNodeDataError(f"{where}: an ACL is not a JSON object", path=where)
            principal = _string(item, "principal", where)
            if ":" not in principal:
                raise InvalidZNodeDataError(f"{where}: bad principal {principal!r}", path=where)
            operation = AclOperation.from_pascal_name(_string(item, "operation", where))
            permission = AclPermissionType.from_pascal_name(_string(item, "permissionType", where))
            if operation.is_unknown or operation is AclOperation.ANY:
                raise InvalidZNodeDataError(f"{where}: unknown operation in {item}", path=where)
            if permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
                raise InvalidZNodeDataError(f"{where}: unknown permission in {item}", path=where)
            acls.add(
                AccessControlEntry(
                    principal,
                    _string(item, "host", where),
                    AclOperation(operation),
                    AclPermissionType(permission),
                )
            )
        return ResourceAcls(frozenset(acls), stat_version)


# ---------------------------------------------------------------------------------------------
# ACL change notifications

ACL_CHANGE_PREFIX = "acl_changes_"


class LiteralAclChangeZNode:
    """`/kafka-acl-changes/acl_changes_<seq>`: `TOPIC:name` (a LITERAL pattern changed)."""

    @staticmethod
    def path() -> str:
        return "/kafka-acl-changes"

    @staticmethod
    def create_path() -> str:
        return f"{LiteralAclChangeZNode.path()}/{ACL_CHANGE_PREFIX}"

    @staticmethod
    def encode(pattern: ResourcePattern) -> bytes:
        if pattern.pattern_type is not PatternType.LITERAL:
            raise ValueError("only literal resource patterns go to /kafka-acl-changes")
        return f"{pattern.resource_type.name}:{pattern.name}".encode()

    @staticmethod
    def decode(data: bytes) -> ResourcePattern:
        where = LiteralAclChangeZNode.path()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidZNodeDataError(f"{where}: not UTF-8", path=where) from None
        type_name, sep, name = text.partition(":")
        resource_type = ResourceType.from_string(type_name)
        if not sep or resource_type not in _CONCRETE_TYPES:
            raise InvalidZNodeDataError(
                f"{where}: expected ResourceType:ResourceName, got {text!r}", path=where
            )
        return ResourcePattern(ResourceType(resource_type), name, PatternType.LITERAL)


class ExtendedAclChangeZNode:
    """`/kafka-acl-extended-changes/acl_changes_<seq>`: JSON naming a PREFIXED pattern."""

    VERSION = 1

    @staticmethod
    def path() -> str:
        return "/kafka-acl-extended-changes"

    @staticmethod
    def create_path() -> str:
        return f"{ExtendedAclChangeZNode.path()}/{ACL_CHANGE_PREFIX}"

    @staticmethod
    def encode(pattern: ResourcePattern) -> bytes:
        if pattern.pattern_type is PatternType.LITERAL:
            raise ValueError("literal resource patterns go to /kafka-acl-changes")
        return _dumps(
            {
                "version": ExtendedAclChangeZNode.VERSION,
                "resourceType": pattern.resource_type.name,
                "name": pattern.name,
                "patternType": pattern.pattern_type.name,
            }
        )

    @staticmethod
    def decode(data: bytes) -> ResourcePattern:
        where = ExtendedAclChangeZNode.path()
        obj = _loads(data, where)
        version = obj.get("version")
        if not isinstance(version, int) or version > ExtendedAclChangeZNode.VERSION:
            raise InvalidZNodeDataError(f"{where}: unsupported version {version!r}", path=where)
        resource_type = ResourceType.from_string(_string(obj, "resourceType", where))
        pattern_type = PatternType.from_string(_string(obj, "patternType", where))
        if resource_type not in _CONCRETE_TYPES or pattern_type is not PatternType.PREFIXED:
            raise InvalidZNodeDataError(f"{where}: bad resource in {obj}", path=where)
        return ResourcePattern(
            ResourceType(resource_type), _string(obj, "name", where), PatternType.PREFIXED
        )


def acl_change_znode(
    pattern_type: PatternType,
) -> type[LiteralAclChangeZNode | ExtendedAclChangeZNode]:
    return LiteralAclChangeZNode if pattern_type is PatternType.LITERAL else ExtendedAclChangeZNode


def change_sequence(child: str) -> int:
    """The number ZooKeeper appended to `acl_changes_0000000042` or `config_change_...` (42)."""
    digits = child[child.rfind("_") + 1 :]
    if not digits.isdigit():
        raise InvalidZNodeDataError(f"{child!r} is not a sequential change znode", path=child)
    return int(digits)


_CONCRETE_TYPES = frozenset(
    t for t in ResourceType if t not in (ResourceType.UNKNOWN, ResourceType.ANY)
)

# Created at start-up by every broker whose authorizer is enabled (Kafka's createAclPaths).
ACL_PERSISTENT_PATHS: tuple[str, ...] = (
    *(ResourceTypeZNode.path(PatternType.LITERAL, t) for t in sorted(_CONCRETE_TYPES)),
    *(ResourceTypeZNode.path(PatternType.PREFIXED, t) for t in sorted(_CONCRETE_TYPES)),
    LiteralAclChangeZNode.path(),
    ExtendedAclChangeZNode.path(),
)


# ---------------------------------------------------------------------------------------------
# Users (SCRAM credentials)


def sanitize(name: str) -> str:
    """Kafka's `Sanitizer.sanitize`: `URLEncoder.encode(name, UTF_8)` with `+` → `%20` and
    `*` → `%2A`, i.e. every UTF-8 byte except ASCII letters, digits and `.-_` becomes `%XX`
    (upper-case hex). Python's `quote` would keep `~`, which URLEncoder escapes."""
    return "".join(chr(b) if b in _URL_SAFE else f"%{b:02X}" for b in name.encode("utf-8"))


_URL_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


def desanitize(name: str) -> str:
    """Kafka's `Sanitizer.desanitize` (URL-decoding)."""
    return unquote(name)


@dataclass(frozen=True, slots=True)
class UserConfig:
    """`/config/users/<user>`: every config of a user; SCRAM credentials are under the mechanism
    names (`SCRAM-SHA-256`, `SCRAM-SHA-512`) as credential strings (see `odradek.security.scram`)."""

    user: str
    config: Mapping[str, str]
    zk_version: int


class UserConfigZNode:
    ENTITY_TYPE = "users"

    @staticmethod
    def path(user: str = "") -> str:
        base = f"/config/{UserConfigZNode.ENTITY_TYPE}"
        return f"{base}/{sanitize(user)}" if user else base

    @staticmethod
    def encode(config: Mapping[str, str]) -> bytes:
        return _dumps({"version": 1, "config": dict(config)})

    @staticmethod
    def decode(user: str, data: bytes, stat_version: int) -> UserConfig:
        where = UserConfigZNode.path(user)
        if not data:
            return UserConfig(user, {}, stat_version)
        obj = _loads(data, where)
        config = obj.get("config") or {}
        if not isinstance(config, dict) or not all(isinstance(v, str) for v in config.values()):
            raise InvalidZNodeDataError(f"{where}: 'config' is not a map of strings", path=where)
        return UserConfig(user, dict(config), stat_version)

    @staticmethod
    def entity_path(user: str) -> str:
        """What a config change notification names: `users/<sanitized user>`."""
        return f"{UserConfigZNode.ENTITY_TYPE}/{sanitize(user)}"
