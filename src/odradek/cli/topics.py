"""`odradek topics`: create, list, describe and delete topics, like Kafka's `kafka-topics.sh`.

  odradek topics --bootstrap-server H:P --create --topic T [--partitions N]
                 [--replication-factor R] [--config k=v ...] [--replica-assignment 1:2,2:3,...]
  odradek topics --bootstrap-server H:P --list
  odradek topics --bootstrap-server H:P --describe [--topic T]
                 [--under-replicated-partitions | --unavailable-partitions]
  odradek topics --bootstrap-server H:P --delete --topic T

It speaks the Kafka protocol through the project's own client (`BrokerConnection`), never through
ZooKeeper, so it works against any Kafka-compatible broker: Metadata v12 for lists and
descriptions, CreateTopics v7 and DeleteTopics v6 sent to the controller (as Kafka's admin
client does in ZooKeeper mode; to the bootstrap broker if the controller is unknown or
unreachable). A Kafka error code in a response is printed by its name on one line
(`odradek: error: TOPIC_ALREADY_EXISTS: ...`) and the command exits 1.

`--describe` prints kafka-topics' format, tab-separated: a topic line (`Topic: t  TopicId: ..
PartitionCount: n  ReplicationFactor: r  Configs: k=v,...`, the configs that are not broker
defaults, read with DescribeConfigs when the broker offers it) and then one line per partition
(`Topic: t  Partition: p  Leader: l  Replicas: 1,2,3  Isr: 1,2`, plus `Offline: ..` when some
replicas are offline). With `--under-replicated-partitions` (ISR smaller than the replicas) or
`--unavailable-partitions` (no leader, or a leader that is not a live broker) only the matching
partition lines are printed, as in Kafka.
"""

from __future__ import annotations

import argparse
import base64
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.admin.client import (
    ZERO_UUID,
    AdminClient,
    KafkaResponseError,
    check_error,
    parse_bootstrap,
)
from odradek.cli.client_config import add_command_config_argument, load_command_config
from odradek.cli.command import print_command_lines
from odradek.errors import OperatorError
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity

__all__ = ["AdminClient", "KafkaResponseError", "parse_bootstrap"]  # the other tools' imports


def parse_replica_assignment(text: str) -> dict[int, list[int]]:
    """kafka-topics' `1:2,2:3` -> {0: [1, 2], 1: [2, 3]}: partitions separated by commas, each
    partition's replicas by colons, the first replica preferred."""
    assignment: dict[int, list[int]] = {}
    for partition, item in enumerate(text.split(",")):
        try:
            replicas = [int(r) for r in item.split(":")]
        except ValueError:
            raise OperatorError(
                f"invalid --replica-assignment {text!r}: expected broker ids like 1:2,2:3"
            ) from None
        if len(set(replicas)) != len(replicas):
            raise OperatorError(
                f"partition {partition} of --replica-assignment lists a broker twice: {item}"
            )
        if assignment and len(replicas) != len(assignment[0]):
            raise OperatorError(
                f"partition {partition} of --replica-assignment has a different replication "
                f"factor ({len(replicas)}) from partition 0 ({len(assignment[0])})"
            )
        assignment[partition] = replicas
    return assignment


def parse_configs(items: Sequence[str]) -> dict[str, str]:
    configs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OperatorError(f"invalid --config {item!r}: expected name=value")
        configs[key.strip()] = value.strip()
    return configs


def topic_id_text(topic_id: uuid.UUID | None) -> str:
    """Kafka's textual topic id: the 16 bytes in URL-safe base64 without padding."""
    raw = (topic_id or ZERO_UUID).bytes
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


# ---------------------------------------------------------------------------------------------
# The commands


def _ids(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def describe_lines(
    metadata: Any,
    configs: dict[str, list[tuple[str, str]]],
    under_replicated_only: bool = False,
    unavailable_only: bool = False,
) -> list[str]:
    """kafka-topics' --describe output for the topics of a Metadata response, sorted by name."""
    live = {b.node_id for b in metadata.brokers}
    filtered = under_replicated_only or unavailable_only
    lines = []
    for topic in sorted(metadata.topics, key=lambda t: t.name or ""):
        partitions = sorted(topic.partitions, key=lambda p: p.partition_index)
        if not filtered:
            replication = len(partitions[0].replica_nodes) if partitions else 0
            config_text = ",".join(f"{k}={v}" for k, v in configs.get(topic.name, []))
            lines.append(
                f"Topic: {topic.name}\tTopicId: {topic_id_text(topic.topic_id)}\t"
                f"PartitionCount: {len(partitions)}\tReplicationFactor: {replication}\t"
                f"Configs: {config_text}"
            )
        for p in partitions:
            leader_live = p.leader_id >= 0 and p.leader_id in live
            if filtered and not (
                (under_replicated_only and len(p.isr_nodes) < len(p.replica_nodes))
                or (unavailable_only and not leader_live)
            ):
                continue
            line = (
                f"\tTopic: {topic.name}\tPartition: {p.partition_index}\t"
                f"Leader: {p.leader_id if p.leader_id >= 0 else 'none'}\t"
                f"Replicas: {_ids(p.replica_nodes)}\tIsr: {_ids(p.isr_nodes)}"
            )
            if p.offline_replicas:
                line += f"\tOffline: {_ids(p.offline_replicas)}"
            lines.append(line)
    return lines


@dataclass(frozen=True, slots=True)
class TopicsCommand:
    """A validated `odradek topics` invocation."""

    action: str  # create | list | describe | delete
    servers: list[tuple[str, int]]
    topic: str | None
    partitions: int
    replication_factor: int
    assignment: dict[int, list[int]]
    configs: dict[str, str]
    under_replicated_only: bool
    unavailable_only: bool
    if_exists: bool
    if_not_exists: bool
    timeout: float
    security: ClientSecurity = PLAINTEXT_CLIENT


def validate(args: argparse.Namespace) -> TopicsCommand:
    """Check the arguments before connecting anywhere; OperatorError names the first mistake."""
    action = next(a for a in ("create", "list", "describe", "delete") if getattr(args, a))
    if action in ("create", "delete") and not args.topic:
        raise OperatorError(f"--topic is required with --{action}")
    if args.replica_assignment and (
        args.partitions is not None or args.replication_factor is not None
    ):
        raise OperatorError(
            "--replica-assignment cannot be combined with --partitions or --replication-factor"
        )
    if args.partitions is not None and args.partitions < 1:
        raise OperatorError("--partitions must be at least 1")
    if args.replication_factor is not None and not 1 <= args.replication_factor <= 32767:
        raise OperatorError("--replication-factor must be between 1 and 32767")
    creating_only = ("partitions", "replication_factor", "config", "replica_assignment")
    if action != "create" and any(getattr(args, name) is not None for name in creating_only):
        raise OperatorError(
            "--partitions, --replication-factor, --config and --replica-assignment need --create"
        )
    if action != "describe" and (args.under_replicated_partitions or args.unavailable_partitions):
        raise OperatorError(
            "--under-replicated-partitions and --unavailable-partitions need --describe"
        )
    return TopicsCommand(
        action=action,
        servers=parse_bootstrap(args.bootstrap_server),
        topic=args.topic,
        partitions=args.partitions if args.partitions is not None else -1,
        replication_factor=args.replication_factor if args.replication_factor is not None else -1,
        assignment=(
            parse_replica_assignment(args.replica_assignment) if args.replica_assignment else {}
        ),
        configs=parse_configs(args.config or []),
        under_replicated_only=args.under_replicated_partitions,
        unavailable_only=args.unavailable_partitions,
        if_exists=args.if_exists,
        if_not_exists=args.if_not_exists,
        timeout=args.timeout,
        security=load_command_config(getattr(args, "command_config", None)),
    )


async def run(command: TopicsCommand) -> list[str]:
    """Carry out `command`; the lines to print."""
    client = await AdminClient.connect(command.servers, command.timeout, command.security)
    try:
        if command.action == "create":
            try:
                await client.create_topic(
                    command.topic or "",
                    command.partitions,
                    command.replication_factor,
                    command.assignment,
                    command.configs,
                )
            except KafkaResponseError as e:
                if command.if_not_exists and e.code == ErrorCode.topic_already_exists:
                    return []
                raise
            return [f"Created topic {command.topic}."]
        if command.action == "delete":
            try:
                await client.delete_topic(command.topic or "")
            except KafkaResponseError as e:
                if command.if_exists and e.code == ErrorCode.unknown_topic_or_partition:
                    return []
                raise
            return []
        metadata = await client.metadata([command.topic] if command.topic else None)
        if command.topic:  # a topic asked for by name must exist
            for topic in metadata.topics:
                check_error(topic.error_code, f"topic {topic.name!r}")
        if command.action == "list":
            return sorted(t.name for t in metadata.topics)
        filtered = command.under_replicated_only or command.unavailable_only
        names = [t.name for t in metadata.topics]
        configs = {} if filtered else await client.topic_configs(names)
        return describe_lines(
            metadata, configs, command.under_replicated_only, command.unavailable_only
        )
    finally:
        client.close()


def cmd_topics(args: argparse.Namespace) -> int:
    return print_command_lines(args, validate, run)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "topics",
        help="create, list, describe or delete topics",
        description="Create, list, describe or delete topics (like kafka-topics.sh).",
    )
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]")
    add_command_config_argument(parser)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--create", action="store_true", help="create a topic")
    action.add_argument("--list", action="store_true", help="list the topics")
    action.add_argument("--describe", action="store_true", help="describe topics")
    action.add_argument("--delete", action="store_true", help="delete a topic")
    parser.add_argument("--topic", help="the topic to create, delete or describe")
    parser.add_argument("--partitions", type=int, help="partitions (default: the broker's)")
    parser.add_argument(
        "--replication-factor", type=int, help="replicas per partition (default: the broker's)"
    )
    parser.add_argument(
        "--config", action="append", metavar="NAME=VALUE", help="a topic config override"
    )
    parser.add_argument(
        "--replica-assignment",
        metavar="B1:B2,B1:B2,...",
        help="explicit replicas: partitions separated by commas, replicas by colons",
    )
    filters = parser.add_mutually_exclusive_group()
    filters.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="describe only partitions whose ISR is smaller than their replicas",
    )
    filters.add_argument(
        "--unavailable-partitions",
        action="store_true",
        help="describe only partitions without a live leader",
    )
    parser.add_argument(
        "--if-not-exists", action="store_true", help="with --create: no error if it exists"
    )
    parser.add_argument(
        "--if-exists", action="store_true", help="with --delete: no error if it does not exist"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the brokers (default 30)"
    )
    parser.set_defaults(func=cmd_topics)
    return parser
