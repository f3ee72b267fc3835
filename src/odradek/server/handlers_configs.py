"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44) and CreatePartitions (37).

Topic configs live in `/config/topics/<topic>` and every broker learns of a change through a
`/config/changes` notification (see `topic_configs`). DescribeConfigs answers for topics (the
effective value of every topic config this broker implements, with its source and synonyms: the
topic's override, else the broker default at its level). BROKER and BROKER_LOGGER resources (dynamic
broker configs, KIP-226, and logger levels, KIP-412) are `broker_configs`' business.

CreatePartitions grows a topic's assignment in `/brokers/topics/<topic>` (conditionally on the znode
version read); the controller's watch on that znode creates the new partitions.

Authorization: DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic (TOPIC_AUTHORIZATION_FAILED) or on the
cluster for a broker (CLUSTER_AUTHORIZATION_FAILED), per resource; CreatePartitions needs ALTER on
the topic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.errors import InvalidConfigurationError, KafkaError
from odradek.protocol.build import build_response
from odradek.server.admin.manager import ConcurrentAssignmentChange
from odradek.server.admin.topics import (
    TOPIC_CONFIGS,
    config_value_text,
    effective_topic_config,
    parse_topic_config_value,
)
from odradek.server.authorization import (
    ALTER,
    ALTER_CONFIGS,
    CLUSTER_AUTHORIZATION_FAILED,
    DESCRIBE_CONFIGS,
    TOPIC,
    TOPIC_AUTHORIZATION_FAILED,
)
from odradek.server.broker_configs import (
    alter_broker,
    alter_loggers,
    describe_broker,
    describe_loggers,
)
from odradek.server.dynamic_config import topic_synonyms

if TYPE_CHECKING:
    from odradek.network.request_context import RequestContext
    from odradek.security.acl import AclOperation
    from odradek.server.services import BrokerServices

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
BROKER_LOGGER_RESOURCE = 8
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
CONFIG_TYPES = {
    "int": 3, "long": 5, "bool": 1, "enum": 2, "string": 2, "list": 7, "double": 6, "replicas": 7
}  # fmt: skip


def _text(value: Any) -> str | None:
    return None if value is None else config_value_text(value)


async def _require_topic(broker: BrokerServices, name: str) -> None:
    """UNKNOWN_TOPIC_OR_PARTITION (UnknownTopicOrPartitionError) for a topic that does not exist.

    Kafka's ConfigHelper asks its metadata cache alone. Here a topic the cache does not know is
    looked up in ZooKeeper too, where the controller writes it first: a topic created a moment
    ago (its UpdateMetadata not yet at this broker) is described, not reported unknown. Either
    way the topic's assignment is not read: on a 10,000-partition topic that znode took 34-170 ms
    to read and decode per request."""
    if not broker.metadata_cache.contains_topic(name):
        await broker.admin.require_topic(name)


async def _describe_topic(
    broker: BrokerServices, name: str, keys: set[str] | None, include_synonyms: bool
) -> list[dict[str, Any]]:
    overrides = await broker.admin.topic_config(name)
    effective = effective_topic_config(broker.config, overrides)
    entries = []
    for key, value in sorted(effective.items()):
        if keys is not None and key not in keys:
            continue
        definition = TOPIC_CONFIGS[key]
        synonyms = topic_synonyms(broker.dynamic_config, key, overrides)
        entries.append(
            {
                "name": key,
                "value": _text(value),
                "read_only": False,
                "config_source": synonyms[0].source if synonyms else SOURCE_DEFAULT,
                "is_sensitive": False,
                "synonyms": [
                    {"name": s.name, "value": s.value, "source": s.source} for s in synonyms
                ]
                if include_synonyms
                else (),
                "config_type": CONFIG_TYPES.get(definition.kind, 2),
                "documentation": None,
            }
        )
    return entries


def handle_describe_configs(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header

    async def describe() -> Any:
        results = []
        for resource in request.resources:
            keys = (
                set(resource.configuration_keys)
                if resource.configuration_keys is not None
                else None
            )
            result: dict[str, Any] = {
                "error_code": ErrorCode.none,
                "error_message": None,
                "resource_type": resource.resource_type,
                "resource_name": resource.resource_name,
                "configs": (),
            }
            try:
                _authorize_config_resource(broker, context, resource, DESCRIBE_CONFIGS)
                if resource.resource_type == TOPIC_RESOURCE:
                    await _require_topic(broker, resource.resource_name)
                    result["configs"] = await _describe_topic(
                        broker, resource.resource_name, keys, bool(request.include_synonyms)
                    )
                elif resource.resource_type == BROKER_RESOURCE:
                    result["configs"] = describe_broker(
                        broker.dynamic_config,
                        broker.broker_id,
                        resource.resource_name,
                        resource.configuration_keys,
                        bool(request.include_synonyms),
                    )
                elif resource.resource_type == BROKER_LOGGER_RESOURCE:
                    result["configs"] = describe_loggers(
                        broker.broker_id, resource.resource_name, resource.configuration_keys
                    )
                else:
                    raise KafkaError(
                        f"resource type {resource.resource_type} is not supported",
                        ErrorCode.invalid_request,
                    )
            except KafkaError as e:
                result["error_code"] = e.code
                result["error_message"] = str(e)
            results.append(result)
        return build_response(header, {"throttle_time": 0, "results": results})

    return describe()


def _authorize_config_resource(
    broker: BrokerServices, context: RequestContext, resource: Any, operation: AclOperation
) -> None:
    """DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic, or on the cluster for a broker resource."""
    if resource.resource_type == TOPIC_RESOURCE:
        if not broker.authorizer.allowed(context, operation, TOPIC, resource.resource_name):
            raise KafkaError("Authorization failed.", TOPIC_AUTHORIZATION_FAILED)
    elif resource.resource_type in (
        BROKER_RESOURCE,
        BROKER_LOGGER_RESOURCE,
    ) and not broker.authorizer.cluster(context, operation):
        raise KafkaError("Authorization failed.", CLUSTER_AUTHORIZATION_FAILED)


async def _alter(
    broker: BrokerServices, context: RequestContext, request: Any, incremental: bool
) -> list[dict[str, Any]]:
    admin = broker.admin
    results = []
    for resource in request.resources:
        result: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "resource_type": resource.resource_type,
            "resource_name": resource.resource_name,
        }
        try:
            _authorize_config_resource(broker, context, resource, ALTER_CONFIGS)
            if resource.resource_type != TOPIC_RESOURCE:
                await _alter_broker_resource(broker, resource, incremental, request.validate_only)
                results.append(result)
                continue
            name = resource.resource_name
            current = await admin.topic_config(name) if incremental else {}
            for entry in resource.configs:
                operation = int(getattr(entry, "config_operation", OP_SET))
                if entry.name not in TOPIC_CONFIGS:
                    raise InvalidConfigurationError(
                        f"unknown or unsupported topic config {entry.name!r}"
                    )
                if operation == OP_SET:
                    if entry.value is None:
                        raise InvalidConfigurationError(f"topic config {entry.name} needs a value")
                    current[entry.name] = entry.value
                elif operation == OP_DELETE:
                    current.pop(entry.name, None)
                elif TOPIC_CONFIGS[entry.name].kind != "list":
                    raise InvalidConfigurationError(
                        f"{entry.name} is not a list config: APPEND/SUBTRACT do not apply"
                    )
                else:
                    current[entry.name] = _apply_list_operation(
                        broker, entry.name, current.get(entry.name), entry.value, operation
                    )
            if request.validate_only:
                await _require_topic(broker, name)
                from odradek.server.admin.topics import validate_topic_configs

                validate_topic_configs(current)
            else:
                await admin.set_topic_config(name, current)
        except KafkaError as e:
            result["error_code"] = e.code
            result["error_message"] = str(e)
        results.append(result)
    return results


async def _alter_broker_resource(
    broker: BrokerServices, resource: Any, incremental: bool, validate_only: bool
) -> None:
    """BROKER (dynamic broker configs) and, incrementally only, BROKER_LOGGER."""
    if resource.resource_type == BROKER_RESOURCE:
        await alter_broker(
            broker.admin.zk,
            broker.dynamic_config,
            broker.broker_id,
            resource.resource_name,
            resource.configs,
            incremental,
            validate_only,
        )
    elif resource.resource_type == BROKER_LOGGER_RESOURCE and incremental:
        alter_loggers(broker.broker_id, resource.resource_name, resource.configs, validate_only)
    else:
        raise KafkaError(
            f"Unknown resource type {resource.resource_type}", ErrorCode.invalid_request
        )


def _apply_list_operation(
    broker: BrokerServices, name: str, current: str | None, value: str | None, operation: int
) -> str:
    """APPEND or SUBTRACT `value`'s items to or from the topic's list (its override, else the
    broker default), as Kafka's IncrementalAlterConfigs does."""
    base = parse_topic_config_value(
        name,
        current
        if current is not None
        else config_value_text(TOPIC_CONFIGS[name].broker_default(broker.config)),
    )
    items = parse_topic_config_value(name, value or "")
    if operation == OP_APPEND:
        result = tuple(dict.fromkeys((*base, *items)))
    else:
        result = tuple(item for item in base if item not in items)
    return config_value_text(result)


def handle_alter_configs(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header

    async def alter() -> Any:
        return build_response(
            header, {"throttle_time": 0, "responses": await _alter(broker, context, request, False)}
        )

    return alter()


def handle_incremental_alter_configs(
    broker: BrokerServices, context: RequestContext, request: Any
) -> Any:
    header = context.header

    async def alter() -> Any:
        return build_response(
            header, {"throttle_time": 0, "responses": await _alter(broker, context, request, True)}
        )

    return alter()


def handle_create_partitions(broker: BrokerServices, context: RequestContext, request: Any) -> Any:
    header = context.header

    async def create() -> Any:
        results = []
        grown: dict[str, int] = {}
        for topic in request.topics:
            result: dict[str, Any] = {
                "name": topic.name,
                "error_code": ErrorCode.none,
                "error_message": None,
            }
            try:
                if not broker.authorizer.allowed(context, ALTER, TOPIC, topic.name):
                    raise KafkaError("Authorization failed.", TOPIC_AUTHORIZATION_FAILED)
                manual = (
                    [list(a.broker_ids) for a in topic.assignments] if topic.assignments else None
                )
                for attempt in range(3):
                    current, added = await broker.admin.prepare_partitions(
                        topic.name, topic.count, manual
                    )
                    if request.validate_only:
                        break
                    try:
                        await broker.admin.add_partitions(current, added)
                        grown[topic.name] = topic.count
                        break
                    except ConcurrentAssignmentChange:
                        if attempt == 2:
                            raise
            except KafkaError as e:
                result["error_code"] = e.code
                result["error_message"] = str(e)
            results.append(result)
        if grown:
            ready = await broker.wait_for_metadata(
                lambda: all(
                    broker.metadata_cache.partition_count(t) >= n
                    and all(p.leader >= 0 for p in broker.metadata_cache.topics.get(t, {}).values())
                    for t, n in grown.items()
                ),
                max(0.0, request.timeout.total_seconds()),
            )
            if not ready:
                for result in results:
                    if result["name"] in grown:
                        result["error_code"] = ErrorCode.request_timed_out
        return build_response(header, {"throttle_time": 0, "results": results})

    return create()
