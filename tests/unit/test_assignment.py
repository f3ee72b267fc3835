"""Replica assignment (odradek.controller.assignment): worked examples, errors and properties."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from odradek.controller.assignment import (
    BrokerMetadata,
    RackAwareMode,
    assign_replicas_for_added_partitions,
    assign_replicas_to_brokers,
    rack_alternated_broker_list,
    validate_manual_assignment,
)
from odradek.errors import (
    AdminOperationError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
)


class NoRandom(random.Random):
    """An rng that fails the test if it is consulted."""

    def randrange(self, *args, **kwargs):  # type: ignore[override]
        raise AssertionError("randomness used although the start index was fixed")


# --- worked examples ------------------------------------------------------------------------------


def test_seed_example_four_brokers_four_partitions():
    # The seed: partition i's first replica on broker i mod n, replica j on (i + j) mod n.
    assignment = assign_replicas_to_brokers(4, 3, [0, 1, 2, 3], fixed_start_index=0)
    assert assignment == {p: [p % 4, (p + 1) % 4, (p + 2) % 4] for p in range(4)}


def test_shift_grows_every_n_partitions():
    # 5 brokers, 10 partitions, RF 3: the second round of partitions shifts its followers by one.
    assignment = assign_replicas_to_brokers(10, 3, [0, 1, 2, 3, 4], fixed_start_index=0)
    assert assignment == {
        0: [0, 1, 2],
        1: [1, 2, 3],
        2: [2, 3, 4],
        3: [3, 4, 0],
        4: [4, 0, 1],
        5: [0, 2, 3],
        6: [1, 3, 4],
        7: [2, 4, 0],
        8: [3, 0, 1],
        9: [4, 1, 2],
    }


def test_brokers_are_sorted_and_ids_need_not_be_contiguous():
    assignment = assign_replicas_to_brokers(3, 2, [30, 10, 20], fixed_start_index=0)
    assert assignment == {0: [10, 20], 1: [20, 30], 2: [30, 10]}


def test_fixed_start_index_and_start_partition_id():
    assignment = assign_replicas_to_brokers(
        2, 2, [0, 1, 2], fixed_start_index=1, start_partition_id=4
    )
    # partition 4: first index (4 + 1) % 3 = 2, follower shift 1 + (1 + 0) % 2 = 2; the shift stays
    # 1 because no multiple of 3 lies in 4..5
    assert assignment == {4: [2, 1], 5: [0, 2]}


def test_rack_alternated_list():
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert rack_alternated_broker_list(racks) == [0, 3, 1, 5, 4, 2]
    uneven = {1: "a", 2: "a", 3: "a", 4: "b"}
    assert rack_alternated_broker_list(uneven) == [1, 4, 2, 3]
    assert rack_alternated_broker_list({}) == []


def test_rack_aware_example():
    brokers = [(0, "rack1"), (1, "rack3"), (2, "rack3"), (3, "rack2"), (4, "rack2"), (5, "rack1")]
    assignment = assign_replicas_to_brokers(7, 3, brokers, fixed_start_index=0)
    assert assignment == {
        0: [0, 3, 1],
        1: [3, 1, 5],
        2: [1, 5, 4],
        3: [5, 4, 2],
        4: [4, 2, 0],
        5: [2, 0, 3],
        6: [0, 4, 2],  # second round: followers shifted, not a repeat of partition 0
    }


def test_rack_aware_skips_a_broker_whose_rack_already_has_a_replica():
    # Racks a: 1, 2, 3 and b: 4 -> alternated list [1, 4, 2, 3]. Partition 2 starts on broker 2 (rack
    # a); the plain walk would pick 3 (rack a too) but rack b has no replica yet, so 4 is chosen.
    brokers = [BrokerMetadata(1, "a"), BrokerMetadata(2, "a"), BrokerMetadata(3, "a"), (4, "b")]
    assignment = assign_replicas_to_brokers(4, 2, brokers, fixed_start_index=0)
    assert assignment == {0: [1, 4], 1: [4, 2], 2: [2, 4], 3: [3, 4]}
    racks = {1: "a", 2: "a", 3: "a", 4: "b"}
    for replicas in assignment.values():
        assert {racks[b] for b in replicas} == {"a", "b"}


def test_single_broker():
    assert assign_replicas_to_brokers(3, 1, [7], fixed_start_index=0) == {0: [7], 1: [7], 2: [7]}
    assert assign_replicas_to_brokers(2, 1, [(7, "r")], rng=random.Random(1)) == {0: [7], 1: [7]}


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_partitions", "replication_factor", "brokers", "error"),
    [
        (0, 1, [1], InvalidPartitionsError),
        (-3, 1, [1], InvalidPartitionsError),
        (1, 0, [1], InvalidReplicationFactorError),
        (1, -1, [1], InvalidReplicationFactorError),
        (1, 3, [1, 2], InvalidReplicationFactorError),
        (1, 1, [], InvalidReplicationFactorError),
        (0, 0, [], InvalidPartitionsError),  # partitions are checked first, as in Kafka
        (1, 1, [1, 1], AdminOperationError),
    ],
)
def test_invalid_arguments(n_partitions, replication_factor, brokers, error):
    with pytest.raises(error):
        assign_replicas_to_brokers(n_partitions, replication_factor, brokers, fixed_start_index=0)


def test_error_codes_reach_clients():
    with pytest.raises(InvalidReplicationFactorError) as raised:
        assign_replicas_to_brokers(1, 4, [1, 2, 3])
    assert raised.value.code.name == "invalid_replication_factor"


def test_partial_rack_information():
    brokers = [(1, "a"), (2, None), (3, "b")]
    with pytest.raises(AdminOperationError, match=r"\[2\]"):
        assign_replicas_to_brokers(3, 2, brokers, fixed_start_index=0)
    unaware = assign_replicas_to_brokers(3, 2, [1, 2, 3], fixed_start_index=0)
    for mode in (RackAwareMode.SAFE, RackAwareMode.DISABLED):
        assert (
            assign_replicas_to_brokers(3, 2, brokers, fixed_start_index=0, rack_aware_mode=mode)
            == unaware
        )


def test_disabled_mode_ignores_complete_racks():
    brokers = [(1, "a"), (2, "a"), (3, "b")]
    assert assign_replicas_to_brokers(
        3, 2, brokers, fixed_start_index=0, rack_aware_mode=RackAwareMode.DISABLED
    ) == assign_replicas_to_brokers(3, 2, [1, 2, 3], fixed_start_index=0)
    # with racks the alternated list is [1, 3, 2], which changes the placement
    assert assign_replicas_to_brokers(3, 2, brokers, fixed_start_index=0)[0] == [1, 3]


# --- adding partitions ----------------------------------------------------------------------------


def test_added_partitions_continue_the_leader_round_robin():
    brokers = [1, 2, 3, 4]
    whole = assign_replicas_to_brokers(6, 2, brokers, fixed_start_index=2)
    existing = {p: whole[p] for p in range(3)}
    added = assign_replicas_for_added_partitions(existing, 6, brokers)
    assert sorted(added) == [3, 4, 5]
    assert [added[p][0] for p in (3, 4, 5)] == [whole[p][0] for p in (3, 4, 5)]
    assert all(len(replicas) == 2 for replicas in added.values())


def test_added_partitions_errors():
    with pytest.raises(InvalidPartitionsError):
        assign_replicas_for_added_partitions({0: [1], 1: [2]}, 2, [1, 2])
    with pytest.raises(InvalidPartitionsError):
        assign_replicas_for_added_partitions({1: [2]}, 3, [1, 2])
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas_for_added_partitions({0: [1, 2, 3]}, 2, [1, 2])


def test_added_partitions_when_partition_zero_leader_is_gone():
    # partition 0 led by broker 9, which is no longer live: start at the first broker with id >= 9,
    # or at index 0 if there is none
    added = assign_replicas_for_added_partitions({0: [9]}, 3, [1, 2, 3])
    assert added == {1: [2], 2: [3]}


# --- manual assignments ---------------------------------------------------------------------------


def test_valid_manual_assignment():
    validate_manual_assignment({0: [1, 2], 1: [2, 3], 2: [3, 1]}, {1, 2, 3})
    validate_manual_assignment(
        {3: [1], 4: [2]}, [1, 2], expected_replication_factor=1, first_partition_id=3
    )


@pytest.mark.parametrize(
    ("assignment", "kwargs", "message"),
    [
        ({}, {}, "no partitions"),
        ({0: [1, 1]}, {}, "duplicate"),
        ({0: [1, 2], 1: [2]}, {}, "inconsistent replication factor"),
        ({0: [1], 2: [2]}, {}, "consecutive"),
        ({1: [1], 2: [2]}, {}, "consecutive"),
        ({0: [1, 9]}, {}, "unknown"),
        ({0: []}, {}, "replication factor of 0"),
        ({0: [1]}, {"expected_replication_factor": 2}, "inconsistent replication factor"),
        ({0: [1]}, {"first_partition_id": 2}, "consecutive"),
    ],
)
def test_invalid_manual_assignment(assignment, kwargs, message):
    with pytest.raises(InvalidReplicaAssignmentError, match=message):
        validate_manual_assignment(assignment, {1, 2, 3}, **kwargs)


# --- properties -----------------------------------------------------------------------------------

broker_ids = st.lists(st.integers(0, 200), min_size=1, max_size=12, unique=True)


@st.composite
def rack_unaware_cases(draw):
    brokers = draw(broker_ids)
    replication_factor = draw(st.integers(1, len(brokers)))
    n_partitions = draw(st.integers(1, 60))
    seed = draw(st.integers(0, 2**32))
    return brokers, replication_factor, n_partitions, seed


@st.composite
def rack_aware_cases(draw):
    brokers = draw(broker_ids)
    n_racks = draw(st.integers(1, len(brokers)))
    racks = [f"rack{i}" for i in range(n_racks)]
    # every rack gets at least one broker, the rest are spread at random
    rack_of = racks + [draw(st.sampled_from(racks)) for _ in range(len(brokers) - n_racks)]
    rack_of = draw(st.permutations(rack_of))
    replication_factor = draw(st.integers(1, len(brokers)))
    n_partitions = draw(st.integers(1, 60))
    seed = draw(st.integers(0, 2**32))
    return list(zip(brokers, rack_of, strict=True)), replication_factor, n_partitions, seed


def leader_counts(assignment, brokers):
    counts = Counter(replicas[0] for replicas in assignment.values())
    return [counts[b] for b in brokers]


def replica_counts(assignment, brokers):
    counts = Counter(b for replicas in assignment.values() for b in replicas)
    return [counts[b] for b in brokers]


def check_common(assignment, broker_list, replication_factor, n_partitions, first_partition_id):
    assert sorted(assignment) == list(range(first_partition_id, first_partition_id + n_partitions))
    for replicas in assignment.values():
        assert len(replicas) == replication_factor
        assert len(set(replicas)) == replication_factor  # no broker twice in a partition
        assert set(replicas) <= set(broker_list)
    # leaders: floor(P/n) or ceil(P/n) per broker
    n = len(broker_list)
    assert set(leader_counts(assignment, broker_list)) <= {n_partitions // n, -(-n_partitions // n)}


@given(rack_unaware_cases(), st.integers(-1, 30))
def test_rack_unaware_properties(case, start_partition_id):
    brokers, replication_factor, n_partitions, seed = case
    assignment = assign_replicas_to_brokers(
        n_partitions,
        replication_factor,
        brokers,
        start_partition_id=start_partition_id,
        rng=random.Random(seed),
    )
    check_common(assignment, brokers, replication_factor, n_partitions, max(0, start_partition_id))
    counts = replica_counts(assignment, brokers)
    assert sum(counts) == n_partitions * replication_factor
    if start_partition_id <= 0:
        n = len(brokers)
        spread = max(counts) - min(counts)
        assert spread == 0 if n_partitions % n == 0 else spread <= replication_factor


@given(rack_aware_cases(), st.integers(-1, 30))
def test_rack_aware_properties(case, start_partition_id):
    brokers, replication_factor, n_partitions, seed = case
    racks = dict(brokers)
    n_racks = len(set(racks.values()))
    assignment = assign_replicas_to_brokers(
        n_partitions,
        replication_factor,
        brokers,
        start_partition_id=start_partition_id,
        rng=random.Random(seed),
    )
    check_common(
        assignment, list(racks), replication_factor, n_partitions, max(0, start_partition_id)
    )
    for replicas in assignment.values():
        replica_racks = {racks[b] for b in replicas}
        # distinct racks while they last; every rack covered once RF reaches the number of racks
        assert len(replica_racks) == min(replication_factor, n_racks)


@given(
    n_racks=st.integers(1, 5),
    brokers_per_rack=st.integers(1, 4),
    rounds=st.integers(1, 4),
    first_round=st.integers(0, 3),
    seed=st.integers(0, 2**32),
)
def test_rack_aware_balance_with_equal_racks(n_racks, brokers_per_rack, rounds, first_round, seed):
    rng = random.Random(seed)
    ids = rng.sample(range(1000), n_racks * brokers_per_rack)
    brokers = [(broker_id, f"rack{i % n_racks}") for i, broker_id in enumerate(ids)]
    n = len(brokers)
    assignment = assign_replicas_to_brokers(
        rounds * n, n_racks, brokers, start_partition_id=first_round * n, rng=rng
    )
    counts = replica_counts(assignment, ids)
    assert min(counts) == max(counts) == rounds * n_racks


@given(rack_unaware_cases(), st.booleans())
def test_deterministic_given_seed(case, with_racks):
    brokers, replication_factor, n_partitions, seed = case
    if with_racks:
        brokers = [(b, f"r{b % 3}") for b in brokers]
    first = assign_replicas_to_brokers(
        n_partitions, replication_factor, brokers, rng=random.Random(seed)
    )
    again = assign_replicas_to_brokers(
        n_partitions, replication_factor, list(reversed(brokers)), rng=random.Random(seed)
    )
    assert first == again


@given(rack_unaware_cases(), st.integers(0, 20), st.booleans())
def test_fixed_start_index_uses_no_randomness(case, fixed_start_index, with_racks):
    brokers, replication_factor, n_partitions, _ = case
    if with_racks:
        brokers = [(b, f"r{b % 3}") for b in brokers]
    first = assign_replicas_to_brokers(
        n_partitions,
        replication_factor,
        brokers,
        fixed_start_index=fixed_start_index,
        rng=NoRandom(),
    )
    assert first == assign_replicas_to_brokers(
        n_partitions, replication_factor, brokers, fixed_start_index=fixed_start_index
    )


def test_random_start_varies_leaders():
    # Without a fixed start, different seeds start the round robin on different brokers.
    firsts = {
        assign_replicas_to_brokers(1, 1, list(range(10)), rng=random.Random(seed))[0][0]
        for seed in range(50)
    }
    assert len(firsts) > 1
