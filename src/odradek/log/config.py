"""Per-topic log configuration, under Kafka's topic-level names.

`LogConfig` is immutable: a config change (AlterConfigs, a `/config/topics/<topic>` notification)
builds a new one and hands it to `Log.config` / `LogManager.update_config`. Topic-level properties
override the broker's defaults (`log.segment.bytes`, ...), which `from_broker_properties` maps.

| field                          | topic property                  | broker default property        |
|--------------------------------|---------------------------------|--------------------------------|
| segment_bytes                  | segment.bytes                   | log.segment.bytes              |
| segment_ms                     | segment.ms                      | log.roll.ms / log.roll.hours   |
| retention_ms                   | retention.ms                    | log.retention.ms/minutes/hours |
| retention_bytes                | retention.bytes                 | log.retention.bytes            |
| index_interval_bytes           | index.interval.bytes            | log.index.interval.bytes       |
| segment_index_bytes            | segment.index.bytes             | log.index.size.max.bytes       |
| max_message_bytes              | max.message.bytes               | message.max.bytes              |
| message_timestamp_type         | message.timestamp.type          | log.message.timestamp.type     |
| file_delete_delay_ms           | file.delete.delay.ms            | log.segment.delete.delay.ms    |
| min_insync_replicas            | min.insync.replicas             | min.insync.replicas            |
| unclean_leader_election_enable | unclean.leader.election.enable  | unclean.leader.election.enable |
| message_timestamp_before_max_ms | message.timestamp.before.max.ms | log.message.timestamp.before.max.ms |
| message_timestamp_after_max_ms | message.timestamp.after.max.ms  | log.message.timestamp.after.max.ms |
| message_timestamp_difference_max_ms | message.timestamp.difference.max.ms | log.message.timestamp.difference.max.ms |
| decompressed_limit             | (none)                          | socket.request.max.bytes       |
| cleanup_policy                 | cleanup.policy                  | log.cleanup.policy             |
| producer_id_expiration_ms      | (none)                          | producer.id.expiration.ms      |
| min_cleanable_dirty_ratio      | min.cleanable.dirty.ratio       | log.cleaner.min.cleanable.ratio |
| min_compaction_lag_ms          | min.compaction.lag.ms           | log.cleaner.min.compaction.lag.ms |
| max_compaction_lag_ms          | max.compaction.lag.ms           | log.cleaner.max.compaction.lag.ms |
| delete_retention_ms            | delete.retention.ms             | log.cleaner.delete.retention.ms |
| compression_type               | compression.type                | compression.type               |

The compaction settings (Kafka's meanings; `odradek.log.cleaner_manager` applies them): a
compacted log is cleaned once the dirty part of its cleanable range (the part not cleaned yet, up
to the active segment and the high watermark) is more than `min_cleanable_dirty_ratio` of that
range, or as soon as it has dirty data older than `max_compaction_lag_ms`; a segment whose newest
record is younger than `min_compaction_lag_ms` is not cleaned yet; a tombstone stays
`delete_retention_ms` after the cleaning that first saw it. `max_segment_ms` is segment.ms, or
max.compaction.lag.ms when that is smaller on a compacted log, so that the active segment (never
cleaned) rolls in time. min.compaction.lag.ms may not exceed max.compaction.lag.ms.

`compression_type` is the codec the leader stores batches in: `producer` keeps the producer's,
`uncompressed`, `gzip`, `snappy`, `lz4` and `zstd` recompress batches in another codec
(`odradek.log.recompress`).

The three timestamp settings bound the record timestamps a CreateTime topic accepts (KIP-937):
a record's timestamp must lie within [now - before, now + after]. As in Kafka 3.9, a before or
after bound left at its default (Long.MAX_VALUE, no bound) takes the value of the older
difference setting, so an operator's existing `message.timestamp.difference.max.ms` still applies.

`decompressed_limit` is not a Kafka setting: the most bytes a compressed batch may decompress to
before the broker refuses it (MESSAGE_TOO_LARGE). Kafka streams records out of a compressed batch
without a bound; Odradek decompresses a batch into one buffer to validate it, so it bounds that
buffer by the largest request it reads at all (`socket.request.max.bytes`, 100 MB by default): a
producer could not have sent more records than that uncompressed either, while a decompression
bomb (1 MB of zstd can hold 30 GB of zeros) is stopped there.

`cleanup_policy` is a tuple of "delete" and "compact" (Kafka's LIST config): retention by time
and size (`Log.delete_retention_segments`) applies only when it holds "delete"; "compact" is the
log cleaner's business. A log whose policy is compact only keeps every segment until the cleaner
rewrites it, as in Kafka; the log start offset (DeleteRecords) still removes segments below it.

min.insync.replicas and unclean.leader.election.enable are not used by the log itself; they live
here because Kafka keeps them in its LogConfig too, so the partition and the controller read every
topic-level setting from one object.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from odradek.errors import InvalidConfigurationError

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
_MIN_SEGMENT_BYTES = 14  # Kafka's minimum: the overhead of the smallest legacy record


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one topic's logs; Kafka's defaults."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 60 * 60 * 1000
    retention_ms: int = 7 * 24 * 60 * 60 * 1000
    retention_bytes: int = -1
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10 * 1024 * 1024
    max_message_bytes: int = 1024 * 1024 + 12
    message_timestamp_type: str = CREATE_TIME
    file_delete_delay_ms: int = 60_000
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    message_timestamp_before_max_ms: int = _INT64_MAX
    message_timestamp_after_max_ms: int = _INT64_MAX
    message_timestamp_difference_max_ms: int = _INT64_MAX
    decompressed_limit: int = 100 * 1024 * 1024
    cleanup_policy: tuple[str, ...] = ("delete",)
    producer_id_expiration_ms: int = 24 * 60 * 60 * 1000
    """How long a producer id's state outlives its last write (broker-wide in Kafka)."""
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = _INT64_MAX
    delete_retention_ms: int = 24 * 60 * 60 * 1000
    compression_type: str = "producer"

    def __post_init__(self) -> None:
        for spec in _TOPIC_PROPERTIES.values():
            spec.check(getattr(self, spec.field))
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise InvalidConfigurationError(
                f"min.compaction.lag.ms ({self.min_compaction_lag_ms}) may not exceed "
                f"max.compaction.lag.ms ({self.max_compaction_lag_ms})"
            )

    @property
    def delete(self) -> bool:
        """Does retention by time and size delete old segments (cleanup.policy has delete)?"""
        return "delete" in self.cleanup_policy

    @property
    def compact(self) -> bool:
        """Is the log compacted (cleanup.policy has compact)?"""
        return "compact" in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """How long the active segment may take appends (module docstring)."""
        if self.compact:
            return min(self.segment_ms, self.max_compaction_lag_ms)
        return self.segment_ms

    @property
    def uses_log_append_time(self) -> bool:
        return self.message_timestamp_type == LOG_APPEND_TIME

    @property
    def effective_timestamp_before_max_ms(self) -> int:
        """How far in the past a CreateTime record may be (module docstring)."""
        if self.message_timestamp_before_max_ms != _INT64_MAX:
            return self.message_timestamp_before_max_ms
        return self.message_timestamp_difference_max_ms

    @property
    def effective_timestamp_after_max_ms(self) -> int:
        """How far in the future a CreateTime record may be (module docstring)."""
        if self.message_timestamp_after_max_ms != _INT64_MAX:
            return self.message_timestamp_after_max_ms
        return self.message_timestamp_difference_max_ms

    @classmethod
    def from_properties(
        cls, properties: Mapping[str, str], defaults: LogConfig | None = None
    ) -> LogConfig:
        """`defaults` overridden by the topic-level properties given (Kafka names).

        Names that are not log settings are ignored here: which topic configs exist is the admin
        layer's business, not the log's.
        """
        base = defaults if defaults is not None else cls()
        changes = {
            spec.field: spec.parse(name, value)
            for name, value in properties.items()
            if (spec := _TOPIC_PROPERTIES.get(name)) is not None
        }
        return dataclasses.replace(base, **changes)

    @classmethod
    def from_broker_properties(cls, properties: Mapping[str, str]) -> LogConfig:
        """The broker-wide defaults from server.properties names (`log.segment.bytes`, ...).

        Where Kafka has several units for one setting, the finest one given wins
        (log.retention.ms over .minutes over .hours; log.roll.ms over log.roll.hours).
        """
        topic_level: dict[str, str] = {}
        for broker_name, topic_name in _BROKER_TO_TOPIC.items():
            if broker_name in properties:
                topic_level[topic_name] = properties[broker_name]
        for names, topic_name in _BROKER_TIME_UNITS:
            for broker_name, multiplier in names:
                if broker_name in properties:
                    value = _parse_int(broker_name, properties[broker_name], -1, _INT64_MAX)
                    topic_level[topic_name] = str(value * multiplier if value > 0 else value)
                    break
        return cls.from_properties(topic_level)

    def to_properties(self) -> dict[str, str]:
        """The topic-level properties of this config (for DescribeConfigs)."""
        result = {}
        for name, spec in _TOPIC_PROPERTIES.items():
            value = getattr(self, spec.field)
            if isinstance(value, bool):
                result[name] = str(value).lower()
            elif isinstance(value, tuple):
                result[name] = ",".join(value)
            else:
                result[name] = str(value)
        return result


def _parse_int(name: str, value: str, minimum: int, maximum: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise InvalidConfigurationError(f"{name} must be an integer, got {value!r}") from None
    if not minimum <= number <= maximum:
        raise InvalidConfigurationError(
            f"{name} must be between {minimum} and {maximum}, got {number}"
        )
    return number


def _parse_bool(name: str, value: str) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise InvalidConfigurationError(f"{name} must be true or false, got {value!r}")
    return text == "true"


_CLEANUP_POLICIES = ("compact", "delete")


def _parse_cleanup_policy(name: str, value: str) -> tuple[str, ...]:
    items = tuple(dict.fromkeys(i.strip() for i in str(value).split(",") if i.strip()))
    if any(item not in _CLEANUP_POLICIES for item in items):
        raise InvalidConfigurationError(f"{name} must list compact and/or delete, got {value!r}")
    return items


COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
"""The values of compression.type (Kafka's BrokerCompressionType)."""


def _parse_compression_type(name: str, value: str) -> str:
    text = str(value).strip().lower()
    if text not in COMPRESSION_TYPES:
        raise InvalidConfigurationError(
            f"{name} must be one of {', '.join(COMPRESSION_TYPES)}, got {value!r}"
        )
    return text


def _parse_ratio(name: str, value: str) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        raise InvalidConfigurationError(f"{name} must be a number, got {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise InvalidConfigurationError(f"{name} must be between 0 and 1, got {number}")
    return number


def _parse_timestamp_type(name: str, value: str) -> str:
    text = str(value).strip()
    if text not in (CREATE_TIME, LOG_APPEND_TIME):
        raise InvalidConfigurationError(
            f"{name} must be {CREATE_TIME} or {LOG_APPEND_TIME}, got {value!r}"
        )
    return text


@dataclass(frozen=True, slots=True)
class _Property:
    name: str
    field: str
    parser: Callable[[str, str], Any]
    checker: Callable[[Any], bool]
    rule: str

    def parse(self, name: str, value: str) -> Any:
        parsed = self.parser(name, value)
        self.check(parsed)
        return parsed

    def check(self, value: Any) -> None:
        if not self.checker(value):
            raise InvalidConfigurationError(f"{self.name} {self.rule}, got {value!r}")


def _int(name: str, field: str, minimum: int, maximum: int) -> _Property:
    return _Property(
        name,
        field,
        lambda n, v: _parse_int(n, v, minimum, maximum),
        lambda v: isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= maximum,
        f"must be an integer between {minimum} and {maximum}",
    )


_TOPIC_PROPERTIES: dict[str, _Property] = {
    spec.name: spec
    for spec in (
        _int("segment.bytes", "segment_bytes", _MIN_SEGMENT_BYTES, _INT32_MAX),
        _int("segment.ms", "segment_ms", 1, _INT64_MAX),
        _int("retention.ms", "retention_ms", -1, _INT64_MAX),
        _int("retention.bytes", "retention_bytes", -1, _INT64_MAX),
        _int("index.interval.bytes", "index_interval_bytes", 0, _INT32_MAX),
        _int("segment.index.bytes", "segment_index_bytes", 12, _INT32_MAX),
        _int("max.message.bytes", "max_message_bytes", 0, _INT32_MAX),
        _int("file.delete.delay.ms", "file_delete_delay_ms", 0, _INT64_MAX),
        _int("min.insync.replicas", "min_insync_replicas", 1, _INT32_MAX),
        _int("message.timestamp.before.max.ms", "message_timestamp_before_max_ms", 0, _INT64_MAX),
        _int("message.timestamp.after.max.ms", "message_timestamp_after_max_ms", 0, _INT64_MAX),
        _int(
            "message.timestamp.difference.max.ms",
            "message_timestamp_difference_max_ms",
            0,
            _INT64_MAX,
        ),
        _Property(
            "message.timestamp.type",
            "message_timestamp_type",
            _parse_timestamp_type,
            lambda v: v in (CREATE_TIME, LOG_APPEND_TIME),
            f"must be {CREATE_TIME} or {LOG_APPEND_TIME}",
        ),
        _Property(
            "cleanup.policy",
            "cleanup_policy",
            _parse_cleanup_policy,
            lambda v: isinstance(v, tuple) and all(i in _CLEANUP_POLICIES for i in v),
            "must list compact and/or delete",
        ),
        _Property(
            "min.cleanable.dirty.ratio",
            "min_cleanable_dirty_ratio",
            _parse_ratio,
            lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1,
            "must be a number between 0 and 1",
        ),
        _int("min.compaction.lag.ms", "min_compaction_lag_ms", 0, _INT64_MAX),
        _int("max.compaction.lag.ms", "max_compaction_lag_ms", 1, _INT64_MAX),
        _int("delete.retention.ms", "delete_retention_ms", 0, _INT64_MAX),
        _Property(
            "compression.type",
            "compression_type",
            _parse_compression_type,
            lambda v: v in COMPRESSION_TYPES,
            f"must be one of {', '.join(COMPRESSION_TYPES)}",
        ),
        _Property(
            "unclean.leader.election.enable",
            "unclean_leader_election_enable",
            _parse_bool,
            lambda v: isinstance(v, bool),
            "must be true or false",
        ),
    )
}

TOPIC_CONFIG_NAMES = frozenset(_TOPIC_PROPERTIES)
"""The topic-level property names LogConfig understands."""

_BROKER_TO_TOPIC = {
    "log.segment.bytes": "segment.bytes",
    "log.retention.bytes": "retention.bytes",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.index.size.max.bytes": "segment.index.bytes",
    "message.max.bytes": "max.message.bytes",
    "log.message.timestamp.type": "message.timestamp.type",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "log.cleanup.policy": "cleanup.policy",
    "log.message.timestamp.before.max.ms": "message.timestamp.before.max.ms",
    "log.message.timestamp.after.max.ms": "message.timestamp.after.max.ms",
    "log.message.timestamp.difference.max.ms": "message.timestamp.difference.max.ms",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "compression.type": "compression.type",
}

_HOUR_MS = 60 * 60 * 1000
_BROKER_TIME_UNITS = (
    ((("log.roll.ms", 1), ("log.roll.hours", _HOUR_MS)), "segment.ms"),
    (
        (
            ("log.retention.ms", 1),
            ("log.retention.minutes", 60 * 1000),
            ("log.retention.hours", _HOUR_MS),
        ),
        "retention.ms",
    ),
)
