"""`odradek configs`: describe and alter entity configs, like Kafka's `kafka-configs.sh`.

  odradek configs --bootstrap-server H:P [--command-config F] --entity-type users
                  --entity-name alice --alter
                  --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=...]'
  odradek configs ... --entity-type users --entity-name alice --alter --delete-config SCRAM-SHA-256
  odradek configs ... --entity-type users [--entity-name alice] --describe
  odradek configs --zookeeper H:P --entity-type users --entity-name admin --alter --add-config ...

  odradek configs --bootstrap-server H:P --entity-type topics --entity-name t --alter
                  --add-config retention.ms=60000,cleanup.policy=[compact,delete] --delete-config segment.ms
  odradek configs ... --entity-type topics [--entity-name t] --describe [--all]
  odradek configs ... --entity-type brokers (--entity-name 1 | --entity-default) --describe|--alter ...
  odradek configs ... --entity-type broker-loggers --entity-name 1 --alter --add-config odradek.controller=DEBUG
  odradek configs ... --entity-type clients (--entity-name c | --entity-default) --alter
                  --add-config producer_byte_rate=1048576
  (shorthands as in Kafka: --topic T, --broker 1, --broker-defaults, --user U, --user-defaults,
   --client C, --client-defaults; --add-config-file F takes the additions from a properties file)

Entity types are handled by an `EntityType` each, registered in `ENTITY_TYPES`: `users` (SCRAM
credentials here, quotas through `configs_quotas`), `clients` (quotas, `configs_quotas`), `topics`
and `brokers` (`configs_resources`: DescribeConfigs, IncrementalAlterConfigs, AlterConfigs). A
users and a clients entity together name a user+client quota entity, as in Kafka.

Users: `--add-config` takes kafka-configs' syntax (`odradek.security.scram.parse_add_config`):
brackets group a mechanism's `iterations=N,password=P` (iterations default 4096, at least 4096,
at most 16384). Through a broker (`--bootstrap-server`) the salted password is computed here with a
fresh random salt and sent with AlterUserScramCredentials (the password never travels); the
principal needs Alter on the cluster (Describe for `--describe`). With `--zookeeper` the credential
is written straight into `/config/users/<user>` with a change notification, as Kafka's
`kafka-configs.sh --zookeeper` does to create the brokers' own SCRAM user before any broker runs.

Output follows kafka-configs.sh: `Completed updating config for user alice.` and
`SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=8192`.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from odradek.cli.client_config import add_command_config_argument, load_command_config
from odradek.cli.command import print_command_lines
from odradek.cli.configs_quotas import ClientQuotas, is_quota_key
from odradek.cli.configs_quotas import completed_line as quota_completed_line
from odradek.cli.configs_resources import ConfigResources
from odradek.cli.topics import AdminClient, KafkaResponseError, parse_bootstrap
from odradek.errors import OperatorError
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity
from odradek.security.api_acls import (
    ALTER_USER_SCRAM_CREDENTIALS,
    DESCRIBE_USER_SCRAM_CREDENTIALS,
)
from odradek.security.errors import InvalidScramCredentialError
from odradek.security.scram import (
    DEFAULT_ITERATIONS,
    ScramMechanism,
    credential_from_config_value,
    parse_add_config,
)


@dataclass(frozen=True, slots=True)
class ConfigsCommand:
    action: str  # alter | describe
    entity_type: str
    entity_name: str | None
    add_config: dict[str, str]
    delete_config: list[str]
    servers: list[tuple[str, int]] | None
    zookeeper: str | None
    timeout: float
    security: ClientSecurity = PLAINTEXT_CLIENT
    # Every (entity type, name) given, in order; name "" is the default entity, None no name.
    entities: tuple[tuple[str, str | None], ...] = ()
    describe_all: bool = False


class EntityType(Protocol):
    """How one `--entity-type` is described and altered."""

    def validate(self, command: ConfigsCommand) -> None: ...

    async def alter(self, command: ConfigsCommand) -> list[str]: ...

    async def describe(self, command: ConfigsCommand) -> list[str]: ...


# -- users: SCRAM credentials --------------------------------------------------------------------


def _scram_mechanism(name: str) -> ScramMechanism:
    mechanism = ScramMechanism.from_name(name)
    if mechanism is None:
        raise OperatorError(
            f"config {name!r} is not supported for users: only SCRAM-SHA-256 and SCRAM-SHA-512 "
            "(user quotas are not implemented)"
        )
    return mechanism


def _iterations_and_password(value: str) -> tuple[int, str]:
    head, sep, password = value.partition("password=")
    if not sep:
        raise OperatorError("a SCRAM config needs password=...: [iterations=N,]password=P")
    iterations = DEFAULT_ITERATIONS
    head = head.rstrip(",").strip()
    if head:
        key, _, number = head.partition("=")
        if key.strip() != "iterations":
            raise OperatorError(f"unknown SCRAM config field {key.strip()!r}")
        try:
            iterations = int(number)
        except ValueError:
            raise OperatorError(f"iterations must be a number, not {number!r}") from None
        if iterations == -1:
            iterations = DEFAULT_ITERATIONS
    return iterations, password


class Users:
    """`--entity-type users`: SCRAM credentials, and quotas (`configs_quotas`)."""

    def validate(self, command: ConfigsCommand) -> None:
        keys = list(command.add_config) + command.delete_config
        quota_keys = [k for k in keys if is_quota_key(k)]
        if quota_keys and len(quota_keys) != len(keys):
            raise OperatorError(
                "Cannot alter both quota and SCRAM credential configs simultaneously for 'users'"
            )
        if (
            (quota_keys and not command.zookeeper)
            or len(command.entities) > 1
            or (command.entity_name == "")
        ):
            if command.entity_name == "" and keys and not quota_keys:
                raise OperatorError(
                    "The use of --entity-default or --user-defaults is not allowed with User "
                    "SCRAM Credentials"
                )
            ClientQuotas().validate(command)
            return
        if command.action == "alter" and not command.entity_name:
            raise OperatorError("--alter needs --entity-name")
        for name in list(command.add_config) + command.delete_config:
            _scram_mechanism(name)
        for name, value in command.add_config.items():
            iterations, _ = _iterations_and_password(value)
            mechanism = _scram_mechanism(name)
            if not mechanism.min_iterations <= iterations <= mechanism.max_iterations:
                raise OperatorError(
                    f"{name}: iterations must be between {mechanism.min_iterations} and "
                    f"{mechanism.max_iterations}"
                )
        if command.zookeeper and command.action == "describe":
            raise OperatorError("--describe of users needs --bootstrap-server")

    async def alter(self, command: ConfigsCommand) -> list[str]:
        user = command.entity_name or ""
        if any(is_quota_key(k) for k in [*command.add_config, *command.delete_config]):
            return await alter_quotas(command)
        if command.zookeeper:
            await self._alter_in_zookeeper(command, user)
        else:
            await self._alter_through_broker(command, user)
        return [f"Completed updating config for user {user}."]

    async def _alter_through_broker(self, command: ConfigsCommand, user: str) -> None:
        upsertions = []
        for name, value in command.add_config.items():
            mechanism = _scram_mechanism(name)
            iterations, password = _iterations_and_password(value)
            salt = secrets.token_bytes(32)
            salted = await asyncio.to_thread(mechanism.salted_password, password, salt, iterations)
            upsertions.append(
                {
                    "name": user,
                    "mechanism": mechanism.code,
                    "iterations": iterations,
                    "salt": salt,
                    "salted_password": salted,
                }
            )
        deletions = [
            {"name": user, "mechanism": _scram_mechanism(name).code}
            for name in command.delete_config
        ]
        client = await connect(command)
        try:
            response = await client._send(
                client.bootstrap,
                ALTER_USER_SCRAM_CREDENTIALS,
                0,
                {"deletions": deletions, "upsertions": upsertions},
            )
        finally:
            client.close()
        for result in response.results:
            if result.error_code != ErrorCode.none:
                raise KafkaResponseError(result.error_code, result.error_message)

    async def _alter_in_zookeeper(self, command: ConfigsCommand, user: str) -> None:
        from odradek.security.credential_store import CredentialCache, CredentialStore
        from odradek.zk.client import ZkClient

        upserts = {}
        for name, value in command.add_config.items():
            mechanism = _scram_mechanism(name)
            try:
                upserts[mechanism] = await asyncio.to_thread(
                    credential_from_config_value, mechanism, value
                )
            except InvalidScramCredentialError as e:
                raise OperatorError(str(e)) from None
        deletions = tuple(_scram_mechanism(name) for name in command.delete_config)
        from odradek.server.broker_security import environment_zookeeper_identity

        # With KAFKA_OPTS naming a JAAS file, authenticate and protect the credentials' znode
        # as the brokers do (zookeeper.set.acl); otherwise it is created world-readable.
        credentials = environment_zookeeper_identity()
        zk = ZkClient(
            command.zookeeper or "",
            session_timeout_s=10,
            credentials=credentials,
            set_acl=credentials is not None,
        )
        await zk.start(timeout=command.timeout)
        try:
            store = CredentialStore(zk, CredentialCache())
            await store.start()
            await store.alter_credentials(user, upserts, deletions)
            store.close()
        finally:
            await zk.close()

    async def describe(self, command: ConfigsCommand) -> list[str]:
        users = [{"name": command.entity_name}] if command.entity_name else None
        client = await connect(command)
        lines: list[str] = []
        try:
            if len(command.entities) > 1 or command.entity_name == "":
                # As Kafka: no SCRAM credentials for defaults or user+client entities.
                return await ClientQuotas().describe_lines(client, command)
            try:
                lines += await ClientQuotas().describe_lines(client, command)
            except KafkaResponseError as e:
                if e.code != ErrorCode.unsupported_version:
                    raise
                # Kafka's tool would stop here; the SCRAM credentials can still be shown.
                print(f"odradek: warning: quotas not shown: {e}", file=sys.stderr)
            response = await client._send(
                client.bootstrap, DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": users}
            )
        finally:
            client.close()
        if response.error_code != ErrorCode.none:
            raise KafkaResponseError(response.error_code, response.error_message)
        for result in response.results:
            if result.error_code == ErrorCode.resource_not_found:
                continue  # a user without credentials has no SCRAM configs to show
            if result.error_code != ErrorCode.none:
                raise KafkaResponseError(result.error_code, result.error_message)
            configs = ", ".join(
                f"{_mechanism_name(info.mechanism)}=iterations={info.iterations}"
                for info in result.credential_infos
            )
            lines.append(
                f"SCRAM credential configs for user-principal '{result.user}' are {configs}"
            )
        return lines


def _mechanism_name(code: int) -> str:
    for mechanism in ScramMechanism:
        if mechanism.code == code:
            return mechanism.mechanism_name
    return f"UNKNOWN({code})"


class Clients:
    """`--entity-type clients`: quotas only (`configs_quotas`)."""

    def validate(self, command: ConfigsCommand) -> None:
        for key in [*command.add_config, *command.delete_config]:
            if not is_quota_key(key):
                raise OperatorError(
                    f"Only quota configs can be added for 'clients'. Unexpected config names: {key}"
                )
        ClientQuotas().validate(command)

    async def alter(self, command: ConfigsCommand) -> list[str]:
        return await alter_quotas(command)

    async def describe(self, command: ConfigsCommand) -> list[str]:
        client = await connect(command)
        try:
            return await ClientQuotas().describe_lines(client, command)
        finally:
            client.close()


ENTITY_TYPES: dict[str, EntityType] = {
    "users": Users(),
    "clients": Clients(),
    "topics": ConfigResources("topics"),
    "brokers": ConfigResources("brokers"),
    "broker-loggers": ConfigResources("broker-loggers"),
}


async def connect(command: ConfigsCommand) -> AdminClient:
    if not command.servers:
        raise OperatorError("this needs --bootstrap-server")
    return await AdminClient.connect(command.servers, command.timeout, command.security)


async def alter_quotas(command: ConfigsCommand) -> list[str]:
    """Alter the quotas of the command's user or client entity through the broker
    (AlterClientQuotas); the line Kafka's tool prints."""
    client = await connect(command)
    try:
        await ClientQuotas().alter(client, command)
    finally:
        client.close()
    return [quota_completed_line(command)]


def _entities(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(entity type, name) pairs from --entity-type/--entity-name/--entity-default (names pair
    with types in order, as kafka-configs.sh pairs them) and the shorthands."""
    types = list(args.entity_type or [])
    names = list(args.entity_names or [])
    if len(names) > len(types):
        raise OperatorError("--entity-name or --entity-default given without an --entity-type")
    pairs: list[tuple[str, str | None]] = [
        (t, names[i] if i < len(names) else None) for i, t in enumerate(types)
    ]
    pairs += list(args.shorthand or [])
    if not pairs:
        raise OperatorError("--entity-type (or --topic, --broker, --user, --client) is required")
    for entity_type, _ in pairs:
        if entity_type not in ENTITY_TYPES:
            raise OperatorError(
                f"--entity-type {entity_type} is not supported (supported: "
                f"{', '.join(sorted(ENTITY_TYPES))})"
            )
    kinds = [t for t, _ in pairs]
    if len(pairs) > 1 and sorted(kinds) != ["clients", "users"]:
        raise OperatorError("only one entity, or a users and a clients entity together")
    if sorted(kinds) == ["clients", "users"]:
        pairs.sort(key=lambda p: p[0] != "users")  # the user first, as Kafka's tool names them
    return pairs


def validate(args: argparse.Namespace) -> ConfigsCommand:
    action = "alter" if args.alter else "describe"
    entities = _entities(args)
    if bool(args.bootstrap_server) == bool(args.zookeeper):
        raise OperatorError("give exactly one of --bootstrap-server and --zookeeper")
    add_text = args.add_config
    file_additions: dict[str, str] = {}
    if getattr(args, "add_config_file", None):
        from odradek.cli.client_tools import read_properties_file

        file_additions = read_properties_file(args.add_config_file, "--add-config-file")
    if action == "alter" and not (add_text or file_additions or args.delete_config):
        raise OperatorError("--alter needs --add-config, --add-config-file or --delete-config")
    if action == "describe" and (add_text or file_additions or args.delete_config):
        raise OperatorError("--add-config and --delete-config go with --alter")
    try:
        add_config = parse_add_config(add_text) if add_text else {}
    except InvalidScramCredentialError as e:
        raise OperatorError(str(e)) from None
    add_config.update(file_additions)
    delete_config = [n.strip() for n in (args.delete_config or "").split(",") if n.strip()]
    both = sorted(set(add_config) & set(delete_config))
    if both:
        raise OperatorError(f"Invalid config(s): {','.join(both)} (both added and deleted)")
    entity_type, entity_name = entities[0]
    command = ConfigsCommand(
        action=action,
        entity_type=entity_type,
        entity_name=entity_name,
        add_config=add_config,
        delete_config=delete_config,
        servers=parse_bootstrap(args.bootstrap_server) if args.bootstrap_server else None,
        zookeeper=args.zookeeper,
        timeout=args.timeout,
        security=load_command_config(getattr(args, "command_config", None)),
        entities=tuple(entities),
        describe_all=bool(getattr(args, "all", False)),
    )
    ENTITY_TYPES[command.entity_type].validate(command)
    return command


async def run(command: ConfigsCommand) -> list[str]:
    entity = ENTITY_TYPES[command.entity_type]
    if command.action == "alter":
        return await entity.alter(command)
    return await entity.describe(command)


def cmd_configs(args: argparse.Namespace) -> int:
    return print_command_lines(args, validate, run)


class _Shorthand(argparse.Action):
    """`--topic T`, `--broker-defaults`, ...: append (entity type, name or "")."""

    def __init__(self, *args: Any, entity_type: str, **kwargs: Any) -> None:
        self.entity_type = entity_type
        super().__init__(*args, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        pairs = list(getattr(namespace, self.dest, None) or [])
        name = values if isinstance(values, str) else ""
        pairs.append((self.entity_type, name))
        setattr(namespace, self.dest, pairs)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "configs",
        help="describe or alter configs of topics, brokers, users and clients",
        description="Describe or alter entity configs (like kafka-configs.sh).",
    )
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT[,HOST:PORT]")
    parser.add_argument(
        "--zookeeper", metavar="HOST:PORT[/chroot]", help="write users' credentials directly"
    )
    add_command_config_argument(parser)
    parser.add_argument(
        "--entity-type",
        action="append",
        help="topics, brokers, broker-loggers, users or clients (users and clients together: a "
        "user+client quota entity)",
    )
    parser.add_argument(
        "--entity-name",
        action="append",
        dest="entity_names",
        help="the entity (topic, broker id, user, client id)",
    )
    parser.add_argument(
        "--entity-default",
        action="append_const",
        const="",
        dest="entity_names",
        help="the default entity (brokers: the cluster-wide default; users, clients: quotas)",
    )
    for flag, entity_type, takes_name in (
        ("--topic", "topics", True),
        ("--broker", "brokers", True),
        ("--broker-defaults", "brokers", False),
        ("--broker-logger", "broker-loggers", True),
        ("--user", "users", True),
        ("--user-defaults", "users", False),
        ("--client", "clients", True),
        ("--client-defaults", "clients", False),
    ):
        if takes_name:
            parser.add_argument(
                flag,
                action=_Shorthand,
                entity_type=entity_type,
                dest="shorthand",
                metavar="NAME",
                help=f"same as --entity-type {entity_type} --entity-name NAME",
            )
        else:
            parser.add_argument(
                flag,
                action=_Shorthand,
                entity_type=entity_type,
                nargs=0,
                dest="shorthand",
                help=f"same as --entity-type {entity_type} --entity-default",
            )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--alter", action="store_true", help="change configs")
    action.add_argument("--describe", action="store_true", help="show configs")
    parser.add_argument(
        "--all", action="store_true", help="with --describe: every config, not only those set"
    )
    parser.add_argument(
        "--add-config",
        metavar="K=V,...",
        help="configs to set, e.g. 'retention.ms=60000,cleanup.policy=[compact,delete]' or "
        "'SCRAM-SHA-256=[iterations=8192,password=secret]'",
    )
    parser.add_argument(
        "--add-config-file", metavar="FILE", help="configs to set, from a properties file"
    )
    parser.add_argument("--delete-config", metavar="K,...", help="configs to remove")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    parser.set_defaults(func=cmd_configs)
    return parser
