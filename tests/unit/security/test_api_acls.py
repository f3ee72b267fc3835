"""The API → ACL table: every API the broker serves is covered, and spot checks against Kafka."""

from __future__ import annotations

from odradek.protocol.codec import ApiKey
from odradek.security.acl import AclOperation, ResourceType
from odradek.security.api_acls import (
    API_AUTHORIZATION,
    CREATE_ACLS,
    DESCRIBE_ACLS,
    Scope,
    checks_for,
)
from odradek.server.apis import SUPPORTED_VERSIONS


def test_every_served_api_has_an_authorization_entry() -> None:
    missing = sorted(set(SUPPORTED_VERSIONS) - set(API_AUTHORIZATION))
    assert missing == []


def first(api: int) -> tuple[AclOperation, ResourceType, Scope]:
    check = checks_for(api).checks[0]
    return check.operation, check.resource_type, check.scope


def test_spot_checks_against_kafka_apis() -> None:
    assert first(ApiKey.JOIN_GROUP) == (AclOperation.READ, ResourceType.GROUP, Scope.REQUEST)
    assert first(ApiKey.OFFSET_FETCH)[:2] == (AclOperation.DESCRIBE, ResourceType.GROUP)
    assert first(ApiKey.LIST_OFFSETS)[:2] == (AclOperation.DESCRIBE, ResourceType.TOPIC)
    assert first(ApiKey.STOP_REPLICA)[:2] == (AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)
    assert first(CREATE_ACLS)[:2] == (AclOperation.ALTER, ResourceType.CLUSTER)
    assert first(DESCRIBE_ACLS)[:2] == (AclOperation.DESCRIBE, ResourceType.CLUSTER)
    produce = [(c.operation, c.resource_type) for c in checks_for(ApiKey.PRODUCE).checks]
    assert produce == [
        (AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID),
        (AclOperation.WRITE, ResourceType.TOPIC),
    ]
    fetch = checks_for(ApiKey.FETCH).checks
    assert (fetch[1].operation, fetch[1].scope) == (AclOperation.CLUSTER_ACTION, Scope.ALTERNATIVE)
    assert "CLUSTER_ACTION" not in str(fetch[1]) and "ClusterAction" in str(fetch[1])
