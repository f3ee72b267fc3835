"""Partition offsets as Spark sees them: the JSON shape, offset specs, ranges and their planning.

Pure functions, no client and no Spark session, so that the arithmetic is tested alone.

The JSON shape is the one Spark's built-in Kafka source writes to its checkpoint and accepts in
`startingOffsets` / `endingOffsets`: an object of topics, each an object of partition numbers (as
strings) to offsets, `{"orders":{"0":23,"1":-2}}`. In an option, -2 stands for the earliest offset
(the log start offset) and -1 for the latest (the high watermark); a checkpointed offset is always
a real offset, the next one to read. `offsets_to_json` orders topics by name and partitions by
number, so that one set of offsets always serialises to the same string: Spark decides whether a
micro-batch has new data by comparing the serialised start and end offsets, and a different order
of the same offsets would make it run empty batches.

Offsets may also be given by record timestamp, as Spark's `startingTimestamp` (one timestamp for
every partition) and `startingOffsetsByTimestamp` (`{"orders":{"0":1700000000000}}`, a timestamp
per partition, every partition read named): an `OffsetSpec` of kind `timestamp` or
`by_timestamp`, resolved on the driver with ListOffsets by timestamp (the first offset whose
timestamp is at or after it).

An `OffsetRange` is one unit of reading, [from_offset, until_offset) of one partition; it is also
the `InputPartition` Spark ships to an executor (it must stay picklable and importable there).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from pyspark.sql.datasource import InputPartition

from odradek.errors import DataSourceOptionError

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetRange",
    "OffsetSpec",
    "PartitionOffsets",
    "TopicPartition",
    "offsets_from_json",
    "offsets_to_json",
    "parse_assign",
    "parse_offset_spec",
    "parse_timestamp",
    "parse_timestamps_spec",
    "plan_ranges",
    "rate_limit",
]

EARLIEST = -2
LATEST = -1


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


PartitionOffsets = dict[TopicPartition, int]


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """`{tp: offset}` -> Spark's `{"topic": {"0": offset}}`, in a deterministic order."""
    result: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        result.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return result


def offsets_from_json(obj: Any, what: str) -> PartitionOffsets:
    """Spark's `{"topic": {"0": offset}}` (already decoded) -> `{tp: offset}`.

    `what` names the option or the checkpoint the object came from, for the error message.
    DataSourceOptionError if the shape is wrong.
    """
    if not isinstance(obj, dict):
        raise DataSourceOptionError(
            f'{what}: expected a JSON object of topics like {{"topic":{{"0":23}}}}, got {obj!r}'
        )
    offsets: PartitionOffsets = {}
    for topic, partitions in obj.items():
        if not isinstance(partitions, dict):
            raise DataSourceOptionError(
                f"{what}: topic {topic!r} must map partition numbers to offsets, got {partitions!r}"
            )
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except (TypeError, ValueError):
                raise DataSourceOptionError(
                    f"{what}: partition {partition!r} of topic {topic!r} is not a number"
                ) from None
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise DataSourceOptionError(
                    f"{what}: offset of {topic}-{partition} must be an integer, got {offset!r}"
                )
            if number < 0:
                raise DataSourceOptionError(f"{what}: negative partition {topic}-{partition}")
            offsets[TopicPartition(str(topic), number)] = offset
    return offsets


def _load_json(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise DataSourceOptionError(f"{option}: not valid JSON ({e}): {text!r}") from None


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends: `earliest`, `latest`, specific offsets per partition
    (which may themselves be EARLIEST or LATEST), one record timestamp for every partition
    (`timestamp`), or a timestamp per partition (`by_timestamp`, in `offsets`). `option` names
    the option it came from, for messages."""

    kind: Literal["earliest", "latest", "specific", "timestamp", "by_timestamp"]
    offsets: Mapping[TopicPartition, int] | None = None
    timestamp: int | None = None
    option: str = ""

    @property
    def by_time(self) -> bool:
        return self.kind in ("timestamp", "by_timestamp")

    def describe(self) -> str:
        if self.kind in ("specific", "by_timestamp"):
            return json.dumps(offsets_to_json(self.offsets or {}), separators=(",", ":"))
        if self.kind == "timestamp":
            return f"timestamp {self.timestamp}"
        return self.kind


def parse_timestamp(text: str, option: str) -> OffsetSpec:
    """Spark's `startingTimestamp` / `endingTimestamp`: one timestamp (milliseconds since the
    epoch) for every partition."""
    try:
        timestamp = int(text.strip())
    except ValueError:
        raise DataSourceOptionError(
            f"{option}: expected a timestamp in milliseconds since the epoch (an integer), "
            f"got {text!r}"
        ) from None
    if timestamp < 0:
        raise DataSourceOptionError(
            f"{option}: expected a timestamp in milliseconds since the epoch (0 or more), "
            f"got {text!r}"
        )
    return OffsetSpec("timestamp", timestamp=timestamp, option=option)


def parse_timestamps_spec(text: str, option: str) -> OffsetSpec:
    """Spark's `startingOffsetsByTimestamp` / `endingOffsetsByTimestamp`:
    `{"topic":{"0":1700000000000}}`, a timestamp (milliseconds, 0 or more) per partition."""
    value = text.strip()
    if not value.startswith("{"):
        raise DataSourceOptionError(
            f'{option}: expected JSON like {{"topic":{{"0":1700000000000}}}} (a timestamp in '
            f"milliseconds per partition), got {text!r}"
        )
    timestamps = offsets_from_json(_load_json(value, option), option)
    for tp, timestamp in timestamps.items():
        if timestamp < 0:
            raise DataSourceOptionError(
                f"{option}: timestamp {timestamp} of {tp} is invalid (milliseconds since the "
                "epoch, 0 or more)"
            )
    if not timestamps:
        raise DataSourceOptionError(f"{option}: no partition given in {text!r}")
    return OffsetSpec("by_timestamp", timestamps, option=option)


def parse_offset_spec(text: str, option: str) -> OffsetSpec:
    """Parse `earliest`, `latest` or Spark's per-partition JSON; DataSourceOptionError naming
    `option` otherwise. Offsets below -2 are refused."""
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return OffsetSpec(value.lower(), option=option)  # type: ignore[arg-type]
    if not value.startswith("{"):
        raise DataSourceOptionError(
            f'{option}: expected "earliest", "latest" or JSON like {{"topic":{{"0":23,"1":-2}}}},'
            f" got {text!r}"
        )
    offsets = offsets_from_json(_load_json(value, option), option)
    for tp, offset in offsets.items():
        if offset < EARLIEST:
            raise DataSourceOptionError(
                f"{option}: offset {offset} of {tp} is invalid (use -2 for earliest, -1 for latest)"
            )
    return OffsetSpec("specific", offsets, option=option)


def parse_assign(text: str) -> list[TopicPartition]:
    """Spark's `assign` option, `{"topicA":[0,1],"topicB":[2]}` -> sorted topic partitions."""
    obj = _load_json(text.strip(), "assign")
    if not isinstance(obj, dict) or not obj:
        raise DataSourceOptionError(
            f'assign: expected a non-empty JSON object like {{"topicA":[0,1]}}, got {text!r}'
        )
    result: set[TopicPartition] = set()
    for topic, partitions in obj.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise DataSourceOptionError(
                f"assign: topic {topic!r} must map to a list of partition numbers, "
                f"got {partitions!r}"
            )
        result.update(TopicPartition(str(topic), p) for p in partitions)
    return sorted(result)


@dataclass
class OffsetRange(InputPartition):
    """Offsets [from_offset, until_offset) of one partition: what one Spark task reads."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        return max(0, self.until_offset - self.from_offset)

    def split(self, parts: int) -> list[OffsetRange]:
        """`parts` contiguous ranges of (nearly) equal size covering this one."""
        parts = max(1, min(parts, self.size))
        bounds = [self.from_offset + self.size * i // parts for i in range(parts + 1)]
        return [
            OffsetRange(self.topic, self.partition, bounds[i], bounds[i + 1]) for i in range(parts)
        ]


def plan_ranges(
    ranges: Iterable[OffsetRange],
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[OffsetRange]:
    """The tasks of one read: the non-empty `ranges`, split so that there are at least
    `min_partitions` of them (as long as there are that many records) and none holds more than
    `max_records_per_partition` records.

    Extra splits go to the ranges with the most records per part, so the tasks come out as even
    as the partitions allow; the pieces of one range stay in offset order.
    """
    nonempty = sorted((r for r in ranges if r.size > 0), key=lambda r: r.topic_partition)
    parts = [1] * len(nonempty)
    if max_records_per_partition is not None and max_records_per_partition > 0:
        parts = [-(-r.size // max_records_per_partition) for r in nonempty]
    wanted = min_partitions or 0
    if sum(parts) < wanted:
        # A max-heap of (records per part) over the ranges that can still be split.
        heap = [(-r.size / p, i) for i, (r, p) in enumerate(zip(nonempty, parts, strict=True))]
        heapq.heapify(heap)
        total = sum(parts)
        while total < wanted and heap:
            _, i = heapq.heappop(heap)
            if parts[i] >= nonempty[i].size:
                continue  # one record per task already: cannot split further
            parts[i] += 1
            total += 1
            heapq.heappush(heap, (-nonempty[i].size / parts[i], i))
    planned: list[OffsetRange] = []
    for r, p in zip(nonempty, parts, strict=True):
        planned.extend(r.split(p))
    return planned


def rate_limit(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_offsets: int,
    default_start: int = 0,
) -> PartitionOffsets:
    """End offsets that read at most `max_offsets` records in total from `start` towards
    `latest`, shared among partitions in proportion to their backlog (as Spark's
    `maxOffsetsPerTrigger`).

    A partition missing from `start` starts at `default_start`. Whole shares are given by
    proportion and the records left over one by one to the largest fractional shares (ties by
    topic partition), so the total is exactly `max_offsets` whenever the backlog is larger and
    every partition with a backlog makes progress over successive calls.
    """
    if max_offsets <= 0:
        raise DataSourceOptionError(f"maxOffsetsPerTrigger must be positive, got {max_offsets}")
    lag = {tp: max(0, end - start.get(tp, default_start)) for tp, end in latest.items()}
    total = sum(lag.values())
    if total <= max_offsets:
        return dict(latest)
    share = {tp: max_offsets * n // total for tp, n in lag.items()}
    left = max_offsets - sum(share.values())
    by_remainder = sorted(lag, key=lambda tp: (-(max_offsets * lag[tp] % total), tp))
    for tp in by_remainder[:left]:
        share[tp] += 1
    return {
        tp: (start.get(tp, default_start) + share[tp]) if lag[tp] else end
        for tp, end in latest.items()
    }
