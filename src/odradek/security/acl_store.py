"""ACLs in ZooKeeper: loading every broker's `AclCache`, keeping it current, and changing ACLs.

Storage and notification formats are in `odradek.security.znodes`. What this module does, as Kafka's
AclAuthorizer does (3.x):

Start-up (`start`), in this order so that no change is missed:
1. create the store paths if missing (`/kafka-acl/<Type>`, `/kafka-acl-extended/prefixed/<Type>`,
   `/kafka-acl-changes`, `/kafka-acl-extended-changes`);
2. set the child watches on both change parents;
3. load every resource znode of both stores into the cache (unknown resource types are skipped
   with a warning, as Kafka does);
4. process the notifications present (each re-reads the resource it names).

Change notification (a watch fired): list the children, re-read the resource of each new one and
put what ZooKeeper holds into the cache (an absent znode empties the pattern), then purge
notifications older than 15 minutes (`odradek.security.notifications`).

Session expiry (`resync`): watches are gone and notifications may have expired meanwhile, so the
store reloads everything (Kafka only re-processes notifications; a full reload also catches changes
whose notifications were purged while this broker was away).

Updates (`create_acls`, `delete_acls`): per resource pattern, a compare-and-set loop on the znode
version: compute the new set from the current one; `set` with the version read (or `create` if
the znode did not exist, or conditional `delete` if the new set is empty); on BadVersion / NoNode /
NodeExists re-read and retry after 100-150 ms, at most 10 retries. When the set changed, update the
local cache and create one change notification so that every other broker re-reads it. A broker
that crashes between the write and the notification leaves the other caches stale until their next
full load: the same window as Kafka's.

Concurrency: one asyncio event loop. ZooKeeper watch callbacks only schedule a processing pass;
updates and notification passes hold one asyncio lock, so cache writes never interleave.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from odradek.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    PatternType,
    ResourcePattern,
    ResourceType,
    validate_binding,
)
from odradek.security.authorizer import NO_ACLS, AclCache, VersionedAcls
from odradek.security.errors import AclUpdateConflictError
from odradek.security.notifications import Coalescer, NotificationTracker
from odradek.security.znodes import (
    ACL_CHANGE_PREFIX,
    ACL_PERSISTENT_PATHS,
    ExtendedAclChangeZNode,
    LiteralAclChangeZNode,
    ResourceTypeZNode,
    ResourceZNode,
    acl_change_znode,
    acl_store_path,
)
from odradek.zk.errors import (
    BadVersionError,
    InvalidZNodeDataError,
    NodeExistsError,
    NoNodeError,
    ZkError,
)

log = logging.getLogger(__name__)

MAX_UPDATE_RETRIES = 10
RETRY_BACKOFF_S = 0.100
RETRY_BACKOFF_JITTER_S = 0.050


class AclZk(Protocol):
    """The part of `odradek.zk.client.ZkClient` this module uses (tests pass the in-memory fake)."""

    async def get(self, path: str, watch: Any = None) -> tuple[bytes, Any]: ...

    async def get_children(self, path: str, watch: Any = None) -> list[str]: ...

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str: ...

    async def set(self, path: str, data: bytes, version: int = -1) -> Any: ...

    async def delete(self, path: str, version: int = -1, recursive: bool = False) -> None: ...


_STORES = (PatternType.LITERAL, PatternType.PREFIXED)
_CHANGE_ZNODES = (LiteralAclChangeZNode, ExtendedAclChangeZNode)


class AclStore:
    """Keeps an `AclCache` equal to ZooKeeper's ACLs and writes ACL changes.

    `clock_ms` gives wall-clock milliseconds for the notification purge (ZooKeeper's ctime is
    wall-clock); `sleep` is the retry backoff (tests pass a no-op)."""

    def __init__(
        self,
        zk: AclZk,
        cache: AclCache,
        *,
        clock_ms: Callable[[], int] | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
        max_update_retries: int = MAX_UPDATE_RETRIES,
    ) -> None:
        import time

        self.zk = zk
        self.cache = cache
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._sleep = sleep
        self.max_update_retries = max_update_retries
        self._lock = asyncio.Lock()
        self._trackers = {
            znode.path(): NotificationTracker(ACL_CHANGE_PREFIX) for znode in _CHANGE_ZNODES
        }
        self._passes = {parent: self._coalescer(parent) for parent in self._trackers}

    def _coalescer(self, parent: str) -> Coalescer:
        async def one_pass() -> None:
            await self.process_notifications(parent)

        return Coalescer(one_pass, f"acl-changes {parent}")

    # -- loading --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Steps 1-4 of the module docstring."""
        await self._ensure_paths()
        async with self._lock:
            for parent in self._trackers:
                await self.zk.get_children(parent, watch=self._watch(parent))
            await self._load_all()
        for parent in self._trackers:
            await self.process_notifications(parent)

    async def resync(self) -> None:
        """After a new ZooKeeper session: re-arm the watches and reload everything."""
        for tracker in self._trackers.values():
            tracker.last_processed = -1
        await self.start()

    async def close(self) -> None:
        for coalescer in self._passes.values():
            coalescer.cancel()

    async def wait_idle(self) -> None:
        for coalescer in self._passes.values():
            await coalescer.wait_idle()

    async def _ensure_paths(self) -> None:
        for path in ACL_PERSISTENT_PATHS:
            try:
                await self.zk.create(path, b"", makepath=True)
            except NodeExistsError:
                pass

    async def _load_all(self) -> None:
        seen: set[ResourcePattern] = set()
        for pattern_type in _STORES:
            try:
                type_names = await self.zk.get_children(acl_store_path(pattern_type))
            except NoNodeError:
                continue
            for type_name in sorted(type_names):
                resource_type = ResourceType.from_pascal_name(type_name)
                if resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
                    log.warning("ignoring ACLs of unknown resource type %r", type_name)
                    continue
                resource_type = ResourceType(resource_type)
                parent = ResourceTypeZNode.path(pattern_type, resource_type)
                try:
                    names = await self.zk.get_children(parent)
                except NoNodeError:
                    continue
                for name in names:
                    pattern = ResourcePattern(resource_type, name, pattern_type)
                    self.cache.update(pattern, await self._read(pattern))
                    seen.add(pattern)
        for pattern in self.cache.patterns():
            if pattern not in seen:
                self.cache.update(pattern, NO_ACLS)
        log.info("loaded ACLs of %d resource patterns", len(self.cache))

    async def _read(self, pattern: ResourcePattern) -> VersionedAcls:
        path = ResourceZNode.path(pattern)
        try:
            data, stat = await self.zk.get(path)
        except NoNodeError:
            return NO_ACLS
        decoded = ResourceZNode.decode(data, stat.version, path)
        return VersionedAcls(decoded.acls, decoded.zk_version)

    # -- change notifications -------------------------------------------------------------------

    def _watch(self, parent: str) -> Callable[[Any], None]:
        def on_change(_event: Any) -> None:  # on the event loop thread: schedule, never block
            self._passes[parent].request()

        return on_change

    async def process_notifications(self, parent: str) -> None:
        """One pass over a change parent's children (re-arms its watch)."""
        tracker = self._trackers[parent]
        decode = (
            LiteralAclChangeZNode.decode
            if parent == LiteralAclChangeZNode.path()
            else (ExtendedAclChangeZNode.decode)
        )
        async with self._lock:
            children = await self.zk.get_children(parent, watch=self._watch(parent))
            for child in tracker.new_children(children):
                path = f"{parent}/{child}"
                try:
                    data, _stat = await self.zk.get(path)
                    pattern = decode(data)
                    self.cache.update(pattern, await self._read(pattern))
                    log.info("processed ACL change notification %s for %s", child, pattern)
                except NoNodeError:
                    log.debug("ACL change notification %s vanished before it was read", path)
                except InvalidZNodeDataError as e:
                    log.error("ignoring ACL change notification %s: %s", path, e)
                tracker.processed(child)
        await self._purge(parent, children)

    async def _purge(self, parent: str, children: Sequence[str]) -> None:
        ctimes = []
        for child in children:
            try:
                _data, stat = await self.zk.get(f"{parent}/{child}")
            except NoNodeError:
                continue
            ctimes.append((child, int(stat.ctime)))
        for child in NotificationTracker.obsolete(ctimes, self._clock_ms()):
            try:
                await self.zk.delete(f"{parent}/{child}")
            except NoNodeError:
                pass

    # -- updates --------------------------------------------------------------------------------

    async def create_acls(self, bindings: Sequence[AclBinding]) -> list[Exception | None]:
        """CreateAcls: one result per binding, in order (None = created or already there)."""
        results: list[Exception | None] = [None] * len(bindings)
        by_pattern: dict[ResourcePattern, list[int]] = {}
        for index, binding in enumerate(bindings):
            try:
                validate_binding(binding)
            except Exception as e:
                results[index] = e
                continue
            by_pattern.setdefault(binding.pattern, []).append(index)
        async with self._lock:
            for pattern, indexes in by_pattern.items():
                added = frozenset(bindings[i].entry for i in indexes)
                try:
                    await self._update(pattern, added.union)
                except Exception as e:
                    for i in indexes:
                        results[i] = e
        return results

    async def delete_acls(
        self, filters: Sequence[AclBindingFilter]
    ) -> list[list[tuple[AclBinding, Exception | None]]]:
        """DeleteAcls: for each filter, the bindings it deleted, each with its error (None =
        deleted). A binding matched by several filters is reported under the first. The patterns
        considered are those in the local cache plus, for filters naming one resource, that
        resource's patterns (read from ZooKeeper), as in Kafka."""
        deleted: dict[AclBinding, int] = {}
        errors: dict[AclBinding, Exception] = {}
        async with self._lock:
            candidates = set(self.cache.patterns())
            for binding_filter in filters:
                candidates.update(binding_filter.pattern.candidate_patterns())
            for pattern in sorted(candidates):
                matching = [(i, f) for i, f in enumerate(filters) if f.pattern.matches(pattern)]
                if not matching:
                    continue
                removed_here: list[AclBinding] = []

                def remove(
                    current: frozenset[AccessControlEntry],
                    pattern: ResourcePattern = pattern,
                    matching: list[tuple[int, AclBindingFilter]] = matching,
                    removed_here: list[AclBinding] = removed_here,
                ) -> frozenset[AccessControlEntry]:
                    removed_here.clear()
                    keep = set()
                    for entry in current:
                        index = next((i for i, f in matching if f.entry.matches(entry)), None)
                        if index is None:
                            keep.add(entry)
                        else:
                            binding = AclBinding(pattern, entry)
                            deleted.setdefault(binding, index)
                            removed_here.append(binding)
                    return frozenset(keep)

                try:
                    await self._update(pattern, remove)
                except Exception as e:
                    for binding in removed_here:
                        errors.setdefault(binding, e)
        results: list[list[tuple[AclBinding, Exception | None]]] = [[] for _ in filters]
        for binding, index in sorted(deleted.items()):
            results[index].append((binding, errors.get(binding)))
        return results

    async def _update(
        self,
        pattern: ResourcePattern,
        transform: Callable[[frozenset[AccessControlEntry]], frozenset[AccessControlEntry]],
    ) -> bool:
        """The compare-and-set loop; True if the stored set changed. Caller holds the lock."""
        path = ResourceZNode.path(pattern)
        current = self.cache.get(pattern) if pattern in self.cache else await self._read(pattern)
        for attempt in range(self.max_update_retries + 1):
            new_acls = transform(current.acls)
            try:
                new = await self._write(path, current, new_acls)
            except (BadVersionError, NoNodeError, NodeExistsError) as e:
                log.debug("ACL update of %s lost a race (%s); re-reading", pattern, e)
                if attempt == self.max_update_retries:
                    break
                await self._sleep(RETRY_BACKOFF_S + random.random() * RETRY_BACKOFF_JITTER_S)
                current = await self._read(pattern)
                continue
            self.cache.update(pattern, new)
            if new.acls != current.acls:
                log.info("updated ACLs for %s (znode version %d)", pattern, new.zk_version)
                await self._notify(pattern)
                return True
            return False
        raise AclUpdateConflictError(
            f"Failed to update ACLs for {pattern} after trying a maximum of "
            f"{self.max_update_retries} times"
        )

    async def _write(
        self, path: str, current: VersionedAcls, new_acls: frozenset[AccessControlEntry]
    ) -> VersionedAcls:
        if new_acls == current.acls:
            return current
        if new_acls:
            data = ResourceZNode.encode(new_acls)
            if current.exists:
                stat = await self.zk.set(path, data, version=current.zk_version)
                return VersionedAcls(new_acls, stat.version)
            await self.zk.create(path, data, makepath=True)
            return VersionedAcls(new_acls, 0)
        # The last ACL goes: delete the znode, only if nobody changed it since we read it.
        try:
            await self.zk.delete(path, version=current.zk_version)
        except NoNodeError:
            pass
        return NO_ACLS

    async def _notify(self, pattern: ResourcePattern) -> None:
        znode = acl_change_znode(pattern.pattern_type)
        try:
            await self.zk.create(znode.create_path(), znode.encode(pattern), sequence=True)
        except ZkError as e:
            # The ACL is stored; other brokers will see it at their next full load.
            log.error("could not create the ACL change notification for %s: %s", pattern, e)
