"""The authorizer's decision function: a table of Kafka's rules, and hypothesis against a reference
model that scans a flat list of bindings the obvious way (no indexes, no incremental cache)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odradek.security.acl import (
    CLUSTER,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    Resource,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from odradek.security.authorizer import AclAuthorizer, AclCache, VersionedAcls, host_matches
from odradek.security.principal import KafkaPrincipal

ALICE = KafkaPrincipal.user("alice")
BOB = KafkaPrincipal.user("bob")
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
A = AclOperation
TOPIC = ResourceType.TOPIC
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED


def binding(
    name: str,
    op: AclOperation,
    permission: AclPermissionType = ALLOW,
    *,
    principal: str = "User:alice",
    host: str = "*",
    pattern_type: PatternType = LIT,
    resource_type: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(
        ResourcePattern(resource_type, name, pattern_type),
        AccessControlEntry(principal, host, op, permission),
    )


def cache_of(bindings: Iterable[AclBinding]) -> AclCache:
    grouped: dict[ResourcePattern, set[AccessControlEntry]] = {}
    for b in bindings:
        grouped.setdefault(b.pattern, set()).add(b.entry)
    cache = AclCache()
    for pattern, entries in grouped.items():
        cache.update(pattern, VersionedAcls(frozenset(entries), 0))
    return cache


def authorizer(*bindings: AclBinding, **kwargs: object) -> AclAuthorizer:
    return AclAuthorizer(cache_of(bindings), **kwargs)  # type: ignore[arg-type]


def topic(name: str) -> Resource:
    return Resource(TOPIC, name)


H = "10.0.0.1"


def test_no_acls_denies_unless_allow_everyone() -> None:
    assert not authorizer().authorize(ALICE, H, A.READ, topic("t"))
    assert authorizer(allow_everyone_if_no_acl_found=True).authorize(ALICE, H, A.READ, topic("t"))
    # ACLs exist for the resource, none for alice: allow.everyone no longer applies.
    auth = authorizer(
        binding("t", A.READ, principal="User:bob"), allow_everyone_if_no_acl_found=True
    )
    assert not auth.authorize(ALICE, H, A.READ, topic("t"))


def test_super_users_bypass_acls_including_deny() -> None:
    auth = authorizer(binding("t", A.ALL, DENY), super_users={ALICE})
    assert auth.authorize(ALICE, H, A.WRITE, topic("t"))
    assert auth.authorize(ALICE, H, A.CLUSTER_ACTION, CLUSTER)


def test_literal_wildcard_and_prefixed_patterns() -> None:
    auth = authorizer(
        binding("orders", A.READ),
        binding("*", A.WRITE),
        binding("log-", A.DELETE, pattern_type=PRE),
    )
    assert auth.authorize(ALICE, H, A.READ, topic("orders"))
    assert not auth.authorize(ALICE, H, A.READ, topic("orders2"))
    assert auth.authorize(ALICE, H, A.WRITE, topic("anything"))
    assert auth.authorize(ALICE, H, A.DELETE, topic("log-2024"))
    assert not auth.authorize(ALICE, H, A.DELETE, topic("log"))
    # a literal ACL named "log-" is not a prefix
    assert not authorizer(binding("log-", A.DELETE)).authorize(ALICE, H, A.DELETE, topic("log-1"))


def test_deny_beats_allow_whatever_the_specificity() -> None:
    auth = authorizer(
        binding("orders", A.READ),
        binding("ord", A.READ, DENY, pattern_type=PRE),
    )
    assert not auth.authorize(ALICE, H, A.READ, topic("orders"))
    auth = authorizer(binding("orders", A.READ), binding("*", A.ALL, DENY, principal="User:*"))
    assert not auth.authorize(ALICE, H, A.READ, topic("orders"))


def test_implied_operations_only_for_allow() -> None:
    for op in (A.READ, A.WRITE, A.DELETE, A.ALTER):
        assert authorizer(binding("t", op)).authorize(ALICE, H, A.DESCRIBE, topic("t"))
    assert not authorizer(binding("t", A.CREATE)).authorize(ALICE, H, A.DESCRIBE, topic("t"))
    assert authorizer(binding("t", A.ALTER_CONFIGS)).authorize(
        ALICE, H, A.DESCRIBE_CONFIGS, topic("t")
    )
    assert not authorizer(binding("t", A.DESCRIBE)).authorize(ALICE, H, A.READ, topic("t"))
    # DENY READ does not deny DESCRIBE
    auth = authorizer(binding("t", A.DESCRIBE), binding("t", A.READ, DENY))
    assert auth.authorize(ALICE, H, A.DESCRIBE, topic("t"))
    assert not auth.authorize(ALICE, H, A.READ, topic("t"))


def test_all_covers_every_operation_in_allow_and_deny() -> None:
    auth = authorizer(binding("t", A.ALL))
    for op in (A.READ, A.WRITE, A.DESCRIBE, A.ALTER_CONFIGS, A.DELETE):
        assert auth.authorize(ALICE, H, op, topic("t"))
    auth = authorizer(binding("t", A.ALL), binding("t", A.ALL, DENY, principal="User:bob"))
    assert not auth.authorize(BOB, H, A.READ, topic("t"))


def test_principal_and_host_matching() -> None:
    auth = authorizer(binding("t", A.READ, principal="User:*", host="10.0.0.1"))
    assert auth.authorize(ALICE, "10.0.0.1", A.READ, topic("t"))
    assert auth.authorize(BOB, "10.0.0.1", A.READ, topic("t"))
    assert not auth.authorize(ALICE, "10.0.0.2", A.READ, topic("t"))
    assert not auth.authorize(KafkaPrincipal("Group", "alice"), "10.0.0.2", A.READ, topic("t"))
    assert host_matches("::1", "0:0:0:0:0:0:0:1")
    assert not host_matches("::1", "::2")
    assert host_matches("broker-1", "broker-1")


def test_resource_types_do_not_mix() -> None:
    auth = authorizer(binding("g", A.READ, resource_type=ResourceType.GROUP))
    assert auth.authorize(ALICE, H, A.READ, Resource(ResourceType.GROUP, "g"))
    assert not auth.authorize(ALICE, H, A.READ, topic("g"))


def test_from_properties() -> None:
    auth = AclAuthorizer.from_properties(
        {"super.users": "User:admin; User:CN=broker,O=x", "allow.everyone.if.no.acl.found": "true"},
        AclCache(),
    )
    assert auth.super_users == {KafkaPrincipal.user("admin"), KafkaPrincipal.user("CN=broker,O=x")}
    assert auth.allow_everyone_if_no_acl_found


@pytest.mark.parametrize(
    ("acls", "expected"),
    [
        ([], False),
        ([binding("t", A.WRITE)], True),
        ([binding("t-", A.WRITE, pattern_type=PRE)], True),
        ([binding("t", A.WRITE), binding("t", A.WRITE, DENY)], False),
        ([binding("t", A.WRITE), binding("t", A.WRITE, DENY, pattern_type=PRE)], False),
        ([binding("t", A.WRITE), binding("u", A.WRITE, DENY)], True),
        ([binding("tx", A.WRITE, pattern_type=PRE), binding("t", A.WRITE, DENY)], True),
        (
            [
                binding("tx", A.WRITE, pattern_type=PRE),
                binding("t", A.WRITE, DENY, pattern_type=PRE),
            ],
            False,
        ),
        ([binding("*", A.WRITE), binding("t", A.WRITE, DENY, pattern_type=PRE)], True),
        ([binding("t", A.WRITE), binding("*", A.WRITE, DENY)], False),
        ([binding("t", A.READ)], False),  # no implication in the by-type question
    ],
)
def test_authorize_by_resource_type(acls: list[AclBinding], expected: bool) -> None:
    assert authorizer(*acls).authorize_by_resource_type(ALICE, H, A.WRITE, TOPIC) is expected


def test_by_resource_type_allow_everyone_quirk() -> None:
    # Kafka: allow.everyone.if.no.acl.found allows here even when (non-wildcard) DENY ACLs exist.
    auth = authorizer(binding("t", A.WRITE, DENY), allow_everyone_if_no_acl_found=True)
    assert auth.authorize_by_resource_type(ALICE, H, A.WRITE, TOPIC)
    auth = authorizer(binding("*", A.WRITE, DENY), allow_everyone_if_no_acl_found=True)
    assert not auth.authorize_by_resource_type(ALICE, H, A.WRITE, TOPIC)


def test_cache_bindings_filter_and_removal() -> None:
    cache = cache_of([binding("a", A.READ), binding("b", A.READ, pattern_type=PRE)])
    assert len(cache.bindings(AclBindingFilter())) == 2
    only_prefixed = AclBindingFilter(ResourcePatternFilter(TOPIC, None, PRE))
    assert [b.pattern.name for b in cache.bindings(only_prefixed)] == ["b"]
    cache.update(ResourcePattern(TOPIC, "a", LIT), VersionedAcls(frozenset(), 3))
    assert ResourcePattern(TOPIC, "a", LIT) not in cache
    assert cache.acls_for(topic("a")) == []


# -- hypothesis: the cache-backed authorizer against a flat-list reference model --------------

PRINCIPALS = ["User:alice", "User:bob", "User:*", "Group:alice"]
HOSTS = ["*", "1.1.1.1", "2.2.2.2"]
OPS = [op for op in AclOperation if op not in (A.UNKNOWN, A.ANY)]
TYPES = [TOPIC, ResourceType.GROUP]
names = st.text(alphabet="ab*", min_size=1, max_size=3)

bindings_st = st.builds(
    lambda n, rt, pt, p, h, op, perm: AclBinding(
        ResourcePattern(rt, n, pt), AccessControlEntry(p, h, op, perm)
    ),
    names,
    st.sampled_from(TYPES),
    st.sampled_from([LIT, PRE]),
    st.sampled_from(PRINCIPALS),
    st.sampled_from(HOSTS),
    st.sampled_from(OPS),
    st.sampled_from([ALLOW, DENY]),
)


def reference(
    bindings: list[AclBinding],
    super_users: set[KafkaPrincipal],
    allow_everyone: bool,
    principal: KafkaPrincipal,
    host: str,
    op: AclOperation,
    resource: Resource,
) -> bool:
    if principal in super_users:
        return True
    applicable = [
        b
        for b in bindings
        if b.pattern.resource_type == resource.resource_type
        and (
            (b.pattern.pattern_type is LIT and b.pattern.name in (resource.name, "*"))
            or (b.pattern.pattern_type is PRE and resource.name.startswith(b.pattern.name))
        )
    ]
    if not applicable:
        return allow_everyone

    def matches(b: AclBinding, ops: set[AclOperation], permission: AclPermissionType) -> bool:
        e = b.entry
        return (
            e.permission_type == permission
            and e.principal in (str(principal), "User:*")
            and e.host in ("*", host)
            and (e.operation is A.ALL or e.operation in ops)
        )

    implied = {op}
    if op is A.DESCRIBE:
        implied |= {A.READ, A.WRITE, A.DELETE, A.ALTER}
    if op is A.DESCRIBE_CONFIGS:
        implied |= {A.ALTER_CONFIGS}
    if any(matches(b, {op}, DENY) for b in applicable):
        return False
    return any(matches(b, implied, ALLOW) for b in applicable)


@settings(max_examples=300, deadline=None)
@given(
    bindings=st.lists(bindings_st, max_size=12),
    removed=st.lists(bindings_st, max_size=4),
    principal=st.sampled_from(["User:alice", "User:bob", "Group:alice"]),
    host=st.sampled_from(HOSTS[1:]),
    op=st.sampled_from(OPS),
    resource=st.builds(Resource, st.sampled_from(TYPES), names),
    allow_everyone=st.booleans(),
    super_bob=st.booleans(),
)
def test_authorize_matches_reference_model(
    bindings: list[AclBinding],
    removed: list[AclBinding],
    principal: str,
    host: str,
    op: AclOperation,
    resource: Resource,
    allow_everyone: bool,
    super_bob: bool,
) -> None:
    # Build the cache incrementally, with removals, as notifications would.
    cache = cache_of(bindings + removed)
    for b in removed:
        current = cache.get(b.pattern)
        remaining = current.acls - {b.entry}
        if b in bindings:
            remaining |= {b.entry}
        cache.update(b.pattern, VersionedAcls(remaining, current.zk_version + 1))
    supers = {BOB} if super_bob else set()
    auth = AclAuthorizer(cache, super_users=supers, allow_everyone_if_no_acl_found=allow_everyone)
    who = KafkaPrincipal.parse(principal)
    expected = reference(bindings, supers, allow_everyone, who, host, op, resource)
    assert auth.authorize(who, host, op, resource) is expected


@settings(max_examples=300, deadline=None)
@given(
    bindings=st.lists(bindings_st, max_size=10),
    op=st.sampled_from([o for o in OPS if o not in (A.DESCRIBE, A.DESCRIBE_CONFIGS, A.ALL)]),
    resource_type=st.sampled_from(TYPES),
)
def test_by_resource_type_means_some_resource_is_authorized(
    bindings: list[AclBinding], op: AclOperation, resource_type: ResourceType
) -> None:
    # Without allow.everyone.if.no.acl.found, KIP-679's question has a plain meaning: is there a
    # resource name of the type that `authorize` would allow? Every name an ACL mentions, and a
    # fresh extension of each, covers every case.
    auth = AclAuthorizer(cache_of(bindings))
    candidates = {"zzz"} | {b.pattern.name for b in bindings}
    candidates |= {name + "~zz" for name in candidates}
    some = any(
        auth.authorize(ALICE, "1.1.1.1", op, Resource(resource_type, name), log_if_denied=False)
        for name in candidates
    )
    assert auth.authorize_by_resource_type(ALICE, "1.1.1.1", op, resource_type) is some
