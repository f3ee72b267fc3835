"""What the client-side tools (console producer and consumer, perf tests, verifiable clients,
get-offsets) share: their confluent-kafka configuration from Kafka's flags and properties files,
and one way to turn a failure into Kafka's exit status.

Kafka's tools take Java client properties (`--producer.config F`, `--producer-property k=v`,
`--command-config F`, ...). librdkafka uses the same names for most of them (`acks`, `linger.ms`,
`batch.size`, `compression.type`, `security.protocol`, `client.id`, `group.id`,
`auto.offset.reset`, `isolation.level`, ...); `java_to_librdkafka` translates the few that differ:

| Java property | librdkafka |
|---|---|
| `key.serializer`, `value.serializer`, `*.deserializer`, `partitioner.class`, `interceptor.classes` | dropped: the tools write and read bytes |
| `sasl.jaas.config` (Plain or Scram login module) | `sasl.username`, `sasl.password` |
| `ssl.truststore.location` of type PEM | `ssl.ca.location` |
| `ssl.endpoint.identification.algorithm=` (empty) | `ssl.endpoint.identification.algorithm=none` |

Anything librdkafka does not know is reported by librdkafka itself, as one line, exit status 1.
librdkafka's own log is off (`log_level=0`) unless a property turns it on.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from odradek.errors import OdradekError, OperatorError
from odradek.server.config import parse_properties

# librdkafka logs every refused connection and retry on standard error; the tools report failures
# themselves, as one line, so its log stays quiet unless `log_level` is set (e.g. with
# `--consumer-property log_level=6`).
QUIET = {"log_level": "0"}

_DROPPED = (
    "key.serializer",
    "value.serializer",
    "key.deserializer",
    "value.deserializer",
    "partitioner.class",
    "interceptor.classes",
    "ssl.truststore.type",
    "sasl.login.class",
    "sasl.client.callback.handler.class",
)


def read_properties_file(path: str | None, flag: str) -> dict[str, str]:
    if not path:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise OperatorError(f"cannot read {flag} {path}: {e.strerror or e}") from None
    try:
        return {k: v.strip() for k, v in parse_properties(text).items()}
    except OdradekError as e:
        raise OperatorError(f"{flag} {path}: {e}") from None


def parse_property_list(items: Iterable[str] | None, flag: str) -> dict[str, str]:
    """`k=v` items (one per repeated flag), as Kafka's tools take them: the value is kept as
    given, spaces included (`--property "key.separator= | "` separates with " | ")."""
    properties: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OperatorError(f"{flag} expects key=value, not {item!r}")
        properties[key.strip()] = value
    return properties


def java_to_librdkafka(properties: dict[str, str]) -> dict[str, str]:
    """Translate Kafka's Java client properties to librdkafka's (see the module docstring)."""
    config: dict[str, str] = {}
    truststore_type = properties.get("ssl.truststore.type", "JKS").upper()
    for key, value in properties.items():
        if key in _DROPPED:
            continue
        if key == "sasl.jaas.config":
            config.update(_jaas_credentials(value))
        elif key == "ssl.truststore.location":
            if truststore_type != "PEM":
                raise OperatorError(
                    "ssl.truststore.location must be a PEM file (ssl.truststore.type=PEM) "
                    "for these tools"
                )
            config["ssl.ca.location"] = value
        elif key == "ssl.endpoint.identification.algorithm" and not value:
            config[key] = "none"
        else:
            config[key] = value
    return config


def _jaas_credentials(value: str) -> dict[str, str]:
    from odradek.security.jaas import parse_jaas_config

    try:
        entries = parse_jaas_config(value)
    except OdradekError as e:
        raise OperatorError(f"sasl.jaas.config: {e}") from None
    if not entries:
        raise OperatorError("sasl.jaas.config has no login module")
    options = entries[0].options
    if "username" not in options or "password" not in options:
        raise OperatorError("sasl.jaas.config needs username and password options")
    return {"sasl.username": options["username"], "sasl.password": options["password"]}


def client_config(
    bootstrap_server: str | None,
    *,
    config_file: str | None = None,
    config_flag: str = "--command-config",
    properties: Iterable[str] | None = None,
    properties_flag: str = "--property",
    defaults: dict[str, str] | None = None,
) -> dict[str, str]:
    """librdkafka configuration: `defaults`, then the file, then the `k=v` items, then the
    bootstrap servers (the flag wins, as in Kafka's tools)."""
    merged = {**QUIET, **(defaults or {})}
    merged.update(read_properties_file(config_file, config_flag))
    merged.update(parse_property_list(properties, properties_flag))
    if bootstrap_server:
        merged["bootstrap.servers"] = bootstrap_server
    if not merged.get("bootstrap.servers"):
        raise OperatorError("--bootstrap-server is required")
    return java_to_librdkafka(merged)


def add_bootstrap_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,HOST:PORT]",
        help="the brokers to connect to" + (" (required)" if required else ""),
    )
    parser.add_argument(
        "--broker-list", metavar="HOST:PORT", help="deprecated: use --bootstrap-server"
    )


def bootstrap_of(args: argparse.Namespace) -> str:
    bootstrap: str | None = args.bootstrap_server or args.broker_list
    if not bootstrap:
        raise OperatorError("--bootstrap-server is required")
    return bootstrap


def run_tool(body: Callable[[], int]) -> int:
    """Run a tool's body: an operator mistake or a client failure is one line on standard error
    and exit status 1; Ctrl-C ends quietly with 130; a closed pipe (`| head`) ends with 0."""
    from confluent_kafka import KafkaException

    previous = signal.getsignal(signal.SIGTERM)
    # SIGTERM ends the tool the way Ctrl-C does, so its clients close and it prints its summary.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return body()
    except OperatorError as e:
        print(f"odradek: error: {e}", file=sys.stderr)
        return 1
    except KafkaException as e:
        print(f"odradek: error: {describe_kafka_error(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def describe_kafka_error(error: Any) -> str:
    """One line for a confluent-kafka KafkaError or KafkaException: Kafka's error name and the
    message."""
    inner = error.args[0] if getattr(error, "args", None) else error
    name = getattr(inner, "name", None)
    text = getattr(inner, "str", None)
    if callable(name) and callable(text):
        return f"{name()}: {text()}"
    return str(error)
