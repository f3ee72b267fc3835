"""The pure parts of preferred-replica / unclean elections and of the automatic leader rebalance
(`odradek.controller.elect_leaders`), of the ElectLeaders handler's answer
(`odradek.server.handlers_elect_leaders`) and of `odradek leader-election`
(`odradek.cli.leader_election`); the rebalance timer on a real event loop.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given
from kio.schema.errors import ErrorCode

from odradek.cli import leader_election as cli
from odradek.controller import events as ev
from odradek.controller.elect_leaders import (
    AutoRebalanceTimer,
    ElectionType,
    auto_rebalance_candidates,
    leader_imbalance,
    outcome_of,
    plan_election,
)
from odradek.controller.partition_state_machine import (
    NoEligibleLeaderError,
    StateChangeFailedError,
)
from odradek.errors import KafkaError, NotControllerError, OperatorError
from odradek.server.handlers_elect_leaders import requested_partitions, results_by_topic
from odradek.server.metadata_cache import MetadataCache, PartitionMetadata
from odradek.zk.errors import BadVersionError
from odradek.zk.znodes import LeaderIsrAndControllerEpoch

ASSIGNMENTS = {
    ("t", 0): (1, 2, 3),
    ("t", 1): (2, 3, 1),
    ("t", 2): (3, 1, 2),
    ("u", 0): (1, 2),
}


def _code(outcome: Any) -> ErrorCode:
    return outcome.code if isinstance(outcome, KafkaError) else ErrorCode.none


# --- plan_election --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("election_type", "leaders", "live", "deleting", "electable", "not_needed"),
    [
        # preferred: only partitions whose first replica does not lead
        (ElectionType.PREFERRED, {("t", 0): 2, ("t", 1): 2}, {1, 2, 3}, (), [("t", 0)], [("t", 1)]),
        # preferred: a leaderless partition needs an election too
        (ElectionType.PREFERRED, {("t", 0): -1, ("t", 1): 2}, {2, 3}, (), [("t", 0)], [("t", 1)]),
        # preferred: a partition without a state yet has no leader: electable
        (ElectionType.PREFERRED, {("t", 1): 2}, {1, 2, 3}, (), [("t", 0)], [("t", 1)]),
        # unclean: a live leader needs nothing, a dead or missing one does
        (ElectionType.UNCLEAN, {("t", 0): 2, ("t", 1): 2}, {1, 2, 3}, (), [], [("t", 0), ("t", 1)]),
        (ElectionType.UNCLEAN, {("t", 0): 1, ("t", 1): -1}, {2, 3}, (), [("t", 0), ("t", 1)], []),
        # a topic being deleted is answered as such, whatever its leaders
        (ElectionType.PREFERRED, {("t", 0): 2, ("t", 1): 3}, {1, 2, 3}, ("t",), [], []),
    ],
)
def test_plan_election_splits_the_request_as_kafka_does(
    election_type: ElectionType,
    leaders: dict[tuple[str, int], int],
    live: set[int],
    deleting: tuple[str, ...],
    electable: list[tuple[str, int]],
    not_needed: list[tuple[str, int]],
) -> None:
    requested = [("t", 1), ("t", 0), ("t", 0), ("nope", 0), ("t", 9)]
    plan = plan_election(requested, election_type, ASSIGNMENTS, leaders, live, deleting)
    assert plan.electable == electable
    assert plan.not_needed == not_needed
    assert plan.unknown == [("nope", 0), ("t", 9)]
    assert plan.being_deleted == ([("t", 0), ("t", 1)] if deleting else [])
    answered = plan.answered()
    assert {tp: _code(o) for tp, o in answered.items()} == {
        **{tp: ErrorCode.election_not_needed for tp in not_needed},
        **{tp: ErrorCode.invalid_topic_exception for tp in plan.being_deleted},
        ("nope", 0): ErrorCode.unknown_topic_or_partition,
        ("t", 9): ErrorCode.unknown_topic_or_partition,
    }


# --- imbalance and the rebalance candidates ------------------------------------------------------


def test_leader_imbalance_counts_preferred_partitions_and_the_misled_ones() -> None:
    leaders = {("t", 0): 2, ("t", 1): 2, ("t", 2): 3}  # ("u", 0) has no state yet
    imbalance = leader_imbalance(ASSIGNMENTS, leaders)
    assert sorted(imbalance) == [1, 2, 3]
    assert (imbalance[1].preferred, imbalance[1].not_led) == (2, (("t", 0),))
    assert imbalance[1].ratio == 0.5
    assert (imbalance[2].preferred, imbalance[2].not_led, imbalance[2].ratio) == (1, (), 0.0)
    assert imbalance[3].ratio == 0.0


def _leadership(leaders: dict[tuple[str, int], int], isr: tuple[int, ...] = (1, 2, 3)) -> Any:
    return {tp: (leader, isr) for tp, leader in leaders.items()}


@pytest.mark.parametrize(
    ("percentage", "live", "isr", "excluded", "expected"),
    [
        # broker 1 prefers t-0 and u-0, leads neither: 100 % > 10 %
        (10, {1, 2, 3}, (1, 2, 3), (), [("t", 0), ("u", 0)]),
        # the threshold is strict: 100 % is not above 100 %
        (100, {1, 2, 3}, (1, 2, 3), (), []),
        # the preferred replica is dead, or not in the ISR: no candidate
        (10, {2, 3}, (1, 2, 3), (), []),
        (10, {1, 2, 3}, (2, 3), (), []),
        # a partition being reassigned is left to the reassignment
        (10, {1, 2, 3}, (1, 2, 3), {("u", 0)}, [("t", 0)]),
    ],
)
def test_auto_rebalance_candidates(
    percentage: int,
    live: set[int],
    isr: tuple[int, ...],
    excluded: Any,
    expected: list[tuple[str, int]],
) -> None:
    leaders = {("t", 0): 2, ("t", 1): 2, ("t", 2): 3, ("u", 0): 2}
    candidates = auto_rebalance_candidates(
        ASSIGNMENTS, _leadership(leaders, isr), live, percentage, excluded
    )
    assert candidates == expected


def test_one_misled_partition_of_many_stays_below_the_threshold() -> None:
    """Ten partitions preferring broker 1, one led elsewhere: exactly 10 %, not above it."""
    assignments = {("t", p): (1, 2) for p in range(10)}
    leaders = {tp: 1 for tp in assignments} | {("t", 3): 2}
    leadership = _leadership(leaders, (1, 2))
    assert auto_rebalance_candidates(assignments, leadership, {1, 2}, 10) == []
    assert auto_rebalance_candidates(assignments, leadership, {1, 2}, 9) == [("t", 3)]


BROKERS = st.integers(1, 4)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Any, Any, set[int], int, set[Any]]:
    count = draw(st.integers(1, 12))
    assignments, leadership = {}, {}
    for p in range(count):
        replicas = tuple(draw(st.lists(BROKERS, min_size=1, max_size=3, unique=True)))
        assignments[("t", p)] = replicas
        if draw(st.booleans()):  # some partitions have no leader state yet
            leader = draw(st.sampled_from([-1, *replicas]))
            isr = draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True))
            leadership[("t", p)] = (leader, tuple(isr))
    live = draw(st.sets(BROKERS))
    percentage = draw(st.integers(0, 100))
    excluded = draw(st.sets(st.sampled_from(sorted(assignments))))
    return assignments, leadership, live, percentage, excluded


@given(clusters())
def test_candidates_are_exactly_the_movable_partitions_of_imbalanced_brokers(
    cluster: tuple[Any, Any, set[int], int, set[Any]],
) -> None:
    assignments, leadership, live, percentage, excluded = cluster
    candidates = auto_rebalance_candidates(assignments, leadership, live, percentage, excluded)
    assert candidates == sorted(set(candidates))
    for tp, replicas in assignments.items():
        preferred = replicas[0]
        mine = [q for q, r in assignments.items() if r[0] == preferred]
        misled = [q for q in mine if q in leadership and leadership[q][0] != preferred]
        imbalanced = len(misled) / len(mine) > percentage / 100
        movable = (
            tp in misled
            and tp not in excluded
            and preferred in live
            and preferred in leadership[tp][1]
        )
        assert (tp in candidates) == (imbalanced and movable), tp


# --- outcomes --------------------------------------------------------------------------------------


def test_outcome_of_maps_results_to_kafka_answers() -> None:
    state = LeaderIsrAndControllerEpoch(3, 7, (3, 1), 2, 9)
    assert outcome_of(state, ElectionType.PREFERRED) == 3
    refused = NoEligibleLeaderError("no eligible leader")
    assert _code(outcome_of(refused, ElectionType.PREFERRED)) == (
        ErrorCode.preferred_leader_not_available
    )
    assert _code(outcome_of(refused, ElectionType.UNCLEAN)) == (
        ErrorCode.eligible_leaders_not_available
    )
    invalid = StateChangeFailedError("invalid transition")
    assert _code(outcome_of(invalid, ElectionType.UNCLEAN)) == (
        ErrorCode.eligible_leaders_not_available
    )
    assert _code(outcome_of(NotControllerError("moved"), ElectionType.PREFERRED)) == (
        ErrorCode.not_controller
    )
    assert _code(outcome_of(BadVersionError("busy"), ElectionType.PREFERRED)) == (
        ErrorCode.unknown_server_error
    )


# --- the handler's answer ---------------------------------------------------------------------------


def test_results_by_topic_groups_and_sorts_and_drops_not_needed_for_all() -> None:
    outcomes: dict[tuple[str, int], Any] = {
        ("b", 1): 2,
        ("a", 0): KafkaError("no", ErrorCode.preferred_leader_not_available),
        ("b", 0): KafkaError("fine", ErrorCode.election_not_needed),
    }
    named = results_by_topic(outcomes, all_partitions=False)
    assert [r["topic"] for r in named] == ["a", "b"]
    assert [(p["partition_id"], p["error_code"]) for p in named[1]["partition_result"]] == [
        (0, ErrorCode.election_not_needed),
        (1, ErrorCode.none),
    ]
    assert named[1]["partition_result"][1]["error_message"] is None
    assert named[0]["partition_result"][0]["error_message"] == "no"
    everything = results_by_topic(outcomes, all_partitions=True)
    assert [
        (r["topic"], [p["partition_id"] for p in r["partition_result"]]) for r in everything
    ] == [
        ("a", [0]),
        ("b", [1]),
    ]


def test_requested_partitions_null_means_every_partition_in_the_metadata() -> None:
    cache = MetadataCache(broker_id=1)
    cache.update(
        1,
        1,
        [],
        [PartitionMetadata("x", p, 1, 0, (1,), (1,)) for p in range(2)]
        + [PartitionMetadata("y", 0, 1, 0, (1,), (1,))],
    )
    everything = SimpleNamespace(topic_partitions=None)
    assert requested_partitions(everything, cache) == ([("x", 0), ("x", 1), ("y", 0)], True)
    named = SimpleNamespace(
        topic_partitions=[
            SimpleNamespace(topic="y", partitions=(3, 3)),
            SimpleNamespace(topic="x", partitions=(1,)),
        ]
    )
    assert requested_partitions(named, cache) == ([("x", 1), ("y", 3)], False)


# --- the command line -------------------------------------------------------------------------------


def _args(**overrides: Any) -> argparse.Namespace:
    values = {
        "bootstrap_server": "127.0.0.1:9092",
        "election_type": "preferred",
        "topic": None,
        "partition": None,
        "all_topic_partitions": False,
        "path_to_json_file": None,
        "timeout": 30.0,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_cli_validate_accepts_the_three_ways_of_naming_partitions(tmp_path: Path) -> None:
    one = cli.validate(_args(topic="t", partition=2, election_type="UNCLEAN"))
    assert (one.election_type, one.partitions) == ("unclean", [("t", 2)])
    assert cli.validate(_args(all_topic_partitions=True)).partitions is None
    path = tmp_path / "election.json"
    path.write_text(
        '{"partitions": [{"topic": "a", "partition": 1}, {"topic": "b", "partition": 0}]}'
    )
    assert cli.validate(_args(path_to_json_file=str(path))).partitions == [("a", 1), ("b", 0)]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"election_type": "fastest", "topic": "t", "partition": 0}, "--election-type"),
        ({}, "exactly one of"),
        ({"topic": "t", "partition": 0, "all_topic_partitions": True}, "exactly one of"),
        ({"topic": "t"}, "--topic and --partition"),
        ({"partition": 0, "all_topic_partitions": True}, "--topic and --partition"),
        ({"topic": "t", "partition": -1}, "negative"),
        ({"path_to_json_file": "/nonexistent/election.json"}, "cannot read"),
        ({"all_topic_partitions": True, "bootstrap_server": "nohost"}, "HOST:PORT"),
    ],
)
def test_cli_validate_names_the_mistake(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(OperatorError, match=message):
        cli.validate(_args(**overrides))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ('{"version": 1}', '"partitions" list'),
        ('[{"topic": "t", "partition": 0}]', '"partitions" list'),
        ('{"partitions": [{"topic": "t"}]}', "every partition must be"),
        ('{"partitions": [{"topic": "t", "partition": "0"}]}', "every partition must be"),
        ('{"partitions": [{"topic": "", "partition": 0}]}', "every partition must be"),
        ('{"partitions": [{"topic": "t", "partition": true}]}', "every partition must be"),
        ('{"partitions": []}', "no partitions"),
        (
            '{"partitions": [{"topic": "t", "partition": 0}, {"topic": "t", "partition": 0}]}',
            "more than once: t-0",
        ),
    ],
)
def test_cli_json_file_mistakes(text: str, message: str) -> None:
    with pytest.raises(OperatorError, match=message):
        cli.parse_partitions_json(text, "f.json")


def test_cli_prints_kafkas_summary() -> None:
    def result(partition: int, code: ErrorCode, message: str | None = None) -> Any:
        return SimpleNamespace(partition_id=partition, error_code=code, error_message=message)

    response = SimpleNamespace(
        replica_election_results=[
            SimpleNamespace(
                topic="t",
                partition_result=[
                    result(2, ErrorCode.none),
                    result(0, ErrorCode.none),
                    result(1, ErrorCode.election_not_needed),
                    result(3, ErrorCode.preferred_leader_not_available, "not in\nthe ISR"),
                ],
            )
        ]
    )
    summary = cli.summarize(response)
    assert cli.summary_lines(summary, "preferred") == [
        "Successfully completed leader election (PREFERRED) for partitions t-0, t-2",
        "Valid replica already elected for partitions t-1",
        "Error completing leader election (PREFERRED) for partition: t-3: "
        "PREFERRED_LEADER_NOT_AVAILABLE: not in the ISR",
    ]


# --- the timer ------------------------------------------------------------------------------------


def test_rebalance_timer_enqueues_one_event_of_its_term_and_cancel_stops_it() -> None:
    async def scenario() -> list[Any]:
        fired: list[Any] = []
        done = asyncio.Event()

        def enqueue(event: Any) -> None:
            fired.append(event)
            done.set()

        timer = AutoRebalanceTimer(enqueue)
        timer.schedule(0.01, generation=1)
        timer.cancel()
        assert not timer.scheduled
        timer.schedule(0.02, generation=2)
        timer.schedule(0.03, generation=3)  # replaces the pending one
        async with asyncio.timeout(10):
            await done.wait()
        assert not timer.scheduled
        return fired

    fired = asyncio.run(scenario())
    assert fired == [ev.AutoPreferredReplicaLeaderElection(generation=3)]
