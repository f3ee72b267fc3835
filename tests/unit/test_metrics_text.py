"""The exporter's own Prometheus text (`metrics.text.TextFormat`, its caches, the timers' kept
summaries and `RowFamily`) against prometheus_client's encoders (`generate_latest`, OpenMetrics',
their escapings): the same bytes, on the first scrape and on every later one, whatever changed in
between."""

from __future__ import annotations

import asyncio
import gzip
import math
import random
import urllib.request
from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.exposition import choose_encoder, generate_latest

from odradek.histogram import LatencyHistogram
from odradek.protocol.codec import ApiKey
from odradek.server.metrics.exporter import MetricsExporter
from odradek.server.metrics.request_metrics import RequestMetrics
from odradek.server.metrics.snapshot import collect
from odradek.server.metrics.text import RowFamily, TextFormat
from odradek.server.metrics.timers import Pending, expand, take
from tests.unit.test_metrics_exposition import _fake_broker


class _Registry:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _reference(families: list[Metric], encoder: Any = generate_latest) -> bytes:
    return encoder(_Registry(families))


# Accept headers -> prometheus_client's encoders: the default text, what a Prometheus server
# sends (OpenMetrics 1.0.0 first), and UTF-8 names both ways.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
ENCODERS = [
    choose_encoder(accept)[0]
    for accept in (
        "",
        PROMETHEUS_ACCEPT,
        "application/openmetrics-text; version=1.0.0; escaping=allow-utf-8",
        "text/plain; version=1.0.0; escaping=allow-utf-8",
        "application/openmetrics-text; version=1.0.0; escaping=dots",
    )
]


LABEL_VALUES = st.text(alphabet=st.sampled_from('ab"\\\n\té€_-.{}= '), max_size=6)
VALUES = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 0.0, -0.0, 1e7, 12345678.0, 1e-7, 2.5e21]),
)
FAMILY = st.tuples(
    st.sampled_from(["gauge", "unknown", "counter", "rows-gauge", "rows-unknown"]),
    st.sampled_from(["", "doc", 'a "quoted"\\ doc\nnext line']),
    st.lists(st.tuples(LABEL_VALUES, LABEL_VALUES, VALUES), max_size=5),
    st.booleans(),  # a timestamp on the first sample
)


def _family(index: int, spec: tuple[str, str, list[tuple[str, str, Any]], bool]) -> Metric:
    kind, doc, samples, timestamped = spec
    name = f"family_{index}" if index % 2 else f"family.{index}_é"
    labels = ["topic", "partition"] if index % 3 else ["topic", "part.ition"]
    if kind.startswith("rows-"):
        rows = [((a, b), v) for a, b, v in samples]
        return RowFamily(name, doc, tuple(labels), rows, kind.removeprefix("rows-"))
    family: Metric
    if kind == "gauge":
        family = GaugeMetricFamily(name, doc, labels=labels)
    elif kind == "counter":
        family = CounterMetricFamily(name, doc, labels=labels)
    else:
        family = UnknownMetricFamily(name, doc, labels=labels)
    for i, (a, b, v) in enumerate(samples):
        family.add_metric([a, b], v, timestamp=1.5 if timestamped and i == 0 else None)
    return family


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(FAMILY, max_size=4), min_size=1, max_size=4),
    st.sampled_from(range(len(ENCODERS))),
)
def test_the_text_is_the_encoders_on_every_scrape(scrapes: list[list[Any]], which: int) -> None:
    """Any families (escapes in names, labels and help, odd values, counters and timestamps
    that take the slow path), scraped several times with one `TextFormat`: each scrape's text
    is what the encoder writes for it, whatever the caches kept from the scrapes before."""
    encoder = ENCODERS[which]
    text_format = TextFormat(encoder)
    for specs in scrapes:
        families = [_family(i, spec) for i, spec in enumerate(specs)]
        assert text_format.render(families) == _reference(families, encoder)


def test_a_full_cache_is_emptied_and_the_text_stays_the_same() -> None:
    text_format = TextFormat(max_samples=3)
    for values in ([1, 2, 3, 4, 5], [1, 2, 9, 4, 5], [5]):
        family = GaugeMetricFamily("g", "doc", labels=["p"])
        for i, value in enumerate(values):
            family.add_metric([str(i)], value)
        assert text_format.render([family]) == _reference([family])


def test_row_families_samples_are_those_add_metric_makes() -> None:
    rows: list[tuple[tuple[str, ...], float]] = [(("a", "0"), 1), (("b", "1"), 2.5)]
    untyped = UnknownMetricFamily("x", "doc", labels=["topic", "partition"])
    gauge = GaugeMetricFamily("y", "doc", labels=["topic", "partition"])
    for labels, value in rows:
        untyped.add_metric(list(labels), value)
        gauge.add_metric(list(labels), value)
    assert RowFamily("x", "doc", ("topic", "partition"), rows) == untyped
    assert RowFamily("y", "doc", ("topic", "partition"), rows, "gauge") == gauge
    replaced = RowFamily("x", "doc", ("topic", "partition"), rows)
    replaced.samples = replaced.samples[:1]  # (the snapshot's topic filter does this)
    assert replaced.rows is None and TextFormat().render([replaced]) == _reference([replaced])


def test_a_histogram_summary_is_kept_until_the_next_record() -> None:
    histogram = LatencyHistogram()
    histogram.record_ns(3_000_000)
    taken = take(histogram)
    assert isinstance(taken, Pending) and histogram.summary is None
    summary = taken.summary()
    assert summary[0] == 1 and histogram.summary is summary
    assert take(histogram) is summary  # nothing recorded: neither copied nor walked again
    histogram.record_ns(5_000_000)
    again = take(histogram)
    assert isinstance(again, Pending) and again.summary()[0] == 2
    assert again.summary() == (
        2,
        histogram.mean_ms,
        histogram.max_ms,
        *(value for _name, value in histogram.percentiles_ms()),
    )


def _busy_metrics(rng: random.Random) -> RequestMetrics:
    metrics = RequestMetrics()
    for api_key in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.OFFSET_COMMIT):
        stats = metrics.stats(api_key)
        stats.requests = 3
        stats.errors[ErrorCode.none] = 3
        for histogram in (stats.queue, stats.local, stats.remote, stats.total):
            for _ in range(3):
                histogram.record_ns(int(rng.lognormvariate(12, 2)))
    return metrics


def test_a_brokers_scrapes_match_generate_latest_as_it_changes() -> None:
    """The broker's families (the fake broker's, busy request metrics), scraped again and
    again while some histograms, counters and offsets change and others do not: the cached
    text of each scrape is generate_latest's text of the same snapshot."""
    rng = random.Random(7)
    broker = _fake_broker()
    metrics = _busy_metrics(rng)
    text_format = TextFormat()
    for scrape in range(30):
        families = expand(collect(broker, metrics, defer=True))
        assert text_format.render(families) == _reference(families), scrape
        if scrape % 3 == 0:
            metrics.stats(ApiKey.PRODUCE).total.record_ns(int(rng.lognormvariate(12, 2)))
        if scrape % 5 == 0:
            broker.replica_manager.broker_topic_stats.record_append("orders", 1, 100)
            broker.replica_manager.partitions["orders", 0].log_end_offset += 1
        if scrape == 10:
            metrics.stats(ApiKey.LIST_OFFSETS).local.record_ns(1)  # a new API's rows
    names = {"kafka_network_requestmetrics_totaltimems_99thpercentile"}
    families = expand(collect(broker, metrics, names, defer=True))
    assert text_format.render(families) == _reference(families)
    assert all(math.isfinite(s.value) for f in families for s in f.samples)


def test_the_exporter_serves_the_encoders_text_gzipped_when_asked() -> None:
    """Over HTTP, as prometheus_client's app would answer: the format the Accept header asks
    for (the default text; OpenMetrics for a Prometheus server), its content type, and gzip
    when the client accepts it."""
    broker = _fake_broker()
    metrics = _busy_metrics(random.Random(3))
    requests: list[dict[str, str]] = [
        {},
        {"Accept-Encoding": "gzip"},
        {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"},
        {},
        {"Accept": PROMETHEUS_ACCEPT},
    ]

    async def run() -> list[tuple[bytes, str | None, str | None]]:
        exporter = MetricsExporter(
            "127.0.0.1", 0, lambda names, replicas: collect(broker, metrics, names, replicas)
        )
        exporter.start()
        answers = []
        try:
            url = f"http://127.0.0.1:{exporter.port}/metrics"
            for headers in requests:
                request = urllib.request.Request(url, headers=headers)
                response = await asyncio.to_thread(urllib.request.urlopen, request, None, 10)
                body = response.read()
                encoding = response.headers.get("Content-Encoding")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                answers.append((body, response.headers.get("Content-Type"), encoding))
        finally:
            await exporter.stop()
        return answers

    answers = asyncio.run(run())
    families = expand(collect(broker, metrics))
    for headers, (body, content_type, encoding) in zip(requests, answers, strict=True):
        encoder, expected_type = choose_encoder(headers.get("Accept", ""))
        assert body == _reference(families, encoder) and content_type == expected_type
        assert encoding == ("gzip" if "Accept-Encoding" in headers else None)
    prometheus = answers[2]
    assert prometheus[1] is not None and prometheus[1].startswith("application/openmetrics-text")
    assert prometheus[0].endswith(b"# EOF\n")
