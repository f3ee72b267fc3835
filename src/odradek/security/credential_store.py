"""SCRAM credentials from ZooKeeper: the cache the SCRAM server reads, its loader, and the writes
behind `odradek configs --entity-type users --alter` and AlterUserScramCredentials.

Formats (`odradek.security.znodes`, verified against Kafka 3.6.2): `/config/users/<sanitized
user>` holds `{"version":1,"config":{"SCRAM-SHA-256":"salt=...,stored_key=...,server_key=...,
iterations=4096"}}`; a change is announced by `/config/changes/config_change_<seq>` holding
`{"version":2,"entity_path":"users/<sanitized user>"}`.

Loading (`start`), as Kafka's DynamicConfigManager does for users:
1. set the child watch on `/config/changes`;
2. read every `/config/users/<user>` and cache its SCRAM entries;
3. process the notifications present; afterwards each fired watch processes the new ones. A
   notification for `users/<u>` re-reads `/config/users/<u>` (absent znode: the user has no
   credentials any more); notifications of other entity types (topics, brokers, clients, and
   `users/<u>/clients/<c>` quotas) are skipped: other components own them.

This store never deletes notifications: `/config/changes` belongs to the dynamic-config manager,
which purges old ones for every entity type (Kafka's one ZkNodeChangeNotificationListener).

A stored credential that does not parse is logged and ignored (that user cannot log in with that
mechanism) rather than failing the whole load.

Concurrency: one asyncio event loop; watch callbacks only schedule a pass (`Coalescer`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from odradek.security.acl_store import AclZk
from odradek.security.errors import InvalidScramCredentialError
from odradek.security.notifications import Coalescer, NotificationTracker
from odradek.security.scram import ScramCredential, ScramMechanism
from odradek.security.znodes import UserConfigZNode, desanitize
from odradek.zk.errors import BadVersionError, InvalidZNodeDataError, NodeExistsError, NoNodeError
from odradek.zk.znodes import (
    ConfigChangeNotificationSequenceZNode,
    ConfigChangeNotificationZNode,
)

log = logging.getLogger(__name__)

MAX_UPDATE_RETRIES = 10


class CredentialCache:
    """user → mechanism → credential. `get` is the SCRAM server's `CredentialLookup`."""

    def __init__(self) -> None:
        self._by_mechanism: dict[ScramMechanism, dict[str, ScramCredential]] = {
            m: {} for m in ScramMechanism
        }

    def get(self, mechanism: ScramMechanism, user: str) -> ScramCredential | None:
        return self._by_mechanism[mechanism].get(user)

    def lookup(self, mechanism: ScramMechanism) -> Callable[[str], ScramCredential | None]:
        """A `CredentialLookup` for `ScramServer` that reads the cache at call time."""
        return self._by_mechanism[mechanism].get

    def update_user(self, user: str, config: Mapping[str, str]) -> None:
        """Replace the user's credentials with the SCRAM entries of its config."""
        credentials = credentials_of(user, config)
        for mechanism in ScramMechanism:
            credential = credentials.get(mechanism)
            if credential is None:
                self._by_mechanism[mechanism].pop(user, None)
            else:
                self._by_mechanism[mechanism][user] = credential

    def remove_user(self, user: str) -> None:
        self.update_user(user, {})

    def users(self, mechanism: ScramMechanism) -> list[str]:
        return sorted(self._by_mechanism[mechanism])


def credentials_of(user: str, config: Mapping[str, str]) -> dict[ScramMechanism, ScramCredential]:
    """The SCRAM entries of a user's config; one that does not parse is logged and left out."""
    credentials = {}
    for mechanism in ScramMechanism:
        text = config.get(mechanism.mechanism_name)
        if text is None:
            continue
        try:
            credentials[mechanism] = ScramCredential.from_string(text)
        except InvalidScramCredentialError as e:
            log.error("ignoring the %s credential of %r: %s", mechanism.mechanism_name, user, e)
    return credentials


def user_of_entity_path(entity_path: str) -> str | None:
    """`users/<sanitized>` → the user name; None for anything else (including quota paths
    `users/<u>/clients/<c>`)."""
    entity_type, sep, rest = entity_path.partition("/")
    if entity_type != UserConfigZNode.ENTITY_TYPE or not sep or not rest or "/" in rest:
        return None
    return desanitize(rest)


class CredentialStore:
    """Keeps a `CredentialCache` equal to ZooKeeper and writes credentials."""

    def __init__(self, zk: AclZk, cache: CredentialCache) -> None:
        self.zk = zk
        self.cache = cache
        self._tracker = NotificationTracker(ConfigChangeNotificationSequenceZNode.PREFIX)
        self._pass = Coalescer(self.process_notifications, "user-config-changes")
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        parent = ConfigChangeNotificationZNode.path()
        for path in (parent, UserConfigZNode.path()):
            try:
                await self.zk.create(path, b"", makepath=True)
            except NodeExistsError:
                pass
        async with self._lock:
            await self.zk.get_children(parent, watch=self._on_change)
            for name in await self.zk.get_children(UserConfigZNode.path()):
                await self._refresh(desanitize(name))
        await self.process_notifications()

    async def resync(self) -> None:
        """After a new ZooKeeper session: forget every user and load again."""
        self._tracker.last_processed = -1
        for mechanism in ScramMechanism:
            for user in self.cache.users(mechanism):
                self.cache.remove_user(user)
        await self.start()

    def close(self) -> None:
        self._pass.cancel()

    async def wait_idle(self) -> None:
        await self._pass.wait_idle()

    def _on_change(self, _event: Any) -> None:
        self._pass.request()

    async def _refresh(self, user: str) -> None:
        self.cache.update_user(user, await self._read_config(user))

    async def _read_config(self, user: str) -> Mapping[str, str]:
        """`/config/users/<user>`'s config ({} when there is none or it does not parse)."""
        path = UserConfigZNode.path(user)
        try:
            data, stat = await self.zk.get(path)
        except NoNodeError:
            return {}
        try:
            return UserConfigZNode.decode(user, data, stat.version).config
        except InvalidZNodeDataError as e:
            log.error("ignoring %s: %s", path, e)
            return {}

    # -- reads for the admin APIs ---------------------------------------------------------------

    async def read_credentials(self, user: str) -> dict[ScramMechanism, ScramCredential]:
        """The user's credentials as ZooKeeper holds them now, not as the cache last heard of
        them: DescribeUserScramCredentials and AlterUserScramCredentials' deletion check read
        ZooKeeper, as Kafka's do, so a client sees its own write at once whichever broker it
        asks (the cache follows a change notification moments later). The cache is not touched."""
        return credentials_of(user, await self._read_config(user))

    async def users_with_credentials(self) -> list[str]:
        """Every user whose `/config/users` entry holds a SCRAM credential, read from ZooKeeper."""
        try:
            names = await self.zk.get_children(UserConfigZNode.path())
        except NoNodeError:
            return []
        users = sorted(desanitize(name) for name in names)
        return [user for user in users if await self.read_credentials(user)]

    async def process_notifications(self) -> None:
        parent = ConfigChangeNotificationZNode.path()
        async with self._lock:
            children = await self.zk.get_children(parent, watch=self._on_change)
            for child in self._tracker.new_children(children):
                try:
                    data, stat = await self.zk.get(f"{parent}/{child}")
                    change = ConfigChangeNotificationSequenceZNode.decode(data, stat.version)
                except NoNodeError:
                    change = None
                except InvalidZNodeDataError as e:
                    log.error("ignoring config change notification %s: %s", child, e)
                    change = None
                if change is not None:
                    user = user_of_entity_path(f"{change.entity_type}/{change.entity_name}")
                    if user is not None:
                        await self._refresh(user)
                        log.info("reloaded the SCRAM credentials of %r", user)
                self._tracker.processed(child)

    # -- writes -----------------------------------------------------------------------------

    async def alter_credentials(
        self,
        user: str,
        upserts: Mapping[ScramMechanism, ScramCredential] | None = None,
        deletions: tuple[ScramMechanism, ...] = (),
    ) -> None:
        """Set and/or delete a user's credentials (a read-modify-write conditional on the znode
        version), then announce the change. Other config keys of the user are kept."""
        upserts = upserts or {}

        def change(config: dict[str, str]) -> dict[str, str]:
            for mechanism in deletions:
                config.pop(mechanism.mechanism_name, None)
            for mechanism, credential in upserts.items():
                config[mechanism.mechanism_name] = credential.to_string()
            return config

        await self.alter_config(user, change)

    async def alter_config(
        self, user: str, change: Callable[[dict[str, str]], dict[str, str]]
    ) -> None:
        path = UserConfigZNode.path(user)
        for _attempt in range(MAX_UPDATE_RETRIES + 1):
            try:
                data, stat = await self.zk.get(path)
                current = dict(UserConfigZNode.decode(user, data, stat.version).config)
                version = stat.version
            except NoNodeError:
                current, version = {}, None
            new = change(dict(current))
            try:
                if version is None:
                    await self.zk.create(path, UserConfigZNode.encode(new), makepath=True)
                else:
                    await self.zk.set(path, UserConfigZNode.encode(new), version=version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue
            await self.zk.create(
                ConfigChangeNotificationSequenceZNode.path(),
                ConfigChangeNotificationSequenceZNode.encode(
                    UserConfigZNode.ENTITY_TYPE, UserConfigZNode.entity_path(user).split("/", 1)[1]
                ),
                sequence=True,
            )
            async with self._lock:
                await self._refresh(user)
            return
        raise BadVersionError(f"could not update {path}: too many concurrent changes", path=path)
