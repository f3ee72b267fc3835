"""The controller's components of the current term, as the event handlers reach them.

`KafkaController` creates the channel manager, the request batch, the two state machines, the topic
deletion manager and the reassignment manager at each failover (`_on_controller_failover`, in
`failover`) and drops them at resignation; while this broker is not the controller they are None.
The properties here return them or raise `InvariantError` — an event handler that runs outside a
term is a bug.

`TermComponents` is the base of `KafkaController` and of its mixins (`failover`, and the event
handlers `broker_events`, `topic_events`): it declares the fields `KafkaController.__init__` sets
and the methods it defines that the handlers call, so each mixin type-checks on its own.

Concurrency: event task only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from odradek.controller.channel_manager import (
    ControllerBrokerRequestBatch,
    ControllerChannelManager,
)
from odradek.controller.context import ControllerContext
from odradek.controller.controller_zk import ControllerZk
from odradek.controller.log_dir_events import LogDirEventManager
from odradek.controller.partition_state_machine import PartitionStateMachine
from odradek.controller.reassignment import PartitionReassignmentManager
from odradek.controller.replica_state_machine import ReplicaStateMachine
from odradek.controller.topic_deletion import TopicDeletionManager
from odradek.errors import require
from odradek.zk.client import WatchEvent


class TermComponents:
    """What `KafkaController` holds, as its event handlers see it."""

    # set by KafkaController.__init__
    broker_id: int
    context: ControllerContext
    zk: ControllerZk
    log_dir_events: LogDirEventManager
    # set at failover, None while this broker is not the controller
    channel: ControllerChannelManager | None
    batch: ControllerBrokerRequestBatch | None
    replica_state_machine: ReplicaStateMachine | None
    partition_state_machine: PartitionStateMachine | None
    topic_deletion: TopicDeletionManager | None
    reassignment: PartitionReassignmentManager | None

    if TYPE_CHECKING:  # defined by KafkaController

        @property
        def is_active(self) -> bool: ...

        def watch(
            self, make_event: Callable[[WatchEvent], Any]
        ) -> Callable[[WatchEvent], None]: ...

    # the current term's components

    @property
    def _rsm(self) -> ReplicaStateMachine:
        return require(self.replica_state_machine, "the replica state machine (active controller)")

    @property
    def _psm(self) -> PartitionStateMachine:
        return require(
            self.partition_state_machine, "the partition state machine (active controller)"
        )

    @property
    def _batch(self) -> ControllerBrokerRequestBatch:
        return require(self.batch, "the controller's request batch (active controller)")

    @property
    def _channel(self) -> ControllerChannelManager:
        return require(self.channel, "the controller's channel manager (active controller)")

    @property
    def _topic_deletion(self) -> TopicDeletionManager:
        return require(self.topic_deletion, "the topic deletion manager (active controller)")

    @property
    def _reassignment(self) -> PartitionReassignmentManager:
        return require(self.reassignment, "the reassignment manager (active controller)")

    def _send_batch(self) -> None:
        if self.batch is not None:
            self._batch.send_requests_to_brokers(self.context.epoch)
