"""Table tests for the leader election algorithms (odradek.controller.election_algorithms)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from odradek.controller.election_algorithms import (
    NO_LEADER,
    ElectionDecision,
    controlled_shutdown_partition_leader_election,
    elect_controlled_shutdown_leader,
    elect_offline_partition_leader,
    elect_preferred_replica_leader,
    elect_reassigned_partition_leader,
    new_partition_leader_and_isr,
    offline_partition_leader_election,
    preferred_replica_partition_leader_election,
    reassign_partition_leader_election,
    remove_replica_from_isr,
)

# --- offline partition ----------------------------------------------------------------------------

# (AR, ISR, live, unclean) -> (leader, new ISR, is unclean) or None
OFFLINE_CASES = [
    # the seed's rows (DESIGN.md section 3)
    ([1, 2, 3, 4, 5], [1, 2, 3], {2, 3, 5}, False, (2, [2, 3], False)),
    ([1, 2, 3, 4, 5], [1, 2, 3], {2, 3, 5}, True, (2, [2, 3], False)),
    ([1, 2, 3, 4, 5], [1, 2, 3], {4, 6, 7}, True, (4, [4], True)),
    ([1, 2, 3, 4, 5], [1, 2, 3], {4, 6, 7}, False, None),
    # AR order decides, not ISR order; the new ISR keeps ISR order
    ([3, 1, 2], [1, 2, 3], {1, 2, 3}, False, (3, [1, 2, 3], False)),
    ([3, 1, 2], [2, 1], {1, 2}, False, (1, [2, 1], False)),
    # the seed's broker-failure example: leader 1 dies
    ([1, 2, 3], [1, 2, 3], {2, 3}, False, (2, [2, 3], False)),
    # every replica dead
    ([1, 2, 3], [1, 2, 3], set(), False, None),
    ([1, 2, 3], [1, 2, 3], set(), True, None),
    ([1, 2, 3], [1, 2, 3], {4, 5}, True, None),
    # empty ISR: only an unclean election can find a leader
    ([1, 2, 3], [], {1, 2, 3}, False, None),
    ([1, 2, 3], [], {2, 3}, True, (2, [2], True)),
    # ISR member not in AR (mid-reassignment) never leads
    ([1, 2], [9, 2], {9, 2}, False, (2, [9, 2], False)),
    ([1, 2], [9], {9}, False, None),
    ([1, 2], [9], {9, 1}, True, (1, [1], True)),
    # unclean enabled but a clean choice exists: the clean choice wins, even if later in AR
    ([1, 2, 3], [3], {1, 2, 3}, True, (3, [3], False)),
    # a live ISR member outside AR stays in the new ISR (ISR filtered by liveness only)
    ([1, 2, 3], [1, 7, 2], {2, 7}, False, (2, [7, 2], False)),
    # empty AR
    ([], [1], {1}, True, None),
    # single replica
    ([5], [5], {5}, False, (5, [5], False)),
    ([5], [5], set(), True, None),
]


@pytest.mark.parametrize(("assignment", "isr", "live", "unclean", "expected"), OFFLINE_CASES)
def test_offline_partition_leader_election(assignment, isr, live, unclean, expected):
    leader = offline_partition_leader_election(assignment, isr, live, unclean)
    decision = elect_offline_partition_leader(assignment, isr, live, unclean)
    if expected is None:
        assert leader is None
        assert decision is None
    else:
        assert leader == expected[0]
        assert decision == ElectionDecision(*expected)
        assert tuple(decision) == expected


def test_offline_election_accepts_any_collection_for_live():
    assert offline_partition_leader_election([1, 2], [2], [2], False) == 2
    assert offline_partition_leader_election([1, 2], (2,), frozenset({2}), False) == 2


@given(
    assignment=st.lists(st.integers(0, 8), unique=True, max_size=6),
    isr=st.lists(st.integers(0, 8), unique=True, max_size=6),
    live=st.sets(st.integers(0, 8)),
    unclean=st.booleans(),
)
def test_offline_election_properties(assignment, isr, live, unclean):
    decision = elect_offline_partition_leader(assignment, isr, live, unclean)
    clean_candidates = [r for r in assignment if r in live and r in isr]
    if decision is None:
        assert not clean_candidates
        assert not unclean or not any(r in live for r in assignment)
        return
    assert decision.leader in assignment and decision.leader in live
    assert decision.leader in decision.isr
    assert set(decision.isr) <= set(live)
    if decision.unclean:
        assert unclean and not clean_candidates and decision.isr == [decision.leader]
    else:
        assert decision.leader == clean_candidates[0]
        assert decision.isr == [r for r in isr if r in live]


# --- reassignment ---------------------------------------------------------------------------------

REASSIGN_CASES = [
    # (target replicas, ISR, live) -> leader
    ([4, 5, 6], [1, 2, 3, 4, 5, 6], {1, 2, 3, 4, 5, 6}, 4),
    ([4, 5, 6], [1, 2, 5, 6], {1, 2, 4, 5, 6}, 5),  # 4 not yet in ISR
    ([4, 5, 6], [1, 4, 5, 6], {1, 5, 6}, 5),  # 4 dead
    ([4, 5, 6], [1, 2, 3], {1, 2, 3, 4, 5, 6}, None),  # no target replica in sync yet
    ([4, 5, 6], [4, 5, 6], set(), None),
    ([6, 5, 4], [4, 5, 6], {4, 5, 6}, 6),  # target order decides
    ([], [1], {1}, None),
]


@pytest.mark.parametrize(("reassignment", "isr", "live", "expected"), REASSIGN_CASES)
def test_reassign_partition_leader_election(reassignment, isr, live, expected):
    assert reassign_partition_leader_election(reassignment, isr, live) == expected
    decision = elect_reassigned_partition_leader(reassignment, isr, live)
    if expected is None:
        assert decision is None
    else:
        assert decision == ElectionDecision(expected, list(isr), False)


# --- preferred replica ----------------------------------------------------------------------------

PREFERRED_CASES = [
    ([1, 2, 3], [1, 2, 3], {1, 2, 3}, 1),
    ([1, 2, 3], [2, 3, 1], {1, 2, 3}, 1),
    ([1, 2, 3], [2, 3], {1, 2, 3}, None),  # preferred not in ISR: no fallback to 2
    ([1, 2, 3], [1, 2, 3], {2, 3}, None),  # preferred dead: no fallback
    ([3, 1, 2], [1, 2, 3], {1, 2, 3}, 3),
    ([], [1], {1}, None),
    ([1], [], {1}, None),
]


@pytest.mark.parametrize(("assignment", "isr", "live", "expected"), PREFERRED_CASES)
def test_preferred_replica_partition_leader_election(assignment, isr, live, expected):
    assert preferred_replica_partition_leader_election(assignment, isr, live) == expected
    decision = elect_preferred_replica_leader(assignment, isr, live)
    if expected is None:
        assert decision is None
    else:
        assert decision == ElectionDecision(expected, list(isr), False)


# --- controlled shutdown --------------------------------------------------------------------------

SHUTDOWN_CASES = [
    # (AR, ISR, live, shutting down) -> (leader, new ISR) or None
    ([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1}, (2, [2, 3])),
    ([1, 2, 3], [1, 2, 3], {2, 3}, {1}, (2, [2, 3])),  # live without the shutting-down broker
    ([1, 2, 3], [3, 1, 2], {1, 2, 3}, {1, 2}, (3, [3])),
    ([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1, 2, 3}, None),  # everyone shutting down
    ([1, 2, 3], [1], {1, 2, 3}, {1}, None),  # the only ISR member is leaving
    (
        [1, 2, 3],
        [1, 2, 3],
        {1, 3},
        {1},
        (3, [2, 3]),
    ),  # 2 dead but the ISR is not filtered by liveness
    ([1, 2, 3], [1, 2, 3], {1, 2, 3}, set(), (1, [1, 2, 3])),
    ([1, 2, 3], [2, 3], {1, 2, 3}, {4}, (2, [2, 3])),  # an unrelated broker shutting down
    ([], [1], {1}, set(), None),
]


@pytest.mark.parametrize(("assignment", "isr", "live", "shutting_down", "expected"), SHUTDOWN_CASES)
def test_controlled_shutdown_partition_leader_election(
    assignment, isr, live, shutting_down, expected
):
    leader = controlled_shutdown_partition_leader_election(assignment, isr, live, shutting_down)
    decision = elect_controlled_shutdown_leader(assignment, isr, live, shutting_down)
    if expected is None:
        assert leader is None
        assert decision is None
    else:
        assert leader == expected[0]
        assert decision == ElectionDecision(expected[0], expected[1], False)


# --- new partition and ISR shrink -----------------------------------------------------------------

NEW_PARTITION_CASES = [
    ([1, 2, 3], {1, 2, 3}, (1, [1, 2, 3])),
    ([1, 2, 3], {2, 3}, (2, [2, 3])),
    ([3, 1, 2], {1, 2}, (1, [1, 2])),
    ([1, 2, 3], {4}, None),
    ([], {1}, None),
]


@pytest.mark.parametrize(("assignment", "live", "expected"), NEW_PARTITION_CASES)
def test_new_partition_leader_and_isr(assignment, live, expected):
    decision = new_partition_leader_and_isr(assignment, live)
    if expected is None:
        assert decision is None
    else:
        assert decision == ElectionDecision(expected[0], expected[1], False)


REMOVE_FROM_ISR_CASES = [
    # (leader, ISR, replica going offline) -> (leader, ISR)
    (1, [1, 2, 3], 2, (1, [1, 3])),  # a follower leaves
    (1, [1, 2, 3], 1, (NO_LEADER, [2, 3])),  # the leader leaves: no leader until an election
    (1, [1], 1, (NO_LEADER, [1])),  # the last ISR member stays in the ISR
    (2, [2], 3, (2, [2])),  # not in the ISR: nothing changes
    (NO_LEADER, [3], 3, (NO_LEADER, [3])),
    (2, [3, 2, 1], 3, (2, [2, 1])),
]


@pytest.mark.parametrize(("leader", "isr", "replica", "expected"), REMOVE_FROM_ISR_CASES)
def test_remove_replica_from_isr(leader, isr, replica, expected):
    assert remove_replica_from_isr(leader, isr, replica) == expected


def test_results_do_not_alias_inputs():
    isr = [1, 2]
    decision = elect_preferred_replica_leader([1, 2], isr, {1, 2})
    assert decision is not None
    decision.isr.append(9)
    assert isr == [1, 2]
    _, new_isr = remove_replica_from_isr(1, isr, 5)
    new_isr.append(9)
    assert isr == [1, 2]
