"""Byte-exact znode formats, as Kafka 3.x writes them (kafka.zk.ZkData, AclEntry, Sanitizer)."""

from __future__ import annotations

import json

import pytest

from odradek.security.acl import (
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from odradek.security.znodes import (
    ACL_PERSISTENT_PATHS,
    ExtendedAclChangeZNode,
    LiteralAclChangeZNode,
    ResourceZNode,
    UserConfigZNode,
    change_sequence,
    desanitize,
    sanitize,
)
from odradek.zk.errors import InvalidZNodeDataError

READ = AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)


def test_resource_paths() -> None:
    assert ResourceZNode.path(ResourcePattern(ResourceType.TOPIC, "t", PatternType.LITERAL)) == (
        "/kafka-acl/Topic/t"
    )
    assert ResourceZNode.path(
        ResourcePattern(ResourceType.TRANSACTIONAL_ID, "tx-", PatternType.PREFIXED)
    ) == ("/kafka-acl-extended/prefixed/TransactionalId/tx-")
    assert "/kafka-acl/DelegationToken" in ACL_PERSISTENT_PATHS
    assert "/kafka-acl-extended/prefixed/User" in ACL_PERSISTENT_PATHS
    assert "/kafka-acl-changes" in ACL_PERSISTENT_PATHS


def test_resource_acls_json_is_kafkas() -> None:
    data = ResourceZNode.encode([READ])
    assert data == (
        b'{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow",'
        b'"operation":"Read","host":"*"}]}'
    )
    decoded = ResourceZNode.decode(data, 7)
    assert decoded.acls == {READ} and decoded.zk_version == 7


def test_decodes_what_kafka_writes_with_other_key_order_and_spacing() -> None:
    data = (
        b'{"version": 1, "acls": [ { "host":"host1", "permissionType": "Deny",'
        b'"operation": "DescribeConfigs","principal": "User:CN=a,O=b"}]}'
    )
    (acl,) = ResourceZNode.decode(data, 0).acls
    assert acl == AccessControlEntry(
        "User:CN=a,O=b", "host1", AclOperation.DESCRIBE_CONFIGS, AclPermissionType.DENY
    )
    assert ResourceZNode.decode(b"", 2).acls == frozenset()


@pytest.mark.parametrize(
    "data",
    [
        b'{"version":2,"acls":[]}',
        b'{"version":1}',
        b'{"version":1,"acls":[{"principal":"User:a","permissionType":"Allow","operation":"Fly","host":"*"}]}',
        b'{"version":1,"acls":[{"principal":"User:a","permissionType":"Maybe","operation":"Read","host":"*"}]}',
        b'{"version":1,"acls":[{"principal":"alice","permissionType":"Allow","operation":"Read","host":"*"}]}',
        b"not json",
    ],
)
def test_bad_resource_znodes_are_refused(data: bytes) -> None:
    with pytest.raises(InvalidZNodeDataError):
        ResourceZNode.decode(data, 0)


def test_literal_change_notification_uses_the_java_enum_name() -> None:
    pattern = ResourcePattern(ResourceType.TRANSACTIONAL_ID, "a:b", PatternType.LITERAL)
    assert LiteralAclChangeZNode.encode(pattern) == b"TRANSACTIONAL_ID:a:b"
    assert LiteralAclChangeZNode.decode(b"TRANSACTIONAL_ID:a:b") == pattern
    # Kafka 1.x wrote "Topic:name"; fromString is case-insensitive
    assert LiteralAclChangeZNode.decode(b"Topic:t").resource_type is ResourceType.TOPIC
    assert LiteralAclChangeZNode.create_path() == "/kafka-acl-changes/acl_changes_"
    with pytest.raises(InvalidZNodeDataError):
        LiteralAclChangeZNode.decode(b"Broker:1")
    with pytest.raises(ValueError):
        LiteralAclChangeZNode.encode(ResourcePattern(ResourceType.TOPIC, "t", PatternType.PREFIXED))


def test_extended_change_notification() -> None:
    pattern = ResourcePattern(ResourceType.GROUP, "g-", PatternType.PREFIXED)
    data = ExtendedAclChangeZNode.encode(pattern)
    assert data == b'{"version":1,"resourceType":"GROUP","name":"g-","patternType":"PREFIXED"}'
    assert ExtendedAclChangeZNode.decode(data) == pattern
    assert ExtendedAclChangeZNode.create_path() == "/kafka-acl-extended-changes/acl_changes_"
    with pytest.raises(InvalidZNodeDataError):
        ExtendedAclChangeZNode.decode(
            b'{"version":2,"resourceType":"GROUP","name":"g-","patternType":"PREFIXED"}'
        )


def test_change_sequence() -> None:
    assert change_sequence("acl_changes_0000000042") == 42
    assert change_sequence("config_change_0000000007") == 7
    with pytest.raises(InvalidZNodeDataError):
        change_sequence("acl_changes_")


@pytest.mark.parametrize(
    ("name", "sanitized"),
    [
        ("alice", "alice"),
        ("a.b-c_d", "a.b-c_d"),
        ("a b", "a%20b"),
        ("a*b", "a%2Ab"),
        ("a+b/c~", "a%2Bb%2Fc%7E"),
        ("CN=x,O=y", "CN%3Dx%2CO%3Dy"),
        ("é", "%C3%A9"),
    ],
)
def test_sanitize_is_kafkas(name: str, sanitized: str) -> None:
    assert sanitize(name) == sanitized
    assert desanitize(sanitized) == name


def test_user_config_znode() -> None:
    assert UserConfigZNode.path("a b") == "/config/users/a%20b"
    assert UserConfigZNode.entity_path("a b") == "users/a%20b"
    cred = "salt=c2FsdA==,stored_key=a2V5,server_key=a2V5,iterations=4096"
    data = UserConfigZNode.encode({"SCRAM-SHA-256": cred})
    assert json.loads(data) == {"version": 1, "config": {"SCRAM-SHA-256": cred}}
    decoded = UserConfigZNode.decode("a b", data, 3)
    assert decoded.config == {"SCRAM-SHA-256": cred} and decoded.zk_version == 3
    assert UserConfigZNode.decode("u", b"", 0).config == {}
