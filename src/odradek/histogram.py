"""A latency histogram for the broker's metrics: fixed log-scale buckets, O(1) to record (pure).

Kafka's Yammer histograms keep an exponentially-decaying reservoir and compute percentiles from
it. This keeps counts in fixed buckets instead, and computes percentiles only when asked (at
scrape time): recording a value is a few integer operations and one list increment, whatever was
recorded before, with nothing kept per value.

Buckets, on durations in integer nanoseconds (`time.perf_counter_ns()` differences): values
below 16 ns each have their own bucket; above, each power of two [2**k, 2**(k+1)) is cut into 8
equal buckets, so a bucket spans at most 1/8 of its lower bound (a percentile is off by at most
12.5% of the true value, half that for the bucket's middle, which is what is reported). For a
value `v` >= 16 with `s = v.bit_length() - 4`, the top four bits `v >> s` are 8..15 and the bucket
is `8 * s + (v >> s)`. Values of 2**44 ns (about 4.9 hours) and more go to one overflow bucket,
reported as the largest value recorded. 337 buckets in all.

Percentiles are nearest-rank: the p-th percentile of n values is the value of rank
ceil(p * n) in sorted order, reported as its bucket's middle, never above the maximum recorded.
An empty histogram reports 0 for every percentile, as Kafka's empty snapshot does.

`summary_ms()` (count, mean, max and the percentiles) is what a scrape serves; a reader may keep
the last one it computed in `summary` (the metrics snapshot does, from a copy): it holds while its
count is the histogram's, since every record bumps the count. Recording never looks at it.

Concurrency: not thread-safe; each histogram is recorded to and read from one thread (the broker's
event loop), or read as a copy. `summary` may be set from another thread (one attribute store, of
an immutable tuple); a reader checks its count before trusting it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import accumulate

SUB_BUCKET_BITS = 3
SUB_BUCKETS = 1 << SUB_BUCKET_BITS  # 8 buckets per power of two
_TOP_BITS = SUB_BUCKET_BITS + 1
OVERFLOW_NS = 1 << 44
OVERFLOW_BUCKET = SUB_BUCKETS * (OVERFLOW_NS.bit_length() - _TOP_BITS) + SUB_BUCKETS
BUCKETS = OVERFLOW_BUCKET + 1

# The percentiles Kafka's histograms expose, as the JMX exporter names their attributes.
PERCENTILES = (
    ("50thPercentile", 0.50),
    ("75thPercentile", 0.75),
    ("95thPercentile", 0.95),
    ("98thPercentile", 0.98),
    ("99thPercentile", 0.99),
    ("999thPercentile", 0.999),
)


def bucket_of(value_ns: int) -> int:
    """The bucket of a duration in nanoseconds (negative values count as 0)."""
    if value_ns < 16:
        return value_ns if value_ns > 0 else 0
    if value_ns >= OVERFLOW_NS:
        return OVERFLOW_BUCKET
    shift = value_ns.bit_length() - _TOP_BITS
    return (shift << SUB_BUCKET_BITS) + (value_ns >> shift)


def bucket_bounds(bucket: int) -> tuple[int, int]:
    """[low, high) of a bucket in nanoseconds (the overflow bucket: [2**44, inf) as -1)."""
    if bucket < 2 * SUB_BUCKETS:
        return bucket, bucket + 1
    if bucket >= OVERFLOW_BUCKET:
        return OVERFLOW_NS, -1
    shift = (bucket >> SUB_BUCKET_BITS) - 1
    top = bucket - (shift << SUB_BUCKET_BITS)
    return top << shift, (top + 1) << shift


class LatencyHistogram:
    """Durations in nanoseconds: count, sum, max and bucket counts. Record with `record_ns`."""

    __slots__ = ("count", "counts", "max_ns", "sum_ns", "summary")

    def __init__(self) -> None:
        self.counts = [0] * BUCKETS
        self.count = 0
        self.sum_ns = 0
        self.max_ns = 0
        # A reader's last `summary_ms()` of this histogram (see the module docstring).
        self.summary: Summary | None = None

    def record_ns(self, value_ns: int) -> None:
        """O(1): a bucket lookup (inlined `bucket_of`) and four additions."""
        if value_ns < 16:
            if value_ns < 0:
                value_ns = 0
            bucket = value_ns
        elif value_ns >= OVERFLOW_NS:
            bucket = OVERFLOW_BUCKET
        else:
            shift = value_ns.bit_length() - _TOP_BITS
            bucket = (shift << SUB_BUCKET_BITS) + (value_ns >> shift)
        self.counts[bucket] += 1
        self.count += 1
        self.sum_ns += value_ns
        if value_ns > self.max_ns:
            self.max_ns = value_ns

    def copy(self) -> LatencyHistogram:
        """A snapshot (the bucket list copied in C: about a microsecond)."""
        copied = LatencyHistogram.__new__(LatencyHistogram)
        copied.counts = self.counts.copy()
        copied.count = self.count
        copied.sum_ns = self.sum_ns
        copied.max_ns = self.max_ns
        copied.summary = None
        return copied

    @property
    def mean_ms(self) -> float:
        return self.sum_ns / self.count / 1e6 if self.count else 0.0

    @property
    def max_ms(self) -> float:
        return self.max_ns / 1e6

    def percentiles_ns(self, quantiles: tuple[float, ...]) -> list[int]:
        """The nearest-rank percentiles of `quantiles` (each in (0, 1]); all 0 when empty."""
        if not self.count:
            return [0] * len(quantiles)
        # Cumulative counts in C (itertools), then a binary search per rank: microseconds.
        cumulative = list(accumulate(self.counts))
        return [
            self._representative(bisect_left(cumulative, max(1, math.ceil(q * self.count - 1e-9))))
            for q in quantiles
        ]

    def _representative(self, bucket: int) -> int:
        low, high = bucket_bounds(bucket)
        if high < 0:
            return self.max_ns
        return min(low + (high - low) // 2, self.max_ns)

    def percentiles_ms(self) -> list[tuple[str, float]]:
        """Kafka's percentile attributes and their values in milliseconds."""
        values = self.percentiles_ns(_QUANTILES)
        return [(name, v / 1e6) for (name, _q), v in zip(PERCENTILES, values, strict=True)]

    def summary_ms(self) -> Summary:
        """(count, mean ms, max ms, then the `PERCENTILES` in ms)."""
        percentiles = [v / 1e6 for v in self.percentiles_ns(_QUANTILES)]
        return (self.count, self.mean_ms, self.max_ms, *percentiles)


_QUANTILES = tuple(q for _name, q in PERCENTILES)
# (count, mean ms, max ms, then one value per PERCENTILES entry), as `summary_ms` returns it.
Summary = tuple[float, ...]
