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

Percentiles are computed at scrape time, and only for a histogram that changed since the last
scrape. Building a broker's timer families (a hundred histograms: 20 APIs x 5 times) costs
milliseconds of Python, so it is `Deferred`: on the event loop the snapshot `take`s each histogram
the scrape asks for -- its kept summary if nothing was recorded since (`LatencyHistogram.summary`:
the count tells), else a copy (a list copy) -- and the families are built on the HTTP thread, which
computes the summaries of the copies and keeps each on its histogram for the next scrape. Between
two scrapes of a broker most APIs see no request: their histograms are neither copied nor walked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence

from prometheus_client.core import Metric

from odradek.histogram import PERCENTILES, LatencyHistogram, Summary
from odradek.server.metrics.names import jmx_metric_name
from odradek.server.metrics.text import RowFamily

Row = tuple[Sequence[str], LatencyHistogram]


class Pending:
    """A histogram changed since its summary was kept: a copy of it taken on the event loop, to
    compute the summary from off the loop and keep it on `source`."""

    __slots__ = ("copy", "source")

    def __init__(self, copy: LatencyHistogram, source: LatencyHistogram) -> None:
        self.copy = copy
        self.source = source

    def summary(self) -> Summary:
        summary = self.copy.summary_ms()
        # One attribute store: the loop reads it on the next scrape, and trusts it only while
        # its count is the histogram's.
        self.source.summary = summary
        return summary


# A timer row as the snapshot took it on the loop: label values, and a summary or a `Pending`.
TakenRow = tuple[Sequence[str], "Summary | Pending"]


def take(histogram: LatencyHistogram) -> Summary | Pending:
    """On the event loop: `histogram`'s kept summary if nothing was recorded since it was
    computed, else a copy to compute it from."""
    summary = histogram.summary
    if summary is not None and summary[0] == histogram.count:
        return summary
    return Pending(histogram.copy(), histogram)


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
    rows: Iterable[TakenRow],
    names: Collection[str] | None = None,
) -> Iterator[Metric]:
    """The Count, Mean, Max and percentile families of one MBean name, a sample per row (its
    label values and histogram, as `take` took it); percentiles only if `names` is None or names
    one of them. Off the event loop."""
    summaries = [
        (tuple(labels), taken.summary() if isinstance(taken, Pending) else taken)
        for labels, taken in rows
    ]
    label_names = tuple(label_names)

    def family(attribute: str, column: int) -> RowFamily:
        return RowFamily(
            jmx_metric_name(mbean_domain, mbean_type, mbean, attribute),
            f"{mbean_domain}:type={mbean_type},name={mbean} {attribute}: {doc}",
            label_names,
            [(labels, summary[column]) for labels, summary in summaries],
        )

    yield family("Count", 0)
    yield family("Mean", 1)
    yield family("Max", 2)
    names_of_percentiles = [
        jmx_metric_name(mbean_domain, mbean_type, mbean, attribute) for attribute, _q in PERCENTILES
    ]
    if names is not None and not any(name in names for name in names_of_percentiles):
        return
    for column, (attribute, _q) in enumerate(PERCENTILES, start=3):
        yield family(attribute, column)
