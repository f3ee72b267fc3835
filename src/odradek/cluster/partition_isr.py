"""The leader's side of a partition's ISR and high watermark: followers' fetch state, ISR expansion
and shrinking, the conditional ISR write, and advancing the HW.

The rules (Kafka's): a follower is caught up at time t if it has fetched everything the leader had
at t; it joins the ISR when its LEO reaches the HW and the start of the current leader epoch, and
leaves it when it has not caught up for `replica.lag.time.max.ms`. Each change is written to the
partition state znode conditionally on the znode version the controller gave the leader (through
an `IsrWriter`; `isr_writes` batches them); while the write is in flight the ISR state is pending
(`odradek.cluster.isr`) and no other change starts. A rejected write fences the leader until the
next LeaderAndIsr. The HW is the smallest LEO of the maximal ISR (see `odradek.cluster.isr`); it
moves on a follower's fetch and on a committed ISR change, and wakes acks=all producers and
delayed fetches.

`PartitionIsr` is a base of `Partition` (partition.py); it works on the fields
`Partition.__init__` sets, declared below.

Concurrency: the broker's event loop thread only, like `Partition`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from odradek.cluster.broker_topic_stats import BrokerTopicStats
from odradek.cluster.isr import CommittedIsr, IsrState, PendingExpandIsr, PendingShrinkIsr
from odradek.zk.errors import SessionExpiredError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FollowerState:
    """What the leader knows about one follower, from its fetch requests."""

    log_end_offset: int = -1
    last_caught_up_time: float = 0.0
    last_fetch_leader_log_end_offset: int = -1
    last_fetch_time: float = 0.0
    log_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class IsrUpdate:
    """An ISR write the leader asks ZooKeeper for (conditional on `zk_version`)."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    zk_version: int


QuietToken = tuple[Any, int, IsrState, tuple[int, ...], int, int, int]
"""(log, leader epoch, ISR state, assignment, LEO, HW, log start offset): see
`PartitionIsr.quiet_follower_token`."""


class QuietWatcher(Protocol):
    """A follower's fetch session holding a quiet mark on a partition (`server/fetch_quiet`)."""

    def wake(self, key: Any, partition: Any) -> None:
        """The partition changed: its mark under `key` no longer holds."""


IsrWriter = Callable[[IsrUpdate], Awaitable[int | None]]
"""Writes an ISR update; returns the new znode version, or None if the conditional write failed."""


class PartitionIsr:
    """The leader's ISR and HW maintenance of a `Partition` (see the module docstring)."""

    # set by Partition.__init__
    topic: str
    partition: int
    local_broker_id: int
    leader_id: int
    log: Any
    _isr_writer: IsrWriter
    _on_isr_change: Callable[[str, int], None]
    _stats: BrokerTopicStats | None
    replica_lag_time_max: float
    leader_epoch: int
    leader_epoch_start_offset: int
    partition_epoch: int
    controller_epoch: int
    assignment: tuple[int, ...]
    _isr_state: IsrState
    _quiet_watchers: dict[tuple[int, Any], tuple[QuietWatcher, Any]]
    followers: dict[int, FollowerState]
    high_watermark: int
    fenced: bool
    _hw_waiters: list[tuple[int, asyncio.Future[None]]]
    _isr_task: asyncio.Task[None] | None

    if TYPE_CHECKING:  # defined by Partition

        @property
        def is_leader(self) -> bool: ...

        @property
        def isr(self) -> frozenset[int]: ...

        @property
        def log_end_offset(self) -> int: ...

        def fence(self, reason: str) -> None: ...

        def _complete_hw_waiter(self, future: asyncio.Future[None]) -> None: ...

        def _wake_data_waiters(self) -> None: ...

        def _maybe_complete_low_watermark_waiters(self) -> None: ...

    # leader: followers, ISR and HW

    def update_follower_fetch_state(
        self, follower_id: int, fetch_offset: int, now: float, log_start_offset: int = -1
    ) -> None:
        """Record a follower's fetch: its LEO is the offset it asks for (and its log start offset
        the one it reports).

        A follower is caught up at time t if it has fetched everything the leader had at t: either this
        fetch reaches the leader's current LEO, or it reaches the LEO the leader had at the follower's
        previous fetch (then it was caught up as of that previous fetch).
        """
        follower = self.followers.get(follower_id)
        if follower is None:
            return
        # An idle in-sync follower fetching at the same offset again (the common case with
        # thousands of idle partitions) cannot move the ISR, the HW or the low watermark.
        unchanged = follower.log_end_offset == fetch_offset and (
            log_start_offset < 0 or follower.log_start_offset == log_start_offset
        )
        leader_log_end_offset = self.log_end_offset
        if fetch_offset >= leader_log_end_offset:
            follower.last_caught_up_time = max(follower.last_caught_up_time, now)
        elif fetch_offset >= follower.last_fetch_leader_log_end_offset:
            follower.last_caught_up_time = max(
                follower.last_caught_up_time, follower.last_fetch_time
            )
        follower.log_end_offset = fetch_offset
        follower.last_fetch_leader_log_end_offset = leader_log_end_offset
        follower.last_fetch_time = now
        if log_start_offset >= 0:
            follower.log_start_offset = log_start_offset
        if unchanged and not self.isr_state.is_pending and follower_id in self.isr:
            return
        self._maybe_expand_isr(follower_id, follower)
        self._maybe_increment_high_watermark()
        self._maybe_complete_low_watermark_waiters()

    @property
    def isr_state(self) -> IsrState:
        return self._isr_state

    @isr_state.setter
    def isr_state(self, state: IsrState) -> None:
        self._isr_state = state
        self.wake_quiet()

    def watch_quiet(self, watcher: QuietWatcher, key: Any) -> None:
        """`watcher` marked this partition quiet under `key`: tell it (once) when anything a
        follower's fetch depends on may have changed (`wake_quiet`)."""
        self._quiet_watchers[(id(watcher), key)] = (watcher, key)

    def unwatch_quiet(self, watcher: QuietWatcher, key: Any) -> None:
        self._quiet_watchers.pop((id(watcher), key), None)

    def wake_quiet(self) -> None:
        """Something a quiet mark depends on changed (an append, the HW, the ISR, the role, the
        log start offset, fencing): every session marking this partition quiet reads it again."""
        if self._quiet_watchers:
            watchers, self._quiet_watchers = self._quiet_watchers, {}
            for watcher, key in watchers.values():
                watcher.wake(key, self)

    def quiet_follower_token(self, follower_id: int, fetch_offset: int) -> QuietToken | None:
        """For an incremental fetch session: the state a follower's fetch at `fetch_offset`
        depends on, when that fetch has nothing to read and cannot move the ISR, the HW or the
        low watermark (led here, not fenced, the ISR settled with the follower in it, and the
        follower's last counted fetch at our LEO); None otherwise. While the token stays the
        same, a fetch at the same offset would be answered as the last one was, and only the
        follower's caught-up time moves (`refresh_quiet_follower`)."""
        if (
            not self.is_leader
            or self.fenced
            or self.isr_state.is_pending
            or follower_id not in self.isr_state.isr
            or self.log.closed
        ):
            return None
        follower = self.followers.get(follower_id)
        log_end_offset = self.log_end_offset
        if (
            follower is None
            or follower.log_end_offset != fetch_offset
            or fetch_offset != log_end_offset
        ):
            return None
        return self._quiet_state()

    def _quiet_state(self) -> QuietToken:
        log_ = self.log
        return (
            log_,
            self.leader_epoch,
            self.isr_state,
            self.assignment,
            log_.log_end_offset,
            self.high_watermark,
            log_.log_start_offset,
        )

    def refresh_quiet_follower(
        self,
        follower_id: int,
        fetch_offset: int,
        log_start_offset: int,
        token: QuietToken,
        now: float,
    ) -> bool:
        """A fetch of a session partition whose parameters and `quiet_follower_token` are what
        they were at its last answer: record the fetch as `update_follower_fetch_state` would
        (the follower is caught up now) and return True; False, with nothing changed, if the
        token differs (the partition must be read)."""
        if (
            self._quiet_state() != token
            or self.leader_id != self.local_broker_id
            or self.fenced
            or self.log.closed
        ):
            return False
        follower = self.followers.get(follower_id)
        if follower is None or follower.log_end_offset != fetch_offset:
            return False
        # What update_follower_fetch_state does for a follower in the ISR, with nothing pending,
        # fetching at the LEO again (a token is made only then, and the ISR state is the same):
        # inlined, since this runs for thousands of partitions per fetch.
        if now > follower.last_caught_up_time:
            follower.last_caught_up_time = now
        follower.last_fetch_leader_log_end_offset = fetch_offset
        follower.last_fetch_time = now
        if log_start_offset >= 0:
            follower.log_start_offset = log_start_offset
        return True

    def _maybe_expand_isr(self, follower_id: int, follower: FollowerState) -> None:
        if self.isr_state.is_pending or self.fenced or follower_id in self.isr:
            return
        if follower_id not in self.assignment:
            return
        if (
            follower.log_end_offset >= self.high_watermark
            and follower.log_end_offset >= self.leader_epoch_start_offset
        ):
            self._submit_isr_change(PendingExpandIsr(self.isr, follower_id))

    def out_of_sync_replicas(self, now: float) -> frozenset[int]:
        return frozenset(
            replica
            for replica in self.isr
            if replica != self.local_broker_id
            and replica in self.followers
            and now - self.followers[replica].last_caught_up_time > self.replica_lag_time_max
        )

    def maybe_shrink_isr(self, now: float) -> None:
        """Drop followers that have not caught up for replica.lag.time.max.ms (called periodically)."""
        if not self.is_leader or self.isr_state.is_pending or self.fenced:
            return
        out_of_sync = self.out_of_sync_replicas(now)
        if out_of_sync:
            log.info(
                "%s: shrinking ISR from %s to %s (out of sync: %s)",
                self,
                sorted(self.isr),
                sorted(self.isr - out_of_sync),
                sorted(out_of_sync),
            )
            self._submit_isr_change(PendingShrinkIsr(self.isr, out_of_sync))

    def _submit_isr_change(self, pending: PendingExpandIsr | PendingShrinkIsr) -> None:
        if isinstance(pending, PendingExpandIsr):
            new_isr = pending.isr | {pending.new_in_sync_replica}
        else:
            new_isr = pending.isr - pending.out_of_sync_replicas
        self.isr_state = pending
        update = IsrUpdate(
            topic=self.topic,
            partition=self.partition,
            leader=self.local_broker_id,
            leader_epoch=self.leader_epoch,
            isr=tuple(r for r in self.assignment if r in new_isr),
            controller_epoch=self.controller_epoch,
            zk_version=self.partition_epoch,
        )
        self._isr_task = asyncio.get_running_loop().create_task(self._write_isr(update, pending))

    async def _write_isr(
        self, update: IsrUpdate, pending: PendingExpandIsr | PendingShrinkIsr
    ) -> None:
        try:
            new_version = await self._isr_writer(update)
        except SessionExpiredError:
            # Our session expired: the controller has seen this broker die and moved (or is
            # moving) leadership. Like a rejected write, this makes us a zombie until told our role.
            if self.isr_state is pending:
                self.isr_state = CommittedIsr(pending.isr)
            self.fence("the ZooKeeper session expired")
            return
        except Exception as e:  # ZooKeeper unavailable: keep the old ISR, retry on the next trigger
            log.warning("%s: ISR write failed (%s); keeping %s", self, e, sorted(pending.isr))
            if self.isr_state is pending:
                self.isr_state = CommittedIsr(pending.isr)
            return
        if self.isr_state is not pending or self.leader_epoch != update.leader_epoch:
            return  # a LeaderAndIsr superseded this change while it was in flight
        if new_version is None:
            log.warning(
                "%s: ISR write with znode version %d was rejected: the controller has changed the "
                "partition state; not accepting writes until it tells us our role",
                self,
                update.zk_version,
            )
            self.isr_state = CommittedIsr(pending.isr)
            self.fence("the partition state znode changed")
            return
        self.isr_state = CommittedIsr(frozenset(update.isr))
        self.partition_epoch = new_version
        if self._stats is not None:
            if isinstance(pending, PendingExpandIsr):
                self._stats.isr_expands += 1
            else:
                self._stats.isr_shrinks += 1
        log.info("%s: ISR is now %s (znode version %d)", self, list(update.isr), new_version)
        self._on_isr_change(self.topic, self.partition)
        self._maybe_increment_high_watermark()

    def _maybe_increment_high_watermark(self) -> None:
        if not self.is_leader:
            return
        new_high_watermark = self.log_end_offset
        for replica in self.isr_state.maximal_isr:
            if replica == self.local_broker_id:
                continue
            follower = self.followers.get(replica)
            if follower is None or follower.log_end_offset < 0:
                return  # an ISR member we have not heard from yet holds the HW where it is
            new_high_watermark = min(new_high_watermark, follower.log_end_offset)
        if new_high_watermark > self.high_watermark:
            self.high_watermark = new_high_watermark
            self._on_high_watermark_increased()

    def _on_high_watermark_increased(self) -> None:
        high_watermark = self.high_watermark
        self.log.on_high_watermark_updated(high_watermark)
        if self._hw_waiters:
            remaining = []
            for required_offset, future in self._hw_waiters:
                if required_offset <= high_watermark:
                    self._complete_hw_waiter(future)
                elif not future.done():
                    remaining.append((required_offset, future))
            self._hw_waiters = remaining
        self._wake_data_waiters()
