"""The pure logic the console's pages are made of: paging, filtering, lag, record rendering, charts.

No I/O and no framework here, so each rule is tested alone (tests/unit/test_console_views.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from odradek.console.snapshot import PartitionRow, TopicSummary

T = TypeVar("T")

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
TOPIC_STATUSES = ("healthy", "under-replicated", "under-min-isr", "offline", "deleting")
PARTITION_FILTERS = ("all", "offline", "under-replicated", "under-min-isr", "not-preferred")
RECORD_FORMATS = ("text", "json", "hex")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list: `number` counts from 1 and is clamped into range."""

    items: Sequence[T]
    number: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.size))

    @property
    def first_index(self) -> int:
        """1-based position of the page's first item (0 when the list is empty)."""
        return (self.number - 1) * self.size + 1 if self.total else 0

    @property
    def last_index(self) -> int:
        return (self.number - 1) * self.size + len(self.items)

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages


def parse_int(text: str | None, default: int, low: int, high: int) -> int:
    """A query parameter as an int clamped into [low, high]; `default` when absent or bad."""
    try:
        value = int(text) if text not in (None, "") else default
    except ValueError:
        value = default
    return min(high, max(low, value))


def paginate(items: Sequence[T], number: int, size: int = DEFAULT_PAGE_SIZE) -> Page[T]:
    size = min(MAX_PAGE_SIZE, max(1, size))
    pages = max(1, math.ceil(len(items) / size))
    number = min(pages, max(1, number))
    start = (number - 1) * size
    return Page(items[start : start + size], number, size, len(items))


def filter_topics(
    topics: Iterable[TopicSummary],
    query: str = "",
    status: str = "",
    include_internal: bool = True,
) -> list[TopicSummary]:
    """Topics whose name contains `query` (case-insensitive) and whose status is `status` (any
    when empty; "unhealthy" means any but healthy), sorted by name."""
    needle = query.strip().lower()
    result = []
    for topic in topics:
        if needle and needle not in topic.name.lower():
            continue
        if not include_internal and topic.name.startswith("__"):
            continue
        if status == "unhealthy":
            if topic.status == "healthy":
                continue
        elif status and topic.status != status:
            continue
        result.append(topic)
    result.sort(key=lambda t: t.name)
    return result


def filter_partitions(partitions: Iterable[PartitionRow], which: str = "all") -> list[PartitionRow]:
    """A topic's partitions narrowed to one condition (PARTITION_FILTERS)."""
    if which == "offline":
        return [p for p in partitions if not p.online]
    if which == "under-replicated":
        return [p for p in partitions if p.under_replicated]
    if which == "under-min-isr":
        return [p for p in partitions if p.under_min_isr]
    if which == "not-preferred":
        return [p for p in partitions if p.leader != p.preferred_leader]
    return list(partitions)


# -- consumer lag -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a group: committed offset, the partition's end (its high watermark, what
    a read_uncommitted consumer can reach), and who holds it."""

    topic: str
    partition: int
    committed: int | None
    log_end_offset: int | None
    lag: int | None
    member: str | None = None
    client_id: str | None = None
    host: str | None = None


def lag(committed: int | None, log_end_offset: int | None) -> int | None:
    """Kafka's lag: end offset - committed offset, never negative (a committed offset past the
    end after a truncation shows 0); unknown (None) without both numbers."""
    if committed is None or committed < 0 or log_end_offset is None or log_end_offset < 0:
        return None
    return max(0, log_end_offset - committed)


def group_lag(
    committed: Mapping[tuple[str, int], int | None],
    ends: Mapping[tuple[str, int], int],
    owners: Mapping[tuple[str, int], tuple[str, str, str]] | None = None,
) -> list[PartitionLag]:
    """Rows for every partition the group has committed or is assigned, sorted; `owners`:
    partition -> (member id, client id, host)."""
    owners = owners or {}
    rows = []
    for key in sorted(set(committed) | set(owners)):
        offset = committed.get(key)
        end = ends.get(key)
        member, client_id, host = owners.get(key, (None, None, None))
        rows.append(
            PartitionLag(key[0], key[1], offset, end, lag(offset, end), member, client_id, host)
        )
    return rows


def total_lag(rows: Iterable[PartitionLag]) -> int | None:
    known = [r.lag for r in rows if r.lag is not None]
    return sum(known) if known else None


# -- records ----------------------------------------------------------------------------------


def render_bytes(data: bytes | None, fmt: str) -> str:
    """A key or value for the record browser: `text` (UTF-8, undecodable bytes escaped), `json`
    (pretty-printed when it parses, else as text), `hex` (bytes in groups of 2 hex digits)."""
    if data is None:
        return "null"
    if fmt == "hex":
        return data.hex(" ")
    text = data.decode("utf-8", "backslashreplace")
    if fmt == "json":
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
        except ValueError:
            return text
    return text


def start_offset(low: int, high: int, count: int) -> int:
    """Where to start reading to get the latest `count` records of [low, high)."""
    return max(low, high - max(0, count))


# -- formatting -------------------------------------------------------------------------------


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def human_rate(n: float | None) -> str:
    if n is None:
        return "-"
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 1_000:
        return f"{n / 1_000:.1f}k"
    return f"{n:.0f}"


def sparkline(values: Sequence[float], width: int = 240, height: int = 40) -> str:
    """An SVG polyline path ("M x,y L x,y ...") of `values` scaled into width x height, the
    largest at the top; "" for fewer than two points. Drawn server-side: no chart library."""
    if len(values) < 2:
        return ""
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    points = [
        f"{i * step:.1f},{height - (v / top) * (height - 2) - 1:.1f}" for i, v in enumerate(values)
    ]
    return "M " + " L ".join(points)


def is_fragment(headers: Mapping[str, str], target: str) -> bool:
    """Whether a request with these headers is htmx refreshing the live region `target` (it
    then gets that region's fragment, not the whole page)."""
    return headers.get("HX-Request") == "true" and headers.get("HX-Target") == target
