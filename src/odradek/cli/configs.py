"""`odradek configs`: describe and alter entity configs, like Kafka's `kafka-configs.sh`.

  odradek configs --bootstrap-server H:P [--command-config F] --entity-type users
                  --entity-name alice --alter
                  --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=...]'
  odradek configs ... --entity-type users --entity-name alice --alter --delete-config SCRAM-SHA-256
  odradek configs ... --entity-type users [--entity-name alice] --describe
  odradek configs --zookeeper H:P --entity-type users --entity-name admin --alter --add-config ...

Entity types are handled by an `EntityType` each, registered in `ENTITY_TYPES`; today `users`
(SCRAM credentials). Another entity type (topics, brokers, clients) is a new class with the same
three methods and one line in the registry.

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
    """`--entity-type users`: SCRAM credentials."""

    def validate(self, command: ConfigsCommand) -> None:
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
        client = await _connect(command)
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
        client = await _connect(command)
        try:
            response = await client._send(
                client.bootstrap, DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": users}
            )
        finally:
            client.close()
        if response.error_code != ErrorCode.none:
            raise KafkaResponseError(response.error_code, response.error_message)
        lines = []
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


ENTITY_TYPES: dict[str, EntityType] = {"users": Users()}


async def _connect(command: ConfigsCommand) -> AdminClient:
    if not command.servers:
        raise OperatorError("this needs --bootstrap-server")
    return await AdminClient.connect(command.servers, command.timeout, command.security)


def validate(args: argparse.Namespace) -> ConfigsCommand:
    action = "alter" if args.alter else "describe"
    if args.entity_type not in ENTITY_TYPES:
        raise OperatorError(
            f"--entity-type {args.entity_type} is not supported (supported: "
            f"{', '.join(sorted(ENTITY_TYPES))})"
        )
    if bool(args.bootstrap_server) == bool(args.zookeeper):
        raise OperatorError("give exactly one of --bootstrap-server and --zookeeper")
    if action == "alter" and not (args.add_config or args.delete_config):
        raise OperatorError("--alter needs --add-config or --delete-config")
    if action == "describe" and (args.add_config or args.delete_config):
        raise OperatorError("--add-config and --delete-config go with --alter")
    try:
        add_config = parse_add_config(args.add_config) if args.add_config else {}
    except InvalidScramCredentialError as e:
        raise OperatorError(str(e)) from None
    delete_config = [n.strip() for n in (args.delete_config or "").split(",") if n.strip()]
    command = ConfigsCommand(
        action=action,
        entity_type=args.entity_type,
        entity_name=args.entity_name,
        add_config=add_config,
        delete_config=delete_config,
        servers=parse_bootstrap(args.bootstrap_server) if args.bootstrap_server else None,
        zookeeper=args.zookeeper,
        timeout=args.timeout,
        security=load_command_config(getattr(args, "command_config", None)),
    )
    ENTITY_TYPES[command.entity_type].validate(command)
    return command


async def run(command: ConfigsCommand) -> list[str]:
    entity = ENTITY_TYPES[command.entity_type]
    if command.action == "alter":
        return await entity.alter(command)
    return await entity.describe(command)


def cmd_configs(args: argparse.Namespace) -> int:
    try:
        lines = asyncio.run(run(validate(args)))
    except OperatorError as e:
        print(f"odradek: error: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "configs",
        help="describe or alter entity configs (users' SCRAM credentials)",
        description="Describe or alter entity configs (like kafka-configs.sh).",
    )
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT[,HOST:PORT]")
    parser.add_argument(
        "--zookeeper", metavar="HOST:PORT[/chroot]", help="write users' credentials directly"
    )
    add_command_config_argument(parser)
    parser.add_argument("--entity-type", required=True, help="users")
    parser.add_argument("--entity-name", help="the entity (user name)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--alter", action="store_true", help="change configs")
    action.add_argument("--describe", action="store_true", help="show configs")
    parser.add_argument(
        "--add-config",
        metavar="K=V,...",
        help="configs to set, e.g. 'SCRAM-SHA-256=[iterations=8192,password=secret]'",
    )
    parser.add_argument("--delete-config", metavar="K,...", help="configs to remove")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    parser.set_defaults(func=cmd_configs)
    return parser
