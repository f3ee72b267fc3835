"""Fetch (1), ListOffsets (2) and OffsetForLeaderEpoch (23): the read side.

Fetch serves consumers (replica_id = -1: reads end at the high watermark) and followers (replica_id =
their broker id: reads end at the log end offset, and the fetch offset tells the leader the follower's
LEO). Versions 13+ name topics by topic id (an unknown id gets UNKNOWN_TOPIC_ID); 15+ carry the
follower's id and broker epoch in `replica_state`. Consumers need READ on each topic; a follower
needs CLUSTER_ACTION, must be a replica of the partition and present its current broker epoch, and
its fetch moves its LEO (and so the ISR and HW) only after the read at its offset succeeded
(`odradek.security.controller_requests`): no client can keep a dead follower in the ISR by
fetching in its name. Fetch sessions (KIP-227) are not implemented: every response carries session
id 0, which tells clients to keep sending full fetch requests.

Whatever a request asks for, a response holds at most `fetch.max.bytes` (KIP-541, 55 MB by
default) of records for a consumer and `replica.fetch.response.max.bytes` (10 MB) for a follower,
as in Kafka; each partition's share is also bounded by what remains of that (plus, for the first
partition with data, one whole batch however large: KIP-74). Negative sizes count as zero.

ListOffsets answers earliest (-2: the log start offset), latest (-1: the high watermark for consumers,
the LEO for followers), by timestamp (the first offset whose batch timestamp is at or after it) and,
from v7, max timestamp (-3, KIP-734: the record with the largest timestamp, below the high
watermark for consumers). A found offset carries the leader epoch that wrote it.

OffsetForLeaderEpoch (KIP-101/KIP-279) answers, for a requested leader epoch, the largest epoch at or
below it that this leader knows and the offset where that epoch ended — what a follower truncates to.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.cluster.replica_manager import FetchPartitionRequest, FetchPartitionResult
from odradek.errors import KafkaError
from odradek.protocol.build import build_response
from odradek.security.controller_requests import (
    UNKNOWN_BROKER_EPOCH,
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

if TYPE_CHECKING:
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
    broker: BrokerServices, context: RequestContext, request: Any, keys: list[tuple[str, int]]
) -> tuple[dict[tuple[str, int], ErrorCode], set[tuple[str, int]]]:
    """A follower fetch (replica id >= 0): which partitions to refuse (and with what), and which
    may update the follower's state. Needs CLUSTER_ACTION; then `validate_follower_fetch` per
    partition this broker leads (KIP-903: a replica of the partition, with its current broker
    epoch from Fetch v15's ReplicaState)."""
    if not broker.authorizer.cluster(context, CLUSTER_ACTION):
        return dict.fromkeys(keys, TOPIC_AUTHORIZATION_FAILED), set()
    state = getattr(request, "replica_state", None)
    replica_id = _replica_id(request)
    replica_epoch = int(state.replica_epoch) if state is not None else UNKNOWN_BROKER_EPOCH
    refused: dict[tuple[str, int], ErrorCode] = {}
    updatable: set[tuple[str, int]] = set()
    for key in keys:
        partition = broker.replica_manager.get_partition(*key)
        if partition is None or not partition.is_leader:
            continue  # the read answers NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC_OR_PARTITION
        verdict = validate_follower_fetch(
            replica_id,
            replica_epoch,
            partition.assignment,
            broker.live_broker_epochs,
            has_current_leader_epoch=True,
        )
        if verdict.error is not None:
            refused[key] = verdict.error
            log.warning("refused a follower fetch of %s-%d: %s", key[0], key[1], verdict.reason)
        elif verdict.update_state:
            updatable.add(key)
    return refused, updatable


def _replica_id(request: Any) -> int:
    state = getattr(request, "replica_state", None)
    if state is not None:  # v15+
        return int(state.replica_id)
    return int(getattr(request, "replica_id", -1))


def handle_fetch(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    replica_manager = broker.replica_manager
    replica_id = _replica_id(request)
    by_id = header.api_version >= 13  # topics named by topic id (KIP-516)
    requests: list[FetchPartitionRequest] = []
    # (name or None for an unknown topic id, topic id, partition indexes)
    order: list[tuple[str | None, Any, list[int]]] = []
    keys: list[tuple[str, int]] = []
    read_committed = replica_id < 0 and int(getattr(request, "isolation_level", 0)) == 1
    for topic in request.topics:
        name = broker.metadata_cache.topic_name(topic.topic_id) if by_id else topic.topic
        indexes = [p.partition for p in topic.partitions]
        order.append((name, topic.topic_id if by_id else None, indexes))
        if name is None:
            continue
        for partition in topic.partitions:
            keys.append((name, partition.partition))
            requests.append(
                FetchPartitionRequest(
                    name,
                    partition.partition,
                    int(partition.fetch_offset),
                    max(0, int(partition.partition_max_bytes)),
                    _epoch_or_none(getattr(partition, "current_leader_epoch", None)),
                    int(getattr(partition, "log_start_offset", -1)),
                    int(getattr(partition, "last_fetched_epoch", -1)),
                    read_committed=read_committed,
                )
            )
    refused: dict[tuple[str, int], ErrorCode] = {}
    follower_update = None
    if replica_id >= 0:
        refused, updatable = _follower_verdicts(broker, context, request, keys)

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
    if requests:
        result = replica_manager.fetch_messages(
            requests, replica_id, max_wait_ms, int(request.min_bytes), max_bytes, follower_update
        )
    else:
        result = {}

    def answer(results: dict[tuple[str, int], FetchPartitionResult]) -> Any:
        topics = []
        for name, topic_id, indexes in order:
            partitions = []
            for index in indexes:
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
                    partitions.append(
                        {
                            "partition_index": index,
                            "error_code": code,
                            "high_watermark": -1,
                            "last_stable_offset": -1,
                            "log_start_offset": -1,
                            "aborted_transactions": None,
                            "preferred_read_replica": -1,
                            "records": b"",
                        }
                    )
                    continue
                read = item.read
                partitions.append(
                    {
                        "partition_index": index,
                        "error_code": ErrorCode.none,
                        "high_watermark": read.high_watermark,
                        "last_stable_offset": read.last_stable_offset,
                        "log_start_offset": read.log_start_offset,
                        "aborted_transactions": (
                            None
                            if read.aborted_transactions is None
                            else [
                                {"producer_id": producer_id, "first_offset": first_offset}
                                for producer_id, first_offset in read.aborted_transactions
                            ]
                        ),
                        "preferred_read_replica": -1,
                        "records": read.records,
                    }
                )
            topics.append({"topic": name or "", "topic_id": topic_id, "partitions": partitions})
        return build_response(
            header,
            {
                "throttle_time": 0,
                "error_code": ErrorCode.none,
                "session_id": 0,
                "responses": topics,
            },
        )

    if isinstance(result, dict):
        return answer(result)

    async def wait_and_build() -> Any:
        return answer(await result)

    return wait_and_build()


def handle_list_offsets(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    replica_manager = broker.replica_manager
    from_follower = int(request.replica_id) >= 0
    read_committed = not from_follower and int(getattr(request, "isolation_level", 0)) == 1
    allowed = broker.authorizer.filter(context, DESCRIBE, TOPIC, {t.name for t in request.topics})
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
            if topic.name not in allowed:
                entry["error_code"] = TOPIC_AUTHORIZATION_FAILED
                partitions.append(entry)
                continue
            try:
                partition = replica_manager.leader_partition(topic.name, item.partition_index)
                partition.check_leader_epoch(
                    _epoch_or_none(getattr(item, "current_leader_epoch", None))
                )
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
            except KafkaError as e:
                entry["error_code"] = e.code
            partitions.append(entry)
        topics.append({"name": topic.name, "partitions": partitions})
    return build_response(header, {"throttle_time": 0, "topics": topics})


def handle_offset_for_leader_epoch(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    replica_manager = broker.replica_manager
    # Followers (CLUSTER_ACTION) may ask about every topic, others about topics they may describe.
    names = {t.topic for t in request.topics}
    allowed = (
        names
        if broker.authorizer.cluster(context, CLUSTER_ACTION, log_if_denied=False)
        else broker.authorizer.filter(context, DESCRIBE, TOPIC, names)
    )
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
            if topic.topic not in allowed:
                entry["error_code"] = TOPIC_AUTHORIZATION_FAILED
                partitions.append(entry)
                continue
            try:
                partition = replica_manager.leader_partition(topic.topic, item.partition)
                partition.check_leader_epoch(
                    _epoch_or_none(getattr(item, "current_leader_epoch", None))
                )
                epoch, end_offset = partition.log.leader_epoch_cache.end_offset_for(
                    int(item.leader_epoch), partition.log_end_offset
                )
                entry["leader_epoch"], entry["end_offset"] = epoch, end_offset
            except KafkaError as e:
                entry["error_code"] = e.code
            partitions.append(entry)
        topics.append({"topic": topic.topic, "partitions": partitions})
    return build_response(header, {"throttle_time": 0, "topics": topics})
