"""CreateTopics (19) and DeleteTopics (20), accepted by any broker.

CreateTopics validates each topic (name, partitions, replication factor, configs, explicit
assignment), writes it to ZooKeeper, and answers once this broker's metadata shows a leader for every
partition of the created topics, or at the request's timeout (REQUEST_TIMED_OUT; the topic is created
anyway, as in Kafka). `validate_only` checks everything and writes nothing. DeleteTopics queues the
topics for the controller and answers once they are gone from this broker's metadata (or at timeout).

Authorization: CreateTopics needs CREATE on the cluster or else on each topic, and returns a
created topic's configs only with DESCRIBE_CONFIGS on it; DeleteTopics needs DELETE on each topic.
A refused topic gets TOPIC_AUTHORIZATION_FAILED and is left alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.errors import KafkaError, TopicDeletionDisabledError
from odradek.protocol.build import build_response
from odradek.server.admin.manager import TopicCreation
from odradek.server.admin.topics import config_value_text, effective_topic_config
from odradek.server.authorization import (
    CREATE,
    DELETE,
    DESCRIBE_CONFIGS,
    TOPIC,
    TOPIC_AUTHORIZATION_FAILED,
)

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.server.services import BrokerServices

log = logging.getLogger(__name__)


def _timeout_seconds(request: Any) -> float:
    return max(0.0, request.timeout.total_seconds())


def handle_create_topics(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    cluster_create = broker.authorizer.cluster(context, CREATE, log_if_denied=False)

    async def create() -> Any:
        results: dict[str, dict[str, Any]] = {}
        created: list[TopicCreation] = []
        seen: set[str] = set()
        for topic in request.topics:
            name = topic.name
            result: dict[str, Any] = {
                "name": name,
                "error_code": ErrorCode.none,
                "error_message": None,
                "num_partitions": -1,
                "replication_factor": -1,
                "configs": None,
                "topic_id": None,
            }
            results[name] = result
            if name in seen:
                result["error_code"] = ErrorCode.invalid_request
                result["error_message"] = f"topic {name!r} appears more than once in the request"
                continue
            seen.add(name)
            if not cluster_create and not broker.authorizer.allowed(context, CREATE, TOPIC, name):
                result["error_code"] = TOPIC_AUTHORIZATION_FAILED
                result["error_message"] = "Authorization failed."
                continue
            try:
                manual = {a.partition_index: list(a.broker_ids) for a in topic.assignments}
                if manual and (topic.num_partitions != -1 or topic.replication_factor != -1):
                    raise KafkaError(
                        "num_partitions and replication_factor must be -1 with an explicit assignment",
                        ErrorCode.invalid_request,
                    )
                configs = {c.name: c.value for c in topic.configs}
                creation = await broker.admin.prepare_topic(
                    name, topic.num_partitions, topic.replication_factor, manual, configs
                )
                if not request.validate_only:
                    await broker.admin.create_topic(creation)
                created.append(creation)
            except KafkaError as e:
                result["error_code"] = e.code
                result["error_message"] = str(e)
                continue
            result["num_partitions"] = len(creation.assignment)
            result["replication_factor"] = len(next(iter(creation.assignment.values())))
            from odradek.protocol.topic_ids import topic_id_to_uuid

            result["topic_id"] = topic_id_to_uuid(creation.topic_id)
            if not broker.authorizer.allowed(context, DESCRIBE_CONFIGS, TOPIC, name):
                result["topic_config_error_code"] = TOPIC_AUTHORIZATION_FAILED
                continue
            effective = effective_topic_config(broker.config, creation.configs)
            result["configs"] = [
                {
                    "name": key,
                    "value": config_value_text(value),
                    "read_only": False,
                    "config_source": 1 if key in creation.configs else 5,
                    "is_sensitive": False,
                }
                for key, value in sorted(effective.items())
            ]
        if created and not request.validate_only:
            ready = await broker.wait_for_metadata(
                lambda: all(
                    broker.metadata_cache.partition_count(c.name) == len(c.assignment)
                    and all(
                        p.leader >= 0 for p in broker.metadata_cache.topics.get(c.name, {}).values()
                    )
                    for c in created
                ),
                _timeout_seconds(request),
            )
            if not ready:
                for creation in created:
                    results[creation.name]["error_code"] = ErrorCode.request_timed_out
                    results[creation.name]["error_message"] = (
                        "the topic was created but its leaders were not elected within the timeout"
                    )
        return build_response(header, {"throttle_time": 0, "topics": list(results.values())})

    return create()


def handle_delete_topics(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header
    if hasattr(request, "topics"):
        names = [t.name for t in request.topics]
    else:
        names = list(request.topic_names)

    async def delete() -> Any:
        results = []
        queued = []
        for name in names:
            entry: dict[str, Any] = {
                "name": name,
                "topic_id": None,
                "error_code": ErrorCode.none,
                "error_message": None,
            }
            try:
                if name is None:
                    raise KafkaError(
                        "deleting topics by id is not supported", ErrorCode.unsupported_version
                    )
                if not broker.authorizer.allowed(context, DELETE, TOPIC, name):
                    raise KafkaError("Authorization failed.", TOPIC_AUTHORIZATION_FAILED)
                if not broker.config["delete.topic.enable"]:
                    raise TopicDeletionDisabledError(
                        "topic deletion is disabled (delete.topic.enable=false)"
                    )
                await broker.admin.delete_topic(name)
                queued.append(name)
            except KafkaError as e:
                entry["error_code"] = e.code
                entry["error_message"] = str(e)
            results.append(entry)
        if queued:
            done = await broker.wait_for_metadata(
                lambda: not any(broker.metadata_cache.contains_topic(n) for n in queued),
                _timeout_seconds(request),
            )
            if not done:
                for entry in results:
                    if entry["name"] in queued:
                        entry["error_code"] = ErrorCode.request_timed_out
        return build_response(header, {"throttle_time": 0, "responses": results})

    return delete()
