"""The controller-to-broker APIs: LeaderAndIsr (4), StopReplica (5), UpdateMetadata (6), and
ControlledShutdown (7, broker to controller).

Fencing: a request carrying an older controller epoch than the newest this broker has seen is refused
whole with STALE_CONTROLLER_EPOCH (a deposed controller may still be sending); one addressed to an
older incarnation of this broker (its broker epoch, the czxid of its registration) with
STALE_BROKER_EPOCH. Per-partition staleness (an older leader epoch) is answered per partition by the
replica manager.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.cluster.partition import PartitionStateInfo
from odradek.cluster.replica_manager import LeaderAndIsrPartition
from odradek.errors import KafkaError
from odradek.protocol.build import build_response
from odradek.protocol.topic_ids import uuid_to_topic_id
from odradek.server.metadata_cache import BrokerEndpoint, PartitionMetadata

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices


def _after_registration(handler: Any) -> Any:
    """Hold a controller request until this broker has registered and knows its broker epoch
    (Kafka processes no request before then). Otherwise a request addressed to a previous
    incarnation of this broker (restarted within its old session) would pass the broker epoch
    check while the epoch is still -1."""

    def wrapper(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
        if broker.broker_epoch >= 0:
            return handler(broker, context, request)

        async def later() -> Any:
            await broker.registered.wait()
            result = handler(broker, context, request)
            return await result if inspect.isawaitable(result) else result

        return later()

    return wrapper


def _broker_epoch_stale(broker: BrokerServices, broker_epoch: int) -> bool:
    current = broker.broker_epoch
    return broker_epoch >= 0 and current >= 0 and broker_epoch < current


def _controller_epoch_stale(broker: BrokerServices, controller_epoch: int) -> bool:
    return controller_epoch < broker.latest_controller_epoch


@_after_registration
def handle_leader_and_isr(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    topic_ids = {t.topic_name: t.topic_id for t in request.topic_states}

    def error_response(code: ErrorCode) -> Any:
        return build_response(
            header,
            {
                "error_code": code,
                "topics": [
                    {
                        "topic_id": t.topic_id,
                        "partition_errors": [
                            {"partition_index": p.partition_index, "error_code": code}
                            for p in t.partition_states
                        ],
                    }
                    for t in request.topic_states
                ],
            },
        )

    if _controller_epoch_stale(broker, request.controller_epoch):
        return error_response(ErrorCode.stale_controller_epoch)
    if _broker_epoch_stale(broker, request.broker_epoch):
        return error_response(ErrorCode.stale_broker_epoch)
    broker.latest_controller_epoch = request.controller_epoch

    async def apply() -> Any:
        await broker.topic_configs.ensure_loaded(list(topic_ids))
        if _controller_epoch_stale(broker, request.controller_epoch):
            return error_response(ErrorCode.stale_controller_epoch)
        states = [
            LeaderAndIsrPartition(
                topic.topic_name,
                p.partition_index,
                PartitionStateInfo(
                    controller_epoch=p.controller_epoch,
                    leader=p.leader,
                    leader_epoch=p.leader_epoch,
                    isr=tuple(p.isr),
                    zk_version=p.zk_version,
                    replicas=tuple(p.replicas),
                    is_new=p.is_new,
                ),
                topic_id=uuid_to_topic_id(topic.topic_id) if topic.topic_id else None,
            )
            for topic in request.topic_states
            for p in topic.partition_states
        ]
        live_leaders = {
            leader.broker_id: (leader.host_name, leader.port) for leader in request.live_leaders
        }
        try:
            results = broker.replica_manager.become_leader_or_follower(
                request.controller_id, request.controller_epoch, states, live_leaders
            )
        except KafkaError as e:
            return error_response(e.code)
        topics = []
        for topic in request.topic_states:
            topics.append(
                {
                    "topic_id": topic.topic_id,
                    "partition_errors": [
                        {
                            "partition_index": p.partition_index,
                            "error_code": (
                                error.code
                                if (error := results.get((topic.topic_name, p.partition_index)))
                                is not None
                                else ErrorCode.none
                            ),
                        }
                        for p in topic.partition_states
                    ],
                }
            )
        return build_response(header, {"error_code": ErrorCode.none, "topics": topics})

    return apply()


@_after_registration
def handle_update_metadata(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    if _controller_epoch_stale(broker, request.controller_epoch):
        return build_response(header, {"error_code": ErrorCode.stale_controller_epoch})
    if _broker_epoch_stale(broker, request.broker_epoch):
        return build_response(header, {"error_code": ErrorCode.stale_broker_epoch})
    broker.latest_controller_epoch = request.controller_epoch
    brokers = []
    for live in request.live_brokers:
        endpoint = next(iter(live.endpoints), None)
        if endpoint is None:
            continue
        brokers.append(BrokerEndpoint(live.id, endpoint.host, endpoint.port, live.rack))
    partitions = [
        PartitionMetadata(
            topic=topic.topic_name,
            partition=p.partition_index,
            leader=p.leader,
            leader_epoch=p.leader_epoch,
            isr=tuple(p.isr),
            replicas=tuple(p.replicas),
            offline_replicas=tuple(p.offline_replicas),
            zk_version=p.zk_version,
            controller_epoch=p.controller_epoch,
        )
        for topic in request.topic_states
        for p in topic.partition_states
    ]
    topic_ids = {t.topic_name: t.topic_id for t in request.topic_states if t.topic_id is not None}
    deleted = broker.metadata_cache.update(
        request.controller_id, request.controller_epoch, brokers, partitions, topic_ids
    )
    for topic in {t for t, _ in deleted}:
        if not broker.metadata_cache.contains_topic(topic):
            broker.forget_topic(topic)
    broker.on_metadata_updated()
    return build_response(header, {"error_code": ErrorCode.none})


@_after_registration
def handle_stop_replica(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    if _controller_epoch_stale(broker, request.controller_epoch):
        return build_response(
            header, {"error_code": ErrorCode.stale_controller_epoch, "partition_errors": ()}
        )
    if _broker_epoch_stale(broker, request.broker_epoch):
        return build_response(
            header, {"error_code": ErrorCode.stale_broker_epoch, "partition_errors": ()}
        )
    broker.latest_controller_epoch = request.controller_epoch
    partitions = [
        (topic.topic_name, p.partition_index, bool(p.delete_partition))
        for topic in request.topic_states
        for p in topic.partition_states
    ]
    try:
        results = broker.replica_manager.stop_replicas(request.controller_epoch, partitions)
    except KafkaError as e:
        return build_response(header, {"error_code": e.code, "partition_errors": ()})
    errors = [
        {
            "topic_name": topic,
            "partition_index": partition,
            "error_code": error.code if error is not None else ErrorCode.none,
        }
        for (topic, partition), error in results.items()
    ]
    return build_response(header, {"error_code": ErrorCode.none, "partition_errors": errors})


def handle_controlled_shutdown(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    controller = broker.controller

    async def wait() -> Any:
        try:
            remaining = await controller.controlled_shutdown(
                request.broker_id, request.broker_epoch
            )
        except KafkaError as e:
            return build_response(header, {"error_code": e.code, "remaining_partitions": ()})
        return build_response(
            header,
            {
                "error_code": ErrorCode.none,
                "remaining_partitions": [
                    {"topic_name": topic, "partition_index": partition}
                    for topic, partition in remaining
                ],
            },
        )

    return wait()
