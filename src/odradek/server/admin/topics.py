"""Topic names and topic-level configuration: Kafka's rules, and the log config they produce.

Topic names: 1..249 characters of ASCII letters, digits, '.', '_' and '-', neither "." nor "..";
two topics whose names differ only by '.' versus '_' collide (metric names would clash in Kafka) and the
second is refused.

Topic configs (`/config/topics/<topic>`) override the broker's defaults. Only the configs this broker
implements are accepted; anything else is INVALID_CONFIG with the reason, so that nobody believes a
setting took effect when it did not. `cleanup.policy` is a LIST config as in Kafka (`delete`,
`compact`, `compact,delete`, or empty), so IncrementalAlterConfigs' APPEND and SUBTRACT apply to
it; its value is a tuple of the items in the order given, duplicates dropped. The compaction
configs (`min.cleanable.dirty.ratio`, a double in [0, 1]; `min.compaction.lag.ms`,
`max.compaction.lag.ms`, `delete.retention.ms`) default to the broker's `log.cleaner.*` settings;
a topic may not set min.compaction.lag.ms above its max.compaction.lag.ms (INVALID_CONFIG, Kafka's
message), and where a topic's lag conflicts with a broker default the maximum wins.
`compression.type` defaults to the broker's `compression.type`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from odradek.cluster.replication_quota import (
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_REPLICAS,
    InvalidThrottledReplicasError,
    validate_throttled_replicas,
)
from odradek.errors import InvalidConfigurationError, InvalidTopicError
from odradek.log.config import COMPRESSION_TYPES, LogConfig

if TYPE_CHECKING:
    from odradek.server.config import KafkaConfig

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: str) -> None:
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(f"topic name is longer than {MAX_TOPIC_NAME_LENGTH} characters")
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} is illegal: it may only contain ASCII letters, digits, '.', '_' and '-'"
        )


def collides(name: str, existing: str) -> bool:
    return name != existing and name.replace(".", "_") == existing.replace(".", "_")


@dataclass(frozen=True, slots=True)
class TopicConfigDef:
    name: str
    kind: str  # int | long | bool | enum | list (comma-separated items, each one of `allowed`)
    #            | replicas (a throttled replica list)
    broker_default: Callable[[KafkaConfig], Any]
    allowed: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None


TOPIC_CONFIGS: dict[str, TopicConfigDef] = {
    d.name: d
    for d in [
        TopicConfigDef("segment.bytes", "int", lambda c: c["log.segment.bytes"], minimum=14),
        TopicConfigDef("segment.ms", "long", lambda c: c.log_roll_ms, minimum=1),
        TopicConfigDef("retention.ms", "long", lambda c: c.log_retention_ms, minimum=-1),
        TopicConfigDef("retention.bytes", "long", lambda c: c["log.retention.bytes"], minimum=-1),
        TopicConfigDef(
            "segment.index.bytes", "int", lambda c: c["log.index.size.max.bytes"], minimum=4
        ),
        TopicConfigDef(
            "index.interval.bytes", "int", lambda c: c["log.index.interval.bytes"], minimum=0
        ),
        TopicConfigDef("max.message.bytes", "int", lambda c: c["message.max.bytes"], minimum=0),
        TopicConfigDef(
            "message.timestamp.type",
            "enum",
            lambda c: c["log.message.timestamp.type"],
            allowed=("CreateTime", "LogAppendTime"),
        ),
        TopicConfigDef(
            "file.delete.delay.ms", "long", lambda c: c["log.segment.delete.delay.ms"], minimum=0
        ),
        TopicConfigDef("min.insync.replicas", "int", lambda c: c["min.insync.replicas"], minimum=1),
        TopicConfigDef(
            "message.timestamp.before.max.ms",
            "long",
            lambda c: c["log.message.timestamp.before.max.ms"],
            minimum=0,
        ),
        TopicConfigDef(
            "message.timestamp.after.max.ms",
            "long",
            lambda c: c["log.message.timestamp.after.max.ms"],
            minimum=0,
        ),
        TopicConfigDef(
            "message.timestamp.difference.max.ms",
            "long",
            lambda c: c["log.message.timestamp.difference.max.ms"],
            minimum=0,
        ),
        TopicConfigDef(
            "unclean.leader.election.enable", "bool", lambda c: c["unclean.leader.election.enable"]
        ),
        TopicConfigDef(
            "cleanup.policy",
            "list",
            lambda c: parse_topic_config_value("cleanup.policy", c["log.cleanup.policy"]),
            allowed=("compact", "delete"),
        ),
        TopicConfigDef(
            "min.cleanable.dirty.ratio",
            "double",
            lambda c: c["log.cleaner.min.cleanable.ratio"],
            minimum=0,
            maximum=1,
        ),
        TopicConfigDef(
            "min.compaction.lag.ms",
            "long",
            lambda c: c["log.cleaner.min.compaction.lag.ms"],
            minimum=0,
        ),
        TopicConfigDef(
            "max.compaction.lag.ms",
            "long",
            lambda c: c["log.cleaner.max.compaction.lag.ms"],
            minimum=1,
        ),
        TopicConfigDef(
            "delete.retention.ms", "long", lambda c: c["log.cleaner.delete.retention.ms"], minimum=0
        ),
        TopicConfigDef(
            "compression.type",
            "enum",
            lambda c: c["compression.type"],
            allowed=COMPRESSION_TYPES,
        ),
        # Replication throttles (KIP-73, odradek.cluster.replication_quota): `*` or p:b,...
        TopicConfigDef(LEADER_THROTTLED_REPLICAS, "replicas", lambda c: ""),
        TopicConfigDef(FOLLOWER_THROTTLED_REPLICAS, "replicas", lambda c: ""),
    ]
}

_COMPACTION_LAGS = ("min.compaction.lag.ms", "max.compaction.lag.ms")


def parse_topic_config_value(name: str, raw: str | None) -> Any:
    definition = TOPIC_CONFIGS.get(name)
    if definition is None:
        raise InvalidConfigurationError(f"unknown or unsupported topic config {name!r}")
    if raw is None:
        raise InvalidConfigurationError(f"topic config {name} needs a value")
    text = str(raw).strip()
    if definition.kind in ("int", "long"):
        try:
            value: Any = int(text)
        except ValueError:
            raise InvalidConfigurationError(
                f"invalid value {raw!r} for {name}: not an integer"
            ) from None
        if definition.minimum is not None and value < definition.minimum:
            raise InvalidConfigurationError(
                f"invalid value {raw!r} for {name}: must be at least {definition.minimum}"
            )
        maximum = 2**31 - 1 if definition.kind == "int" else 2**63 - 1
        if value > maximum:
            raise InvalidConfigurationError(
                f"invalid value {raw!r} for {name}: must be at most {maximum}"
            )
        return value
    if definition.kind == "double":
        try:
            number = float(text)
        except ValueError:
            raise InvalidConfigurationError(
                f"invalid value {raw!r} for {name}: not a number"
            ) from None
        low = definition.minimum if definition.minimum is not None else float("-inf")
        high = definition.maximum if definition.maximum is not None else float("inf")
        if not low <= number <= high:
            raise InvalidConfigurationError(
                f"invalid value {raw!r} for {name}: must be between {low} and {high}"
            )
        return number
    if definition.kind == "replicas":
        try:
            validate_throttled_replicas(name, text)
        except InvalidThrottledReplicasError as e:
            raise InvalidConfigurationError(f"invalid value {raw!r} for {name}: {e}") from None
        return text
    if definition.kind == "bool":
        if text.lower() not in ("true", "false"):
            raise InvalidConfigurationError(
                f"invalid value {raw!r} for {name}: expected true or false"
            )
        return text.lower() == "true"
    if definition.kind == "list":
        items = tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
        unknown = [item for item in items if item not in definition.allowed]
        if unknown:
            raise InvalidConfigurationError(
                f"invalid value {raw!r} for {name}: {', '.join(unknown)} is not one of "
                f"{', '.join(definition.allowed)}"
            )
        return items
    if text not in definition.allowed:
        raise InvalidConfigurationError(
            f"invalid value {raw!r} for {name}: supported values are {', '.join(definition.allowed)}"
        )
    return text


def config_value_text(value: Any) -> str:
    """A parsed config value as Kafka writes it: lower-case booleans, comma-joined lists."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Check every entry; returns the normalised string map to store in ZooKeeper."""
    normalised = {}
    for name, raw in configs.items():
        parse_topic_config_value(name, raw)
        normalised[name] = str(raw).strip()
    if all(name in normalised for name in _COMPACTION_LAGS):
        low, high = (int(normalised[name]) for name in _COMPACTION_LAGS)
        if low > high:
            # Kafka's LogConfig.validateValues, with its message.
            raise InvalidConfigurationError(
                "conflict topic config setting min.compaction.lag.ms > max.compaction.lag.ms"
            )
    return normalised


def effective_topic_config(
    broker_config: KafkaConfig, overrides: Mapping[str, str]
) -> dict[str, Any]:
    """Every topic config's effective value: the topic's override, else the broker default."""
    values = {name: d.broker_default(broker_config) for name, d in TOPIC_CONFIGS.items()}
    for name, raw in overrides.items():
        if name in TOPIC_CONFIGS:
            try:
                values[name] = parse_topic_config_value(name, raw)
            except InvalidConfigurationError:
                pass  # written by another tool; keep the default rather than fail the partition
    if values["min.compaction.lag.ms"] > values["max.compaction.lag.ms"]:
        # A topic's lag against a broker default it conflicts with: the maximum wins, so that
        # the partition still opens and dirty data is cleaned in time.
        values["min.compaction.lag.ms"] = values["max.compaction.lag.ms"]
    return values


def log_config_for(broker_config: KafkaConfig, overrides: Mapping[str, str]) -> LogConfig:
    values = effective_topic_config(broker_config, overrides)
    return LogConfig(
        segment_bytes=values["segment.bytes"],
        segment_ms=values["segment.ms"],
        retention_ms=values["retention.ms"],
        retention_bytes=values["retention.bytes"],
        index_interval_bytes=values["index.interval.bytes"],
        segment_index_bytes=values["segment.index.bytes"],
        max_message_bytes=values["max.message.bytes"],
        message_timestamp_type=values["message.timestamp.type"],
        file_delete_delay_ms=values["file.delete.delay.ms"],
        min_insync_replicas=values["min.insync.replicas"],
        unclean_leader_election_enable=values["unclean.leader.election.enable"],
        message_timestamp_before_max_ms=values["message.timestamp.before.max.ms"],
        message_timestamp_after_max_ms=values["message.timestamp.after.max.ms"],
        message_timestamp_difference_max_ms=values["message.timestamp.difference.max.ms"],
        decompressed_limit=broker_config["socket.request.max.bytes"],
        cleanup_policy=values["cleanup.policy"],
        producer_id_expiration_ms=broker_config["producer.id.expiration.ms"],
        min_cleanable_dirty_ratio=values["min.cleanable.dirty.ratio"],
        min_compaction_lag_ms=values["min.compaction.lag.ms"],
        max_compaction_lag_ms=values["max.compaction.lag.ms"],
        delete_retention_ms=values["delete.retention.ms"],
        compression_type=values["compression.type"],
    )
