"""One topic partition on this broker: its role (leader or follower), ISR, high watermark and waiters.

The controller decides roles with LeaderAndIsr; `make_leader` / `make_follower` apply a partition state
only if its leader epoch is newer than the one this broker holds (the replica manager checks that before
calling). As leader the partition:

- appends produce requests to its log (`append_records_to_leader`), refusing acks=all writes when the
  committed ISR is smaller than `min.insync.replicas` (NOT_ENOUGH_REPLICAS);
- tracks each follower's log end offset and last caught-up time from its fetches
  (`update_follower_fetch_state`), expands the ISR when a follower reaches the high watermark and the
  start of the current leader epoch, and shrinks it when a follower has not caught up for
  `replica.lag.time.max.ms` (`maybe_shrink_isr`);
- writes each ISR change to the partition state znode *conditionally on the znode version* the
  controller gave it. If that write fails because the znode changed, this broker is a zombie leader
  (the controller has moved on): it stops accepting writes for the partition (`fenced`) until the next
  LeaderAndIsr tells it its role;
- keeps the high watermark (see `odradek.cluster.isr`) and wakes delayed produce requests waiting for
  acks=all and delayed fetches waiting for data;
- moves its log start offset for DeleteRecords (`delete_records_on_leader`, at most to the HW) and
  tracks each follower's log start offset from its fetches, so that DeleteRecords can wait until
  the *low watermark* -- the smallest log start offset of the leader and its ISR followers -- has
  reached the new start (Kafka's DelayedDeleteRecords; Kafka counts every live replica, Odradek
  the ISR: a replica outside it learns the new start from its next fetch response).

The leader's ISR and HW maintenance (follower fetch state, expand/shrink, the conditional ISR
write, advancing the HW) is in `partition_isr`, a base of `Partition`.

As follower it only holds its log; the replica fetcher appends what the leader sends and moves the
follower's HW to min(leader HW, own LEO).

Concurrency: owned by the broker's event loop thread; no locks. Calls that write to ZooKeeper start a
task and record the change as pending in the ISR state, so no other change starts meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from odradek.cluster.broker_topic_stats import BrokerTopicStats
from odradek.cluster.isr import CommittedIsr, IsrState
from odradek.cluster.partition_isr import FollowerState, IsrWriter, PartitionIsr, QuietWatcher
from odradek.errors import (
    FencedLeaderEpochError,
    KafkaError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    UnknownLeaderEpochError,
)
from odradek.protocol.fetch_response import FileRecords
from odradek.protocol.record_batch import iter_batches

log = logging.getLogger(__name__)

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class PartitionStateInfo:
    """The part of a LeaderAndIsr partition state that the broker applies."""

    controller_epoch: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    zk_version: int
    replicas: tuple[int, ...]
    is_new: bool = False


class ReadResult(NamedTuple):
    """One partition's read. A named tuple rather than a frozen dataclass: a fetch makes one per
    partition it names (thousands for an idle follower's session), and a tuple is built in
    under half the time."""

    records: bytes | FileRecords
    """Bytes, or with a zero-copy read a range of a segment file."""
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int = -1
    aborted_transactions: list[tuple[int, int]] | None = None
    """(producer id, first offset) of the aborted transactions a read_committed read overlaps;
    None for other reads."""


class DataWaitable(Protocol):
    """What a delayed fetch waits on: a partition, or a follower's fetch session."""

    def register_data_waiter(self, future: asyncio.Future[None]) -> None: ...

    def unregister_data_waiter(self, future: asyncio.Future[None]) -> None: ...


class Partition(PartitionIsr):
    """A partition replica hosted by this broker. Event-loop thread only."""

    def __init__(
        self,
        topic: str,
        partition: int,
        local_broker_id: int,
        log: Any,
        isr_writer: IsrWriter,
        on_isr_change: Callable[[str, int], None],
        min_insync_replicas: Callable[[], int],
        replica_lag_time_max_ms: int,
        stats: BrokerTopicStats | None = None,
    ) -> None:
        self.topic = topic
        self._stats = stats  # IsrShrinksPerSec / IsrExpandsPerSec, counted on a committed change
        self.partition = partition
        self.local_broker_id = local_broker_id
        self.log = log
        self._isr_writer = isr_writer
        self._on_isr_change = on_isr_change
        self._min_insync_replicas = min_insync_replicas
        self.replica_lag_time_max = replica_lag_time_max_ms / 1000.0

        self.leader_id = NO_LEADER
        self.leader_epoch = -1
        self.leader_epoch_start_offset = -1
        self.partition_epoch = -1  # version of the partition state znode
        self.controller_epoch = -1
        self.assignment: tuple[int, ...] = ()
        self._quiet_watchers: dict[tuple[int, Any], tuple[QuietWatcher, Any]] = {}
        self._isr_state: IsrState = CommittedIsr(frozenset())
        self.followers: dict[int, FollowerState] = {}
        self.high_watermark = 0
        self.leader_high_watermark = -1  # as follower: the HW of the leader's last fetch answer
        self.fenced = False
        self._hw_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._low_watermark_waiters: list[tuple[int, asyncio.Future[int]]] = []
        self._data_waiters: set[asyncio.Future[None]] = set()
        self._isr_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.partition})"

    # role

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_broker_id

    @property
    def isr(self) -> frozenset[int]:
        return self.isr_state.isr

    @property
    def is_under_replicated(self) -> bool:
        """Led here with an ISR smaller than the assignment (Kafka's isUnderReplicated)."""
        return self.is_leader and len(self.isr) < len(self.assignment)

    @property
    def is_under_min_isr(self) -> bool:
        """Led here with fewer in-sync replicas than min.insync.replicas."""
        return self.is_leader and len(self.isr) < self._min_insync_replicas()

    @property
    def is_at_min_isr(self) -> bool:
        """Led here with exactly min.insync.replicas in-sync replicas (Kafka's isAtMinIsr): one
        more loss and acks=all produce fails."""
        return self.is_leader and len(self.isr) == self._min_insync_replicas()

    @property
    def log_end_offset(self) -> int:
        return int(self.log.log_end_offset)

    @property
    def log_start_offset(self) -> int:
        return int(self.log.log_start_offset)

    def make_leader(self, state: PartitionStateInfo, now: float | None = None) -> bool:
        """Become (or stay) leader with the controller's state; returns True if newly leader.

        Steps: (1) take assignment, ISR, leader epoch and znode version from the request; (2) record
        the new epoch's start offset (our LEO) in the leader epoch cache, so followers can truncate to
        it; (3) reset follower tracking, counting ISR members as caught up now so they are not dropped
        before they have had a chance to fetch; (4) re-evaluate the HW.
        """
        now = time.monotonic() if now is None else now
        was_leader = self.is_leader
        if state.leader_epoch != self.leader_epoch or not was_leader:
            # First, before any state changes: a failed log directory (KafkaStorageError) must
            # leave the partition as it was.
            self.log.assign_leader_epoch(state.leader_epoch, self.log_end_offset)
            self.leader_epoch_start_offset = self.log_end_offset
        self.controller_epoch = state.controller_epoch
        self.assignment = tuple(state.replicas)
        self.isr_state = CommittedIsr(frozenset(state.isr))
        self.partition_epoch = state.zk_version
        self.fenced = False
        self.leader_epoch = state.leader_epoch
        self.leader_id = self.local_broker_id
        followers = {}
        for replica in self.assignment:
            if replica == self.local_broker_id:
                continue
            previous = self.followers.get(replica) if was_leader else None
            followers[replica] = previous or FollowerState(
                last_caught_up_time=now if replica in state.isr else 0.0
            )
        self.followers = followers
        if self.high_watermark > self.log_end_offset:
            self.high_watermark = self.log_end_offset
        self._maybe_increment_high_watermark()
        self._wake_data_waiters()
        return not was_leader

    def make_follower(self, state: PartitionStateInfo) -> bool:
        """Become follower of `state.leader`; returns True if the leader changed (refetch needed)."""
        leader_changed = self.leader_id != state.leader or self.leader_epoch != state.leader_epoch
        self.controller_epoch = state.controller_epoch
        self.assignment = tuple(state.replicas)
        self.isr_state = CommittedIsr(frozenset(state.isr))
        self.partition_epoch = state.zk_version
        self.leader_epoch = state.leader_epoch
        self.leader_epoch_start_offset = -1
        self.leader_id = state.leader
        self.followers = {}
        self.fenced = False
        self._fail_hw_waiters(NotLeaderOrFollowerError(f"{self} is no longer the leader"))
        self._wake_data_waiters()
        return leader_changed

    def make_offline(self, error: KafkaError | None = None) -> None:
        """Stop serving (StopReplica, deletion, a failed log directory): fail every waiter with
        `error` (NOT_LEADER_OR_FOLLOWER by default)."""
        self.leader_id = NO_LEADER
        self._fail_hw_waiters(error or NotLeaderOrFollowerError(f"{self} was stopped"))
        self._wake_data_waiters()

    def fence(self, reason: str) -> None:
        """Stop taking writes as leader until the next LeaderAndIsr (a zombie leader)."""
        if self.is_leader and not self.fenced:
            log.warning(
                "%s: fenced (%s): no writes until the controller tells us our role", self, reason
            )
        self.fenced = True
        self.wake_quiet()
        self._fail_hw_waiters(NotLeaderOrFollowerError(f"{self}: leadership is being moved"))

    # leader: appends

    def check_leader_epoch(self, current_leader_epoch: int | None) -> None:
        """Fencing of clients and followers that carry a leader epoch (KIP-320)."""
        if current_leader_epoch is None or current_leader_epoch < 0:
            return
        if current_leader_epoch < self.leader_epoch:
            raise FencedLeaderEpochError(
                f"{self}: leader epoch {current_leader_epoch} is older than {self.leader_epoch}"
            )
        if current_leader_epoch > self.leader_epoch:
            raise UnknownLeaderEpochError(
                f"{self}: leader epoch {current_leader_epoch} is newer than {self.leader_epoch}"
            )

    def append_records_to_leader(
        self,
        records: bytes,
        required_acks: int,
        now_ms: int,
        *,
        validated: Any = None,
        budget: int | None = None,
        origin: Any = None,
    ) -> Any:
        """Validate and append a produce request's records; returns the log's LogAppendInfo.
        `origin` is the log's AppendOrigin (CLIENT unless given: the transaction markers the
        broker writes are COORDINATOR).

        `budget` and `validated` go to `Log.append_as_leader`: the validation work allowed on
        this (the event loop's) thread, or its result from a worker thread."""
        if not self.is_leader or self.fenced:
            raise NotLeaderOrFollowerError(
                f"broker {self.local_broker_id} is not the leader of {self}"
            )
        min_isr = self._min_insync_replicas()
        if required_acks == -1 and len(self.isr) < min_isr:
            raise NotEnoughReplicasError(
                f"{self}: ISR {sorted(self.isr)} is smaller than min.insync.replicas={min_isr}"
            )
        extra = {} if origin is None else {"origin": origin}
        info = self.log.append_as_leader(
            records, self.leader_epoch, now_ms, validated=validated, budget=budget, **extra
        )
        self._maybe_increment_high_watermark()
        self._wake_data_waiters()
        return info

    def wait_for_high_watermark(self, required_offset: int) -> asyncio.Future[None]:
        """A future resolved when the HW reaches `required_offset` (acks=all).

        It fails with NOT_LEADER_OR_FOLLOWER if leadership is lost first, and with
        NOT_ENOUGH_REPLICAS_AFTER_APPEND if, when the HW gets there, the ISR is below
        min.insync.replicas (the write is committed but not as durable as asked).
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.high_watermark >= required_offset:
            self._complete_hw_waiter(future)
        else:
            self._hw_waiters.append((required_offset, future))
        return future

    def _complete_hw_waiter(self, future: asyncio.Future[None]) -> None:
        if future.done():
            return
        min_isr = self._min_insync_replicas()
        if len(self.isr) < min_isr:
            future.set_exception(
                NotEnoughReplicasAfterAppendError(
                    f"{self}: ISR {sorted(self.isr)} shrank below min.insync.replicas={min_isr}"
                )
            )
        else:
            future.set_result(None)

    def _fail_hw_waiters(self, error: Exception) -> None:
        waiters, self._hw_waiters = self._hw_waiters, []
        low, self._low_watermark_waiters = self._low_watermark_waiters, []
        futures: list[asyncio.Future[Any]] = [f for _o, f in waiters] + [f for _o, f in low]
        for future in futures:
            if not future.done():
                future.set_exception(error)
                future.exception()  # its producer may have gone: don't report it as unretrieved

    # leader: DeleteRecords

    def delete_records_on_leader(self, offset: int) -> int:
        """Move the log start offset to `offset` (-1: the high watermark); returns the new log
        start offset. OFFSET_OUT_OF_RANGE for a negative offset or one past the HW (records that
        are not committed cannot be deleted)."""
        if not self.is_leader or self.fenced:
            raise NotLeaderOrFollowerError(
                f"broker {self.local_broker_id} is not the leader of {self}"
            )
        target = self.high_watermark if offset == -1 else offset
        if target < 0 or target > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"{self}: cannot delete records before offset {offset}: the high watermark is "
                f"{self.high_watermark}"
            )
        if self.log.maybe_increment_log_start_offset(target):
            log.info("%s: log start offset moved to %d (DeleteRecords)", self, target)
            self.wake_quiet()
        self._maybe_complete_low_watermark_waiters()
        return self.log_start_offset

    @property
    def low_watermark(self) -> int:
        """The smallest log start offset of the leader and its ISR followers (-1 if unknown)."""
        starts = [self.log_start_offset]
        for replica in self.isr:
            if replica == self.local_broker_id:
                continue
            follower = self.followers.get(replica)
            starts.append(follower.log_start_offset if follower is not None else -1)
        return min(starts)

    def wait_for_low_watermark(self, required_offset: int) -> asyncio.Future[int]:
        """A future of the low watermark once it reaches `required_offset`; it fails with
        NOT_LEADER_OR_FOLLOWER if leadership is lost first."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._low_watermark_waiters.append((required_offset, future))
        self._maybe_complete_low_watermark_waiters()
        return future

    def _maybe_complete_low_watermark_waiters(self) -> None:
        if not self._low_watermark_waiters:
            return
        low = self.low_watermark
        remaining = []
        for required, future in self._low_watermark_waiters:
            if future.done():
                continue
            if low >= required:
                future.set_result(low)
            else:
                remaining.append((required, future))
        self._low_watermark_waiters = remaining

    # reads

    def read_records(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        from_follower: bool,
        current_leader_epoch: int | None = None,
        min_one_batch: bool = True,
        read_committed: bool = False,
        zero_copy: bool = False,
    ) -> ReadResult:
        """Read for a consumer (up to the HW; with `read_committed` up to the last stable
        offset, with the aborted transactions among the records read) or a follower (up to
        the LEO). With `zero_copy` the records are a range of a segment file (`FileRecords`),
        for sendfile; a read_committed read's aborted transactions are those below the offset
        of the batch that follows the range (as Kafka bounds them by its fetch upper bound)."""
        if not self.is_leader:
            raise NotLeaderOrFollowerError(
                f"broker {self.local_broker_id} is not the leader of {self}"
            )
        self.check_leader_epoch(current_leader_epoch)
        log_end_offset = self.log_end_offset
        high_watermark = self.high_watermark
        if fetch_offset > log_end_offset or fetch_offset < self.log_start_offset:
            raise OffsetOutOfRangeError(
                f"{self}: offset {fetch_offset} is outside [{self.log_start_offset}, {log_end_offset}]"
            )
        last_stable_offset = self.log.last_stable_offset(high_watermark)
        max_offset = None if from_follower else high_watermark
        if read_committed and not from_follower:
            max_offset = last_stable_offset
        limit = log_end_offset if max_offset is None else min(max_offset, log_end_offset)
        if fetch_offset >= limit and not self.log.closed:
            # Nothing to read (a caught-up follower or consumer: most partitions of an idle
            # session); the log's read would answer the same, b"" and no aborted transactions.
            return ReadResult(
                b"",
                high_watermark,
                self.log_start_offset,
                log_end_offset,
                last_stable_offset,
                [] if read_committed and not from_follower else None,
            )
        if zero_copy:
            found = self.log.read_file_records(fetch_offset, max_bytes, max_offset, min_one_batch)
            aborted: list[tuple[int, int]] | None = None
            if read_committed and not from_follower:
                aborted = []
                if isinstance(found, FileRecords):
                    upper = min(self.log.offset_after_range(found), last_stable_offset)
                    aborted = self._aborted_between(fetch_offset, upper)
            return ReadResult(
                found,
                high_watermark,
                self.log_start_offset,
                log_end_offset,
                last_stable_offset,
                aborted,
            )
        records = bytes(self.log.read(fetch_offset, max_bytes, max_offset, min_one_batch))
        aborted = None
        if read_committed and not from_follower:
            aborted = []
            if records:
                upper = fetch_offset
                for header in iter_batches(records):
                    upper = header.next_offset
                aborted = self._aborted_between(fetch_offset, upper)
        return ReadResult(
            records,
            high_watermark,
            self.log_start_offset,
            log_end_offset,
            last_stable_offset,
            aborted,
        )

    def diverges(self, fetch: Any) -> bool:
        """Does a follower's last fetched epoch end before its fetch offset in our log? (`fetch`
        has `last_fetched_epoch` and `fetch_offset`.) An epoch we do not know is not taken as
        divergence: the follower truncates by OffsetForLeaderEpoch before fetching."""
        if fetch.last_fetched_epoch < 0:
            return False
        cache = self.log.leader_epoch_cache
        if fetch.last_fetched_epoch == cache.latest_epoch:
            return False  # that epoch ends at our LEO, which the read found >= the fetch offset
        epoch, end_offset = cache.end_offset_for(fetch.last_fetched_epoch, self.log_end_offset)
        if epoch < 0:
            return False
        return epoch < fetch.last_fetched_epoch or end_offset < fetch.fetch_offset

    def _aborted_between(self, start: int, upper: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a read of [start, upper)
        overlaps, for a read_committed answer."""
        return [
            (txn.producer_id, txn.first_offset)
            for txn in self.log.collect_aborted_transactions(start, upper)
        ]

    def register_data_waiter(self, future: asyncio.Future[None]) -> None:
        self._data_waiters.add(future)

    def unregister_data_waiter(self, future: asyncio.Future[None]) -> None:
        self._data_waiters.discard(future)

    def _wake_data_waiters(self) -> None:
        self.wake_quiet()
        if not self._data_waiters:
            return
        waiters, self._data_waiters = self._data_waiters, set()
        for future in waiters:
            if not future.done():
                future.set_result(None)

    # follower

    def update_follower_high_watermark(self, leader_high_watermark: int) -> None:
        """As follower: HW = min(leader's HW, own LEO); never decreases."""
        self.leader_high_watermark = leader_high_watermark  # ReplicaFetcherManager MaxLag
        new_high_watermark = min(leader_high_watermark, self.log_end_offset)
        if new_high_watermark > self.high_watermark:
            self.high_watermark = new_high_watermark
            self.log.on_high_watermark_updated(new_high_watermark)

    def truncate_to(self, offset: int) -> None:
        self.log.truncate_to(offset)
        self.wake_quiet()
        if self.high_watermark > self.log_end_offset:
            self.high_watermark = self.log_end_offset
