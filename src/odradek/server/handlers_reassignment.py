"""AlterPartitionReassignments (45) and ListPartitionReassignments (46), KIP-455, version 0.

Both are answered by the active controller only; any other broker answers with a top-level
NOT_CONTROLLER (the admin client then finds the controller in Metadata and retries there), as Kafka
in ZooKeeper mode does. The controller does the work on its event queue (`reassignment`):

* Alter answers once each partition's move has been started (or refused): its error per partition is
  UNKNOWN_TOPIC_OR_PARTITION (no such partition, or its topic is being deleted),
  INVALID_REPLICA_ASSIGNMENT (an empty list, a broker twice, a negative id, or a new replica on a
  broker that is not live), NO_REASSIGNMENT_IN_PROGRESS (a cancellation — null replicas — of a
  partition that is not moving), or NONE. It does not wait for the moves to complete: List (or the
  assignment in Metadata) shows when they have. A partition named twice takes its last entry.
* List returns, for every partition being moved (or those of the requested ones that are), its
  current replica set RS with the replicas being added and removed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.errors import KafkaError
from odradek.protocol.build import build_response
from odradek.server.authorization import ALTER, CLUSTER_AUTHORIZATION_FAILED, DESCRIBE

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

log = logging.getLogger(__name__)


def handle_alter_partition_reassignments(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    controller = broker.controller
    if not broker.authorizer.cluster(context, ALTER):
        return build_response(
            header,
            {
                "error_code": CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "Authorization failed.",
                "responses": [],
            },
        )
    reassignments: dict[tuple[str, int], tuple[int, ...] | None] = {}
    for topic in request.topics:
        for p in topic.partitions:
            replicas = None if p.replicas is None else tuple(int(r) for r in p.replicas)
            reassignments[(topic.name, int(p.partition_index))] = replicas

    async def alter() -> Any:
        try:
            results = await controller.alter_partition_reassignments(reassignments)
        except KafkaError as e:
            return build_response(
                header,
                {
                    "throttle_time": 0,
                    "error_code": e.code,
                    "error_message": str(e),
                    "responses": [],
                },
            )
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), error in results.items():
            by_topic.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "error_code": error.code if error is not None else ErrorCode.none,
                    "error_message": str(error) if error is not None else None,
                }
            )
        return build_response(
            header,
            {
                "throttle_time": 0,
                "error_code": ErrorCode.none,
                "error_message": None,
                "responses": [
                    {"name": topic, "partitions": sorted(parts, key=lambda p: p["partition_index"])}
                    for topic, parts in sorted(by_topic.items())
                ],
            },
        )

    return alter()


def handle_list_partition_reassignments(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    controller = broker.controller
    if not broker.authorizer.cluster(context, DESCRIBE):
        return build_response(
            header,
            {
                "error_code": CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "Authorization failed.",
                "topics": [],
            },
        )
    partitions: frozenset[tuple[str, int]] | None = None
    if request.topics is not None:
        partitions = frozenset(
            (topic.name, int(index))
            for topic in request.topics
            for index in topic.partition_indexes
        )

    async def list_() -> Any:
        try:
            moving = await controller.list_partition_reassignments(partitions)
        except KafkaError as e:
            return build_response(
                header,
                {"throttle_time": 0, "error_code": e.code, "error_message": str(e), "topics": []},
            )
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), assignment in sorted(moving.items()):
            by_topic.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "replicas": list(assignment.replicas),
                    "adding_replicas": list(assignment.adding_replicas),
                    "removing_replicas": list(assignment.removing_replicas),
                }
            )
        return build_response(
            header,
            {
                "throttle_time": 0,
                "error_code": ErrorCode.none,
                "error_message": None,
                "topics": [
                    {"name": topic, "partitions": parts}
                    for topic, parts in sorted(by_topic.items())
                ],
            },
        )

    return list_()
