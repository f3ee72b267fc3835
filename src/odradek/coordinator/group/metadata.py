"""The group coordinator's data: group states, members, groups, timers, requests and results.

`GroupMetadata` holds one group's membership and its committed offsets (`offsets.GroupOffsets`),
and refuses a state change that `VALID_PREVIOUS_STATES` does not allow; `GroupCoordinator` (in
`coordinator`, whose module docstring lists the states and what moves a group between them)
decides when changes happen. A group that only ever committed offsets (no member ever joined) is
an Empty group without a protocol type, as in Kafka. `GroupStore` is how the membership half
asks for a group's metadata to be persisted (the metadata manager appends it to the offsets
topic). Nothing here does I/O or reads a clock: times come in as milliseconds, and a `TimerQueue`
only orders deadlines, leaving it to its owner to run the due ones.

Concurrency: like the coordinator that owns it, everything here is used only on the broker's event
loop thread (or a test's thread); callbacks stored on members are invoked synchronously and must
not block.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.offsets import GroupOffsets
from odradek.errors import GroupStateError

log = logging.getLogger(__name__)

UNKNOWN_MEMBER_ID = ""
NO_GENERATION = -1
CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# Each state with the states it may be entered from (the table in `coordinator`).
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.EMPTY, GroupState.COMPLETING_REBALANCE, GroupState.STABLE}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}


@dataclass(frozen=True, slots=True)
class GroupConfig:
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3000
    max_size: int = 2**31 - 1

    @classmethod
    def from_broker_config(cls, config: Any) -> GroupConfig:
        return cls(
            min_session_timeout_ms=config["group.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.max.session.timeout.ms"],
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            max_size=config["group.max.size"],
        )


# Requests and results


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    require_known_member_id: bool = True  # JoinGroup v4+ of a dynamic member (KIP-394)
    supports_skip_assignment: bool = False  # JoinGroup v9+
    client_id: str = ""
    client_host: str = ""
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    skip_assignment: bool = False
    members: tuple[JoinedMember, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class LeavingMember:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class MemberSummary:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupSummary:
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberSummary, ...]


@dataclass(frozen=True, slots=True)
class GroupOverview:
    group_id: str
    protocol_type: str
    state: str


JoinCallback = Callable[[JoinResult], None]
SyncCallback = Callable[[SyncResult], None]


# Timers


@dataclass(order=True, slots=True)
class Timer:
    deadline_ms: int
    sequence: int
    action: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class TimerQueue:
    """Deadlines in a heap; a cancelled timer stays in the heap and is skipped when it comes up."""

    def __init__(self, on_schedule: Callable[[], None]) -> None:
        self._heap: list[Timer] = []
        self._sequence = itertools.count()
        self._on_schedule = on_schedule

    def schedule(self, deadline_ms: int, action: Callable[[], None]) -> Timer:
        timer = Timer(deadline_ms, next(self._sequence), action)
        heapq.heappush(self._heap, timer)
        self._on_schedule()
        return timer

    def next_deadline(self) -> int | None:
        while self._heap and self._heap[0].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0].deadline_ms if self._heap else None

    def pop_due(self, now_ms: int) -> Timer | None:
        while self._heap and self._heap[0].deadline_ms <= now_ms:
            timer = heapq.heappop(self._heap)
            if not timer.cancelled:
                return timer
        return None


@dataclass(slots=True)
class JoinOperation:
    """The parked rebalance (Kafka's DelayedJoin / InitialDelayedJoin)."""

    initial: bool
    delay_ms: int = 0
    remaining_ms: int = 0
    timer: Timer | None = None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


# Members and groups


@dataclass(slots=True, eq=False)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    join_callback: JoinCallback | None = None
    sync_callback: SyncCallback | None = None
    is_new: bool = False
    heartbeat_timer: Timer | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_callback is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_callback is not None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise GroupStateError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        """The first protocol of this member's preference list that every member supports."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise GroupStateError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        """At a heartbeat deadline: may the member stay without having heartbeated?

        A member parked in JoinGroup or SyncGroup cannot heartbeat and is bounded by the rebalance
        timeout instead; a new member is not, so that an abandoned JoinGroup does not linger."""
        if self.is_new:
            return False
        return self.awaiting_join or self.awaiting_sync


@dataclass(slots=True, eq=False)
class GroupMetadata:
    """One group's membership and state. Changed only by `GroupCoordinator`."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    state_timestamp_ms: int = 0
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_members: dict[str, Timer] = field(default_factory=dict)  # KIP-394, with expiry
    pending_sync_members: set[str] = field(default_factory=set)
    new_member_added: bool = False
    join_operation: JoinOperation | None = None
    sync_timer: Timer | None = None
    offsets: GroupOffsets = field(default_factory=GroupOffsets)

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise GroupStateError(
                f"group {self.group_id} cannot move from {self.state.value} to {state.value}"
            )
        self.state = state
        self.state_timestamp_ms = now_ms

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: MemberMetadata, callback: JoinCallback | None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise GroupStateError(
                    f"static member {member.group_instance_id} is already in group {self.group_id}"
                )
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        member.join_callback = callback
        timer = self.pending_members.pop(member.member_id, None)
        if timer is not None:
            timer.cancel()

    def remove(self, member_id: str) -> MemberMetadata | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
            if member.heartbeat_timer is not None:
                member.heartbeat_timer.cancel()
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        timer = self.pending_members.pop(member_id, None)
        if timer is not None:
            timer.cancel()
        self.pending_sync_members.discard(member_id)
        return member

    def replace_static_member(
        self, group_instance_id: str, old_member_id: str, new_member_id: str
    ) -> MemberMetadata:
        member = self.members.pop(old_member_id, None)
        if member is None:
            raise GroupStateError(f"cannot replace unknown member {old_member_id}")
        # Whoever still waits under the old id is a duplicate instance: fence it now.
        self.maybe_invoke_join_callback(
            member, JoinResult(ErrorCode.fenced_instance_id, old_member_id)
        )
        self.maybe_invoke_sync_callback(member, SyncResult(ErrorCode.fenced_instance_id))
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        return member

    def update_member(
        self,
        member: MemberMetadata,
        protocols: tuple[tuple[str, bytes], ...],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        callback: JoinCallback | None,
    ) -> None:
        member.protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        member.join_callback = callback

    def has_all_members_joined(self) -> bool:
        """The join barrier: every member is parked in JoinGroup and no pending member is due."""
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick a member that did; False if none did."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for member in self.members.values():
            if member.awaiting_join:
                log.info(
                    "group %s: leader %s did not rejoin in time; %s leads now",
                    self.group_id,
                    self.leader_id,
                    member.member_id,
                )
                self.leader_id = member.member_id
                return True
        return False

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def candidate_protocols(self) -> set[str]:
        members = list(self.members.values())
        if not members:
            return set()
        candidates = set(members[0].protocol_names())
        for member in members[1:]:
            candidates &= set(member.protocol_names())
        return candidates

    def supports_protocols(self, protocol_type: str, protocols: Sequence[str]) -> bool:
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(protocols)
        candidates = self.candidate_protocols()
        return self.protocol_type == protocol_type and any(p in candidates for p in protocols)

    def select_protocol(self) -> str:
        """Each member votes for its preferred protocol among those all support; most votes win
        (ties go to the protocol voted first, so the choice is deterministic)."""
        if not self.members:
            raise GroupStateError(f"cannot select a protocol for empty group {self.group_id}")
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    def current_member_metadata(self) -> tuple[JoinedMember, ...]:
        if self.state in (GroupState.DEAD, GroupState.PREPARING_REBALANCE):
            raise GroupStateError(
                f"group {self.group_id} has no member metadata while {self.state}"
            )
        protocol = self.protocol_name or ""
        return tuple(
            JoinedMember(m.member_id, m.group_instance_id, m.metadata_for(protocol))
            for m in self.members.values()
        )

    def maybe_invoke_join_callback(self, member: MemberMetadata, result: JoinResult) -> None:
        callback, member.join_callback = member.join_callback, None
        if callback is not None:
            callback(result)

    def maybe_invoke_sync_callback(self, member: MemberMetadata, result: SyncResult) -> bool:
        callback, member.sync_callback = member.sync_callback, None
        if callback is None:
            return False
        callback(result)
        return True

    def join_result(self, member_id: str, skip_assignment: bool = False) -> JoinResult:
        """The current generation as `member_id` sees it (the leader also gets the members)."""
        return JoinResult(
            ErrorCode.none,
            member_id,
            self.generation_id,
            self.protocol_type,
            self.protocol_name,
            self.leader_id or "",
            skip_assignment,
            self.current_member_metadata() if self.is_leader(member_id) else (),
        )

    def summary(self) -> GroupSummary:
        stable = self.state is GroupState.STABLE and self.protocol_name is not None
        protocol = self.protocol_name if stable and self.protocol_name else ""
        members = tuple(
            MemberSummary(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata_for(protocol) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in self.members.values()
        )
        return GroupSummary(self.state.value, self.protocol_type or "", protocol, members)

    def overview(self) -> GroupOverview:
        return GroupOverview(self.group_id, self.protocol_type or "", self.state.value)

    def subscribed_topics(self) -> frozenset[str] | None:
        """The topics the members subscribe to, for a "consumer" group whose protocol is chosen
        and whose every subscription parses; None when unknown (then no offset of a Stable group
        expires, as in Kafka)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or not self.protocol_name:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            try:
                topics.update(consumer_subscription_topics(member.metadata_for(self.protocol_name)))
            except (GroupStateError, ValueError):
                return None
        return frozenset(topics)

    def is_subscribed_to(self, topic: str) -> bool:
        """Kafka's isSubscribedToTopic: unknown subscriptions count as subscribed."""
        topics = self.subscribed_topics()
        return topics is None or topic in topics


class GroupStore(Protocol):
    """Persists a group's metadata (the metadata manager: an append to the offsets topic)."""

    def store_group(
        self,
        group: GroupMetadata,
        assignment: Mapping[str, bytes],
        callback: Callable[[ErrorCode], None],
    ) -> None:
        """Write the group's generation, members and `assignment`; `callback` gets NONE once the
        record is committed, or the error to answer (maybe synchronously, maybe later)."""
        ...


_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def consumer_subscription_topics(metadata: bytes) -> list[str]:
    """The topics of a consumer's subscription (Kafka's ConsumerProtocolSubscription: an int16
    version, then an int32 count of int16-length topic names, in every version). ValueError if
    it does not parse."""
    try:
        (count,) = _INT32.unpack_from(metadata, 2)
        position, topics = 6, []
        for _ in range(count):
            (length,) = _INT16.unpack_from(metadata, position)
            position += 2
            if length < 0 or position + length > len(metadata):
                raise ValueError("a topic name runs past the subscription")
            topics.append(metadata[position : position + length].decode("utf-8"))
            position += length
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"not a consumer subscription: {e}") from None
    return topics
