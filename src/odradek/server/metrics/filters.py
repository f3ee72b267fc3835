"""The query parameters of the broker's HTTP endpoints, parsed and checked on the HTTP thread (pure).

`/metrics?topic=T[&partition=RANGES]` restricts a scrape to one topic (and some of its
partitions): every sample that has a `topic` label is served only for that topic (and, when it also
has a `partition` label, only for those partitions); samples without a `topic` label are unchanged.
It combines with `name[]` (both restrictions apply). The point is cost: the per-replica
`kafka_log_log_*` gauges are then built only for the named replicas, not for every hosted one (see
`snapshot.collect`). A topic this broker does not host gives no such samples, not an error.

RANGES is a comma-separated list of partitions and inclusive ranges, `0-99` or `3,17,40-45`
(`format_partition_ranges` writes the shortest form). Anything else -- a name Kafka would not
accept as a topic, a repeated `topic`, `partition` without `topic`, a malformed or reversed range,
more than `MAX_RANGES` terms -- is a `BadQuery`, which the exporter answers with 400 and the message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Kafka's rule for topic names (`Topic.validate`): 1-249 of these characters.
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_RANGE = re.compile(r"([0-9]{1,10})(?:-([0-9]{1,10}))?")
MAX_PARTITION = 2**31 - 1
MAX_RANGES = 1000


class BadQuery(ValueError):
    """A query parameter the endpoint cannot honour; the message says which and why (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class ReplicaFilter:
    """One topic, and optionally some of its partitions as sorted disjoint inclusive ranges."""

    topic: str
    ranges: tuple[tuple[int, int], ...] | None = None

    def matches(self, topic: str, partition: int | None = None) -> bool:
        if topic != self.topic:
            return False
        if self.ranges is None or partition is None:
            return True
        return any(low <= partition <= high for low, high in self.ranges)

    @property
    def partition_count(self) -> int | None:
        """How many partition numbers the ranges name (None: all of the topic's)."""
        if self.ranges is None:
            return None
        return sum(high - low + 1 for low, high in self.ranges)

    def partitions(self) -> Iterable[int]:
        for low, high in self.ranges or ():
            yield from range(low, high + 1)


def _one(params: Mapping[str, Sequence[str]], key: str) -> str | None:
    values = params.get(key)
    if not values:
        return None
    if len(values) > 1:
        raise BadQuery(f"{key} may be given once, not {len(values)} times")
    return values[0]


def parse_topic(text: str) -> str:
    if not _LEGAL_TOPIC.fullmatch(text):
        raise BadQuery(f"topic {text[:60]!r} is not a legal topic name ([a-zA-Z0-9._-], 1-249)")
    return text


def parse_partition(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 10 or int(text) > MAX_PARTITION:
        raise BadQuery(f"partition {text[:60]!r} is not a partition number")
    return int(text)


def parse_partition_ranges(text: str) -> tuple[tuple[int, int], ...]:
    """`"3,17,40-45"` -> ((3, 3), (17, 17), (40, 45)), sorted and merged."""
    terms = text.split(",")
    if len(terms) > MAX_RANGES:
        raise BadQuery(f"partition names {len(terms)} terms; at most {MAX_RANGES}")
    ranges: list[tuple[int, int]] = []
    for term in terms:
        match = _RANGE.fullmatch(term.strip())
        if match is None:
            raise BadQuery(f"partition term {term[:60]!r} is not N or N-M")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low or high > MAX_PARTITION:
            raise BadQuery(f"partition range {term[:60]!r} is reversed or out of range")
        ranges.append((low, high))
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for low, high in ranges:
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


def format_partition_ranges(partitions: Iterable[int]) -> str:
    """The shortest RANGES text naming exactly `partitions`: [0, 1, 2, 5] -> `"0-2,5"`."""
    terms: list[str] = []
    run: list[int] = []
    for p in sorted(set(partitions)):
        if run and p == run[-1] + 1:
            run[-1] = p
            continue
        if run:
            terms.append(f"{run[0]}-{run[1]}" if run[1] != run[0] else str(run[0]))
        run = [p, p]
    if run:
        terms.append(f"{run[0]}-{run[1]}" if run[1] != run[0] else str(run[0]))
    return ",".join(terms)


def parse_replica_filter(params: Mapping[str, Sequence[str]]) -> ReplicaFilter | None:
    """The `topic` and `partition` parameters of a `/metrics` scrape (None: no filter)."""
    topic = _one(params, "topic")
    partitions = _one(params, "partition")
    if topic is None:
        if partitions is not None:
            raise BadQuery("partition needs topic")
        return None
    return ReplicaFilter(
        parse_topic(topic), parse_partition_ranges(partitions) if partitions is not None else None
    )


def parse_topic_partition(params: Mapping[str, Sequence[str]]) -> tuple[str, int]:
    """The required `topic` and `partition` of `/state-changes`."""
    topic = _one(params, "topic")
    partition = _one(params, "partition")
    if topic is None or partition is None:
        raise BadQuery("state-changes needs topic=NAME&partition=N")
    return parse_topic(topic), parse_partition(partition)
