"""The replication throttle rates of this broker, from ZooKeeper (Kafka's `BrokerConfigHandler`
for `leader.replication.throttled.rate` and `follower.replication.throttled.rate`).

Both are dynamic broker configs: set per broker in `/config/brokers/<id>` or for every broker in
`/config/brokers/<default>` (`{"version":1,"config":{"leader.replication.throttled.rate":
"1048576"}}`), a per-broker value winning over the default; unset, replication is unbounded.
`kafka-reassign-partitions.sh --throttle` and `kafka-configs.sh --entity-type brokers` write them.
This is a small reader of its own, following the `brokers/<id>` and `brokers/<default>` change
notifications; the dynamic broker config component (KIP-226) owns those znodes and their
validation.

The throttled replicas are topic configs, read where they are used
(`odradek.cluster.replication_quota.ReplicationQuotaManager.is_throttled`).

Concurrency: the broker's event loop; watch callbacks only schedule a pass (`Coalescer`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from odradek.cluster.replication_quota import (
    FOLLOWER_THROTTLED_RATE,
    LEADER_THROTTLED_RATE,
    ReplicationQuotas,
)
from odradek.security.notifications import Coalescer, NotificationTracker
from odradek.server.quota.config_changes import new_config_changes, skip_announced_changes
from odradek.server.quota.store import read_config_znode
from odradek.zk.client import ZkClient
from odradek.zk.znodes import BrokerConfigZNode, ConfigChangeNotificationSequenceZNode

log = logging.getLogger(__name__)


def throttle_bounds(
    broker: dict[str, str], default: dict[str, str]
) -> tuple[float | None, float | None]:
    """(leader bound, follower bound) from this broker's and the default config (None: unbounded;
    a value that is not a non-negative integer is ignored, with a log line)."""
    bounds = []
    for key in (LEADER_THROTTLED_RATE, FOLLOWER_THROTTLED_RATE):
        text = broker.get(key, default.get(key))
        bound: float | None = None
        if text is not None:
            try:
                value = int(text.strip())
                if value < 0:
                    raise ValueError("negative")
                bound = float(value)
            except ValueError:
                log.error("ignoring %s=%r: not a non-negative integer", key, text)
        bounds.append(bound)
    return bounds[0], bounds[1]


class ReplicationThrottleFollower:
    def __init__(self, zk: ZkClient, broker_id: int, quotas: ReplicationQuotas) -> None:
        self.zk = zk
        self.broker_id = broker_id
        self.quotas = quotas
        self._tracker = NotificationTracker(ConfigChangeNotificationSequenceZNode.PREFIX)
        self._pass = Coalescer(self.process_notifications, "replication-throttle-changes")
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            await skip_announced_changes(self.zk, self._tracker, self._on_change)
            await self._reload()
        await self.process_notifications()

    async def resync(self) -> None:
        self._tracker.last_processed = -1
        await self.start()

    def close(self) -> None:
        self._pass.cancel()

    def _on_change(self, _event: Any) -> None:
        self._pass.request()

    async def _read(self, name: str) -> dict[str, str]:
        return await read_config_znode(self.zk, BrokerConfigZNode.path(name))

    async def _reload(self) -> None:
        leader, follower = throttle_bounds(
            await self._read(str(self.broker_id)), await self._read(BrokerConfigZNode.DEFAULT)
        )
        if (leader, follower) != (self.quotas.leader.bound, self.quotas.follower.bound):
            log.info("replication throttles: leader %s, follower %s bytes/s", leader, follower)
        self.quotas.leader.update_quota(leader)
        self.quotas.follower.update_quota(follower)

    async def process_notifications(self) -> None:
        ours = {str(self.broker_id), BrokerConfigZNode.DEFAULT}
        async with self._lock:
            changed = False
            async for _child, change in new_config_changes(self.zk, self._tracker, self._on_change):
                if change.entity_type == "brokers" and change.entity_name in ours:
                    changed = True
            if changed:
                await self._reload()
