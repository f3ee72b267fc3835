"""Dynamic broker configs on one broker: read from ZooKeeper at start-up, followed through the
`/config/changes` notifications, and applied to the running components (Kafka's
DynamicConfigManager with ConfigHandler.BrokerConfigHandler, and the BrokerReconfigurables of
DynamicBrokerConfig).

Start-up (`start`, called by `Broker.startup` right after ZooKeeper, before the broker listens or
builds its components): read `/config/brokers/<default>` and `/config/brokers/<id>` into
`DynamicBrokerConfig` (so the components are built with the effective values), and watch
`/config/changes`. Existing notifications are not replayed: the znodes themselves were just read.

A notification whose `entity_path` is `brokers/<default>` or `brokers/<our id>` re-reads that znode;
the values that changed are then applied (`_reconfigure`), each family by the component that owns
it (see `odradek.server.dynamic_config` for the table): log configs to every log, the unclean
election default to the controller, the cleaner and fetcher counts, the connection limits.
Notifications for other entity types (topics, users, clients) are other components' business.

Concurrency: the broker's event loop; watch callbacks arrive on it (`odradek.zk.client`). Changes
are applied one notification at a time, in sequence order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from odradek.log.log_cleaner import CleanerConfig
from odradek.network.quotas import parse_overrides
from odradek.security.errors import SecurityConfigError
from odradek.security.ssl_config import listener_ssl_config, server_context
from odradek.server.admin.topics import log_config_for
from odradek.server.broker_configs import read_broker_config
from odradek.server.dynamic_config import (
    CLEANER_CONFIGS,
    DEFAULT_ENTITY,
    FETCHER_CONFIGS,
    LOG_CONFIGS,
    DynamicBrokerConfig,
    listener_ssl_names,
)
from odradek.zk.client import WatchEvent, ZkClient
from odradek.zk.errors import NoNodeError, ZkError
from odradek.zk.znodes import ConfigChangeNotificationSequenceZNode, ConfigChangeNotificationZNode

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ReplicaManager
    from odradek.controller.controller import KafkaController
    from odradek.log.config import LogConfig
    from odradek.log.log_cleaner import LogCleaner
    from odradek.log.log_manager import LogManager
    from odradek.network.server import SocketServer
    from odradek.server.admin.topic_configs import TopicConfigs
    from odradek.server.config import KafkaConfig

log = logging.getLogger(__name__)


class ReconfigurableBroker(Protocol):
    """What the manager reconfigures (`Broker` satisfies it; the components may still be None
    while the broker starts)."""

    broker_id: int
    config: KafkaConfig
    zk: ZkClient | None
    log_manager: LogManager | None
    log_cleaner: LogCleaner | None
    controller: KafkaController
    replica_manager: ReplicaManager
    socket_servers: list[SocketServer]
    topic_configs: TopicConfigs | None

    def clear_log_configs(self) -> None: ...

    def log_config_for(self, topic: str) -> LogConfig: ...


class DynamicConfigManager:
    def __init__(self, broker: ReconfigurableBroker, dynamic: DynamicBrokerConfig) -> None:
        self.broker = broker
        self.dynamic = dynamic
        self._seen: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._pending = False
        self._tls_settings: dict[str, dict[str, str]] = {}

    @property
    def _zk(self) -> ZkClient:
        zk = self.broker.zk
        if zk is None:
            from odradek.errors import InvariantError

            raise InvariantError("dynamic configs need the broker's ZooKeeper client")
        return zk

    async def start(self) -> None:
        zk = self._zk
        try:
            self._seen = set(
                await zk.get_children(ConfigChangeNotificationZNode.path(), self._watch)
            )
        except NoNodeError:
            self._seen = set()
        default = await read_broker_config(zk, DEFAULT_ENTITY)
        own = await read_broker_config(zk, str(self.broker.broker_id))
        changed = self.dynamic.load(per_broker=own, cluster_default=default)
        if changed:
            log.info(
                "dynamic broker configs in effect: %s",
                ", ".join(f"{name}={new}" for name, (_, new) in sorted(changed.items())),
            )
        log_manager = self.broker.log_manager
        if set(changed) & LOG_CONFIGS and log_manager is not None:
            # The logs opened in step 1 took the static defaults; topics' own configs come
            # with LeaderAndIsr, which starts after this.
            log_manager.update_default_config(log_config_for(self.broker.config, {}))

    async def resync(self) -> None:
        """After a new ZooKeeper session (watches are gone, changes may have been missed):
        watch again and re-read both levels."""
        try:
            await self._process_once()
            zk = self._zk
            default = await read_broker_config(zk, DEFAULT_ENTITY)
            own = await read_broker_config(zk, str(self.broker.broker_id))
            await self._reconfigure(self.dynamic.load(per_broker=own, cluster_default=default))
            self.reload_listener_tls()
        except Exception:
            log.exception("dynamic broker configs could not be re-read after a new session")

    def _watch(self, event: WatchEvent) -> None:
        if self._task is not None and not self._task.done():
            self._pending = True
            return
        self._task = asyncio.get_running_loop().create_task(self._process_notifications())

    async def _process_notifications(self) -> None:
        while True:
            self._pending = False
            try:
                await self._process_once()
            except Exception:
                log.exception("dynamic broker config change could not be applied")
            if not self._pending:
                return

    async def _process_once(self) -> None:
        zk = self._zk
        try:
            children = set(await zk.get_children(ConfigChangeNotificationZNode.path(), self._watch))
        except ZkError as e:
            log.warning("cannot read config change notifications: %s", e)
            return
        new = sorted(children - self._seen)
        self._seen = children
        ours = {DEFAULT_ENTITY, str(self.broker.broker_id)}
        for child in new:
            try:
                data, stat = await zk.get(f"{ConfigChangeNotificationZNode.path()}/{child}")
                notification = ConfigChangeNotificationSequenceZNode.decode(data, stat.version)
            except ZkError as e:
                log.debug("config change %s unreadable: %s", child, e)
                continue
            log.debug(
                "config change notification %s: %s/%s",
                child,
                notification.entity_type,
                notification.entity_name,
            )
            if notification.entity_type != "brokers" or notification.entity_name not in ours:
                continue
            entity = notification.entity_name
            stored = await read_broker_config(zk, entity)
            if entity == DEFAULT_ENTITY:
                changed = self.dynamic.load(cluster_default=stored)
            else:
                changed = self.dynamic.load(per_broker=stored)
            log.info(
                "dynamic configs of %s changed to %s; applying %s",
                "the cluster default" if entity == DEFAULT_ENTITY else f"broker {entity}",
                stored,
                sorted(changed) or "nothing new",
            )
            await self._reconfigure(changed)
            if entity != DEFAULT_ENTITY:
                self.reload_listener_tls()

    async def _reconfigure(self, changed: Mapping[str, tuple[Any, Any]]) -> None:
        """Hand the new values to the components that own them (Kafka's BrokerReconfigurables)."""
        names = set(changed)
        broker = self.broker
        if names & LOG_CONFIGS:
            self._reconfigure_logs()
        if "unclean.leader.election.enable" in changed and broker.controller is not None:
            broker.controller.set_unclean_leader_election_default(
                bool(changed["unclean.leader.election.enable"][1])
            )
        if names & FETCHER_CONFIGS and broker.replica_manager is not None:
            broker.replica_manager.fetcher_manager.resize()
        self.reconfigure_connection_limits()
        if names & CLEANER_CONFIGS and broker.log_cleaner is not None:
            await broker.log_cleaner.reconfigure(
                CleanerConfig.from_broker_config(broker.config.__getitem__)
            )

    def _reconfigure_logs(self) -> None:
        """Kafka's DynamicLogConfig: new broker defaults for every log (topic overrides still
        win), and for logs created later."""
        broker = self.broker
        broker.clear_log_configs()
        log_manager = broker.log_manager
        if log_manager is None:
            return
        log_manager.update_default_config(log_config_for(broker.config, {}))
        if broker.topic_configs is None:
            return  # starting: topics' own configs come with LeaderAndIsr, after they are read
        for topic in {log.topic for log in log_manager.all_logs()}:
            log_manager.update_config(topic, broker.log_config_for(topic))

    def reconfigure_listeners(self) -> None:
        """Connection limits and TLS contexts as the dynamic configs say (also at start-up,
        once the listeners exist: they were built from the static properties)."""
        self.reconfigure_connection_limits()
        self.reload_listener_tls()

    def reload_listener_tls(self) -> None:
        """Listener keystores and truststores (`listener.name.<l>.ssl.keystore.location` and
        friends, per broker): a TLS listener whose settings changed, or whose per-broker level
        names them at all, gets a new context for new connections (open ones keep theirs) — so
        re-sending the same location reloads a keystore file replaced in place, as Kafka's
        reloadUpdatedFilesWithoutConfigChange does."""
        properties = self.dynamic.effective_properties()
        configured = listener_ssl_names(self.dynamic.per_broker)
        for server in self.broker.socket_servers:
            security = server.security
            if security.ssl_context is None:
                continue
            listener = security.listener
            prefix = f"listener.name.{listener.lower()}."
            settings = listener_ssl_config(properties, listener, security.security_protocol)
            previous = self._tls_settings.get(listener)
            named = any(name.startswith(prefix) for name in configured)
            if not named and (previous is None or settings == previous):
                self._tls_settings[listener] = settings  # as built from the static properties
                continue
            try:
                context = server_context(settings)
            except SecurityConfigError as e:
                log.error("listener %s keeps its TLS context: %s", listener, e)
                continue
            server.security = dataclasses.replace(security, ssl_context=context)
            self._tls_settings[listener] = settings
            log.info("listener %s: TLS context reloaded for new connections", listener)

    def reconfigure_connection_limits(self) -> None:
        """`max.connections*` for new connections (SocketServer's reconfigure in Kafka)."""
        config = self.broker.config
        for server in self.broker.socket_servers:
            quotas = server.quotas
            quotas.max_connections = config["max.connections"]
            quotas.max_connections_per_ip = config["max.connections.per.ip"]
            quotas.per_ip_overrides = parse_overrides(config["max.connections.per.ip.overrides"])
            quotas.listener_limits = self.dynamic.listener_limits(
                endpoint.listener for endpoint in config.listeners
            )
