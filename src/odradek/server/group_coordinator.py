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
states, members and groups themselves are data, in `group_metadata`):

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
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from odradek.errors import GroupStateError
from odradek.protocol.codec import ApiKey
from odradek.server.group_metadata import (
    UNKNOWN_MEMBER_ID,
    GroupConfig,
    GroupMetadata,
    GroupOverview,
    GroupState,
    GroupSummary,
    JoinCallback,
    JoinOperation,
    JoinRequest,
    JoinResult,
    LeavingMember,
    MemberMetadata,
    SyncCallback,
    SyncResult,
    TimerQueue,
)

if TYPE_CHECKING:
    from odradek.server.broker import Broker
    from odradek.server.offset_store import OffsetStore

# The request, result and group classes live in `group_metadata`; the group handlers and the tests
# import them from here, as before the split.
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

NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000
"""How long a new member may wait in a rebalance before it is dropped (Kafka's value): it has no
member id yet, so it cannot heartbeat, and a client that gave up would otherwise stay forever."""


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


class GroupCoordinator:
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
        self.broker_id = broker_id
        self.config = config
        self.placement = placement
        self.clock_ms = clock_ms
        self.on_group_unloaded = on_group_unloaded
        self._placement_listener = on_placement_changed
        self.groups: dict[str, GroupMetadata] = {}
        self.active = True
        self._wakeup: asyncio.Event | None = None
        self._timers = TimerQueue(self._on_timer_scheduled)
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def for_broker(cls, broker: Broker, offset_store: OffsetStore) -> GroupCoordinator:
        """The coordinator of a broker: its group.* configs, placement from its metadata cache,
        and the offset store's cache kept to the groups placed here."""
        return cls(
            broker.broker_id,
            GroupConfig.from_broker_config(broker.config),
            lambda group_id: coordinator_for(group_id, broker.metadata_cache.alive_broker_ids()),
            on_group_unloaded=offset_store.forget,
            on_placement_changed=offset_store.retain,
        )

    def start_for_broker(self, broker: Broker) -> None:
        """`start`, watching the broker's metadata cache for changes of the live broker set."""
        self.start(broker.wait_for_metadata, lambda: broker.metadata_cache.version)

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

    def _on_timer_scheduled(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _run_timers(self) -> None:
        assert self._wakeup is not None
        while True:
            self._wakeup.clear()
            deadline = self._timers.next_deadline()
            timeout = None if deadline is None else max(0.0, (deadline - self.clock_ms()) / 1000)
            with contextlib.suppress(TimeoutError):  # not wait_for: see Broker.wait_for_metadata
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
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

    def expire_timers(self) -> None:
        """Run every timer whose deadline has passed (timers a timer schedules for now included)."""
        while True:
            timer = self._timers.pop_due(self.clock_ms())
            if timer is None:
                return
            timer.action()

    def next_deadline_ms(self) -> int | None:
        return self._timers.next_deadline()

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

    def _cancel_group_timers(self, group: GroupMetadata) -> None:
        if group.join_operation is not None:
            group.join_operation.cancel()
            group.join_operation = None
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None
        for timer in group.pending_members.values():
            timer.cancel()

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

    @staticmethod
    def _validate_current_member(
        group: GroupMetadata, member_id: str, group_instance_id: str | None
    ) -> ErrorCode | None:
        if group_instance_id is not None:
            current = group.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
            return None
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
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

    def _accept_joining_member(self, group: GroupMetadata, member_id: str) -> bool:
        state = group.state
        if state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        member = group.members.get(member_id)
        if state is GroupState.PREPARING_REBALANCE:
            awaiting = sum(1 for m in group.members.values() if m.awaiting_join)
            return (member is not None and member.awaiting_join) or awaiting < self.config.max_size
        return member is not None or len(group.members) < self.config.max_size

    def _join_new_member(
        self, group: GroupMetadata, request: JoinRequest, callback: JoinCallback
    ) -> None:
        if group.state is GroupState.DEAD:
            callback(JoinResult(ErrorCode.coordinator_not_available, UNKNOWN_MEMBER_ID))
            return
        if not group.supports_protocols(request.protocol_type, [p for p, _ in request.protocols]):
            callback(JoinResult(ErrorCode.inconsistent_group_protocol, UNKNOWN_MEMBER_ID))
            return
        prefix = request.group_instance_id or request.client_id
        new_member_id = f"{prefix}-{uuid.uuid4()}"
        if request.group_instance_id is not None:
            old_member_id = group.static_members.get(request.group_instance_id)
            if old_member_id is not None:
                self._update_static_member(group, old_member_id, new_member_id, request, callback)
            else:
                self._add_member_and_rebalance(group, new_member_id, request, callback)
        elif request.require_known_member_id:
            # KIP-394: hand out the id first; the member counts once it joins again with it.
            timer = self._timers.schedule(
                self.clock_ms() + request.session_timeout_ms,
                lambda: self._on_pending_member_expired(group, new_member_id),
            )
            group.pending_members[new_member_id] = timer
            callback(JoinResult(ErrorCode.member_id_required, new_member_id))
        else:
            self._add_member_and_rebalance(group, new_member_id, request, callback)

    def _join_current_member(
        self, group: GroupMetadata, request: JoinRequest, callback: JoinCallback
    ) -> None:
        member_id = request.member_id
        if group.state is GroupState.DEAD:
            callback(JoinResult(ErrorCode.coordinator_not_available, member_id))
            return
        if not group.supports_protocols(request.protocol_type, [p for p, _ in request.protocols]):
            callback(JoinResult(ErrorCode.inconsistent_group_protocol, member_id))
            return
        if member_id in group.pending_members:
            if request.group_instance_id is not None:
                # Pending ids are only handed to dynamic members: this client is confused.
                callback(JoinResult(ErrorCode.invalid_request, member_id))
                return
            self._add_member_and_rebalance(group, member_id, request, callback)
            return
        error = self._validate_current_member(group, member_id, request.group_instance_id)
        if error is not None:
            callback(JoinResult(error, member_id))
            return
        member = group.members[member_id]
        state = group.state
        if state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, request, callback, "member rejoined")
        elif state is GroupState.COMPLETING_REBALANCE:
            if member.matches(request.protocols):
                # It probably missed its JoinGroup answer: send the current generation again.
                callback(group.join_result(member_id))
            else:
                self._update_member_and_rebalance(
                    group, member, request, callback, "member changed its metadata"
                )
        elif state is GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(request.protocols):
                # The leader rejoining lets it react to changes the member metadata does not
                # show (new partitions of a subscribed topic, say).
                self._update_member_and_rebalance(
                    group, member, request, callback, "leader rejoined or metadata changed"
                )
            else:
                callback(group.join_result(member_id))
        else:
            callback(JoinResult(ErrorCode.unknown_member_id, member_id))

    def _add_member_and_rebalance(
        self, group: GroupMetadata, member_id: str, request: JoinRequest, callback: JoinCallback
    ) -> None:
        member = MemberMetadata(
            member_id,
            request.group_instance_id,
            request.client_id,
            request.client_host,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            request.protocol_type,
            request.protocols,
            is_new=True,
        )
        if group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True  # lets the initial delay wait for more members
        group.add(member, callback)
        self._schedule_heartbeat_expiration(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance(group, f"new member {member_id} joined")

    def _update_member_and_rebalance(
        self,
        group: GroupMetadata,
        member: MemberMetadata,
        request: JoinRequest,
        callback: JoinCallback,
        reason: str,
    ) -> None:
        group.update_member(
            member,
            request.protocols,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            callback,
        )
        self._maybe_prepare_rebalance(group, f"{reason}: {member.member_id}")

    def _update_static_member(
        self,
        group: GroupMetadata,
        old_member_id: str,
        new_member_id: str,
        request: JoinRequest,
        callback: JoinCallback,
    ) -> None:
        """A known static member came back with no member id: it takes a new id in its old place.

        While the group is Stable and the chosen protocol stays the same there is no rebalance:
        the member gets the current generation back and then its old assignment from SyncGroup.
        """
        instance_id = request.group_instance_id
        assert instance_id is not None  # caller's contract
        current_leader = group.leader_id or ""
        member = group.replace_static_member(instance_id, old_member_id, new_member_id)
        self._schedule_heartbeat_expiration(group, member, member.session_timeout_ms)
        group.update_member(
            member,
            request.protocols,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            callback,
        )
        state = group.state
        if state is GroupState.STABLE:
            if group.protocol_name == group.select_protocol():
                if request.supports_skip_assignment:
                    is_leader = group.is_leader(new_member_id)
                    result = group.join_result(new_member_id, skip_assignment=is_leader)
                else:
                    # Before v9 the old leader id is returned, so that a returning leader does not
                    # compute an assignment that a Stable group would never hand out.
                    result = JoinResult(
                        ErrorCode.none,
                        new_member_id,
                        group.generation_id,
                        group.protocol_type,
                        group.protocol_name,
                        current_leader,
                    )
                group.maybe_invoke_join_callback(member, result)
            else:
                self._maybe_prepare_rebalance(
                    group, f"static member {instance_id} rejoined with other protocols"
                )
        elif state is GroupState.COMPLETING_REBALANCE:
            # The leader may be assigning to the old member id: start over with the new one.
            self._prepare_rebalance(group, f"static member {instance_id} rejoined during sync")
        elif state is not GroupState.PREPARING_REBALANCE:
            raise GroupStateError(
                f"group {group.group_id} is {state.value} while static member {instance_id} rejoins"
            )

    # -- rebalance -------------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        """Start a rebalance: 1. answer parked SyncGroups REBALANCE_IN_PROGRESS; 2. drop the sync
        deadline; 3. move to PreparingRebalance; 4. park the join (initial delay from Empty)."""
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, ErrorCode.rebalance_in_progress)
        self._remove_sync_expiration(group)
        from_empty = group.state is GroupState.EMPTY
        group.transition_to(GroupState.PREPARING_REBALANCE, self.clock_ms())
        log.info(
            "preparing to rebalance group %s with old generation %d (reason: %s)",
            group.group_id,
            group.generation_id,
            reason,
        )
        if group.join_operation is not None:
            group.join_operation.cancel()
            group.join_operation = None
        if from_empty:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self._schedule_initial_join(group, delay, remaining)
        else:
            self._schedule_join(group)
            self._maybe_complete_join(group)

    def _schedule_join(self, group: GroupMetadata) -> None:
        operation = JoinOperation(initial=False)
        operation.timer = self._timers.schedule(
            self.clock_ms() + group.rebalance_timeout_ms(),
            lambda: self._on_join_deadline(group),
        )
        group.join_operation = operation

    def _schedule_initial_join(
        self, group: GroupMetadata, delay_ms: int, remaining_ms: int
    ) -> None:
        operation = JoinOperation(initial=True, delay_ms=delay_ms, remaining_ms=remaining_ms)
        operation.timer = self._timers.schedule(
            self.clock_ms() + delay_ms, lambda: self._on_initial_join_delay(group, operation)
        )
        group.join_operation = operation

    def _maybe_complete_join(self, group: GroupMetadata) -> None:
        """The join barrier (Kafka's tryComplete): complete once every member has rejoined. The
        initial delay never completes early: it exists to wait for more members."""
        operation = group.join_operation
        if (
            operation is not None
            and not operation.initial
            and group.state is GroupState.PREPARING_REBALANCE
            and group.has_all_members_joined()
        ):
            operation.cancel()
            group.join_operation = None
            self._complete_join(group)

    def _on_join_deadline(self, group: GroupMetadata) -> None:
        group.join_operation = None
        if group.state is GroupState.PREPARING_REBALANCE:
            self._complete_join(group)

    def _on_initial_join_delay(self, group: GroupMetadata, operation: JoinOperation) -> None:
        group.join_operation = None
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        if group.new_member_added and operation.remaining_ms != 0:
            group.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms, operation.remaining_ms)
            remaining = max(operation.remaining_ms - operation.delay_ms, 0)
            self._schedule_initial_join(group, delay, remaining)
        else:
            self._complete_join(group)

    def _complete_join(self, group: GroupMetadata) -> None:
        """End the join phase: 1. drop dynamic members that did not rejoin; 2. keep or elect a
        leader among those that did; 3. start the next generation; 4. answer every parked
        JoinGroup (the leader gets all members' metadata) and expect a SyncGroup from each."""
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            if not member.is_static:
                log.info(
                    "group %s: member %s did not rejoin in time; removing it",
                    group.group_id,
                    member.member_id,
                )
                group.remove(member.member_id)
        if group.state is GroupState.DEAD:
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Only static members remain and none rejoined: wait for them (or their sessions).
            log.warning("group %s: no member rejoined; waiting another round", group.group_id)
            self._schedule_join(group)
            self._maybe_complete_join(group)
            return
        group.init_next_generation(self.clock_ms())
        if group.state is GroupState.EMPTY:
            log.info(
                "group %s with generation %d is now empty", group.group_id, group.generation_id
            )
            return
        log.info(
            "stabilized group %s generation %d (%s) with %d members",
            group.group_id,
            group.generation_id,
            group.protocol_name,
            len(group.members),
        )
        for member in list(group.members.values()):
            group.maybe_invoke_join_callback(member, group.join_result(member.member_id))
            self._schedule_heartbeat_expiration(group, member, member.session_timeout_ms)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        generation = group.generation_id
        group.sync_timer = self._timers.schedule(
            self.clock_ms() + group.rebalance_timeout_ms(),
            lambda: self._on_sync_deadline(group, generation),
        )

    def _on_sync_deadline(self, group: GroupMetadata, generation_id: int) -> None:
        """Members that got their JoinGroup answer but never sent SyncGroup are removed."""
        group.sync_timer = None
        if generation_id != group.generation_id or group.state not in (
            GroupState.COMPLETING_REBALANCE,
            GroupState.STABLE,
        ):
            return
        missing = sorted(group.pending_sync_members)
        if not missing:
            return
        for member_id in missing:
            group.remove(member_id)
        self._prepare_rebalance(group, f"members {missing} did not send SyncGroup in time")

    def _remove_pending_sync_member(self, group: GroupMetadata, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if not group.pending_sync_members and group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None

    def _remove_sync_expiration(self, group: GroupMetadata) -> None:
        group.pending_sync_members.clear()
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None

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

    def _reset_and_propagate_assignment_error(self, group: GroupMetadata, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: GroupMetadata, error: ErrorCode) -> None:
        ok = error is ErrorCode.none
        for member in list(group.members.values()):
            result = SyncResult(
                error,
                group.protocol_type if ok else None,
                group.protocol_name if ok else None,
                member.assignment,
            )
            if group.maybe_invoke_sync_callback(member, result):
                # The member could not heartbeat while parked: its session starts over now.
                self._schedule_heartbeat_expiration(group, member, member.session_timeout_ms)

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

    def _schedule_heartbeat_expiration(
        self, group: GroupMetadata, member: MemberMetadata, timeout_ms: int
    ) -> None:
        """Complete the member's current heartbeat deadline and set the next one."""
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
        member_id = member.member_id
        member.heartbeat_timer = self._timers.schedule(
            self.clock_ms() + timeout_ms, lambda: self._on_heartbeat_deadline(group, member_id)
        )

    def _on_heartbeat_deadline(self, group: GroupMetadata, member_id: str) -> None:
        if group.state is GroupState.DEAD:
            return
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return
        log.info(
            "member %s of group %s missed its session timeout; removing it",
            member_id,
            group.group_id,
        )
        self._remove_member_and_update_group(group, member, "session timeout")

    def _on_pending_member_expired(self, group: GroupMetadata, member_id: str) -> None:
        if group.state is GroupState.DEAD or member_id not in group.pending_members:
            return
        log.info("pending member %s of group %s never joined", member_id, group.group_id)
        self._remove_pending_member(group, member_id)

    def _remove_member_and_update_group(
        self, group: GroupMetadata, member: MemberMetadata, reason: str
    ) -> None:
        # A removed member still parked in JoinGroup learns it must start over.
        group.maybe_invoke_join_callback(
            member, JoinResult(ErrorCode.unknown_member_id, UNKNOWN_MEMBER_ID)
        )
        group.maybe_invoke_sync_callback(member, SyncResult(ErrorCode.unknown_member_id))
        group.remove(member.member_id)
        self._after_member_removed(group, f"{reason}: {member.member_id}")

    def _after_member_removed(self, group: GroupMetadata, reason: str) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, reason)
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)

    def _remove_pending_member(self, group: GroupMetadata, member_id: str) -> None:
        group.remove(member_id)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)

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
