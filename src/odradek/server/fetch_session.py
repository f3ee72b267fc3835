"""Incremental fetch sessions, the leader's side (KIP-227; Kafka's `FetchSession.scala`).

A client that fetches the same partitions over and over (a consumer, a follower's replica fetcher)
need not name every partition in every request. Its first request is *full* (session id 0, epoch 0):
the broker answers every partition and, if the cache has a slot, gives the client a session id.
Later requests are *incremental* (that id, epochs 1, 2, ...): they carry only the partitions whose
fetch parameters changed (or that join the session) and a list of partitions to forget; the broker
reads every partition of the session from the fetch offsets it cached, and answers only the
partitions with something to say — records, a changed high watermark or log start offset, an error.
For a follower with 10,000 idle partitions, an incremental request and its answer are a few bytes.
(A follower's session also skips reading the partitions that cannot have anything new since their
last answer: `fetch_quiet`, through `CachedPartition.quiet`.)

Request metadata (session id, epoch):

| session id | epoch | meaning |
|---|---|---|
| 0 | 0 | full request; create a session if possible |
| 0 | -1 | full request without a session (what clients send to brokers before Fetch v7) |
| S | 0 | full request; close session S, then create a new one if possible |
| S | -1 | close session S; answer this request in full, without a session |
| S | n > 0 | incremental request in session S; n must be the session's expected epoch |

Errors (top level; the response then carries session id 0 and no partitions):
FETCH_SESSION_ID_NOT_FOUND (no session S: evicted, or a broker restart), INVALID_FETCH_SESSION_EPOCH
(n is not the expected epoch: a lost or duplicated request), FETCH_SESSION_TOPIC_ID_ERROR (a
session made with topic names, Fetch < 13, used with topic ids, or the reverse). The client then
starts over with a full request.

The cache holds at most `max.incremental.fetch.session.cache.slots` sessions (Kafka's default
1,000). When it is full, a new session may evict, in Kafka's order: the least recently used session
if it is stale (unused for `EVICTION_MS`, 120 s); otherwise the least valuable evictable session —
sessions compare by (privileged, partition count, id), a privileged (follower) session is worth more
than any consumer session, and a session counts as evictable only once it is older than
`EVICTION_MS` (a follower may evict younger consumer sessions). Which sessions are evictable is
decided when a session is used (Kafka's `touch`). Kafka 3.9 splits its cache into 8 shards for lock
contention; a broker's event loop has none, so this cache is one shard holding every slot.

Sans-I/O and pure: `FetchManager.new_context` turns a request's session fields into a
`FetchContext` saying which partitions to read (with which parameters); the handler reads them and
asks the context which results go into the response. Event-loop thread only.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.errors import InvariantError

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
EVICTION_MS = 120_000
"""Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS."""

PartitionKey = tuple[Hashable, int]
"""(topic name before Fetch v13, topic id from v13; partition index)."""


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch`: FINAL stays FINAL, and the largest int32 wraps to 1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == 0x7FFFFFFF else epoch + 1


@dataclass(slots=True)
class PartitionFetch:
    """What a request says about one partition (Kafka's FetchRequest.PartitionData)."""

    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int | None = None
    log_start_offset: int = -1
    last_fetched_epoch: int = -1


@dataclass(slots=True)
class CachedPartition:
    """A partition of a session: its latest request parameters and what the client was last told."""

    fetch: PartitionFetch
    high_watermark: int = -1
    log_start_offset: int = -1
    quiet: tuple[Any, Any] | None = None
    """For a follower's session: (the leader's Partition, its `quiet_follower_token`) as of
    the last answer, if that answer found nothing to read and nothing the fetch could move;
    while both hold, a fetch with the same parameters skips the read (`handlers_fetch`)."""

    def must_respond(
        self, records_size: int, high_watermark: int, log_start_offset: int, error: bool
    ) -> bool:
        """Should an incremental response include this partition? Updates what the client knows.

        Records, a changed high watermark or log start offset and errors are always sent; after
        an error the cached high watermark is forgotten so that the partition is sent again when
        the error clears."""
        respond = records_size > 0
        if self.high_watermark != high_watermark:
            respond = True
            self.high_watermark = high_watermark
        if self.log_start_offset != log_start_offset:
            respond = True
            self.log_start_offset = log_start_offset
        if error:
            self.high_watermark = -1
            respond = True
        return respond


@dataclass(slots=True, eq=False)
class FetchSession:
    id: int
    privileged: bool
    """Created by a follower: worth more than any consumer session when the cache is full."""
    uses_topic_ids: bool
    creation_ms: int
    last_used_ms: int
    epoch: int
    partitions: dict[PartitionKey, CachedPartition] = field(default_factory=dict)
    """In Kafka's order: a partition that returned records moves to the end (fair sharing of
    the response's byte budget across requests)."""
    evictable_key: tuple[bool, int, int] = (False, 0, 0)
    """(privileged, size, id) as of the last touch."""
    evictable_by_all: bool = False
    evictable_by_privileged: bool = False
    quiet_basis: Any = None
    """What the partitions' `quiet` marks were made under (the follower's broker epoch, as it
    sent it and as this broker knows it): a request with another basis reads everything."""
    awake: dict[PartitionKey, None] = field(default_factory=dict)
    """The partitions not marked quiet, in the order a follower's fetch walks them (a marked
    partition leaves; it comes back, at the end, when its partition changes or its fetch
    parameters do)."""
    woken: list[PartitionKey] = field(default_factory=list)
    """Marks dropped by a change since the last fetch began (`read_on_wake` reads them)."""
    quiet_recheck_at: float = 0.0
    """When a fetch next checks every mark against its partition (`fetch_quiet.recheck`)."""
    _waiters: set[Any] = field(default_factory=set)

    def wake(self, key: PartitionKey, partition: Any) -> None:
        """`partition`, marked quiet under `key`, changed: it is read again from the next fetch
        (or the delayed fetch waiting now, which this wakes)."""
        cached = self.partitions.get(key)
        if cached is None or cached.quiet is None or cached.quiet[0] is not partition:
            return
        self.unmark(key, cached)
        self.woken.append(key)
        if self._waiters:
            waiters, self._waiters = self._waiters, set()
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    def unmark(self, key: PartitionKey, cached: CachedPartition) -> None:
        if cached.quiet is not None:
            cached.quiet[0].unwatch_quiet(self, key)
            cached.quiet = None
        self.awake[key] = None

    def unmark_all(self) -> None:
        """Drop every mark (another basis, or the session closes): every partition is read
        again, and no partition holds the session any longer."""
        for key, cached in self.partitions.items():
            if cached.quiet is not None:
                cached.quiet[0].unwatch_quiet(self, key)
                cached.quiet = None
        self.awake = dict.fromkeys(self.partitions)
        self.woken.clear()

    def register_data_waiter(self, future: Any) -> None:
        """A delayed fetch of this session waits: a change to a marked partition wakes it."""
        self._waiters.add(future)

    def unregister_data_waiter(self, future: Any) -> None:
        self._waiters.discard(future)


class ContextKind(enum.Enum):
    SESSIONLESS = "sessionless"
    FULL = "full"
    INCREMENTAL = "incremental"
    ERROR = "error"


@dataclass(slots=True)
class FetchContext:
    """One request's view of its session: what to read and what to answer."""

    kind: ContextKind
    requested: dict[PartitionKey, PartitionFetch]
    """The request's partitions (for an incremental fetch, only those that joined the session
    or changed their parameters)."""
    error: ErrorCode = ErrorCode.none
    session: FetchSession | None = None
    expected_epoch: int = 0
    """The session's epoch once this request is done: another epoch at response time means a
    second request of the session overtook this one (answered INVALID_FETCH_SESSION_EPOCH)."""
    _create: (
        Callable[[FetchContext, dict[PartitionKey, tuple[int, int, int, bool]]], int] | None
    ) = None

    @property
    def partitions(self) -> dict[PartitionKey, PartitionFetch]:
        """The partitions to read, in response order: the request's for a full fetch, the whole
        session's for an incremental one (a copy: the handler walks `session.partitions`)."""
        if self.kind is ContextKind.INCREMENTAL:
            cached = assert_session(self.session).partitions
            return {key: partition.fetch for key, partition in cached.items()}
        return self.requested

    def respond(
        self, results: dict[PartitionKey, tuple[int, int, int, bool]]
    ) -> tuple[int, list[PartitionKey]]:
        """(session id for the response, partitions to include, in order).

        `results` maps every read partition to (records size, high watermark, log start offset,
        error?), in the order of `partitions`. An incremental fetch may leave out partitions it
        did not read (`fetch_quiet`): they are not answered, and only the read ones are walked."""
        if self.kind is ContextKind.ERROR:
            return INVALID_SESSION_ID, []
        if self.kind is ContextKind.SESSIONLESS:
            return INVALID_SESSION_ID, list(self.requested)
        if self.kind is ContextKind.FULL:
            session_id = self._create(self, results) if self._create is not None else 0
            return session_id, list(self.requested)
        session = assert_session(self.session)
        if session.epoch != self.expected_epoch:
            self.error = ErrorCode.invalid_fetch_session_epoch
            return INVALID_SESSION_ID, []
        included: list[PartitionKey] = []
        moved: list[PartitionKey] = []
        cached = session.partitions
        for key, result in results.items():
            partition = cached.get(key)
            if partition is None:
                continue
            size, high_watermark, log_start_offset, error = result
            if partition.must_respond(size, high_watermark, log_start_offset, error):
                included.append(key)
                if size > 0:
                    moved.append(key)
        awake = session.awake
        for key in moved:
            cached[key] = cached.pop(key)
            if key in awake:
                awake[key] = awake.pop(key)
        return session.id, included


def assert_session(session: FetchSession | None) -> FetchSession:
    if session is None:
        raise InvariantError("an incremental fetch context without its session")
    return session


class FetchSessionCache:
    """The sessions of this broker, bounded by `max_entries` slots, with Kafka's eviction rules."""

    def __init__(
        self, max_entries: int, eviction_ms: int = EVICTION_MS, rng: random.Random | None = None
    ) -> None:
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self.sessions: dict[int, FetchSession] = {}
        self.evictions = 0
        self.quiet_skips = 0
        """Session partitions a follower's fetch did not read (`fetch_quiet`), ever."""
        self._rng = rng or random.Random()

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self.sessions.get(session_id)

    def remove(self, session_id: int) -> FetchSession | None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            session.unmark_all()  # its partitions stop telling it of changes
        return session

    def touch(self, session: FetchSession, now_ms: int) -> None:
        """Mark `session` used now and re-decide whether it may be evicted (Kafka's rules)."""
        session.last_used_ms = now_ms
        session.evictable_key = (session.privileged, len(session.partitions), session.id)
        old = now_ms - session.creation_ms > self.eviction_ms
        session.evictable_by_privileged = (not session.privileged) or old
        session.evictable_by_all = old

    def maybe_create(
        self,
        now_ms: int,
        privileged: bool,
        uses_topic_ids: bool,
        partitions: dict[PartitionKey, CachedPartition],
    ) -> int:
        """A new session's id, or INVALID_SESSION_ID when the cache has no slot for it."""
        if self.max_entries <= 0:
            return INVALID_SESSION_ID
        if len(self.sessions) >= self.max_entries and not self._try_evict(
            privileged, (privileged, len(partitions), 0), now_ms
        ):
            return INVALID_SESSION_ID
        session_id = self._new_session_id()
        session = FetchSession(
            session_id,
            privileged,
            uses_topic_ids,
            now_ms,
            now_ms,
            next_epoch(INITIAL_EPOCH),
            partitions,
            awake=dict.fromkeys(partitions),
        )
        self.sessions[session_id] = session
        self.touch(session, now_ms)
        return session_id

    def _new_session_id(self) -> int:
        while True:
            session_id = self._rng.randint(1, 0x7FFFFFFF)
            if session_id not in self.sessions:
                return session_id

    def _try_evict(self, privileged: bool, key: tuple[bool, int, int], now_ms: int) -> bool:
        if not self.sessions:
            return False
        least_recent = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now_ms - least_recent.last_used_ms > self.eviction_ms:
            self.remove(least_recent.id)
            self.evictions += 1
            return True
        candidates = [
            s
            for s in self.sessions.values()
            if (s.evictable_by_privileged if privileged else s.evictable_by_all)
        ]
        if not candidates:
            return False
        cheapest = min(candidates, key=lambda s: s.evictable_key)
        if key < cheapest.evictable_key:
            return False
        self.remove(cheapest.id)
        self.evictions += 1
        return True


class FetchManager:
    """Turns each Fetch request's session fields into a `FetchContext` (Kafka's FetchManager)."""

    def __init__(self, cache: FetchSessionCache, clock_ms: Callable[[], int]) -> None:
        self.cache = cache
        self._clock_ms = clock_ms

    def new_context(
        self,
        version: int,
        session_id: int,
        epoch: int,
        is_follower: bool,
        fetch_data: dict[PartitionKey, PartitionFetch],
        to_forget: Iterable[PartitionKey],
    ) -> FetchContext:
        if version < 7:  # no session fields before Fetch v7
            return FetchContext(ContextKind.SESSIONLESS, fetch_data)
        uses_topic_ids = version >= 13
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):  # a full request
            if session_id != INVALID_SESSION_ID:
                self.cache.remove(session_id)  # any session named by a full request is closed
            if epoch == FINAL_EPOCH:
                return FetchContext(ContextKind.SESSIONLESS, fetch_data)

            def create(
                context: FetchContext, results: dict[PartitionKey, tuple[int, int, int, bool]]
            ) -> int:
                cached = {}
                for key, fetch in context.requested.items():
                    _size, high_watermark, log_start_offset, error = results.get(
                        key, (0, -1, -1, True)
                    )
                    cached[key] = CachedPartition(
                        fetch, -1 if error else high_watermark, log_start_offset
                    )
                return self.cache.maybe_create(
                    self._clock_ms(), is_follower, uses_topic_ids, cached
                )

            return FetchContext(ContextKind.FULL, fetch_data, _create=create)
        session = self.cache.get(session_id)
        if session is None:
            return FetchContext(ContextKind.ERROR, {}, ErrorCode.fetch_session_id_not_found)
        if session.epoch != epoch:
            return FetchContext(ContextKind.ERROR, {}, ErrorCode.invalid_fetch_session_epoch)
        if session.uses_topic_ids != uses_topic_ids:
            return FetchContext(ContextKind.ERROR, {}, ErrorCode.fetch_session_topic_id_error)
        cached = session.partitions
        awake = session.awake
        for key, fetch in fetch_data.items():
            partition = cached.get(key)
            if partition is None:
                cached[key] = CachedPartition(fetch)
            else:
                partition.fetch = fetch
                session.unmark(key, partition)
            awake[key] = None
        for key in to_forget:
            forgotten = cached.pop(key, None)
            if forgotten is not None and forgotten.quiet is not None:
                forgotten.quiet[0].unwatch_quiet(session, key)
            awake.pop(key, None)
        if not cached:  # nothing left: close the session, answer without one
            self.cache.remove(session.id)
            return FetchContext(ContextKind.SESSIONLESS, fetch_data)
        self.cache.touch(session, self._clock_ms())
        session.epoch = next_epoch(session.epoch)
        return FetchContext(
            ContextKind.INCREMENTAL,
            fetch_data,
            session=session,
            expected_epoch=session.epoch,
        )
