"""Replica fetchers: how a follower copies its leaders' logs (Kafka's ReplicaFetcherThread; the
fetchers are created and removed by `fetcher_manager.ReplicaFetcherManager`).

There is one fetcher per (leader broker, fetcher index) pair — `num.replica.fetchers` per leader —
and each batches every partition this broker follows from that leader into one Fetch request
(`replica_id` = our broker id, so the leader reads up to its log end offset and learns our LEO from
the fetch offsets). A partition enters a fetcher in the *truncating* state:

1. Truncation by leader epoch (KIP-101, KIP-279). The fetcher asks the leader (OffsetForLeaderEpoch)
   where our latest leader epoch ended in its log. If the leader knows that epoch, we truncate to
   min(its end offset, our LEO). If it answers an older epoch, the logs diverged earlier: we look up
   where *that* epoch ends in our log and truncate to the smaller of the two ends, asking again with
   our previous epoch when we do not have the leader's epoch at all. Only the HW is not enough: a
   follower that truncates to a stale HW and then becomes leader loses acknowledged records, and two
   replicas that crash together can keep different records at one offset.
2. Fetching from our LEO, with Fetch v15 in an incremental fetch session (KIP-227,
   `odradek.cluster.fetch_session_handler`: after the first full request, only partitions whose
   fetch offset or epoch changed are sent, and the leader answers only partitions with news): partitions are named by topic id (v13+) and the request
   carries our `ReplicaState` — broker id and broker epoch (the czxid of our registration), which
   the leader checks against ZooKeeper before it lets our fetch move the ISR or the high watermark
   (KIP-903; `odradek.security.controller_requests.validate_follower_fetch`). A partition whose
   topic id we do not know yet waits for LeaderAndIsr or UpdateMetadata to tell us. Returned batches are appended as they are (CRC-checked, never re-encoded);
   our HW becomes min(leader HW, our LEO); a leader log start offset above ours moves ours up.

Errors back a partition off for `replica.fetch.backoff.ms` (NOT_LEADER_OR_FOLLOWER and friends: the
controller will tell us the new leader), OFFSET_OUT_OF_RANGE truncates again (below the leader's log
start: we start our log afresh at the leader's log start offset). A lost connection backs the whole
fetcher off and reconnects.

Replication throttle (KIP-73, `odradek.cluster.replication_quota`): a partition listed in the
topic's `follower.replication.throttled.replicas` for this broker, and not caught up, is left out
of the fetch while the follower throttle's rate is over `follower.replication.throttled.rate`
(looked at again every `THROTTLE_POLL_S`); the bytes fetched for such partitions are recorded.

Concurrency: fetcher tasks run on the broker's event loop; partitions are added and removed by the
replica manager on that same loop, so a response is applied only if the partition is still ours, in
the same leader epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.cluster.fetch_session_handler import FetchSessionHandler, PartitionParams
from odradek.cluster.replication_quota import hold_throttled
from odradek.errors import KafkaError, NetworkError
from odradek.network.client import BrokerConnection
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, request_class

if TYPE_CHECKING:
    from odradek.cluster.fetcher_manager import ReplicaFetcherManager
    from odradek.cluster.partition import Partition

log = logging.getLogger(__name__)

FETCH_VERSION = 15
OFFSET_FOR_LEADER_EPOCH_VERSION = 3
LIST_OFFSETS_VERSION = 6
EARLIEST_TIMESTAMP = -2
MAX_TRUNCATION_ROUNDS = 16
THROTTLE_POLL_S = 0.1
"""How often a throttled partition looks again whether the follower throttle allows a fetch."""

TopicPartition = tuple[str, int]

SESSION_ERRORS = frozenset(
    {
        ErrorCode.fetch_session_id_not_found,
        ErrorCode.invalid_fetch_session_epoch,
        ErrorCode.fetch_session_topic_id_error,
    }
)
"""Answered when our session was evicted or we lost track of its epoch: fetch again at once,
in full (no backoff)."""


class FetcherConfig(Protocol):
    """What the fetchers read from the broker's configuration: its id and the `replica.fetch.*`,
    `replica.socket.timeout.ms` and `num.replica.fetchers` properties by name."""

    @property
    def broker_id(self) -> int: ...

    def __getitem__(self, name: str) -> Any: ...


LeaderAddress = Callable[[int], "tuple[str, int] | None"]
"""A broker id's (host, port) as this broker's metadata knows it, or None."""


@dataclass(slots=True)
class FetchState:
    partition: Partition
    leader_epoch: int
    truncating: bool = True
    delayed_until: float = 0.0
    caught_up: bool = False
    """Our LEO had reached the leader's high watermark at the last fetch (Kafka's
    isReplicaInSync): a caught-up replica is never throttled."""
    last_error: int = 0
    """The error code of the leader's last answer for this partition (0: none): a change is
    logged, a repeat is not (a partition can be refused many times a second)."""
    error_since: float = 0.0
    """When the leader started refusing the partition (time.monotonic()), for the line that
    says it answers again."""

    @property
    def key(self) -> TopicPartition:
        return (self.partition.topic, self.partition.partition)


class ReplicaFetcher:
    """Fetches every partition this broker follows from one leader (one of its fetcher indexes)."""

    def __init__(
        self, manager: ReplicaFetcherManager, leader_id: int, address: tuple[str, int], index: int
    ) -> None:
        self.manager = manager
        self.leader_id = leader_id
        self.address = address
        self.index = index
        self.partitions: dict[TopicPartition, FetchState] = {}
        # Partitions whose leader's answers changed while one answer is processed, by (API or
        # "again", error name): logged together at its end (`_log_changes`).
        self._changes: dict[tuple[str, str], list[tuple[FetchState, float]]] = {}
        self._wakeup = asyncio.Event()
        self._connection: BrokerConnection | None = None
        self.session = FetchSessionHandler()
        """Our incremental fetch session with this leader (KIP-227)."""
        self._session_topic_ids: dict[str, uuid.UUID] = {}
        """The topic id each topic name of the session was last sent with."""
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"replica-fetcher-{manager.broker_id}-{leader_id}-{index}"
        )

    def add(self, partition: Partition) -> None:
        self.partitions[(partition.topic, partition.partition)] = FetchState(
            partition, partition.leader_epoch
        )
        self._wakeup.set()

    def remove(self, key: TopicPartition) -> None:
        self.partitions.pop(key, None)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        if self._connection is not None:
            self._connection.close()

    # the loop

    async def _run(self) -> None:
        config = self.manager.config
        backoff = config["replica.fetch.backoff.ms"] / 1000
        while True:
            if not self.partitions:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                connection = await self._connect()
                now = time.monotonic()
                truncating = [
                    s for s in self.partitions.values() if s.truncating and s.delayed_until <= now
                ]
                if truncating:
                    await self._truncate(connection, truncating)
                ready = [
                    s
                    for s in self.partitions.values()
                    if not s.truncating and s.delayed_until <= time.monotonic()
                ]
                if not ready:
                    await self._sleep_until_ready(backoff)
                    continue
                await self._fetch(connection, ready)
            except asyncio.CancelledError:
                raise
            except NetworkError as e:
                log.info("fetcher from broker %d: %s; backing off", self.leader_id, e)
                if self._connection is not None:
                    self._connection.close()
                self._connection = None
                await asyncio.sleep(backoff)
            except Exception:
                log.exception("fetcher from broker %d failed; backing off", self.leader_id)
                await asyncio.sleep(backoff)

    async def _sleep_until_ready(self, backoff: float) -> None:
        now = time.monotonic()
        # Wake for the first partition whose backoff ends (a truncating one the leader refused
        # included); a partition with no backoff that is still not ready (a truncation that got
        # no answer for it) waits a whole backoff, as before, never a tight loop.
        pending = [s.delayed_until for s in self.partitions.values() if s.delayed_until > now]
        delay = min(pending) - now if pending else backoff
        self._wakeup.clear()
        with contextlib.suppress(TimeoutError):  # not wait_for: it can lose cancellations on 3.11
            async with asyncio.timeout(max(0.01, min(delay, backoff))):
                await self._wakeup.wait()

    async def _connect(self) -> BrokerConnection:
        if self._connection is None or self._connection.closed:
            host, port = self.address
            self._connection = await BrokerConnection.connect(
                host,
                port,
                timeout=self.manager.config["replica.socket.timeout.ms"] / 1000,
                client_id=f"replica-fetcher-{self.manager.broker_id}",
                security=self.manager.security,
            )
        return self._connection

    def _current(self, state: FetchState) -> bool:
        """Is the partition still fetched by us, at the epoch this state was made for?"""
        return (
            self.partitions.get(state.key) is state
            and state.partition.leader_epoch == state.leader_epoch
        )

    def _delay(self, state: FetchState) -> None:
        state.delayed_until = (
            time.monotonic() + self.manager.config["replica.fetch.backoff.ms"] / 1000
        )

    # truncation

    async def _truncate(self, connection: BrokerConnection, states: list[FetchState]) -> None:
        requested: dict[TopicPartition, int] = {}
        for state in states:
            epoch = state.partition.log.leader_epoch_cache.latest_epoch
            if epoch is None or epoch < 0:
                # Nothing to compare: an empty log (or one without epochs) keeps what is below the HW.
                self._finish_truncation(
                    state, min(state.partition.high_watermark, state.partition.log_end_offset)
                )
                continue
            requested[state.key] = epoch
        for _round in range(MAX_TRUNCATION_ROUNDS):
            if not requested:
                return
            answers = await self._offsets_for_leader_epoch(connection, states, requested)
            next_round: dict[TopicPartition, int] = {}
            for key, (error, leader_epoch, end_offset) in answers.items():
                found = self.partitions.get(key)
                if found is None or not self._current(found):
                    continue
                state = found
                if error != ErrorCode.none:
                    self._refused(state, error, "OffsetsForLeaderEpoch")
                    continue
                self._answered(state)
                log_ = state.partition.log
                if leader_epoch < 0 or end_offset < 0:
                    self._finish_truncation(
                        state, min(state.partition.high_watermark, log_.log_end_offset)
                    )
                    continue
                if leader_epoch == requested[key]:
                    self._finish_truncation(state, min(end_offset, log_.log_end_offset))
                    continue
                # The leader's answer is an older epoch: where does that epoch end in our log?
                our_epoch, our_end = log_.leader_epoch_cache.end_offset_for(
                    leader_epoch, log_.log_end_offset
                )
                if our_epoch == leader_epoch:
                    self._finish_truncation(state, min(end_offset, our_end, log_.log_end_offset))
                elif our_epoch < 0:
                    self._finish_truncation(state, min(end_offset, log_.log_end_offset))
                else:
                    next_round[key] = our_epoch
            self._log_changes()
            requested = next_round
        for key in requested:
            left = self.partitions.get(key)
            if left is not None:
                self._finish_truncation(
                    left, min(left.partition.high_watermark, left.partition.log_end_offset)
                )

    def _finish_truncation(self, state: FetchState, offset: int) -> None:
        partition = state.partition
        if offset < partition.log_end_offset:
            log.info(
                "%s: truncating from %d to %d (leader %d, epoch %d)",
                partition,
                partition.log_end_offset,
                offset,
                self.leader_id,
                state.leader_epoch,
            )
            partition.truncate_to(offset)
        state.truncating = False

    async def _offsets_for_leader_epoch(
        self,
        connection: BrokerConnection,
        states: list[FetchState],
        requested: dict[TopicPartition, int],
    ) -> dict[TopicPartition, tuple[int, int, int]]:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        epochs = {s.key: s.leader_epoch for s in states}
        for (topic, partition), epoch in requested.items():
            by_topic.setdefault(topic, []).append(
                {
                    "partition": partition,
                    "current_leader_epoch": epochs.get((topic, partition), -1),
                    "leader_epoch": epoch,
                }
            )
        cls = request_class(ApiKey.OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_VERSION)
        request = build(
            cls,
            {
                "replica_id": self.manager.broker_id,
                "topics": [{"topic": t, "partitions": p} for t, p in by_topic.items()],
            },
        )
        response = await connection.send(
            ApiKey.OFFSET_FOR_LEADER_EPOCH,
            OFFSET_FOR_LEADER_EPOCH_VERSION,
            request,
            timeout=self.manager.config["replica.socket.timeout.ms"] / 1000,
        )
        answers = {}
        for topic in response.topics:
            for p in topic.partitions:
                answers[(topic.topic, p.partition)] = (
                    p.error_code,
                    int(p.leader_epoch),
                    int(p.end_offset),
                )
        return answers

    # fetching

    async def _fetch(self, connection: BrokerConnection, states: list[FetchState]) -> None:
        config = self.manager.config
        wanted: dict[TopicPartition, PartitionParams] = {}
        sent: dict[TopicPartition, FetchState] = {}
        topic_ids: dict[str, uuid.UUID | None] = {}
        partition_max_bytes = config["replica.fetch.max.bytes"]
        throttle = self.manager.throttle
        if throttle is not None and throttle.enabled:
            states = hold_throttled(throttle, states, time.monotonic() + THROTTLE_POLL_S)
        make_params = PartitionParams._make  # a named tuple's __new__ is a Python lambda
        for state in states:
            partition = state.partition
            topic = partition.topic
            if topic not in topic_ids:
                topic_ids[topic] = self.manager.topic_id_for(topic)
            if topic_ids[topic] is None:
                log.info("%s: topic id not known yet; not fetching", partition)
                self._delay(state)
                continue
            key = (topic, partition.partition)
            sent[key] = state
            log_ = partition.log
            latest = log_.leader_epoch_cache.latest_epoch
            wanted[key] = make_params(
                (
                    log_.log_end_offset,
                    log_.log_start_offset,
                    partition_max_bytes,
                    state.leader_epoch,
                    latest if latest is not None else -1,
                )
            )
        if not sent:
            return
        # The session names partitions by topic name, the request by topic id: a name's hash is
        # kept, a UUID's is computed in Python at every look-up (several per partition per
        # fetch). A topic whose id changed since the session named it (deleted and created
        # again) starts the session over.
        session = self.session
        known_ids = self._session_topic_ids
        for topic, topic_id in topic_ids.items():
            if topic_id is not None:
                if known_ids.get(topic, topic_id) != topic_id:
                    session.reset()
                known_ids[topic] = topic_id
        topic_names = {topic_id: topic for topic, topic_id in topic_ids.items() if topic_id}
        data = session.build(wanted)
        by_topic: dict[uuid.UUID, list[dict[str, Any]]] = {}
        for (topic, index), params in data.to_send.items():
            by_topic.setdefault(known_ids[topic], []).append(
                {
                    "partition": index,
                    "current_leader_epoch": params.current_leader_epoch,
                    "fetch_offset": params.fetch_offset,
                    "last_fetched_epoch": params.last_fetched_epoch,
                    "log_start_offset": params.log_start_offset,
                    "partition_max_bytes": params.max_bytes,
                }
            )
        forgotten: dict[Any, list[int]] = {}
        for topic, index in data.to_forget:
            forgotten_id = known_ids.get(topic)
            if forgotten_id is not None:
                forgotten.setdefault(forgotten_id, []).append(index)
        request = build(
            request_class(ApiKey.FETCH, FETCH_VERSION),
            {
                "cluster_id": None,
                "replica_state": {
                    "replica_id": self.manager.broker_id,
                    "replica_epoch": self.manager.broker_epoch(),
                },
                "max_wait": datetime.timedelta(milliseconds=config["replica.fetch.wait.max.ms"]),
                "min_bytes": config["replica.fetch.min.bytes"],
                "max_bytes": config["replica.fetch.response.max.bytes"],
                "isolation_level": 0,
                "session_id": data.session_id,
                "session_epoch": data.epoch,
                "topics": [{"topic_id": t, "partitions": p} for t, p in by_topic.items()],
                "forgotten_topics_data": [
                    {"topic_id": t, "partitions": p} for t, p in forgotten.items()
                ],
                "rack_id": "",
            },
        )
        try:
            response = await connection.send(
                ApiKey.FETCH,
                FETCH_VERSION,
                request,
                timeout=(config["replica.socket.timeout.ms"] + config["replica.fetch.wait.max.ms"])
                / 1000,
            )
        except BaseException:
            session.reset()  # the leader may or may not have moved the session's epoch on
            raise
        session.handle_response(response.error_code != ErrorCode.none, int(response.session_id))
        if response.error_code != ErrorCode.none:
            log.info("fetch from broker %d failed with %s", self.leader_id, response.error_code)
            if response.error_code not in SESSION_ERRORS:
                for state in sent.values():
                    self._delay(state)
            return
        try:
            for topic in response.responses:
                name = topic_names.get(topic.topic_id)
                for item in topic.partitions:
                    answered = sent.get((name, item.partition_index)) if name is not None else None
                    if answered is None or not self._current(answered):
                        continue
                    self._process_partition(answered, item)
        finally:
            self._log_changes()

    def _process_partition(self, state: FetchState, data: Any) -> None:
        partition = state.partition
        error = data.error_code
        if error == ErrorCode.none:
            self._answered(state)
            records = data.records
            if records and self.manager.throttle is not None:
                self.manager.throttle.record_fetched(partition.topic, partition.partition, records)
            if records:
                try:
                    partition.log.append_as_follower(records)
                except KafkaError as e:
                    log.error(
                        "%s: cannot append what leader %d sent: %s", partition, self.leader_id, e
                    )
                    self._delay(state)
                    return
            partition.update_follower_high_watermark(int(data.high_watermark))
            state.caught_up = partition.log.log_end_offset >= int(data.high_watermark)
            leader_log_start = int(data.log_start_offset)
            if leader_log_start > partition.log.log_start_offset:
                moved = partition.log.maybe_increment_log_start_offset(
                    min(leader_log_start, partition.log.log_end_offset)
                )
                # Persisted before the next fetch reports it to the leader (DeleteRecords waits
                # for that report).
                if moved and self.manager.on_log_start_offset_moved is not None:
                    self.manager.on_log_start_offset_moved()
            return
        if error == ErrorCode.offset_out_of_range:
            state.truncating = True
            self.manager.schedule_out_of_range(self, state)
            return
        self._refused(state, error, "Fetch")

    def _answered(self, state: FetchState) -> None:
        if state.last_error:
            self._changes.setdefault(("again", _error_name(state.last_error)), []).append(
                (state, time.monotonic() - state.error_since)
            )
            state.last_error = 0

    def _refused(self, state: FetchState, error: int, api: str) -> None:
        """The leader answered `error` for this partition: ask again after the backoff. Logged
        when the error changes, so that a partition refused for good (a LeaderAndIsr one side
        missed) shows in the log instead of retrying silently."""
        if error != state.last_error:
            if not state.last_error:
                state.error_since = time.monotonic()
            self._changes.setdefault((api, _error_name(error)), []).append((state, 0.0))
            state.last_error = error
        self._delay(state)

    def _log_changes(self) -> None:
        """Log what `_answered` and `_refused` collected from one answer: a line per partition
        when few changed, else one line per kind of change naming the first few (a leader
        that learns of 10,000 new partitions a moment after its followers used to cost 20,000
        lines, each a few microseconds of the loop)."""
        if not self._changes:
            return  # the usual answer: nothing changed (no dict made per fetch)
        changes, self._changes = self._changes, {}
        for (what, error), items in changes.items():
            if len(items) <= _CHANGES_PER_PARTITION:
                for state, seconds in items:
                    if what == "again":
                        log.info(
                            "%s: leader %d answers again after %.1f s of %s",
                            state.partition,
                            self.leader_id,
                            seconds,
                            error,
                        )
                    else:
                        log.info(
                            "%s: %s answered %s by leader %d (our leader epoch %d); "
                            "retrying after backoff",
                            state.partition,
                            what,
                            error,
                            self.leader_id,
                            state.leader_epoch,
                        )
                continue
            named = ", ".join(
                f"{state.partition.topic}-{state.partition.partition}"
                for state, _ in items[:_CHANGES_NAMED]
            )
            if what == "again":
                log.info(
                    "leader %d answers again for %d partitions (%s and %d more) after up to "
                    "%.1f s of %s",
                    self.leader_id,
                    len(items),
                    named,
                    len(items) - _CHANGES_NAMED,
                    max(seconds for _, seconds in items),
                    error,
                )
            else:
                log.info(
                    "%s answered %s by leader %d for %d partitions (%s and %d more); "
                    "retrying after backoff",
                    what,
                    error,
                    self.leader_id,
                    len(items),
                    named,
                    len(items) - _CHANGES_NAMED,
                )


# Up to this many partitions changing alike in one answer are logged a line each; beyond, one
# line names the first _CHANGES_NAMED.
_CHANGES_PER_PARTITION = 5
_CHANGES_NAMED = 5


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
