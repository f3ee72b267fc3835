"""Kafka's windowed rate, as its quota managers measure it (`org.apache.kafka.common.metrics`:
`SampledStat`, `WindowedSum`, `Rate`, `SimpleRate`; `kafka.utils.QuotaUtils`). Pure: the caller
passes the time in milliseconds.

A rate keeps `samples` samples (Kafka's `quota.window.num`, 11) of `window_ms` each
(`quota.window.size.seconds`, 1 s), plus one spare for a sample that overlaps the start of the
monitored window. Recording adds the value to the current sample, starting the next one (reusing
the oldest slot) once the current one is `window_ms` old. A sample whose last event is
`samples * window_ms` or more ago is reset when the rate is measured.

The rate is the sum of the samples over the elapsed time since the oldest sample began — but, as
in Kafka's `Rate.windowSize`, never over less than `samples - 1` whole windows (the elapsed time is
padded to that many), so that the first second of traffic does not measure as a huge rate. So a
client may send `samples - 1` windows' worth of its quota at once before it is throttled, then
nothing more until that burst has aged out of the window: averaged over the window the rate is
the quota. `SimpleRate` (replication throttles) pads only to one window.

Throttle time (`QuotaUtils.throttleTime`): with observed rate O over window W and bound T, the
delay X that brings O * W / (W + X) down to T is X = (O - T) / T * W.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_WINDOW_NUM = 11
"""Kafka's `quota.window.num`: 10 whole windows and the current one."""
DEFAULT_WINDOW_SIZE_MS = 1000
"""Kafka's `quota.window.size.seconds`, in milliseconds."""


@dataclass(frozen=True, slots=True)
class RateConfig:
    samples: int = DEFAULT_WINDOW_NUM
    window_ms: int = DEFAULT_WINDOW_SIZE_MS


class _Sample:
    __slots__ = ("last_event_ms", "start_ms", "value")

    def __init__(self, now_ms: int) -> None:
        self.value = 0.0
        self.start_ms = now_ms
        self.last_event_ms = now_ms

    def reset(self, now_ms: int) -> None:
        self.value = 0.0
        self.start_ms = now_ms
        self.last_event_ms = now_ms


class Rate:
    """A windowed sum per second (Kafka's `Rate` over a `WindowedSum`). Not thread-safe."""

    __slots__ = ("_current", "_samples", "config")

    def __init__(self, config: RateConfig) -> None:
        self.config = config
        self._samples: list[_Sample] = []
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        sample = self._current_sample(now_ms)
        if now_ms - sample.start_ms >= self.config.window_ms:
            sample = self._advance(now_ms)
        sample.value += value
        sample.last_event_ms = now_ms

    def measure(self, now_ms: int) -> float:
        """The rate per second at `now_ms`."""
        return self.measure_with_window(now_ms)[0]

    def measure_with_window(self, now_ms: int) -> tuple[float, int]:
        """(the rate per second, the window in ms it is measured over) at `now_ms`."""
        window_ms = self.window_size_ms(now_ms)  # purges obsolete samples first
        total = 0.0
        for sample in self._samples:
            total += sample.value
        return total / (window_ms / 1000.0), window_ms

    def window_size_ms(self, now_ms: int) -> int:
        self._purge(now_ms)
        elapsed = now_ms - self._oldest(now_ms).start_ms
        window = self.config.window_ms
        full_windows = elapsed // window
        minimum_full = self.config.samples - 1
        if full_windows < minimum_full:
            elapsed += (minimum_full - full_windows) * window
        return max(elapsed, 1)

    def _current_sample(self, now_ms: int) -> _Sample:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        return self._samples[self._current]

    def _advance(self, now_ms: int) -> _Sample:
        self._current = (self._current + 1) % (self.config.samples + 1)
        if self._current >= len(self._samples):
            sample = _Sample(now_ms)
            self._samples.append(sample)
            return sample
        sample = self._samples[self._current]
        sample.reset(now_ms)
        return sample

    def _oldest(self, now_ms: int) -> _Sample:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        return min(self._samples, key=lambda s: s.start_ms)

    def _purge(self, now_ms: int) -> None:
        expire_age = self.config.samples * self.config.window_ms
        for sample in self._samples:
            if now_ms - sample.last_event_ms >= expire_age:
                sample.reset(now_ms)

    def last_event_ms(self) -> int:
        return max((s.last_event_ms for s in self._samples), default=0)


class SimpleRate(Rate):
    """Kafka's `SimpleRate` (replication quotas): the elapsed time since the oldest sample, but at
    least one window."""

    __slots__ = ()

    def window_size_ms(self, now_ms: int) -> int:
        self._purge(now_ms)
        elapsed = now_ms - self._oldest(now_ms).start_ms
        return max(elapsed, self.config.window_ms)


def throttle_time_ms(observed: float, bound: float, window_ms: int) -> int:
    """How long to delay a client whose rate `observed` exceeds `bound` over `window_ms` so that
    its rate comes back to the bound: (O - T) / T * W, rounded (Kafka's `QuotaUtils.throttleTime`).
    0 when the rate is within the bound."""
    if observed <= bound:
        return 0
    if bound <= 0:
        return window_ms  # a zero quota: Kafka divides by zero here; hold the client a window
    # Java's Math.round: half up (Python's round() would round half to even).
    return math.floor((observed - bound) / bound * window_ms + 0.5)
