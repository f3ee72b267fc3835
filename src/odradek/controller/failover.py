"""The controller's election, failover and resignation (part of `KafkaController`).

Who invokes them, and their steps (the event loop in `controller` routes Startup, Reelect,
ControllerChange, Expire and RegisterBrokerAndReelect here, and its error handler resigns through
`_maybe_resign` and `_trigger_controller_move`):

`_elect` — Startup / Reelect: read `/controller`; if nobody holds it, create it and bump
`/controller_epoch` in one transaction; the broker that wins runs the failover.

`_on_controller_failover` — when this broker wins the election:
  1. register the watches (brokers, topics, topic deletions, ISR change notifications, log
     directory events — those left behind are deleted: the failover's LeaderAndIsr finds the
     offline replicas again);
  2. read the whole cluster state from ZooKeeper into the context (pipelined reads);
  3. start a sender per live broker and send UpdateMetadata to every live broker *before* any
     LeaderAndIsr, so brokers know the cluster before they are told their roles;
  4. start the replica state machine (replicas Online, LeaderAndIsr to their brokers) and the partition
     state machine (leaders elected for New and Offline partitions);
  5. resume topic deletions;
  6. watch `/admin/preferred_replica_election` and act on a request already there; start the
     automatic leader rebalance timer (`elect_leaders`).

`_on_controller_resignation` — on losing `/controller` or the session: stop the senders and the
rebalance timer, forget the context. Nothing is written: the new controller rebuilds from ZooKeeper.

`ControllerFailover` is a mixin of `KafkaController` over `term_components`: it creates the term's
components that `TermComponents` declares, and declares below the rest of what it uses of the
controller and of the other mixins.

Concurrency: event task only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from odradek.controller import events as ev
from odradek.controller.channel_manager import (
    ControllerBrokerRequestBatch,
    ControllerChannelManager,
)
from odradek.controller.context import LeaderAndIsr, TopicPartition
from odradek.controller.elect_leaders import ReplicaLeaderElection
from odradek.controller.partition_state_machine import PartitionStateMachine
from odradek.controller.reassignment import PartitionReassignmentManager
from odradek.controller.replica_state_machine import ReplicaStateMachine
from odradek.controller.states import ReplicaState, StateChangeLogger
from odradek.controller.stats import ControllerStats
from odradek.controller.term_components import TermComponents
from odradek.controller.topic_deletion import TopicDeletionManager
from odradek.network.client import ClientSecurity
from odradek.zk.client import WatchEvent, ZkClient
from odradek.zk.errors import BadVersionError, NodeExistsError, ZkError
from odradek.zk.znodes import ControllerZNode

log = logging.getLogger(__name__)


class ControllerFailover(TermComponents):
    """Winning the election, taking over the cluster, and stepping down."""

    # set by KafkaController.__init__
    zk_client: ZkClient
    request_timeout: float
    unclean_leader_election_default: bool
    delete_topic_enable: bool
    controller_listener: str
    inter_broker_listener: str
    channel_security: ClientSecurity
    state_change_logger: StateChangeLogger
    stats: ControllerStats
    leader_election: ReplicaLeaderElection
    active_controller_id: int
    failovers: int
    last_failover_seconds: float
    _generation: int
    _controller_watcher: Callable[[WatchEvent], None]
    _on_elected: Callable[[int, int], None] | None

    if TYPE_CHECKING:  # defined by KafkaController and its other mixins

        def put(self, event: Any) -> None: ...

        def send_update_metadata(self, partitions: Iterable[TopicPartition] | None) -> None: ...

        def send_leader_and_isr(
            self,
            broker_ids: Iterable[int],
            tp: TopicPartition,
            leader_and_isr: LeaderAndIsr,
            replicas: Sequence[int],
            is_new: bool,
        ) -> None: ...

        async def resume_topic_deletions(self) -> None: ...

        def _partition_modification_watch(self, topic: str) -> Callable[[WatchEvent], None]: ...

        async def _load_assignments(self, assignments: dict[str, Any]) -> list[str]: ...

        async def _on_unprocessed_restarts(self, written: Mapping[TopicPartition, int]) -> None: ...

    async def _elect(self) -> None:
        self.active_controller_id = await self.zk.read_controller_id(self._controller_watcher)
        if self.active_controller_id == self.broker_id and self.channel is None:
            await self._adopt_own_registration()
            return
        if self.active_controller_id != -1:
            log.debug("broker %d is the controller", self.active_controller_id)
            return
        try:
            epoch, epoch_zk_version = await self.zk.register_controller_and_increment_epoch(
                self.broker_id
            )
        except (NodeExistsError, BadVersionError):
            self.active_controller_id = await self.zk.read_controller_id(self._controller_watcher)
            return
        await self._take_over(epoch, epoch_zk_version)

    async def _adopt_own_registration(self) -> None:
        """`/controller` names us, yet we never took over: our registration landed but its answer
        was lost (the request gave up on a lost connection). If it is an ephemeral of our
        current session it is ours: take over at its epoch, as Kafka's controller accepts its
        own registration met again. Left alone, no broker would be controller until our
        session ended (found by the soak: new topics waited minutes for leaders). A znode of an
        earlier session of ours goes with that session; its deletion elects again."""
        ours = await self.zk.own_controller_registration(self.broker_id)
        if ours is None:
            return
        log.info(
            "broker %d holds /controller by a registration whose answer was lost", self.broker_id
        )
        await self._take_over(*ours)

    async def _take_over(self, epoch: int, epoch_zk_version: int) -> None:
        """We hold `/controller` at `epoch`: reset the context and run the failover."""
        self.active_controller_id = self.broker_id
        self.context.reset()
        self.context.epoch = epoch
        self.context.epoch_zk_version = epoch_zk_version
        log.info("broker %d is the controller now, epoch %d", self.broker_id, epoch)
        if self._on_elected is not None:
            self._on_elected(self.broker_id, epoch)
        await self._on_controller_failover()

    async def _maybe_resign(self) -> None:
        was_active = self.is_active
        self.active_controller_id = await self.zk.read_controller_id(self._controller_watcher)
        if was_active and not self.is_active:
            self._on_controller_resignation()
        elif self.is_active and self.channel is None:
            await self._adopt_own_registration()

    async def _trigger_controller_move(self) -> None:
        self._on_controller_resignation()
        self.active_controller_id = -1
        with contextlib.suppress(ZkError):
            await self.zk_client.delete(ControllerZNode.path())

    def _on_controller_resignation(self) -> None:
        log.info("broker %d resigns as controller (epoch %d)", self.broker_id, self.context.epoch)
        self._generation += 1
        if self.channel is not None:
            channel = self.channel
            asyncio.get_running_loop().create_task(channel.shutdown())
        self.channel = None
        self.batch = None
        self.replica_state_machine = None
        self.partition_state_machine = None
        self.topic_deletion = None
        self.reassignment = None
        self.leader_election.on_controller_resignation()
        self.context.reset()

    def _on_broker_response(self, broker_id: int, api_key: int, response: Any) -> None:
        self.put(ev.BrokerResponseReceived(broker_id, api_key, response))

    async def _unclean_enabled(self, topics: Iterable[str]) -> dict[str, bool]:
        configs = await self.zk.get_topic_configs(topics)
        result = {}
        for topic, config in configs.items():
            raw = config.get("unclean.leader.election.enable")
            result[topic] = (
                raw.strip().lower() == "true"
                if raw is not None
                else self.unclean_leader_election_default
            )
        return result

    async def _on_controller_failover(self) -> None:
        started = asyncio.get_running_loop().time()
        self._generation += 1
        context = self.context
        self.channel = ControllerChannelManager(
            self.broker_id, self.request_timeout, self.controller_listener, self.channel_security
        )
        self.batch = ControllerBrokerRequestBatch(
            context,
            self.channel,
            self.broker_id,
            self._on_broker_response,
            inter_broker_listener=self.inter_broker_listener,
        )
        self.replica_state_machine = ReplicaStateMachine(
            context, self.zk, self.batch, self.state_change_logger
        )
        self.partition_state_machine = PartitionStateMachine(
            context, self.zk, self.batch, self.state_change_logger, self._unclean_enabled
        )
        self.partition_state_machine.stats = self.stats
        self.topic_deletion = TopicDeletionManager(
            context,
            self.zk_client,
            self.replica_state_machine,
            self.partition_state_machine,
            self,
            self.delete_topic_enable,
        )
        self.reassignment = PartitionReassignmentManager(
            context,
            self.zk_client,
            self.zk,
            self.replica_state_machine,
            self.partition_state_machine,
            self,
        )

        clock = asyncio.get_running_loop().time
        phases: list[str] = []
        mark = started

        def phase(name: str) -> None:
            nonlocal mark
            now = clock()
            phases.append(f"{name} {now - mark:.2f}s")
            mark = now

        # 1-2. watches and the cluster state
        context.live_brokers = await self.zk.get_all_brokers(
            self.watch(lambda e: ev.BrokerChange())
        )
        topics = await self.zk.get_all_topics(self.watch(lambda e: ev.TopicChange()))
        assignments = await self.zk.get_topic_assignments(
            topics, self._partition_modification_watch
        )
        await self._load_assignments(assignments)
        phase("assignments")
        written: dict[TopicPartition, int] = {}
        context.leadership.update(
            await self.zk.get_partition_states(context.all_partitions(), written)
        )
        phase("states")
        notifications = await self.zk.get_isr_change_notifications(
            self.watch(lambda e: ev.IsrChangeNotification())
        )
        if notifications:
            await self.zk.delete_isr_change_notifications(notifications, context.epoch_zk_version)
        await self.log_dir_events.on_controller_failover(
            self.watch(lambda e: ev.LogDirEventNotification())
        )
        # 3. senders, then UpdateMetadata before any LeaderAndIsr
        for broker in context.live_brokers.values():
            self._channel.add_broker(broker)
        self._batch.add_update_metadata_request_for_brokers(context.live_broker_ids, None)
        self._send_batch()
        phase("metadata")
        # 4. the state machines
        self._rsm.initialize_states()
        self._psm.initialize_states()
        online = [r for r, s in context.replica_states.items() if s is ReplicaState.OnlineReplica]
        await self._rsm.handle_state_changes(online, ReplicaState.OnlineReplica)
        phase("replicas")
        await self._psm.trigger_online_partition_state_change()
        # 4a. leaders that registered again after their leadership was written, unseen by any
        # controller: a new leader epoch for the new process, in place (never offline). In the
        # same batch as step 4, whose LeaderAndIsr it replaces for those partitions: sent
        # first, the old epoch would make the new process lead at it for a moment, serving its
        # checkpointed high watermark (found by the soak: HW 13021 after 13350 under epoch 13).
        await self._on_unprocessed_restarts(written)
        self._send_batch()
        phase("partitions")
        # 4b. resume the reassignments in progress; act on /admin/reassign_partitions
        await self._reassignment.initialize()
        self._send_batch()
        # 5. topic deletion
        await self._topic_deletion.process_topic_deletion_event(
            self.watch(lambda e: ev.TopicDeletion())
        )
        self._send_batch()
        # 6. pending preferred replica elections, and the leader rebalance timer
        await self.leader_election.on_controller_failover()
        self._send_batch()
        phase("rest")
        self.failovers += 1
        self.last_failover_seconds = asyncio.get_running_loop().time() - started
        log.info(
            "controller failover done in %.3fs: %d brokers, %d topics, %d partitions (%d offline)"
            " (%s)",
            self.last_failover_seconds,
            len(context.live_brokers),
            len(context.assignments),
            len(context.leadership),
            context.offline_partition_count(),
            ", ".join(phases),
        )
