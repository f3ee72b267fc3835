"""`odradek.histogram`: percentiles against a sorted-list reference, the empty and overflow cases,
and the per-request cost of the request metrics (a microbenchmark; its figures are in the README)."""

from __future__ import annotations

import asyncio
import math
import time
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odradek.controller.event_manager import ControllerEventManager
from odradek.controller.stats import ControllerStats
from odradek.histogram import (
    BUCKETS,
    OVERFLOW_BUCKET,
    OVERFLOW_NS,
    PERCENTILES,
    LatencyHistogram,
    bucket_bounds,
    bucket_of,
)
from odradek.network.request_context import RequestContext
from odradek.protocol.codec import ApiKey
from odradek.server.metrics.request_metrics import RequestMetrics
from odradek.server.metrics.snapshot import collect
from odradek.server.metrics.timers import Deferred, expand

QUANTILES = tuple(q for _name, q in PERCENTILES)
# Durations up to ~18 hours: past the overflow bound (2**44 ns, ~4.9 hours).
DURATIONS = st.integers(min_value=0, max_value=2**46)


def _reference(values: list[int], q: float) -> int:
    """Nearest rank: the value of rank ceil(q * n) in sorted order (exact arithmetic)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(Fraction(str(q)) * len(ordered)))
    return ordered[rank - 1]


@given(st.integers(min_value=0, max_value=2**50))
def test_every_value_falls_in_its_buckets_bounds(value: int) -> None:
    bucket = bucket_of(value)
    assert 0 <= bucket < BUCKETS
    low, high = bucket_bounds(bucket)
    if bucket == OVERFLOW_BUCKET:
        assert value >= OVERFLOW_NS and high == -1
    else:
        assert low <= value < high
        assert high - low <= max(1, low // 8)  # at most 1/8 of the value wide


def test_buckets_are_contiguous_up_to_the_overflow_bucket() -> None:
    for bucket in range(OVERFLOW_BUCKET - 1):
        assert bucket_bounds(bucket)[1] == bucket_bounds(bucket + 1)[0]
    assert bucket_bounds(OVERFLOW_BUCKET - 1)[1] == OVERFLOW_NS


@settings(max_examples=300, deadline=None)
@given(st.lists(DURATIONS, min_size=1, max_size=400), st.sampled_from(QUANTILES))
def test_percentiles_are_in_the_bucket_of_the_exact_nearest_rank(
    values: list[int], q: float
) -> None:
    histogram = LatencyHistogram()
    for value in values:
        histogram.record_ns(value)
    (estimate,) = histogram.percentiles_ns((q,))
    exact = _reference(values, q)
    assert bucket_of(estimate) == bucket_of(exact)
    assert estimate <= max(values)
    if exact < OVERFLOW_NS:
        assert abs(estimate - exact) <= exact / 8 + 1
    assert histogram.count == len(values) and histogram.max_ns == max(values)
    assert histogram.sum_ns == sum(values)


@given(st.lists(DURATIONS, min_size=1, max_size=200))
def test_percentiles_never_decrease_with_the_quantile(values: list[int]) -> None:
    histogram = LatencyHistogram()
    for value in values:
        histogram.record_ns(value)
    found = histogram.percentiles_ns(QUANTILES)
    assert found == sorted(found)


def test_an_empty_histogram_reports_zeros() -> None:
    histogram = LatencyHistogram()
    assert histogram.percentiles_ns(QUANTILES) == [0] * len(QUANTILES)
    assert histogram.mean_ms == 0.0 and histogram.max_ms == 0.0 and histogram.count == 0
    assert [name for name, _v in histogram.percentiles_ms()] == [
        "50thPercentile",
        "75thPercentile",
        "95thPercentile",
        "98thPercentile",
        "99thPercentile",
        "999thPercentile",
    ]


def test_the_overflow_bucket_reports_the_largest_value() -> None:
    histogram = LatencyHistogram()
    histogram.record_ns(1_000)
    histogram.record_ns(OVERFLOW_NS * 3)
    histogram.record_ns(OVERFLOW_NS + 5)
    assert histogram.counts[OVERFLOW_BUCKET] == 2
    p50, p99 = histogram.percentiles_ns((0.5, 0.99))
    assert p50 == OVERFLOW_NS * 3 and p99 == OVERFLOW_NS * 3  # ranks 2 and 3: both overflowed
    histogram.record_ns(-7)  # a clock that went backwards counts as 0
    assert histogram.counts[0] == 1 and histogram.percentiles_ns((0.25,)) == [0]


def _context(api_key: int, received_ns: int) -> RequestContext:
    header = SimpleNamespace(api_key=api_key, api_version=0, correlation_id=1, client_id="c")
    return RequestContext(header, "127.0.0.1:1", "127.0.0.1", received_ns=received_ns)  # type: ignore[arg-type]


def test_per_request_cost_of_the_request_metrics() -> None:
    """The request metrics' cost per request: a synchronous handler dispatched through
    `metered` against the bare handler, and the connection's ResponseSendTimeMs record
    (`response_sent`). Printed for the README (`pytest -s`); the bound only catches an
    accidental O(n) (the shared machine's noise is far above a few hundred ns)."""
    metrics = RequestMetrics()
    response = SimpleNamespace(error_code=0)

    def dispatch(context: RequestContext, frame: bytes) -> Any:
        return response

    metered = metrics.metered(dispatch)
    context = _context(ApiKey.PRODUCE, time.perf_counter_ns())
    rounds, n = 5, 50_000

    def per_call(call: Any, *args: Any) -> float:
        best = math.inf
        for _ in range(rounds):
            started = time.perf_counter_ns()
            for _ in range(n):
                call(*args)
            best = min(best, (time.perf_counter_ns() - started) / n)
        return best

    bare = per_call(dispatch, context, b"")
    timed = per_call(metered, context, b"")
    sent = per_call(metrics.response_sent, ApiKey.PRODUCE, 12_345)
    cost = timed - bare + sent
    print(
        f"\nrequest metrics per request: dispatch {bare:.0f} ns bare, {timed:.0f} ns metered;"
        f" response_sent {sent:.0f} ns; added {cost:.0f} ns"
    )
    stats = metrics.stats(ApiKey.PRODUCE)
    assert stats.total.count == stats.requests == rounds * n
    assert cost < 20_000


def test_the_async_path_records_each_request_once() -> None:
    metrics = RequestMetrics()

    async def answer() -> Any:
        await asyncio.sleep(0)
        return SimpleNamespace(error_code=0)

    async def run() -> None:
        metered = metrics.metered(lambda context, frame: answer())
        for _ in range(100):
            await metered(_context(ApiKey.FETCH, time.perf_counter_ns()), b"")

    asyncio.run(run())
    stats = metrics.stats(ApiKey.FETCH)
    assert stats.requests == stats.total.count == stats.remote.count == 100
    assert sum(stats.errors.values()) == 100


def test_controller_stats_time_broker_changes_and_every_events_queue_wait() -> None:
    """The event manager's hook feeds ControllerStats: every event's queue time, and the
    processing time of the BrokerChange-state events as LeaderElectionRateAndTimeMs; served with
    the unclean election count on the broker's scrape."""
    stats = ControllerStats()

    async def run() -> None:
        class Processor:
            async def process(self, event: Any) -> None:
                if event.name == "BrokerChange":
                    # Timed from inside the event: a release scheduled from outside could come
                    # less than 20 ms after a late start (this flaked on a loaded machine).
                    await asyncio.sleep(0.021)

            def preempt(self, event: Any) -> None:
                pass

            async def on_error(self, event: Any, error: BaseException) -> None:
                pass

        manager = ControllerEventManager(Processor(), asyncio.get_running_loop())
        manager.on_processed = stats.event_processed
        manager.start()
        for name in ("BrokerChange", "TopicChange", "BrokerModification"):
            manager.put(SimpleNamespace(name=name))
        async with asyncio.timeout(10):
            while manager.events_processed < 3:
                await asyncio.sleep(0.001)
        await manager.close()

    asyncio.run(run())
    assert stats.event_queue.count == 3 and stats.leader_election.count == 2
    assert stats.leader_election.max_ns >= 20_000_000
    assert stats.event_queue.max_ns >= 20_000_000  # TopicChange waited behind it
    stats.unclean_leader_elections = 2
    broker = SimpleNamespace(
        replica_manager=None,
        controller=SimpleNamespace(
            stats=stats, is_active=False, context=SimpleNamespace(), event_manager=None
        ),
        group_coordinator=None,
        socket_servers=[],
        zk=None,
    )
    samples = {s.name: s.value for f in collect(broker, RequestMetrics()) for s in f.samples}
    elections = "kafka_controller_controllerstats_leaderelectionrateandtimems_"
    assert samples[elections + "count"] == 2 and samples[elections + "max"] >= 20
    assert samples[elections + "99thpercentile"] >= 20 * (1 - 1 / 16)
    assert samples["kafka_controller_controllerstats_uncleanleaderelectionspersec_count"] == 2
    assert samples["kafka_controller_controllereventmanager_eventqueuetimems_count"] == 3


def test_a_named_scrape_copies_and_builds_only_the_timers_it_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics = RequestMetrics()
    for api_key in (ApiKey.PRODUCE, ApiKey.FETCH):
        metrics.stats(api_key).total.record_ns(3_000_000)
    copies: list[LatencyHistogram] = []
    real_copy = LatencyHistogram.copy

    def counting_copy(self: LatencyHistogram) -> LatencyHistogram:
        copies.append(self)
        return real_copy(self)

    monkeypatch.setattr(LatencyHistogram, "copy", counting_copy)
    broker = SimpleNamespace(
        replica_manager=None, controller=None, group_coordinator=None, socket_servers=[], zk=None
    )
    p99 = "kafka_network_requestmetrics_totaltimems_99thpercentile"
    items = collect(broker, metrics, {p99}, defer=True)
    assert len(copies) == 2  # TotalTimeMs of the two APIs, nothing else
    assert isinstance(items[-1], Deferred)
    samples = {(s.name, s.labels["request"]): s.value for f in expand(items) for s in f.samples}
    assert samples == {
        (p99, "Produce"): pytest.approx(3.0, rel=1 / 16),
        (p99, "Fetch"): pytest.approx(3.0, rel=1 / 16),
    }
    copies.clear()
    assert expand(collect(broker, metrics, {"kafka_server_replicamanager_leadercount_value"})) == []
    assert copies == []
