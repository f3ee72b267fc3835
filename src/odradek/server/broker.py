"""One broker process: its components, and the order they start and stop in.

Start-up (`Broker.startup`), in Kafka's order and for the same reasons:
  1. open the log dirs (`LogManager.startup`: recovery after an unclean shutdown happens here, before
     anyone can read);
  2. connect to ZooKeeper (a one-line error if it is unreachable), create the persistent paths, and
     read or create the cluster id; load SCRAM credentials and ACLs and start following their
     changes (`BrokerSecurity`), so that the first connection is checked against the real data;
     read the dynamic broker configs (KIP-226, `dynamic_config_manager`), so that everything
     built from here on sees their values;
  3. start listening on every listener (`listeners`, each secured as its protocol says:
     `odradek.server.listeners`; a one-line error if a port is taken or a TLS/SASL setting is
     wrong) — before registering, so that the controller can reach us as soon as it sees us;
  4. build the replica manager (HW checkpoint loaded), the fetchers, the admin manager;
  5. register `/brokers/ids/<id>` (ephemeral; its czxid is our broker epoch) with every advertised
     listener and the listener→protocol map, first closing the ZooKeeper session of our previous
     process if it was killed with its registration standing (`session_reclaim`);
  6. start the controller component (it competes for `/controller`);
  7. start the periodic tasks (retention, checkpoints, ISR expiry), the log cleaner
     (`odradek.log.log_cleaner`: its checkpoints are read here; it cleans a partition only once
     this broker leads or follows it, up to its high watermark) and the log directory failure
     handler (KIP-112: directories that failed at start-up are reported to the controller now).

Shutdown (`Broker.shutdown`: controlled shutdown first, the ZooKeeper session, and with it our
registration, last) is in `broker_shutdown`, a base of `Broker`, which lists its steps.

The broker's own ZooKeeper state (cluster id, registration, stray logs, ISR change
notifications, session expiry) is in `broker_zk`, a base of `Broker`.

Concurrency: one asyncio event loop runs every component; kazoo's threads only hand results and
watch events to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from odradek.cluster.fetcher_manager import ReplicaFetcherManager
from odradek.cluster.isr_writes import BatchedIsrWriter
from odradek.cluster.replica_manager import ReplicaManager
from odradek.controller.controller import KafkaController
from odradek.controller.elect_leaders import AutoRebalanceConfig
from odradek.controller.gc_pause import freeze_after_pauses, paused_gc
from odradek.coordinator.group.coordinator import GroupCoordinator
from odradek.coordinator.group.metadata import GroupConfig
from odradek.coordinator.group.metadata_manager import GroupMetadataManager, OffsetConfig
from odradek.coordinator.group.placement import OFFSETS_TOPIC
from odradek.coordinator.group.txn_offsets import PendingTxnOffsets
from odradek.coordinator.group.zk_import import ZkLegacyOffsets
from odradek.coordinator.transaction.coordinator import TransactionCoordinator
from odradek.coordinator.transaction.producer_id_manager import ProducerIdManager
from odradek.errors import InvariantError, KafkaError, OperatorError, require
from odradek.log.fd_limit import descriptor_limit_message, is_descriptor_exhaustion
from odradek.log.log_cleaner import CleanerConfig, LogCleaner
from odradek.log.log_dir_failure import LogDirFailureChannel
from odradek.log.log_manager import LogManager
from odradek.network.client import ClientSecurity
from odradek.network.server import SocketServer
from odradek.protocol.topic_ids import topic_id_to_uuid
from odradek.security.acl_store import AclStore
from odradek.security.controller_requests import ControllerEpochValidator
from odradek.security.credential_store import CredentialStore
from odradek.server.admin.manager import AdminManager
from odradek.server.admin.topic_configs import TopicConfigs
from odradek.server.admin.topics import log_config_for
from odradek.server.apis import KafkaApis, answer_api_versions
from odradek.server.authorization import RequestAuthorizer
from odradek.server.broker_security import BrokerSecurity, zookeeper_identity
from odradek.server.broker_shutdown import BrokerShutdown
from odradek.server.broker_zk import BrokerZk
from odradek.server.config import KafkaConfig
from odradek.server.dynamic_config import DynamicBrokerConfig
from odradek.server.dynamic_config_manager import DynamicConfigManager
from odradek.server.fetch_session import FetchManager, FetchSessionCache
from odradek.server.listeners import (
    broker_client_security,
    connection_quotas,
    listener_security,
    memory_pool,
)
from odradek.server.log_dir_failure import LogDirFailureHandler
from odradek.server.metadata_cache import MetadataCache
from odradek.server.metrics.exporter import MetricsExporter, parse_metrics_listener
from odradek.server.metrics.json_endpoints import broker_json_endpoints
from odradek.server.metrics.request_metrics import RequestMetrics
from odradek.server.metrics.snapshot import collect as collect_metrics
from odradek.server.offsets_topic import OffsetsTopicCreator, ReplicaManagerOffsetsLog
from odradek.server.quota.broker_quotas import BrokerQuotas
from odradek.server.startup_phases import StartupPhases
from odradek.server.transaction_topic import TransactionTopicCreator, build_transaction_coordinator
from odradek.zk.client import ZkClient
from odradek.zk.errors import ZkError
from odradek.zk.znodes import (
    PERSISTENT_PATHS,
)

log = logging.getLogger(__name__)


class Broker(BrokerZk, BrokerShutdown):
    def __init__(self, config: KafkaConfig, *, own_process: bool = False) -> None:
        """`own_process`: the broker is all this process runs (the `odradek server` command),
        so start-up may take process-wide measures (see `_freeze_loaded_objects`)."""
        self.config = config
        self._own_process = own_process
        self.broker_id = config.broker_id
        self.cluster_id = ""
        self.broker_epoch = -1
        # Set once /brokers/ids/<id> exists and broker_epoch is known: controller requests wait
        # for it (a request naming an epoch before then was meant for an earlier incarnation).
        self.registered = asyncio.Event()
        self.latest_controller_epoch = -1
        self.zk: ZkClient | None = None
        self.log_manager: LogManager | None = None
        self.log_cleaner: LogCleaner | None = None
        listeners = config.listener_config
        self.metadata_cache = MetadataCache(self.broker_id, listeners.inter_broker_listener)
        self.security = BrokerSecurity(config, lambda: self.broker_epoch)
        self.quotas = BrokerQuotas(config, self.broker_id)  # client quotas, replication throttles
        # Dynamic broker configs (KIP-226): read at start-up (2), followed afterwards.
        self.dynamic_config = DynamicBrokerConfig(config)
        self.dynamic_config_manager = DynamicConfigManager(self, self.dynamic_config)
        # Incremental fetch sessions (KIP-227), shared by every listener's connections.
        self.fetch_manager = FetchManager(
            FetchSessionCache(config["max.incremental.fetch.session.cache.slots"]),
            lambda: int(time.time() * 1000),
        )
        # How this broker reaches others: the inter-broker listener (fetchers, controlled
        # shutdown) and the control-plane listener (the controller's requests).
        self.inter_broker_client: ClientSecurity = broker_client_security(
            config, listeners.inter_broker_listener
        )
        self.controller_client: ClientSecurity = broker_client_security(
            config, listeners.controller_listener
        )
        self.socket_servers: list[SocketServer] = []
        self.request_metrics = RequestMetrics()
        self.metrics_exporter: MetricsExporter | None = None
        self.replica_manager: ReplicaManager = None  # type: ignore[assignment]
        self.controller: KafkaController = None  # type: ignore[assignment]
        self.admin: AdminManager = None  # type: ignore[assignment]
        self.topic_configs: TopicConfigs = None  # type: ignore[assignment]
        self.group_coordinator: GroupCoordinator = None  # type: ignore[assignment]
        self.transaction_coordinator: TransactionCoordinator = None  # type: ignore[assignment]
        self.producer_id_manager: ProducerIdManager = None  # type: ignore[assignment]
        self.txn_offsets: PendingTxnOffsets = None  # type: ignore[assignment]
        self._transaction_topic: TransactionTopicCreator | None = None
        self._offsets_topic: OffsetsTopicCreator | None = None
        self.log_dir_failure = LogDirFailureHandler(
            self.broker_id, lambda: self.replica_manager, lambda: self.zk
        )
        self._tasks: list[asyncio.Task[Any]] = []
        self._metadata_waiters: list[asyncio.Future[None]] = []
        self._auto_creating: set[str] = set()
        self._log_configs: dict[str, Any] = {}
        self._stopped = asyncio.Event()
        self._shutting_down = False
        self._session_expired = False
        self._loaded_in_session: int | None = None  # the session `_load_zk_state` completed in
        self.started = False

    # the components start-up creates: required once it has

    @property
    def _zk(self) -> ZkClient:
        return require(self.zk, "the broker's ZooKeeper client (created at start-up)")

    @property
    def _log_manager(self) -> LogManager:
        return require(self.log_manager, "the broker's log manager (created at start-up)")

    # start-up

    async def startup(self) -> None:
        config = self.config
        phases = StartupPhases()
        now_ms = int(time.time() * 1000)
        try:
            cleaner_config = CleanerConfig.from_broker_config(config.__getitem__)
        except InvariantError as e:
            raise OperatorError(str(e)) from None
        # 1. logs
        self.log_manager = LogManager(
            config.log_dirs,
            log_config_for(config, {}),
            failure_channel=LogDirFailureChannel(self.log_dir_failure.on_offline),
        )
        try:
            # Loading thousands of logs allocates objects that all survive: the cyclic
            # collector would walk them again and again meanwhile (a fifth of 10,000 logs' CPU).
            with paused_gc():
                self._log_manager.startup(now_ms)
                self._freeze_loaded_objects()
        except (OSError, KafkaError) as e:
            if is_descriptor_exhaustion(e):
                raise OperatorError(
                    f"cannot open the logs: {descriptor_limit_message(e)}"
                ) from None
            raise OperatorError(
                f"cannot open log dirs {[str(d) for d in config.log_dirs]}: {e}"
            ) from None
        phases.mark("logs")
        # 2. ZooKeeper
        self.zk = ZkClient(
            config["zookeeper.connect"],
            session_timeout_s=config["zookeeper.session.timeout.ms"] / 1000,
            credentials=zookeeper_identity(config),
            set_acl=config["zookeeper.set.acl"],
        )
        await self._zk.start(timeout=config.zookeeper_connection_timeout_ms / 1000)
        phases.mark("ZooKeeper session")
        await self._in_a_session(
            "load its state from ZooKeeper", "loading state from ZooKeeper", self._load_zk_state
        )
        phases.mark("ZooKeeper state")
        # 3. listen
        # The group coordinator exists before we listen, so no group request finds it missing;
        # it serves groups once its timers start with the other periodic work (7), and loads
        # offsets partitions as LeaderAndIsr makes us their leader.
        cache = self.metadata_cache
        self.producer_id_manager = ProducerIdManager(self.broker_id, self._zk)
        self.group_coordinator = GroupCoordinator(
            self.broker_id,
            GroupConfig.from_broker_config(config),
            GroupMetadataManager(
                OffsetConfig.from_broker_config(config),
                ReplicaManagerOffsetsLog(lambda: self.replica_manager),
                partition_count=lambda: cache.partition_count(OFFSETS_TOPIC),
                legacy=ZkLegacyOffsets(self.zk),
            ),
        )
        self.txn_offsets = PendingTxnOffsets(self.group_coordinator)
        self.transaction_coordinator = build_transaction_coordinator(
            self.broker_id,
            config,
            lambda: self.replica_manager,
            cache,
            self.producer_id_manager,
            self.inter_broker_client,
        )
        apis = KafkaApis(self)
        dispatch = self.request_metrics.metered(apis.dispatch)
        quotas, pool = connection_quotas(config), memory_pool(config)
        for endpoint in config.listeners:
            server = SocketServer(
                endpoint.host or "0.0.0.0",
                endpoint.port,
                dispatch,
                config["socket.request.max.bytes"],
                security=listener_security(
                    config, endpoint, self.security.credentials, answer_api_versions
                ),
                quotas=quotas,
                memory_pool=pool,
                connections_max_idle_ms=config["connections.max.idle.ms"],
            )
            server.response_sent = self.request_metrics.response_sent
            self.socket_servers.append(server)
            await server.start()
        self.dynamic_config_manager.reconfigure_listeners()
        # 4. components
        self.topic_configs = TopicConfigs(self.zk, self._on_topic_config_change)
        await self._in_a_session(
            "watch topic configs", "watching topic configs", self.topic_configs.start
        )
        fetcher_manager = ReplicaFetcherManager(
            self._broker_address,
            config,
            security=self.inter_broker_client,
            topic_id_for=self._topic_id_for,
            broker_epoch=lambda: self.broker_epoch,
        )
        self.replica_manager = ReplicaManager(
            self.broker_id,
            self.log_manager,
            self.metadata_cache,
            self.log_config_for,
            lambda topic: self.log_config_for(topic).min_insync_replicas,
            BatchedIsrWriter(self.zk),
            self._publish_isr_changes,
            config["replica.lag.time.max.ms"],
            fetcher_manager,
        )
        self.replica_manager.load_high_watermarks(self._log_manager.live_log_dirs)
        self.quotas.attach(self.replica_manager, self.topic_configs.get)
        self.admin = AdminManager(
            self.zk, config["num.partitions"], config["default.replication.factor"]
        )
        self._offsets_topic = OffsetsTopicCreator(
            config, self.admin, self.metadata_cache.alive_broker_ids
        )
        self._transaction_topic = TransactionTopicCreator(
            config, self.admin, self.metadata_cache.alive_broker_ids
        )
        self.controller = KafkaController(
            self.broker_id,
            self.zk,
            request_timeout=config["controller.socket.timeout.ms"] / 1000,
            unclean_leader_election_default=config["unclean.leader.election.enable"],
            delete_topic_enable=config["delete.topic.enable"],
            register_broker=self._register_broker,
            auto_rebalance=AutoRebalanceConfig(
                enabled=config["auto.leader.rebalance.enable"],
                imbalance_percentage=config["leader.imbalance.per.broker.percentage"],
                check_interval_s=float(config["leader.imbalance.check.interval.seconds"]),
            ),
            controller_listener=config.listener_config.controller_listener,
            inter_broker_listener=config.listener_config.inter_broker_listener,
            channel_security=self.controller_client,
            on_elected=self.security.on_elected,
        )
        phases.mark("listeners and components")
        # 5. register, 6. controller
        self._zk.add_state_listener(self._on_session_state)
        if self._zk.session_id != self._loaded_in_session:
            # The session that loaded the caches and armed their watches expired since: reload
            # now, or when the new session connects if it has not yet.
            if self._zk.connected:
                self._resync_after_expiry()
            else:
                self._session_expired = True
        await self._register_at_startup()
        phases.mark("registration")
        self.controller.startup()
        # Directories that failed at start-up are reported now that we are registered.
        self.log_dir_failure.start()
        # 7. periodic work
        self.replica_manager.start_background_tasks(
            config["replica.high.watermark.checkpoint.interval.ms"]
        )
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._retention_loop()))
        self._tasks.append(loop.create_task(self._log_checkpoint_loop()))
        self._tasks.append(loop.create_task(self._producer_expiration_loop()))
        self.group_coordinator.start()
        self.transaction_coordinator.start()
        cleaner_config = CleanerConfig.from_broker_config(config.__getitem__)  # dynamic ones too
        self.log_cleaner = LogCleaner(self._log_manager, cleaner_config, self._cleanable_offset)
        self.log_cleaner.start()
        # 8. metrics, once every component they read exists
        if config["metrics.listener"]:
            host, port = parse_metrics_listener(config["metrics.listener"])
            self.metrics_exporter = MetricsExporter(
                host,
                port,
                lambda names, replicas: collect_metrics(
                    self, self.request_metrics, names, replicas, defer=True
                ),
                broker_json_endpoints(self),
            )
            self.metrics_exporter.start()
        phases.mark("the rest")
        self.started = True
        log.info(
            "broker %d started: listening on %s, cluster %s, %d logs; start-up took %s",
            self.broker_id,
            ", ".join(f"{s.listener}://{s.host}:{s.port}" for s in self.socket_servers),
            self.cluster_id,
            len(self._log_manager.all_logs()),
            phases.summary(),
        )

    def _freeze_loaded_objects(self) -> None:
        """From the end of the pause the logs load in, move the objects alive whenever a pause
        of the cyclic collector ends (modules, the loaded logs, later the partition state) out
        of its reach (`gc_pause.freeze_after_pauses`). They live as long as the process, and
        each full collection walked all of them again: 0.1 s for 10,000 loaded logs, during
        start-up, while applying the first LeaderAndIsr and later while serving. Only when the
        broker owns its process: a test or a program running brokers in-process keeps its
        objects collectable."""
        if self._own_process:
            freeze_after_pauses()

    # hooks used by handlers and components

    def _broker_address(self, broker_id: int) -> tuple[str, int] | None:
        """(host, port) of a broker's inter-broker listener as UpdateMetadata told us, for the
        replica fetchers."""
        endpoint = self.metadata_cache.get_broker(broker_id)
        return (endpoint.host, endpoint.port) if endpoint is not None else None

    def ensure_offsets_topic(self) -> None:
        """Create `__consumer_offsets` if need be (FindCoordinator found no such topic)."""
        if self._offsets_topic is not None:
            self._offsets_topic.ensure()

    def ensure_transaction_topic(self) -> None:
        """Create `__transaction_state` if need be (FindCoordinator found no such topic)."""
        if self._transaction_topic is not None:
            self._transaction_topic.ensure()

    def _topic_id_for(self, topic: str) -> uuid.UUID | None:
        """The topic's id for Fetch v13+: as LeaderAndIsr or UpdateMetadata stated it."""
        stated = self.replica_manager.topic_ids.get(topic)
        if stated:
            return topic_id_to_uuid(stated)
        return self.metadata_cache.topic_ids.get(topic)

    # the security components, as handlers see them (BrokerServices)

    @property
    def authorizer(self) -> RequestAuthorizer:
        return self.security.authorizer

    @property
    def controller_validator(self) -> ControllerEpochValidator:
        return self.security.controller_validator

    @property
    def live_broker_epochs(self) -> dict[int, int]:
        return self.security.live_broker_epochs

    @property
    def acl_store(self) -> AclStore | None:
        return self.security.acl_store

    @property
    def credential_store(self) -> CredentialStore:
        return self.security.credential_store

    def refresh_live_broker_epochs(self) -> None:
        self.security.refresh_broker_epochs()

    def maybe_auto_create_topic(self, topic: str) -> None:
        """Create an unknown topic with the broker defaults (auto.create.topics.enable)."""
        if not self.config["auto.create.topics.enable"] or topic in self._auto_creating:
            return
        self._auto_creating.add(topic)

        async def create() -> None:
            try:
                creation = await self.admin.prepare_topic(topic, -1, -1, None, {})
                await self.admin.create_topic(creation)
            except KafkaError as e:
                log.debug("auto-creation of %s: %s", topic, e)
            except ZkError as e:
                log.warning("auto-creation of %s failed: %s", topic, e)
            finally:
                self._auto_creating.discard(topic)

        asyncio.get_running_loop().create_task(create())

    async def wait_for_metadata(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait until `condition()` holds after an UpdateMetadata, or the timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not condition():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._metadata_waiters.append(waiter)
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that arrives as the waiter completes, and shutdown would hang on this task.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await waiter
        return True

    def on_metadata_updated(self) -> None:
        waiters, self._metadata_waiters = self._metadata_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def clear_log_configs(self) -> None:
        """The broker defaults changed: derive every topic's log config afresh."""
        self._log_configs.clear()

    def forget_topic(self, topic: str) -> None:
        self.topic_configs.forget(topic)
        self._log_configs.pop(topic, None)

    def log_config_for(self, topic: str) -> Any:
        """The topic's log config (broker defaults overridden by the topic's), memoised."""
        config = self._log_configs.get(topic)
        if config is None:
            config = self._log_configs[topic] = log_config_for(
                self.config, self.topic_configs.get(topic)
            )
        return config

    async def _load_zk_state(self) -> None:
        """Start-up step 2, after connecting: the paths every broker expects, the cluster id, the
        stray logs, and the caches kept equal to ZooKeeper (credentials, ACLs, quotas, dynamic
        configs). Each part may run again in a new session (`_in_a_session`)."""
        await self._zk.ensure_paths(PERSISTENT_PATHS)
        self.cluster_id = await self._get_or_create_cluster_id()
        self._log_manager.check_meta_properties(self.broker_id, self.cluster_id)
        await self._delete_stray_partitions()
        await self.security.start(self._zk)
        await self.quotas.start(self._zk)
        await self.dynamic_config_manager.start()
        self._loaded_in_session = self._zk.session_id

    def _on_topic_config_change(self, topic: str, overrides: dict[str, str]) -> None:
        self._log_configs.pop(topic, None)
        config = self.log_config_for(topic)
        for partition in list(self.replica_manager.partitions.values()):
            if partition.topic == topic and partition.log is not None:
                partition.log.config = config
        if self.log_cleaner is not None and config.compact:
            self.log_cleaner.wake()

    def _cleanable_offset(self, topic: str, partition: int) -> int | None:
        """Where the log cleaner must stop in a partition: its last stable offset (nothing a new
        leader could truncate, and no transaction not yet decided, is cleaned: an open
        transaction's records would be cleaned as if committed); None when this broker does not
        serve it."""
        found = self.replica_manager.get_partition(topic, partition)
        if found is None or found.log is None:
            return None
        return found.log.last_stable_offset(int(found.high_watermark))

    # periodic tasks

    async def _retention_loop(self) -> None:
        interval = self.config["log.retention.check.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self._log_manager.cleanup(
                    int(time.time() * 1000), on_deleted=self.replica_manager.log_start_moved
                )
            except Exception:
                log.exception("log retention failed")

    async def _producer_expiration_loop(self) -> None:
        interval = self.config["producer.id.expiration.check.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                expired = self._log_manager.remove_expired_producers()
                if expired:
                    log.info("expired %d idle producer ids", expired)
            except Exception:
                log.exception("producer id expiration failed")

    async def _log_checkpoint_loop(self) -> None:
        interval = self.config["log.flush.offset.checkpoint.interval.ms"] / 1000
        while True:
            await asyncio.sleep(max(1.0, interval))
            try:
                self._log_manager.checkpoint_recovery_points_and_start_offsets()
            except Exception:
                log.exception("writing log checkpoints failed")
