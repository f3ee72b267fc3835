"""The controller's events. ZooKeeper watches and broker responses only create these and enqueue them;
the controller's single event task processes them one at a time (see `event_manager`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Startup:
    name: str = "Startup"


@dataclass
class ControllerChange:
    """`/controller` was created or changed: maybe resign, re-watch."""

    name: str = "ControllerChange"


@dataclass
class Reelect:
    """`/controller` was deleted: maybe resign, then try to become controller."""

    name: str = "Reelect"


@dataclass
class Expire:
    """The ZooKeeper session expired: resign (watches and ephemerals are gone)."""

    name: str = "Expire"


@dataclass
class RegisterBrokerAndReelect:
    """A new ZooKeeper session after an expiry: re-register the broker, then elect."""

    name: str = "RegisterBrokerAndReelect"


@dataclass
class BrokerChange:
    name: str = "BrokerChange"


@dataclass
class BrokerModification:
    broker_id: int
    name: str = "BrokerModification"


@dataclass
class TopicChange:
    name: str = "TopicChange"


@dataclass
class PartitionModifications:
    topic: str
    name: str = "PartitionModifications"


@dataclass
class TopicDeletion:
    name: str = "TopicDeletion"


@dataclass
class IsrChangeNotification:
    name: str = "IsrChangeNotification"


@dataclass
class LogDirEventNotification:
    """A child of `/log_dir_event_notification` appeared: a broker's log directory failed."""

    name: str = "LogDirEventNotification"


@dataclass
class PartitionReassignment:
    """`/admin/reassign_partitions` was created, changed or deleted (Kafka's
    ZkPartitionReassignment)."""

    name: str = "PartitionReassignment"


@dataclass
class ApiPartitionReassignment:
    """An AlterPartitionReassignments request: target replicas per partition (None cancels);
    `result` gets an error (or None) per partition."""

    reassignments: dict[tuple[str, int], tuple[int, ...] | None]
    result: asyncio.Future[Any]
    name: str = "ApiPartitionReassignment"


@dataclass
class ListPartitionReassignments:
    """A ListPartitionReassignments request (`partitions` None: all); `result` gets the full
    assignment of each partition being reassigned."""

    partitions: frozenset[tuple[str, int]] | None
    result: asyncio.Future[Any]
    name: str = "ListPartitionReassignments"


@dataclass
class PartitionReassignmentIsrChange:
    """The state znode of a partition being reassigned changed: maybe its targets caught up."""

    topic: str
    partition: int
    name: str = "PartitionReassignmentIsrChange"


@dataclass
class UncleanLeaderElectionEnable:
    """The broker default of unclean.leader.election.enable was turned on (dynamically)."""

    name: str = "UncleanLeaderElectionEnable"


@dataclass
class PreferredReplicaElection:
    name: str = "PreferredReplicaElection"


@dataclass
class AutoPreferredReplicaLeaderElection:
    """The leader rebalance timer fired; `generation` is the controller term that scheduled it."""

    generation: int = -1
    name: str = "AutoPreferredReplicaLeaderElection"


@dataclass
class ReplicaLeaderElection:
    """An ElectLeaders request: elect `partitions` with `election_type` (0 preferred, 1 unclean);
    `result` gets each partition's new leader or error (see `elect_leaders`)."""

    partitions: frozenset[tuple[str, int]]
    election_type: int
    result: asyncio.Future[Any]
    name: str = "ReplicaLeaderElection"


@dataclass
class ControlledShutdown:
    """A broker asked to shut down; `result` gets the partitions it still leads (or an error)."""

    broker_id: int
    broker_epoch: int
    result: asyncio.Future[Any]
    name: str = "ControlledShutdown"


@dataclass
class BrokerResponseReceived:
    broker_id: int
    api_key: int
    response: Any
    name: str = "BrokerResponseReceived"


@dataclass
class TopicDeletionStopReplicaResponseReceived:
    broker_id: int
    errors: dict[tuple[str, int], int] = field(default_factory=dict)
    name: str = "TopicDeletionStopReplicaResponseReceived"


@dataclass
class Shutdown:
    """Resign and stop processing (broker shutdown)."""

    done: asyncio.Future[None]
    name: str = "Shutdown"
