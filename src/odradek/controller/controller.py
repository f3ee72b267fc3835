"""The controller (Kafka's KafkaController in ZooKeeper mode): one broker of the cluster decides.

Every broker runs this component; the one that creates the ephemeral `/controller` znode (and bumps
`/controller_epoch` in the same transaction) is the active controller. The others watch `/controller`
and try again when it disappears. All work is done by events on one queue (`event_manager`); watch
callbacks only enqueue, and watches registered by an earlier term are ignored (`_generation`).

The election, the failover (`_on_controller_failover`: watches, the cluster state read from
ZooKeeper, UpdateMetadata before any LeaderAndIsr, the state machines, then deletions, reassignments
and elections resumed) and the resignation are in `failover`, a mixin of this class that lists
their steps.

The handlers of broker events (broker start-up, failure and bounce, replicas going offline,
controlled shutdown, broker responses) are in `broker_events`; those of topic events (new topics
and partitions, reassignment requests, ISR change notifications) in `topic_events`. Both are
mixins of this class; `term_components` declares what they see of it (the current term's
components). Each lists its callbacks and their steps.

Partition reassignment (`/admin/reassign_partitions`, AlterPartitionReassignments,
ListPartitionReassignments, and resuming moves at failover and broker start-up) lives in
`reassignment`; this class routes its events and hooks to it.

Preferred-replica and unclean elections on demand (`/admin/preferred_replica_election`, the
ElectLeaders API) and the automatic leader rebalance live in `elect_leaders`; this class only
routes their events to it and starts/stops it with each term.

Concurrency: all state is owned by the event task. Public methods called from elsewhere only enqueue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from odradek.controller import events as ev
from odradek.controller.broker_events import BrokerEventHandlers
from odradek.controller.channel_manager import (
    ControllerBrokerRequestBatch,
    ControllerChannelManager,
)
from odradek.controller.context import ControllerContext, LeaderAndIsr, TopicPartition
from odradek.controller.controller_zk import ControllerZk
from odradek.controller.elect_leaders import (
    AutoRebalanceConfig,
    ElectionType,
    ReplicaLeaderElection,
    fail_waiter,
)
from odradek.controller.event_manager import ControllerEventManager
from odradek.controller.failover import ControllerFailover
from odradek.controller.gc_pause import paused_gc
from odradek.controller.log_dir_events import LogDirEventManager
from odradek.controller.partition_state_machine import ElectionStrategy, PartitionStateMachine
from odradek.controller.reassignment import PartitionReassignmentManager
from odradek.controller.replica_state_machine import ReplicaStateMachine
from odradek.controller.states import PartitionState, StateChangeLogger
from odradek.controller.stats import ControllerStats
from odradek.controller.topic_deletion import TopicDeletionManager
from odradek.controller.topic_events import TopicEventHandlers
from odradek.errors import KafkaError, NotControllerError
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity
from odradek.zk.client import SessionState, WatchEvent, WatchEventKind, ZkClient
from odradek.zk.errors import (
    ConnectionLossError,
    ControllerMovedError,
    NoNodeError,
    SessionExpiredError,
)
from odradek.zk.znodes import (
    DeleteTopicsZNode,
    IsrChangeNotificationZNode,
    ReplicaAssignment,
)

log = logging.getLogger(__name__)


# Events that only re-read ZooKeeper and act on what they find (watch-driven, no caller waiting):
# safe to run again after a lost connection interrupted them.
REREAD_EVENTS = (
    ev.ControllerChange,
    ev.BrokerChange,
    ev.BrokerModification,
    ev.TopicChange,
    ev.PartitionModifications,
    ev.TopicDeletion,
    ev.IsrChangeNotification,
    ev.LogDirEventNotification,
    ev.PartitionReassignment,
    ev.PartitionReassignmentIsrChange,
    ev.UncleanLeaderElectionEnable,
    ev.PreferredReplicaElection,
)


class KafkaController(ControllerFailover, BrokerEventHandlers, TopicEventHandlers):
    """The controller component of one broker."""

    def __init__(
        self,
        broker_id: int,
        zk: ZkClient,
        *,
        request_timeout: float,
        unclean_leader_election_default: bool,
        delete_topic_enable: bool,
        register_broker: Callable[[], Awaitable[None]],
        auto_rebalance: AutoRebalanceConfig | None = None,
        controller_listener: str = "PLAINTEXT",
        inter_broker_listener: str = "PLAINTEXT",
        channel_security: ClientSecurity = PLAINTEXT_CLIENT,
        on_elected: Callable[[int, int], None] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.zk_client = zk
        # Events a lost connection interrupted, to run again once connected (see on_error).
        self._rerun_when_connected: list[Any] = []
        self.zk = ControllerZk(zk)
        self.context = ControllerContext()
        self.state_change_logger = StateChangeLogger(broker_id)
        self.request_timeout = request_timeout
        self.unclean_leader_election_default = unclean_leader_election_default
        self.delete_topic_enable = delete_topic_enable
        self._register_broker = register_broker
        # How the controller reaches brokers (KIP-291 control plane, or the inter-broker
        # listener) and which listener followers fetch from (LeaderAndIsr's live leaders).
        self.controller_listener = controller_listener
        self.inter_broker_listener = inter_broker_listener
        self.channel_security = channel_security
        self._on_elected = on_elected
        self.active_controller_id = -1
        self._generation = 0
        self.channel: ControllerChannelManager | None = None
        self.batch: ControllerBrokerRequestBatch | None = None
        self.replica_state_machine: ReplicaStateMachine | None = None
        self.partition_state_machine: PartitionStateMachine | None = None
        self.topic_deletion: TopicDeletionManager | None = None
        self.reassignment: PartitionReassignmentManager | None = None
        self.event_manager: ControllerEventManager | None = None
        self.stats = ControllerStats()  # the metrics, across terms
        self._expired = False
        self._controller_watcher = self._controller_watch
        self.failovers = 0
        self.last_failover_seconds = 0.0
        self.leader_election = ReplicaLeaderElection(
            self.context, zk, self, auto_rebalance or AutoRebalanceConfig()
        )
        self.log_dir_events = LogDirEventManager(self.context, self.zk, self)

    # lifecycle (broker's event loop)

    @property
    def is_active(self) -> bool:
        return self.active_controller_id == self.broker_id

    def startup(self) -> None:
        loop = asyncio.get_running_loop()
        self.event_manager = ControllerEventManager(self, loop)
        self.event_manager.on_processed = self.stats.event_processed
        self.zk_client.add_state_listener(self._on_session_state)
        self.event_manager.put(ev.Startup())
        self.event_manager.start()

    async def shutdown(self) -> None:
        if self.event_manager is None:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.event_manager.put(ev.Shutdown(done))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await done
        await self.event_manager.close()
        self.zk_client.remove_state_listener(self._on_session_state)

    def put(self, event: Any) -> None:
        if self.event_manager is not None:
            self.event_manager.put(event)

    def set_unclean_leader_election_default(self, enabled: bool) -> None:
        """A dynamic broker config changed it; turned on, offline partitions are elected now."""
        if enabled and not self.unclean_leader_election_default:
            self.put(ev.UncleanLeaderElectionEnable())  # processed after the assignment below
        self.unclean_leader_election_default = enabled

    def _ask(self, make_event: Callable[[asyncio.Future[Any]], Any]) -> asyncio.Future[Any]:
        """A future for a request handler: fails at once with NotControllerError on a broker that
        is not the controller, else resolves when the event `make_event(future)` is processed."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self.is_active:
            future.set_exception(
                NotControllerError(f"broker {self.broker_id} is not the controller")
            )
        else:
            self.put(make_event(future))
        return future

    def alter_partition_reassignments(
        self, reassignments: dict[TopicPartition, tuple[int, ...] | None]
    ) -> asyncio.Future[Any]:
        """Called by the AlterPartitionReassignments handler; resolves to {partition: KafkaError or
        None}, or fails with NotControllerError on a broker that is not the controller."""
        return self._ask(lambda future: ev.ApiPartitionReassignment(reassignments, future))

    def list_partition_reassignments(
        self, partitions: frozenset[TopicPartition] | None
    ) -> asyncio.Future[Any]:
        """Called by the ListPartitionReassignments handler; resolves to {partition: full
        assignment} of the partitions being reassigned (among `partitions`, if given)."""
        return self._ask(lambda future: ev.ListPartitionReassignments(partitions, future))

    def controlled_shutdown(self, broker_id: int, broker_epoch: int) -> asyncio.Future[Any]:
        """Called by the ControlledShutdown request handler; resolves to the partitions still led."""
        return self._ask(lambda future: ev.ControlledShutdown(broker_id, broker_epoch, future))

    def elect_leaders(
        self, partitions: Iterable[tuple[str, int]], election_type: ElectionType
    ) -> asyncio.Future[Any]:
        """Called by the ElectLeaders request handler; resolves to {partition: new leader or
        KafkaError}, or fails with NotControllerError on a broker that is not the controller."""
        return self._ask(
            lambda future: ev.ReplicaLeaderElection(
                frozenset(partitions), int(election_type), future
            )
        )

    def _on_session_state(self, state: SessionState) -> None:
        if self.event_manager is None:
            return
        if state is SessionState.EXPIRED:
            self._expired = True
            self.event_manager.clear_and_put(ev.Expire())
        elif state is SessionState.CONNECTED and self._expired:
            self._expired = False
            self._rerun_when_connected.clear()  # a new session re-reads everything anyway
            self.event_manager.put(ev.RegisterBrokerAndReelect())
        elif state is SessionState.CONNECTED:
            pending, self._rerun_when_connected = self._rerun_when_connected, []
            for event in pending:
                self.event_manager.put(event)

    # watches: they only enqueue, and only for the current term

    def watch(self, make_event: Callable[[WatchEvent], Any]) -> Callable[[WatchEvent], None]:
        """A watch callback that enqueues `make_event(event)` (unless it is None), ignored once
        this term is over. Part of the managers' client Protocols."""
        generation = self._generation

        def callback(event: WatchEvent) -> None:
            if generation != self._generation:
                return
            item = make_event(event)
            if item is not None:
                self.put(item)

        return callback

    def _controller_watch(self, event: WatchEvent) -> None:
        """The `/controller` watch: the same callable in every term, so ZooKeeper holds it once
        however often it is re-armed (a new closure per call would multiply the events)."""
        self.put(ev.Reelect() if event.kind is WatchEventKind.DELETED else ev.ControllerChange())

    # what the managers see of the controller (their client Protocols: DeletionClient,
    # ReassignmentClient, ElectionClient); event task only

    @property
    def term(self) -> int:
        """Changes at every failover and resignation."""
        return self._generation

    def send_update_metadata(self, partitions: Iterable[TopicPartition] | None) -> None:
        """Queue UpdateMetadata for every live broker in this event's batch."""
        self._batch.add_update_metadata_request_for_brokers(
            self.context.live_broker_ids, partitions
        )

    def send_leader_and_isr(
        self,
        broker_ids: Iterable[int],
        tp: TopicPartition,
        leader_and_isr: LeaderAndIsr,
        replicas: Sequence[int],
        is_new: bool,
    ) -> None:
        """Queue LeaderAndIsr for `tp` to `broker_ids` in this event's batch."""
        self._batch.add_leader_and_isr_request_for_brokers(
            broker_ids, tp, leader_and_isr, replicas, is_new=is_new
        )

    async def resume_topic_deletions(self) -> None:
        if self.topic_deletion is not None:
            await self._topic_deletion.resume()

    async def elect_with_strategy(
        self, partitions: Sequence[TopicPartition], strategy: ElectionStrategy
    ) -> Mapping[TopicPartition, LeaderAndIsr | Exception]:
        """Elect leaders of online `partitions` with `strategy` (OnlinePartition ->
        OnlinePartition); the partition state machine's result for each."""
        return await self._psm.handle_state_changes(
            partitions, PartitionState.OnlinePartition, strategy
        )

    # the event processor interface

    async def process(self, event: Any) -> None:
        # The collector would walk the whole broker's heap many times in a large event (gc_pause).
        with paused_gc():
            try:
                await self._dispatch(event)
            finally:
                self.state_change_logger.flush()  # the state machines flush their own batches

    async def _dispatch(self, event: Any) -> None:
        match event:
            case ev.Startup():
                await self._elect()
            case ev.ControllerChange():
                await self._maybe_resign()
            case ev.Reelect():
                await self._maybe_resign()
                await self._elect()
            case ev.Expire():
                if self.is_active:
                    self._on_controller_resignation()
                self.active_controller_id = -1
            case ev.RegisterBrokerAndReelect():
                await self._register_broker()
                await self._elect()
            case ev.Shutdown(done=done):
                if self.is_active:
                    self._on_controller_resignation()
                self.active_controller_id = -1
                if not done.done():
                    done.set_result(None)
            case ev.ControlledShutdown():
                await self._process_controlled_shutdown(event)
            case ev.ReplicaLeaderElection():
                await self.leader_election.process_admin_request(event)
                self._send_batch()
            case ev.ApiPartitionReassignment() | ev.ListPartitionReassignments():
                await self._process_reassignment_request(event)
            case _ if not self.is_active:
                return
            case ev.PartitionReassignment():
                await self._reassignment.process_zk_reassignment()
                self._send_batch()
            case ev.PartitionReassignmentIsrChange(topic=topic, partition=partition):
                await self._reassignment.maybe_complete([(topic, partition)])
                self._send_batch()
            case ev.UncleanLeaderElectionEnable():
                await self._psm.trigger_online_partition_state_change()
                self._send_batch()
            case ev.PreferredReplicaElection():
                await self.leader_election.process_preferred_replica_election_znode()
                self._send_batch()
            case ev.AutoPreferredReplicaLeaderElection():
                await self.leader_election.process_auto_rebalance(event)
                self._send_batch()
            case ev.BrokerChange():
                await self._process_broker_change()
            case ev.BrokerModification():
                await self._process_broker_change()
            case ev.TopicChange():
                await self._process_topic_change()
            case ev.PartitionModifications(topic=topic):
                await self._process_partition_modifications(topic)
            case ev.TopicDeletion():
                await self._topic_deletion.process_topic_deletion_event(
                    self.watch(lambda e: ev.TopicDeletion())
                )
                self._send_batch()
            case ev.TopicDeletionStopReplicaResponseReceived():
                await self._topic_deletion.on_stop_replica_response(event.broker_id, event.errors)
                self._send_batch()
            case ev.IsrChangeNotification():
                await self._process_isr_change_notification()
            case ev.LogDirEventNotification():
                await self.log_dir_events.process_notifications(
                    self.watch(lambda e: ev.LogDirEventNotification())
                )
            case ev.BrokerResponseReceived():
                await self._process_broker_response(event)
            case _:
                log.debug("controller ignores event %s", event.name)

    def preempt(self, event: Any) -> None:
        if isinstance(event, ev.ControlledShutdown) and not event.result.done():
            event.result.set_exception(NotControllerError("controller is resigning"))
        if isinstance(event, ev.Shutdown) and not event.done.done():
            event.done.set_result(None)
        if (
            isinstance(event, ev.ApiPartitionReassignment | ev.ListPartitionReassignments)
            and not event.result.done()
        ):
            event.result.set_exception(NotControllerError("controller is resigning"))
        fail_waiter(event, None)

    async def on_error(self, event: Any, error: BaseException) -> None:
        if (
            isinstance(event, ev.ApiPartitionReassignment | ev.ListPartitionReassignments)
            and not event.result.done()
        ):
            event.result.set_exception(
                NotControllerError("the controller moved")
                if isinstance(error, ControllerMovedError)
                else error
                if isinstance(error, KafkaError)
                else KafkaError(f"reassignment failed: {error}")
            )
        if isinstance(event, ev.ControlledShutdown) and not event.result.done():
            event.result.set_exception(
                error
                if isinstance(error, KafkaError)
                else KafkaError(f"controlled shutdown failed: {error}")
            )
        fail_waiter(event, error)
        if isinstance(error, ControllerMovedError):
            log.info("controller moved while processing %s; resigning", event.name)
            await self._maybe_resign()
            if self.is_active:  # the ZooKeeper write says otherwise: step down for real
                self._on_controller_resignation()
                self.active_controller_id = -1
            return
        if isinstance(error, SessionExpiredError):
            log.info("ZooKeeper session expired while processing %s", event.name)
            return
        if isinstance(error, ConnectionLossError) and isinstance(event, REREAD_EVENTS):
            # Kafka's controller never fails an event on a lost connection: its ZooKeeper client
            # waits until connected. Ours gives a request up after the session timeout, and a
            # quorum lost for longer expires no session: the event (and the watch it would set
            # again) would be lost for good -- found by the soak, a controller that never again
            # saw a broker register. Such an event re-reads ZooKeeper: it runs again once the
            # connection is back.
            log.warning(
                "ZooKeeper connection lost while processing %s; it runs again once connected",
                event.name,
            )
            if self.zk_client.connected:
                self.put(event)
            else:
                self._rerun_when_connected.append(event)
            return
        log.error("error processing controller event %s", event.name, exc_info=error)
        if (
            isinstance(event, ev.Startup | ev.Reelect | ev.RegisterBrokerAndReelect)
            and self.is_active
        ):
            await self._trigger_controller_move()

    # introspection (tests, status)

    def state_summary(self) -> dict[str, Any]:
        context = self.context
        return {
            "active": self.is_active,
            "epoch": context.epoch,
            "live_brokers": sorted(context.live_brokers),
            "partitions": len(context.leadership),
            "offline": context.offline_partition_count(),
        }


__all__ = [
    "DeleteTopicsZNode",
    "IsrChangeNotificationZNode",
    "KafkaController",
    "NoNodeError",
    "ReplicaAssignment",
]
