"""The group coordinator's state machine, driven by a fake clock: no sockets, no ZooKeeper.

Each test plays clients against `GroupCoordinator` the way Kafka's consumers do (JoinGroup with
MEMBER_ID_REQUIRED first, SyncGroup, heartbeats) and moves time only through `Clock.advance` and
`expire_timers()`, so session and rebalance timeouts are exact and instantaneous. The store is a
real `GroupMetadataManager` over an in-memory offsets log whose appends answer at once; which
broker leads the group's partition is the harness's `owner`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from odradek.coordinator.group.coordinator import (
    NEW_MEMBER_JOIN_TIMEOUT_MS,
    GroupConfig,
    GroupCoordinator,
    GroupMetadata,
    GroupState,
    JoinRequest,
    JoinResult,
    LeavingMember,
    SyncResult,
)
from odradek.coordinator.group.metadata_manager import GroupMetadataManager, OffsetConfig
from odradek.coordinator.group.offsets import OffsetAndMetadata
from odradek.errors import GroupStateError
from tests.fakes.offsets_log import FakeOffsetsLog

GROUP = "group-a"
SESSION_MS = 10_000
REBALANCE_MS = 30_000
BROKER_ID = 1


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Answers:
    """The answers one request got (a parked request has none until it is answered)."""

    results: list[Any] = field(default_factory=list)

    def __call__(self, result: Any) -> None:
        self.results.append(result)

    @property
    def answered(self) -> bool:
        return bool(self.results)

    @property
    def result(self) -> Any:
        assert len(self.results) == 1, f"expected one answer, got {self.results}"
        return self.results[0]


class OwnedManager(GroupMetadataManager):
    """The store, with partition ownership decided by the harness rather than LeaderAndIsr."""

    owner: Any = BROKER_ID

    def status(self, group_id: str) -> ErrorCode | None:
        if self.owner is None:
            return ErrorCode.coordinator_load_in_progress
        return None if self.owner == BROKER_ID else ErrorCode.not_coordinator


class Harness:
    """A coordinator, its clock, its store, and client-side helpers."""

    def __init__(self, initial_delay_ms: int = 0, max_size: int = 2**31 - 1) -> None:
        self.clock = Clock()
        self.log = FakeOffsetsLog()
        self.manager = OwnedManager(OffsetConfig(), self.log, clock_ms=self.clock)
        self.coordinator = GroupCoordinator(
            BROKER_ID,
            GroupConfig(
                min_session_timeout_ms=1000,
                max_session_timeout_ms=60_000,
                initial_rebalance_delay_ms=initial_delay_ms,
                max_size=max_size,
            ),
            self.manager,
            clock_ms=self.clock,
        )
        self.coordinator.active = True

    @property
    def owner(self) -> Any:
        return self.manager.owner

    @owner.setter
    def owner(self, value: Any) -> None:
        self.manager.owner = value

    def commit(self, group_id: str, member_id: str, generation: int, offset: int = 5) -> ErrorCode:
        results = self.coordinator.commit_offsets(
            group_id, member_id, None, generation, {("t", 0): OffsetAndMetadata(offset)}
        )
        assert isinstance(results, dict)
        return results[("t", 0)]

    def advance(self, ms: int) -> None:
        self.clock.now += ms
        self.coordinator.expire_timers()

    def group(self, group_id: str = GROUP) -> GroupMetadata:
        return self.coordinator.groups[group_id]

    def join(
        self,
        member_id: str = "",
        *,
        group_id: str = GROUP,
        protocols: tuple[tuple[str, bytes], ...] = (("range", b"meta"),),
        protocol_type: str = "consumer",
        session_ms: int = SESSION_MS,
        rebalance_ms: int = REBALANCE_MS,
        instance_id: str | None = None,
        require_known_member_id: bool = True,
        skip_assignment: bool = False,
    ) -> Answers:
        answers = Answers()
        self.coordinator.join_group(
            JoinRequest(
                group_id=group_id,
                member_id=member_id,
                group_instance_id=instance_id,
                protocol_type=protocol_type,
                protocols=protocols,
                session_timeout_ms=session_ms,
                rebalance_timeout_ms=rebalance_ms,
                require_known_member_id=require_known_member_id and instance_id is None,
                supports_skip_assignment=skip_assignment,
                client_id="client",
                client_host="/127.0.0.1",
            ),
            answers,
        )
        # A join with no member id may create timers due now (an initial delay of 0).
        self.coordinator.expire_timers()
        return answers

    def new_member(self, metadata: bytes = b"meta", **kwargs: Any) -> tuple[str, Answers]:
        """KIP-394: a first JoinGroup gets MEMBER_ID_REQUIRED and an id; join again with it."""
        first = self.join(protocols=(("range", metadata),), **kwargs)
        assert first.result.error is ErrorCode.member_id_required
        member_id = first.result.member_id
        assert member_id.startswith("client-")
        return member_id, self.join(member_id, protocols=(("range", metadata),), **kwargs)

    def sync(
        self,
        member_id: str,
        generation_id: int,
        assignments: dict[str, bytes] | None = None,
        *,
        instance_id: str | None = None,
    ) -> Answers:
        answers = Answers()
        self.coordinator.sync_group(
            GROUP,
            generation_id,
            member_id,
            instance_id,
            "consumer",
            "range",
            assignments or {},
            answers,
        )
        return answers

    def heartbeat(
        self, member_id: str, generation_id: int, instance_id: str | None = None
    ) -> ErrorCode:
        return self.coordinator.heartbeat(GROUP, member_id, instance_id, generation_id)

    def stable_group_of_two(self) -> tuple[str, str, int]:
        """Members A (leader) and B in a Stable group; returns (a, b, generation)."""
        a, a_join = self.new_member(b"A")
        assert a_join.result.error is ErrorCode.none
        b, b_join = self.new_member(b"B")
        assert not b_join.answered  # parked: A must rejoin first
        assert self.heartbeat(a, a_join.result.generation_id) is ErrorCode.rebalance_in_progress
        a_rejoin = self.join(a, protocols=(("range", b"A"),))
        generation = a_rejoin.result.generation_id
        assert b_join.result.generation_id == generation
        b_sync = self.sync(b, generation)
        self.sync(a, generation, {a: b"assign-A", b: b"assign-B"})
        assert b_sync.result.assignment == b"assign-B"
        assert self.group().state is GroupState.STABLE
        return a, b, generation


# ---------------------------------------------------------------------------------------------
# Placement


def test_a_broker_that_does_not_coordinate_the_group_answers_not_coordinator() -> None:
    h = Harness()
    h.owner = 2
    assert h.join().result.error is ErrorCode.not_coordinator
    assert h.heartbeat("m", 1) is ErrorCode.not_coordinator
    h.owner = None
    assert h.join().result.error is ErrorCode.coordinator_load_in_progress
    assert GROUP not in h.coordinator.groups


# ---------------------------------------------------------------------------------------------
# Join barrier, sync, heartbeat


def test_first_member_gets_an_id_then_leads_generation_one() -> None:
    h = Harness()
    member, joined = h.new_member()
    result: JoinResult = joined.result
    assert result.error is ErrorCode.none
    assert (result.generation_id, result.leader_id, result.member_id) == (1, member, member)
    assert result.protocol_name == "range"
    assert [m.member_id for m in result.members] == [member]
    assert result.members[0].metadata == b"meta"
    assert h.group().state is GroupState.COMPLETING_REBALANCE


def test_join_barrier_waits_for_every_known_member_and_only_the_leader_gets_members() -> None:
    h = Harness()
    a, _a_join = h.new_member(b"A")
    h.sync(a, 1, {a: b"x"})
    b, b_join = h.new_member(b"B")
    assert not b_join.answered
    assert h.group().state is GroupState.PREPARING_REBALANCE
    a_rejoin = h.join(a, protocols=(("range", b"A"),))
    assert a_rejoin.result.generation_id == b_join.result.generation_id == 2
    assert a_rejoin.result.leader_id == b_join.result.leader_id == a
    assert {m.member_id: m.metadata for m in a_rejoin.result.members} == {a: b"A", b: b"B"}
    assert b_join.result.members == ()


def test_followers_sync_waits_for_the_leaders_assignment() -> None:
    h = Harness()
    _a, b, generation = h.stable_group_of_two()
    # In a Stable group SyncGroup answers at once with the member's assignment.
    again = h.sync(b, generation)
    assert again.result == SyncResult(ErrorCode.none, "consumer", "range", b"assign-B")
    # A sync for the wrong generation, or from a stranger, is refused.
    assert h.sync(b, generation - 1).result.error is ErrorCode.illegal_generation
    assert h.sync("stranger", generation).result.error is ErrorCode.unknown_member_id


def test_leader_omitting_a_member_gives_it_an_empty_assignment() -> None:
    h = Harness()
    a, _ = h.new_member(b"A")
    h.sync(a, 1, {a: b"x"})
    b, _b_join = h.new_member(b"B")
    h.join(a, protocols=(("range", b"A"),))
    b_sync = h.sync(b, 2)
    assert not b_sync.answered
    h.sync(a, 2, {a: b"only-a"})
    assert b_sync.result.error is ErrorCode.none and b_sync.result.assignment == b""


def test_heartbeat_answers() -> None:
    h = Harness()
    a, _b, generation = h.stable_group_of_two()
    assert h.heartbeat(a, generation) is ErrorCode.none
    assert h.heartbeat(a, generation - 1) is ErrorCode.illegal_generation
    assert h.heartbeat("stranger", generation) is ErrorCode.unknown_member_id
    assert (
        h.coordinator.heartbeat("other-group", a, None, generation) is ErrorCode.unknown_member_id
    )
    assert h.coordinator.heartbeat("", a, None, generation) is ErrorCode.invalid_group_id


def test_a_member_rejoining_with_new_metadata_starts_a_rebalance() -> None:
    h = Harness()
    a, b, generation = h.stable_group_of_two()
    follower_same = h.join(b, protocols=(("range", b"B"),))
    # A follower with unchanged metadata just gets the current generation back.
    assert follower_same.result.generation_id == generation
    assert h.group().state is GroupState.STABLE
    follower_changed = h.join(b, protocols=(("range", b"B2"),))
    assert not follower_changed.answered
    assert h.group().state is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, generation) is ErrorCode.rebalance_in_progress


def test_protocol_selection_and_inconsistent_protocols() -> None:
    h = Harness()
    a, _ = h.new_member()
    h.sync(a, 1, {a: b""})
    other_type = h.join(protocol_type="connect", protocols=(("range", b""),))
    assert other_type.result.error is ErrorCode.inconsistent_group_protocol
    no_common = h.join(protocols=(("roundrobin", b""),))
    assert no_common.result.error is ErrorCode.inconsistent_group_protocol
    # Both prefer roundrobin, both support range: the vote picks roundrobin only when every
    # member supports it.
    h2 = Harness()
    first = h2.join(
        require_known_member_id=False, protocols=(("roundrobin", b"1"), ("range", b"1"))
    )
    assert first.result.protocol_name == "roundrobin"
    assert h2.join(require_known_member_id=False, protocols=()).result.error is (
        ErrorCode.inconsistent_group_protocol
    )


def test_session_timeout_bounds() -> None:
    h = Harness()
    assert h.join(session_ms=999).result.error is ErrorCode.invalid_session_timeout
    assert h.join(session_ms=60_001).result.error is ErrorCode.invalid_session_timeout
    assert GROUP not in h.coordinator.groups


# ---------------------------------------------------------------------------------------------
# Timeouts


def test_session_expiry_removes_a_silent_member_and_rebalances_the_rest() -> None:
    h = Harness()
    a, b, generation = h.stable_group_of_two()
    for _ in range(4):
        h.advance(SESSION_MS // 2)
        assert h.heartbeat(a, generation) is ErrorCode.none or h.group().members.get(b) is None
    # B never heartbeated: it was removed after its session timeout, and A is told to rejoin.
    assert b not in h.group().members
    assert h.heartbeat(a, generation) is ErrorCode.rebalance_in_progress
    rejoin = h.join(a, protocols=(("range", b"A"),))
    assert rejoin.result.generation_id == generation + 1
    assert [m.member_id for m in rejoin.result.members] == [a]


def test_session_expiry_of_the_last_member_empties_the_group() -> None:
    h = Harness()
    a, _joined = h.new_member()
    h.sync(a, 1, {a: b""})
    h.advance(SESSION_MS - 1)
    assert a in h.group().members
    h.advance(1)
    assert h.group().state is GroupState.EMPTY
    assert h.group().generation_id == 2
    assert h.heartbeat(a, 1) is ErrorCode.unknown_member_id


def test_rebalance_timeout_drops_members_that_did_not_rejoin() -> None:
    h = Harness()
    a, b, generation = h.stable_group_of_two()
    c, c_join = h.new_member(b"C")
    a_rejoin = h.join(a, protocols=(("range", b"A"),))
    # B keeps heartbeating (REBALANCE_IN_PROGRESS) but never rejoins.
    for _ in range(REBALANCE_MS // 5000 - 1):
        h.advance(5000)
        assert h.heartbeat(b, generation) is ErrorCode.rebalance_in_progress
    assert not a_rejoin.answered and not c_join.answered
    h.advance(5000)
    assert a_rejoin.result.generation_id == c_join.result.generation_id == generation + 1
    assert set(h.group().members) == {a, c}
    assert h.heartbeat(b, generation) is ErrorCode.unknown_member_id


def test_leader_that_does_not_rejoin_is_replaced() -> None:
    h = Harness()
    a, b, _generation = h.stable_group_of_two()
    h.advance(1000)
    h.join(b, protocols=(("range", b"B-new"),))  # B forces a rebalance; A stays away
    b_again = h.group().members[b]
    assert b_again.awaiting_join
    h.advance(REBALANCE_MS)
    assert h.group().leader_id == b
    assert a not in h.group().members


def test_sync_deadline_removes_members_that_never_sync() -> None:
    h = Harness()
    a, b, _ = h.stable_group_of_two()
    h.join(a, protocols=(("range", b"A"),))
    b_rejoin = h.join(b, protocols=(("range", b"B"),))
    generation = b_rejoin.result.generation_id
    h.sync(a, generation, {a: b"a"})  # the leader syncs; B heartbeats but never syncs
    assert h.group().state is GroupState.STABLE
    for _ in range(REBALANCE_MS // 5000 - 1):
        h.advance(5000)
        assert h.heartbeat(a, generation) is ErrorCode.none
        assert h.heartbeat(b, generation) is ErrorCode.none
    h.advance(5000)
    # The sync deadline (the rebalance timeout) passed: B is out, and A must rejoin.
    assert b not in h.group().members
    assert h.group().state is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, generation) is ErrorCode.rebalance_in_progress


def test_pending_member_that_never_rejoins_expires() -> None:
    h = Harness()
    _a, _b, _generation = h.stable_group_of_two()
    first = h.join()
    assert first.result.error is ErrorCode.member_id_required
    pending = first.result.member_id
    assert pending in h.group().pending_members
    h.advance(SESSION_MS)
    assert pending not in h.group().pending_members
    assert h.join(pending).result.error is ErrorCode.unknown_member_id


def test_new_member_parked_in_join_is_dropped_after_the_new_member_timeout() -> None:
    h = Harness()
    a, b, generation = h.stable_group_of_two()
    c, c_join = h.new_member(b"C", rebalance_ms=10 * 60_000)
    # A and B keep their sessions alive but never rejoin; C waits in JoinGroup.
    elapsed = 0
    while not c_join.answered:
        h.advance(5000)
        elapsed += 5000
        h.heartbeat(a, generation)
        h.heartbeat(b, generation)
    assert elapsed == NEW_MEMBER_JOIN_TIMEOUT_MS
    assert c_join.result.error is ErrorCode.unknown_member_id
    assert c not in h.group().members


def test_initial_rebalance_delay_waits_for_more_members() -> None:
    h = Harness(initial_delay_ms=3000)
    _a, a_join = h.new_member(b"A")
    assert not a_join.answered
    h.advance(1000)
    _b, b_join = h.new_member(b"B")
    h.advance(2000)  # t=3000: a member arrived during the delay, so wait another 3000 ms
    assert not a_join.answered and not b_join.answered
    h.advance(2999)
    assert not a_join.answered
    h.advance(1)
    assert a_join.result.generation_id == b_join.result.generation_id == 1
    assert len(a_join.result.members) == 2


# ---------------------------------------------------------------------------------------------
# Leaving


def test_leave_group() -> None:
    h = Harness()
    a, b, generation = h.stable_group_of_two()
    error, member_errors = h.coordinator.leave_group(
        GROUP, [LeavingMember(b), LeavingMember("stranger")]
    )
    assert error is ErrorCode.none
    assert member_errors == [ErrorCode.none, ErrorCode.unknown_member_id]
    assert h.heartbeat(a, generation) is ErrorCode.rebalance_in_progress
    rejoin = h.join(a, protocols=(("range", b"A"),))
    assert rejoin.result.generation_id == generation + 1
    h.sync(a, generation + 1, {a: b""})
    assert h.coordinator.leave_group(GROUP, [LeavingMember(a)]) == (
        ErrorCode.none,
        [ErrorCode.none],
    )
    assert h.group().state is GroupState.EMPTY
    assert h.coordinator.leave_group("nobody", [LeavingMember(a)]) == (
        ErrorCode.none,
        [ErrorCode.unknown_member_id],
    )


def test_leaving_while_others_wait_in_join_completes_the_barrier() -> None:
    h = Harness()
    a, b, generation = h.stable_group_of_two()
    a_rejoin = h.join(a, protocols=(("range", b"A"),))
    assert not a_rejoin.answered
    h.coordinator.leave_group(GROUP, [LeavingMember(b)])
    assert a_rejoin.result.generation_id == generation + 1


# ---------------------------------------------------------------------------------------------
# Static membership (KIP-345)


def test_static_member_restart_keeps_its_assignment_without_a_rebalance() -> None:
    h = Harness()
    first = h.join(instance_id="instance-1", protocols=(("range", b"S"),))
    old_id = first.result.member_id
    assert old_id.startswith("instance-1-")
    h.sync(old_id, 1, {old_id: b"assigned"}, instance_id="instance-1")
    assert h.group().state is GroupState.STABLE
    # The process restarts: same instance id, no member id.
    restarted = h.join(instance_id="instance-1", protocols=(("range", b"S"),))
    new_id = restarted.result.member_id
    assert new_id != old_id
    assert restarted.result.generation_id == 1  # no new generation
    assert h.group().state is GroupState.STABLE
    sync = h.sync(new_id, 1, instance_id="instance-1")
    assert sync.result.assignment == b"assigned"
    # The old incarnation is fenced.
    assert h.heartbeat(old_id, 1, "instance-1") is ErrorCode.fenced_instance_id
    assert h.heartbeat(new_id, 1, "instance-1") is ErrorCode.none


def test_static_leader_rejoining_with_skip_assignment_is_told_it_leads() -> None:
    h = Harness()
    first = h.join(instance_id="i", protocols=(("range", b"S"),))
    h.sync(first.result.member_id, 1, {first.result.member_id: b"a"}, instance_id="i")
    again = h.join(instance_id="i", protocols=(("range", b"S"),), skip_assignment=True)
    assert again.result.skip_assignment is True
    assert again.result.leader_id == again.result.member_id
    old_style = h.join(instance_id="i", protocols=(("range", b"S"),))
    # Before v9 the old leader id comes back, so the member does not assign.
    assert old_style.result.leader_id == again.result.member_id != old_style.result.member_id


def test_static_member_is_removed_by_instance_id_or_by_its_session() -> None:
    h = Harness()
    first = h.join(instance_id="i", protocols=(("range", b"S"),))
    member = first.result.member_id
    h.sync(member, 1, {member: b""}, instance_id="i")
    assert h.coordinator.leave_group(GROUP, [LeavingMember("", "i")]) == (
        ErrorCode.none,
        [ErrorCode.none],
    )
    assert h.group().state is GroupState.EMPTY
    again = h.join(instance_id="i", protocols=(("range", b"S"),))
    h.sync(again.result.member_id, 2, {again.result.member_id: b""}, instance_id="i")
    h.advance(SESSION_MS)
    assert h.group().state is GroupState.EMPTY


# ---------------------------------------------------------------------------------------------
# Offset commits, groups moving, admin


def test_offset_commit_validation_follows_kafka() -> None:
    h = Harness()
    # A group this coordinator does not know: a simple consumer may commit (the group appears,
    # Empty, with its offsets), a member of an unknown generation may not.
    assert h.commit("simple-group", "", -1) is ErrorCode.none
    assert h.coordinator.groups["simple-group"].state is GroupState.EMPTY
    assert h.commit("unknown-group", "m", 3) is ErrorCode.illegal_generation
    assert "unknown-group" not in h.coordinator.groups
    a, b, generation = h.stable_group_of_two()
    assert h.commit(GROUP, a, generation) is ErrorCode.none
    assert h.commit(GROUP, a, generation - 1) is ErrorCode.illegal_generation
    assert h.commit(GROUP, "stranger", generation) is ErrorCode.unknown_member_id
    assert h.commit(GROUP, "", -1) is ErrorCode.unknown_member_id
    # Between JoinGroup and SyncGroup the member must finish the rebalance first.
    h.join(a, protocols=(("range", b"A"),))
    assert h.commit(GROUP, a, generation) is ErrorCode.none  # PreparingRebalance: allowed
    h.join(b, protocols=(("range", b"B"),))
    assert h.commit(GROUP, a, generation + 1) is ErrorCode.rebalance_in_progress
    h.owner = 2
    assert h.commit(GROUP, a, generation + 1) is ErrorCode.not_coordinator


def test_a_valid_commit_counts_as_a_heartbeat() -> None:
    h = Harness()
    a, b, generation = h.stable_group_of_two()
    for _ in range(3):
        h.advance(SESSION_MS // 2)
        h.heartbeat(a, generation)
        assert h.commit(GROUP, b, generation) is ErrorCode.none
    assert set(h.group().members) == {a, b}


def test_losing_the_partition_answers_parked_requests_not_coordinator() -> None:
    h = Harness()
    a, _b, generation = h.stable_group_of_two()
    parked = h.join(a, protocols=(("range", b"A"),))
    h.owner = 2
    h.manager.on_resigned(h.manager.partition_of(GROUP))
    assert parked.result.error is ErrorCode.not_coordinator
    assert GROUP not in h.coordinator.groups
    h.advance(REBALANCE_MS + SESSION_MS)  # the unloaded group's timers do nothing
    assert h.coordinator.next_deadline_ms() is None
    # Back here later, without a load: the members start over.
    h.owner = BROKER_ID
    assert h.heartbeat(a, generation) is ErrorCode.unknown_member_id


def test_describe_list_and_delete_groups() -> None:
    h = Harness()
    a, b, _generation = h.stable_group_of_two()
    error, summary = h.coordinator.describe_group(GROUP)
    assert error is ErrorCode.none
    assert (summary.state, summary.protocol_type, summary.protocol) == (
        "Stable",
        "consumer",
        "range",
    )
    assert {m.member_id: m.assignment for m in summary.members} == {a: b"assign-A", b: b"assign-B"}
    listed = h.coordinator.list_groups()
    assert (listed[0], [(g.group_id, g.state) for g in listed[1]]) == (
        ErrorCode.none,
        [(GROUP, "Stable")],
    )
    assert h.coordinator.list_groups(["empty"]) == (ErrorCode.none, [])
    assert h.coordinator.describe_group("other")[1].state == "Dead"
    assert h.coordinator.delete_groups([GROUP, "other"]) == {
        GROUP: ErrorCode.non_empty_group,
        "other": ErrorCode.group_id_not_found,
    }
    h.coordinator.leave_group(GROUP, [LeavingMember(a), LeavingMember(b)])
    assert h.group().state is GroupState.EMPTY
    assert h.coordinator.delete_groups([GROUP]) == {GROUP: ErrorCode.none}
    assert GROUP not in h.coordinator.groups


def test_group_max_size() -> None:
    h = Harness(max_size=1)
    a, _ = h.new_member()
    h.sync(a, 1, {a: b""})
    refused = h.join()
    assert refused.result.error is ErrorCode.group_max_size_reached


def test_invalid_transitions_raise() -> None:
    group = GroupMetadata("g")
    with pytest.raises(GroupStateError):
        group.transition_to(GroupState.STABLE, 0)
    group.transition_to(GroupState.PREPARING_REBALANCE, 0)
    with pytest.raises(GroupStateError):
        group.transition_to(GroupState.STABLE, 0)
    group.transition_to(GroupState.DEAD, 0)
    assert group.state is GroupState.DEAD


def test_shutdown_answers_parked_joins() -> None:
    import asyncio

    h = Harness()
    a, _b, _generation = h.stable_group_of_two()
    parked = h.join(a, protocols=(("range", b"A"),))
    asyncio.run(h.coordinator.shutdown())
    assert parked.result.error is ErrorCode.not_coordinator
    assert h.join().result.error is ErrorCode.coordinator_not_available
