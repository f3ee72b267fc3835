"""The broker's shutdown, and its controlled shutdown through the controller.

Shutdown (`BrokerShutdown.shutdown`): controlled shutdown through the controller (leadership moves
away first), stop listening, stop the controller and the replica manager (fetchers, HW checkpoint),
close the log cleaner (a cleaning in progress is aborted: its `.cleaned` files go), close the logs
cleanly (flush, checkpoints, clean-shutdown marker), then close the ZooKeeper session — which
removes our registration last.

`controlled_shutdown` sends ControlledShutdown to the active controller (as this broker's
controller component or the metadata cache knows it) and retries as `controlled.shutdown.*` say
until no partition is led here any more.

`BrokerShutdown` is a base of `Broker` (broker.py, which says how start-up builds each component);
it works on the fields `Broker.__init__` sets, declared below.

Concurrency: the broker's event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from odradek.cluster.replica_manager import ReplicaManager
from odradek.controller.controller import KafkaController
from odradek.coordinator.group.coordinator import GroupCoordinator
from odradek.coordinator.transaction.coordinator import TransactionCoordinator
from odradek.log.log_cleaner import LogCleaner
from odradek.log.log_manager import LogManager
from odradek.network.client import BrokerConnection, ClientSecurity
from odradek.network.server import SocketServer
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey
from odradek.server.broker_security import BrokerSecurity
from odradek.server.config import KafkaConfig
from odradek.server.log_dir_failure import LogDirFailureHandler
from odradek.server.metadata_cache import MetadataCache
from odradek.server.metrics.exporter import MetricsExporter
from odradek.server.quota.broker_quotas import BrokerQuotas
from odradek.zk.client import ZkClient

log = logging.getLogger(__name__)


class BrokerShutdown:
    """The broker's shutdown sequence (see the module docstring)."""

    # set by Broker.__init__ (the components by Broker.startup)
    config: KafkaConfig
    broker_id: int
    broker_epoch: int
    started: bool
    zk: ZkClient | None
    log_manager: LogManager | None
    log_cleaner: LogCleaner | None
    metadata_cache: MetadataCache
    security: BrokerSecurity
    quotas: BrokerQuotas
    inter_broker_client: ClientSecurity
    socket_servers: list[SocketServer]
    metrics_exporter: MetricsExporter | None
    replica_manager: ReplicaManager
    controller: KafkaController
    group_coordinator: GroupCoordinator
    transaction_coordinator: TransactionCoordinator
    log_dir_failure: LogDirFailureHandler
    _tasks: list[asyncio.Task[Any]]
    _stopped: asyncio.Event
    _shutting_down: bool

    if TYPE_CHECKING:  # defined by Broker

        @property
        def _zk(self) -> ZkClient: ...

        @property
        def _log_manager(self) -> LogManager: ...

    async def controlled_shutdown(self) -> bool:
        """Ask the controller to move our leaderships away; retries as `controlled.shutdown.*`."""
        if (
            not self.config["controlled.shutdown.enable"]
            or self.zk is None
            or self.broker_epoch < 0
        ):
            return False
        retries = self.config["controlled.shutdown.max.retries"]
        backoff = self.config["controlled.shutdown.retry.backoff.ms"] / 1000
        timeout = self.config["controller.socket.timeout.ms"] / 1000
        from odradek.protocol.messages import ControlledShutdownRequestV3

        for attempt in range(retries + 1):
            controller_id = self.metadata_cache.controller_id
            if self.controller is not None and self.controller.active_controller_id >= 0:
                controller_id = self.controller.active_controller_id
            endpoint = self.metadata_cache.get_broker(controller_id)
            if endpoint is not None:
                host, port = endpoint.host, endpoint.port
            else:
                host, port = "", 0
            if port:
                try:
                    connection = await BrokerConnection.connect(
                        host, port, timeout=timeout, security=self.inter_broker_client
                    )
                    try:
                        response = await connection.send(
                            ApiKey.CONTROLLED_SHUTDOWN,
                            3,
                            build(
                                ControlledShutdownRequestV3,
                                {"broker_id": self.broker_id, "broker_epoch": self.broker_epoch},
                            ),
                            timeout=timeout,
                        )
                    finally:
                        connection.close()
                    if response.error_code == 0 and not response.remaining_partitions:
                        log.info("controlled shutdown succeeded")
                        return True
                    log.info(
                        "controlled shutdown attempt %d: error %s, %d partitions still led",
                        attempt + 1,
                        response.error_code,
                        len(response.remaining_partitions),
                    )
                except Exception as e:
                    log.info("controlled shutdown attempt %d failed: %s", attempt + 1, e)
            if attempt < retries:
                await asyncio.sleep(backoff)
        log.warning("controlled shutdown did not complete; shutting down anyway")
        return False

    async def shutdown(self) -> None:
        if self._shutting_down:
            await self._stopped.wait()
            return
        self._shutting_down = True
        log.info("broker %d shutting down", self.broker_id)
        try:
            if self.started:
                with contextlib.suppress(Exception):
                    await self.controlled_shutdown()
            # After the controlled shutdown, as Kafka closes its metrics reporters late: the
            # exporter's thread notices a stop only at its next poll (up to 0.5 s), which the
            # leaderships' move would otherwise wait for.
            if self.metrics_exporter is not None:
                await self.metrics_exporter.stop()
            if self.group_coordinator is not None:
                # Parked JoinGroup/SyncGroup requests get NOT_COORDINATOR while we still can answer.
                await self.group_coordinator.shutdown()
            if self.transaction_coordinator is not None:
                await self.transaction_coordinator.shutdown()
            for server in self.socket_servers:
                await server.stop()
            if self.controller is not None:
                with contextlib.suppress(Exception):
                    await self.controller.shutdown()
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self.log_dir_failure.stop()
            if self.replica_manager is not None:
                await self.replica_manager.shutdown()
            if self.log_cleaner is not None:
                with contextlib.suppress(Exception):
                    await self.log_cleaner.shutdown()
            if self.log_manager is not None:
                self._log_manager.shutdown()
            await self.security.close()
            self.quotas.close()
            if self.zk is not None:
                await self._zk.close()
        finally:
            self._stopped.set()
        log.info("broker %d shut down cleanly", self.broker_id)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
