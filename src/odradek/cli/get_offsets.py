"""`odradek get-offsets`: partitions' offsets by time, like Kafka's `kafka-get-offsets.sh`
(GetOffsetShell).

  odradek get-offsets --bootstrap-server H:P [--topic REGEX [--partitions 0,1]]
                      [--topic-partitions 't1:0,t2:0-3,t3,t4:5-,t5:-3'] [--time latest]
                      [--exclude-internal-topics] [--command-config F]

One `topic:partition:offset` line per partition, ordered as Kafka's tool orders them (by the
string `topic-partition`). `--time` is Kafka's: `-1`/`latest` (the high watermark, or the last
stable offset for nothing: ListOffsets from a plain client reads uncommitted), `-2`/`earliest`
(the log start offset), `-3`/`max-timestamp` (the record with the largest timestamp), `-4`/
`earliest-local` (the same as earliest: there is no tiered storage), or a timestamp in ms (the
first offset whose timestamp is at least it; a partition with none is left out, as Kafka does).
Topic names are regular expressions matched against the whole name. The offsets come from
ListOffsets through confluent-kafka's admin client (`list_offsets`), sent to each leader.

Exit status 1 with one line when no partition matches the filters, the time is malformed, or the
cluster cannot be reached; a partition whose ListOffsets failed is skipped with a line on standard
error (`Skip getting offsets for topic-partition t-0 due to error: ...`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any

from odradek.cli.client_tools import (
    add_bootstrap_arguments,
    bootstrap_of,
    client_config,
    describe_kafka_error,
    run_tool,
)
from odradek.errors import OperatorError

INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")
PartitionFilter = Callable[[int], bool]
_TOPIC_PARTITION = re.compile(r"^([^:,]*)(?::(?:(\d+)|(\d*)-(\d*)))?$")


def parse_time(text: str) -> tuple[str, int]:
    """('earliest' | 'latest' | 'max_timestamp' | 'timestamp', timestamp)."""
    named = {
        "latest": "latest",
        "-1": "latest",
        "earliest": "earliest",
        "-2": "earliest",
        "max-timestamp": "max_timestamp",
        "-3": "max_timestamp",
        "earliest-local": "earliest",
        "-4": "earliest",
    }
    if text in named:
        return named[text], 0
    try:
        timestamp = int(text)
    except ValueError:
        timestamp = -1
    if timestamp < 0:
        raise OperatorError(
            f"Malformed time argument {text}. Please use -1 or latest / -2 or earliest / -3 or "
            "max-timestamp / -4 or earliest-local, or a specified long format timestamp "
            "(latest-tiered: there is no tiered storage)"
        )
    return "timestamp", timestamp


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise OperatorError(f"{pattern!r} is not a regular expression: {e}") from None


def parse_topic_partitions(text: str) -> list[tuple[re.Pattern[str], PartitionFilter]]:
    """Kafka's `--topic-partitions` patterns: `topic`, `topic:3`, `topic:0-3` (end exclusive),
    `topic:5-`, `topic:-3`; an empty topic matches every topic."""
    filters: list[tuple[re.Pattern[str], PartitionFilter]] = []
    for item in text.split(","):
        match = _TOPIC_PARTITION.match(item.strip())
        if match is None:
            raise OperatorError(
                f"Invalid topic-partition pattern: {item} (expected topic, topic:N, topic:N-M, "
                "topic:N- or topic:-M)"
            )
        topic, single, low, high = match.groups()
        pattern = _compile(topic or ".*")
        if single is not None:
            filters.append((pattern, _partition_range(int(single), int(single) + 1)))
        elif low is not None or high is not None:
            end = int(high) if high else None
            filters.append((pattern, _partition_range(int(low) if low else 0, end)))
        else:
            filters.append((pattern, _partition_range(0, None)))
    return filters


def _partition_range(start: int, end: int | None) -> PartitionFilter:
    """Partitions from `start` up to `end` (exclusive; None: no end)."""

    def accepts(partition: int) -> bool:
        return partition >= start and (end is None or partition < end)

    return accepts


def partition_filters(args: argparse.Namespace) -> list[tuple[re.Pattern[str], PartitionFilter]]:
    if args.topic_partitions:
        if args.topic or args.partitions:
            raise OperatorError("--topic-partitions cannot be used with --topic or --partitions")
        return parse_topic_partitions(args.topic_partitions)
    pattern = _compile(args.topic or ".*")
    if not args.partitions:
        return [(pattern, _partition_range(0, None))]
    try:
        wanted = {int(p) for p in args.partitions.split(",") if p.strip()}
    except ValueError:
        raise OperatorError("--partitions must be partition ids separated by commas") from None
    return [(pattern, wanted.__contains__)]


def fetch_offsets(args: argparse.Namespace) -> dict[tuple[str, int], int]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    kind, timestamp = parse_time(args.time)
    filters = partition_filters(args)
    config = client_config(bootstrap_of(args), config_file=args.command_config)
    config.setdefault("client.id", "GetOffsetShell")
    admin = AdminClient(config)
    metadata = admin.list_topics(timeout=args.timeout)
    partitions = [
        (topic.topic or "", partition)
        for topic in metadata.topics.values()
        if topic.error is None
        and topic.topic
        and not (args.exclude_internal_topics and topic.topic in INTERNAL_TOPICS)
        for partition in topic.partitions
        if any(
            pattern.fullmatch(topic.topic or "") and accepts(partition)
            for pattern, accepts in filters
        )
    ]
    if not partitions:
        raise OperatorError("Could not match any topic-partitions with the specified filters")
    spec = {
        "earliest": OffsetSpec.earliest,
        "latest": OffsetSpec.latest,
        "max_timestamp": OffsetSpec.max_timestamp,
    }.get(kind)
    offset_spec = spec() if spec is not None else OffsetSpec.for_timestamp(timestamp)
    futures = admin.list_offsets(
        {TopicPartition(topic, partition): offset_spec for topic, partition in partitions},
        request_timeout=args.timeout,
    )
    offsets: dict[tuple[str, int], int] = {}
    for tp, future in futures.items():
        try:
            result = future.result()
        except Exception as e:  # a KafkaException for this partition only
            print(
                f"Skip getting offsets for topic-partition {tp.topic}-{tp.partition} due to "
                f"error: {describe_kafka_error(e)}",
                file=sys.stderr,
            )
            continue
        if result.offset >= 0:
            offsets[(tp.topic, tp.partition)] = result.offset
    return offsets


def kafka_order(offsets: dict[tuple[str, int], int]) -> list[tuple[str, int, int]]:
    """Kafka's tool sorts by `TopicPartition.toString()`: `t-10` comes before `t-2`."""
    return sorted(
        ((topic, partition, offset) for (topic, partition), offset in offsets.items()),
        key=lambda row: f"{row[0]}-{row[1]}",
    )


def _run(args: argparse.Namespace) -> int:
    for topic, partition, offset in kafka_order(fetch_offsets(args)):
        print(f"{topic}:{partition}:{offset}")
    return 0


def cmd_get_offsets(args: argparse.Namespace) -> int:
    return run_tool(lambda: _run(args))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "get-offsets",
        help="partitions' offsets by time",
        description="Print the offsets of partitions at a time (like kafka-get-offsets.sh).",
    )
    add_bootstrap_arguments(parser)
    parser.add_argument("--topic", metavar="REGEX", help="topics to query (default: all)")
    parser.add_argument("--partitions", metavar="0,1", help="partition ids (default: all)")
    parser.add_argument(
        "--topic-partitions",
        metavar="PATTERNS",
        help="comma-separated topic:partition patterns, e.g. 't1:0,t2:0-3,t3,t4:5-,t5:-3'",
    )
    parser.add_argument(
        "--time",
        default="latest",
        help="-1/latest (default), -2/earliest, -3/max-timestamp, -4/earliest-local, or a "
        "timestamp in ms",
    )
    parser.add_argument(
        "--exclude-internal-topics", action="store_true", help="leave out internal topics"
    )
    parser.add_argument(
        "--command-config", metavar="FILE", help="admin client properties (security settings)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    parser.set_defaults(func=cmd_get_offsets)
    return parser
