"""The transaction APIs as the broker serves them: authorization in front of the transaction
coordinator's handlers (`odradek.coordinator.transaction.handlers`), and the partition leader's
side of a transaction, WriteTxnMarkers (27).

Authorization (`odradek.security.api_acls`, as Kafka's KafkaApis):

| API | check | refused |
|---|---|---|
| AddPartitionsToTxn | WRITE on the transactional id, then WRITE on each topic | whole request / TOPIC_AUTHORIZATION_FAILED for refused topics, OPERATION_NOT_ATTEMPTED for the rest |
| AddOffsetsToTxn | WRITE on the transactional id, READ on the group | TRANSACTIONAL_ID_ / GROUP_AUTHORIZATION_FAILED |
| EndTxn | WRITE on the transactional id | TRANSACTIONAL_ID_AUTHORIZATION_FAILED |
| WriteTxnMarkers | CLUSTER_ACTION (brokers only) | CLUSTER_AUTHORIZATION_FAILED per partition |
| DescribeTransactions | DESCRIBE on each id | that id |
| ListTransactions | DESCRIBE on each listed id | silently left out |

WriteTxnMarkers: for each marker and partition, the leader appends one control batch (COMMIT or
ABORT, `log_records.build_marker_batch`) with the producer's id and epoch, acks=all; the partition
is answered once the high watermark passes the marker (so that a marker acknowledged to the
coordinator survives a leader change), NOT_LEADER_OR_FOLLOWER / NOT_ENOUGH_REPLICAS /
UNKNOWN_TOPIC_OR_PARTITION otherwise, which the coordinator's marker sender retries. The batch is
built here, by the broker, and appended with origin COORDINATOR (the only origin whose control
batches the log accepts).

Concurrency: event-loop thread, like every handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.placement import OFFSETS_TOPIC
from odradek.coordinator.transaction import handlers as txn_handlers
from odradek.coordinator.transaction.log_records import build_marker_batch
from odradek.errors import KafkaError
from odradek.log.producer_state import AppendOrigin
from odradek.protocol.build import build_response
from odradek.server.authorization import (
    CLUSTER_ACTION,
    DESCRIBE,
    GROUP,
    GROUP_AUTHORIZATION_FAILED,
    READ,
    TOPIC,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID,
    WRITE,
    error_for,
)

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

TRANSACTIONAL_ID_AUTHORIZATION_FAILED = error_for(TRANSACTIONAL_ID)
MARKER_TIMEOUT_S = 30.0


def _may_write_txn(broker: BrokerServices, context: RequestContext, transactional_id: str) -> bool:
    return broker.authorizer.allowed(context, WRITE, TRANSACTIONAL_ID, transactional_id)


def handle_add_partitions_to_txn(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    if header.api_version >= 4:
        if not broker.authorizer.cluster(context, CLUSTER_ACTION):
            return build_response(
                header,
                {
                    "throttle_time": 0,
                    "error_code": ErrorCode.cluster_authorization_failed,
                    "results_by_transaction": [],
                },
            )
        return txn_handlers.handle_add_partitions_to_txn(broker, context, request)
    topics = txn_handlers.v3_topics(request)
    if not _may_write_txn(broker, context, request.v3_and_below_transactional_id):
        refused = dict.fromkeys(
            ((n, p) for n, ids in topics for p in ids), TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        )
        return txn_handlers.v3_response(header, topics, refused)
    denied = {n for n, _ in topics if not broker.authorizer.allowed(context, WRITE, TOPIC, n)}
    unknown = {n for n, _ in topics if not broker.metadata_cache.contains_topic(n)}
    if denied or unknown:
        errors = {}
        for name, ids in topics:
            for p in ids:
                if name in denied:
                    errors[(name, p)] = TOPIC_AUTHORIZATION_FAILED
                elif name in unknown:
                    errors[(name, p)] = ErrorCode.unknown_topic_or_partition
                else:
                    errors[(name, p)] = ErrorCode.operation_not_attempted
        return txn_handlers.v3_response(header, topics, errors)
    return txn_handlers.handle_add_partitions_to_txn(broker, context, request)


def handle_add_offsets_to_txn(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    if not _may_write_txn(broker, context, request.transactional_id):
        error = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif not broker.authorizer.allowed(context, READ, GROUP, request.group_id):
        error = GROUP_AUTHORIZATION_FAILED
    else:
        return txn_handlers.handle_add_offsets_to_txn(broker, context, request)
    return build_response(context.header, {"throttle_time": 0, "error_code": error})


def handle_end_txn(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    if not _may_write_txn(broker, context, request.transactional_id):
        return build_response(
            context.header,
            {"throttle_time": 0, "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED},
        )
    return txn_handlers.handle_end_txn(broker, context, request)


def handle_describe_transactions(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    response = txn_handlers.handle_describe_transactions(broker, context, request)
    if not broker.authorizer.enabled:
        return response
    import dataclasses

    states = []
    for state in response.transaction_states:
        if not broker.authorizer.allowed(
            context, DESCRIBE, TRANSACTIONAL_ID, state.transactional_id
        ):
            state = dataclasses.replace(
                state, error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED, topics=()
            )
        else:
            visible = broker.authorizer.filter(
                context, DESCRIBE, TOPIC, [t.topic for t in state.topics]
            )
            state = dataclasses.replace(
                state, topics=tuple(t for t in state.topics if t.topic in visible)
            )
        states.append(state)
    return dataclasses.replace(response, transaction_states=tuple(states))


def handle_list_transactions(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    response = txn_handlers.handle_list_transactions(broker, context, request)
    if not broker.authorizer.enabled:
        return response
    import dataclasses

    visible = broker.authorizer.filter(
        context,
        DESCRIBE,
        TRANSACTIONAL_ID,
        [s.transactional_id for s in response.transaction_states],
    )
    return dataclasses.replace(
        response,
        transaction_states=tuple(
            s for s in response.transaction_states if s.transactional_id in visible
        ),
    )


# ---------------------------------------------------------------------------------------------
# WriteTxnMarkers


def handle_write_txn_markers(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    allowed = broker.authorizer.cluster(context, CLUSTER_ACTION)
    now_ms = int(time.time() * 1000)
    waits: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
    markers = []
    for marker in request.markers:
        topics = []
        for topic in marker.topics:
            partitions = []
            for index in topic.partition_indexes:
                result: dict[str, Any] = {"partition_index": index, "error_code": ErrorCode.none}
                partitions.append(result)
                if not allowed:
                    result["error_code"] = ErrorCode.cluster_authorization_failed
                    continue
                try:
                    wait = _append_marker(broker, topic.name, int(index), marker, now_ms)
                except KafkaError as e:
                    result["error_code"] = ErrorCode(e.code)
                    continue
                waits.append((result, wait))
            topics.append({"name": topic.name, "partitions": partitions})
        markers.append({"producer_id": marker.producer_id, "topics": topics})

    def answer() -> Any:
        return build_response(header, {"markers": markers})

    if not waits:
        return answer()

    async def wait_all() -> Any:
        for result, wait in waits:
            try:
                async with asyncio.timeout(MARKER_TIMEOUT_S):
                    await wait
            except TimeoutError:
                result["error_code"] = ErrorCode.request_timed_out
            except KafkaError as e:
                result["error_code"] = ErrorCode(e.code)
            except Exception:
                result["error_code"] = ErrorCode.not_leader_or_follower
            finally:
                if not wait.done():
                    wait.cancel()
                with contextlib.suppress(BaseException):
                    wait.exception() if wait.done() and not wait.cancelled() else None
        return answer()

    return wait_all()


def _append_marker(
    broker: BrokerServices, topic: str, partition_index: int, marker: Any, now_ms: int
) -> asyncio.Future[None]:
    """Append one control batch as leader; the future completes when the HW passes it."""
    partition = broker.replica_manager.leader_partition(topic, partition_index)
    batch = build_marker_batch(
        int(marker.producer_id),
        int(marker.producer_epoch),
        bool(marker.transaction_result),
        int(marker.coordinator_epoch),
        now_ms,
    )
    info = partition.append_records_to_leader(batch, -1, now_ms, origin=AppendOrigin.COORDINATOR)
    if topic == OFFSETS_TOPIC:
        broker.txn_offsets.complete(
            partition_index, int(marker.producer_id), bool(marker.transaction_result)
        )
    return partition.wait_for_high_watermark(info.last_offset + 1)


# ---------------------------------------------------------------------------------------------
# TxnOffsetCommit


def handle_txn_offset_commit(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    """Offsets of a transaction, pending until its marker (`coordinator.group.txn_offsets`)."""
    from odradek.coordinator.group.offsets import OffsetAndMetadata

    header = context.header
    topics = [(t.name, list(t.partitions)) for t in request.topics]

    def answer(error_of: Any) -> Any:
        return build_response(
            header,
            {
                "throttle_time": 0,
                "topics": [
                    {
                        "name": name,
                        "partitions": [
                            {"partition_index": p.partition_index, "error_code": error_of(name)}
                            for p in partitions
                        ],
                    }
                    for name, partitions in topics
                ],
            },
        )

    if not _may_write_txn(broker, context, request.transactional_id):
        return answer(lambda _name: TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not broker.authorizer.allowed(context, READ, GROUP, request.group_id):
        return answer(lambda _name: GROUP_AUTHORIZATION_FAILED)
    denied = {n for n, _ in topics if not broker.authorizer.allowed(context, READ, TOPIC, n)}
    now_ms = int(time.time() * 1000)
    offsets = {
        (name, int(p.partition_index)): OffsetAndMetadata(
            int(p.committed_offset),
            int(getattr(p, "committed_leader_epoch", -1)),
            p.committed_metadata or "",
            now_ms,
        )
        for name, partitions in topics
        if name not in denied
        for p in partitions
    }
    outcome = broker.txn_offsets.commit(
        request.group_id,
        int(request.producer_id),
        int(request.producer_epoch),
        getattr(request, "member_id", "") or "",
        getattr(request, "group_instance_id", None),
        int(getattr(request, "generation_id", -1)),
        offsets,
    )

    def finish(error: ErrorCode) -> Any:
        if error is ErrorCode.producer_fenced and header.api_version < 3:
            error = ErrorCode.invalid_producer_epoch
        return answer(lambda name: TOPIC_AUTHORIZATION_FAILED if name in denied else error)

    if isinstance(outcome, ErrorCode):
        return finish(outcome)

    async def wait() -> Any:
        return finish(await outcome)

    return wait()


# ---------------------------------------------------------------------------------------------
# DescribeProducers


def handle_describe_producers(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    """The active producers of each partition this broker leads (KIP-664): their epoch, last
    sequence and timestamp, the coordinator epoch of their last marker and the first offset of
    their open transaction (-1 when none). READ on the topic, else TOPIC_AUTHORIZATION_FAILED."""
    topics = []
    for topic in request.topics:
        allowed = broker.authorizer.allowed(context, READ, TOPIC, topic.name)
        partitions = []
        for index in topic.partition_indexes:
            entry: dict[str, Any] = {
                "partition_index": index,
                "error_code": ErrorCode.none,
                "error_message": None,
                "active_producers": [],
            }
            partitions.append(entry)
            if not allowed:
                entry["error_code"] = TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                partition = broker.replica_manager.leader_partition(topic.name, int(index))
            except KafkaError as e:
                entry["error_code"] = ErrorCode(e.code)
                entry["error_message"] = str(e)
                continue
            state = partition.log.producer_state
            entry["active_producers"] = [
                {
                    "producer_id": producer.producer_id,
                    "producer_epoch": producer.producer_epoch,
                    "last_sequence": producer.last_seq,
                    "last_timestamp": producer.last_timestamp,
                    "coordinator_epoch": producer.coordinator_epoch,
                    "current_txn_start_offset": producer.current_txn_first_offset,
                }
                for producer in sorted(state.producers.values(), key=lambda p: p.producer_id)
            ]
        topics.append({"name": topic.name, "partitions": partitions})
    return build_response(context.header, {"throttle_time": 0, "topics": topics})
