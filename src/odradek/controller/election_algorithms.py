"""Partition leader election: pure decisions over broker ids, no I/O.

The controller calls these with what it has cached (the assigned replicas AR, the ISR from the partition
state znode, the set of live brokers) and writes the result to ZooKeeper itself. Keeping the decisions
pure means every rule below has its own table of test cases and the controller's callbacks only move data.

Four situations elect a leader, each with its own rule (Kafka's `PartitionLeaderElectionAlgorithms`):

* **offline partition** (the leader's broker died, or the partition is new after a failover): the first
  replica in AR order that is live and in the ISR. If there is none and `unclean.leader.election.enable`
  is set for the topic, the first live replica in AR order, even though it is not in the ISR: the
  partition becomes available again but may have lost acknowledged records. Otherwise no leader; the
  partition stays offline until an ISR member returns (consistency over availability).
* **reassignment**: the first replica of the *target* replica list that is live and in the ISR.
* **preferred replica**: the first replica of AR, and only it, if it is live and in the ISR.
* **controlled shutdown**: the first replica of AR that is live, in the ISR and not on a broker that is
  shutting down.

AR order matters everywhere: the first replica of AR is the *preferred* replica, so preferring AR order
moves leadership back towards the placement the assignment algorithm balanced.

The ISR a decision produces follows Kafka's `Election`: a clean offline election keeps the ISR members
that are still live (in ISR order); an unclean one sets the ISR to the new leader alone; a controlled
shutdown drops the shutting-down brokers; reassignment and preferred election leave the ISR unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import NamedTuple

NO_LEADER = -1
"""The leader id written to the partition state znode when a partition has no leader (Kafka's NoLeader)."""


class ElectionDecision(NamedTuple):
    """A new leader and ISR for one partition.

    `unclean` is true when the leader was not in the ISR it was elected from: records the old ISR
    acknowledged may be missing from it. The controller counts these (Kafka's unclean election rate).
    """

    leader: int
    isr: list[int]
    unclean: bool = False


# --- the four algorithms: leader only -------------------------------------------------------------


def offline_partition_leader_election(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int], unclean: bool
) -> int | None:
    """The leader for a partition whose leader is gone, or None if no replica may lead.

    `assignment` is AR in order, `live` the brokers currently registered. A replica in the ISR but not in
    AR (possible mid-reassignment) is never chosen: only assigned replicas may lead.
    """
    for replica in assignment:
        if replica in live and replica in isr:
            return replica
    if unclean:
        for replica in assignment:
            if replica in live:
                return replica
    return None


def reassign_partition_leader_election(
    reassignment: Sequence[int], isr: Sequence[int], live: Collection[int]
) -> int | None:
    """The leader during a reassignment: the first target replica that is live and in the ISR."""
    for replica in reassignment:
        if replica in live and replica in isr:
            return replica
    return None


def preferred_replica_partition_leader_election(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int]
) -> int | None:
    """The preferred replica (first of AR) if it is live and in the ISR, else None.

    None means "leave the current leader alone": preferred election never falls back to another replica,
    since any other choice would not move leadership towards the balanced placement.
    """
    if not assignment:
        return None
    preferred = assignment[0]
    if preferred in live and preferred in isr:
        return preferred
    return None


def controlled_shutdown_partition_leader_election(
    assignment: Sequence[int],
    isr: Sequence[int],
    live: Collection[int],
    shutting_down: Collection[int],
) -> int | None:
    """The first replica of AR that is live, in the ISR and not shutting down, else None.

    Whether `live` includes the shutting-down brokers does not matter (Kafka passes them as live, since
    they are still registered): they are excluded either way.
    """
    for replica in assignment:
        if replica in live and replica in isr and replica not in shutting_down:
            return replica
    return None


# --- wrappers that also decide the ISR ------------------------------------------------------------


def elect_offline_partition_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int], unclean: bool
) -> ElectionDecision | None:
    """Leader and ISR for an offline partition, or None when no replica may lead.

    Clean: ISR = the old ISR members that are live, in ISR order (the leader is among them). Unclean:
    ISR = [leader]; the other replicas must catch up from it and rejoin, because nothing says their logs
    agree with the new leader's.
    """
    leader = offline_partition_leader_election(assignment, isr, live, unclean)
    if leader is None:
        return None
    if leader in isr:
        return ElectionDecision(leader, [replica for replica in isr if replica in live], False)
    return ElectionDecision(leader, [leader], True)


def elect_reassigned_partition_leader(
    reassignment: Sequence[int], isr: Sequence[int], live: Collection[int]
) -> ElectionDecision | None:
    """Leader for a partition being reassigned to `reassignment`; the ISR is left as it is."""
    leader = reassign_partition_leader_election(reassignment, isr, live)
    if leader is None:
        return None
    return ElectionDecision(leader, list(isr))


def elect_preferred_replica_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int]
) -> ElectionDecision | None:
    """The preferred replica as leader; the ISR is left as it is."""
    leader = preferred_replica_partition_leader_election(assignment, isr, live)
    if leader is None:
        return None
    return ElectionDecision(leader, list(isr))


def elect_controlled_shutdown_leader(
    assignment: Sequence[int],
    isr: Sequence[int],
    live: Collection[int],
    shutting_down: Collection[int],
) -> ElectionDecision | None:
    """Leader and ISR when the current leader's broker is shutting down cleanly.

    The new ISR drops the shutting-down brokers (and only them: the ISR is not filtered by liveness here,
    as in Kafka), so that `acks=all` producers stop waiting for a broker that is about to stop fetching.
    """
    leader = controlled_shutdown_partition_leader_election(assignment, isr, live, shutting_down)
    if leader is None:
        return None
    return ElectionDecision(leader, [replica for replica in isr if replica not in shutting_down])


# --- leader and ISR without an election -----------------------------------------------------------


def new_partition_leader_and_isr(
    assignment: Sequence[int], live: Collection[int]
) -> ElectionDecision | None:
    """The first leader and ISR of a new partition (NewPartition -> OnlinePartition), or None.

    No replica has data yet, so every live assigned replica is in sync: leader = the first live replica
    of AR, ISR = all live replicas of AR in AR order. None when no assigned replica is live; the partition
    then stays NewPartition until one is.
    """
    live_replicas = [replica for replica in assignment if replica in live]
    if not live_replicas:
        return None
    return ElectionDecision(live_replicas[0], live_replicas)


def remove_replica_from_isr(leader: int, isr: Sequence[int], replica: int) -> tuple[int, list[int]]:
    """Leader and ISR after `replica` goes offline (the OfflineReplica transition's ISR shrink).

    If the replica led, the leader becomes NO_LEADER (-1) and an election must follow. The ISR never
    becomes empty: when the replica is its last member it stays, so that a later clean election can
    still tell which replica holds every committed record (it will lead again when it returns). A
    replica not in the ISR changes nothing.
    """
    if replica not in isr:
        return leader, list(isr)
    new_leader = NO_LEADER if replica == leader else leader
    if len(isr) == 1:
        return new_leader, list(isr)
    return new_leader, [member for member in isr if member != replica]
