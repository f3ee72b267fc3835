"""Quiet partitions of a follower's fetch session: the reads an idle follower's fetch can skip.

A follower's incremental fetch session (KIP-227, `fetch_session`) names every partition it
follows on this leader, thousands on an idle cluster, and the follower fetches about twice a
second. Kafka reads each one on every fetch; most have nothing to read, and their answer is left
out of the response. Here, after answering, the leader marks each partition whose next fetch with
the same parameters would be answered the same way: no records at the leader's LEO, the
follower's fetch counted (a replica of the partition, with its current broker epoch), in the ISR
with nothing pending, no diverging epoch. The mark holds the partition's
`quiet_follower_token` (log, leader epoch, ISR state, assignment, LEO, HW, log start offset), and
the partition holds the session as a watcher.

A marked partition leaves the session's `awake` partitions, the only ones a fetch walks: it is
not read, validated or answered, and costs nothing per fetch. It comes back when:
* the partition changes (an append, the HW, the ISR, its role, fencing, DeleteRecords): it tells
  its watchers (`Partition.wake_quiet`); a delayed fetch of the session waiting then wakes and
  reads it with the others;
* its fetch parameters change (`FetchManager.new_context`), or the follower's broker epoch does
  (marks hold under the epoch they were made with, as the request states it and as this broker
  knows it: any other reads every partition and marks them again);
* the periodic check finds its token changed (`recheck`, every `recheck_interval`: what changes
  without telling, such as retention moving the log start offset). That check also moves the
  follower's caught-up time for each partition still quiet, as the read would have
  (`Partition.refresh_quiet_follower`), well inside replica.lag.time.max.ms, so an idle follower
  stays in the ISR.

Event-loop thread only, like the partitions and the sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.security.controller_requests import UNKNOWN_BROKER_EPOCH
from odradek.server.fetch_session import CachedPartition, FetchSession, PartitionKey

if TYPE_CHECKING:
    from odradek.cluster.partition import Partition, ReadResult
    from odradek.server.services import BrokerServices

QuietBasis = tuple[int, int | None]
"""(the follower's broker epoch as its request states it, as this broker knows it)."""


def replica_epoch(request: Any) -> int:
    """The follower's broker epoch from Fetch v15's ReplicaState, or UNKNOWN_BROKER_EPOCH."""
    state = getattr(request, "replica_state", None)
    return int(state.replica_epoch) if state is not None else UNKNOWN_BROKER_EPOCH


def follower_basis(broker: BrokerServices, request: Any, replica_id: int) -> QuietBasis:
    """The basis of an authorized follower fetch. A broker epoch newer than the registration
    this broker knows makes it re-read the registrations first (a restart, or a session that
    expired and came back: if the /brokers/ids watch missed it, the follower could never rejoin
    the ISR)."""
    epoch = replica_epoch(request)
    known = broker.live_broker_epochs.get(replica_id)
    if epoch != UNKNOWN_BROKER_EPOCH and (known is None or epoch > known):
        broker.refresh_live_broker_epochs()
    return epoch, broker.live_broker_epochs.get(replica_id)


def still_quiet(
    cached: CachedPartition,
    hosted: Partition | None,
    replica_id: int,
    now: float,
) -> Partition | None:
    """The partition if `cached` is marked quiet and nothing in it changed (the follower's
    fetch is then recorded); None if it must be read."""
    mark = cached.quiet
    if mark is None or hosted is not mark[0]:
        return None
    fetch = cached.fetch
    if not hosted.refresh_quiet_follower(
        replica_id, fetch.fetch_offset, fetch.log_start_offset, mark[1], now
    ):
        return None
    return hosted


def mark_quiet(
    session: FetchSession,
    basis: QuietBasis,
    found: Mapping[PartitionKey, ReadResult | ErrorCode],
    names: Mapping[Any, str | None],
    hosted: Mapping[tuple[str, int], Partition],
    counted: Container[tuple[str, int]],
    replica_id: int,
) -> None:
    """After answering a follower's incremental fetch: mark (or unmark) every partition read
    (`found`); `counted` are those whose fetch may move the follower's state."""
    session.quiet_basis = basis
    cached_partitions = session.partitions
    awake = session.awake
    for key, outcome in found.items():
        cached = cached_partitions.get(key)
        if cached is None:
            continue
        if cached.quiet is not None:
            session.unmark(key, cached)
        if isinstance(outcome, ErrorCode) or len(outcome.records) > 0:
            continue
        name = names.get(key[0])
        if name is None or (name, key[1]) not in counted:
            continue
        partition = hosted.get((name, key[1]))
        fetch = cached.fetch
        if partition is None or partition.diverges(fetch):
            continue
        token = partition.quiet_follower_token(replica_id, fetch.fetch_offset)
        # As told: the answer's LEO, HW and log start offset are the partition's now (a
        # delayed fetch answers with what it read when it came).
        if token is not None and token[4:] == (
            outcome.log_end_offset,
            outcome.high_watermark,
            outcome.log_start_offset,
        ):
            cached.quiet = (partition, token)
            awake.pop(key, None)
            partition.watch_quiet(session, key)


def recheck_interval(replica_lag_time_max_ms: int) -> float:
    """How often a session's marks are checked against their partitions, which also moves the
    followers' caught-up times: well inside replica.lag.time.max.ms, at most every 5 s."""
    return min(RECHECK_MAX_S, replica_lag_time_max_ms / 1000 / 4)


RECHECK_MAX_S = 5.0


def recheck(
    session: FetchSession,
    name_of: Callable[[Any], str | None],
    hosted: Mapping[tuple[str, int], Partition],
    replica_id: int,
    now: float,
) -> None:
    """Check every quiet mark of `session` against its partition: one that still holds records
    the follower's fetch (it is caught up now); one that does not is dropped, so the partition
    is read. Changes tell the session at once (`Partition.wake_quiet`); this is the backstop for
    what changes without telling (retention moving a log start offset) and what keeps an idle
    follower in the ISR."""
    for key, cached in session.partitions.items():
        if cached.quiet is None:
            continue
        name = name_of(key[0])
        partition = hosted.get((name, key[1])) if name is not None else None
        if still_quiet(cached, partition, replica_id, now) is None:
            session.unmark(key, cached)


def answered(
    read: list[PartitionKey],
    woken: list[PartitionKey],
    results: Mapping[tuple[str, int], Any],
    names: Mapping[Any, str | None],
) -> list[PartitionKey]:
    """The partitions whose results the answer is built from: those read (`read`, in the
    session's walking order), then the quiet ones new data woke during a delayed fetch that were
    read with them."""
    if not woken:
        return read
    return [*read, *(key for key in woken if (names.get(key[0]), key[1]) in results)]
