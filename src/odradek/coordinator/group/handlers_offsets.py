"""Committed-offset APIs: OffsetCommit (8), OffsetFetch (9) and OffsetDelete (47).

Offsets live in `__consumer_offsets` (`metadata_manager`). Every decision that depends on request
order happens synchronously, before a handler returns its awaitable: the socket server dispatches
a connection's requests in order but runs their awaitables concurrently. So an OffsetCommit is
judged and appended to the log in request order, and an OffsetFetch waits for the group's commits
appended before it: a client that pipelines commits and a fetch on one connection reads back its
last commit, with the metadata and leader epoch it committed.

OffsetCommit v2-v4 may carry a retention time: such a commit stores an expire timestamp (commit
time + retention), as Kafka 3.9 does (OffsetCommitValue version 1).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.offsets import NO_LEADER_EPOCH, OffsetAndMetadata, TopicPartition
from odradek.protocol.build import build_response
from odradek.protocol.codec import ApiKey

if TYPE_CHECKING:
    from odradek.coordinator.group.handlers import GroupServices
    from odradek.network.request_context import RequestContext

NO_OFFSET = -1


def _retention_ms(request: Any) -> int:
    value = getattr(request, "retention_time", None)
    if value is None:
        return -1
    milliseconds = value // datetime.timedelta(milliseconds=1)
    return int(milliseconds) if milliseconds >= 0 else -1


def handle_offset_commit(services: GroupServices, context: RequestContext, request: Any) -> Any:
    """1. per partition: unknown partition, oversized metadata; 2. may this member commit now;
    3. append the rest (judged and appended synchronously, in request order)."""
    header = context.header
    cache = services.metadata_cache
    coordinator = services.group_coordinator
    max_metadata = coordinator.manager.config.metadata_max_bytes
    now = coordinator.clock_ms()
    retention = _retention_ms(request)
    errors: dict[TopicPartition, ErrorCode] = {}
    valid: dict[TopicPartition, OffsetAndMetadata] = {}
    for topic in request.topics:
        for partition in topic.partitions:
            key = (topic.name, partition.partition_index)
            metadata = partition.committed_metadata or ""
            if cache.get_partition(*key) is None:
                errors[key] = ErrorCode.unknown_topic_or_partition
            elif len(metadata.encode()) > max_metadata:
                errors[key] = ErrorCode.offset_metadata_too_large
            else:
                epoch = getattr(partition, "committed_leader_epoch", NO_LEADER_EPOCH)
                valid[key] = OffsetAndMetadata(
                    offset=partition.committed_offset,
                    leader_epoch=epoch if epoch is not None and epoch >= 0 else NO_LEADER_EPOCH,
                    metadata=metadata,
                    commit_timestamp=now,
                    expire_timestamp=now + retention if retention >= 0 else -1,
                )
    result: Any = {}
    if valid:
        result = coordinator.commit_offsets(
            request.group_id,
            request.member_id,
            getattr(request, "group_instance_id", None),
            request.generation_id_or_member_epoch,
            valid,
        )

    def answer(results: dict[TopicPartition, ErrorCode]) -> Any:
        topics = [
            {
                "name": topic.name,
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": results.get(
                            (topic.name, p.partition_index), ErrorCode.unknown_server_error
                        ),
                    }
                    for p in topic.partitions
                ],
            }
            for topic in request.topics
        ]
        return build_response(header, {"throttle_time": 0, "topics": topics})

    if isinstance(result, dict):
        return answer({**errors, **result})

    async def write() -> Any:
        return answer({**errors, **await result})

    return write()


def _requested(topics: Any) -> list[tuple[str, list[int]]] | None:
    if topics is None:
        return None
    return [(t.name, list(t.partition_indexes)) for t in topics]


def _partition_offsets(
    requested: list[tuple[str, list[int]]] | None,
    offsets: dict[TopicPartition, OffsetAndMetadata],
    error: ErrorCode,
) -> list[dict[str, Any]]:
    """The topics of one group's OffsetFetch answer: every requested partition (-1 if never
    committed), or everything committed when all were asked for."""
    if requested is None:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(offsets):
            by_topic.setdefault(topic, []).append(partition)
        requested = list(by_topic.items())
    topics = []
    for topic, indexes in requested:
        partitions = []
        for index in indexes:
            found = offsets.get((topic, index))
            partitions.append(
                {
                    "partition_index": index,
                    "committed_offset": found.offset if found is not None else NO_OFFSET,
                    "committed_leader_epoch": (
                        found.leader_epoch if found is not None else NO_LEADER_EPOCH
                    ),
                    "metadata": found.metadata if found is not None else "",
                    "error_code": error,
                }
            )
        topics.append({"name": topic, "partitions": partitions})
    return topics


def handle_offset_fetch(services: GroupServices, context: RequestContext, request: Any) -> Any:
    """One group (v1-v7) or several (v8). Reads start synchronously, so they see every commit this
    broker accepted before them."""
    header = context.header
    coordinator = services.group_coordinator
    if header.api_version >= 8:
        asked = [(g.group_id, _requested(g.topics)) for g in request.groups]
    else:
        asked = [(request.group_id, _requested(request.topics))]
    reads = []
    for group_id, requested in asked:
        partitions = None if requested is None else [(t, p) for t, ps in requested for p in ps]
        error, reading = coordinator.fetch_offsets(group_id, partitions)
        reads.append((group_id, requested, error, reading))

    async def fetch() -> Any:
        groups = []
        for group_id, requested, error, reading in reads:
            offsets: dict[TopicPartition, OffsetAndMetadata] = {}
            if error is ErrorCode.none and reading is not None:
                offsets = await reading
                # The read ends in a later turn of the loop (after the group's commits in flight).
                # If the group's partition moved away or started loading meanwhile, the read saw
                # no offsets at all: answer the group's error instead, as Kafka (which reads under
                # the group's lock) would.
                error = (
                    coordinator.validate_group_status(group_id, ApiKey.OFFSET_FETCH)
                    or ErrorCode.none
                )
            if error is not ErrorCode.none or reading is None:
                # v2+ answer a group error alone; v0-v1 have no group error field, so each
                # requested partition carries it (Kafka's getErrorResponse).
                old = header.api_version < 2
                topics = _partition_offsets(requested or [], {}, error) if old else []
            else:
                topics = _partition_offsets(requested, offsets, ErrorCode.none)
            groups.append({"group_id": group_id, "error_code": error, "topics": topics})
        if header.api_version >= 8:
            return build_response(header, {"throttle_time": 0, "groups": groups})
        (group,) = groups
        return build_response(
            header,
            {"throttle_time": 0, "error_code": group["error_code"], "topics": group["topics"]},
        )

    return fetch()


def handle_offset_delete(services: GroupServices, context: RequestContext, request: Any) -> Any:
    """KIP-496: delete some committed offsets of a group (see `GroupCoordinator.delete_offsets`);
    a partition the cluster does not know is UNKNOWN_TOPIC_OR_PARTITION."""
    header = context.header
    cache = services.metadata_cache
    asked = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    unknown = {tp for tp in asked if cache.get_partition(*tp) is None}
    group_error, results = services.group_coordinator.delete_offsets(
        request.group_id, [tp for tp in asked if tp not in unknown]
    )
    results.update(dict.fromkeys(unknown, ErrorCode.unknown_topic_or_partition))
    topics = [
        {
            "name": t.name,
            "partitions": [
                {
                    "partition_index": p.partition_index,
                    "error_code": results.get((t.name, p.partition_index), ErrorCode.none),
                }
                for p in t.partitions
            ],
        }
        for t in request.topics
    ]
    return build_response(
        header,
        {
            "error_code": group_error,
            "throttle_time": 0,
            "topics": topics if group_error is ErrorCode.none else [],
        },
    )
