"""The broker's quota components in one place (Kafka's `QuotaFactory.QuotaManagers` and the
quota part of its `DynamicConfigManager`): the client quota managers, their ZooKeeper store, and
the replication throttles.

Start-up (`start`, once ZooKeeper is connected and before the broker listens, so that the first
request already sees every quota): load the client quotas and follow their changes; load the
replication throttle rates of this broker and follow theirs. `resync` reloads both after a new
ZooKeeper session (a watch set in the expired one is gone).

Concurrency: the broker's event loop thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from odradek.cluster.replication_quota import ReplicationQuotas
from odradek.server.quota.manager import ClientQuotas
from odradek.server.quota.rate import RateConfig, SimpleRate
from odradek.server.quota.replication import ReplicationThrottleFollower
from odradek.server.quota.store import ClientQuotaStore
from odradek.zk.client import ZkClient

log = logging.getLogger(__name__)


class BrokerQuotas:
    def __init__(self, config: Any, broker_id: int) -> None:
        self.client = ClientQuotas(
            RateConfig(config["quota.window.num"], config["quota.window.size.seconds"] * 1000)
        )
        self.replication = ReplicationQuotas(
            RateConfig(
                config["replication.quota.window.num"],
                config["replication.quota.window.size.seconds"] * 1000,
            ),
            SimpleRate,
        )
        self.broker_id = broker_id
        self._store: ClientQuotaStore | None = None
        self._throttles: ReplicationThrottleFollower | None = None

    @property
    def store(self) -> ClientQuotaStore:
        if self._store is None:
            raise RuntimeError("the client quota store is used before start()")
        return self._store

    @property
    def throttles(self) -> ReplicationThrottleFollower:
        if self._throttles is None:
            raise RuntimeError("the replication throttles are used before start()")
        return self._throttles

    async def start(self, zk: ZkClient) -> None:
        """Load and watch. Called again when an attempt was cut short by a ZooKeeper session
        expiry or connection loss (`BrokerZk._in_a_session`): what an earlier attempt made
        reloads rather than being made twice."""
        if self._store is None:
            self._store = ClientQuotaStore(zk, self.client)
            await self._store.start()
        else:
            await self._store.resync()
        if self._throttles is None:
            self._throttles = ReplicationThrottleFollower(zk, self.broker_id, self.replication)
            await self._throttles.start()
        else:
            await self._throttles.resync()

    def attach(self, replica_manager: Any, topic_config: Callable[[str], dict[str, str]]) -> None:
        """Hand the replication throttles to the leader's read path and the follower's fetchers,
        with where the throttled replicas (topic configs) come from."""
        self.replication.bind(self.broker_id, topic_config)
        replica_manager.leader_throttle = self.replication.leader
        if replica_manager.fetcher_manager is not None:
            replica_manager.fetcher_manager.throttle = self.replication.follower

    async def resync(self) -> None:
        log.info("reloading client quotas and replication throttles after a new session")
        if self._store is not None:
            await self._store.resync()
        if self._throttles is not None:
            await self._throttles.resync()

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
        if self._throttles is not None:
            self._throttles.close()
