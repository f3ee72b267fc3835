"""The pure rules of partition reassignment (`reassignment_plan`), the reassignment JSON of the CLI,
and the controller context's bookkeeping of moving partitions.

A table of worked cases (Kafka's own examples among them), then properties over arbitrary replica
lists: ORS and TRS are always recoverable from RS, AR and RR (what makes a move survive a
controller failover), and a cancellation always gets the original replica set back.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from odradek.cli.reassign import parse_reassignment_json, reassignment_json
from odradek.controller.context import ControllerContext
from odradek.controller.reassignment_plan import (
    build_reassignment,
    is_being_reassigned,
    is_reassignment_complete,
    leader_needs_election,
    origin_replicas,
    reassign_to,
    replicas_to_stop,
    target_replicas,
    validate_new_replicas_live,
    validate_target_replicas,
)
from odradek.errors import InvalidReplicaAssignmentError, OperatorError
from odradek.zk.znodes import ReplicaAssignment

RA = ReplicaAssignment


@pytest.mark.parametrize(
    ("current", "target", "expected"),
    [
        # ORS [1,2] -> TRS [2,3]: RS = TRS then the ORS leftovers; AR = [3]; RR = [1]
        (RA((1, 2)), [2, 3], RA((2, 3, 1), (3,), (1,))),
        # Kafka's example: {1,2,3} -> {4,5,6}
        (RA((1, 2, 3)), [4, 5, 6], RA((4, 5, 6, 1, 2, 3), (4, 5, 6), (1, 2, 3))),
        # the same replicas in another order: nothing added or removed
        (RA((1, 2, 3)), [3, 2, 1], RA((3, 2, 1))),
        # shrinking the replication factor: nothing to add
        (RA((1, 2, 3)), [1, 2], RA((1, 2, 3), (), (3,))),
        # growing it: nothing to remove
        (RA((1, 2)), [1, 2, 3], RA((1, 2, 3), (3,), ())),
        # a move already under way is re-targeted from ORS ([1,2]), not from RS
        (RA((2, 3, 1), (3,), (1,)), [2, 4], RA((2, 4, 1), (4,), (1,))),
        # ... and re-targeting it to ORS is a cancellation (order: Kafka's, target first)
        (RA((2, 3, 1), (3,), (1,)), [1, 2], RA((1, 2))),
    ],
)
def test_reassign_to(current: RA, target: list[int], expected: RA) -> None:
    assert reassign_to(current, target) == expected
    # ORS comes back as a set: RS lists the target first, so the order before the move is lost
    assert set(origin_replicas(expected)) == set(origin_replicas(current))
    assert target_replicas(expected) == tuple(target)


def test_a_cancellation_reverts_to_the_original_replicas_and_needs_a_move_in_progress() -> None:
    moving = RA((2, 3, 1), (3,), (1,))
    assert build_reassignment(moving, None) == RA((2, 1))
    assert build_reassignment(RA((1, 2)), None) is None
    assert build_reassignment(RA((1, 2)), [3, 1]) == RA((3, 1, 2), (3,), (2,))


def test_replicas_a_superseding_move_no_longer_wants_are_stopped() -> None:
    # [1,2] moving to [2,3] (RS [2,3,1]) is re-targeted to [2,4]: 3 was being added, now unwanted
    assert replicas_to_stop((2, 3, 1), (2, 4, 1)) == [3]
    assert replicas_to_stop((2, 3, 1), (2, 1)) == [3]  # a cancellation
    assert replicas_to_stop((1, 2), (2, 3, 1)) == []


@pytest.mark.parametrize(
    ("assignment", "isr", "complete"),
    [
        (RA((2, 3, 1), (3,), (1,)), [1, 2], False),
        (RA((2, 3, 1), (3,), (1,)), [1, 2, 3], True),
        (RA((2, 3, 1), (3,), (1,)), [2, 3], True),  # ORS members need not be in the ISR
        (RA((1, 2, 3), (), (3,)), [1, 2], True),  # a pure shrink is complete at once
        (RA((1, 2)), [1], True),  # not moving: nothing to wait for
    ],
)
def test_a_move_completes_when_every_target_replica_is_in_the_isr(
    assignment: RA, isr: list[int], complete: bool
) -> None:
    assert is_reassignment_complete(assignment, isr) is complete


@pytest.mark.parametrize(
    ("target", "leader", "live", "elect"),
    [
        ([2, 3], 1, {1, 2, 3}, True),  # the leader leaves
        ([2, 3], 2, {1, 2, 3}, False),  # it stays: only its epoch is bumped
        ([2, 3], 2, {1, 3}, True),  # it stays in TRS but is dead
        ([2, 3], -1, {1, 2, 3}, True),  # no leader at all
    ],
)
def test_the_leader_moves_only_when_it_leaves_or_is_dead(
    target: list[int], leader: int, live: set[int], elect: bool
) -> None:
    assert leader_needs_election(target, leader, live) is elect


@pytest.mark.parametrize(
    ("target", "fragment"),
    [([], "empty"), ([1, 1], "duplicate"), ([1, -2], "invalid broker id")],
)
def test_malformed_targets_are_invalid_replica_assignments(
    target: list[int], fragment: str
) -> None:
    with pytest.raises(InvalidReplicaAssignmentError, match=fragment):
        validate_target_replicas(target)


def test_only_the_replicas_being_added_must_be_live() -> None:
    validate_new_replicas_live(RA((1, 2)), [2, 3], live={2, 3})  # 1 may be dead: it is leaving
    with pytest.raises(InvalidReplicaAssignmentError, match=r"not alive: \[4\]"):
        validate_new_replicas_live(RA((1, 2)), [2, 4], live={1, 2, 3})


replica_lists = st.lists(st.integers(0, 9), min_size=1, max_size=6, unique=True)


@given(replica_lists, replica_lists, replica_lists)
def test_any_chain_of_moves_keeps_origin_and_target_recoverable(
    original: list[int], first: list[int], second: list[int]
) -> None:
    moving = reassign_to(RA(tuple(original)), first)
    assert set(origin_replicas(moving)) == set(original)
    assert target_replicas(moving) == tuple(first)
    assert is_being_reassigned(moving) == (set(first) != set(original))
    assert set(moving.replicas) == set(original) | set(first)
    assert len(set(moving.replicas)) == len(moving.replicas)
    again = reassign_to(moving, second)
    assert set(origin_replicas(again)) == set(original)
    assert target_replicas(again) == tuple(second)
    cancelled = build_reassignment(again, None)
    if is_being_reassigned(again):
        assert cancelled is not None and not is_being_reassigned(cancelled)
        assert set(cancelled.replicas) == set(original)
    else:
        assert cancelled is None


def test_the_context_keeps_rs_and_the_moving_partitions_in_step() -> None:
    context = ControllerContext()
    context.update_partition_replica_assignment(("t", 0), (1, 2))
    assert context.full_replica_assignment(("t", 0)) == RA((1, 2))
    assert context.partitions_being_reassigned() == set()
    context.update_full_replica_assignment(("t", 0), RA((2, 3, 1), (3,), (1,)))
    assert context.partition_replica_assignment(("t", 0)) == (2, 3, 1)
    assert context.partitions_being_reassigned() == {("t", 0)}
    assert context.topic_being_reassigned("t") and not context.topic_being_reassigned("u")
    context.update_full_replica_assignment(("t", 0), RA((2, 3)))
    assert context.partitions_being_reassigned() == set()
    context.update_full_replica_assignment(("t", 0), RA((2, 3, 1), (3,), (1,)))
    context.remove_topic("t")
    assert context.partitions_being_reassigned() == set()


def test_the_cli_reads_and_writes_kafkas_reassignment_json() -> None:
    text = (
        '{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3],'
        '"log_dirs":["any","any"]},{"topic":"t","partition":1,"replicas":[3,1]}]}'
    )
    targets = parse_reassignment_json(text, "f.json")
    assert targets == {("t", 0): [2, 3], ("t", 1): [3, 1]}
    assert parse_reassignment_json(reassignment_json(targets), "rollback") == targets


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not valid JSON"),
        ('{"version":1}', '"partitions" list'),
        ('{"version":2,"partitions":[]}', "unsupported version"),
        ('{"partitions":[]}', "no partitions"),
        ('{"partitions":[{"partition":0,"replicas":[1]}]}', '"topic"'),
        ('{"partitions":[{"topic":"t","partition":-1,"replicas":[1]}]}', '"partition"'),
        ('{"partitions":[{"topic":"t","partition":0,"replicas":"1,2"}]}', '"replicas"'),
        ('{"partitions":[{"topic":"t","partition":0,"replicas":[1],"log_dirs":["/d"]}]}', "any"),
        (
            '{"partitions":[{"topic":"t","partition":0,"replicas":[1]},'
            '{"topic":"t","partition":0,"replicas":[2]}]}',
            "listed twice",
        ),
    ],
)
def test_malformed_reassignment_json_is_one_operator_error(text: str, fragment: str) -> None:
    with pytest.raises(OperatorError, match=fragment):
        parse_reassignment_json(text, "f.json")
