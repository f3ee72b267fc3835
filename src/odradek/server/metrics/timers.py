"""Kafka's Yammer histograms and timers as the JMX exporter renders them, from `LatencyHistogram`s.

A Kafka timer or histogram MBean (`kafka.network:type=RequestMetrics,name=TotalTimeMs,
request=Produce`) has the attributes Count, Mean, Max, Min, StdDev and 50thPercentile ...
999thPercentile; with `lowercaseOutputName` and the rule `kafka.<domain><type=(.+), name=(.+)><>
(Count|Value|Mean|Max|...Percentile)` each becomes a sample named
`kafka_network_requestmetrics_totaltimems_50thpercentile{request="Produce"}`. Served here: Count,
Mean, Max and the six percentiles, in milliseconds. Kafka's percentiles come from an
exponentially-decaying reservoir (about the last five minutes); these come from fixed buckets over
everything since the broker started (see `odradek.histogram`), so use `rate()` on Count and read
percentiles as "since start".

Percentiles are computed at scrape time, and only when a scrape asks for them (all samples, or a
`name[]` naming one). Building a broker's timer families (a hundred histograms: 20 APIs x 5 times)
costs milliseconds of Python, so it is `Deferred`: the snapshot copies the histograms on the event
loop (a list copy each) and the families are built from the copies on the HTTP thread.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence

from prometheus_client.core import Metric, UnknownMetricFamily

from odradek.histogram import PERCENTILES, LatencyHistogram
from odradek.server.metrics.names import jmx_metric_name

Row = tuple[Sequence[str], LatencyHistogram]


class Deferred:
    """Families to build later, off the event loop, from copies taken on it (`build`); with
    `wanted`, only the samples of those names (a scrape's `name[]`)."""

    __slots__ = ("build", "wanted")

    def __init__(
        self, build: Callable[[], Iterable[Metric]], wanted: Collection[str] | None = None
    ) -> None:
        self.build = build
        self.wanted = wanted

    def families(self) -> list[Metric]:
        built = list(self.build())
        if self.wanted is None:
            return built
        wanted = set(self.wanted)
        restricted = (family._restricted_metric(wanted) for family in built)
        return [family for family in restricted if family is not None]


def expand(items: Iterable[Metric | Deferred]) -> list[Metric]:
    """`items` with every `Deferred` built (call off the event loop)."""
    expanded: list[Metric] = []
    for item in items:
        if isinstance(item, Deferred):
            expanded.extend(item.families())
        else:
            expanded.append(item)
    return expanded


def timer_families(
    mbean_domain: str,
    mbean_type: str,
    mbean: str,
    doc: str,
    label_names: Sequence[str],
    rows: Iterable[Row],
    names: Collection[str] | None = None,
) -> Iterator[Metric]:
    """The Count, Mean, Max and percentile families of one MBean name, a sample per row (its
    label values and histogram); percentiles only if `names` is None or names one of them."""
    rows = list(rows)

    def family(attribute: str) -> UnknownMetricFamily:
        return UnknownMetricFamily(
            jmx_metric_name(mbean_domain, mbean_type, mbean, attribute),
            f"{mbean_domain}:type={mbean_type},name={mbean} {attribute}: {doc}",
            labels=list(label_names),
        )

    count, mean, maximum = family("Count"), family("Mean"), family("Max")
    for labels, histogram in rows:
        count.add_metric(list(labels), histogram.count)
        mean.add_metric(list(labels), histogram.mean_ms)
        maximum.add_metric(list(labels), histogram.max_ms)
    yield count
    yield mean
    yield maximum
    percentiles = [family(attribute) for attribute, _q in PERCENTILES]
    if names is not None and not any(f.name in names for f in percentiles):
        return
    for labels, histogram in rows:
        for target, (_attribute, value) in zip(
            percentiles, histogram.percentiles_ms(), strict=True
        ):
            target.add_metric(list(labels), value)
    yield from percentiles
