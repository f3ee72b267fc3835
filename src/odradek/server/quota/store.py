"""Client quotas in ZooKeeper, as Kafka stores them (ZooKeeper mode: `AdminZkClient`,
`DynamicConfigManager` with its `UserConfigHandler` and `ClientIdConfigHandler`).

Formats: a quota lives in the config map of its entity's znode, values as strings:

    /config/users/<user>                       {"version":1,"config":{"producer_byte_rate":"1024"}}
    /config/users/<user>/clients/<client-id>   (same shape)
    /config/clients/<client-id>                (same shape)

with `<default>` for a default user or client id, and names sanitized (`odradek.security.znodes.
sanitize`). `/config/users/<user>` also holds the user's SCRAM credentials
(`odradek.security.credential_store`): a quota write keeps every other key of the map, and is
conditional on the znode version it read (retried on a concurrent change). A change is announced
with `/config/changes/config_change_<seq>` holding `{"version":2,"entity_path":"users/<user>/
clients/<client-id>"}` (or `users/<user>`, `clients/<client-id>`).

Following (`start`), as Kafka's DynamicConfigManager does:
1. set the child watch on `/config/changes`, and take the notifications present then as done
   (unlike Kafka, which re-reads each named entity: the full load covers them);
2. read every user, user+client and client znode and apply its quotas (`ClientQuotas.
   update_entity`);
3. process the notifications that came since; afterwards each fired watch processes the new ones: a
   notification naming a quota entity re-reads that entity's znode (gone: no quotas). Other entity
   types (topics, brokers) belong to other components and are skipped.
Like the other followers of `/config/changes`, this one never deletes notifications.

Concurrency: the broker's event loop; watch callbacks only schedule a pass (`Coalescer`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from odradek.security.notifications import Coalescer, NotificationTracker
from odradek.server.quota.config_changes import new_config_changes, skip_announced_changes
from odradek.server.quota.entities import QuotaEntity
from odradek.server.quota.manager import ClientQuotas
from odradek.zk.client import ZkClient
from odradek.zk.errors import BadVersionError, InvalidZNodeDataError, NodeExistsError, NoNodeError
from odradek.zk.znodes import ConfigChangeNotificationSequenceZNode

log = logging.getLogger(__name__)

MAX_UPDATE_RETRIES = 10
USERS = "/config/users"
CLIENTS = "/config/clients"


def entity_znode(entity: QuotaEntity) -> str:
    return f"/config/{entity.zk_entity_path()}"


def decode_config(data: bytes, where: str) -> dict[str, str]:
    """The config map of an entity znode (empty payload: no config)."""
    if not data:
        return {}
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidZNodeDataError(f"{where}: not JSON ({e})", path=where) from None
    config = obj.get("config") if isinstance(obj, dict) else None
    if config is None:
        return {}
    if not isinstance(config, dict) or not all(isinstance(v, str) for v in config.values()):
        raise InvalidZNodeDataError(f"{where}: 'config' is not a map of strings", path=where)
    return dict(config)


async def read_config_znode(zk: ZkClient, path: str) -> dict[str, str]:
    """The config map of the entity znode at `path`: {} when there is none, or when it is corrupt
    (logged: a reader keeps going with the entity unconfigured)."""
    try:
        data, _stat = await zk.get(path)
        return decode_config(data, path)
    except NoNodeError:
        return {}
    except InvalidZNodeDataError as e:
        log.error("ignoring %s: %s", path, e)
        return {}


def encode_config(config: dict[str, str]) -> bytes:
    return json.dumps({"version": 1, "config": config}, separators=(",", ":")).encode()


class ClientQuotaStore:
    """Keeps `ClientQuotas` equal to ZooKeeper, and reads and writes quota configs."""

    def __init__(self, zk: ZkClient, quotas: ClientQuotas) -> None:
        self.zk = zk
        self.quotas = quotas
        self._tracker = NotificationTracker(ConfigChangeNotificationSequenceZNode.PREFIX)
        self._pass = Coalescer(self.process_notifications, "client-quota-changes")
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            await skip_announced_changes(self.zk, self._tracker, self._on_change)
            for entity, config in (await self.all_configs()).items():
                self.quotas.update_entity(entity, config)
        await self.process_notifications()

    async def resync(self) -> None:
        """After a new ZooKeeper session: forget every quota and load again."""
        self._tracker.last_processed = -1
        for manager in self.quotas.by_type.values():
            for entity in list(manager.overrides):
                manager.update_quota(entity, None)
        await self.start()

    def close(self) -> None:
        self._pass.cancel()

    def _on_change(self, _event: Any) -> None:
        self._pass.request()

    async def process_notifications(self) -> None:
        async with self._lock:
            async for child, change in new_config_changes(self.zk, self._tracker, self._on_change):
                try:
                    entity = QuotaEntity.from_zk_entity_path(
                        f"{change.entity_type}/{change.entity_name}"
                    )
                except InvalidZNodeDataError as e:
                    log.error("ignoring config change notification %s: %s", child, e)
                    continue
                if entity is not None:
                    config = await self.read_config(entity)
                    self.quotas.update_entity(entity, config)
                    log.info("quotas of %s: %s", entity.zk_entity_path(), _quota_part(config))

    # reads

    async def read_config(self, entity: QuotaEntity) -> dict[str, str]:
        """The whole config map of an entity's znode ({} when there is none or it is corrupt)."""
        return await read_config_znode(self.zk, entity_znode(entity))

    async def all_configs(self) -> dict[QuotaEntity, dict[str, str]]:
        """Every user, user+client and client entity's config map."""
        entities: list[QuotaEntity] = []
        for user in await self.zk.children_or_empty(USERS):
            entities.append(QuotaEntity(user=user))
            for client in await self.zk.children_or_empty(f"{USERS}/{user}/clients"):
                entities.append(QuotaEntity(user=user, client_id=client))
        for client in await self.zk.children_or_empty(CLIENTS):
            entities.append(QuotaEntity(client_id=client))
        configs = await asyncio.gather(*(self.read_config(e) for e in entities))
        return dict(zip(entities, configs, strict=True))

    # writes

    async def alter_config(
        self, entity: QuotaEntity, change: Callable[[dict[str, str]], dict[str, str]]
    ) -> None:
        """Replace the entity's config map by `change(current)` (a read-modify-write conditional
        on the znode version, retried on a concurrent change), then announce it and apply it here
        at once (other brokers follow the notification)."""
        path = entity_znode(entity)
        for _attempt in range(MAX_UPDATE_RETRIES + 1):
            try:
                data, stat = await self.zk.get(path)
                current, version = decode_config(data, path), stat.version
            except NoNodeError:
                current, version = {}, None
            new = change(dict(current))
            try:
                if version is None:
                    await self.zk.create(path, encode_config(new), makepath=True)
                else:
                    await self.zk.set(path, encode_config(new), version=version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue
            entity_type, _slash, name = entity.zk_entity_path().partition("/")
            await self.zk.create(
                ConfigChangeNotificationSequenceZNode.path(),
                ConfigChangeNotificationSequenceZNode.encode(entity_type, name),
                sequence=True,
            )
            self.quotas.update_entity(entity, new)
            return
        raise BadVersionError(f"could not update {path}: too many concurrent changes", path=path)


def _quota_part(config: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in config.items() if not k.startswith("SCRAM-")}
