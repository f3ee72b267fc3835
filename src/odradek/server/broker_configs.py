"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs on BROKER and BROKER_LOGGER
resources (Kafka's ConfigHelper, ConfigAdminManager and ZkAdminManager for brokers).

BROKER, resource name = a broker id: that broker's configs. Describe lists every config with its
effective value, `config_source` (the level it comes from: see `odradek.server.dynamic_config`),
`read_only` (false for the dynamic ones), `is_sensitive` (passwords: value null) and, with
`include_synonyms`, every level's value in precedence order. Altering needs that broker itself
(`Unexpected broker id, expected 1, but received 2`, INVALID_REQUEST, as Kafka): the request
replaces (AlterConfigs) or edits (IncrementalAlterConfigs: SET, DELETE, and APPEND/SUBTRACT on
list configs) `/config/brokers/<id>`.

BROKER, resource name "": the cluster-wide default, `/config/brokers/<default>`, which any broker
describes (only the configs set there) and alters.

A change is validated on the receiving broker (`DynamicBrokerConfig.validate`), then, unless
`validate_only`, written to the znode followed by a `/config/changes/config_change_<seq>`
notification `{"version":2,"entity_path":"brokers/<id or <default>>"}`: every broker (the
receiving one too) applies it when the notification arrives (`dynamic_config_manager`).

BROKER_LOGGER (name = this broker's id): the loggers of `odradek.server.broker_loggers`; only
IncrementalAlterConfigs changes them (legacy AlterConfigs says `Unknown resource type 8`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from odradek.errors import InvalidConfigurationError, InvalidRequestError
from odradek.server import broker_loggers
from odradek.server.config import DEFINITIONS
from odradek.server.dynamic_config import (
    DEFAULT_CONFIG,
    DEFAULT_ENTITY,
    DYNAMIC_BROKER_LOGGER_CONFIG,
    DYNAMIC_DEFAULT_BROKER_CONFIG,
    THROTTLE_CONFIGS,
    DynamicBrokerConfig,
    is_dynamic,
    is_list_config,
    is_sensitive,
    usable_configs,
    value_text,
)
from odradek.zk.client import ZkClient
from odradek.zk.errors import NoNodeError
from odradek.zk.znodes import BrokerConfigZNode, ConfigChangeNotificationSequenceZNode

log = logging.getLogger(__name__)

OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
# Kafka's DescribeConfigsResponse.ConfigType ids.
_CONFIG_TYPES = {"bool": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7}
_PASSWORD_TYPE, _UNKNOWN_TYPE = 9, 0


async def read_broker_config(zk: ZkClient, entity: str) -> dict[str, str]:
    """The stored configs of `/config/brokers/<entity>` (empty when the znode does not exist)."""
    try:
        data, stat = await zk.get(BrokerConfigZNode.path(entity))
    except NoNodeError:
        return {}
    return dict(BrokerConfigZNode.decode(data, stat.version, entity).config)


async def write_broker_config(zk: ZkClient, entity: str, config: Mapping[str, str]) -> None:
    """Replace `/config/brokers/<entity>` and notify every broker (Kafka's changeBrokerConfig)."""
    path = BrokerConfigZNode.path(entity)
    data = BrokerConfigZNode.encode(config)
    try:
        await zk.set(path, data)
    except NoNodeError:
        await zk.create(path, data, makepath=True)
    await zk.create(
        ConfigChangeNotificationSequenceZNode.path(),
        ConfigChangeNotificationSequenceZNode.encode("brokers", entity),
        sequence=True,
        makepath=True,
    )


def check_node_id(name: str, broker_id: int) -> None:
    try:
        requested = int(name)
    except ValueError:
        raise InvalidRequestError(f"Node id must be an integer, but it is: {name}") from None
    if requested != broker_id:
        raise InvalidRequestError(
            f"Unexpected broker id, expected {broker_id}, but received {name}"
        )


# -- describe ------------------------------------------------------------------------------------


def _config_type(name: str) -> int:
    definition = DEFINITIONS.get(name)
    if definition is not None:
        return _CONFIG_TYPES.get(definition.type, 2)
    if name in THROTTLE_CONFIGS:
        return _CONFIG_TYPES["long"]
    if is_sensitive(name):
        return _PASSWORD_TYPE if name.endswith("password") else _UNKNOWN_TYPE
    return 2


def _entry(name: str, value: str | None, synonyms: Sequence[Any], with_synonyms: bool) -> dict:
    return {
        "name": name,
        "value": None if is_sensitive(name) else value,
        "read_only": not is_dynamic(name),
        "config_source": synonyms[0].source if synonyms else DEFAULT_CONFIG,
        "is_sensitive": is_sensitive(name),
        "synonyms": [{"name": s.name, "value": s.value, "source": s.source} for s in synonyms]
        if with_synonyms
        else [],
        "config_type": _config_type(name),
        "documentation": None,
    }


def describe_broker(
    dynamic: DynamicBrokerConfig,
    broker_id: int,
    name: str,
    keys: Sequence[str] | None,
    include_synonyms: bool,
) -> list[dict[str, Any]]:
    """DescribeConfigs entries of BROKER `name` (this broker's id, or "" for the default)."""
    wanted = set(keys) if keys else None
    if name == "":
        entries = []
        for key, value in sorted(dynamic.cluster_default.items()):
            if wanted is not None and key not in wanted:
                continue
            synonyms = [
                s for s in dynamic.synonyms(key) if s.source == DYNAMIC_DEFAULT_BROKER_CONFIG
            ]
            entries.append(_entry(key, value, synonyms, include_synonyms))
        return entries
    try:
        requested = int(name)
    except ValueError:
        raise InvalidRequestError(f"Broker id must be an integer, but it is: {name}") from None
    if requested != broker_id:
        raise InvalidRequestError(
            f"Unexpected broker id, expected {broker_id} or empty string, but received {name}"
        )
    properties = dynamic.effective_properties()
    config = dynamic.config
    entries = []
    for key in sorted(set(DEFINITIONS) | set(properties)):
        if wanted is not None and key not in wanted:
            continue
        value = value_text(key, config[key]) if key in DEFINITIONS else properties.get(key)
        entries.append(_entry(key, value, dynamic.synonyms(key), include_synonyms))
    return entries


def describe_loggers(broker_id: int, name: str, keys: Sequence[str] | None) -> list[dict]:
    if not name:
        raise InvalidRequestError("Broker id must not be empty")
    try:
        requested = int(name)
    except ValueError:
        raise InvalidRequestError(f"Broker id must be an integer, but it is: {name}") from None
    if requested != broker_id:
        raise InvalidRequestError(f"Unexpected broker id, expected {broker_id} but received {name}")
    wanted = set(keys) if keys else None
    return [
        {
            "name": logger,
            "value": level,
            "read_only": False,
            "config_source": DYNAMIC_BROKER_LOGGER_CONFIG,
            "is_sensitive": False,
            "synonyms": [],
            "config_type": 2,
            "documentation": None,
        }
        for logger, level in broker_loggers.loggers().items()
        if wanted is None or logger in wanted
    ]


# -- alter ---------------------------------------------------------------------------------------


def _check_entries(entries: Sequence[Any], incremental: bool) -> None:
    """Kafka's preprocessing: no duplicate keys, no null value except for a DELETE."""
    names = [entry.name for entry in entries]
    if len(set(names)) != len(names):
        raise InvalidRequestError("Error due to duplicate config keys")
    null_updates = [
        entry.name
        for entry in entries
        if entry.value is None
        and not (incremental and int(getattr(entry, "config_operation", OP_SET)) == OP_DELETE)
    ]
    if null_updates:
        raise InvalidRequestError(f"Null value not supported for : {', '.join(null_updates)}")


def apply_operations(current: dict[str, str], entries: Sequence[Any]) -> dict[str, str]:
    """IncrementalAlterConfigs' operations on one level's configs (Kafka's
    prepareIncrementalConfigs; APPEND/SUBTRACT start from Kafka's default of a list config)."""
    result = dict(current)
    for entry in entries:
        operation = int(entry.config_operation)
        name = entry.name
        if operation == OP_SET:
            result[name] = entry.value
        elif operation == OP_DELETE:
            result.pop(name, None)
        elif operation in (OP_APPEND, OP_SUBTRACT):
            verb = "append" if operation == OP_APPEND else "subtract"
            if not is_list_config(name):
                raise InvalidConfigurationError(
                    f"Config value {verb} is not allowed for config key: {name}"
                )
            default = DEFINITIONS[name].default if name in DEFINITIONS else ""
            old_text = result.get(name, default or "")
            old = [item for item in old_text.split(",") if item]
            items = entry.value.split(",")
            if operation == OP_APPEND:
                new = old + [item for item in items if item not in old]
            else:
                new = [item for item in old if item not in items]
            result[name] = ",".join(new)
        else:
            raise InvalidRequestError(f"Unknown operations type {operation}")
    return result


async def alter_broker(
    zk: ZkClient,
    dynamic: DynamicBrokerConfig,
    broker_id: int,
    name: str,
    entries: Sequence[Any],
    incremental: bool,
    validate_only: bool,
) -> None:
    """AlterConfigs (`incremental` false: the entries replace the level) or
    IncrementalAlterConfigs on BROKER `name`; raises the KafkaError to answer."""
    per_broker = name != ""
    if per_broker:
        check_node_id(name, broker_id)
    _check_entries(entries, incremental)
    entity = name if per_broker else DEFAULT_ENTITY
    if incremental:
        stored = usable_configs(await read_broker_config(zk, entity), entity)
        proposed = apply_operations(stored, entries)
    else:
        proposed = {entry.name: entry.value for entry in entries}
    dynamic.validate(proposed, per_broker)
    if validate_only:
        return
    log.info(
        "Updating %s with new configuration : %s",
        f"broker {name}" if per_broker else "brokers",
        ",".join(f"{k} -> {'[hidden]' if is_sensitive(k) else v}" for k, v in proposed.items()),
    )
    await write_broker_config(zk, entity, proposed)


def alter_loggers(broker_id: int, name: str, entries: Sequence[Any], validate_only: bool) -> None:
    """IncrementalAlterConfigs on BROKER_LOGGER `name` (this broker's id)."""
    _check_entries(entries, True)
    try:
        requested = int(name)
    except ValueError:
        raise InvalidRequestError(f"Node id must be an integer, but it is: {name}") from None
    if requested != broker_id:
        raise InvalidRequestError(f"Unexpected node id. Expected {broker_id}, but received {name}")
    broker_loggers.validate(entries)
    if not validate_only:
        broker_loggers.apply(entries)
