"""The ACL vocabulary: names, codes, filters and the validation CreateAcls applies."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from odradek.security.acl import (
    CLUSTER_NAME,
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
    allowing_operations,
    authorization_error,
    check_supported_operation,
    validate_binding,
)
from odradek.security.errors import InvalidAclError

ALLOW = AclPermissionType.ALLOW


def entry(
    op: AclOperation = AclOperation.READ, principal: str = "User:alice"
) -> AccessControlEntry:
    return AccessControlEntry(principal, "*", op, ALLOW)


def test_wire_codes_and_names_are_kafkas() -> None:
    assert [int(t) for t in ResourceType] == list(range(8))
    assert ResourceType.TRANSACTIONAL_ID.pascal_name == "TransactionalId"
    assert ResourceType.DELEGATION_TOKEN.pascal_name == "DelegationToken"
    assert AclOperation.CLUSTER_ACTION.pascal_name == "ClusterAction"
    assert AclOperation.IDEMPOTENT_WRITE == 12 and AclOperation.DESCRIBE_TOKENS == 14
    assert AclPermissionType.ALLOW.pascal_name == "Allow" and AclPermissionType.DENY == 2
    assert PatternType.PREFIXED == 4 and PatternType.MATCH == 2
    assert AclOperation.from_pascal_name("DescribeConfigs") is AclOperation.DESCRIBE_CONFIGS
    assert AclOperation.from_pascal_name("describeconfigs") is AclOperation.UNKNOWN
    assert ResourceType.from_string("Topic") is ResourceType.TOPIC
    assert ResourceType.from_string("TOPIC") is ResourceType.TOPIC
    assert ResourceType.from_string("Broker") is ResourceType.UNKNOWN


def test_implied_operations() -> None:
    assert allowing_operations(AclOperation.DESCRIBE) == {
        AclOperation.DESCRIBE,
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.DELETE,
        AclOperation.ALTER,
    }
    assert allowing_operations(AclOperation.DESCRIBE_CONFIGS) == {
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    }
    assert allowing_operations(AclOperation.READ) == {AclOperation.READ}


@pytest.mark.parametrize(
    ("resource_type", "code"),
    [
        (ResourceType.TOPIC, ErrorCode.topic_authorization_failed),
        (ResourceType.GROUP, ErrorCode.group_authorization_failed),
        (ResourceType.CLUSTER, ErrorCode.cluster_authorization_failed),
        (ResourceType.TRANSACTIONAL_ID, ErrorCode.transactional_id_authorization_failed),
        (ResourceType.DELEGATION_TOKEN, ErrorCode.delegation_token_authorization_failed),
    ],
)
def test_authorization_error_per_resource_type(
    resource_type: ResourceType, code: ErrorCode
) -> None:
    assert authorization_error(resource_type) == code


def test_validate_binding_refuses_what_the_broker_refuses() -> None:
    good = AclBinding(ResourcePattern(ResourceType.TOPIC, "t", PatternType.LITERAL), entry())
    validate_binding(good)
    bad = [
        AclBinding(ResourcePattern(ResourceType.ANY, "t", PatternType.LITERAL), entry()),
        AclBinding(ResourcePattern(ResourceType.TOPIC, "t", PatternType.MATCH), entry()),
        AclBinding(ResourcePattern(ResourceType.TOPIC, "a/b", PatternType.LITERAL), entry()),
        AclBinding(ResourcePattern(ResourceType.TOPIC, "", PatternType.LITERAL), entry()),
        AclBinding(ResourcePattern(ResourceType.CLUSTER, "c", PatternType.LITERAL), entry()),
        AclBinding(
            ResourcePattern(ResourceType.TOPIC, "t", PatternType.LITERAL), entry(AclOperation.ANY)
        ),
        AclBinding(
            ResourcePattern(ResourceType.TOPIC, "t", PatternType.LITERAL), entry(principal="alice")
        ),
    ]
    for binding in bad:
        with pytest.raises(InvalidAclError):
            validate_binding(binding)
    validate_binding(
        AclBinding(
            ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL), entry()
        )
    )


def test_supported_operations_for_the_cli() -> None:
    check_supported_operation(ResourceType.GROUP, AclOperation.READ)
    check_supported_operation(ResourceType.GROUP, AclOperation.ALL)
    with pytest.raises(InvalidAclError, match="Group only supports operations"):
        check_supported_operation(ResourceType.GROUP, AclOperation.WRITE)


LIT = ResourcePattern(ResourceType.TOPIC, "orders", PatternType.LITERAL)
WILD = ResourcePattern(ResourceType.TOPIC, "*", PatternType.LITERAL)
PRE = ResourcePattern(ResourceType.TOPIC, "ord", PatternType.PREFIXED)
OTHER = ResourcePattern(ResourceType.GROUP, "orders", PatternType.LITERAL)


@pytest.mark.parametrize(
    ("pattern_filter", "expected"),
    [
        (ResourcePatternFilter(), {LIT, WILD, PRE, OTHER}),
        (ResourcePatternFilter(ResourceType.TOPIC), {LIT, WILD, PRE}),
        (ResourcePatternFilter(ResourceType.TOPIC, "orders", PatternType.ANY), {LIT}),
        (ResourcePatternFilter(ResourceType.ANY, "orders", PatternType.ANY), {LIT, OTHER}),
        (ResourcePatternFilter(ResourceType.TOPIC, "orders", PatternType.MATCH), {LIT, WILD, PRE}),
        (ResourcePatternFilter(ResourceType.TOPIC, "ord", PatternType.PREFIXED), {PRE}),
        (ResourcePatternFilter(ResourceType.TOPIC, "orders", PatternType.LITERAL), {LIT}),
        (ResourcePatternFilter(ResourceType.TOPIC, None, PatternType.PREFIXED), {PRE}),
    ],
)
def test_pattern_filters(
    pattern_filter: ResourcePatternFilter, expected: set[ResourcePattern]
) -> None:
    assert {p for p in (LIT, WILD, PRE, OTHER) if pattern_filter.matches(p)} == expected


def test_filter_definiteness_and_candidates() -> None:
    assert ResourcePatternFilter(ResourceType.TOPIC, "t", PatternType.MATCH).indefinite_field()
    assert ResourcePatternFilter(ResourceType.TOPIC, None).indefinite_field()
    definite = ResourcePatternFilter(ResourceType.TOPIC, "t", PatternType.ANY)
    assert definite.indefinite_field() is None
    assert {p.pattern_type for p in definite.candidate_patterns()} == {
        PatternType.LITERAL,
        PatternType.PREFIXED,
    }


def test_entry_filter() -> None:
    e = AccessControlEntry("User:alice", "10.0.0.1", AclOperation.READ, ALLOW)
    assert AccessControlEntryFilter().matches(e)
    assert AccessControlEntryFilter(principal="User:alice", host="10.0.0.1").matches(e)
    assert not AccessControlEntryFilter(principal="User:bob").matches(e)
    assert not AccessControlEntryFilter(operation=AclOperation.WRITE).matches(e)
    assert not AccessControlEntryFilter(permission_type=AclPermissionType.DENY).matches(e)
    assert AclBindingFilter().matches(AclBinding(LIT, e))
