"""Topic config overrides on this broker, read from `/config/topics/<topic>` and kept current.

A broker needs a topic's config before it creates the topic's logs (segment size, retention,
timestamp type) and when it checks `min.insync.replicas`. Configs are loaded on demand
(`ensure_loaded`, awaited by the LeaderAndIsr handler before partitions are created) and refreshed
when a `/config/changes/config_change_<seq>` notification names the topic (Kafka's
DynamicConfigManager); a change updates the config of the topic's existing logs.

Concurrency: the broker's event loop; watch callbacks arrive on it too (see `odradek.zk.client`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from odradek.zk.client import WatchEvent, ZkClient
from odradek.zk.errors import NoNodeError, ZkError
from odradek.zk.znodes import (
    ConfigChangeNotificationSequenceZNode,
    ConfigChangeNotificationZNode,
    TopicConfigZNode,
)

log = logging.getLogger(__name__)


class TopicConfigs:
    def __init__(self, zk: ZkClient, on_change: Callable[[str, dict[str, str]], None]) -> None:
        self.zk = zk
        self._on_change = on_change
        self._configs: dict[str, dict[str, str]] = {}
        self._seen_notifications: set[str] = set()
        self._refresh_task: asyncio.Task[None] | None = None

    def get(self, topic: str) -> dict[str, str]:
        return self._configs.get(topic, {})

    def loaded(self, topics: Iterable[str]) -> bool:
        """Every one of `topics` has its config here (ensure_loaded would read nothing)."""
        configs = self._configs
        return all(t in configs for t in topics)

    async def ensure_loaded(self, topics: Iterable[str]) -> None:
        missing = [t for t in set(topics) if t not in self._configs]
        if missing:
            results = await asyncio.gather(
                *(self._read(t) for t in missing), return_exceptions=True
            )
            for topic, result in zip(missing, results, strict=True):
                if isinstance(result, BaseException):
                    log.warning("cannot read the config of %s (%s); using defaults", topic, result)
                    self._configs[topic] = {}
                else:
                    self._configs[topic] = result

    async def _read(self, topic: str) -> dict[str, str]:
        try:
            data, stat = await self.zk.get(TopicConfigZNode.path(topic))
        except NoNodeError:
            return {}
        return dict(TopicConfigZNode.decode(data, stat.version, topic).config)

    def forget(self, topic: str) -> None:
        self._configs.pop(topic, None)

    async def start(self) -> None:
        """Watch for config change notifications (existing ones are not replayed)."""
        try:
            self._seen_notifications = set(
                await self.zk.get_children(ConfigChangeNotificationZNode.path(), self._watch)
            )
        except NoNodeError:
            self._seen_notifications = set()

    async def resync(self) -> None:
        """After a new ZooKeeper session (the watch died with the old one, and changes may have
        been made meanwhile): watch again, apply the notifications not seen yet, and re-read
        every topic whose config we hold, applying those that changed."""
        await self._process_notifications()
        for topic in list(self._configs):
            try:
                config = await self._read(topic)
            except ZkError as e:
                log.warning("cannot re-read the config of %s after a new session: %s", topic, e)
                continue
            if topic in self._configs and config != self._configs[topic]:
                self._configs[topic] = config
                log.info("config of topic %s changed while the session was lost: %s", topic, config)
                self._on_change(topic, config)

    def _watch(self, event: WatchEvent) -> None:
        if self._refresh_task is None or self._refresh_task.done():
            self._refresh_task = asyncio.get_running_loop().create_task(
                self._process_notifications()
            )

    async def _process_notifications(self) -> None:
        try:
            children = set(
                await self.zk.get_children(ConfigChangeNotificationZNode.path(), self._watch)
            )
        except ZkError as e:
            log.warning("cannot read config change notifications: %s", e)
            return
        new = sorted(children - self._seen_notifications)
        self._seen_notifications = children
        for child in new:
            try:
                data, stat = await self.zk.get(f"{ConfigChangeNotificationZNode.path()}/{child}")
                notification = ConfigChangeNotificationSequenceZNode.decode(data, stat.version)
            except ZkError as e:
                log.debug("config change %s unreadable: %s", child, e)
                continue
            if notification.entity_type != "topics":
                continue
            topic = notification.entity_name
            try:
                config = await self._read(topic)
            except ZkError as e:
                log.warning("cannot read the config of %s: %s", topic, e)
                continue
            self._configs[topic] = config
            log.info("config of topic %s changed: %s", topic, config)
            self._on_change(topic, config)
