"""Fetch (1), ListOffsets (2) and OffsetForLeaderEpoch (23): the read side.

Fetch serves consumers (replica_id = -1: reads end at the high watermark) and followers (replica_id =
their broker id: reads end at the log end offset, and the fetch offset tells the leader the follower's
LEO). Fetch sessions (KIP-227) are not implemented: every response carries session id 0, which tells
clients to keep sending full fetch requests.

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

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.cluster.replica_manager import FetchPartitionRequest, FetchPartitionResult
from odradek.errors import KafkaError
from odradek.protocol.build import build_response

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


def _epoch_or_none(value: Any) -> int | None:
    if value is None:
        return None
    value = int(value)
    return value if value >= 0 else None


def handle_fetch(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    replica_manager = broker.replica_manager
    replica_id = int(request.replica_id)
    requests: list[FetchPartitionRequest] = []
    order: list[tuple[str, list[int]]] = []
    for topic in request.topics:
        indexes = []
        for partition in topic.partitions:
            indexes.append(partition.partition)
            requests.append(
                FetchPartitionRequest(
                    topic.topic,
                    partition.partition,
                    int(partition.fetch_offset),
                    max(0, int(partition.partition_max_bytes)),
                    _epoch_or_none(getattr(partition, "current_leader_epoch", None)),
                    int(getattr(partition, "log_start_offset", -1)),
                )
            )
        order.append((topic.topic, indexes))
    max_wait_ms = int(request.max_wait.total_seconds() * 1000)
    config = broker.config
    cap = config["replica.fetch.response.max.bytes" if replica_id >= 0 else "fetch.max.bytes"]
    max_bytes = max(0, min(int(getattr(request, "max_bytes", 0x7FFFFFFF)), cap))
    result = replica_manager.fetch_messages(
        requests, replica_id, max_wait_ms, int(request.min_bytes), max_bytes
    )

    def answer(results: dict[tuple[str, int], FetchPartitionResult]) -> Any:
        topics = []
        for name, indexes in order:
            partitions = []
            for index in indexes:
                item = results[(name, index)]
                if item.error is not None or item.read is None:
                    code = (
                        item.error.code
                        if item.error is not None
                        else ErrorCode.unknown_server_error
                    )
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
                        "last_stable_offset": read.high_watermark,
                        "log_start_offset": read.log_start_offset,
                        "aborted_transactions": None,
                        "preferred_read_replica": -1,
                        "records": read.records,
                    }
                )
            topics.append({"topic": name, "partitions": partitions})
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
            try:
                partition = replica_manager.leader_partition(topic.name, item.partition_index)
                partition.check_leader_epoch(
                    _epoch_or_none(getattr(item, "current_leader_epoch", None))
                )
                timestamp = int(item.timestamp)
                if timestamp == EARLIEST_TIMESTAMP:
                    entry["offset"] = partition.log_start_offset
                elif timestamp == LATEST_TIMESTAMP:
                    entry["offset"] = (
                        partition.log_end_offset if from_follower else partition.high_watermark
                    )
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
