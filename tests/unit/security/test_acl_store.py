"""AclStore over the in-memory ZooKeeper: loading, change notifications between brokers, the
compare-and-set loop, and CreateAcls/DeleteAcls results."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from odradek.security.acl import (
    AccessControlEntry,
    AccessControlEntryFilter,
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
from odradek.security.acl_store import AclStore
from odradek.security.authorizer import AclAuthorizer, AclCache
from odradek.security.errors import AclUpdateConflictError, InvalidAclError
from odradek.security.principal import KafkaPrincipal
from odradek.security.znodes import ResourceZNode
from odradek.zk.errors import BadVersionError
from tests.fakes.controller_zk import FakeZooKeeper

ALICE = KafkaPrincipal.user("alice")
READ = AclOperation.READ
T = ResourceType.TOPIC


def acl(
    name: str,
    op: AclOperation = READ,
    *,
    pattern_type: PatternType = PatternType.LITERAL,
    principal: str = "User:alice",
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(
        ResourcePattern(T, name, pattern_type), AccessControlEntry(principal, "*", op, permission)
    )


async def no_sleep(_seconds: float) -> None:
    return None


def store(tree: FakeZooKeeper, **kwargs: Any) -> AclStore:
    return AclStore(tree.client(), AclCache(), clock_ms=lambda: 0, sleep=no_sleep, **kwargs)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_create_writes_kafkas_znodes_and_notifications() -> None:
    async def go() -> None:
        tree = FakeZooKeeper()
        s = store(tree)
        await s.start()
        results = await s.create_acls(
            [
                acl("orders"),
                acl("orders", AclOperation.WRITE),
                acl("log-", pattern_type=PatternType.PREFIXED),
            ]
        )
        assert results == [None, None, None]
        data, stat = tree.get("/kafka-acl/Topic/orders")
        assert {a.operation for a in ResourceZNode.decode(data, stat.version).acls} == {
            READ,
            AclOperation.WRITE,
        }
        assert tree.get("/kafka-acl-extended/prefixed/Topic/log-")[0].startswith(b'{"version":1')
        changes = tree.get_children("/kafka-acl-changes")
        assert len(changes) == 1 and changes[0].startswith("acl_changes_")
        assert tree.get(f"/kafka-acl-changes/{changes[0]}")[0] == b"TOPIC:orders"
        ext = tree.get_children("/kafka-acl-extended-changes")
        assert tree.get(f"/kafka-acl-extended-changes/{ext[0]}")[0] == (
            b'{"version":1,"resourceType":"TOPIC","name":"log-","patternType":"PREFIXED"}'
        )
        # Adding what is there already changes nothing and notifies nobody.
        assert await s.create_acls([acl("orders")]) == [None]
        assert len(tree.get_children("/kafka-acl-changes")) == 1

    run(go)


def test_other_brokers_caches_follow_notifications() -> None:
    async def go() -> None:
        tree = FakeZooKeeper()
        writer, reader = store(tree), store(tree)
        await writer.start()
        await writer.create_acls([acl("early")])
        await reader.start()  # loads what exists
        auth = AclAuthorizer(reader.cache)
        assert auth.authorize(ALICE, "1.1.1.1", READ, Resource(T, "early"))
        await writer.create_acls([acl("late"), acl("pre-", pattern_type=PatternType.PREFIXED)])
        await reader.wait_idle()
        assert auth.authorize(ALICE, "1.1.1.1", READ, Resource(T, "late"))
        assert auth.authorize(ALICE, "1.1.1.1", READ, Resource(T, "pre-x"))
        await writer.delete_acls(
            [AclBindingFilter(ResourcePatternFilter(T, "late", PatternType.LITERAL))]
        )
        await reader.wait_idle()
        assert not auth.authorize(ALICE, "1.1.1.1", READ, Resource(T, "late"))
        assert not tree.exists("/kafka-acl/Topic/late")  # the last ACL took the znode with it
        await writer.close()
        await reader.close()

    run(go)


def test_unknown_resource_types_and_bad_znodes_do_not_stop_loading() -> None:
    async def go() -> None:
        tree = FakeZooKeeper()
        tree.create("/kafka-acl/Broker/1", b"{}", makepath=True)
        tree.create("/kafka-acl/Topic/t", ResourceZNode.encode([acl("t").entry]), makepath=True)
        s = store(tree)
        await s.start()
        assert s.cache.patterns() == [ResourcePattern(T, "t", PatternType.LITERAL)]

    run(go)


def test_resync_after_session_loss_drops_acls_deleted_meanwhile() -> None:
    async def go() -> None:
        tree = FakeZooKeeper()
        s = store(tree)
        await s.start()
        await s.create_acls([acl("a"), acl("b")])
        # Someone deletes 'b' behind our back and the notification is gone (purged).
        tree.delete("/kafka-acl/Topic/b")
        await s.resync()
        assert [p.name for p in s.cache.patterns()] == ["a"]

    run(go)


def test_compare_and_set_retries_on_a_concurrent_write() -> None:
    async def go() -> None:
        tree = FakeZooKeeper()
        mine, theirs = store(tree), store(tree)
        await mine.start()
        await theirs.start()
        await mine.create_acls([acl("t")])
        # theirs writes directly, bypassing mine's cache: mine's cached version is now stale.
        tree.set(
            "/kafka-acl/Topic/t",
            ResourceZNode.encode([acl("t").entry, acl("t", AclOperation.ALTER).entry]),
        )
        assert await mine.create_acls([acl("t", AclOperation.WRITE)]) == [None]
        data, stat = tree.get("/kafka-acl/Topic/t")
        ops = {a.operation for a in ResourceZNode.decode(data, stat.version).acls}
        assert ops == {READ, AclOperation.ALTER, AclOperation.WRITE}  # nothing lost

    run(go)


def test_compare_and_set_gives_up_after_the_retries() -> None:
    class AlwaysStale:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def set(self, path: str, data: bytes, version: int = -1) -> Any:
            raise BadVersionError("stale", path=path)

    async def go() -> None:
        tree = FakeZooKeeper()
        s = store(tree, max_update_retries=2)
        await s.start()
        await s.create_acls([acl("t")])
        s.zk = AlwaysStale(s.zk)
        (result,) = await s.create_acls([acl("t", AclOperation.WRITE)])
        assert isinstance(result, AclUpdateConflictError)

    run(go)


def test_create_reports_invalid_bindings_per_binding() -> None:
    async def go() -> None:
        s = store(FakeZooKeeper())
        await s.start()
        results = await s.create_acls([acl("ok"), acl("bad/name")])
        assert results[0] is None and isinstance(results[1], InvalidAclError)

    run(go)


def test_delete_filters_attribute_each_binding_to_the_first_matching_filter() -> None:
    async def go() -> None:
        tree = FakeZooKeeper()
        s = store(tree)
        await s.start()
        await s.create_acls(
            [acl("a"), acl("a", AclOperation.WRITE), acl("b"), acl("a", principal="User:bob")]
        )
        results = await s.delete_acls(
            [
                AclBindingFilter(
                    ResourcePatternFilter(T, "a", PatternType.LITERAL),
                    AccessControlEntryFilter(principal="User:alice"),
                ),
                AclBindingFilter(entry=AccessControlEntryFilter(operation=READ)),
                AclBindingFilter(ResourcePatternFilter(T, "nothing", PatternType.LITERAL)),
            ]
        )
        first = {(b.pattern.name, b.entry.principal, b.entry.operation) for b, _ in results[0]}
        second = {(b.pattern.name, b.entry.principal) for b, _ in results[1]}
        assert first == {("a", "User:alice", READ), ("a", "User:alice", AclOperation.WRITE)}
        assert second == {("b", "User:alice"), ("a", "User:bob")}
        assert results[2] == []
        assert all(error is None for r in results for _, error in r)
        assert len(s.cache) == 0 and not tree.exists("/kafka-acl/Topic/a")

    run(go)


def test_delete_of_a_definite_filter_reaches_acls_the_cache_has_not_seen() -> None:
    async def go() -> None:
        tree = FakeZooKeeper()
        s = store(tree)
        await s.start()
        # Written by another broker whose notification we have not processed yet.
        tree.create("/kafka-acl/Topic/x", ResourceZNode.encode([acl("x").entry]), makepath=True)
        results = await s.delete_acls(
            [AclBindingFilter(ResourcePatternFilter(T, "x", PatternType.ANY))]
        )
        assert [b.pattern.name for b, _ in results[0]] == ["x"]
        assert not tree.exists("/kafka-acl/Topic/x")

    run(go)


def test_old_notifications_are_purged() -> None:
    async def go() -> None:
        tree = FakeZooKeeper()
        clock = [0]
        s = AclStore(tree.client(), AclCache(), clock_ms=lambda: clock[0], sleep=no_sleep)
        await s.start()
        await s.create_acls([acl("a")])
        await s.wait_idle()
        assert len(tree.get_children("/kafka-acl-changes")) == 1
        clock[0] = 10**12  # far beyond 15 minutes after the fake's ctime
        await s.create_acls([acl("b")])
        await s.wait_idle()
        await s.process_notifications("/kafka-acl-changes")
        assert tree.get_children("/kafka-acl-changes") == []

    run(go)
