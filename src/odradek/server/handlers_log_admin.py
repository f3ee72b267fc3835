"""DeleteRecords (21), DescribeLogDirs (35) and DescribeCluster (60): the operator's reads and
the one deletion that works on a log rather than a topic.

DeleteRecords moves each partition's log start offset (Kafka's deleteRecords): the leader moves
it at once (up to the high watermark; -1 means the high watermark), writes it to its
`log-start-offset-checkpoint`, and answers with the partition's low watermark once every ISR
follower has moved too (they learn it from the `log_start_offset` of their fetch responses and
report it in their next fetch), or REQUEST_TIMED_OUT after the request's timeout. Segments wholly
below the new start are deleted by the next retention pass; Fetch and ListOffsets honour the new
start at once (OFFSET_OUT_OF_RANGE below it; "earliest" is it). Records of internal topics can be
deleted only by Kafka's admin client id, as in Kafka.

DescribeLogDirs answers for this broker's log directories: each partition's size in bytes and
offset lag (high watermark minus log end offset, never below 0: 0 on a healthy replica), and from
v4 the directory's total and usable bytes; a directory that failed (KIP-112) is listed with
KAFKA_STORAGE_ERROR and no partitions.

DescribeCluster is Metadata without topics: the live brokers (with the address of the listener the
client came in on, as Metadata), the controller and the cluster id (v1's endpoint type 2,
controllers, exists only in KRaft mode: UNSUPPORTED_ENDPOINT_TYPE).

Authorization, as Kafka's: DeleteRecords needs DELETE on each topic (TOPIC_AUTHORIZATION_FAILED for
that topic's partitions, which are not touched); DescribeLogDirs DESCRIBE on the cluster (without
it: no directories and CLUSTER_AUTHORIZATION_FAILED); DescribeCluster needs nothing, and its
`cluster_authorized_operations`, when asked for, are the cluster operations the principal has.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.placement import OFFSETS_TOPIC
from odradek.errors import KafkaError
from odradek.protocol.build import build_response
from odradek.security.acl import AclOperation
from odradek.server.authorization import (
    CLUSTER_AUTHORIZATION_FAILED,
    DELETE,
    DESCRIBE,
    TOPIC,
    TOPIC_AUTHORIZATION_FAILED,
)

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

ADMIN_CLIENT_ID = "__admin_client"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC})
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
# Kafka's AclOperations that apply to a cluster: ALTER (4), CREATE (7), DESCRIBE (8),
# CLUSTER_ACTION (9), DESCRIBE_CONFIGS (10), ALTER_CONFIGS (11), IDEMPOTENT_WRITE (12).
CLUSTER_OPERATIONS = (
    AclOperation.ALTER,
    AclOperation.CREATE,
    AclOperation.DESCRIBE,
    AclOperation.CLUSTER_ACTION,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
    AclOperation.IDEMPOTENT_WRITE,
)
BROKER_ENDPOINTS = 1


def handle_delete_records(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    offsets: dict[tuple[str, int], int] = {}
    refused: dict[tuple[str, int], ErrorCode] = {}
    allowed = broker.authorizer.filter(context, DELETE, TOPIC, {t.name for t in request.topics})
    for topic in request.topics:
        for partition in topic.partitions:
            key = (topic.name, partition.partition_index)
            if topic.name not in allowed:
                refused[key] = TOPIC_AUTHORIZATION_FAILED
            elif topic.name in INTERNAL_TOPICS and header.client_id != ADMIN_CLIENT_ID:
                refused[key] = ErrorCode.invalid_topic_exception
            else:
                offsets[key] = int(partition.offset)
    timeout_ms = int(request.timeout.total_seconds() * 1000)
    waiting = broker.replica_manager.delete_records(offsets, timeout_ms)

    async def answer() -> Any:
        results = await waiting
        topics = []
        for topic in request.topics:
            partitions = []
            for partition in topic.partitions:
                key = (topic.name, partition.partition_index)
                low_watermark, error = results.get(key, (-1, None))
                code = refused.get(key) or (error.code if error is not None else ErrorCode.none)
                partitions.append(
                    {
                        "partition_index": partition.partition_index,
                        "low_watermark": low_watermark if code is ErrorCode.none else -1,
                        "error_code": code,
                    }
                )
            topics.append({"name": topic.name, "partitions": partitions})
        return build_response(header, {"throttle_time": 0, "topics": topics})

    return answer()


def handle_describe_log_dirs(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    if not broker.authorizer.cluster(context, DESCRIBE):
        return build_response(
            header, {"throttle_time": 0, "error_code": CLUSTER_AUTHORIZATION_FAILED, "results": ()}
        )
    replica_manager = broker.replica_manager
    log_manager = replica_manager.log_manager
    wanted: dict[str, set[int]] | None = None
    if request.topics is not None:
        wanted = {}
        for topic in request.topics:
            wanted.setdefault(topic.topic, set()).update(topic.partitions)
    by_dir: dict[str, dict[str, list[dict[str, Any]]]] = {
        os.path.abspath(d): {} for d in broker.config.log_dirs
    }
    for log in sorted(log_manager.all_logs(), key=lambda log: (log.topic, log.partition)):
        if wanted is not None and log.partition not in wanted.get(log.topic, ()):
            continue
        directory = log_manager.log_dir_of(log.topic, log.partition)
        if directory is None:
            continue
        hosted = replica_manager.get_partition(log.topic, log.partition)
        high_watermark = hosted.high_watermark if hosted is not None else log.log_end_offset
        by_dir.setdefault(os.path.abspath(directory), {}).setdefault(log.topic, []).append(
            {
                "partition_index": log.partition,
                "partition_size": log.size_in_bytes,
                "offset_lag": max(high_watermark - log.log_end_offset, 0),
                "is_future_key": False,
            }
        )
    results = []
    for directory, topics in by_dir.items():
        error = ErrorCode.none
        total = usable = -1
        if not log_manager.is_log_dir_online(directory):
            # KIP-112: a failed directory is reported with KAFKA_STORAGE_ERROR and nothing else.
            results.append(
                {
                    "error_code": ErrorCode.kafka_storage_error,
                    "log_dir": directory,
                    "topics": [],
                    "total_bytes": -1,
                    "usable_bytes": -1,
                }
            )
            continue
        try:
            stats = os.statvfs(directory)
            total, usable = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
        except OSError:
            error = ErrorCode.kafka_storage_error
        results.append(
            {
                "error_code": error,
                "log_dir": directory,
                "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()],
                "total_bytes": total,
                "usable_bytes": usable,
            }
        )
    return build_response(
        header, {"throttle_time": 0, "error_code": ErrorCode.none, "results": results}
    )


def handle_describe_cluster(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    cache = broker.metadata_cache
    endpoint_type = int(getattr(request, "endpoint_type", BROKER_ENDPOINTS))
    if endpoint_type != BROKER_ENDPOINTS:
        error: KafkaError | None = KafkaError(
            "only broker endpoints exist in ZooKeeper mode", ErrorCode.unsupported_endpoint_type
        )
    else:
        error = None
    include_operations = bool(getattr(request, "include_cluster_authorized_operations", False))
    return build_response(
        header,
        {
            "throttle_time": 0,
            "error_code": error.code if error is not None else ErrorCode.none,
            "error_message": str(error) if error is not None else None,
            "endpoint_type": endpoint_type,
            "cluster_id": broker.cluster_id,
            "controller_id": cache.controller_id,
            "brokers": [
                {"broker_id": e.id, "host": e.host, "port": e.port, "rack": e.rack}
                for b in sorted(cache.brokers.values(), key=lambda b: b.id)
                if (e := b.endpoint(context.listener)) is not None
            ]
            if error is None
            else [],
            "cluster_authorized_operations": (
                sum(
                    1 << int(op)
                    for op in CLUSTER_OPERATIONS
                    if broker.authorizer.cluster(context, op, log_if_denied=False)
                )
                if include_operations
                else AUTHORIZED_OPERATIONS_OMITTED
            ),
        },
    )
