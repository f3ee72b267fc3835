"""The controller-to-broker APIs: LeaderAndIsr (4), StopReplica (5), UpdateMetadata (6), and
ControlledShutdown (7, broker to controller).

Who may send them (issue 14), checked before anything changes, in this order:

1. CLUSTER_ACTION on the cluster (brokers are super users by principal); otherwise
   CLUSTER_AUTHORIZATION_FAILED.
2. The controller id and epoch must be ZooKeeper's (`/controller`, `/controller_epoch`, read after
   a `sync` when a newer epoch than the verified one arrives) and the broker epoch this broker's
   own registration: `odradek.security.controller_requests.ControllerEpochValidator`. A deposed
   controller, a forged epoch (even a huge one, which Kafka would accept) or a request meant for
   an earlier incarnation of this broker is refused whole with STALE_CONTROLLER_EPOCH or
   STALE_BROKER_EPOCH, and the verified controller stays the real one.

Per-partition staleness (an older leader epoch) is answered per partition by the replica manager.
ControlledShutdown is checked by the controller (only the live broker itself, with its exact broker
epoch: `validate_controlled_shutdown`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.cluster.partition import PartitionStateInfo
from odradek.cluster.replica_roles import LeaderAndIsrPartition
from odradek.controller.gc_pause import paused_gc
from odradek.errors import KafkaError
from odradek.protocol.build import build_response
from odradek.protocol.topic_ids import uuid_to_topic_id
from odradek.server.authorization import CLUSTER_ACTION, CLUSTER_AUTHORIZATION_FAILED
from odradek.server.metadata_cache import LiveBroker, PartitionMetadata
from odradek.server.offsets_topic import on_leadership_change
from odradek.server.transaction_topic import (
    on_leadership_change as on_transaction_leadership_change,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices


# The controller request of each connection still being applied (broker -> connection id ->
# future): the next one from that connection starts after it.
_applying: weakref.WeakKeyDictionary[Any, dict[str, asyncio.Future[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _controller_request(
    broker: BrokerServices,
    context: RequestContext,
    request: Any,
    refuse: Callable[[ErrorCode], Any],
    apply: Callable[[], Any],
) -> Any:
    """Run `apply()` only for a request that may come from the controller (module docstring);
    otherwise answer `refuse(code)` and change nothing.

    A connection's controller requests are applied one after another in the order they came: the
    controller writes an event's LeaderAndIsr and UpdateMetadata back to back, and a LeaderAndIsr
    may wait (for topic configs, or for this broker's registration) while an UpdateMetadata would
    not: applied first, it would name leaders that are not leading yet."""
    if not broker.authorizer.cluster(context, CLUSTER_ACTION):
        return refuse(CLUSTER_AUTHORIZATION_FAILED)
    connections = _applying.setdefault(broker, {})
    key = context.connection_id
    previous = connections.get(key)
    if previous is None or previous.done():
        result = _checked_controller_request(broker, request, refuse, apply)
        if not inspect.isawaitable(result):
            connections.pop(key, None)
            return result
        current = asyncio.ensure_future(result)
    else:

        async def after_previous() -> Any:
            await asyncio.wait([previous])
            result = _checked_controller_request(broker, request, refuse, apply)
            return await result if inspect.isawaitable(result) else result

        current = asyncio.ensure_future(after_previous())
    connections[key] = current
    current.add_done_callback(lambda done: _forget(connections, key, done))
    return current


def _forget(
    connections: dict[str, asyncio.Future[Any]], key: str, done: asyncio.Future[Any]
) -> None:
    if connections.get(key) is done:
        del connections[key]


def _checked_controller_request(
    broker: BrokerServices,
    request: Any,
    refuse: Callable[[ErrorCode], Any],
    apply: Callable[[], Any],
) -> Any:
    """The controller id and epochs checked (a cached verdict at once, else after ZooKeeper is
    asked), then `apply()` or `refuse(code)`: a result, or an awaitable of one."""
    validator = broker.controller_validator
    ids = (int(request.controller_id), int(request.controller_epoch), int(request.broker_epoch))
    if broker.broker_epoch >= 0:
        verdict = validator.check_cached(*ids)
        if verdict is not None:
            return _accepted(broker, request, refuse, apply, verdict.error)

    async def later() -> Any:
        # Held until this broker has registered and knows its broker epoch (Kafka processes no
        # request before then): otherwise a request addressed to a previous incarnation of this
        # broker, restarted within its old session, would be checked against epoch -1.
        await broker.registered.wait()
        verdict = await validator.validate(*ids)
        result = _accepted(broker, request, refuse, apply, verdict.error)
        return await result if inspect.isawaitable(result) else result

    return later()


def _accepted(
    broker: BrokerServices,
    request: Any,
    refuse: Callable[[ErrorCode], Any],
    apply: Callable[[], Any],
    error: ErrorCode | None,
) -> Any:
    if error is not None:
        return refuse(error)
    broker.latest_controller_epoch = max(
        broker.latest_controller_epoch, int(request.controller_epoch)
    )
    return apply()


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

    def apply() -> Any:
        # At once when every topic's config is known (the usual case: the UpdateMetadata written
        # right behind this request is then applied in the same turn of the loop, not after
        # whatever else the loop has queued meanwhile); otherwise after reading the configs.
        if broker.topic_configs.loaded(topic_ids):
            return apply_loaded()

        async def load_then_apply() -> Any:
            await broker.topic_configs.ensure_loaded(list(topic_ids))
            return apply_loaded()

        return load_then_apply()

    def apply_loaded() -> Any:
        if request.controller_epoch < broker.latest_controller_epoch:
            return error_response(ErrorCode.stale_controller_epoch)
        # Thousands of partitions at once after a failover: the collector would walk the whole
        # heap many times over (odradek.controller.gc_pause).
        with paused_gc():
            return apply_states()

    def apply_states() -> Any:
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
                topic_id=topic_id,
            )
            for topic in request.topic_states
            for topic_id in [uuid_to_topic_id(topic.topic_id) if topic.topic_id else None]
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
        applied = [s for s in states if results.get((s.topic, s.partition)) is None]
        led = [
            (s.topic, s.partition, s.state.leader_epoch)
            for s in applied
            if s.state.leader == broker.broker_id
        ]
        followed = [(s.topic, s.partition) for s in applied if s.state.leader != broker.broker_id]
        on_leadership_change(broker.group_coordinator.manager, led, followed)
        on_transaction_leadership_change(broker.transaction_coordinator, led, followed)
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

    return _controller_request(broker, context, request, error_response, apply)


def handle_update_metadata(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header

    def error_response(code: ErrorCode) -> Any:
        return build_response(header, {"error_code": code})

    def apply() -> Any:
        with paused_gc():  # as for LeaderAndIsr
            return apply_metadata()

    def apply_metadata() -> Any:
        brokers = [
            LiveBroker(
                live.id,
                {e.listener: (e.host, e.port) for e in live.endpoints},
                live.rack,
            )
            for live in request.live_brokers
            if live.endpoints
        ]
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
        topic_ids = {
            t.topic_name: t.topic_id for t in request.topic_states if t.topic_id is not None
        }
        cache = broker.metadata_cache
        deleted = cache.update(
            request.controller_id, request.controller_epoch, brokers, partitions, topic_ids
        )
        if cache.leaders_changed:
            # As the LeaderAndIsr line: when clients asking this broker learn of new leaders.
            log.info(
                "UpdateMetadata from controller %d (epoch %d): new leaders for %d partitions",
                request.controller_id,
                request.controller_epoch,
                cache.leaders_changed,
            )
        for topic in {t for t, _ in deleted}:
            if not broker.metadata_cache.contains_topic(topic):
                broker.forget_topic(topic)
        broker.on_metadata_updated()
        return build_response(header, {"error_code": ErrorCode.none})

    return _controller_request(broker, context, request, error_response, apply)


def handle_stop_replica(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header

    def error_response(code: ErrorCode) -> Any:
        return build_response(header, {"error_code": code, "partition_errors": ()})

    def apply() -> Any:
        partitions = [
            (topic.topic_name, p.partition_index, bool(p.delete_partition))
            for topic in request.topic_states
            for p in topic.partition_states
        ]
        try:
            results = broker.replica_manager.stop_replicas(request.controller_epoch, partitions)
        except KafkaError as e:
            return error_response(e.code)
        stopped = [key for key, e in results.items() if e is None]
        on_leadership_change(broker.group_coordinator.manager, (), stopped)
        on_transaction_leadership_change(broker.transaction_coordinator, (), stopped)
        errors = [
            {
                "topic_name": topic,
                "partition_index": partition,
                "error_code": error.code if error is not None else ErrorCode.none,
            }
            for (topic, partition), error in results.items()
        ]
        return build_response(header, {"error_code": ErrorCode.none, "partition_errors": errors})

    return _controller_request(broker, context, request, error_response, apply)


def handle_controlled_shutdown(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header
    controller = broker.controller
    if not broker.authorizer.cluster(context, CLUSTER_ACTION):
        return build_response(
            header, {"error_code": CLUSTER_AUTHORIZATION_FAILED, "remaining_partitions": ()}
        )

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
