"""Replica assignment for new topics and new partitions: which brokers hold each partition's replicas.

Pure functions; the caller passes the live brokers (and their racks) and writes the result to
`/brokers/topics/<topic>`. The first replica of each partition is its *preferred* replica, the leader
whenever it is live and in the ISR, so spreading first replicas spreads leadership.

Rack-unaware placement (the seed's algorithm plus Kafka's refinements). With the n live brokers sorted
by id, a start index `s` and a replica shift `h` (both random unless fixed):

* partition p's first replica is broker[(p + s) mod n] -- round robin, so leaders spread evenly;
* its replica j (j = 1 .. RF-1) is broker[(first + 1 + (h + j - 1) mod (n - 1)) mod n] -- a fixed
  offset from the first replica, never 0 (so never the first replica itself), distinct for distinct j;
* `h` grows by one each time p passes a multiple of n, so a broker's followers are not always the same
  brokers: when it fails, its partitions' leadership spreads over several survivors.

With s = h = 0 and p < n this is exactly the seed's rule: first replica on i mod n, replica j on
(i + j) mod n. Worked example, 5 brokers, s = h = 0, 10 partitions, RF = 3:

    broker:      0    1    2    3    4
    1st replica: p0   p1   p2   p3   p4
                 p5   p6   p7   p8   p9
    2nd replica: p4   p0   p1   p2   p3
                 p8   p9   p5   p6   p7
    3rd replica: p3   p4   p0   p1   p2
                 p7   p8   p9   p5   p6

Rack-aware placement (when every broker has a rack): the brokers are first arranged in a *rack
alternated* list -- racks sorted by name, brokers within a rack sorted by id, then one broker from each
rack in turn (racks a:{0,5}, b:{3,4}, c:{1,2} give 0, 3, 1, 5, 4, 2). The first replica goes round robin
over that list as above. Each further replica walks the list from the same kind of shifted offset (the
shift scaled by the number of racks) and skips a broker if its rack already holds a replica of this
partition while some rack holds none, or if the broker already holds one. So a partition's replicas
land on distinct racks while RF <= number of racks, and every rack gets one when RF >= number of racks.

What this guarantees (and the property tests check):

* no broker appears twice in a partition;
* leaders (first replicas): over any run of consecutive partition ids, every broker leads
  floor(P/n) or ceil(P/n) of the P partitions -- max - min <= 1, in both modes;
* rack-unaware, replicas per broker: every aligned block of n partitions (ids k*n .. k*n + n-1) puts
  exactly RF replicas on every broker, since each replica position is a fixed offset from a round-robin
  first replica; a partial block adds 0..RF per broker. So with start_partition_id <= 0, max - min is 0
  when P is a multiple of n and at most RF otherwise;
* rack-aware, when the racks all have the same number of brokers and RF equals the number of racks,
  the same exact balance holds for every aligned block of n partitions;
* the result depends only on the arguments: with `fixed_start_index >= 0` no randomness is used; with
  a seeded `rng` the same seed gives the same assignment.
"""

from __future__ import annotations

import enum
import itertools
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from odradek.errors import (
    AdminOperationError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
)


@dataclass(frozen=True, slots=True)
class BrokerMetadata:
    """A live broker as replica assignment sees it: its id and rack (`broker.rack`), if any."""

    id: int
    rack: str | None = None


BrokerLike = BrokerMetadata | tuple[int, str | None] | int
"""A broker given to the assignment functions: metadata, an (id, rack) pair, or a bare id (no rack)."""


class RackAwareMode(enum.Enum):
    """How to treat racks when only some brokers have one (Kafka's RackAwareMode)."""

    ENFORCED = "enforced"
    """Use racks if every broker has one; if only some do, refuse (AdminOperationError)."""
    SAFE = "safe"
    """Use racks if every broker has one; if only some do, ignore racks."""
    DISABLED = "disabled"
    """Ignore racks."""


_system_random = random.SystemRandom()


def assign_replicas_to_brokers(
    n_partitions: int,
    replication_factor: int,
    brokers: Sequence[BrokerLike],
    fixed_start_index: int = -1,
    start_partition_id: int = -1,
    rng: random.Random | None = None,
    rack_aware_mode: RackAwareMode = RackAwareMode.ENFORCED,
) -> dict[int, list[int]]:
    """Assign `n_partitions` partitions of `replication_factor` replicas each to `brokers`.

    Partition ids run from max(0, start_partition_id). `fixed_start_index >= 0` fixes both the start
    index and the initial replica shift (Kafka's meaning); otherwise both are drawn from `rng` (a fresh
    system random source when None). The order of `brokers` does not matter: they are sorted by id.

    Raises InvalidPartitionsError (n_partitions <= 0), InvalidReplicationFactorError (RF <= 0 or more
    than the brokers), AdminOperationError (only some brokers have a rack in ENFORCED mode, or a broker
    id is given twice).
    """
    if n_partitions <= 0:
        raise InvalidPartitionsError(
            f"number of partitions must be larger than 0, not {n_partitions}"
        )
    if replication_factor <= 0:
        raise InvalidReplicationFactorError(
            f"replication factor must be larger than 0, not {replication_factor}"
        )
    metadata = _normalise(brokers)
    if replication_factor > len(metadata):
        raise InvalidReplicationFactorError(
            f"replication factor: {replication_factor} larger than available brokers: {len(metadata)}"
        )
    racks = _racks_to_use(metadata, rack_aware_mode)
    if rng is None:
        rng = _system_random
    first_partition_id = max(0, start_partition_id)
    if racks is None:
        return _assign_rack_unaware(
            n_partitions,
            replication_factor,
            [broker.id for broker in metadata],
            fixed_start_index,
            first_partition_id,
            rng,
        )
    return _assign_rack_aware(
        n_partitions, replication_factor, racks, fixed_start_index, first_partition_id, rng
    )


def assign_replicas_for_added_partitions(
    existing: Mapping[int, Sequence[int]],
    total_partitions: int,
    brokers: Sequence[BrokerLike],
    rack_aware_mode: RackAwareMode = RackAwareMode.ENFORCED,
) -> dict[int, list[int]]:
    """Assignment for the partitions added when a topic grows to `total_partitions` (CreatePartitions).

    Returns only the new partitions (ids len(existing) .. total_partitions-1). They keep the topic's
    replication factor (partition 0's) and continue its round robin: the start index is the position,
    in the sorted broker list, of the first broker whose id is >= partition 0's first replica, and the
    partition ids continue where the topic's end, so the new first replicas (leaders) are the ones the
    topic would have had if it had been created with all its partitions at once. (The followers'
    shift restarts from that start index, as in Kafka, so followers may differ from such a topic's.)
    Deterministic: no randomness.

    Raises InvalidPartitionsError if `total_partitions` is not an increase or the topic has no
    partition 0, plus everything `assign_replicas_to_brokers` raises.
    """
    if 0 not in existing or not existing[0]:
        raise InvalidPartitionsError("the topic has no partition 0 with replicas")
    to_add = total_partitions - len(existing)
    if to_add <= 0:
        raise InvalidPartitionsError(
            f"the number of partitions can only be increased: the topic has {len(existing)},"
            f" {total_partitions} would not be an increase"
        )
    partition_zero = existing[0]
    sorted_ids = [broker.id for broker in _normalise(brokers)]
    start_index = next(
        (index for index, broker_id in enumerate(sorted_ids) if broker_id >= partition_zero[0]), 0
    )
    return assign_replicas_to_brokers(
        to_add,
        len(partition_zero),
        brokers,
        fixed_start_index=start_index,
        start_partition_id=len(existing),
        rack_aware_mode=rack_aware_mode,
    )


def validate_manual_assignment(
    assignment: Mapping[int, Sequence[int]],
    live_brokers: Collection[int],
    *,
    expected_replication_factor: int | None = None,
    first_partition_id: int = 0,
) -> None:
    """Check an explicit assignment (CreateTopics or CreatePartitions with assignments); raise if bad.

    The partition ids must be exactly first_partition_id .. first_partition_id + len - 1 (0-based and
    consecutive for a new topic); every partition needs at least one replica, no broker twice, only
    brokers in `live_brokers`, and the same number of replicas as every other partition (and as
    `expected_replication_factor`, when adding partitions to a topic). Raises
    InvalidReplicaAssignmentError naming the first problem found, in partition order.
    """
    if not assignment:
        raise InvalidReplicaAssignmentError("the replica assignment has no partitions")
    expected_ids = set(range(first_partition_id, first_partition_id + len(assignment)))
    if set(assignment) != expected_ids:
        raise InvalidReplicaAssignmentError(
            f"partitions should be a consecutive integer sequence starting at {first_partition_id},"
            f" not {sorted(assignment)}"
        )
    replication_factor = expected_replication_factor
    for partition in sorted(assignment):
        replicas = list(assignment[partition])
        if not replicas:
            raise InvalidReplicaAssignmentError(
                f"cannot have replication factor of 0 for partition {partition}"
            )
        if len(set(replicas)) != len(replicas):
            raise InvalidReplicaAssignmentError(
                f"duplicate brokers in the replica assignment {replicas} of partition {partition}"
            )
        unknown = [replica for replica in replicas if replica not in live_brokers]
        if unknown:
            raise InvalidReplicaAssignmentError(
                f"unknown or unavailable brokers {unknown} in the replica assignment of partition"
                f" {partition}; available brokers: {sorted(live_brokers)}"
            )
        if replication_factor is None:
            replication_factor = len(replicas)
        elif len(replicas) != replication_factor:
            raise InvalidReplicaAssignmentError(
                f"inconsistent replication factor: expected {replication_factor} replicas,"
                f" partition {partition} has {len(replicas)}"
            )


def rack_alternated_broker_list(broker_racks: Mapping[int, str]) -> list[int]:
    """Brokers ordered one per rack in turn: racks sorted by name, brokers in a rack sorted by id.

    Racks a:{0, 5}, b:{3, 4}, c:{1, 2} give [0, 3, 1, 5, 4, 2]. A rack that runs out is skipped.
    """
    by_rack: dict[str, list[int]] = {}
    for broker_id, rack in broker_racks.items():
        by_rack.setdefault(rack, []).append(broker_id)
    columns = [sorted(by_rack[rack]) for rack in sorted(by_rack)]
    deepest = max((len(column) for column in columns), default=0)
    return [column[row] for row in range(deepest) for column in columns if row < len(column)]


# --- internals ------------------------------------------------------------------------------------


def _normalise(brokers: Sequence[BrokerLike]) -> list[BrokerMetadata]:
    """BrokerMetadata for every broker, sorted by id; a repeated id is an error."""
    metadata: list[BrokerMetadata] = []
    for broker in brokers:
        if isinstance(broker, BrokerMetadata):
            metadata.append(broker)
        elif isinstance(broker, int):
            metadata.append(BrokerMetadata(broker))
        else:
            broker_id, rack = broker
            metadata.append(BrokerMetadata(broker_id, rack))
    metadata.sort(key=lambda broker: broker.id)
    for previous, current in itertools.pairwise(metadata):
        if previous.id == current.id:
            raise AdminOperationError(f"broker {current.id} is listed more than once")
    return metadata


def _racks_to_use(metadata: Sequence[BrokerMetadata], mode: RackAwareMode) -> dict[int, str] | None:
    """The broker -> rack map to assign with, or None for rack-unaware assignment."""
    with_rack = {broker.id: broker.rack for broker in metadata if broker.rack is not None}
    if mode is RackAwareMode.DISABLED or not with_rack:
        return None
    if len(with_rack) < len(metadata):
        if mode is RackAwareMode.SAFE:
            return None
        missing = sorted(broker.id for broker in metadata if broker.rack is None)
        raise AdminOperationError(
            f"not all brokers have rack information for rack-aware replica assignment"
            f" (brokers without a rack: {missing}); disable rack awareness to assign without racks"
        )
    return with_rack


def _replica_index(first_replica_index: int, replica_shift: int, k: int, n_brokers: int) -> int:
    """The broker index of a follower: a shift of 1 .. n-1 from the first replica, never 0.

    Only called when n_brokers >= 2 (RF >= 2 needs two brokers), so n_brokers - 1 is never zero.
    """
    shift = 1 + (replica_shift + k) % (n_brokers - 1)
    return (first_replica_index + shift) % n_brokers


def _start_and_shift(fixed_start_index: int, n_brokers: int, rng: random.Random) -> tuple[int, int]:
    if fixed_start_index >= 0:
        return fixed_start_index, fixed_start_index
    start_index = rng.randrange(n_brokers)
    return start_index, rng.randrange(n_brokers)


def _assign_rack_unaware(
    n_partitions: int,
    replication_factor: int,
    broker_ids: list[int],
    fixed_start_index: int,
    first_partition_id: int,
    rng: random.Random,
) -> dict[int, list[int]]:
    n_brokers = len(broker_ids)
    start_index, replica_shift = _start_and_shift(fixed_start_index, n_brokers, rng)
    assignment: dict[int, list[int]] = {}
    for partition in range(first_partition_id, first_partition_id + n_partitions):
        if partition > 0 and partition % n_brokers == 0:
            replica_shift += 1
        first_index = (partition + start_index) % n_brokers
        replicas = [broker_ids[first_index]]
        for k in range(replication_factor - 1):
            replicas.append(broker_ids[_replica_index(first_index, replica_shift, k, n_brokers)])
        assignment[partition] = replicas
    return assignment


def _assign_rack_aware(
    n_partitions: int,
    replication_factor: int,
    broker_racks: dict[int, str],
    fixed_start_index: int,
    first_partition_id: int,
    rng: random.Random,
) -> dict[int, list[int]]:
    arranged = rack_alternated_broker_list(broker_racks)
    n_brokers = len(arranged)
    n_racks = len(set(broker_racks.values()))
    start_index, replica_shift = _start_and_shift(fixed_start_index, n_brokers, rng)
    assignment: dict[int, list[int]] = {}
    for partition in range(first_partition_id, first_partition_id + n_partitions):
        if partition > 0 and partition % n_brokers == 0:
            replica_shift += 1
        first_index = (partition + start_index) % n_brokers
        leader = arranged[first_index]
        replicas = [leader]
        racks_with_replica = {broker_racks[leader]}
        brokers_with_replica = {leader}
        k = 0
        for _ in range(replication_factor - 1):
            # Walk the followers' offsets until a broker qualifies. One always does within n - 1
            # steps (the walk visits every other broker): RF <= n leaves an unused broker, and while a
            # rack holds no replica, that rack's brokers are all unused.
            while True:
                candidate = arranged[
                    _replica_index(first_index, replica_shift * n_racks, k, n_brokers)
                ]
                k += 1
                rack = broker_racks[candidate]
                rack_ok = rack not in racks_with_replica or len(racks_with_replica) == n_racks
                broker_ok = (
                    candidate not in brokers_with_replica or len(brokers_with_replica) == n_brokers
                )
                if rack_ok and broker_ok:
                    replicas.append(candidate)
                    racks_with_replica.add(rack)
                    brokers_with_replica.add(candidate)
                    break
        assignment[partition] = replicas
    return assignment
