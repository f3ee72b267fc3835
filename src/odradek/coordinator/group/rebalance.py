"""How a group's membership changes: joins, rebalances, generations, sessions and their timers.

`GroupRebalancer` is the half of the group coordinator that moves a group through its states (the
table is in `coordinator`'s docstring) once a request has been validated: it adds, updates and
removes members, runs the join barrier (Kafka's `InitialDelayedJoin` and `DelayedJoin`), starts a
generation and hands out the leader's assignment, and expires members whose session or sync
deadline passed (Kafka's heartbeat purgatory). `GroupCoordinator` (in `coordinator`) extends it
with the API-facing half: ownership, validation, and one method per group API.

Persistence: a new generation's metadata (members, assignment) is written through the
`GroupStore` (the metadata manager appends it to the offsets topic) before anyone learns the
assignment: the leader's SyncGroup and its followers' are answered once the record is committed
(or with the store's error, and the group rebalances again), a generation that leaves the group
Empty is written too, and so is a static member's new member id. A coordinator that takes over
the group after a failover reads that record back and keeps the generation and static members.

Timers are deadlines on the injected clock, kept in one `TimerQueue`; `expire_timers()` runs the
due ones. Nothing here does I/O; the store answers through a callback.

Concurrency: every method runs on the broker's event loop thread (or a test's thread); callbacks
are invoked synchronously from inside these methods and must not block.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.metadata import (
    UNKNOWN_MEMBER_ID,
    GroupConfig,
    GroupMetadata,
    GroupState,
    GroupStore,
    JoinCallback,
    JoinOperation,
    JoinRequest,
    JoinResult,
    MemberMetadata,
    SyncResult,
    TimerQueue,
)
from odradek.errors import GroupStateError, InvariantError

log = logging.getLogger(__name__)

NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000
"""How long a new member may wait in a rebalance before it is dropped (Kafka's value): it has no
member id yet, so it cannot heartbeat, and a client that gave up would otherwise stay forever."""


class GroupRebalancer:
    """The groups of one coordinator and the membership changes of each (see the module docstring).

    Event-loop thread only.
    """

    def __init__(
        self,
        config: GroupConfig,
        clock_ms: Callable[[], int],
        groups: dict[str, GroupMetadata],
        store: GroupStore,
    ) -> None:
        self.config = config
        self.clock_ms = clock_ms
        self.groups = groups
        self.store = store
        self._wakeup: asyncio.Event | None = None
        self._timers = TimerQueue(self._on_timer_scheduled)

    def _on_timer_scheduled(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def expire_timers(self) -> None:
        """Run every timer whose deadline has passed (timers a timer schedules for now included)."""
        while True:
            timer = self._timers.pop_due(self.clock_ms())
            if timer is None:
                return
            timer.action()

    def next_deadline_ms(self) -> int | None:
        return self._timers.next_deadline()

    def _cancel_group_timers(self, group: GroupMetadata) -> None:
        if group.join_operation is not None:
            group.join_operation.cancel()
            group.join_operation = None
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None
        for timer in group.pending_members.values():
            timer.cancel()

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

    @classmethod
    def _validate_generation_member(
        cls, group: GroupMetadata, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode | None:
        """A request a member makes in its generation (SyncGroup, Heartbeat, OffsetCommit): the
        member must be the group's current one (`_validate_current_member`) and the generation
        the group's current one (ILLEGAL_GENERATION)."""
        error = cls._validate_current_member(group, member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        return None

    def _accept_joining_member(self, group: GroupMetadata, member_id: str) -> bool:
        state = group.state
        if state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        member = group.members.get(member_id)
        if state is GroupState.PREPARING_REBALANCE:
            awaiting = sum(1 for m in group.members.values() if m.awaiting_join)
            return (member is not None and member.awaiting_join) or awaiting < self.config.max_size
        return member is not None or len(group.members) < self.config.max_size

    @staticmethod
    def _join_refusal(group: GroupMetadata, request: JoinRequest) -> ErrorCode | None:
        """Why a JoinGroup is refused, new member or current: the group is gone
        (COORDINATOR_NOT_AVAILABLE: the client looks for the coordinator again), or the request's
        protocol type and protocols do not fit the group's (`supports_protocols`:
        INCONSISTENT_GROUP_PROTOCOL)."""
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if not group.supports_protocols(request.protocol_type, [p for p, _ in request.protocols]):
            return ErrorCode.inconsistent_group_protocol
        return None

    def _join_new_member(
        self, group: GroupMetadata, request: JoinRequest, callback: JoinCallback
    ) -> None:
        error = self._join_refusal(group, request)
        if error is not None:
            callback(JoinResult(error, UNKNOWN_MEMBER_ID))
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
        error = self._join_refusal(group, request)
        if error is not None:
            callback(JoinResult(error, member_id))
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
        if instance_id is None:
            raise InvariantError("a static member's rejoin without a group instance id")
        current_leader = group.leader_id or ""
        member = group.replace_static_member(instance_id, old_member_id, new_member_id)
        old = (member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms)
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
                # Persist the new member id before answering: a coordinator that loads the group
                # after a failover must know this member by it.
                generation = group.generation_id
                assignment = {m.member_id: m.assignment for m in group.members.values()}

                def stored(error: ErrorCode) -> None:
                    if (
                        group.state is GroupState.DEAD
                        or group.members.get(new_member_id) is not member
                    ):
                        return
                    if error is not ErrorCode.none:
                        log.warning(
                            "group %s: storing static member %s's new id failed (%s); reverting",
                            group.group_id,
                            instance_id,
                            error.name,
                        )
                        group.update_member(member, *old, None)
                        group.replace_static_member(instance_id, new_member_id, old_member_id)
                        self._schedule_heartbeat_expiration(
                            group, member, member.session_timeout_ms
                        )
                        callback(JoinResult(error, UNKNOWN_MEMBER_ID, generation))
                        return
                    if request.supports_skip_assignment:
                        is_leader = group.is_leader(new_member_id)
                        result = group.join_result(new_member_id, skip_assignment=is_leader)
                    else:
                        # Before v9 the old leader id is returned, so that a returning leader does
                        # not compute an assignment that a Stable group would never hand out.
                        result = JoinResult(
                            ErrorCode.none,
                            new_member_id,
                            group.generation_id,
                            group.protocol_type,
                            group.protocol_name,
                            current_leader,
                        )
                    group.maybe_invoke_join_callback(member, result)

                self.store.store_group(group, assignment, stored)
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
            generation = group.generation_id

            def stored(error: ErrorCode) -> None:
                if error is not ErrorCode.none:
                    log.warning(
                        "storing empty group %s generation %d failed: %s",
                        group.group_id,
                        generation,
                        error.name,
                    )

            self.store.store_group(group, {}, stored)
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
