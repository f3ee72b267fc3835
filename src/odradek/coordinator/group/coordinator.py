"""The group coordinator: Kafka's classic consumer-group protocol, as a state machine with a clock.

Every broker runs one. It is the coordinator of the groups that `coordinator_for` places on it: the
live broker at index crc32(group id) mod n of the sorted live broker ids in this broker's metadata
cache. Any broker answers FindCoordinator with that placement; a group request reaching another
broker gets NOT_COORDINATOR, and when the set of live brokers changes (`on_placement_changed`) the
groups that moved away are unloaded: their parked JoinGroup and SyncGroup requests are answered
NOT_COORDINATOR, the members find the new coordinator, learn UNKNOWN_MEMBER_ID there and rejoin.
Group membership lives only in memory (as it would be lost with the broker anyway); committed
offsets live in ZooKeeper (`offset_store`), so they survive a move.

Group states, their valid previous states (`VALID_PREVIOUS_STATES`) and what moves a group (the
states, members and groups themselves are data, in `metadata`; the membership changes in `rebalance`):

  Empty               <- PreparingRebalance   no members; a JoinGroup starts a rebalance
  PreparingRebalance  <- Empty, CompletingRebalance, Stable
                         JoinGroup requests are parked until every known member has rejoined (the
                         join barrier) or the rebalance timeout (the largest of the members') runs
                         out; members that did not rejoin by then are removed. From Empty the
                         rebalance first waits `group.initial.rebalance.delay.ms`, and again for
                         every new member that arrived meanwhile, up to the rebalance timeout.
  CompletingRebalance <- PreparingRebalance   a new generation: every member got its JoinGroup
                         answer (the leader with all members' metadata); SyncGroup requests are
                         parked until the leader's SyncGroup brings the assignment.
  Stable              <- CompletingRebalance  the leader's assignment was handed to every member.
  Dead                <- any state            the group was deleted or moved to another broker.

Leaving (LeaveGroup), a missed session timeout (no heartbeat), a new member, the leader rejoining or
a member changing its subscription send a Stable or CompletingRebalance group back to
PreparingRebalance; members learn it from REBALANCE_IN_PROGRESS on their next heartbeat.

Member ids (KIP-394): a JoinGroup v4+ without a member id gets MEMBER_ID_REQUIRED and a fresh id,
and the member is "pending" until it joins again with that id (or its session timeout passes). Static
members (KIP-345, `group.instance.id`) keep their place across restarts: a rejoin with a known
instance id replaces the old member id (fencing the old one with FENCED_INSTANCE_ID) without a
rebalance while the group is Stable, and their session timeout alone removes them.

Timers (Kafka's heartbeat and rebalance purgatories) are deadlines on the injected clock, kept in one
heap; `expire_timers()` runs the due ones. In the broker a task sleeps until the next deadline; unit
tests move a fake clock and call `expire_timers()` themselves.

Concurrency: every method runs on the broker's event loop thread (or a test's thread); callbacks are
invoked synchronously from inside these methods and must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.metadata import (
    UNKNOWN_MEMBER_ID,
    GroupConfig,
    GroupMetadata,
    GroupOverview,
    GroupState,
    GroupSummary,
    JoinCallback,
    JoinRequest,
    JoinResult,
    LeavingMember,
    SyncCallback,
    SyncResult,
)
from odradek.coordinator.group.rebalance import NEW_MEMBER_JOIN_TIMEOUT_MS, GroupRebalancer
from odradek.errors import GroupStateError, require
from odradek.protocol.codec import ApiKey

if TYPE_CHECKING:
    from odradek.coordinator.group.offset_store import OffsetStore

# The request, result and group classes live in `metadata`; the group handlers and the tests
# import them from here too.
__all__ = [
    "NEW_MEMBER_JOIN_TIMEOUT_MS",
    "GroupConfig",
    "GroupCoordinator",
    "GroupMetadata",
    "GroupState",
    "GroupSummary",
    "JoinRequest",
    "JoinResult",
    "LeavingMember",
    "SyncResult",
    "coordinator_for",
]

log = logging.getLogger(__name__)


class LiveBrokers(Protocol):
    """What the coordinator reads of the broker's metadata cache: the live broker ids (they decide
    the placement of every group) and a version that changes with every UpdateMetadata."""

    @property
    def version(self) -> int: ...

    def alive_broker_ids(self) -> Iterable[int]: ...


def coordinator_for(group_id: str, live_broker_ids: Iterable[int]) -> int | None:
    """The broker that coordinates `group_id`: index crc32(group id) mod n of the sorted live ids.

    crc32, not Python's `hash`, so that every broker process computes the same placement."""
    brokers = sorted(live_broker_ids)
    if not brokers:
        return None
    return brokers[zlib.crc32(group_id.encode()) % len(brokers)]


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


_GROUP_MANAGEMENT_APIS = frozenset(
    {ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP}
)


class GroupCoordinator(GroupRebalancer):
    """Groups, members and generations of the groups placed on this broker.

    `placement(group_id)` names the coordinating broker (None while no live broker is known).
    `on_group_unloaded(group_id)` is told when a group leaves this coordinator (moved or deleted),
    and `on_placement_changed(is_local)` after every change of the live broker set, so that
    caches keyed by group (committed offsets) can be dropped, including those of groups that
    never had members here.

    Concurrency: event-loop thread only (see the module docstring); `start` needs a running loop.
    """

    def __init__(
        self,
        broker_id: int,
        config: GroupConfig,
        placement: Callable[[str], int | None],
        *,
        clock_ms: Callable[[], int] = _monotonic_ms,
        on_group_unloaded: Callable[[str], None] | None = None,
        on_placement_changed: Callable[[Callable[[str], bool]], None] | None = None,
    ) -> None:
        super().__init__(config, clock_ms)
        self.broker_id = broker_id
        self.placement = placement
        self.on_group_unloaded = on_group_unloaded
        self._placement_listener = on_placement_changed
        self.active = True
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def for_broker(
        cls,
        broker_id: int,
        config: GroupConfig,
        live_brokers: LiveBrokers,
        offset_store: OffsetStore,
    ) -> GroupCoordinator:
        """The coordinator of a broker: placement over the live brokers of its metadata cache,
        and the offset store's cache kept to the groups placed here."""
        return cls(
            broker_id,
            config,
            lambda group_id: coordinator_for(group_id, live_brokers.alive_broker_ids()),
            on_group_unloaded=offset_store.forget,
            on_placement_changed=offset_store.retain,
        )

    def start_for_broker(
        self,
        wait_for_metadata: Callable[[Callable[[], bool], float], Awaitable[bool]],
        live_brokers: LiveBrokers,
    ) -> None:
        """`start`, watching the broker's metadata for changes of the live broker set."""
        self.start(wait_for_metadata, lambda: live_brokers.version)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(
        self,
        wait_for_metadata: Callable[[Callable[[], bool], float], Awaitable[bool]] | None = None,
        metadata_version: Callable[[], int] | None = None,
    ) -> None:
        """Start the timer task and, given the broker's metadata hooks, the task that unloads
        groups that moved when the live broker set changes."""
        loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._tasks.append(loop.create_task(self._run_timers()))
        if wait_for_metadata is not None and metadata_version is not None:
            self._tasks.append(
                loop.create_task(self._watch_placement(wait_for_metadata, metadata_version))
            )

    async def shutdown(self) -> None:
        """Stop: parked requests are answered NOT_COORDINATOR, so clients move on at once."""
        self.active = False
        for group in list(self.groups.values()):
            self._unload(group, "the broker is shutting down")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _run_timers(self) -> None:
        wakeup = require(self._wakeup, "the group coordinator's timer wake-up (set by start)")
        while True:
            wakeup.clear()
            deadline = self._timers.next_deadline()
            timeout = None if deadline is None else max(0.0, (deadline - self.clock_ms()) / 1000)
            with contextlib.suppress(TimeoutError):  # not wait_for: see Broker.wait_for_metadata
                async with asyncio.timeout(timeout):
                    await wakeup.wait()
            try:
                self.expire_timers()
            except Exception:
                log.exception("group coordinator timer failed")

    async def _watch_placement(
        self,
        wait_for_metadata: Callable[[Callable[[], bool], float], Awaitable[bool]],
        metadata_version: Callable[[], int],
    ) -> None:
        seen = metadata_version()

        def changed() -> bool:
            return metadata_version() != seen

        while True:
            await wait_for_metadata(changed, 3600.0)
            if changed():
                seen = metadata_version()
                self.on_placement_changed()

    def on_placement_changed(self) -> None:
        """The live brokers changed: unload the groups this broker no longer coordinates."""
        for group in list(self.groups.values()):
            if self.placement(group.group_id) != self.broker_id:
                self._unload(group, "its coordinator moved")
        if self._placement_listener is not None:
            self._placement_listener(lambda group_id: self.placement(group_id) == self.broker_id)

    def _unload(self, group: GroupMetadata, reason: str) -> None:
        log.info(
            "unloading group %s (generation %d, %s): %s",
            group.group_id,
            group.generation_id,
            group.state.value,
            reason,
        )
        previous = group.state
        group.transition_to(GroupState.DEAD, self.clock_ms())
        for member in list(group.members.values()):
            if previous is GroupState.PREPARING_REBALANCE:
                group.maybe_invoke_join_callback(
                    member, JoinResult(ErrorCode.not_coordinator, member.member_id)
                )
            group.maybe_invoke_sync_callback(member, SyncResult(ErrorCode.not_coordinator))
            if member.heartbeat_timer is not None:
                member.heartbeat_timer.cancel()
        self._cancel_group_timers(group)
        self._forget(group)

    def _forget(self, group: GroupMetadata) -> None:
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
        if self.on_group_unloaded is not None:
            self.on_group_unloaded(group.group_id)

    # -- validation ------------------------------------------------------------------------------

    def validate_group_status(self, group_id: str | None, api: int) -> ErrorCode | None:
        """INVALID_GROUP_ID, COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR, or None if we serve it.

        Offset and admin APIs accept the empty group id (as Kafka, for old simple consumers);
        the group management APIs do not."""
        if group_id is None or (not group_id and api in _GROUP_MANAGEMENT_APIS):
            return ErrorCode.invalid_group_id
        if not self.active:
            return ErrorCode.coordinator_not_available
        coordinator = self.placement(group_id)
        if coordinator is None:
            return ErrorCode.coordinator_not_available
        if coordinator != self.broker_id:
            return ErrorCode.not_coordinator
        return None

    # -- JoinGroup -------------------------------------------------------------------------------

    def join_group(self, request: JoinRequest, callback: JoinCallback) -> None:
        """Handle a JoinGroup; `callback` gets the answer now or when the rebalance completes."""
        error = self.validate_group_status(request.group_id, ApiKey.JOIN_GROUP)
        if error is not None:
            callback(JoinResult(error, request.member_id))
            return
        if not (
            self.config.min_session_timeout_ms
            <= request.session_timeout_ms
            <= self.config.max_session_timeout_ms
        ):
            callback(JoinResult(ErrorCode.invalid_session_timeout, request.member_id))
            return
        is_unknown = request.member_id == UNKNOWN_MEMBER_ID
        group = self.groups.get(request.group_id)
        if group is None:
            if not is_unknown:
                # A known member of a group we do not have: it must start over (a new coordinator).
                callback(JoinResult(ErrorCode.unknown_member_id, request.member_id))
                return
            group = self.groups[request.group_id] = GroupMetadata(
                request.group_id, state_timestamp_ms=self.clock_ms()
            )
        if not self._accept_joining_member(group, request.member_id):
            removed = group.remove(request.member_id)
            if removed is not None:
                self._after_member_removed(group, "the group is over its maximum size")
            callback(JoinResult(ErrorCode.group_max_size_reached, UNKNOWN_MEMBER_ID))
        elif is_unknown:
            self._join_new_member(group, request, callback)
        else:
            self._join_current_member(group, request, callback)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)
        self._maybe_discard(group)

    # -- SyncGroup -------------------------------------------------------------------------------

    def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
        callback: SyncCallback,
    ) -> None:
        """Handle a SyncGroup; a follower's answer waits for the leader's assignment."""
        error = self.validate_group_status(group_id, ApiKey.SYNC_GROUP)
        if error is not None:
            callback(SyncResult(error))
            return
        group = self.groups.get(group_id)
        if group is None:
            callback(SyncResult(ErrorCode.unknown_member_id))
            return
        error = self._validate_sync(
            group, generation_id, member_id, group_instance_id, protocol_type, protocol_name
        )
        if error is not None:
            callback(SyncResult(error))
            return
        state = group.state
        if state is GroupState.EMPTY:
            callback(SyncResult(ErrorCode.unknown_member_id))
        elif state is GroupState.PREPARING_REBALANCE:
            callback(SyncResult(ErrorCode.rebalance_in_progress))
        elif state is GroupState.COMPLETING_REBALANCE:
            member = group.members[member_id]
            member.sync_callback = callback
            self._remove_pending_sync_member(group, member_id)
            if group.is_leader(member_id):
                missing = [m for m in group.members if m not in assignments]
                if missing:
                    log.warning(
                        "group %s generation %d: no assignment for %s; giving them none",
                        group.group_id,
                        group.generation_id,
                        missing,
                    )
                for member in group.members.values():
                    member.assignment = assignments.get(member.member_id, b"")
                self._propagate_assignment(group, ErrorCode.none)
                group.transition_to(GroupState.STABLE, self.clock_ms())
        elif state is GroupState.STABLE:
            self._remove_pending_sync_member(group, member_id)
            member = group.members[member_id]
            callback(
                SyncResult(
                    ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment
                )
            )
            self._schedule_heartbeat_expiration(group, member, member.session_timeout_ms)
        else:
            raise GroupStateError(f"SyncGroup reached dead group {group_id}")

    def _validate_sync(
        self,
        group: GroupMetadata,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
    ) -> ErrorCode | None:
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if protocol_type is not None and protocol_type != group.protocol_type:
            return ErrorCode.inconsistent_group_protocol
        if protocol_name is not None and protocol_name != group.protocol_name:
            return ErrorCode.inconsistent_group_protocol
        return None

    # -- Heartbeat and session expiry ------------------------------------------------------------

    def heartbeat(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        error = self.validate_group_status(group_id, ApiKey.HEARTBEAT)
        if error is not None:
            return error
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.state is GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        member = group.members[member_id]
        self._schedule_heartbeat_expiration(group, member, member.session_timeout_ms)
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    # -- LeaveGroup ------------------------------------------------------------------------------

    def leave_group(
        self, group_id: str, members: Sequence[LeavingMember]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """(group error, one error per leaving member)."""
        error = self.validate_group_status(group_id, ApiKey.LEAVE_GROUP)
        if error is not None:
            return error, []
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.none, [ErrorCode.unknown_member_id] * len(members)
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, []
        errors = [self._leave(group, leaving) for leaving in members]
        self._maybe_discard(group)
        return ErrorCode.none, errors

    def _leave(self, group: GroupMetadata, leaving: LeavingMember) -> ErrorCode:
        reason = f"member left ({leaving.reason or 'no reason given'})"
        if leaving.member_id == UNKNOWN_MEMBER_ID:
            # An administrator removing a static member by instance id.
            current = (
                group.static_members.get(leaving.group_instance_id)
                if leaving.group_instance_id is not None
                else None
            )
            if current is None:
                return ErrorCode.unknown_member_id
            self._remove_member_and_update_group(group, group.members[current], reason)
            return ErrorCode.none
        if leaving.member_id in group.pending_members:
            self._remove_pending_member(group, leaving.member_id)
            return ErrorCode.none
        error = self._validate_current_member(group, leaving.member_id, leaving.group_instance_id)
        if error is not None:
            return error
        log.info("member %s left group %s", leaving.member_id, group.group_id)
        self._remove_member_and_update_group(group, group.members[leaving.member_id], reason)
        return ErrorCode.none

    # -- offsets, listing, describing, deleting --------------------------------------------------

    def validate_offset_commit(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        """May this OffsetCommit be stored? NONE, or the error every partition gets.

        Generation -1 with no member id is a consumer that manages partitions itself: allowed
        while the group has no members. Otherwise the committer must be a current member of the
        current generation; a valid commit counts as a heartbeat."""
        error = self.validate_group_status(group_id, ApiKey.OFFSET_COMMIT)
        if error is not None:
            return error
        group = self.groups.get(group_id)
        if group is None:
            # No members here: a simple consumer, or a member of a generation this coordinator
            # never saw (the group moved), which must rejoin before committing.
            return ErrorCode.none if generation_id < 0 else ErrorCode.illegal_generation
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and group.state is GroupState.EMPTY:
            return ErrorCode.none
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = self._validate_current_member(group, member_id, group_instance_id)
            if error is not None:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.illegal_generation
        elif group.state is not GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        member = group.members.get(member_id)
        if member is not None:
            self._schedule_heartbeat_expiration(group, member, member.session_timeout_ms)
        return ErrorCode.none

    def list_groups(self, states: Iterable[str] = ()) -> list[GroupOverview]:
        wanted = {state.lower() for state in states}
        return [
            group.overview()
            for group in self.groups.values()
            if group.state is not GroupState.DEAD
            and (not wanted or group.state.value.lower() in wanted)
        ]

    def describe_group(self, group_id: str) -> tuple[ErrorCode, GroupSummary | None]:
        """(error, summary); a group this coordinator does not hold gives (NONE, None)."""
        error = self.validate_group_status(group_id, ApiKey.DESCRIBE_GROUPS)
        if error is not None:
            return error, None
        group = self.groups.get(group_id)
        return ErrorCode.none, (group.summary() if group is not None else None)

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """Delete groups without members: NONE, NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND (not held
        here; the caller may still find committed offsets to delete) or a status error."""
        results: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            error = self.validate_group_status(group_id, ApiKey.DELETE_GROUPS)
            if error is not None:
                results[group_id] = error
                continue
            group = self.groups.get(group_id)
            if group is None or group.state is GroupState.DEAD:
                results[group_id] = ErrorCode.group_id_not_found
            elif group.state is GroupState.EMPTY:
                group.transition_to(GroupState.DEAD, self.clock_ms())
                self._cancel_group_timers(group)
                self._forget(group)
                results[group_id] = ErrorCode.none
            else:
                results[group_id] = ErrorCode.non_empty_group
        return results

    def _maybe_discard(self, group: GroupMetadata) -> None:
        """Drop a group that never had a generation and has nobody in it (a refused first join):
        there is nothing to remember, and junk requests must not grow the group table."""
        if (
            group.state is GroupState.EMPTY
            and group.generation_id == 0
            and not group.members
            and not group.pending_members
            and self.groups.get(group.group_id) is group
        ):
            del self.groups[group.group_id]
