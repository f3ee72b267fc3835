"""Partition reassignment as pure decisions over replica lists (KIP-455), no I/O.

While a partition moves from its original replica set ORS to a target replica set TRS, its assignment
znode (`/brokers/topics/<t>`, version 2) holds three lists per partition:

* `partitions` — RS, the full replica set: TRS first, in target order, then the ORS members that are
  not in TRS (so that a replica being removed keeps its log and keeps fetching until the end);
* `adding_replicas` — AR = TRS - ORS, the replicas that must catch up before the move completes;
* `removing_replicas` — RR = ORS - TRS, the replicas that go away when it completes.

From those three lists alone the controller can recover both ends of the move after a failover:
ORS = RS - AR and TRS = RS - RR. That is why the assignment znode is rewritten with RS = TRS only as
the last step of a reassignment: until then it is the only durable record of ORS. TRS keeps its order;
ORS keeps its members but not always its order (RS lists the target first), so a cancelled move may
come back with another preferred replica, exactly as in Kafka.

Worked example (ORS = [1, 2], TRS = [2, 3]; leader 1):

    RS        AR    RR    leader  ISR
    [1, 2]    []    []    1       [1, 2]       before
    [2, 3, 1] [3]   [1]   1       [1, 2]       started: 3 is a NewReplica and fetches from 1
    [2, 3, 1] [3]   [1]   1       [1, 2, 3]    3 caught up: TRS is in the ISR
    [2, 3, 1] [3]   [1]   2       [1, 2, 3]    the leader moves into TRS (first live TRS in ISR)
    [2, 3, 1] [3]   [1]   2       [2, 3]       1 goes offline and is deleted
    [2, 3]    []    []    2       [2, 3]       the assignment znode says RS = TRS: done

A new target for a partition already moving is computed against ORS, not against RS: reassigning
[2, 3, 1] (ORS [1, 2]) to [1, 2] is a cancellation and restores RS = [1, 2]; the replicas that were
being added and are not wanted any more (3) are stopped and deleted at once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from odradek.errors import InvalidReplicaAssignmentError
from odradek.zk.znodes import ReplicaAssignment


def origin_replicas(assignment: ReplicaAssignment) -> tuple[int, ...]:
    """ORS: the replica set before the reassignment began (RS without the adding replicas)."""
    adding = set(assignment.adding_replicas)
    return tuple(r for r in assignment.replicas if r not in adding)


def target_replicas(assignment: ReplicaAssignment) -> tuple[int, ...]:
    """TRS: the replica set the reassignment moves to (RS without the removing replicas)."""
    removing = set(assignment.removing_replicas)
    return tuple(r for r in assignment.replicas if r not in removing)


def is_being_reassigned(assignment: ReplicaAssignment) -> bool:
    return bool(assignment.adding_replicas or assignment.removing_replicas)


def reassign_to(assignment: ReplicaAssignment, target: Sequence[int]) -> ReplicaAssignment:
    """The full assignment that moves `assignment`'s ORS to `target`.

    RS = TRS followed by the ORS members not in TRS; AR = RS - ORS; RR = ORS - TRS. A target equal
    to ORS gives a plain assignment with neither adding nor removing replicas (a cancellation).
    """
    origin = origin_replicas(assignment)
    full = list(dict.fromkeys([*target, *origin]))
    origin_set, target_set = set(origin), set(target)
    return ReplicaAssignment(
        tuple(full),
        tuple(r for r in full if r not in origin_set),
        tuple(r for r in origin if r not in target_set),
    )


def build_reassignment(
    current: ReplicaAssignment, target: Sequence[int] | None
) -> ReplicaAssignment | None:
    """The assignment a request asks for, or None when there is nothing to do.

    `target` None is a cancellation (AlterPartitionReassignments with null replicas): it reverts a
    reassignment in progress to ORS, and is None (NO_REASSIGNMENT_IN_PROGRESS) when there is none.
    """
    if target is None:
        if not is_being_reassigned(current):
            return None
        return reassign_to(current, origin_replicas(current))
    return reassign_to(current, target)


def validate_target_replicas(target: Sequence[int]) -> None:
    """The shape checks of a requested replica list: INVALID_REPLICA_ASSIGNMENT if it is empty,
    lists a broker twice or names a negative broker id."""
    if not target:
        raise InvalidReplicaAssignmentError("empty replica list in a partition reassignment")
    if len(set(target)) != len(target):
        raise InvalidReplicaAssignmentError(
            f"duplicate broker ids in the reassignment replica list {list(target)}"
        )
    if any(r < 0 for r in target):
        raise InvalidReplicaAssignmentError(f"invalid broker id in replica list {list(target)}")


def validate_new_replicas_live(
    current: ReplicaAssignment, target: Sequence[int], live: Collection[int]
) -> None:
    """INVALID_REPLICA_ASSIGNMENT when a replica the move would add is not on a live broker: a
    replica nobody hosts could never join the ISR, so the reassignment could never complete."""
    adding = reassign_to(current, target).adding_replicas
    dead = [r for r in adding if r not in live]
    if dead:
        raise InvalidReplicaAssignmentError(
            f"replica assignment {list(target)} has brokers that are not alive: {dead}"
            f" (live brokers: {sorted(live)})"
        )


def is_reassignment_complete(assignment: ReplicaAssignment, isr: Iterable[int]) -> bool:
    """Phase B may run once every target replica is in the ISR (trivially when not moving)."""
    if not is_being_reassigned(assignment):
        return True
    return set(target_replicas(assignment)) <= set(isr)


def replicas_to_stop(previous: Sequence[int], new: Sequence[int]) -> list[int]:
    """Replicas of `previous` RS absent from `new` RS: replicas a superseding reassignment (or a
    cancellation) no longer wants, to be stopped and deleted at once."""
    keep = set(new)
    return [r for r in previous if r not in keep]


def leader_needs_election(target: Collection[int], leader: int, live: Collection[int]) -> bool:
    """Whether completing a move must elect a new leader: the current leader is leaving (not in
    TRS) or is not live. Otherwise the leader stays and only its epoch is bumped, so that it learns
    the shrunk replica set."""
    return leader not in target or leader not in live
