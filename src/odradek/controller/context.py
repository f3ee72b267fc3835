"""The controller context: everything the active controller knows about the cluster.

Built from ZooKeeper in `on_controller_failover` and kept current by the controller's events: live
brokers with their epochs (the czxid of `/brokers/ids/<id>`), every topic's assignment (AR per
partition) and topic id, the latest leader/ISR of every partition as written in ZooKeeper (with the
znode version, the partition epoch), and the state of every partition and replica in the two state
machines. Also the brokers shutting down and the topics queued for deletion.

Concurrency: only the controller's event task reads or writes it (see `event_manager`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from odradek.controller.states import PartitionState, ReplicaState
from odradek.zk.znodes import BrokerInfo, LeaderIsrAndControllerEpoch, ReplicaAssignment

TopicPartition = tuple[str, int]


class PartitionReplica(NamedTuple):
    """One replica of a partition. A named tuple, not a frozen dataclass: the replica state
    machine looks replicas up in dicts millions of times in a large failover, and a tuple's hash
    is native where a dataclass's is a Python function."""

    topic: str
    partition: int
    replica: int

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)


LeaderAndIsr = LeaderIsrAndControllerEpoch
"""A partition's leader, leader epoch, ISR, the controller epoch that wrote it, and the version of
the partition state znode it was read from or written to (the partition epoch)."""


@dataclass
class ControllerContext:
    epoch: int = 0
    epoch_zk_version: int = 0
    live_brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    shutting_down_broker_ids: set[int] = field(default_factory=set)
    assignments: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)
    topic_ids: dict[str, str] = field(default_factory=dict)
    leadership: dict[TopicPartition, LeaderAndIsr] = field(default_factory=dict)
    partition_states: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    replica_states: dict[PartitionReplica, ReplicaState] = field(default_factory=dict)
    topics_to_be_deleted: set[str] = field(default_factory=set)
    topics_ineligible_for_deletion: set[str] = field(default_factory=set)
    # The full assignment (RS, adding AR, removing RR) of every partition being reassigned; its
    # RS is also the partition's entry in `assignments`. See `reassignment_plan`.
    reassignments: dict[TopicPartition, ReplicaAssignment] = field(default_factory=dict)
    # KIP-112: per live broker, the partitions whose replica there sits in a failed log
    # directory (learnt from KAFKA_STORAGE_ERROR in LeaderAndIsr answers; forgotten when the
    # broker restarts or dies). Such a replica is offline although its broker is live.
    replicas_on_offline_dirs: dict[int, set[TopicPartition]] = field(default_factory=dict)

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    # brokers

    @property
    def live_broker_ids(self) -> set[int]:
        return set(self.live_brokers)

    @property
    def live_serving_broker_ids(self) -> set[int]:
        """Live brokers not in controlled shutdown: where leaders may be elected."""
        return set(self.live_brokers) - self.shutting_down_broker_ids

    def broker_epoch(self, broker_id: int) -> int:
        info = self.live_brokers.get(broker_id)
        return info.broker_epoch if info is not None else -1

    def is_replica_online(self, broker_id: int, include_shutting_down: bool = False) -> bool:
        if include_shutting_down:
            return broker_id in self.live_brokers
        return broker_id in self.live_brokers and broker_id not in self.shutting_down_broker_ids

    def brokers_with_offline_replica(self, tp: TopicPartition) -> set[int]:
        """Live brokers whose replica of `tp` is in a failed log directory."""
        if not self.replicas_on_offline_dirs:
            return set()
        return {b for b, tps in self.replicas_on_offline_dirs.items() if tp in tps}

    def is_replica_on_offline_dir(self, broker_id: int, tp: TopicPartition) -> bool:
        offline = self.replicas_on_offline_dirs.get(broker_id)
        return offline is not None and tp in offline

    # topics and partitions

    @property
    def all_topics(self) -> set[str]:
        return set(self.assignments)

    def all_partitions(self) -> list[TopicPartition]:
        return [(t, p) for t, parts in self.assignments.items() for p in parts]

    def partitions_for_topic(self, topic: str) -> list[TopicPartition]:
        return [(topic, p) for p in sorted(self.assignments.get(topic, {}))]

    def partition_replica_assignment(self, tp: TopicPartition) -> tuple[int, ...]:
        return self.assignments.get(tp[0], {}).get(tp[1], ())

    def update_partition_replica_assignment(
        self, tp: TopicPartition, replicas: Iterable[int]
    ) -> None:
        self.assignments.setdefault(tp[0], {})[tp[1]] = tuple(replicas)

    def remove_topic(self, topic: str) -> None:
        for partition in self.assignments.pop(topic, {}):
            tp = (topic, partition)
            self.leadership.pop(tp, None)
            self.partition_states.pop(tp, None)
            self.reassignments.pop(tp, None)
        for replica in [r for r in self.replica_states if r.topic == topic]:
            del self.replica_states[replica]
        self.topic_ids.pop(topic, None)

    # reassignments

    def partitions_being_reassigned(self) -> set[TopicPartition]:
        """Partitions with a reassignment in progress (adding or removing replicas)."""
        return set(self.reassignments)

    def full_replica_assignment(self, tp: TopicPartition) -> ReplicaAssignment:
        """RS with the adding and removing replicas of a reassignment in progress, if any."""
        moving = self.reassignments.get(tp)
        if moving is not None:
            return moving
        return ReplicaAssignment(self.partition_replica_assignment(tp))

    def update_full_replica_assignment(
        self, tp: TopicPartition, assignment: ReplicaAssignment
    ) -> None:
        """Set RS, and remember the reassignment while it adds or removes replicas."""
        self.update_partition_replica_assignment(tp, assignment.replicas)
        if assignment.adding_replicas or assignment.removing_replicas:
            self.reassignments[tp] = assignment
        else:
            self.reassignments.pop(tp, None)

    def topic_being_reassigned(self, topic: str) -> bool:
        return any(tp[0] == topic for tp in self.reassignments)

    def replicas_on_brokers(self, broker_ids: set[int]) -> list[PartitionReplica]:
        return [
            PartitionReplica(topic, partition, replica)
            for topic, parts in self.assignments.items()
            for partition, replicas in parts.items()
            for replica in replicas
            if replica in broker_ids
        ]

    def partitions_on_broker(self, broker_id: int) -> list[TopicPartition]:
        return [
            (topic, partition)
            for topic, parts in self.assignments.items()
            for partition, replicas in parts.items()
            if broker_id in replicas
        ]

    def partitions_led_by(self, broker_id: int) -> list[TopicPartition]:
        return [tp for tp, state in self.leadership.items() if state.leader == broker_id]

    def replicas_for_partition(
        self, partitions: Iterable[TopicPartition]
    ) -> list[PartitionReplica]:
        return [
            PartitionReplica(tp[0], tp[1], replica)
            for tp in partitions
            for replica in self.partition_replica_assignment(tp)
        ]

    def partitions_in_states(self, *states: PartitionState) -> list[TopicPartition]:
        wanted = set(states)
        return [tp for tp, state in self.partition_states.items() if state in wanted]

    def replicas_in_state(self, topic: str, state: ReplicaState) -> list[PartitionReplica]:
        return [r for r, s in self.replica_states.items() if r.topic == topic and s == state]

    def are_all_replicas_in_state(self, topic: str, state: ReplicaState) -> bool:
        return all(s == state for r, s in self.replica_states.items() if r.topic == topic)

    def is_any_replica_in_state(self, topic: str, state: ReplicaState) -> bool:
        return any(s == state for r, s in self.replica_states.items() if r.topic == topic)

    def offline_partition_count(self) -> int:
        return len(self.partitions_in_states(PartitionState.OfflinePartition))

    def leader_counts(self) -> dict[int, int]:
        counts: dict[int, int] = defaultdict(int)
        for state in self.leadership.values():
            counts[state.leader] += 1
        return dict(counts)

    def is_topic_queued_for_deletion(self, topic: str) -> bool:
        return topic in self.topics_to_be_deleted
