"""Fetch (1), ListOffsets (2) and OffsetForLeaderEpoch (23): the read side.

Fetch serves consumers (replica_id = -1: reads end at the high watermark) and followers (replica_id =
their broker id: reads end at the log end offset, and the fetch offset tells the leader the follower's
LEO). Versions 13+ name topics by topic id (an unknown id gets UNKNOWN_TOPIC_ID); 15+ carry the
follower's id and broker epoch in `replica_state`. Consumers need READ on each topic; a follower
needs CLUSTER_ACTION, must be a replica of the partition and present its current broker epoch, and
its fetch moves its LEO (and so the ISR and HW) only after the read at its offset succeeded
(`odradek.security.controller_requests`): no client can keep a dead follower in the ISR by
fetching in its name. From v7 the request may belong to an incremental fetch session (KIP-227,
`odradek.server.fetch_session`): a full request answers every partition it names and may open a
session; an incremental one reads every partition of its session and answers only those with
records, a changed high watermark or log start offset, or an error. A follower's incremental
fetch skips the partitions whose answer cannot have changed since the last (`fetch_quiet`).

Whatever a request asks for, a response holds at most `fetch.max.bytes` (KIP-541, 55 MB by
default) of records for a consumer and `replica.fetch.response.max.bytes` (10 MB) for a follower,
as in Kafka; each partition's share is also bounded by what remains of that (plus, for the first
partition with data, one whole batch however large: KIP-74). Negative sizes count as zero.

ListOffsets answers earliest (-2: the log start offset), latest (-1: the high watermark for consumers,
the LEO for followers), by timestamp (the first offset whose batch timestamp is at or after it) and,
from v7, max timestamp (-3, KIP-734: the record with the largest timestamp, below the high
watermark for consumers). A found offset carries the leader epoch that wrote it.

Client quotas (`odradek.server.quota.throttling`, consumers only): a fetch is capped to what the
client's fetch quota allows in one window; a response that puts the client over its fetch or
request quota goes out without records, with its throttle time, and mutes the connection.

OffsetForLeaderEpoch (KIP-101/KIP-279) answers, for a requested leader epoch, the largest epoch at or
below it that this leader knows and the offset where that epoch ended — what a follower truncates to.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Mapping
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.cluster.replica_manager import FetchPartitionRequest, FetchPartitionResult
from odradek.errors import KafkaError
from odradek.protocol.build import build_response
from odradek.protocol.fetch_response import (
    EncodedResponse,
    PartitionAnswer,
    TopicAnswer,
    encode_fetch_response,
)
from odradek.security.controller_requests import (
    may_update_follower_state,
    validate_follower_fetch,
)
from odradek.server.authorization import (
    CLUSTER_ACTION,
    DESCRIBE,
    READ,
    TOPIC,
    TOPIC_AUTHORIZATION_FAILED,
)
from odradek.server.fetch_quiet import (
    answered,
    follower_basis,
    mark_quiet,
    recheck,
    recheck_interval,
    replica_epoch,
)
from odradek.server.fetch_session import ContextKind, FetchContext, PartitionFetch, PartitionKey
from odradek.server.quota.throttling import (
    fetch_max_bytes,
    fetch_throttle_ms,
    record_leader_replication,
)

if TYPE_CHECKING:
    from odradek.cluster.partition import Partition, ReadResult
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


def _epoch_or_none(value: Any) -> int | None:
    if value is None:
        return None
    value = int(value)
    return value if value >= 0 else None


def _follower_verdicts(
    broker: BrokerServices, authorized: bool, request: Any, keys: list[tuple[str, int]]
) -> tuple[dict[tuple[str, int], ErrorCode], set[tuple[str, int]]]:
    """A follower fetch (replica id >= 0): which partitions to refuse (and with what), and which
    may update the follower's state. Needs CLUSTER_ACTION (`authorized`); then
    `validate_follower_fetch` per partition this broker leads (KIP-903: a replica of the
    partition, with its current broker epoch from Fetch v15's ReplicaState)."""
    if not authorized:
        return dict.fromkeys(keys, TOPIC_AUTHORIZATION_FAILED), set()
    replica_id = _replica_id(request)
    epoch = replica_epoch(request)
    refused: dict[tuple[str, int], ErrorCode] = {}
    updatable: set[tuple[str, int]] = set()
    not_counted: str | None = None  # why partitions were served without counting, if any
    for key in keys:
        partition = broker.replica_manager.get_partition(*key)
        if partition is None or not partition.is_leader:
            continue  # the read answers NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC_OR_PARTITION
        verdict = validate_follower_fetch(
            replica_id,
            epoch,
            partition.assignment,
            broker.live_broker_epochs,
            has_current_leader_epoch=True,
        )
        if verdict.error is not None:
            refused[key] = verdict.error
            log.warning("refused a follower fetch of %s-%d: %s", key[0], key[1], verdict.reason)
        elif verdict.update_state:
            updatable.add(key)
        else:
            not_counted = verdict.reason
    if not_counted is not None:
        _log_not_counted(replica_id, epoch, not_counted, broker.live_broker_epochs)
    return refused, updatable


_NOT_COUNTED_LOG_INTERVAL_S = 10.0
_not_counted_logged: dict[tuple[int, int], float] = {}


def _log_not_counted(
    replica_id: int, replica_epoch: int, reason: str, live: Mapping[int, int]
) -> None:
    """A follower fetch served without moving the follower's state (the ISR cannot grow by
    it): say so, once per replica and epoch every few seconds, since it repeats on every fetch."""
    now = time.monotonic()
    key = (replica_id, replica_epoch)
    if now - _not_counted_logged.get(key, -_NOT_COUNTED_LOG_INTERVAL_S) < (
        _NOT_COUNTED_LOG_INTERVAL_S
    ):
        return
    if len(_not_counted_logged) > 1000:
        _not_counted_logged.clear()
    _not_counted_logged[key] = now
    log.info(
        "follower fetches of replica %d (epoch %d) are served but not counted: %s "
        "(live broker epochs: %s)",
        replica_id,
        replica_epoch,
        reason,
        dict(sorted(live.items())),
    )


def _replica_id(request: Any) -> int:
    state = getattr(request, "replica_state", None)
    if state is not None:  # v15+
        return int(state.replica_id)
    return int(getattr(request, "replica_id", -1))


def _partition_fetch(partition: Any) -> PartitionFetch:
    return PartitionFetch(
        int(partition.fetch_offset),
        max(0, int(partition.partition_max_bytes)),
        _epoch_or_none(getattr(partition, "current_leader_epoch", None)),
        int(getattr(partition, "log_start_offset", -1)),
        int(getattr(partition, "last_fetched_epoch", -1)),
    )


def _forgotten(request: Any, by_id: bool) -> list[PartitionKey]:
    keys: list[PartitionKey] = []
    for topic in getattr(request, "forgotten_topics_data", None) or ():
        topic_key = topic.topic_id if by_id else topic.topic
        keys.extend((topic_key, int(p)) for p in topic.partitions)
    return keys


def _error_partition(index: int, code: ErrorCode) -> dict[str, Any]:
    return {
        "partition_index": index,
        "error_code": code,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "aborted_transactions": None,
        "preferred_read_replica": -1,
        "records": b"",
    }


def handle_fetch(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    started_ns = time.perf_counter_ns()
    header = context.header
    replica_manager = broker.replica_manager
    replica_id = _replica_id(request)
    by_id = header.api_version >= 13  # topics named by topic id (KIP-516)
    fetch_data: dict[PartitionKey, PartitionFetch] = {}
    read_committed = replica_id < 0 and int(getattr(request, "isolation_level", 0)) == 1
    for topic in request.topics:
        topic_key = topic.topic_id if by_id else topic.topic
        for partition in topic.partitions:
            fetch_data[(topic_key, int(partition.partition))] = _partition_fetch(partition)
    fetch_context = broker.fetch_manager.new_context(
        header.api_version,
        int(getattr(request, "session_id", 0)),
        int(getattr(request, "session_epoch", -1)),
        replica_id >= 0,
        fetch_data,
        _forgotten(request, by_id),
    )
    if fetch_context.kind is ContextKind.ERROR:
        return _session_error(header, fetch_context.error)
    authorized = replica_id >= 0 and broker.authorizer.cluster(context, CLUSTER_ACTION)
    basis = follower_basis(broker, request, replica_id) if authorized else None
    # A follower's incremental fetch skips the partitions whose answer cannot have changed
    # since the session's last (`fetch_quiet`): it walks only the session's awake partitions.
    session = fetch_context.session if fetch_context.kind is ContextKind.INCREMENTAL else None
    cached_partitions = session.partitions if session is not None else {}
    use_quiet = basis is not None and session is not None and session.quiet_basis == basis
    hosted = replica_manager.partitions
    names: dict[Any, str | None] = {}
    metadata_cache = broker.metadata_cache

    def name_of(topic_key: Any) -> str | None:
        if topic_key not in names:
            names[topic_key] = metadata_cache.topic_name(topic_key) if by_id else topic_key
        return names[topic_key]

    walk: Any = fetch_context.requested
    skipped = 0
    if session is not None:
        walk = cached_partitions
        if use_quiet:
            session.woken.clear()  # already awake
            now = time.monotonic()
            if now >= session.quiet_recheck_at:
                session.quiet_recheck_at = now + recheck_interval(
                    broker.config["replica.lag.time.max.ms"]
                )
                recheck(session, name_of, hosted, replica_id, now)
            walk = {key: cached_partitions[key] for key in session.awake}
            skipped = len(cached_partitions) - len(walk)
        elif session.quiet_basis is not None:  # marks made under another broker epoch
            session.unmark_all()
            session.quiet_basis = None
    # What to read: the request's partitions (full) or the session's awake ones (incremental);
    # `order` is the partitions read (or answered with an error), in response order, the only
    # ones walked from here on.
    requests: list[FetchPartitionRequest] = []
    keys: list[tuple[str, int]] = []
    order: list[PartitionKey] = []
    for key, item in walk.items():
        topic_key, index = key
        name = names[topic_key] if topic_key in names else name_of(topic_key)
        if name is None:
            order.append(key)
            continue
        fetch = item if session is None else item.fetch
        order.append(key)
        keys.append((name, index))
        requests.append(_partition_request(name, index, fetch, read_committed=read_committed))
    refused: dict[tuple[str, int], ErrorCode] = {}
    follower_update = None
    updatable: set[tuple[str, int]] = set()
    if replica_id >= 0:
        refused, updatable = _follower_verdicts(broker, authorized, request, keys)

        def follower_update(
            key: tuple[str, int], offset: int, start: int, end: int, diverging: bool
        ) -> bool:
            return key in updatable and may_update_follower_state(offset, start, end, diverging)

    else:
        allowed = broker.authorizer.filter(context, READ, TOPIC, {k[0] for k in keys})
        refused = {k: TOPIC_AUTHORIZATION_FAILED for k in keys if k[0] not in allowed}
    if refused:
        requests = [r for r in requests if (r.topic, r.partition) not in refused]
    max_wait_ms = int(request.max_wait.total_seconds() * 1000)
    config = broker.config
    cap = config["replica.fetch.response.max.bytes" if replica_id >= 0 else "fetch.max.bytes"]
    max_bytes = max(0, min(int(getattr(request, "max_bytes", 0x7FFFFFFF)), cap))
    min_bytes = int(request.min_bytes)
    quotas = broker.quotas.client
    if replica_id < 0 and quotas.fetch.enabled:
        max_bytes = fetch_max_bytes(quotas, context, max_bytes)
        min_bytes = min(min_bytes, max_bytes)

    if skipped:
        broker.fetch_manager.cache.quiet_skips += skipped
    woken: list[PartitionKey] = []

    def read_on_wake() -> list[FetchPartitionRequest]:
        # A change woke marked partitions: they are read now, served as any other partition.
        if session is None:
            return []
        woken.extend(key for key in session.woken if key in cached_partitions)
        session.woken.clear()
        return [
            _partition_request(name, key[1], cached_partitions[key].fetch)
            for key in woken
            if (name := name_of(key[0])) is not None
        ]

    if requests or skipped:
        result = replica_manager.fetch_messages(
            requests,
            replica_id,
            max_wait_ms,
            min_bytes,
            max_bytes,
            follower_update,
            # Records stay in their segment files (FileRecords) until the connection sends
            # them: by sendfile(2), or on TLS read once and handed to the transport as they are.
            zero_copy=True,
            watch_only=[session] if skipped and session is not None else (),
            read_on_wake=read_on_wake,
        )
    else:
        result = {}
    handler_ns = time.perf_counter_ns() - started_ns

    # BytesOutPerSec counts what consumers read; followers' reads are replication (as Kafka).
    stats = replica_manager.broker_topic_stats if replica_id < 0 else None

    def answer(results: dict[tuple[str, int], FetchPartitionResult]) -> Any:
        if replica_id < 0 and quotas.enabled:
            size = sum(len(r.read.records) for r in results.values() if r.read is not None)
            throttle_ms = fetch_throttle_ms(quotas, context, size, handler_ns)
            if throttle_ms > 0:
                return _throttled(header, fetch_context, throttle_ms)
        elif replica_id >= 0:
            record_leader_replication(broker.quotas.replication.leader, results)
        # The summary of every partition decides which go into the response (an incremental
        # fetch leaves out those with nothing new); answers are built for those only, since an
        # idle follower's session names thousands of partitions and answers none of them.
        summary: dict[PartitionKey, tuple[int, int, int, bool]] = {}
        found: dict[PartitionKey, ReadResult | ErrorCode] = {}
        # A quiet partition (not read: nothing new) is in the answer only if a change woke a
        # delayed fetch and it was read after all.
        for key in answered(order, woken, results, names):
            topic_key, index = key
            name = names.get(topic_key)
            item = results.get((name, index)) if name is not None else None
            if item is None or item.error is not None or item.read is None:
                if name is None:
                    code = ErrorCode.unknown_topic_id
                elif item is None:
                    code = refused.get((name, index), ErrorCode.unknown_server_error)
                elif item.error is not None:
                    code = item.error.code
                else:
                    code = ErrorCode.unknown_server_error
                found[key] = code
                summary[key] = (0, -1, -1, True)
                if stats is not None and name is not None:
                    stats.record_fetch(name, 0, failed=True)
                continue
            read = item.read
            found[key] = read
            size = len(read.records)
            summary[key] = (size, read.high_watermark, read.log_start_offset, False)
            if stats is not None:
                stats.record_fetch(name, size, failed=False)
        session_id, included = fetch_context.respond(summary)
        if fetch_context.error != ErrorCode.none:
            return _session_error(header, fetch_context.error)
        if session is not None and basis is not None:
            mark_quiet(session, basis, found, names, hosted, updatable, replica_id)
        entries: dict[PartitionKey, PartitionAnswer] = {}
        for key in included:
            outcome = found[key]
            if isinstance(outcome, ErrorCode):
                entries[key] = PartitionAnswer(key[1], outcome.value, -1, -1, b"")
            else:
                entries[key] = PartitionAnswer(
                    key[1],
                    0,
                    outcome.high_watermark,
                    outcome.log_start_offset,
                    outcome.records,
                    outcome.last_stable_offset,
                    outcome.aborted_transactions,
                )
        # Consecutive partitions of one topic share a topic entry (as Kafka's FetchResponse.of).
        topics: list[TopicAnswer] = []
        current: Any = object()
        for key in included:
            topic_key = key[0]
            if topic_key != current:
                current = topic_key
                name = (names.get(topic_key) or "") if by_id else topic_key
                topics.append(TopicAnswer(name, topic_key if by_id else None, []))
            topics[-1].partitions.append(entries[key])
        return EncodedResponse(
            encode_fetch_response(header.api_version, header.correlation_id, 0, session_id, topics)
        )

    if isinstance(result, dict):
        return answer(result)

    async def wait_and_build() -> Any:
        return answer(await result)

    return wait_and_build()


def _partition_request(
    name: str, index: int, fetch: PartitionFetch, read_committed: bool = False
) -> FetchPartitionRequest:
    return FetchPartitionRequest(
        name,
        index,
        fetch.fetch_offset,
        fetch.max_bytes,
        fetch.current_leader_epoch,
        fetch.log_start_offset,
        fetch.last_fetched_epoch,
        read_committed=read_committed,
    )


def _throttled(header: Any, fetch_context: FetchContext, throttle_ms: int) -> EncodedResponse:
    """A throttled fetch's answer: no partitions, the throttle time, and the session left as it
    was (a full fetch creates none; Kafka's `getThrottledResponse`)."""
    session = fetch_context.session
    session_id = session.id if fetch_context.kind is ContextKind.INCREMENTAL and session else 0
    return EncodedResponse(
        encode_fetch_response(
            header.api_version, header.correlation_id, 0, session_id, [], throttle_ms
        )
    )


def _session_error(header: Any, code: ErrorCode) -> EncodedResponse:
    return EncodedResponse(
        encode_fetch_response(header.api_version, header.correlation_id, code.value, 0, [])
    )


def _leader_answer(
    broker: BrokerServices,
    allowed: Container[str],
    topic: str,
    item: Any,
    partition_index: int,
    entry: dict[str, Any],
    answer: Callable[[Partition, Any, dict[str, Any]], None],
) -> dict[str, Any]:
    """`entry`, a ListOffsets or OffsetForLeaderEpoch answer for one partition, filled in by
    `answer(partition, item, entry)` from this broker's leader replica of it.

    TOPIC_AUTHORIZATION_FAILED when the topic is not `allowed`; else the error of any KafkaError
    on the way: NOT_LEADER_OR_FOLLOWER (this broker does not lead the partition),
    FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH (the request's current leader epoch is not the
    leader's, KIP-320), or what `answer` raises.
    """
    if topic not in allowed:
        entry["error_code"] = TOPIC_AUTHORIZATION_FAILED
        return entry
    try:
        partition = broker.replica_manager.leader_partition(topic, partition_index)
        partition.check_leader_epoch(_epoch_or_none(getattr(item, "current_leader_epoch", None)))
        answer(partition, item, entry)
    except KafkaError as e:
        entry["error_code"] = e.code
    return entry


def handle_list_offsets(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    from_follower = int(request.replica_id) >= 0
    read_committed = not from_follower and int(getattr(request, "isolation_level", 0)) == 1
    allowed = broker.authorizer.filter(context, DESCRIBE, TOPIC, {t.name for t in request.topics})

    def answer(partition: Partition, item: Any, entry: dict[str, Any]) -> None:
        timestamp = int(item.timestamp)
        if timestamp == EARLIEST_TIMESTAMP:
            entry["offset"] = partition.log_start_offset
        elif timestamp == LATEST_TIMESTAMP:
            if from_follower:
                entry["offset"] = partition.log_end_offset
            elif read_committed:
                entry["offset"] = partition.log.last_stable_offset(partition.high_watermark)
            else:
                entry["offset"] = partition.high_watermark
        else:
            found = partition.log.fetch_offset_by_timestamp(timestamp)
            limit = partition.log_end_offset if from_follower else partition.high_watermark
            if found is not None and found[0] < limit:
                entry["offset"], entry["timestamp"] = found[0], found[1]
                epoch = partition.log.leader_epoch_cache.epoch_for_offset(found[0])
                entry["leader_epoch"] = epoch if epoch >= 0 else partition.leader_epoch
        if entry["offset"] >= 0 and entry["leader_epoch"] < 0:
            entry["leader_epoch"] = partition.leader_epoch

    topics = []
    for topic in request.topics:
        partitions = []
        for item in topic.partitions:
            entry: dict[str, Any] = {
                "partition_index": item.partition_index,
                "error_code": ErrorCode.none,
                "timestamp": -1,
                "offset": -1,
                "leader_epoch": -1,
            }
            partitions.append(
                _leader_answer(
                    broker, allowed, topic.name, item, item.partition_index, entry, answer
                )
            )
        topics.append({"name": topic.name, "partitions": partitions})
    return build_response(header, {"throttle_time": 0, "topics": topics})


def handle_offset_for_leader_epoch(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    # Followers (CLUSTER_ACTION) may ask about every topic, others about topics they may describe.
    names = {t.topic for t in request.topics}
    allowed = (
        names
        if broker.authorizer.cluster(context, CLUSTER_ACTION, log_if_denied=False)
        else broker.authorizer.filter(context, DESCRIBE, TOPIC, names)
    )

    def answer(partition: Partition, item: Any, entry: dict[str, Any]) -> None:
        epoch, end_offset = partition.log.leader_epoch_cache.end_offset_for(
            int(item.leader_epoch), partition.log_end_offset
        )
        entry["leader_epoch"], entry["end_offset"] = epoch, end_offset

    topics = []
    for topic in request.topics:
        partitions = []
        for item in topic.partitions:
            entry: dict[str, Any] = {
                "error_code": ErrorCode.none,
                "partition": item.partition,
                "leader_epoch": -1,
                "end_offset": -1,
            }
            partitions.append(
                _leader_answer(broker, allowed, topic.topic, item, item.partition, entry, answer)
            )
        topics.append({"topic": topic.topic, "partitions": partitions})
    return build_response(header, {"throttle_time": 0, "topics": topics})
