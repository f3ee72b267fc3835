"""`odradek console-consumer`: print a topic's records, like Kafka's `kafka-console-consumer.sh`.

  odradek console-consumer --bootstrap-server H:P --topic T [--from-beginning] [--max-messages N]
      [--group G] [--partition P [--offset earliest|latest|N]] [--include REGEX]
      [--property print.key=true] [--property print.timestamp=true] [--property print.headers=true]
      [--property print.partition=true] [--property print.offset=true] [--property key.separator=:]
      [--timeout-ms MS] [--isolation-level read_committed] [--consumer-property k=v]
      [--consumer.config F] [--formatter-config F]

Records are printed by `DefaultMessageFormatter`, Kafka's default formatter with its properties
and defaults: in this order, when enabled, `CreateTime:1700000000000` (or `LogAppendTime:...`,
`NO_TIMESTAMP`), `Partition:0`, `Offset:5`, the headers (`k1:v1,k2:v2`, `headers.separator`;
`NO_HEADERS` when there are none), the key, then the value (`print.value=false` leaves it out),
separated by `key.separator` (tab), each record ended by `line.separator` (newline); a null key,
value or header value prints `null.literal` (`null`).

Without `--group` the consumer joins a fresh group `console-consumer-NNNNN` and commits nothing;
with `--group` it commits as a group member would. `--from-beginning` starts where no committed
offset exists at the earliest offset (otherwise the latest). `--partition P` reads one partition
without a group, from `--offset` (default latest). The tool stops after `--max-messages`, after
`--timeout-ms` without a record, or at Ctrl-C/SIGTERM; it then closes the consumer (leaving the
group) and prints `Processed a total of N messages` on standard error, exit status 0.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any, BinaryIO, cast

from odradek.cli.client_tools import (
    add_bootstrap_arguments,
    bootstrap_of,
    client_config,
    describe_kafka_error,
    parse_property_list,
    read_properties_file,
    run_tool,
)
from odradek.errors import OperatorError

# librdkafka's timestamp types (confluent_kafka.TIMESTAMP_*): not available, create, log append.
_TIMESTAMP_NAMES = {1: "CreateTime", 2: "LogAppendTime"}
DEFAULT_FORMATTERS = (
    "kafka.tools.DefaultMessageFormatter",
    "org.apache.kafka.tools.consumer.DefaultMessageFormatter",
)


def _flag(properties: dict[str, str], name: str, default: bool) -> bool:
    if name not in properties:
        return default
    return properties[name].strip().lower() == "true"


class DefaultMessageFormatter:
    """Kafka's DefaultMessageFormatter over (timestamp type, timestamp, partition, offset,
    headers, key, value) — see the module docstring for the properties."""

    def __init__(self, properties: dict[str, str]) -> None:
        self.print_timestamp = _flag(properties, "print.timestamp", False)
        self.print_key = _flag(properties, "print.key", False)
        self.print_offset = _flag(properties, "print.offset", False)
        self.print_partition = _flag(properties, "print.partition", False)
        self.print_headers = _flag(properties, "print.headers", False)
        self.print_value = _flag(properties, "print.value", True)
        self.key_separator = properties.get("key.separator", "\t").encode()
        self.line_separator = properties.get("line.separator", "\n").encode()
        self.headers_separator = properties.get("headers.separator", ",").encode()
        self.null_literal = properties.get("null.literal", "null").encode()

    def format(
        self,
        timestamp: tuple[int, int],
        partition: int,
        offset: int,
        headers: list[tuple[str, bytes | None]] | None,
        key: bytes | None,
        value: bytes | None,
    ) -> bytes:
        out = bytearray()
        # Each column is followed by the column separator if another column follows it.
        columns_after = [
            self.print_partition,
            self.print_offset,
            self.print_headers,
            self.print_key,
            self.print_value,
        ]

        def separator(index: int) -> None:
            out.extend(self.key_separator if any(columns_after[index:]) else self.line_separator)

        if self.print_timestamp:
            kind, ts = timestamp
            name = _TIMESTAMP_NAMES.get(kind)
            out += f"{name}:{ts}".encode() if name else b"NO_TIMESTAMP"
            separator(0)
        if self.print_partition:
            out += f"Partition:{partition}".encode()
            separator(1)
        if self.print_offset:
            out += f"Offset:{offset}".encode()
            separator(2)
        if self.print_headers:
            if not headers:
                out += b"NO_HEADERS"
            else:
                out += self.headers_separator.join(
                    name.encode() + b":" + (self.null_literal if data is None else data)
                    for name, data in headers
                )
            separator(3)
        if self.print_key:
            out += self.null_literal if key is None else key
            separator(4)
        if self.print_value:
            out += self.null_literal if value is None else value
            out += self.line_separator
        return bytes(out)


def _start_offset(text: str) -> int:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END

    lowered = text.lower()
    if lowered in ("earliest", "-2"):
        return int(OFFSET_BEGINNING)
    if lowered in ("latest", "-1"):
        return int(OFFSET_END)
    try:
        offset = int(text)
    except ValueError:
        raise OperatorError(
            f"--offset must be earliest, latest or a non-negative number, not {text!r}"
        ) from None
    if offset < 0:
        raise OperatorError("--offset must be earliest, latest or a non-negative number")
    return offset


def validate(args: argparse.Namespace) -> None:
    if bool(args.topic) == bool(args.include):
        raise OperatorError("exactly one of --topic and --include is required")
    if args.partition is not None and not args.topic:
        raise OperatorError("--partition needs --topic")
    if args.offset is not None and args.partition is None:
        raise OperatorError("--offset needs --partition")
    if args.partition is not None and args.from_beginning and args.offset is not None:
        raise OperatorError("--from-beginning and --offset cannot be used together")
    if args.partition is not None and args.group:
        raise OperatorError("--group cannot be used with --partition")
    if args.formatter and args.formatter not in DEFAULT_FORMATTERS:
        raise OperatorError(
            f"--formatter {args.formatter} is not supported (only {DEFAULT_FORMATTERS[1]})"
        )
    if args.max_messages is not None and args.max_messages <= 0:
        raise OperatorError("--max-messages must be positive")


def consumer_settings(args: argparse.Namespace) -> dict[str, str]:
    group = args.group or f"console-consumer-{random.randrange(100000)}"
    defaults = {
        "group.id": group,
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "enable.auto.commit": "true" if args.group else "false",
        "isolation.level": args.isolation_level,
        "client.id": "console-consumer",
        "enable.partition.eof": "false",
    }
    return client_config(
        bootstrap_of(args),
        config_file=args.consumer_config,
        config_flag="--consumer.config",
        properties=args.consumer_property,
        properties_flag="--consumer-property",
        defaults=defaults,
    )


def consume(args: argparse.Namespace, output: BinaryIO) -> int:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    validate(args)
    formatter_properties = read_properties_file(args.formatter_config, "--formatter-config")
    formatter_properties.update(parse_property_list(args.property, "--property"))
    formatter = DefaultMessageFormatter(formatter_properties)
    consumer = Consumer(consumer_settings(args))
    count = 0
    warned: set[int] = set()
    try:
        if args.partition is not None:
            if args.offset is not None:
                start = _start_offset(args.offset)
            else:
                start = int(OFFSET_BEGINNING) if args.from_beginning else _start_offset("latest")
            consumer.assign([TopicPartition(args.topic, args.partition, start)])
        else:
            consumer.subscribe([args.topic] if args.topic else [f"^{args.include}"])
        timeout_s = None if args.timeout_ms is None else args.timeout_ms / 1000
        last_record = time.monotonic()
        while args.max_messages is None or count < args.max_messages:
            message = consumer.poll(0.2)
            if message is None:
                if timeout_s is not None and time.monotonic() - last_record >= timeout_s:
                    print(
                        "Error processing message, terminating consumer process: "
                        f"no record within {args.timeout_ms} ms",
                        file=sys.stderr,
                    )
                    break
                continue
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise OperatorError(describe_kafka_error(error))
                if error.code() not in warned and error.code() != KafkaError._PARTITION_EOF:
                    warned.add(error.code())
                    print(f"WARN {describe_kafka_error(error)}", file=sys.stderr)
                continue
            last_record = time.monotonic()
            count += 1
            headers = cast("list[tuple[str, bytes | None]] | None", message.headers())
            output.write(
                formatter.format(
                    message.timestamp(),
                    message.partition() or 0,
                    message.offset() or 0,
                    headers,
                    message.key(),
                    message.value(),
                )
            )
            output.flush()
    except KeyboardInterrupt:
        pass
    finally:
        try:
            consumer.close()
        finally:
            print(f"Processed a total of {count} messages", file=sys.stderr)
    return 0


def cmd_console_consumer(args: argparse.Namespace) -> int:
    return run_tool(lambda: consume(args, sys.stdout.buffer))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "console-consumer",
        help="print a topic's records",
        description="Consume records and print them (like kafka-console-consumer.sh).",
    )
    add_bootstrap_arguments(parser)
    parser.add_argument("--topic", help="the topic to consume")
    parser.add_argument(
        "--include", "--whitelist", dest="include", metavar="REGEX", help="topics matching REGEX"
    )
    parser.add_argument("--partition", type=int, help="read only this partition (no group)")
    parser.add_argument(
        "--offset", help="with --partition: earliest, latest (default) or an offset"
    )
    parser.add_argument("--group", help="the consumer group (default: a new one, no commits)")
    parser.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the earliest offset when there is no committed offset",
    )
    parser.add_argument("--max-messages", type=int, help="stop after this many records")
    parser.add_argument("--timeout-ms", type=int, help="stop when no record arrives for this long")
    parser.add_argument(
        "--property",
        action="append",
        metavar="K=V",
        help="formatter properties: print.timestamp, print.key, print.offset, print.partition, "
        "print.headers, print.value, key.separator, line.separator, headers.separator, "
        "null.literal",
    )
    parser.add_argument("--formatter", help="only Kafka's DefaultMessageFormatter")
    parser.add_argument("--formatter-config", metavar="FILE", help="formatter properties file")
    parser.add_argument(
        "--consumer-property", action="append", metavar="K=V", help="a consumer property"
    )
    parser.add_argument(
        "--consumer.config", dest="consumer_config", metavar="FILE", help="consumer properties"
    )
    parser.add_argument(
        "--isolation-level",
        default="read_uncommitted",
        choices=["read_uncommitted", "read_committed"],
        help="read_uncommitted (default, as Kafka's tool) or read_committed",
    )
    parser.add_argument(
        "--skip-message-on-error", action="store_true", help="accepted for compatibility"
    )
    parser.set_defaults(func=cmd_console_consumer)
    return parser
