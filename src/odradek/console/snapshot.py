"""What the console knows about the cluster at one moment, as ZooKeeper told it.

A `ClusterSnapshot` is immutable and built in one go by `zk_view.read_snapshot`; every page renders
from one snapshot, so a page never mixes two moments. The per-topic summaries (partition counts
by health) are computed once when the snapshot is built, which is what keeps the topics page fast
at 10,000 partitions: filtering and paging then touch one row per topic, never every partition.

Health, as Kafka's metrics define it:

* online: the partition has a leader and that broker is registered (alive); offline otherwise
  (leader -1, a dead leader, or no state znode yet): Kafka's OfflinePartitionsCount;
* under-replicated: the ISR is smaller than the assigned replicas (UnderReplicatedPartitions);
* under min ISR: the ISR is smaller than the topic's `min.insync.replicas` (the topic's override,
  else the brokers' default), so acks=all producers are refused (UnderMinIsrPartitionCount).

Nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BrokerRow:
    """A broker: registered ones are alive; one only named by an assignment (or the console's
    list of known brokers) without a registration is dead."""

    id: int
    alive: bool
    rack: str | None = None
    listeners: tuple[str, ...] = ()
    broker_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionRow:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    online: bool = False
    under_replicated: bool = False
    under_min_isr: bool = False

    @property
    def preferred_leader(self) -> int | None:
        return self.replicas[0] if self.replicas else None

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)


@dataclass(frozen=True, slots=True)
class HealthCounts:
    partitions: int = 0
    online: int = 0
    offline: int = 0
    under_replicated: int = 0
    under_min_isr: int = 0

    def __add__(self, other: HealthCounts) -> HealthCounts:
        return HealthCounts(
            self.partitions + other.partitions,
            self.online + other.online,
            self.offline + other.offline,
            self.under_replicated + other.under_replicated,
            self.under_min_isr + other.under_min_isr,
        )

    @property
    def healthy(self) -> bool:
        return self.offline == 0 and self.under_replicated == 0 and self.under_min_isr == 0


@dataclass(frozen=True, slots=True)
class TopicSummary:
    name: str
    partitions: tuple[PartitionRow, ...]
    counts: HealthCounts
    replication_factor: int
    configs: Mapping[str, str]
    min_insync_replicas: int
    marked_for_deletion: bool = False
    topic_id: str | None = None

    @property
    def status(self) -> str:
        """One word for the list's status column and filter: the worst condition present."""
        if self.marked_for_deletion:
            return "deleting"
        if self.counts.offline:
            return "offline"
        if self.counts.under_min_isr:
            return "under-min-isr"
        if self.counts.under_replicated:
            return "under-replicated"
        return "healthy"


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    brokers: tuple[BrokerRow, ...]
    controller_id: int | None
    controller_epoch: int | None
    topics: Mapping[str, TopicSummary]
    totals: HealthCounts
    reassignments: tuple[PartitionRow, ...] = ()
    pending_isr_change_notifications: int = 0
    cluster_id: str | None = None
    taken_at: float = field(default_factory=time.time)
    read_ms: float = 0.0

    @property
    def alive_brokers(self) -> int:
        return sum(1 for b in self.brokers if b.alive)

    def broker(self, broker_id: int) -> BrokerRow | None:
        return next((b for b in self.brokers if b.id == broker_id), None)


@dataclass(frozen=True, slots=True)
class RawPartition:
    """One partition as read from ZooKeeper, before health is judged."""

    partition: int
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]
    leader: int = -1
    leader_epoch: int = -1
    isr: tuple[int, ...] = ()


def judge_partition(
    topic: str, raw: RawPartition, alive: set[int] | frozenset[int], min_insync_replicas: int
) -> PartitionRow:
    online = raw.leader >= 0 and raw.leader in alive
    return PartitionRow(
        topic=topic,
        partition=raw.partition,
        replicas=raw.replicas,
        leader=raw.leader,
        leader_epoch=raw.leader_epoch,
        isr=raw.isr,
        adding_replicas=raw.adding_replicas,
        removing_replicas=raw.removing_replicas,
        online=online,
        under_replicated=len(raw.isr) < len(raw.replicas),
        under_min_isr=len(raw.isr) < min_insync_replicas,
    )


def count_health(partitions: Iterable[PartitionRow]) -> HealthCounts:
    total = online = under_replicated = under_min_isr = 0
    for p in partitions:
        total += 1
        online += p.online
        under_replicated += p.under_replicated
        under_min_isr += p.under_min_isr
    return HealthCounts(total, online, total - online, under_replicated, under_min_isr)


def build_snapshot(
    *,
    registrations: Mapping[int, BrokerRow],
    known_broker_ids: Iterable[int],
    controller_id: int | None,
    controller_epoch: int | None,
    topics: Mapping[str, tuple[str | None, list[RawPartition]]],
    topic_configs: Mapping[str, Mapping[str, str]],
    deleting: Iterable[str],
    default_min_insync_replicas: int,
    pending_isr_change_notifications: int = 0,
    cluster_id: str | None = None,
    read_ms: float = 0.0,
) -> ClusterSnapshot:
    """Judge every partition's health and summarize per topic. `topics`: name -> (topic id,
    partitions); `registrations`: the registered (alive) brokers; a broker id named by an
    assignment or by `known_broker_ids` without a registration is listed as dead."""
    alive = frozenset(registrations)
    deleting = set(deleting)
    named: set[int] = set(known_broker_ids)
    summaries: dict[str, TopicSummary] = {}
    reassignments: list[PartitionRow] = []
    totals = HealthCounts()
    for name in sorted(topics):
        topic_id, raws = topics[name]
        configs = dict(topic_configs.get(name, {}))
        min_isr = _int_or(configs.get("min.insync.replicas"), default_min_insync_replicas)
        rows = tuple(
            judge_partition(name, raw, alive, min_isr)
            for raw in sorted(raws, key=lambda r: r.partition)
        )
        for row in rows:
            named.update(row.replicas)
            if row.reassigning:
                reassignments.append(row)
        counts = count_health(rows)
        totals = totals + counts
        summaries[name] = TopicSummary(
            name=name,
            partitions=rows,
            counts=counts,
            replication_factor=max((len(r.replicas) for r in rows), default=0),
            configs=configs,
            min_insync_replicas=min_isr,
            marked_for_deletion=name in deleting,
            topic_id=topic_id,
        )
    brokers = [registrations[i] for i in sorted(registrations)]
    brokers += [BrokerRow(id=i, alive=False) for i in sorted(named - alive)]
    brokers.sort(key=lambda b: b.id)
    return ClusterSnapshot(
        brokers=tuple(brokers),
        controller_id=controller_id,
        controller_epoch=controller_epoch,
        topics=summaries,
        totals=totals,
        reassignments=tuple(reassignments),
        pending_isr_change_notifications=pending_isr_change_notifications,
        cluster_id=cluster_id,
        read_ms=read_ms,
    )


def _int_or(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


# -- what changed between two snapshots -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """A partition's leader, leader epoch or ISR as it changed between two snapshots the console
    read: what a watcher of the controller's work sees (elections, ISR shrinks and expansions,
    partitions appearing and going)."""

    at: float
    topic: str
    partition: int
    kind: str  # "leader", "isr", "created", "deleted", "topic-created", "topic-deleted"
    leader_before: int | None
    leader_after: int | None
    leader_epoch: int | None
    isr_before: tuple[int, ...]
    isr_after: tuple[int, ...]
    partitions: int | None = None  # how many, for topic-created / topic-deleted

    @property
    def description(self) -> str:
        if self.kind == "topic-created":
            return f"topic created with {self.partitions} partition(s)"
        if self.kind == "topic-deleted":
            return "topic deleted"
        if self.kind == "created":
            return f"created: leader {self.leader_after}, ISR {list(self.isr_after)}"
        if self.kind == "deleted":
            return "deleted"
        parts = []
        if self.leader_before != self.leader_after:
            before = "none" if self.leader_before in (None, -1) else self.leader_before
            after = "none" if self.leader_after in (None, -1) else self.leader_after
            parts.append(f"leader {before} -> {after} (epoch {self.leader_epoch})")
        if self.isr_before != self.isr_after:
            verb = "shrank" if len(self.isr_after) < len(self.isr_before) else "changed"
            verb = "expanded" if len(self.isr_after) > len(self.isr_before) else verb
            parts.append(f"ISR {verb} {list(self.isr_before)} -> {list(self.isr_after)}")
        if not parts:
            parts.append(f"leader epoch {self.leader_epoch}")
        return "; ".join(parts)


def diff_snapshots(before: ClusterSnapshot, after: ClusterSnapshot) -> list[PartitionChange]:
    """Every partition whose leader, leader epoch or ISR differs between two snapshots, plus
    partitions created and deleted, in topic and partition order."""
    changes: list[PartitionChange] = []
    at = after.taken_at
    for name in sorted(set(before.topics) | set(after.topics)):
        old_topic, new_topic = before.topics.get(name), after.topics.get(name)
        old = {p.partition: p for p in old_topic.partitions} if old_topic else {}
        new = {p.partition: p for p in new_topic.partitions} if new_topic else {}
        if old_topic is None or new_topic is None:
            # A whole topic came or went: one event, not one per partition.
            kind = "topic-created" if old_topic is None else "topic-deleted"
            count = len(new if new_topic else old)
            changes.append(PartitionChange(at, name, -1, kind, None, None, None, (), (), count))
            continue
        for index in sorted(set(old) | set(new)):
            o, n = old.get(index), new.get(index)
            if o is None and n is not None:
                changes.append(
                    PartitionChange(
                        at, name, index, "created", None, n.leader, n.leader_epoch, (), n.isr
                    )
                )
            elif n is None and o is not None:
                changes.append(
                    PartitionChange(at, name, index, "deleted", o.leader, None, None, o.isr, ())
                )
            elif (
                o is not None
                and n is not None
                and (o.leader != n.leader or o.leader_epoch != n.leader_epoch or o.isr != n.isr)
            ):
                kind = (
                    "leader" if o.leader != n.leader or o.leader_epoch != n.leader_epoch else "isr"
                )
                changes.append(
                    PartitionChange(
                        at, name, index, kind, o.leader, n.leader, n.leader_epoch, o.isr, n.isr
                    )
                )
    return changes
