"""`odradek configs` for client quotas: users, clients and user+client pairs, over
DescribeClientQuotas (48) and AlterClientQuotas (49), as `kafka-configs.sh --bootstrap-server`
does (KIP-546).

  odradek configs ... --entity-type users --entity-name alice --alter --add-config producer_byte_rate=1024
  odradek configs ... --entity-type clients --entity-default --alter --add-config consumer_byte_rate=2048
  odradek configs ... --entity-type users --entity-name alice --entity-type clients --entity-name c --describe

Quota keys are Kafka's: `producer_byte_rate`, `consumer_byte_rate`, `request_percentage`,
`controller_mutation_rate`; values are numbers (sent as doubles). `--describe` prints
`Quota configs for user-principal 'alice', client-id 'c' are producer_byte_rate=1024.0` per entity
(`the default user-principal` for a default); `--alter` prints `Completed updating config for user
alice.` (or `... default config for users in the cluster.`).

A broker that does not offer these APIs (Odradek before client quotas, `odradek.server.quota`)
is reported as `UNSUPPORTED_VERSION: the brokers do not support AlterClientQuotas (client
quotas)`, exit status 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from odradek.cli.topics import KafkaResponseError
from odradek.errors import OperatorError

if TYPE_CHECKING:
    from odradek.cli.configs import ConfigsCommand
    from odradek.cli.topics import AdminClient

DESCRIBE_CLIENT_QUOTAS = 48
ALTER_CLIENT_QUOTAS = 49
QUOTA_KEYS = (
    "producer_byte_rate",
    "consumer_byte_rate",
    "request_percentage",
    "controller_mutation_rate",
)
# --entity-type → ClientQuotaEntity's entity type, and how the tool names it in its output.
ENTITY_KINDS = {"users": "user", "clients": "client-id"}
_PRINTED_KINDS = {"user": "user-principal", "client-id": "client-id"}
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2


def is_quota_key(name: str) -> bool:
    return name in QUOTA_KEYS


def parse_quota_values(add_config: dict[str, str]) -> dict[str, float]:
    values = {}
    for key, text in add_config.items():
        if not is_quota_key(key):
            raise OperatorError(
                f"{key} is not a quota config (quota configs: {', '.join(QUOTA_KEYS)})"
            )
        try:
            values[key] = float(text)
        except ValueError:
            raise OperatorError(
                f"Cannot parse quota configuration value for {key}: {text}"
            ) from None
    return values


async def _version(client: AdminClient, api_key: int, name: str) -> int:
    version = await client.supported_version(api_key, 1)
    if version is None:
        raise KafkaResponseError(
            ErrorCode.unsupported_version,
            f"the brokers do not support {name} (client quotas)",
        )
    return version


def _entity_text(entity: list[tuple[str, str | None]]) -> str:
    parts = []
    for kind in ("user", "client-id", "ip"):
        for entity_type, name in entity:
            if entity_type == kind:
                printed = _PRINTED_KINDS.get(kind, kind)
                parts.append(
                    f"{printed} '{name}'" if name is not None else f"the default {printed}"
                )
    return ", ".join(parts)


class ClientQuotas:
    """The quota side of `users` and `clients` entities (the SCRAM side is in `configs`)."""

    def validate(self, command: ConfigsCommand) -> None:
        if command.zookeeper:
            raise OperatorError(
                "client quotas are not implemented with --zookeeper: use --bootstrap-server"
            )
        if command.action == "alter":
            if any(name is None for _, name in command.entities):
                raise OperatorError("--alter needs --entity-name or --entity-default")
            parse_quota_values(command.add_config)
            for key in command.delete_config:
                if not is_quota_key(key):
                    raise OperatorError(f"{key} is not a quota config")

    def _components(self, command: ConfigsCommand) -> list[dict[str, object]]:
        components = []
        for entity_type, name in command.entities:
            kind = ENTITY_KINDS[entity_type]
            if name is None:
                components.append({"entity_type": kind, "match_type": MATCH_ANY, "match": None})
            elif name == "":
                components.append({"entity_type": kind, "match_type": MATCH_DEFAULT, "match": None})
            else:
                components.append({"entity_type": kind, "match_type": MATCH_EXACT, "match": name})
        return components

    async def describe_lines(self, client: AdminClient, command: ConfigsCommand) -> list[str]:
        version = await _version(client, DESCRIBE_CLIENT_QUOTAS, "DescribeClientQuotas")
        # Strict when every entity type is named, as Kafka's tool asks (only that exact entity).
        strict = all(name is not None for _, name in command.entities)
        response = await client._send(
            client.bootstrap,
            DESCRIBE_CLIENT_QUOTAS,
            version,
            {"components": self._components(command), "strict": strict},
        )
        if response.error_code != ErrorCode.none:
            raise KafkaResponseError(ErrorCode(response.error_code), response.error_message)
        lines = []
        for entry in response.entries or ():
            entity = [(e.entity_type, e.entity_name) for e in entry.entity]
            values = ", ".join(f"{v.key}={float(v.value)!r}" for v in entry.values)
            lines.append(f"Quota configs for {_entity_text(entity)} are {values}")
        return lines

    async def alter(self, client: AdminClient, command: ConfigsCommand) -> None:
        version = await _version(client, ALTER_CLIENT_QUOTAS, "AlterClientQuotas")
        entity = [
            {"entity_type": ENTITY_KINDS[t], "entity_name": name or None}
            for t, name in command.entities
        ]
        ops = [
            {"key": k, "value": v, "remove": False}
            for k, v in parse_quota_values(command.add_config).items()
        ] + [{"key": k, "value": 0.0, "remove": True} for k in command.delete_config]
        response = await client._send(
            client.bootstrap,
            ALTER_CLIENT_QUOTAS,
            version,
            {"entries": [{"entity": entity, "ops": ops}], "validate_only": False},
        )
        for result in response.entries:
            if result.error_code != ErrorCode.none:
                raise KafkaResponseError(ErrorCode(result.error_code), result.error_message)


def completed_line(command: ConfigsCommand) -> str:
    entity_type, name = command.entities[0]
    if name:
        return f"Completed updating config for {entity_type[:-1]} {name}."
    return f"Completed updating default config for {entity_type} in the cluster."
