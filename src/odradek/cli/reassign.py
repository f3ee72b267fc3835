"""`odradek reassign-partitions`: move partition replicas, like Kafka's `kafka-reassign-partitions.sh`.

  odradek reassign-partitions --bootstrap-server H:P --reassignment-json-file F --execute
  odradek reassign-partitions --bootstrap-server H:P --reassignment-json-file F --verify
  odradek reassign-partitions --bootstrap-server H:P --reassignment-json-file F --cancel
  odradek reassign-partitions --bootstrap-server H:P --list

The file is Kafka's reassignment JSON, `{"version":1,"partitions":[{"topic":"t","partition":0,
"replicas":[2,3]},...]}` (an optional `log_dirs` list per partition may only say "any": this broker
has one log directory per partition and picks it itself).

* `--execute` prints the current assignment of those partitions in the same format (save it to roll
  back) and starts the moves with AlterPartitionReassignments, sent to the controller.
* `--verify` says, per partition, whether its move is complete, still in progress
  (ListPartitionReassignments), or over with a replica set that is not the one asked for.
* `--cancel` cancels the moves of those partitions (AlterPartitionReassignments with null
  replicas): each reverts to its original replicas.
* `--list` prints every move in progress with its replicas, adding and removing replicas.

A Kafka error prints as `odradek: error: CODE_NAME: message` on one line and the command exits 1;
so does a partition the controller refused, a malformed file, or `--verify` finding a partition
whose move ended with other replicas than the file asks for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.cli.client_config import add_command_config_argument, load_command_config
from odradek.cli.topics import AdminClient, KafkaResponseError, parse_bootstrap
from odradek.errors import OperatorError, require
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity
from odradek.protocol.codec import ApiKey

ALTER_VERSION = 0
LIST_VERSION = 0
NOT_CONTROLLER_RETRIES = 5

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ReassignCommand:
    """A validated `odradek reassign-partitions` invocation."""

    action: str  # execute | verify | cancel | list
    servers: list[tuple[str, int]]
    targets: dict[TopicPartition, list[int]]
    timeout: float
    security: ClientSecurity = PLAINTEXT_CLIENT


def parse_reassignment_json(text: str, where: str) -> dict[TopicPartition, list[int]]:
    """Kafka's reassignment JSON -> {(topic, partition): replicas}; OperatorError naming the first
    problem (bad JSON, a missing or mistyped field, a partition listed twice)."""
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise OperatorError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("partitions"), list):
        raise OperatorError(f'{where} must be an object with a "partitions" list')
    version = obj.get("version", 1)
    if version != 1:
        raise OperatorError(f"{where}: unsupported version {version!r} (expected 1)")
    targets: dict[TopicPartition, list[int]] = {}
    for index, entry in enumerate(obj["partitions"]):
        if not isinstance(entry, dict):
            raise OperatorError(f"{where}: partitions[{index}] is not an object")
        topic, partition, replicas = (
            entry.get("topic"),
            entry.get("partition"),
            entry.get("replicas"),
        )
        if not isinstance(topic, str) or not topic:
            raise OperatorError(f'{where}: partitions[{index}] needs a "topic" string')
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise OperatorError(f'{where}: partitions[{index}] needs a "partition" number')
        if not isinstance(replicas, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in replicas
        ):
            raise OperatorError(f'{where}: partitions[{index}] needs a "replicas" list of ids')
        log_dirs = entry.get("log_dirs")
        if log_dirs is not None and (
            not isinstance(log_dirs, list)
            or len(log_dirs) != len(replicas)
            or any(d != "any" for d in log_dirs)
        ):
            raise OperatorError(
                f'{where}: partitions[{index}]: "log_dirs" may only be "any" for every replica'
            )
        if (topic, partition) in targets:
            raise OperatorError(f"{where}: partition {topic}-{partition} is listed twice")
        targets[(topic, partition)] = list(replicas)
    if not targets:
        raise OperatorError(f"{where} lists no partitions")
    return targets


def reassignment_json(assignment: dict[TopicPartition, Sequence[int]]) -> str:
    """The reassignment JSON of `assignment` (for the rollback file), as Kafka's tool prints it."""
    return json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": t, "partition": p, "replicas": list(r), "log_dirs": ["any"] * len(r)}
                for (t, p), r in sorted(assignment.items())
            ],
        },
        separators=(",", ":"),
    )


def _name(tp: TopicPartition) -> str:
    return f"{tp[0]}-{tp[1]}"


class ReassignClient(AdminClient):
    """The admin connections plus the two reassignment APIs. One event loop."""

    async def _to_controller(self, api_key: int, version: int, values: Any) -> Any:
        """Send to the controller; on NOT_CONTROLLER (it moved meanwhile) look it up again."""
        response = None
        for _attempt in range(NOT_CONTROLLER_RETRIES):
            response = await self._send_to_controller(api_key, version, values)
            if response.error_code != ErrorCode.not_controller:
                break
            await asyncio.sleep(0.5)
        response = require(response, "the controller's answer")
        if response.error_code != ErrorCode.none:
            raise KafkaResponseError(response.error_code, response.error_message)
        return response

    async def current_replicas(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, list[int]]:
        """Each partition's replica set from Metadata; UNKNOWN_TOPIC_OR_PARTITION for a missing
        topic or partition."""
        topics = sorted({t for t, _ in partitions})
        metadata = await self.metadata(topics)
        replicas: dict[TopicPartition, list[int]] = {}
        for topic in metadata.topics:
            if topic.error_code != ErrorCode.none:
                raise KafkaResponseError(topic.error_code, f"topic {topic.name!r}")
            for p in topic.partitions:
                replicas[(topic.name, p.partition_index)] = list(p.replica_nodes)
        missing = [tp for tp in partitions if tp not in replicas]
        if missing:
            raise KafkaResponseError(
                ErrorCode.unknown_topic_or_partition,
                f"no partition {', '.join(_name(tp) for tp in missing)}",
            )
        return {tp: replicas[tp] for tp in partitions}

    async def alter(
        self, targets: dict[TopicPartition, list[int] | None]
    ) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), replicas in sorted(targets.items()):
            by_topic.setdefault(topic, []).append(
                {"partition_index": partition, "replicas": replicas}
            )
        response = await self._to_controller(
            ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            ALTER_VERSION,
            {
                "timeout": int(self.timeout * 1000),
                "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
            },
        )
        return {
            (topic.name, p.partition_index): (p.error_code, p.error_message)
            for topic in response.responses
            for p in topic.partitions
        }

    async def list_reassignments(
        self, partitions: Sequence[TopicPartition] | None
    ) -> dict[TopicPartition, Any]:
        topics = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in partitions:
                by_topic.setdefault(topic, []).append(partition)
            topics = [{"name": t, "partition_indexes": p} for t, p in sorted(by_topic.items())]
        response = await self._to_controller(
            ApiKey.LIST_PARTITION_REASSIGNMENTS,
            LIST_VERSION,
            {"timeout": int(self.timeout * 1000), "topics": topics},
        )
        return {
            (topic.name, p.partition_index): p
            for topic in response.topics
            for p in topic.partitions
        }


def _raise_refusals(results: dict[TopicPartition, tuple[ErrorCode, str | None]]) -> None:
    refused = [
        (tp, code, message)
        for tp, (code, message) in sorted(results.items())
        if code != ErrorCode.none
    ]
    if refused:
        tp, code, message = refused[0]
        more = f" (and {len(refused) - 1} more partitions)" if len(refused) > 1 else ""
        raise KafkaResponseError(code, f"{_name(tp)}: {message or ''}{more}")


async def run(command: ReassignCommand) -> tuple[list[str], int]:
    """Carry out `command`: the lines to print and the exit code."""
    client = await ReassignClient.connect(command.servers, command.timeout, command.security)
    try:
        if command.action == "list":
            moving = await client.list_reassignments(None)
            lines = ["Current partition reassignments:"]
            for tp, p in sorted(moving.items()):
                lines.append(
                    f"{_name(tp)}: replicas: {_ids(p.replicas)}. adding: {_ids(p.adding_replicas)}."
                    f" removing: {_ids(p.removing_replicas)}."
                )
            return lines, 0
        partitions = sorted(command.targets)
        if command.action == "execute":
            current = await client.current_replicas(partitions)
            lines = [
                "Current partition replica assignment",
                "",
                reassignment_json(current),
                "",
                "Save this to use as the --reassignment-json-file option during rollback",
            ]
            results = await client.alter(dict(command.targets))
            _raise_refusals(results)
            lines.append(
                "Successfully started partition reassignments for "
                + ",".join(_name(tp) for tp in partitions)
            )
            return lines, 0
        if command.action == "cancel":
            results = await client.alter(dict.fromkeys(partitions))
            _raise_refusals(results)
            return [
                "Successfully cancelled partition reassignments for: "
                + ",".join(_name(tp) for tp in partitions)
            ], 0
        # verify
        moving = await client.list_reassignments(partitions)
        current = await client.current_replicas(partitions)
        lines = ["Status of partition reassignment:"]
        code = 0
        for tp in partitions:
            if tp in moving:
                lines.append(f"Reassignment of partition {_name(tp)} is still in progress.")
            elif current[tp] == command.targets[tp]:
                lines.append(f"Reassignment of partition {_name(tp)} is complete.")
            else:
                code = 1
                lines.append(
                    f"There is no active reassignment of partition {_name(tp)}, but replica set is"
                    f" {_ids(current[tp])} rather than {_ids(command.targets[tp])}."
                )
        return lines, code
    finally:
        client.close()


def _ids(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def validate(args: argparse.Namespace) -> ReassignCommand:
    action = next(a for a in ("execute", "verify", "cancel", "list") if getattr(args, a))
    targets: dict[TopicPartition, list[int]] = {}
    if action == "list":
        if args.reassignment_json_file:
            raise OperatorError("--list takes no --reassignment-json-file")
    else:
        if not args.reassignment_json_file:
            raise OperatorError(f"--{action} needs --reassignment-json-file")
        path = Path(args.reassignment_json_file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise OperatorError(f"cannot read {path}: {e.strerror or e}") from None
        targets = parse_reassignment_json(text, str(path))
    return ReassignCommand(
        action,
        parse_bootstrap(args.bootstrap_server),
        targets,
        args.timeout,
        load_command_config(getattr(args, "command_config", None)),
    )


def cmd_reassign_partitions(args: argparse.Namespace) -> int:
    try:
        lines, code = asyncio.run(run(validate(args)))
    except OperatorError as e:
        print(f"odradek: error: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return code


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "reassign-partitions",
        help="move partition replicas between brokers",
        description="Move partition replicas between brokers (like kafka-reassign-partitions.sh).",
    )
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]")
    add_command_config_argument(parser)
    parser.add_argument(
        "--reassignment-json-file", metavar="FILE", help="the partitions and their target replicas"
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--execute", action="store_true", help="start the reassignments")
    action.add_argument("--verify", action="store_true", help="report their progress")
    action.add_argument("--cancel", action="store_true", help="cancel them (revert)")
    action.add_argument("--list", action="store_true", help="list every reassignment in progress")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the brokers (default 30)"
    )
    parser.set_defaults(func=cmd_reassign_partitions)
    return parser
