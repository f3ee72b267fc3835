"""`odradek configs` for config resources: topics, brokers and the cluster-wide broker default, and
broker loggers, over DescribeConfigs, IncrementalAlterConfigs and AlterConfigs, as
`kafka-configs.sh --bootstrap-server` talks to a cluster.

* `--describe` sends DescribeConfigs with synonyms for each entity (every topic, or every broker
  and then the default, without `--entity-name`) and prints, as Kafka's tool does,
  `Dynamic configs for topic t are:` (`All configs ...` with `--all`; `Default configs for brokers
  in the cluster are:` for the default) and one line per config,
  `  name=value sensitive=false synonyms={SOURCE:name=value, ...}`, sorted by name. Without
  `--all` only the configs set on that entity are listed (source DYNAMIC_TOPIC_CONFIG,
  DYNAMIC_BROKER_CONFIG or DYNAMIC_DEFAULT_BROKER_CONFIG). A broker's configs are asked of that
  broker itself (Kafka's admin client does the same).
* `--alter` on a topic sends IncrementalAlterConfigs (SET for `--add-config`, DELETE for
  `--delete-config`, whose keys must be set on the topic: `Invalid config(s): k`). On a broker or
  the default it sends AlterConfigs with the entity's current dynamic configs plus the additions
  minus the deletions — Kafka's tool does exactly this — to that broker (any broker for the
  default). A broker that refuses (a static config, a bad value: INVALID_REQUEST) is reported as
  one line with Kafka's error name and message, exit status 1.
* `--entity-type broker-loggers --entity-name 1` (`--broker-logger 1`): `--describe` lists that
  broker's loggers and levels (`  kafka.controller=INFO sensitive=false synonyms={}`), `--alter`
  sets (`--add-config odradek.controller=DEBUG`) or unsets (`--delete-config`) levels with
  IncrementalAlterConfigs, after checking that every logger named exists (`Invalid broker
  logger(s): x`), as Kafka's tool does. Levels are not persisted: a restart resets them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from odradek.cli.topics import AdminClient, KafkaResponseError
from odradek.errors import NetworkError, OperatorError
from odradek.network.client import BrokerConnection
from odradek.protocol.codec import ApiKey

if TYPE_CHECKING:
    from odradek.cli.configs import ConfigsCommand

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
BROKER_LOGGER_RESOURCE = 8
_RESOURCE_TYPES = {
    "topics": TOPIC_RESOURCE,
    "brokers": BROKER_RESOURCE,
    "broker-loggers": BROKER_LOGGER_RESOURCE,
}
DESCRIBE_CONFIGS_MAX_VERSION = 4
ALTER_CONFIGS_MAX_VERSION = 1
INCREMENTAL_ALTER_CONFIGS_MAX_VERSION = 1
OP_SET, OP_DELETE = 0, 1
# Kafka's ConfigEntry.ConfigSource, by the id DescribeConfigs carries.
CONFIG_SOURCES = {
    0: "UNKNOWN",
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
    6: "DYNAMIC_BROKER_LOGGER_CONFIG",
    7: "DYNAMIC_CLIENT_METRICS_CONFIG",
}
_DYNAMIC_SOURCE = {"topics": 1, "brokers": 2, "broker-default": 3, "broker-loggers": None}


def _check(code: int, message: str | None) -> None:
    if code != ErrorCode.none:
        raise KafkaResponseError(ErrorCode(code), message)


async def _version(client: AdminClient, api_key: int, highest: int, what: str) -> int:
    version = await client.supported_version(api_key, highest)
    if version is None:
        raise KafkaResponseError(
            ErrorCode.unsupported_version, f"the broker does not support {what}"
        )
    return version


async def broker_connection(client: AdminClient, broker_id: int) -> BrokerConnection:
    """A connection to broker `broker_id` (the bootstrap connection if it is that broker)."""
    metadata = await client.metadata([])
    broker = next((b for b in metadata.brokers if b.node_id == broker_id), None)
    if broker is None:
        raise OperatorError(f"broker {broker_id} is not in the cluster")
    try:
        return await client.connection_to(broker.host, broker.port, "odradek-configs")
    except NetworkError as e:
        raise OperatorError(f"broker {broker_id}: {e}") from None


def _broker_id(name: str) -> int:
    try:
        return int(name)
    except ValueError:
        raise OperatorError(
            f"The entity name for brokers must be a valid integer broker id, found: {name}"
        ) from None


class ConfigResources:
    """`--entity-type topics`, `--entity-type brokers` (with `--entity-default`) and
    `--entity-type broker-loggers`."""

    def __init__(self, entity_type: str) -> None:
        self.entity_type = entity_type  # topics | brokers | broker-loggers

    def validate(self, command: ConfigsCommand) -> None:
        if command.zookeeper:
            raise OperatorError(f"{self.entity_type} configs need --bootstrap-server")
        if command.action == "alter" and command.entity_name is None:
            raise OperatorError(
                "--alter needs --entity-name"
                + (" or --entity-default" if self.entity_type == "brokers" else "")
            )
        if self.entity_type == "topics" and command.entity_name == "":
            raise OperatorError("--entity-default applies to brokers, users and clients")
        if self.entity_type == "brokers" and command.entity_name:
            _broker_id(command.entity_name)
        if self.entity_type == "broker-loggers":
            if not command.entity_name:
                raise OperatorError("broker-loggers need --entity-name (a broker id)")
            _broker_id(command.entity_name)
        if command.describe_all and command.action != "describe":
            raise OperatorError("--all goes with --describe")

    def _kind(self, name: str) -> str:
        return (
            "broker-default" if self.entity_type == "brokers" and name == "" else self.entity_type
        )

    async def _connection_for(self, client: AdminClient, name: str) -> BrokerConnection:
        if self.entity_type in ("brokers", "broker-loggers") and name:
            return await broker_connection(client, _broker_id(name))
        return client.bootstrap

    async def _send(
        self,
        client: AdminClient,
        name: str,
        api_key: int,
        highest_version: int,
        what: str,
        body: dict[str, Any],
    ) -> Any:
        """`body` as request `api_key` (the highest version both sides support, at most
        `highest_version`) to the broker that answers for entity `name` (`_connection_for`),
        over a connection closed afterwards unless it is the bootstrap one."""
        connection = await self._connection_for(client, name)
        try:
            version = await _version(client, api_key, highest_version, what)
            return await client._send(connection, api_key, version, body)
        finally:
            if connection is not client.bootstrap:
                connection.close()

    async def _describe_one(self, client: AdminClient, name: str, describe_all: bool) -> list[Any]:
        response = await self._send(
            client,
            name,
            ApiKey.DESCRIBE_CONFIGS,
            DESCRIBE_CONFIGS_MAX_VERSION,
            "DescribeConfigs",
            {
                "resources": [
                    {
                        "resource_type": _RESOURCE_TYPES[self.entity_type],
                        "resource_name": name,
                        "configuration_keys": None,
                    }
                ],
                "include_synonyms": True,
                "include_documentation": False,
            },
        )
        result = response.results[0]
        _check(result.error_code, result.error_message)
        wanted = _DYNAMIC_SOURCE[self._kind(name)]
        entries = [
            c
            for c in result.configs
            if describe_all or wanted is None or int(c.config_source) == wanted
        ]
        return sorted(entries, key=lambda c: c.name)

    async def _entity_names(self, client: AdminClient) -> list[str]:
        metadata = await client.metadata(None)
        if self.entity_type == "topics":
            return sorted(t.name for t in metadata.topics if t.error_code == ErrorCode.none)
        return [str(b.node_id) for b in sorted(metadata.brokers, key=lambda b: b.node_id)] + [""]

    async def describe(self, command: ConfigsCommand) -> list[str]:
        from odradek.cli.configs import connect

        client = await connect(command)
        try:
            names = (
                [command.entity_name]
                if command.entity_name is not None
                else await self._entity_names(client)
            )
            lines = []
            for name in names:
                if self._kind(name) == "broker-default":
                    lines.append(f"Default configs for {self.entity_type} in the cluster are:")
                else:
                    scope = "All" if command.describe_all else "Dynamic"
                    lines.append(f"{scope} configs for {self.entity_type[:-1]} {name} are:")
                for entry in await self._describe_one(client, name, command.describe_all):
                    lines.append(config_line(entry))
            return lines
        finally:
            client.close()

    async def alter(self, command: ConfigsCommand) -> list[str]:
        from odradek.cli.configs import connect

        name = command.entity_name or ""
        client = await connect(command)
        try:
            current = {
                entry.name: entry.value for entry in await self._describe_one(client, name, False)
            }
            if self.entity_type == "broker-loggers":
                await self._alter_loggers(client, name, set(current), command)
                return [f"Completed updating config for broker-logger {name}."]
            invalid = [k for k in command.delete_config if k not in current]
            if invalid:
                raise KafkaResponseError(
                    ErrorCode.invalid_config, f"Invalid config(s): {','.join(invalid)}"
                )
            if self.entity_type == "topics":
                await self._incremental_alter(client, name, command)
            else:
                await self._alter_broker(client, name, current, command)
        finally:
            client.close()
        if self._kind(name) == "broker-default":
            return [f"Completed updating default config for {self.entity_type} in the cluster."]
        return [f"Completed updating config for {self.entity_type[:-1]} {name}."]

    async def _incremental_alter(
        self, client: AdminClient, name: str, command: ConfigsCommand
    ) -> None:
        version = await _version(
            client,
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            INCREMENTAL_ALTER_CONFIGS_MAX_VERSION,
            "IncrementalAlterConfigs",
        )
        configs = [
            {"name": k, "config_operation": OP_SET, "value": v}
            for k, v in command.add_config.items()
        ] + [
            {"name": k, "config_operation": OP_DELETE, "value": None} for k in command.delete_config
        ]
        response = await client._send(
            client.bootstrap,
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            version,
            {
                "resources": [
                    {"resource_type": TOPIC_RESOURCE, "resource_name": name, "configs": configs}
                ],
                "validate_only": False,
            },
        )
        result = response.responses[0]
        _check(result.error_code, result.error_message)

    async def _alter_loggers(
        self, client: AdminClient, name: str, loggers: set[str], command: ConfigsCommand
    ) -> None:
        invalid = [k for k in [*command.delete_config, *command.add_config] if k not in loggers]
        if invalid:
            raise KafkaResponseError(
                ErrorCode.invalid_config, f"Invalid broker logger(s): {','.join(invalid)}"
            )
        configs = [
            {"name": k, "config_operation": OP_SET, "value": v}
            for k, v in command.add_config.items()
        ] + [{"name": k, "config_operation": OP_DELETE, "value": ""} for k in command.delete_config]
        response = await self._send(
            client,
            name,
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            INCREMENTAL_ALTER_CONFIGS_MAX_VERSION,
            "IncrementalAlterConfigs",
            {
                "resources": [
                    {
                        "resource_type": BROKER_LOGGER_RESOURCE,
                        "resource_name": name,
                        "configs": configs,
                    }
                ],
                "validate_only": False,
            },
        )
        result = response.responses[0]
        _check(result.error_code, result.error_message)

    async def _alter_broker(
        self,
        client: AdminClient,
        name: str,
        current: dict[str, str | None],
        command: ConfigsCommand,
    ) -> None:
        merged = {k: v for k, v in current.items() if k not in command.delete_config}
        merged.update(command.add_config)
        sensitive = sorted(k for k, v in merged.items() if v is None)
        if sensitive:
            raise OperatorError(
                "All sensitive broker config entries must be specified for --alter, missing "
                f"entries: {', '.join(sensitive)}"
            )
        response = await self._send(
            client,
            name,
            ApiKey.ALTER_CONFIGS,
            ALTER_CONFIGS_MAX_VERSION,
            "AlterConfigs",
            {
                "resources": [
                    {
                        "resource_type": BROKER_RESOURCE,
                        "resource_name": name,
                        "configs": [{"name": k, "value": v} for k, v in merged.items()],
                    }
                ],
                "validate_only": False,
            },
        )
        result = response.responses[0]
        _check(result.error_code, result.error_message)


def config_line(entry: Any) -> str:
    """Kafka's `  name=value sensitive=false synonyms={SOURCE:name=value, ...}`."""
    synonyms = ", ".join(
        f"{CONFIG_SOURCES.get(int(s.source), 'UNKNOWN')}:{s.name}="
        f"{'null' if s.value is None else s.value}"
        for s in (entry.synonyms or ())
    )
    value = "null" if entry.value is None else entry.value
    return (
        f"  {entry.name}={value} sensitive={str(bool(entry.is_sensitive)).lower()} "
        f"synonyms={{{synonyms}}}"
    )
