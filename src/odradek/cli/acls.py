"""`odradek acls`: add, remove and list ACLs, like Kafka's `kafka-acls.sh`.

  odradek acls --bootstrap-server H:P [--command-config F] --add
               --allow-principal User:alice [--allow-host H] [--deny-principal P [--deny-host H]]
               --operation Read [--operation Write ...]
               (--topic T | --group G | --cluster | --transactional-id X) ...
               [--resource-pattern-type literal|prefixed]
  odradek acls ... --add --allow-principal User:alice --producer --topic T [--idempotent]
                                                              [--transactional-id X]
  odradek acls ... --add --allow-principal User:alice --consumer --topic T --group G
  odradek acls ... --remove [principals, hosts, operations as for --add] RESOURCES [--force]
  odradek acls ... --list [RESOURCES] [--principal P] [--resource-pattern-type any|match|...]

As kafka-acls.sh: `--add` creates one binding for each combination of resource, principal, host and operation
(ALLOW for `--allow-principal` with `--allow-host`, DENY for `--deny-principal` with `--deny-host`,
hosts defaulting to `*`, operations to All); `--producer` means Write, Describe and Create on the
topics (and IdempotentWrite on the cluster with `--idempotent`, Write and Describe on the
transactional ids), `--consumer` Read and Describe on the topics and Read on the groups.
`--remove` deletes the bindings matching the same description, or every ACL of the resources when
no principal is given (Kafka asks for confirmation; here `--force` is accepted and nothing is
asked). `--list` prints the ACLs of the resources (all resources when none is given), filtered by
`--principal`. An operation a resource type cannot have (Read on the cluster) is refused before
anything is sent.

It talks to any broker with CreateAcls, DescribeAcls and DeleteAcls (v1-3); the principal running
it needs Alter (changes) or Describe (listing) on the cluster. Output lines follow kafka-acls.sh:

    Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name=t, patternType=LITERAL)`:
        (principal=User:alice, host=*, operation=READ, permissionType=ALLOW)
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from odradek.admin.acls import AclAdmin, delete_filter
from odradek.cli.client_config import add_command_config_argument, load_command_config
from odradek.cli.command import print_command_lines
from odradek.cli.topics import parse_bootstrap
from odradek.errors import OperatorError
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity
from odradek.security.acl import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
    check_supported_operation,
)
from odradek.security.errors import InvalidAclError
from odradek.security.principal import KafkaPrincipal

Op = AclOperation


def _operation(name: str) -> AclOperation:
    wanted = name.replace("-", "").replace("_", "").lower()
    for operation in AclOperation:
        if operation.pascal_name.lower() == wanted and operation not in (Op.UNKNOWN, Op.ANY):
            return operation
    names = ", ".join(o.pascal_name for o in AclOperation if o not in (Op.UNKNOWN, Op.ANY))
    raise OperatorError(f"invalid --operation {name!r} (one of {names})")


def _pattern_type(name: str, for_change: bool) -> PatternType:
    allowed = ("literal", "prefixed") if for_change else ("any", "match", "literal", "prefixed")
    if name.lower() not in allowed:
        raise OperatorError(
            f"--resource-pattern-type {name} is not valid here (one of {', '.join(allowed)})"
        )
    return PatternType[name.upper()]


def _principal(text: str) -> str:
    try:
        KafkaPrincipal.parse(text)
    except Exception as e:
        raise OperatorError(f"invalid principal {text!r}: {e}") from None
    return text


def pattern_text(pattern: ResourcePattern) -> str:
    return (
        f"ResourcePattern(resourceType={pattern.resource_type.name}, name={pattern.name}, "
        f"patternType={pattern.pattern_type.name})"
    )


def entry_text(entry: AccessControlEntry) -> str:
    return f"\t{entry} "


@dataclass(frozen=True, slots=True)
class AclsCommand:
    action: str  # add | remove | list
    servers: list[tuple[str, int]]
    resources: list[ResourcePattern]  # concrete for add/remove; filters' names for list
    bindings: list[AclBinding]  # add: to create; remove: to match
    remove_all: bool  # remove: every ACL of the resources
    list_principal: str | None
    timeout: float
    security: ClientSecurity = PLAINTEXT_CLIENT


def _resources(args: argparse.Namespace, pattern_type: PatternType) -> list[ResourcePattern]:
    resources = [ResourcePattern(ResourceType.TOPIC, t, pattern_type) for t in args.topic or ()]
    resources += [ResourcePattern(ResourceType.GROUP, g, pattern_type) for g in args.group or ()]
    resources += [
        ResourcePattern(ResourceType.TRANSACTIONAL_ID, t, pattern_type)
        for t in args.transactional_id or ()
    ]
    if args.cluster:
        resources.append(ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL))
    return resources


def _operations_by_resource(
    args: argparse.Namespace, resources: list[ResourcePattern]
) -> dict[ResourcePattern, list[AclOperation]]:
    """Which operations each resource gets (--producer/--consumer or --operation)."""
    if not (args.producer or args.consumer):
        operations = [_operation(o) for o in args.operation or ["All"]]
        return {r: list(operations) for r in resources}
    by_resource: dict[ResourcePattern, list[AclOperation]] = {}
    for resource in resources:
        ops: list[AclOperation] = []
        if resource.resource_type is ResourceType.TOPIC:
            if args.producer:
                ops += [Op.WRITE, Op.DESCRIBE, Op.CREATE]
            if args.consumer:
                ops += [Op.READ, Op.DESCRIBE]
        elif resource.resource_type is ResourceType.GROUP and args.consumer:
            ops.append(Op.READ)
        elif resource.resource_type is ResourceType.TRANSACTIONAL_ID and args.producer:
            ops += [Op.WRITE, Op.DESCRIBE]
        if ops:
            by_resource[resource] = list(dict.fromkeys(ops))
    if args.producer and args.idempotent:
        cluster = ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL)
        by_resource.setdefault(cluster, []).append(Op.IDEMPOTENT_WRITE)
    return by_resource


def _entries(args: argparse.Namespace, operations: Iterable[AclOperation]) -> list[Any]:
    entries = []
    for permission, principals, hosts in (
        (AclPermissionType.ALLOW, args.allow_principal, args.allow_host),
        (AclPermissionType.DENY, args.deny_principal, args.deny_host),
    ):
        for principal in principals or ():
            for host in hosts or ["*"]:
                for operation in operations:
                    entries.append(
                        AccessControlEntry(_principal(principal), host, operation, permission)
                    )
    return entries


def validate(args: argparse.Namespace) -> AclsCommand:
    action = next(a for a in ("add", "remove", "list") if getattr(args, a))
    changing = action != "list"
    pattern_type = _pattern_type(args.resource_pattern_type or "literal", action == "add")
    if args.producer or args.consumer:
        if action == "list":
            raise OperatorError("--producer and --consumer go with --add or --remove")
        if args.operation or args.cluster:
            raise OperatorError(
                "--producer/--consumer cannot be combined with --operation/--cluster"
            )
        if args.consumer and not args.group:
            raise OperatorError("--consumer needs --group")
        if not args.topic:
            raise OperatorError("--producer/--consumer need --topic")
    if args.idempotent and not args.producer:
        raise OperatorError("--idempotent goes with --producer")
    if (args.allow_host and not args.allow_principal) or (
        args.deny_host and not args.deny_principal
    ):
        raise OperatorError("--allow-host/--deny-host need --allow-principal/--deny-principal")
    resources = _resources(args, pattern_type)
    if changing and not resources:
        raise OperatorError(
            "give at least one resource: --topic, --group, --cluster or --transactional-id"
        )
    has_principals = bool(args.allow_principal or args.deny_principal)
    if action == "add" and not has_principals:
        raise OperatorError("--add needs --allow-principal or --deny-principal")
    bindings: list[AclBinding] = []
    if changing and has_principals:
        for resource, operations in _operations_by_resource(args, resources).items():
            for operation in operations:
                try:
                    check_supported_operation(resource.resource_type, operation)
                except InvalidAclError as e:
                    raise OperatorError(str(e)) from None
            for entry in _entries(args, operations):
                bindings.append(AclBinding(resource, entry))
    return AclsCommand(
        action=action,
        servers=parse_bootstrap(args.bootstrap_server),
        resources=resources,
        bindings=bindings,
        remove_all=action == "remove" and not has_principals,
        list_principal=_principal(args.principal) if args.principal else None,
        timeout=args.timeout,
        security=load_command_config(getattr(args, "command_config", None)),
    )


def _block(
    title: str, pattern: ResourcePattern, entries: Iterable[AccessControlEntry]
) -> list[str]:
    return [f"{title} `{pattern_text(pattern)}`: ", *(entry_text(e) for e in entries), ""]


async def _current(client: AclAdmin, patterns: Iterable[ResourcePattern]) -> list[str]:
    lines: list[str] = []
    for pattern in patterns:
        found = await client.describe(pattern.resource_type, pattern.name, pattern.pattern_type)
        lines += _block("Current ACLs for resource", pattern, found.get(pattern, []))
    return lines


async def run(command: AclsCommand) -> list[str]:
    client = await AclAdmin.connect(command.servers, command.timeout, command.security)
    try:
        if command.action == "add":
            lines: list[str] = []
            by_pattern: dict[ResourcePattern, list[AccessControlEntry]] = {}
            for binding in command.bindings:
                by_pattern.setdefault(binding.pattern, []).append(binding.entry)
            for pattern, entries in by_pattern.items():
                lines += _block("Adding ACLs for resource", pattern, entries)
            await client.create(command.bindings)
            return lines + await _current(client, by_pattern)
        if command.action == "remove":
            if command.remove_all:
                filters = [delete_filter(p, None) for p in command.resources]
                patterns = list(command.resources)
            else:
                filters = [delete_filter(b.pattern, b.entry) for b in command.bindings]
                patterns = list(dict.fromkeys(b.pattern for b in command.bindings))
            lines = [f"Removing ACLs for resource `{pattern_text(p)}`" for p in patterns]
            await client.delete(filters)
            return lines + [""] + await _current(client, patterns)
        # list
        found: dict[ResourcePattern, list[AccessControlEntry]] = {}
        if command.resources:
            for pattern in command.resources:
                found.update(
                    await client.describe(
                        pattern.resource_type,
                        pattern.name,
                        pattern.pattern_type,
                        command.list_principal,
                    )
                )
        else:
            found = await client.describe(principal=command.list_principal)
        lines = []
        for pattern in sorted(found):
            lines += _block("Current ACLs for resource", pattern, found[pattern])
        return lines
    finally:
        client.close()


def cmd_acls(args: argparse.Namespace) -> int:
    return print_command_lines(args, validate, run)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "acls",
        help="add, remove or list ACLs",
        description="Add, remove or list ACLs (like kafka-acls.sh).",
    )
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]")
    add_command_config_argument(parser)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true", help="add ACLs")
    action.add_argument("--remove", action="store_true", help="remove ACLs")
    action.add_argument("--list", action="store_true", help="list ACLs")
    for flag, what in (
        ("--allow-principal", "principal (User:name) the ACLs allow"),
        ("--deny-principal", "principal (User:name) the ACLs deny"),
        ("--allow-host", "host the allowing ACLs apply to (default *)"),
        ("--deny-host", "host the denying ACLs apply to (default *)"),
        (
            "--operation",
            "Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
            "DescribeConfigs, AlterConfigs, IdempotentWrite or All (default All)",
        ),
        ("--topic", "a topic (name, * or a prefix with --resource-pattern-type prefixed)"),
        ("--group", "a consumer group"),
        ("--transactional-id", "a transactional id"),
    ):
        parser.add_argument(flag, action="append", help=what)
    parser.add_argument("--cluster", action="store_true", help="the cluster resource")
    parser.add_argument(
        "--resource-pattern-type",
        help="literal (default) or prefixed; with --list/--remove also any or match",
    )
    parser.add_argument("--producer", action="store_true", help="the ACLs a producer needs")
    parser.add_argument("--consumer", action="store_true", help="the ACLs a consumer needs")
    parser.add_argument(
        "--idempotent", action="store_true", help="with --producer: IdempotentWrite"
    )
    parser.add_argument("--principal", help="with --list: only this principal's ACLs")
    parser.add_argument("--force", action="store_true", help="accepted; nothing is asked")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the brokers (default 30)"
    )
    parser.set_defaults(func=cmd_acls)
    return parser
