"""The group coordinator: Kafka's classic consumer-group protocol, as a state machine with a clock.

Every broker runs one. It coordinates the groups whose `__consumer_offsets` partition
(`placement.partition_for`) this broker leads; the `GroupMetadataManager` (the store) knows which
those are, loads their groups and offsets when the broker becomes leader of a partition and
unloads them when it stops. A group request for a group of a partition being loaded gets
COORDINATOR_LOAD_IN_PROGRESS, one for a group of a partition led elsewhere NOT_COORDINATOR (the
client asks FindCoordinator again). Unloading a group (`_unload`) answers its parked JoinGroup and
SyncGroup requests NOT_COORDINATOR; its members find the new coordinator, which has loaded the
group's last generation, members and assignments from the offsets topic, and carry on (static
members keep their place; dynamic ones heartbeat with the same member id and generation).

Group states, their valid previous states (`VALID_PREVIOUS_STATES`) and what moves a group (the
states, members and groups themselves are data, in `metadata`; the membership changes in `rebalance`):

  Empty               <- PreparingRebalance   no members; a JoinGroup starts a rebalance. A group
                         that only commits offsets (a simple consumer) stays Empty.
  PreparingRebalance  <- Empty, CompletingRebalance, Stable
                         JoinGroup requests are parked until every known member has rejoined (the
                         join barrier) or the rebalance timeout (the largest of the members') runs
                         out; members that did not rejoin by then are removed. From Empty the
                         rebalance first waits `group.initial.rebalance.delay.ms`, and again for
                         every new member that arrived meanwhile, up to the rebalance timeout.
  CompletingRebalance <- PreparingRebalance   a new generation: every member got its JoinGroup
                         answer (the leader with all members' metadata); SyncGroup requests are
                         parked until the leader's SyncGroup brings the assignment.
  Stable              <- CompletingRebalance  the leader's assignment was stored in the offsets
                         topic, then handed to every member.
  Dead                <- any state            the group was deleted, expired, or unloaded.

Leaving (LeaveGroup), a missed session timeout (no heartbeat), a new member, the leader rejoining or
a member changing its subscription send a Stable or CompletingRebalance group back to
PreparingRebalance; members learn it from REBALANCE_IN_PROGRESS on their next heartbeat.

Member ids (KIP-394): a JoinGroup v4+ without a member id gets MEMBER_ID_REQUIRED and a fresh id,
and the member is "pending" until it joins again with that id (or its session timeout passes). Static
members (KIP-345, `group.instance.id`) keep their place across restarts: a rejoin with a known
instance id replaces the old member id (fencing the old one with FENCED_INSTANCE_ID) without a
rebalance while the group is Stable, and their session timeout alone removes them.

Timers (Kafka's heartbeat and rebalance purgatories) are deadlines on the injected clock (the wall
clock in milliseconds, as Kafka's), kept in one heap; `expire_timers()` runs the due ones. In the
broker a task sleeps until the next deadline; unit tests move a fake clock and call
`expire_timers()` themselves. The same clock stamps state changes (`state_timestamp_ms`, stored as
the group's currentStateTimestamp and used by offset expiry).

Concurrency: every method runs on the broker's event loop thread (or a test's thread); callbacks are
invoked synchronously from inside these methods and must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

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
from odradek.coordinator.group.metadata_manager import GroupMetadataManager
from odradek.coordinator.group.offsets import OffsetAndMetadata, TopicPartition
from odradek.coordinator.group.rebalance import NEW_MEMBER_JOIN_TIMEOUT_MS, GroupRebalancer
from odradek.errors import GroupStateError, require
from odradek.protocol.codec import ApiKey

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
]

log = logging.getLogger(__name__)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


_GROUP_MANAGEMENT_APIS = frozenset(
    {ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP}
)

DEAD_GROUP = GroupSummary(GroupState.DEAD.value, "", "", ())
"""What DescribeGroups answers for a group this coordinator does not hold (Kafka's DeadGroup)."""


class GroupCoordinator(GroupRebalancer):
    """Groups, members and generations of the groups whose offsets partition this broker leads.

    Concurrency: event-loop thread only (see the module docstring); `start` needs a running loop.
    """

    def __init__(
        self,
        broker_id: int,
        config: GroupConfig,
        manager: GroupMetadataManager,
        *,
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        super().__init__(config, clock_ms, manager.groups, manager)
        self.broker_id = broker_id
        self.manager = manager
        manager.on_group_loaded = self._on_group_loaded
        manager.on_group_unloaded = lambda group: self._unload(group, "its partition moved")
        self.active = False
        self._tasks: list[asyncio.Task[None]] = []
        # Kafka's group-coordinator-metrics offset-commit-count: partitions whose commit was
        # accepted for storing (read by the metrics scrape).
        self.offset_commits = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the timer task and the store's expiry task; requests are served from now on."""
        loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._tasks.append(loop.create_task(self._run_timers()))
        self.manager.start()
        self.active = True

    async def shutdown(self) -> None:
        """Stop: parked requests are answered NOT_COORDINATOR, so clients move on at once."""
        self.active = False
        await self.manager.shutdown()
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

    def _on_group_loaded(self, group: GroupMetadata) -> None:
        """A group came back from the offsets topic: its members' sessions start now (Kafka's
        onGroupLoaded); a group over `group.max.size` rebalances to shed members."""
        for member in group.members.values():
            self._schedule_heartbeat_expiration(group, member, member.session_timeout_ms)
        if len(group.members) > self.config.max_size:
            self._prepare_rebalance(group, "the group is over its maximum size")

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
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]

    # -- validation ------------------------------------------------------------------------------

    def validate_group_status(self, group_id: str | None, api: int) -> ErrorCode | None:
        """INVALID_GROUP_ID, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS or
        NOT_COORDINATOR, or None if we serve the group now.

        Offset and admin APIs accept the empty group id (as Kafka, for old simple consumers);
        the group management APIs do not."""
        if group_id is None or (not group_id and api in _GROUP_MANAGEMENT_APIS):
            return ErrorCode.invalid_group_id
        if not self.active:
            return ErrorCode.coordinator_not_available
        return self.manager.status(group_id)

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
                assignment = {m: assignments.get(m, b"") for m in group.members}
                self.store.store_group(
                    group,
                    assignment,
                    lambda error: self._on_assignment_stored(
                        group, generation_id, member_id, assignment, error
                    ),
                )
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

    def _on_assignment_stored(
        self,
        group: GroupMetadata,
        generation_id: int,
        leader_id: str,
        assignment: Mapping[str, bytes],
        error: ErrorCode,
    ) -> None:
        """The leader's assignment is in the offsets topic (or failed to get there): hand it out,
        unless the group moved on meanwhile (another member joined, a new generation began)."""
        if (
            group.state is not GroupState.COMPLETING_REBALANCE
            or group.generation_id != generation_id
        ):
            return
        if error is not ErrorCode.none:
            self._reset_and_propagate_assignment_error(group, error)
            self._maybe_prepare_rebalance(
                group, f"storing the assignment of leader {leader_id} failed ({error.name})"
            )
            return
        for member in group.members.values():
            member.assignment = assignment.get(member.member_id, b"")
        self._propagate_assignment(group, ErrorCode.none)
        group.transition_to(GroupState.STABLE, self.clock_ms())

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
        error = self._validate_generation_member(group, member_id, group_instance_id, generation_id)
        if error is not None:
            return error
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
        error = self._validate_generation_member(group, member_id, group_instance_id, generation_id)
        if error is not None:
            return error
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

    def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> dict[TopicPartition, ErrorCode] | Awaitable[dict[TopicPartition, ErrorCode]]:
        """Handle an OffsetCommit's valid partitions: judged now, in request order; stored through
        the metadata manager (appended now, answered once committed).

        Generation -1 with no member id is a consumer that manages partitions itself: allowed
        while the group has no members (the group is created, Empty, if it does not exist).
        Otherwise the committer must be a current member of the current generation; a valid
        commit counts as a heartbeat."""
        error, group = self._validate_offset_commit(
            group_id, member_id, group_instance_id, generation_id
        )
        if error is not ErrorCode.none or group is None:
            return dict.fromkeys(offsets, error)
        self.offset_commits += len(offsets)
        return self.manager.store_offsets(group, offsets)

    def _validate_offset_commit(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> tuple[ErrorCode, GroupMetadata | None]:
        error = self.validate_group_status(group_id, ApiKey.OFFSET_COMMIT)
        if error is not None:
            return error, None
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                # A member of a generation this coordinator does not know: it must rejoin.
                return ErrorCode.illegal_generation, None
            group = self.groups[group_id] = GroupMetadata(
                group_id, state_timestamp_ms=self.clock_ms()
            )
            return ErrorCode.none, group
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, None
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = self._validate_generation_member(
                group, member_id, group_instance_id, generation_id
            )
            if error is not None:
                return error, None
        elif group.state is not GroupState.EMPTY:
            return ErrorCode.unknown_member_id, None
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress, None
        member = group.members.get(member_id)
        if member is not None:
            self._schedule_heartbeat_expiration(group, member, member.session_timeout_ms)
        return ErrorCode.none, group

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> tuple[ErrorCode, Awaitable[dict[TopicPartition, OffsetAndMetadata]] | None]:
        """(error, the committed offsets once this group's earlier commits settled)."""
        error = self.validate_group_status(group_id, ApiKey.OFFSET_FETCH)
        if error is not None:
            return error, None
        return ErrorCode.none, self.manager.fetch_offsets(group_id, partitions)

    def list_groups(self, states: Iterable[str] = ()) -> tuple[ErrorCode, list[GroupOverview]]:
        """The groups held here (filtered by state names, case-insensitively), with
        COORDINATOR_LOAD_IN_PROGRESS while a partition is loading (the list may miss its groups)."""
        if not self.active:
            return ErrorCode.coordinator_not_available, []
        wanted = {state.lower() for state in states}
        groups = [
            group.overview()
            for group in self.groups.values()
            if group.state is not GroupState.DEAD
            and self.manager.status(group.group_id) is None
            and (not wanted or group.state.value.lower() in wanted)
        ]
        error = (
            ErrorCode.coordinator_load_in_progress if self.manager.is_loading else ErrorCode.none
        )
        return error, groups

    def describe_group(self, group_id: str) -> tuple[ErrorCode, GroupSummary]:
        """(error, summary); a group this coordinator does not hold is Dead, as in Kafka."""
        error = self.validate_group_status(group_id, ApiKey.DESCRIBE_GROUPS)
        if error is not None:
            return error, DEAD_GROUP
        group = self.groups.get(group_id)
        return ErrorCode.none, (group.summary() if group is not None else DEAD_GROUP)

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """Delete Empty groups with their offsets (tombstones for both): NONE, NON_EMPTY_GROUP,
        GROUP_ID_NOT_FOUND or a status error."""
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
                self.manager.delete_group(group)
                results[group_id] = ErrorCode.none
            else:
                results[group_id] = ErrorCode.non_empty_group
        return results

    def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete (KIP-496): (group error, per-partition errors). An Empty group loses the
        offsets asked for; a consumer group that is not Empty loses those of topics no member
        subscribes to (GROUP_SUBSCRIBED_TO_TOPIC for the others); any other non-empty group
        refuses (NON_EMPTY_GROUP)."""
        error = self.validate_group_status(group_id, ApiKey.OFFSET_DELETE)
        if error is not None:
            return error, {}
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.group_id_not_found, {}
        results: dict[TopicPartition, ErrorCode] = {}
        if group.state is GroupState.EMPTY:
            deletable = list(partitions)
        elif group.protocol_type == "consumer":
            deletable = []
            for partition in partitions:
                if group.is_subscribed_to(partition[0]):
                    results[partition] = ErrorCode.group_subscribed_to_topic
                else:
                    deletable.append(partition)
        else:
            return ErrorCode.non_empty_group, {}
        self.manager.delete_offsets(group, deletable)
        results.update(dict.fromkeys(deletable, ErrorCode.none))
        return ErrorCode.none, results

    def _maybe_discard(self, group: GroupMetadata) -> None:
        """Drop a group that never had a generation, has nobody in it and no offsets (a refused
        first join): there is nothing to remember, and junk requests must not grow the table."""
        if (
            group.state is GroupState.EMPTY
            and group.generation_id == 0
            and not group.members
            and not group.pending_members
            and not group.offsets
            and self.groups.get(group.group_id) is group
        ):
            del self.groups[group.group_id]
