r"""Broker configuration: Kafka's property names, types, defaults and validation.

`server.properties` is read in Java properties syntax by `javaproperties` (`java.util.Properties`
rules: `=`, `:` or whitespace between key and value, `#`/`!` comments, backslash line continuations,
`\uXXXX` and `\=`/`\:` escapes, the last of duplicate keys wins; the file is read as UTF-8, which
for ASCII files, the usual case, is what Java's ISO-8859-1 reading gives too); `--override k=v` on
the command line wins over the file. Every property is
declared once in `DEFINITIONS` with its type and default; an invalid value is a `ConfigError` naming the
property, which the command line prints as one line. Unknown properties are kept and logged, as Kafka
does, so a Kafka `server.properties` can be used unchanged.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import javaproperties

from odradek.errors import ConfigError
from odradek.server.listener_config import Endpoint, listener_config

__all__ = [
    "DEFINITIONS",
    "Endpoint",
    "KafkaConfig",
    "convert_value",
    "derive_values",
    "load_config",
    "parse_properties",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: str  # int | long | bool | string | list | double
    default: Any
    validator: Callable[[Any], str | None] | None = None


def _at_least(minimum: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value >= minimum else f"must be at least {minimum}"

    return check


def _between(low: int, high: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be between {low} and {high}"

    return check


def _ratio_between(low: float, high: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be between {low:g} and {high:g}"

    return check


def _one_of(*allowed: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in allowed else f"must be one of {', '.join(allowed)}"

    return check


def _http_listener(value: Any) -> str | None:
    if value is None:
        return None
    parts = urlsplit(str(value).strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or port is None or parts.path not in ("", "/"):
        return "must be http://HOST:PORT"
    return None


_DEFS = [
    ConfigDef("broker.id", "int", -1, _at_least(-1)),
    ConfigDef("broker.rack", "string", None),
    ConfigDef("listeners", "string", "PLAINTEXT://:9092"),
    ConfigDef("advertised.listeners", "string", None),
    # Prometheus text format at /metrics (odradek.server.metrics); unset: no metrics endpoint.
    ConfigDef("metrics.listener", "string", None, _http_listener),
    ConfigDef("listener.security.protocol.map", "string", None),
    ConfigDef("inter.broker.listener.name", "string", None),
    ConfigDef("security.inter.broker.protocol", "string", "PLAINTEXT"),
    ConfigDef("control.plane.listener.name", "string", None),
    # Security (issue 14): the ssl.*, sasl.* and listener.name.* properties are read by
    # odradek.security from the originals; these are the broker-wide ones.
    ConfigDef("sasl.enabled.mechanisms", "string", "GSSAPI"),
    ConfigDef("sasl.mechanism.inter.broker.protocol", "string", "GSSAPI"),
    ConfigDef("sasl.server.max.receive.size", "int", 524288, _at_least(1)),
    ConfigDef("connections.max.reauth.ms", "long", 0, _at_least(0)),
    ConfigDef("authorizer.class.name", "string", ""),
    ConfigDef("super.users", "string", None),
    ConfigDef("allow.everyone.if.no.acl.found", "bool", False),
    ConfigDef("zookeeper.set.acl", "bool", False),
    # Odradek's own: a restarted broker closes its killed previous process's ZooKeeper session
    # instead of waiting for it to expire (server/session_reclaim). Off by default: see there.
    ConfigDef("zookeeper.session.reclaim.enable", "bool", False),
    # Kafka takes these two as JVM system properties (KAFKA_OPTS="-Djava.security.auth.login.
    # config=..."); Odradek reads them from there too, or from server.properties.
    ConfigDef("java.security.auth.login.config", "string", None),
    ConfigDef("zookeeper.sasl.clientconfig", "string", "Client"),
    # Resource limits of the socket server.
    ConfigDef("max.connections", "int", 2147483647, _at_least(0)),
    ConfigDef("max.connections.per.ip", "int", 2147483647, _at_least(0)),
    ConfigDef("max.connections.per.ip.overrides", "string", ""),
    ConfigDef("connections.max.idle.ms", "long", 600000),
    ConfigDef("queued.max.request.bytes", "long", -1),
    ConfigDef("log.dirs", "string", None),
    ConfigDef("log.dir", "string", "/tmp/kafka-logs"),
    ConfigDef("zookeeper.connect", "string", None),
    ConfigDef("zookeeper.session.timeout.ms", "int", 18000, _at_least(1000)),
    ConfigDef("zookeeper.connection.timeout.ms", "int", None),
    ConfigDef("num.partitions", "int", 1, _at_least(1)),
    ConfigDef("default.replication.factor", "int", 1, _at_least(1)),
    ConfigDef("auto.create.topics.enable", "bool", True),
    ConfigDef("delete.topic.enable", "bool", True),
    ConfigDef("log.segment.bytes", "int", 1 << 30, _at_least(14)),
    ConfigDef("log.roll.ms", "long", None),
    ConfigDef("log.roll.hours", "int", 168, _at_least(1)),
    ConfigDef("log.retention.ms", "long", None),
    ConfigDef("log.retention.minutes", "int", None),
    ConfigDef("log.retention.hours", "int", 168),
    ConfigDef("log.retention.bytes", "long", -1),
    ConfigDef("log.retention.check.interval.ms", "long", 300000, _at_least(1)),
    ConfigDef("producer.id.expiration.ms", "int", 86400000, _at_least(1)),
    ConfigDef("producer.id.expiration.check.interval.ms", "int", 600000, _at_least(1)),
    ConfigDef("log.index.interval.bytes", "int", 4096, _at_least(0)),
    ConfigDef("log.index.size.max.bytes", "int", 10 * 1024 * 1024, _at_least(4)),
    ConfigDef(
        "log.message.timestamp.type", "string", "CreateTime", _one_of("CreateTime", "LogAppendTime")
    ),
    ConfigDef("log.segment.delete.delay.ms", "long", 60000, _at_least(0)),
    ConfigDef("log.message.timestamp.before.max.ms", "long", 2**63 - 1, _at_least(0)),
    ConfigDef("log.message.timestamp.after.max.ms", "long", 2**63 - 1, _at_least(0)),
    ConfigDef("log.message.timestamp.difference.max.ms", "long", 2**63 - 1, _at_least(0)),
    ConfigDef("log.flush.offset.checkpoint.interval.ms", "int", 60000, _at_least(0)),
    ConfigDef("log.flush.start.offset.checkpoint.interval.ms", "int", 60000, _at_least(0)),
    ConfigDef("log.cleanup.policy", "string", "delete"),
    # The log cleaner (odradek.log.log_cleaner) and the compaction defaults of every topic.
    ConfigDef("log.cleaner.enable", "bool", True),
    ConfigDef("log.cleaner.threads", "int", 1, _at_least(0)),
    ConfigDef("log.cleaner.dedupe.buffer.size", "long", 128 * 1024 * 1024, _at_least(1024)),
    ConfigDef("log.cleaner.io.buffer.size", "int", 512 * 1024, _at_least(0)),
    ConfigDef("log.cleaner.io.buffer.load.factor", "double", 0.9, _ratio_between(0.0, 1.0)),
    ConfigDef("log.cleaner.io.max.bytes.per.second", "double", 1.7976931348623157e308),
    ConfigDef("log.cleaner.backoff.ms", "long", 15000, _at_least(0)),
    # Odradek's own: the CPU priority (nice increment, 0-19) of the cleaner processes.
    ConfigDef("log.cleaner.nice", "int", 10, _between(0, 19)),
    ConfigDef("log.cleaner.min.cleanable.ratio", "double", 0.5, _ratio_between(0.0, 1.0)),
    ConfigDef("log.cleaner.delete.retention.ms", "long", 86400000, _at_least(0)),
    ConfigDef("log.cleaner.min.compaction.lag.ms", "long", 0, _at_least(0)),
    ConfigDef("log.cleaner.max.compaction.lag.ms", "long", 2**63 - 1, _at_least(1)),
    ConfigDef(
        "compression.type",
        "string",
        "producer",
        _one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
    ),
    ConfigDef("message.max.bytes", "int", 1048588, _at_least(0)),
    ConfigDef("socket.request.max.bytes", "int", 104857600, _at_least(1)),
    ConfigDef("replica.lag.time.max.ms", "long", 30000, _at_least(1)),
    ConfigDef("replica.fetch.max.bytes", "int", 1048576, _at_least(0)),
    ConfigDef("replica.fetch.response.max.bytes", "int", 10485760, _at_least(0)),
    ConfigDef("fetch.max.bytes", "int", 55 * 1024 * 1024, _at_least(1024)),
    # Client quotas and replication throttles (odradek.server.quota): the windowed rate.
    ConfigDef("quota.window.num", "int", 11, _at_least(1)),
    ConfigDef("quota.window.size.seconds", "int", 1, _at_least(1)),
    ConfigDef("replication.quota.window.num", "int", 11, _at_least(1)),
    ConfigDef("replication.quota.window.size.seconds", "int", 1, _at_least(1)),
    ConfigDef("replica.fetch.wait.max.ms", "int", 500, _at_least(0)),
    ConfigDef("max.incremental.fetch.session.cache.slots", "int", 1000, _at_least(0)),
    ConfigDef("replica.fetch.min.bytes", "int", 1, _at_least(0)),
    ConfigDef("replica.fetch.backoff.ms", "int", 1000, _at_least(0)),
    ConfigDef("replica.socket.timeout.ms", "int", 30000),
    ConfigDef("replica.high.watermark.checkpoint.interval.ms", "long", 5000, _at_least(1)),
    ConfigDef("num.replica.fetchers", "int", 1, _at_least(1)),
    ConfigDef("min.insync.replicas", "int", 1, _at_least(1)),
    ConfigDef("unclean.leader.election.enable", "bool", False),
    ConfigDef("controlled.shutdown.enable", "bool", True),
    ConfigDef("controlled.shutdown.max.retries", "int", 3, _at_least(0)),
    ConfigDef("controlled.shutdown.retry.backoff.ms", "long", 5000, _at_least(0)),
    ConfigDef("controller.socket.timeout.ms", "int", 30000, _at_least(1)),
    ConfigDef("auto.leader.rebalance.enable", "bool", True),
    ConfigDef("leader.imbalance.per.broker.percentage", "int", 10, _at_least(0)),
    ConfigDef("leader.imbalance.check.interval.seconds", "long", 300, _at_least(1)),
    ConfigDef("request.timeout.ms", "int", 30000, _at_least(1)),
    ConfigDef("offsets.topic.replication.factor", "int", 3, _at_least(1)),
    ConfigDef("offsets.topic.num.partitions", "int", 50, _at_least(1)),
    ConfigDef("offsets.topic.segment.bytes", "int", 104857600, _at_least(1)),
    ConfigDef("offsets.topic.compression.codec", "int", 0, _between(0, 4)),
    ConfigDef("offsets.commit.required.acks", "int", -1, _between(-1, 32767)),
    ConfigDef("offsets.commit.timeout.ms", "int", 5000, _at_least(1)),
    ConfigDef("offsets.retention.minutes", "int", 10080, _at_least(1)),
    ConfigDef("offsets.retention.check.interval.ms", "long", 600000, _at_least(1)),
    ConfigDef("offsets.load.buffer.size", "int", 5242880, _at_least(1)),
    ConfigDef("offset.metadata.max.bytes", "int", 4096),
    # Transactions (Kafka's TransactionStateManagerConfigs and TransactionLogConfigs).
    ConfigDef("transactional.id.expiration.ms", "int", 604800000, _at_least(1)),
    ConfigDef("transaction.max.timeout.ms", "int", 900000, _at_least(1)),
    ConfigDef("transaction.state.log.num.partitions", "int", 50, _at_least(1)),
    ConfigDef("transaction.state.log.replication.factor", "int", 3, _at_least(1)),
    ConfigDef("transaction.state.log.min.isr", "int", 2, _at_least(1)),
    ConfigDef("transaction.state.log.segment.bytes", "int", 104857600, _at_least(1)),
    ConfigDef("transaction.state.log.load.buffer.size", "int", 5242880, _at_least(1)),
    ConfigDef(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", 10000, _at_least(1)
    ),
    ConfigDef(
        "transaction.remove.expired.transaction.cleanup.interval.ms", "int", 3600000, _at_least(1)
    ),
    ConfigDef("group.initial.rebalance.delay.ms", "int", 3000, _at_least(0)),
    ConfigDef("group.min.session.timeout.ms", "int", 6000, _at_least(0)),
    ConfigDef("group.max.session.timeout.ms", "int", 1800000, _at_least(0)),
    ConfigDef("group.max.size", "int", 2147483647, _at_least(1)),
    # Odradek's own: rotation of the broker's log file (`odradek server --log-file`), in place of
    # the log4j appender settings a Kafka broker reads from log4j.properties.
    ConfigDef("broker.log.max.bytes", "long", 100 * 1024 * 1024, _at_least(0)),
    ConfigDef("broker.log.backup.count", "int", 10, _at_least(0)),
]

DEFINITIONS: dict[str, ConfigDef] = {d.name: d for d in _DEFS}

# Families of properties read (and validated) by odradek.security and the listeners, not declared
# one by one: ssl.* and sasl.* settings, their listener-prefixed overrides, JAAS configs.
KNOWN_PREFIXES = ("ssl.", "sasl.", "listener.name.")

# Kafka's names of the ZooKeeper-mode ACL authorizer (the old and the 2.4+ class).
AUTHORIZER_CLASS_NAMES = frozenset(
    {"kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer"}
)


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java properties text as `java.util.Properties.load` does; values keep their
    trailing whitespace (each property's conversion trims it, as Kafka's ConfigDef does)."""
    try:
        return dict(javaproperties.loads(text))
    except ValueError as e:  # javaproperties.InvalidUEscapeError: a malformed \uXXXX
        raise ConfigError(f"invalid properties: {e}") from None


def convert_value(name: str, raw: str) -> Any:
    """`raw` converted and checked as the declared property `name` (ConfigError if invalid)."""
    return _convert(DEFINITIONS[name], raw)


def _convert(definition: ConfigDef, raw: str) -> Any:
    name = definition.name
    text = raw.strip()
    if definition.type in ("int", "long"):
        try:
            value: Any = int(text)
        except ValueError:
            raise ConfigError(f"invalid value {raw!r} for {name}: not an integer") from None
        if definition.type == "int" and not -(2**31) <= value < 2**31:
            raise ConfigError(f"invalid value {raw!r} for {name}: out of the int range")
    elif definition.type == "bool":
        lowered = text.lower()
        if lowered not in ("true", "false"):
            raise ConfigError(f"invalid value {raw!r} for {name}: expected true or false")
        value = lowered == "true"
    elif definition.type == "double":
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"invalid value {raw!r} for {name}: not a number") from None
    else:
        value = text
    if definition.validator is not None:
        problem = definition.validator(value)
        if problem:
            raise ConfigError(f"invalid value {raw!r} for {name}: {problem}")
    return value


def derive_values(properties: Mapping[str, str]) -> dict[str, Any]:
    """Every declared property's value: converted from `properties`, else its default.
    ConfigError naming the property if one is invalid, or if message.max.bytes exceeds
    socket.request.max.bytes."""
    values: dict[str, Any] = {}
    for name, definition in DEFINITIONS.items():
        raw = properties.get(name)
        values[name] = definition.default if raw is None else _convert(definition, raw)
    if values["message.max.bytes"] > values["socket.request.max.bytes"]:
        raise ConfigError("message.max.bytes must not exceed socket.request.max.bytes")
    return values


class KafkaConfig:
    """A broker's validated configuration.

    Values are read with `config[name]` using Kafka's property names; derived values that Kafka computes
    from several properties (log retention, roll time, log dirs, endpoints) are properties here.
    `originals` are the static properties (server.properties and `--override`). The values of
    dynamic broker configs (KIP-226) change when `odradek.server.dynamic_config` calls
    `update_values`, on the broker's event loop; everything else is fixed after construction.
    """

    def __init__(self, properties: Mapping[str, str]) -> None:
        self.originals = dict(properties)
        self._values: dict[str, Any] = derive_values(properties)
        self.unknown = sorted(name for name in properties if not self.is_known(name))
        self._validate()

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def update_values(self, properties: Mapping[str, str]) -> dict[str, tuple[Any, Any]]:
        """Take every value from `properties` (the static ones with the dynamic broker configs
        over them); returns {name: (old value, new value)} of those that changed. ConfigError
        if a value is invalid, and then nothing changes."""
        values = derive_values(properties)
        changed = {
            name: (self._values[name], value)
            for name, value in values.items()
            if self._values[name] != value
        }
        self._values = values
        return changed

    def _validate(self) -> None:
        if self["broker.id"] < 0:
            raise ConfigError("broker.id must be set to a non-negative integer")
        if not self["zookeeper.connect"]:
            raise ConfigError(
                "zookeeper.connect is required (for example zookeeper.connect=127.0.0.1:2181)"
            )
        self.listener_config = listener_config(
            self["listeners"],
            self["advertised.listeners"],
            self["listener.security.protocol.map"],
            self["inter.broker.listener.name"],
            self.originals.get("security.inter.broker.protocol"),
            self["control.plane.listener.name"],
            socket.getfqdn(),
        )
        self.listeners = list(self.listener_config.listeners)
        self.advertised_listeners = list(self.listener_config.advertised)
        authorizer = (self["authorizer.class.name"] or "").strip()
        if authorizer and authorizer not in AUTHORIZER_CLASS_NAMES:
            raise ConfigError(
                f"authorizer.class.name {authorizer} is not supported: use "
                "kafka.security.authorizer.AclAuthorizer (Kafka's ZooKeeper-mode ACL authorizer)"
            )
        if not self.log_dirs:
            raise ConfigError("log.dirs is empty")

    @property
    def broker_id(self) -> int:
        return int(self["broker.id"])

    @property
    def log_dirs(self) -> list[Path]:
        text = self["log.dirs"] or self["log.dir"]
        return [Path(p.strip()) for p in text.split(",") if p.strip()]

    @property
    def log_roll_ms(self) -> int:
        if self["log.roll.ms"] is not None:
            return int(self["log.roll.ms"])
        return int(self["log.roll.hours"]) * 3600 * 1000

    @property
    def log_retention_ms(self) -> int:
        if self["log.retention.ms"] is not None:
            return int(self["log.retention.ms"])
        if self["log.retention.minutes"] is not None:
            return int(self["log.retention.minutes"]) * 60 * 1000
        return int(self["log.retention.hours"]) * 3600 * 1000

    @property
    def zookeeper_connection_timeout_ms(self) -> int:
        value = self["zookeeper.connection.timeout.ms"]
        return int(value) if value is not None else int(self["zookeeper.session.timeout.ms"])

    @property
    def authorizer_enabled(self) -> bool:
        return bool((self["authorizer.class.name"] or "").strip())

    def is_known(self, name: str) -> bool:
        return name in DEFINITIONS or name.startswith(KNOWN_PREFIXES)


def load_config(path: Path | None, overrides: list[str]) -> KafkaConfig:
    """Read `server.properties` and apply `k=v` overrides; ConfigError on any problem."""
    properties: dict[str, str] = {}
    if path is not None:
        try:
            properties.update(parse_properties(Path(path).read_text(encoding="utf-8")))
        except OSError as e:
            raise ConfigError(f"cannot read {path}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"cannot read {path}: not UTF-8 text ({e.reason})") from None
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"invalid override {override!r}: expected key=value")
        key, value = override.split("=", 1)
        properties[key.strip()] = value.strip()
    config = KafkaConfig(properties)
    for name in config.unknown:
        log.warning("the configuration %s is not a known config; ignored", name)
    return config
