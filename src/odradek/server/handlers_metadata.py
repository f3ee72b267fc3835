"""Metadata (api key 3): the cluster as this broker's metadata cache sees it.

Any broker answers for the whole cluster, so clients route produce and fetch requests to partition
leaders through whichever broker they bootstrap from. Unknown topics are auto-created when
`auto.create.topics.enable` is true and the client allows it (v4+: `allow_auto_topic_creation`); the
answer for such a topic is LEADER_NOT_AVAILABLE until the controller has elected its leaders, which
clients retry.

Brokers are listed with the host and port of the listener the client connected to (a broker
without that listener is left out), so that a client on the SSL listener is sent to every broker's
SSL port (Kafka's behaviour since KIP-103).

Authorization: a request for all topics silently leaves out the topics the principal may not
DESCRIBE; a named topic it may not describe gets TOPIC_AUTHORIZATION_FAILED whether or not it
exists, and is never auto-created. Auto-creation needs CREATE on the cluster or on the topic.

Responses are memoised per (version, requested topics, listener, and — with an authorizer — the
principal, its address and the ACL cache's version) and encoded once: a 10,000-partition response
takes tens of milliseconds to build in Python, and clients ask for it often.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.placement import OFFSETS_TOPIC
from odradek.errors import KafkaError
from odradek.protocol.build import build
from odradek.protocol.codec import RequestHeader, encode_body, response_class
from odradek.server.admin.topics import validate_topic_name
from odradek.server.authorization import CREATE, DESCRIBE, TOPIC, TOPIC_AUTHORIZATION_FAILED
from odradek.server.metadata_cache import NO_LEADER, MetadataCache

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

ZERO_UUID = uuid.UUID(int=0)


def _requested_topics(header: RequestHeader, request: Any) -> list[str] | None:
    topics = request.topics
    if topics is None or (header.api_version == 0 and not topics):
        return None
    names = []
    for topic in topics:
        name = topic if isinstance(topic, str) else getattr(topic, "name", None)
        if name is not None:
            names.append(name)
    return names


def _topic_metadata(cache: MetadataCache, name: str) -> dict[str, Any]:
    partitions = []
    for index, state in sorted(cache.topics.get(name, {}).items()):
        leader_alive = state.leader != NO_LEADER and state.leader in cache.brokers
        partitions.append(
            {
                "error_code": ErrorCode.none if leader_alive else ErrorCode.leader_not_available,
                "partition_index": index,
                "leader_id": state.leader if leader_alive else NO_LEADER,
                "leader_epoch": state.leader_epoch,
                "replica_nodes": state.replicas,
                "isr_nodes": state.isr,
                "offline_replicas": state.offline_replicas,
            }
        )
    return {
        "error_code": ErrorCode.none,
        "name": name,
        "topic_id": cache.topic_ids.get(name, ZERO_UUID),
        "is_internal": name == OFFSETS_TOPIC,
        "partitions": partitions,
        "topic_authorized_operations": -2147483648,
    }


def _error_topic(name: str, code: ErrorCode) -> dict[str, Any]:
    return {
        "error_code": code,
        "name": name,
        "topic_id": ZERO_UUID,
        "is_internal": False,
        "partitions": (),
        "topic_authorized_operations": -2147483648,
    }


def handle_metadata(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    cache = broker.metadata_cache
    requested = _requested_topics(header, request)
    allow_auto_create = bool(getattr(request, "allow_auto_topic_creation", True))
    authorizer = broker.authorizer
    missing = [] if requested is None else [t for t in requested if not cache.contains_topic(t)]
    memo_key: tuple[Any, ...] = (
        header.api_version,
        None if requested is None else tuple(requested),
        context.listener,
    )
    if authorizer.enabled and not authorizer.is_super_user(context):
        memo_key += (context.principal, context.client_host, authorizer.acl_version)
    if not missing:
        memoised = cache.memo(memo_key)
        if memoised is not None:
            return memoised

    topics: list[dict[str, Any]] = []
    names = sorted(cache.topics) if requested is None else requested
    describable = authorizer.filter(context, DESCRIBE, TOPIC, names)
    for name in names:
        if name not in describable:
            if requested is not None:
                topics.append(_error_topic(name, TOPIC_AUTHORIZATION_FAILED))
            continue
        if cache.contains_topic(name):
            topics.append(_topic_metadata(cache, name))
            continue
        try:
            validate_topic_name(name)
        except KafkaError as e:
            topics.append(_error_topic(name, e.code))
            continue
        if allow_auto_create and broker.config["auto.create.topics.enable"]:
            if not (
                authorizer.cluster(context, CREATE, log_if_denied=False)
                or authorizer.allowed(context, CREATE, TOPIC, name)
            ):
                topics.append(_error_topic(name, TOPIC_AUTHORIZATION_FAILED))
                continue
            broker.maybe_auto_create_topic(name)
            topics.append(_error_topic(name, ErrorCode.leader_not_available))
        else:
            topics.append(_error_topic(name, ErrorCode.unknown_topic_or_partition))

    brokers = [
        {"node_id": endpoint.id, "host": endpoint.host, "port": endpoint.port, "rack": b.rack}
        for b in sorted(cache.brokers.values(), key=lambda b: b.id)
        if (endpoint := b.endpoint(context.listener)) is not None
    ]
    values = {
        "throttle_time": 0,
        "brokers": brokers,
        "cluster_id": broker.cluster_id,
        "controller_id": cache.controller_id,
        "topics": topics,
        "cluster_authorized_operations": -2147483648,
    }
    encoded = encode_body(build(response_class(header.api_key, header.api_version), values))
    if not missing:
        cache.remember(memo_key, encoded)
    return encoded
