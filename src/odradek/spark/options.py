"""The `odradek` data source's options, parsed and checked once, with Spark's Kafka names.

Spark hands a data source its options in a case-insensitive map (keys lower-cased), so
`startingOffsets` arrives as `startingoffsets`; every lookup here goes through `_Options`, which
lower-cases too. Invalid values and combinations raise DataSourceOptionError naming the option, at
the earliest point Spark lets us: `load()` for a read (through `DataSource.schema`), the start of
the query for a stream-only rule, the `save()` / `start()` of a write.

`kafka.*` options pass to the clients with the prefix removed, as Spark's Kafka source passes them
to the Java client. The clients here are librdkafka's (confluent-kafka), which shares most names
with the Java client (`security.protocol`, `sasl.mechanism`, `client.id`, `fetch.max.bytes`...).
Settings the source must control itself are refused with the option to use instead, as Spark does.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from odradek.errors import DataSourceOptionError
from odradek.spark.client_settings import librdkafka_params
from odradek.spark.offsets import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    TopicPartition,
    parse_assign,
    parse_offset_spec,
    parse_timestamp,
    parse_timestamps_spec,
)

__all__ = ["SinkOptions", "SourceOptions", "Subscription", "kafka_params"]

log = logging.getLogger(__name__)

BOOTSTRAP = "kafka.bootstrap.servers"
EXACTLY_ONCE = "exactlyOnce"
WRITE_PATH = "odradek.writePath"
WRITE_PATHS = ("auto", "producer")
SINK_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")

# Client settings the source or sink owns; a user setting them would break offset tracking or
# delivery checking. Value: what to do instead.
_REFUSED_CLIENT_PARAMS = {
    "auto.offset.reset": "set the source option 'startingOffsets' instead",
    "enable.auto.commit": "offsets are tracked in Spark's checkpoint, never committed to Kafka",
    "key.deserializer": "keys are always read as bytes; cast the 'key' column in the query",
    "value.deserializer": "values are always read as bytes; cast the 'value' column in the query",
    "key.serializer": "keys are always written as bytes or strings from the 'key' column",
    "value.serializer": "values are always written as bytes or strings from the 'value' column",
    "interceptor.classes": "the clients are librdkafka's, which has no Java interceptors",
    "enable.partition.eof": "the reader relies on end-of-partition events",
}
_REFUSED_SINK_PARAMS = {
    "acks": "the sink always produces with acks=all",
    "enable.idempotence": "the sink sets it (on with exactlyOnce=true, off otherwise)",
    "transactional.id": "set the sink option 'exactlyOnce' to true instead (the sink derives "
    "one transactional id per query and task)",
}

ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
TIMESTAMP_STRATEGY = "startingOffsetsByTimestampStrategy"
TIMESTAMP_STRATEGIES = ("error", "latest")
# Spark's default maxTriggerDelay: a micro-batch waiting for minOffsetsPerTrigger runs anyway
# after this long.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
_TIME_UNITS_MS = {
    "us": 0.001,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}
ISOLATION_LEVEL = "kafka.isolation.level"


class _Options:
    """Case-insensitive read access to Spark's option map."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._values = {str(k).lower(): str(v) for k, v in options.items()}

    def get(self, name: str) -> str | None:
        return self._values.get(name.lower())

    def items(self) -> list[tuple[str, str]]:
        return list(self._values.items())

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise DataSourceOptionError(f"{name}: expected true or false, got {value!r}")

    def positive_int(self, name: str) -> int | None:
        value = self.get(name)
        if value is None:
            return None
        try:
            number = int(value.strip())
        except ValueError:
            raise DataSourceOptionError(
                f"{name}: expected a positive integer, got {value!r}"
            ) from None
        if number <= 0:
            raise DataSourceOptionError(f"{name}: expected a positive integer, got {value!r}")
        return number


def kafka_params(options: Mapping[str, str], sink: bool = False) -> dict[str, str]:
    """The `kafka.*` options without their prefix, as librdkafka settings (Java client names
    translated, see `odradek.spark.client_settings`); DataSourceOptionError for a setting the
    data source must own (or, with `sink`, the sink must own)."""
    params = {}
    for key, value in _Options(options).items():
        if not key.startswith("kafka."):
            continue
        name = key[len("kafka.") :]
        if name == "bootstrap.servers":
            continue  # given to every client explicitly
        reason = _REFUSED_CLIENT_PARAMS.get(name) or (
            _REFUSED_SINK_PARAMS.get(name) if sink else None
        )
        if reason is not None:
            raise DataSourceOptionError(f"kafka.{name} is not supported: {reason}")
        params[name] = value
    return librdkafka_params(params)


def _bootstrap(options: _Options) -> str:
    value = options.get(BOOTSTRAP)
    if value is None or not value.strip():
        raise DataSourceOptionError(
            f"option '{BOOTSTRAP}' is required (a comma-separated list of host:port)"
        )
    return value.strip()


@dataclass(frozen=True)
class Subscription:
    """Which partitions a source reads: Spark's `subscribe`, `subscribePattern` or `assign`."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assignment: tuple[TopicPartition, ...] = ()

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "subscribePattern":
            return f"subscribePattern={self.pattern}"
        return "assign=" + ",".join(str(tp) for tp in self.assignment)

    def matches(self, topic: str) -> bool:
        """Whether `topic` is one this subscription reads (internal topics never match a pattern,
        as Kafka's `exclude.internal.topics` default has it)."""
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            return (
                not topic.startswith("__") and re.fullmatch(self.pattern or "", topic) is not None
            )
        return any(tp.topic == topic for tp in self.assignment)

    def resolve(self, partitions_by_topic: Mapping[str, Iterable[int]]) -> list[TopicPartition]:
        """The partitions to read, given the cluster's topics and their partition numbers. For
        `assign`, the assigned partitions that exist."""
        if self.kind == "assign":
            return [
                tp
                for tp in self.assignment
                if tp.partition in set(partitions_by_topic.get(tp.topic, ()))
            ]
        return sorted(
            TopicPartition(topic, p)
            for topic, partitions in partitions_by_topic.items()
            if self.matches(topic)
            for p in partitions
        )


def _subscription(options: _Options) -> Subscription:
    given = [
        name
        for name in ("subscribe", "subscribePattern", "assign")
        if options.get(name) is not None
    ]
    if not given:
        raise DataSourceOptionError(
            "one of the options 'subscribe', 'subscribePattern' or 'assign' is required"
        )
    if len(given) > 1:
        raise DataSourceOptionError(
            f"only one of 'subscribe', 'subscribePattern' or 'assign' may be given, got "
            f"{' and '.join(repr(g) for g in given)}"
        )
    kind = given[0]
    value = options.get(kind) or ""
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise DataSourceOptionError(
                f"subscribe: expected a comma-separated list of topics, got {value!r}"
            )
        return Subscription("subscribe", topics=topics)
    if kind == "subscribePattern":
        if not value.strip():
            raise DataSourceOptionError("subscribePattern: the pattern is empty")
        try:
            re.compile(value)
        except re.error as e:
            raise DataSourceOptionError(
                f"subscribePattern: invalid regular expression {value!r}: {e}"
            ) from None
        return Subscription("subscribePattern", pattern=value)
    return Subscription("assign", assignment=tuple(parse_assign(value)))


def _check_spec_partitions(
    spec: OffsetSpec | None, subscription: Subscription, option: str
) -> None:
    """Offsets given for partitions the subscription does not read are a mistake worth an error."""
    if spec is None or spec.kind not in ("specific", "by_timestamp"):
        return
    stray = sorted(tp for tp in spec.offsets or {} if not subscription.matches(tp.topic))
    if subscription.kind == "assign":
        assigned = set(subscription.assignment)
        stray = sorted(tp for tp in spec.offsets or {} if tp not in assigned)
    if stray:
        raise DataSourceOptionError(
            f"{spec.option or option}: {'timestamps' if spec.by_time else 'offsets'} given for "
            f"{', '.join(str(tp) for tp in stray)}, which "
            f"{subscription.describe()} does not read"
        )


@dataclass(frozen=True)
class SourceOptions:
    """Everything a reader needs, checked. Picklable: it travels to the executors."""

    bootstrap_servers: str
    subscription: Subscription
    starting_offsets: OffsetSpec | None
    ending_offsets: OffsetSpec | None
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    max_records_per_partition: int | None
    fail_on_data_loss: bool
    include_headers: bool
    poll_timeout_ms: int
    fetch_offset_num_retries: int
    fetch_offset_retry_interval_ms: int
    client_params: Mapping[str, str] = field(default_factory=dict)
    isolation_level: str = "read_uncommitted"
    timestamp_strategy: str = "error"
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Check the options every read shares (batch and stream alike)."""
        opts = _Options(options)
        subscription = _subscription(opts)
        starting = _start_or_end(opts, "starting")
        ending = _start_or_end(opts, "ending")
        _check_spec_partitions(starting, subscription, "startingOffsets")
        _check_spec_partitions(ending, subscription, "endingOffsets")
        max_offsets = opts.positive_int("maxOffsetsPerTrigger")
        min_offsets = opts.positive_int("minOffsetsPerTrigger")
        if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
            raise DataSourceOptionError(
                f"minOffsetsPerTrigger: {min_offsets} is higher than maxOffsetsPerTrigger "
                f"{max_offsets} (expected at most maxOffsetsPerTrigger)"
            )
        return cls(
            bootstrap_servers=_bootstrap(opts),
            subscription=subscription,
            starting_offsets=starting,
            ending_offsets=ending,
            max_offsets_per_trigger=max_offsets,
            min_offsets_per_trigger=min_offsets,
            max_trigger_delay_ms=_duration_ms(
                opts, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS
            ),
            timestamp_strategy=_choice(opts, TIMESTAMP_STRATEGY, TIMESTAMP_STRATEGIES, "error"),
            min_partitions=opts.positive_int("minPartitions"),
            max_records_per_partition=opts.positive_int("maxRecordsPerPartition"),
            fail_on_data_loss=opts.boolean("failOnDataLoss", True),
            include_headers=opts.boolean("includeHeaders", False),
            poll_timeout_ms=opts.positive_int("kafkaConsumer.pollTimeoutMs") or 120_000,
            fetch_offset_num_retries=_non_negative(opts, "fetchOffset.numRetries", 3),
            fetch_offset_retry_interval_ms=opts.positive_int("fetchOffset.retryIntervalMs") or 1000,
            client_params={
                k: v for k, v in kafka_params(options).items() if k != "isolation.level"
            },
            isolation_level=_isolation_level(opts),
        )

    def for_batch(self) -> SourceOptions:
        """The batch rules: starting defaults to earliest and may not be latest; ending defaults
        to latest and may not be earliest (Spark's rules for a bounded read)."""
        starting = self.starting_offsets or OffsetSpec("earliest", option="startingOffsets")
        ending = self.ending_offsets or OffsetSpec("latest", option="endingOffsets")
        if starting.kind == "latest" or any(o == LATEST for o in (starting.offsets or {}).values()):
            raise DataSourceOptionError(
                "startingOffsets: 'latest' (-1) is not allowed in a batch query (it reads nothing)"
            )
        if ending.kind == "earliest" or any(o == EARLIEST for o in (ending.offsets or {}).values()):
            raise DataSourceOptionError(
                "endingOffsets: 'earliest' (-2) is not allowed in a batch query (it reads nothing)"
            )
        # The trigger options are ignored in a batch query, with a warning, as Spark does.
        for name, value in (
            ("maxOffsetsPerTrigger", self.max_offsets_per_trigger),
            ("minOffsetsPerTrigger", self.min_offsets_per_trigger),
        ):
            if value is not None:
                log.warning("%s option ignored in batch queries", name)
        return replace(self, starting_offsets=starting, ending_offsets=ending)

    def for_stream(self) -> SourceOptions:
        """The streaming rules: no endingOffsets; starting defaults to latest."""
        if self.ending_offsets is not None:
            raise DataSourceOptionError(
                f"{self.ending_offsets.option or 'endingOffsets'} is not allowed in a streaming "
                "query (a stream has no end); use a batch read (spark.read) for a bounded range"
            )
        return replace(
            self,
            starting_offsets=self.starting_offsets
            or OffsetSpec("latest", option="startingOffsets"),
        )


def _isolation_level(options: _Options) -> str:
    """`kafka.isolation.level`, read_uncommitted by default as in Spark's Kafka source (whose Java
    consumer defaults to it; librdkafka's default, read_committed, is not taken)."""
    value = options.get(ISOLATION_LEVEL)
    if value is None:
        return "read_uncommitted"
    level = value.strip().lower()
    if level not in ISOLATION_LEVELS:
        raise DataSourceOptionError(
            f"{ISOLATION_LEVEL}: expected read_uncommitted or read_committed, got {value!r}"
        )
    return level


def _start_or_end(options: _Options, which: Literal["starting", "ending"]) -> OffsetSpec | None:
    """Where a read starts (or ends), from Spark's three options in Spark's order of preference:
    `<which>Timestamp` (one timestamp for every partition), then `<which>OffsetsByTimestamp`,
    then `<which>Offsets`. The others are ignored when one is given, as Spark ignores them."""
    timestamp = options.get(f"{which}Timestamp")
    if timestamp is not None:
        return parse_timestamp(timestamp, f"{which}Timestamp")
    by_timestamp = options.get(f"{which}OffsetsByTimestamp")
    if by_timestamp is not None:
        return parse_timestamps_spec(by_timestamp, f"{which}OffsetsByTimestamp")
    value = options.get(f"{which}Offsets")
    return None if value is None else parse_offset_spec(value, f"{which}Offsets")


def _choice(options: _Options, name: str, accepted: tuple[str, ...], default: str) -> str:
    value = options.get(name)
    if value is None:
        return default
    if value.strip().lower() not in accepted:
        raise DataSourceOptionError(f"{name}: expected {' or '.join(accepted)}, got {value!r}")
    return value.strip().lower()


def _duration_ms(options: _Options, name: str, default: int) -> int:
    """A Spark time string (`15m`, `30s`, `500ms`, `2h`; a bare number is milliseconds)."""
    value = options.get(name)
    if value is None:
        return default
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", value.lower())
    if match is None or match.group(2) not in ("", *_TIME_UNITS_MS):
        raise DataSourceOptionError(
            f"{name}: expected a duration such as 500ms, 30s, 15m, 2h or 1d (a bare number is "
            f"milliseconds), got {value!r}"
        )
    return int(int(match.group(1)) * _TIME_UNITS_MS[match.group(2) or "ms"])


def _non_negative(options: _Options, name: str, default: int) -> int:
    value = options.get(name)
    if value is None:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        number = -1
    if number < 0:
        raise DataSourceOptionError(f"{name}: expected a non-negative integer, got {value!r}")
    return number


@dataclass(frozen=True)
class SinkOptions:
    """Everything a writer needs, checked. Picklable: it travels to the executors."""

    bootstrap_servers: str
    topic: str | None
    client_params: Mapping[str, str] = field(default_factory=dict)
    exactly_once: bool = False
    # `auto`: the fast path (`spark.produce`) where it applies; `producer`: confluent-kafka only
    write_path: str = "auto"

    @property
    def compression_type(self) -> str:
        """The codec of `kafka.compression.type` (librdkafka's `compression.codec` too)."""
        params = self.client_params
        codec = params.get("compression.type", params.get("compression.codec", "none"))
        return codec.strip().lower()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = _Options(options)
        for name in ("subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets"):
            if opts.get(name) is not None:
                raise DataSourceOptionError(
                    f"{name} is a read option; a write takes 'topic' (or a 'topic' column)"
                )
        topic = opts.get("topic")
        if topic is not None and not topic.strip():
            raise DataSourceOptionError("topic: the topic name is empty")
        exactly_once = opts.boolean(EXACTLY_ONCE, False)
        if exactly_once and not topic:
            raise DataSourceOptionError(
                f"{EXACTLY_ONCE}=true needs the 'topic' option: each task records the last "
                "micro-batch it committed as a transactional offset of that topic's partition 0"
            )
        write_path = (opts.get(WRITE_PATH) or "auto").strip().lower()
        if write_path not in WRITE_PATHS:
            raise DataSourceOptionError(
                f"{WRITE_PATH}: expected auto or producer, got {opts.get(WRITE_PATH)!r}"
            )
        sink = cls(
            bootstrap_servers=_bootstrap(opts),
            topic=topic.strip() if topic else None,
            client_params=kafka_params(options, sink=True),
            exactly_once=exactly_once,
            write_path=write_path,
        )
        if sink.compression_type not in SINK_CODECS:
            name = (
                "compression.type"
                if "compression.type" in sink.client_params
                else "compression.codec"
            )
            raise DataSourceOptionError(
                f"kafka.{name}: expected none, gzip, snappy, lz4 or zstd, got "
                f"{sink.client_params[name]!r}"
            )
        return sink
