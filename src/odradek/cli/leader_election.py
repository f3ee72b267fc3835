"""`odradek leader-election`: preferred or unclean leader elections, like Kafka's
`kafka-leader-election.sh`.

  odradek leader-election --bootstrap-server H:P --election-type preferred|unclean
                          (--topic T --partition P | --all-topic-partitions | --path-to-json-file F)

The JSON file is Kafka's: `{"partitions": [{"topic": "t", "partition": 0}, ...]}` (a partition
listed twice is a mistake). The command sends one ElectLeaders v2 request to the controller (found
through Metadata, as Kafka's admin client does; asked again if the controller moved meanwhile) and
prints Kafka's summary:

  Successfully completed leader election (PREFERRED) for partitions t-0, t-3
  Valid replica already elected for partitions t-1
  Error completing leader election (PREFERRED) for partition: t-2: PREFERRED_LEADER_NOT_AVAILABLE: ..

and exits 1 when any partition could not be elected (`odradek: error: 1 replica(s) could not be
elected`), or on any mistake in the arguments or the file, with one line naming it. With
`--all-topic-partitions` the broker leaves out the partitions whose leader is already right, as
Kafka's does.
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
from odradek.errors import OperatorError
from odradek.network.client import PLAINTEXT_CLIENT, ClientSecurity
from odradek.protocol.codec import ApiKey

ELECT_LEADERS_VERSION = 2
ELECTION_TYPES = {"preferred": 0, "unclean": 1}
NOT_CONTROLLER_ATTEMPTS = 3

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class LeaderElectionCommand:
    """A validated `odradek leader-election` invocation; `partitions` None means all."""

    servers: list[tuple[str, int]]
    election_type: str
    partitions: list[TopicPartition] | None
    timeout: float
    security: ClientSecurity = PLAINTEXT_CLIENT


@dataclass(frozen=True, slots=True)
class ElectionSummary:
    """The answer sorted as Kafka's command prints it."""

    succeeded: list[TopicPartition]
    not_needed: list[TopicPartition]
    failed: list[tuple[TopicPartition, str]]


def parse_partitions_json(text: str, source: str) -> list[TopicPartition]:
    """Kafka's election JSON -> partitions in file order; OperatorError naming the problem."""
    try:
        document = json.loads(text)
    except ValueError as e:
        raise OperatorError(f"{source} is not valid JSON: {e}") from None
    entries = document.get("partitions") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise OperatorError(f'{source} must be an object with a "partitions" list')
    partitions: list[TopicPartition] = []
    for entry in entries:
        topic = entry.get("topic") if isinstance(entry, dict) else None
        partition = entry.get("partition") if isinstance(entry, dict) else None
        if (
            not isinstance(topic, str)
            or not topic
            or not isinstance(partition, int)
            or isinstance(partition, bool)
            or partition < 0
        ):
            raise OperatorError(
                f'{source}: every partition must be {{"topic": name, "partition": number}},'
                f" not {json.dumps(entry)}"
            )
        partitions.append((topic, partition))
    if not partitions:
        raise OperatorError(f"{source} lists no partitions")
    duplicates = sorted({tp for tp in partitions if partitions.count(tp) > 1})
    if duplicates:
        raise OperatorError(
            f"{source} lists partitions more than once: {', '.join(_names(duplicates))}"
        )
    return partitions


def validate(args: argparse.Namespace) -> LeaderElectionCommand:
    """Check the arguments before connecting anywhere; OperatorError names the first mistake."""
    election_type = args.election_type.strip().lower()
    if election_type not in ELECTION_TYPES:
        raise OperatorError(
            f"invalid --election-type {args.election_type!r}: expected preferred or unclean"
        )
    chosen = [
        name
        for name, given in (
            ("--topic", args.topic is not None),
            ("--all-topic-partitions", args.all_topic_partitions),
            ("--path-to-json-file", args.path_to_json_file is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        raise OperatorError(
            "give exactly one of --topic (with --partition), --all-topic-partitions and"
            " --path-to-json-file" + (f" (got {' and '.join(chosen)})" if chosen else "")
        )
    if (args.topic is None) != (args.partition is None):
        raise OperatorError("--topic and --partition must be given together")
    partitions: list[TopicPartition] | None = None
    if args.topic is not None:
        if args.partition < 0:
            raise OperatorError("--partition must not be negative")
        partitions = [(args.topic, args.partition)]
    elif args.path_to_json_file is not None:
        path = Path(args.path_to_json_file)
        try:
            text = path.read_text()
        except OSError as e:
            raise OperatorError(f"cannot read {path}: {e.strerror}") from None
        partitions = parse_partitions_json(text, str(path))
    return LeaderElectionCommand(
        servers=parse_bootstrap(args.bootstrap_server),
        election_type=election_type,
        partitions=partitions,
        timeout=args.timeout,
        security=load_command_config(getattr(args, "command_config", None)),
    )


def _names(partitions: Sequence[TopicPartition]) -> list[str]:
    return [f"{topic}-{partition}" for topic, partition in partitions]


def summarize(response: Any) -> ElectionSummary:
    """An ElectLeaders response sorted into elected, already right, and failed (with the error's
    name and message)."""
    succeeded, not_needed, failed = [], [], []
    for topic_result in response.replica_election_results:
        for result in topic_result.partition_result:
            tp = (str(topic_result.topic), int(result.partition_id))
            code = ErrorCode(result.error_code)
            if code == ErrorCode.none:
                succeeded.append(tp)
            elif code == ErrorCode.election_not_needed:
                not_needed.append(tp)
            else:
                detail = " ".join((result.error_message or "").split())
                failed.append(
                    (tp, f"{code.name.upper()}: {detail}" if detail else code.name.upper())
                )
    return ElectionSummary(sorted(succeeded), sorted(not_needed), sorted(failed))


def summary_lines(summary: ElectionSummary, election_type: str) -> list[str]:
    kind = election_type.upper()
    lines = []
    if summary.succeeded:
        lines.append(
            f"Successfully completed leader election ({kind}) for partitions "
            + ", ".join(_names(summary.succeeded))
        )
    if summary.not_needed:
        lines.append(
            "Valid replica already elected for partitions " + ", ".join(_names(summary.not_needed))
        )
    for (topic, partition), error in summary.failed:
        lines.append(
            f"Error completing leader election ({kind}) for partition: {topic}-{partition}: {error}"
        )
    return lines


class LeaderElectionClient(AdminClient):
    """The topics command's connections, plus ElectLeaders. Owned by one event loop."""

    async def elect_leaders(
        self, election_type: int, partitions: Sequence[TopicPartition] | None
    ) -> Any:
        topic_partitions = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in partitions:
                by_topic.setdefault(topic, []).append(partition)
            topic_partitions = [{"topic": t, "partitions": p} for t, p in by_topic.items()]
        values = {
            "election_type": election_type,
            "topic_partitions": topic_partitions,
            "timeout": int(self.timeout * 1000),
        }
        # The controller may move between our Metadata and its answer: ask the new one.
        for _attempt in range(NOT_CONTROLLER_ATTEMPTS):
            response = await self._send_to_controller(
                ApiKey.ELECT_LEADERS, ELECT_LEADERS_VERSION, values
            )
            if response.error_code != ErrorCode.none:
                raise KafkaResponseError(ErrorCode(response.error_code), None)
            codes = {
                result.error_code
                for topic_result in response.replica_election_results
                for result in topic_result.partition_result
            }
            if codes != {ErrorCode.not_controller}:
                return response
        return response


async def run(command: LeaderElectionCommand) -> ElectionSummary:
    client = await LeaderElectionClient.connect(command.servers, command.timeout, command.security)
    try:
        response = await client.elect_leaders(
            ELECTION_TYPES[command.election_type], command.partitions
        )
    finally:
        client.close()
    return summarize(response)


def cmd_leader_election(args: argparse.Namespace) -> int:
    try:
        command = validate(args)
        summary = asyncio.run(run(command))
    except OperatorError as e:
        print(f"odradek: error: {e}", file=sys.stderr)
        return 1
    for line in summary_lines(summary, command.election_type):
        print(line)
    if summary.failed:
        print(
            f"odradek: error: {len(summary.failed)} replica(s) could not be elected",
            file=sys.stderr,
        )
        return 1
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "leader-election",
        help="elect preferred or unclean leaders",
        description="Elect the preferred replica (or, for leaderless partitions, any live "
        "replica) as leader (like kafka-leader-election.sh).",
    )
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]")
    add_command_config_argument(parser)
    parser.add_argument(
        "--election-type",
        required=True,
        metavar="preferred|unclean",
        help="preferred: the first replica of each partition leads if it is alive and in sync; "
        "unclean: partitions without a live leader get one, even out of sync",
    )
    parser.add_argument("--topic", help="the topic of the one partition to elect")
    parser.add_argument("--partition", type=int, help="the partition to elect (with --topic)")
    parser.add_argument("--all-topic-partitions", action="store_true", help="elect every partition")
    parser.add_argument(
        "--path-to-json-file",
        metavar="FILE",
        help='partitions to elect: {"partitions": [{"topic": "t", "partition": 0}, ...]}',
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the elections (default 30)"
    )
    parser.set_defaults(func=cmd_leader_election)
    return parser
