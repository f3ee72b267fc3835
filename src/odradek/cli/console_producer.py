"""`odradek console-producer`: records from standard input, one per line, like Kafka's
`kafka-console-producer.sh`.

  odradek console-producer --bootstrap-server H:P --topic T [--property parse.key=true]
      [--property key.separator=:] [--property parse.headers=true] [--partition N] [--sync]
      [--compression-codec lz4] [--request-required-acks all] [--producer-property k=v]
      [--producer.config F]

Each line is read as Kafka's LineMessageReader reads it (`LineReader` below, with Kafka's
properties and defaults): with `parse.headers=true` the line starts with headers up to
`headers.delimiter` (tab), each `key:value` (`headers.key.separator`) separated by
`headers.separator` (`,`); with `parse.key=true` the key comes next, up to `key.separator` (tab);
the rest is the value. `null.marker=X` makes a key, value or header value equal to X null. A line
without the separator it needs is an error (`No key separator found on line number 3: '...'`)
unless `ignore.error=true`, which then reads it as having no key (or no headers).
`--partition N` (not in Kafka's tool) sends every record to partition N.

The producer is confluent-kafka's with Kafka's console defaults (acks=all, linger 1000 ms unless
`--timeout`); `--sync` waits for each record's acknowledgement before reading the next line. At the
end of input every record is flushed; a record the brokers refused is reported on standard error
(`Error when sending message to topic T with key: 3 bytes, value: 5 bytes with error: ...`) and the
tool exits 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from odradek.cli.client_tools import (
    add_bootstrap_arguments,
    bootstrap_of,
    client_config,
    describe_kafka_error,
    parse_property_list,
    run_tool,
)
from odradek.errors import OperatorError

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class LineRecord:
    key: bytes | None
    value: bytes | None
    headers: list[Header]


def _flag(properties: dict[str, str], name: str) -> bool:
    return properties.get(name, "false").strip().lower() == "true"


class LineReader:
    """Kafka's LineMessageReader: one record per line (see the module docstring)."""

    def __init__(self, properties: dict[str, str]) -> None:
        self.parse_key = _flag(properties, "parse.key")
        self.key_separator = properties.get("key.separator", "\t")
        self.parse_headers = _flag(properties, "parse.headers")
        self.headers_delimiter = properties.get("headers.delimiter", "\t")
        self.headers_separator = properties.get("headers.separator", ",")
        self.headers_key_separator = properties.get("headers.key.separator", ":")
        self.ignore_error = _flag(properties, "ignore.error")
        self.null_marker = properties.get("null.marker")
        self.line_number = 0
        for a, b in (
            ("headers.delimiter", "headers.separator"),
            ("headers.delimiter", "headers.key.separator"),
            ("headers.separator", "headers.key.separator"),
        ):
            if self._property(a) == self._property(b):
                raise OperatorError(f"{a} and {b} may not be equal")
        if self.null_marker is not None:
            for name in (
                "key.separator",
                "headers.separator",
                "headers.delimiter",
                "headers.key.separator",
            ):
                if self.null_marker == self._property(name):
                    raise OperatorError(f"null.marker and {name} may not be equal")
        for name in ("key.separator", "headers.delimiter", "headers.separator"):
            if not self._property(name):
                raise OperatorError(f"{name} may not be empty")

    def _property(self, name: str) -> str:
        return {
            "key.separator": self.key_separator,
            "headers.delimiter": self.headers_delimiter,
            "headers.separator": self.headers_separator,
            "headers.key.separator": self.headers_key_separator,
        }[name]

    def _split(self, enabled: bool, line: str, start: int, separator: str, what: str) -> str | None:
        if not enabled:
            return None
        index = line.find(separator, start)
        if index < 0:
            if self.ignore_error:
                return None
            raise OperatorError(f"No {what} found on line number {self.line_number}: '{line}'")
        return line[start:index]

    def _bytes(self, text: str | None) -> bytes | None:
        if text is None or text == self.null_marker:
            return None
        return text.encode("utf-8")

    def _headers(self, text: str) -> list[Header]:
        headers: list[Header] = []
        for pair in text.split(self.headers_separator):
            index = pair.find(self.headers_key_separator)
            if index < 0:
                if not self.ignore_error:
                    raise OperatorError(
                        f"No header key separator found in pair '{pair}' on line number "
                        f"{self.line_number}"
                    )
                headers.append((pair, None))
                continue
            key = pair[:index]
            if key == self.null_marker:
                raise OperatorError(
                    f"Header keys should not be equal to the null marker '{self.null_marker}' "
                    "as they can't be null"
                )
            headers.append((key, self._bytes(pair[index + len(self.headers_key_separator) :])))
        return headers

    def parse(self, line: str) -> LineRecord:
        self.line_number += 1
        headers_text = self._split(
            self.parse_headers, line, 0, self.headers_delimiter, "headers delimiter"
        )
        header_end = 0 if headers_text is None else len(headers_text) + len(self.headers_delimiter)
        key = self._split(self.parse_key, line, header_end, self.key_separator, "key separator")
        key_end = 0 if key is None else len(key) + len(self.key_separator)
        value = line[header_end + key_end :]
        headers = (
            self._headers(headers_text)
            if headers_text is not None and headers_text != self.null_marker
            else []
        )
        return LineRecord(self._bytes(key), self._bytes(value), headers)

    def records(self, stream: BinaryIO) -> Iterator[LineRecord]:
        for raw in stream:
            line = raw.decode("utf-8", errors="replace")
            if line.endswith("\n"):
                line = line[:-1]
                if line.endswith("\r"):
                    line = line[:-1]
            yield self.parse(line)


_ACKS = {"all": "all", "-1": "all", "1": "1", "0": "0"}


def producer_settings(args: argparse.Namespace) -> dict[str, str]:
    acks = _ACKS.get(str(args.request_required_acks).lower())
    if acks is None:
        raise OperatorError("--request-required-acks must be all, -1, 0 or 1")
    defaults = {
        "acks": acks,
        "linger.ms": str(args.timeout),
        "compression.type": args.compression_codec or "none",
        "request.timeout.ms": str(args.request_timeout_ms),
        "message.send.max.retries": str(args.message_send_max_retries),
        "retry.backoff.ms": str(args.retry_backoff_ms),
        "client.id": "console-producer",
        # Kafka's delivery.timeout.ms (librdkafka's own default is 300 s).
        "message.timeout.ms": "120000",
        # Keyed records go where a Java producer would put them (Kafka's murmur2 partitioner).
        "partitioner": "murmur2_random",
    }
    if args.batch_size is not None:
        defaults["batch.num.messages"] = str(args.batch_size)
    return client_config(
        bootstrap_of(args),
        config_file=args.producer_config,
        config_flag="--producer.config",
        properties=args.producer_property,
        properties_flag="--producer-property",
        defaults=defaults,
    )


def produce_lines(args: argparse.Namespace, stream: BinaryIO) -> int:
    from confluent_kafka import Producer

    reader_properties = parse_property_list(
        [*(args.property or []), *(args.reader_property or [])], "--property"
    )
    reader = LineReader(reader_properties)
    producer = Producer(producer_settings(args))
    failures: list[str] = []

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            key, value = message.key(), message.value()
            failures.append(
                f"Error when sending message to topic {args.topic} with key: "
                f"{'null' if key is None else f'{len(key)} bytes'}, value: "
                f"{'null' if value is None else f'{len(value)} bytes'} with error: "
                f"{describe_kafka_error(error)}"
            )

    partition = -1 if args.partition is None else args.partition
    try:
        for record in reader.records(stream):
            while True:
                try:
                    producer.produce(
                        args.topic,
                        value=record.value,
                        key=record.key,
                        headers=cast(Any, record.headers or None),
                        partition=partition,
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            producer.poll(0)
            if args.sync:
                producer.flush()
    finally:
        remaining = producer.flush(args.flush_timeout)
    for failure in failures:
        print(failure, file=sys.stderr)
    if remaining:
        print(
            f"odradek: error: {remaining} records were not delivered within "
            f"{args.flush_timeout:g}s",
            file=sys.stderr,
        )
        return 1
    return 1 if failures else 0


def cmd_console_producer(args: argparse.Namespace) -> int:
    return run_tool(lambda: produce_lines(args, sys.stdin.buffer))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "console-producer",
        help="produce the lines of standard input",
        description="Read records from standard input, one per line, and produce them "
        "(like kafka-console-producer.sh).",
    )
    add_bootstrap_arguments(parser)
    parser.add_argument("--topic", required=True, help="the topic to produce to")
    parser.add_argument(
        "--partition", type=int, help="send every record to this partition (not in Kafka's tool)"
    )
    parser.add_argument(
        "--property",
        action="append",
        metavar="K=V",
        help="line reader properties: parse.key, key.separator, parse.headers, "
        "headers.delimiter, headers.separator, headers.key.separator, null.marker, ignore.error",
    )
    parser.add_argument("--reader-property", action="append", metavar="K=V", help=argparse.SUPPRESS)
    parser.add_argument(
        "--producer-property", action="append", metavar="K=V", help="a producer property"
    )
    parser.add_argument(
        "--producer.config", dest="producer_config", metavar="FILE", help="producer properties"
    )
    parser.add_argument(
        "--sync", action="store_true", help="wait for each record's acknowledgement"
    )
    parser.add_argument(
        "--compression-codec",
        nargs="?",
        const="gzip",
        choices=["none", "gzip", "snappy", "lz4", "zstd"],
        help="compression (gzip when given without a value)",
    )
    parser.add_argument(
        "--request-required-acks", default="-1", help="acks: all/-1 (default), 1 or 0"
    )
    parser.add_argument(
        "--timeout", type=int, default=1000, metavar="MS", help="linger.ms (default 1000)"
    )
    parser.add_argument(
        "--request-timeout-ms", type=int, default=1500, help="request.timeout.ms (default 1500)"
    )
    parser.add_argument("--message-send-max-retries", type=int, default=3)
    parser.add_argument("--retry-backoff-ms", type=int, default=100)
    parser.add_argument("--batch-size", type=int, help="records per batch")
    parser.add_argument(
        "--flush-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds to wait for the last records at the end of input (default 60)",
    )
    parser.set_defaults(func=cmd_console_producer)
    return parser
