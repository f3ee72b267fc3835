"""The broker's own state in ZooKeeper: the cluster id, its registration (`/brokers/ids/<id>`,
whose czxid is the broker epoch; a previous process's registration is reclaimed at once by
`session_reclaim`), the logs ZooKeeper no longer assigns to it (deleted at
start-up), its leaders' ISR change notifications for the controller, and what a session expiry
means for it (fence every leadership, re-sync the security caches).

`BrokerZk` is a base of `Broker` (broker.py, which says when each step runs); it works on the
fields `Broker.__init__` sets, declared below.

Concurrency: the broker's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from odradek.cluster.replica_manager import ReplicaManager
from odradek.errors import OperatorError
from odradek.log.log_manager import LogManager
from odradek.log.partition_metadata import read_partition_topic_id
from odradek.network.server import SocketServer
from odradek.protocol.topic_ids import uuid_to_topic_id
from odradek.server.admin.topic_configs import TopicConfigs
from odradek.server.broker_security import BrokerSecurity
from odradek.server.config import KafkaConfig
from odradek.server.dynamic_config_manager import DynamicConfigManager
from odradek.server.quota.broker_quotas import BrokerQuotas
from odradek.server.session_reclaim import reclaim_registration, record_session
from odradek.zk.client import SessionState, ZkClient
from odradek.zk.errors import (
    ConnectionLossError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from odradek.zk.ops import CreateOp
from odradek.zk.znodes import (
    BrokerIdZNode,
    ClusterIdZNode,
    EndPoint,
    IsrChangeNotificationSequenceZNode,
)
from odradek.zk.znodes import (
    TopicPartition as ZkTopicPartition,
)

log = logging.getLogger(__name__)

ISR_CHANGE_NOTIFICATION_BYTES = 400_000

T = TypeVar("T")


# Attempts at a start-up step (the registration, loading the broker's state from ZooKeeper) cut
# short by a session expiry before the broker gives up.
STARTUP_SESSION_ATTEMPTS = 5


class BrokerZk:
    """The broker's registration and notifications in ZooKeeper (see the module docstring)."""

    # set by Broker.__init__
    config: KafkaConfig
    broker_id: int
    broker_epoch: int
    registered: asyncio.Event
    security: BrokerSecurity
    quotas: BrokerQuotas
    dynamic_config_manager: DynamicConfigManager
    topic_configs: TopicConfigs
    socket_servers: list[SocketServer]
    replica_manager: ReplicaManager
    _tasks: list[asyncio.Task[Any]]
    _session_expired: bool

    if TYPE_CHECKING:  # defined by Broker

        @property
        def _zk(self) -> ZkClient: ...

        @property
        def _log_manager(self) -> LogManager: ...

    async def _get_or_create_cluster_id(self) -> str:
        try:
            data, stat = await self._zk.get(ClusterIdZNode.path())
            return ClusterIdZNode.decode(data, stat.version).id
        except NoNodeError:
            pass
        candidate = uuid_to_topic_id(uuid.uuid4())
        try:
            await self._zk.create(
                ClusterIdZNode.path(), ClusterIdZNode.encode(candidate), makepath=True
            )
            return candidate
        except NodeExistsError:
            data, stat = await self._zk.get(ClusterIdZNode.path())
            return ClusterIdZNode.decode(data, stat.version).id

    async def _delete_stray_partitions(self) -> None:
        """Delete local logs that ZooKeeper no longer assigns to this broker.

        The seed's case: a topic deleted and re-created while this broker was down. Its old logs
        must not be served as the new topic's; the recorded topic id (`partition.metadata`) tells an
        old incarnation from the new one even when the assignment looks the same.
        """
        local = self._log_manager.all_logs()
        if not local:
            return
        from odradek.controller.controller_zk import ControllerZk

        assignments = await ControllerZk(self._zk).get_topic_assignments(
            {log_.topic for log_ in local}
        )
        for log_ in local:
            assignment = assignments.get(log_.topic)
            replicas = assignment.partitions.get(log_.partition) if assignment is not None else None
            reason = None
            if assignment is None:
                reason = "its topic no longer exists"
            elif replicas is None or self.broker_id not in replicas.replicas:
                reason = "it is no longer assigned to this broker"
            else:
                recorded = read_partition_topic_id(log_.dir)
                if recorded and assignment.topic_id and recorded != assignment.topic_id:
                    reason = f"it belongs to an earlier topic {log_.topic} (id {recorded})"
            if reason is not None:
                log.info("deleting stray log %s-%d: %s", log_.topic, log_.partition, reason)
                self._log_manager.delete_log(log_.topic, log_.partition)

    async def _register_broker(self) -> None:
        """Create `/brokers/ids/<id>`; our broker epoch is its czxid."""
        bound = {s.listener: s.port for s in self.socket_servers}
        endpoints = [
            EndPoint(
                e.listener,
                e.host,
                bound.get(e.listener, e.port) if e.port == 0 else e.port,
                e.security_protocol,
            )
            for e in self.config.advertised_listeners
        ]
        data = BrokerIdZNode.encode(endpoints, rack=self.config["broker.rack"])
        path = BrokerIdZNode.path(self.broker_id)
        live_log_dirs = self._log_manager.live_log_dirs
        if self.broker_epoch < 0 and self.config["zookeeper.session.reclaim.enable"]:
            # This process's first registration: if the registration there is our previous
            # process's (killed with its session open), end that session now (session_reclaim;
            # opt-in, see there).
            await reclaim_registration(self._zk, self.broker_id, live_log_dirs)
        # A new session (start-up, or after an expiry) is recorded before it registers, so that
        # our next process can reclaim whatever this one leaves behind.
        record_session(self._zk, self.broker_id, live_log_dirs)
        # Otherwise an earlier incarnation's registration goes when its session expires: within a
        # session timeout of ZooKeeper serving. While ZooKeeper does not serve (our session
        # suspended, a quorum lost) no session expires, and a new quorum leader gives every
        # session a fresh timeout, so only the time we are connected counts towards giving up.
        patience = self.config["zookeeper.session.timeout.ms"] / 1000 + 5
        waited = 0.0
        while True:
            try:
                await self._zk.create(path, data, ephemeral=True)
                break
            except NodeExistsError:
                # Ours from a session that is still expiring, or another broker with our id.
                try:
                    _existing, stat = await self._zk.get(path)
                except NoNodeError:
                    continue  # the old registration expired just now: create again
                if stat.ephemeralOwner == self._zk.session_id:
                    break
                if waited > patience:
                    raise OperatorError(
                        f"broker.id {self.broker_id} is already registered in ZooKeeper by another broker"
                    ) from None
                started = time.monotonic()
                await asyncio.sleep(0.5)
                if self._zk.connected:
                    waited += time.monotonic() - started
                else:
                    waited = 0.0  # the old session's timeout starts again once ZooKeeper serves
        _, stat = await self._zk.get(path)
        self.broker_epoch = stat.czxid
        self.registered.set()
        log.info("registered %s with broker epoch %d", path, self.broker_epoch)

    async def _register_at_startup(self) -> None:
        """Register, once more in the new session if the session expires under the registration
        (`_in_a_session`)."""
        await self._in_a_session("register", "registering", self._register_broker)

    async def _in_a_session(self, purpose: str, doing: str, step: Callable[[], Awaitable[T]]) -> T:
        """Run a start-up step that talks to ZooKeeper until it completes in one session: again
        in the new session if the session expires under it (a ZooKeeper quorum lost for longer
        than the session timeout while we start), as Kafka's broker retries its ZooKeeper
        requests in a new session (`KafkaZkClient`'s `retryRequestsUntilConnected`) rather than
        exit. The soak found both the registration (seed 436106115) and the credential store's
        set-up (run 15) ending a start-up with a SessionExpiredError.

        A connection lost under the step (the request given up after the client's deadline, the
        session still alive) is retried once connected again, as Kafka's
        `retryRequestsUntilConnected` does; every step is written so that running it twice is
        harmless (a create that landed before the loss is found as our own). ZooKeeper not
        serving again within zookeeper.connection.timeout.ms ends the start-up, with a one-line
        error; so does a session expiring under each of STARTUP_SESSION_ATTEMPTS attempts."""
        attempt = 1
        while True:
            try:
                expired = self._zk.session_id
                return await step()
            except ConnectionLossError:
                log.warning("ZooKeeper connection lost while %s; trying again", doing)
                await self._wait_for_session(None, doing)
                continue
            except SessionExpiredError:
                if attempt == STARTUP_SESSION_ATTEMPTS:
                    raise OperatorError(
                        f"broker {self.broker_id}: the ZooKeeper session expired during each of "
                        f"{attempt} attempts to {purpose}"
                    ) from None
                log.warning(
                    "ZooKeeper session expired while %s (attempt %d); trying again in a new "
                    "session",
                    doing,
                    attempt,
                )
                attempt += 1
                await self._wait_for_session(expired, doing)

    async def _wait_for_session(self, expired: int | None, doing: str) -> None:
        """Wait (bounded by zookeeper.connection.timeout.ms) until the client is connected, in a
        session other than `expired` if given: until then every request fails at once (the soak
        saw five attempts spent within a millisecond)."""
        timeout = self.config.zookeeper_connection_timeout_ms / 1000
        deadline = time.monotonic() + timeout
        while not (self._zk.connected and self._zk.session_id != expired):
            if time.monotonic() >= deadline:
                raise OperatorError(
                    f"ZooKeeper at {self._zk.connect_string} unreachable within {timeout:g}s "
                    f"while {doing}"
                )
            await asyncio.sleep(0.05)

    def _resync_after_expiry(self) -> None:
        """A new session: every cache kept equal to ZooKeeper reloads and re-arms its watches
        (a session's watches die with it)."""
        loop = asyncio.get_running_loop()
        for resync in (
            self.security.resync,
            self.quotas.resync,
            self.dynamic_config_manager.resync,
            self.topic_configs.resync,
        ):
            self._tasks.append(loop.create_task(resync()))

    def _on_session_state(self, state: SessionState) -> None:
        if state is SessionState.CONNECTED and self._session_expired:
            self._session_expired = False
            self._resync_after_expiry()
        if state is SessionState.EXPIRED:
            self._session_expired = True
            # The controller has seen us die: every partition we lead is being (or has been)
            # given to another replica. Stop taking writes now rather than at our next ISR write.
            log.warning("ZooKeeper session expired; fencing our leaderships and re-registering")
            if self.replica_manager is not None:
                for partition in self.replica_manager.partitions.values():
                    if partition.is_leader:
                        partition.fence("the ZooKeeper session expired")

    async def _publish_isr_changes(self, partitions: list[tuple[str, int]]) -> None:
        """One `/isr_change_notification` znode per chunk of changes: a znode (and the request
        creating it) must stay under ZooKeeper's 1 MB jute.maxbuffer, and a leader shrinking tens of
        thousands of ISRs at once would exceed it in one piece."""
        chunk: list[ZkTopicPartition] = []
        size = 0
        for topic, partition in partitions:
            chunk.append(ZkTopicPartition(topic, partition))
            size += len(topic) + 40  # the JSON of one entry, with room to spare
            if size >= ISR_CHANGE_NOTIFICATION_BYTES:
                await self._create_isr_change_notification(chunk)
                chunk, size = [], 0
        if chunk:
            await self._create_isr_change_notification(chunk)

    async def _create_isr_change_notification(self, partitions: list[ZkTopicPartition]) -> None:
        data = IsrChangeNotificationSequenceZNode.encode(partitions)
        await self._zk.multi(
            [CreateOp(IsrChangeNotificationSequenceZNode.path(), data, sequence=True)]
        )
