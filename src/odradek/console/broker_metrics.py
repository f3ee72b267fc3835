"""The brokers' Prometheus endpoints, as the console reads them: throughput and per-replica logs.

Each broker serves `/metrics` (`metrics.listener`; `odradek cluster up` records the address per
broker as `metrics` in cluster.json). The console scrapes them only when a page needs them and the
last scrape is older than `interval_s` (`MetricsSampler.sample`), never in the background: an idle
console costs the brokers nothing, a watched one a scrape per broker every few seconds, which the
broker answers off its request path (see `odradek.server.metrics.exporter`). Each scrape names
the samples it wants (`name[]`), so the overview's rounds cost a broker hosting 10,000 replicas
nothing measurable. A topic's page asks for the per-replica gauges of only its page of
partitions (`topic=T&partition=0-99`, `topic_logs`), which the broker builds for those replicas
alone, and the reassignments page for only the partitions being moved (`moving_logs`: one such
scrape per topic).

From each scrape it keeps:

* the all-topics BrokerTopicMetrics counters (`kafka_server_brokertopicmetrics_*_count{topic=""}`:
  messages in, bytes in, bytes out); two scrapes give a rate, and the cluster's rates over the last
  `HISTORY` samples are what the overview charts;
* a few gauges per broker: partitions and leaders hosted, under-replicated partitions, and on the
  controller its ControllerState and event queue size (the controller's live work);
* the `kafka_log_log_{size,logendoffset,logstartoffset}_value{topic,partition}` of the replicas a
  page shows: a replica's log end offset and size (the topic page, the reassignments page).

The parser reads Prometheus' text format line by line and keeps only the families it wants, so a
scrape of a broker hosting 10,000 replicas is parsed in tens of milliseconds (off the loop, in a
thread, with the HTTP request).
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from odradek.server.metrics.filters import format_partition_ranges

HISTORY = 60
SCRAPE_TIMEOUT_S = 3.0

MESSAGES_IN = "kafka_server_brokertopicmetrics_messagesinpersec_count"
BYTES_IN = "kafka_server_brokertopicmetrics_bytesinpersec_count"
BYTES_OUT = "kafka_server_brokertopicmetrics_bytesoutpersec_count"
LOG_SIZE = "kafka_log_log_size_value"
LOG_END_OFFSET = "kafka_log_log_logendoffset_value"
LOG_START_OFFSET = "kafka_log_log_logstartoffset_value"
_COUNTERS = {MESSAGES_IN: "messages_in", BYTES_IN: "bytes_in", BYTES_OUT: "bytes_out"}
# Unlabelled gauges shown per broker on the overview.
_GAUGES = {
    "kafka_server_replicamanager_partitioncount_value": "partitions",
    "kafka_server_replicamanager_leadercount_value": "leaders",
    "kafka_server_replicamanager_underreplicatedpartitions_value": "under_replicated",
    "kafka_controller_kafkacontroller_activecontrollercount_value": "active_controller",
    "kafka_controller_kafkacontroller_controllerstate_value": "controller_state",
    "kafka_controller_controllereventmanager_eventqueuesize_value": "event_queue_size",
}
# Kafka's ControllerState numbers (kafka.controller.ControllerState) and their names.
CONTROLLER_STATES = {
    0: "Idle",
    1: "ControllerChange",
    2: "BrokerChange",
    3: "TopicChange",
    4: "TopicDeletion",
    5: "AlterPartitionReassignment",
    6: "AutoLeaderBalance",
    7: "ManualLeaderBalance",
    8: "ControlledShutdown",
    9: "IsrChange",
    10: "LeaderAndIsrResponseReceived",
    11: "LogDirChange",
    12: "ControllerShutdown",
    13: "UncleanLeaderElectionEnable",
    14: "TopicUncleanLeaderElectionEnable",
    15: "ListPartitionReassignment",
    16: "UpdateMetadataResponseReceived",
    17: "UpdateFeatures",
}
_LOG = {LOG_SIZE: "size", LOG_END_OFFSET: "log_end_offset", LOG_START_OFFSET: "log_start_offset"}
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class ReplicaLog:
    size: int | None = None
    log_end_offset: int | None = None
    log_start_offset: int | None = None


@dataclass(slots=True)
class BrokerScrape:
    """What one scrape of one broker said (`error` set when it could not be had)."""

    broker_id: int
    at: float
    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    logs: dict[tuple[str, int], ReplicaLog] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Rates:
    """Cluster-wide per-second rates between two rounds of scrapes."""

    at: float
    messages_in: float
    bytes_in: float
    bytes_out: float


def parse_labels(text: str) -> dict[str, str]:
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(text)}


def parse_scrape(broker_id: int, text: str, at: float) -> BrokerScrape:
    """The families the console uses, out of a Prometheus text exposition."""
    scrape = BrokerScrape(broker_id, at)
    logs: dict[tuple[str, int], dict[str, int]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        name = line[:brace] if brace >= 0 else line.split(" ", 1)[0]
        counter = _COUNTERS.get(name)
        log_field = _LOG.get(name) if counter is None else None
        gauge = _GAUGES.get(name) if counter is None and log_field is None else None
        if counter is None and log_field is None and gauge is None:
            continue
        close = line.rfind("}")
        labels = parse_labels(line[brace + 1 : close]) if brace >= 0 else {}
        try:
            value = float(line[(close + 1 if brace >= 0 else len(name)) :].split()[0])
        except (ValueError, IndexError):
            continue
        if gauge is not None:
            scrape.gauges[gauge] = value
        elif counter is not None:
            if labels.get("topic", "") == "":
                scrape.counters[counter] = value
        elif "topic" in labels and labels.get("partition", "").isdigit():
            key = (labels["topic"], int(labels["partition"]))
            logs.setdefault(key, {})[log_field] = int(value)  # type: ignore[index]
    scrape.logs = {key: ReplicaLog(**values) for key, values in logs.items()}
    return scrape


def cluster_rates(previous: Iterable[BrokerScrape], latest: Iterable[BrokerScrape]) -> Rates | None:
    """Summed per-second rates of the brokers scraped successfully in both rounds; a counter that
    went down (the broker restarted) counts from zero. None when no broker is in both."""
    before = {s.broker_id: s for s in previous if s.error is None}
    totals = {"messages_in": 0.0, "bytes_in": 0.0, "bytes_out": 0.0}
    seen = False
    at = 0.0
    for now in latest:
        then = before.get(now.broker_id)
        if now.error is not None or then is None or now.at <= then.at:
            continue
        seen = True
        at = max(at, now.at)
        elapsed = now.at - then.at
        for key in totals:
            current = now.counters.get(key, 0.0)
            earlier = then.counters.get(key, 0.0)
            delta = current - earlier if current >= earlier else current
            totals[key] += delta / elapsed
    if not seen:
        return None
    return Rates(at, totals["messages_in"], totals["bytes_in"], totals["bytes_out"])


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:
        return answer.read().decode("utf-8", "replace")


def _scrape(broker_id: int, url: str) -> BrokerScrape:
    at = time.time()
    try:
        text = _fetch(url)
    except (OSError, ValueError) as e:
        return BrokerScrape(broker_id, at, error=f"{url}: {e}")
    return parse_scrape(broker_id, text, at)


def scrape_url(
    endpoint: str, names: Iterable[str], topic: str | None = None, partitions: str | None = None
) -> str:
    """`endpoint` asked for only `names` (Prometheus' `name[]` parameters), and with `topic` only
    that topic's samples (of `partitions`, a RANGES text like `0-99`): the broker then builds and
    sends only those (see `odradek.server.metrics.snapshot.collect` and `filters`)."""
    query = "&".join("name[]=" + urllib.parse.quote(n) for n in names)
    if topic is not None:
        query += "&topic=" + urllib.parse.quote(topic)
        if partitions:
            query += "&partition=" + urllib.parse.quote(partitions)
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


TOTALS = (*_COUNTERS, *_GAUGES)
LOGS = tuple(_LOG)
# Topic-filtered scrapes kept (one per topic page and partition page being watched).
TOPIC_LOGS_KEPT = 32

ReplicaLogs = dict[int, dict[tuple[str, int], ReplicaLog]]


@dataclass(slots=True)
class _TopicLogs:
    """The last answer to one topic-filtered scrape round, and the round under way if any."""

    at: float = 0.0
    logs: ReplicaLogs = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class MetricsSampler:
    """Scrapes of every broker's endpoint, at most one round per `interval_s` (see the module
    docstring). A round asks only for the totals and gauges (cheap for the broker at any
    partition count); the per-replica logs are asked for one topic's partitions at a time
    (`topic_logs`, `moving_logs`). Loop-thread only; the scrapes run in threads."""

    def __init__(self, endpoints: Mapping[int, str], interval_s: float = 5.0) -> None:
        self.endpoints = dict(endpoints)
        self.interval_s = interval_s
        self.latest: dict[int, BrokerScrape] = {}
        self.history: deque[Rates] = deque(maxlen=HISTORY)
        self.scrapes = 0
        self._round: asyncio.Task[None] | None = None
        self._last_round = 0.0
        self._topic_logs: dict[tuple[str, str], _TopicLogs] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.endpoints)

    async def sample(self, max_age_s: float | None = None) -> dict[int, BrokerScrape]:
        """The latest scrape of each broker, scraping again (and waiting for it) when the last
        round is older than `max_age_s` (default `interval_s`)."""
        if not self.endpoints:
            return {}
        limit = self.interval_s if max_age_s is None else max_age_s
        if time.time() - self._last_round >= limit:
            await self._round_done()
        return self.latest

    async def moving_logs(
        self, partitions: Iterable[tuple[str, int]], wait_s: float | None = None
    ) -> tuple[ReplicaLogs, list[str]]:
        """The log end offsets and sizes of the replicas of `partitions` (topic, partition) on
        each broker, and the scrape errors: one `topic_logs` scrape per topic, in parallel, so the
        brokers build the gauges of those replicas alone (the reassignments page)."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        answers = await asyncio.gather(
            *(self.topic_logs(t, ps, wait_s) for t, ps in sorted(by_topic.items()))
        )
        logs: ReplicaLogs = {}
        errors: list[str] = []
        for topic_logs, topic_errors in answers:
            for broker_id, hosted in topic_logs.items():
                logs.setdefault(broker_id, {}).update(hosted)
            errors.extend(e for e in topic_errors if e not in errors)
        return logs, errors

    async def topic_logs(
        self, topic: str, partitions: Iterable[int], wait_s: float | None = None
    ) -> tuple[ReplicaLogs, list[str]]:
        """The log end offsets and sizes of `topic`'s replicas of `partitions` on each broker, and
        the scrape errors; scraped again (only those replicas: the broker builds nothing else) when
        older than `interval_s`. With `wait_s`, waits at most that long for a new round and
        returns what it has (the round goes on, for the page's next refresh): a page must not
        wait on a slow broker."""
        ranges = format_partition_ranges(partitions)
        if not self.endpoints or not ranges:  # no partitions: not the whole topic
            return {}, []
        key = (topic, ranges)
        kept = self._topic_logs.get(key)
        if kept is None:
            kept = self._topic_logs[key] = _TopicLogs()
            while len(self._topic_logs) > TOPIC_LOGS_KEPT:
                del self._topic_logs[next(iter(self._topic_logs))]
        if kept.task is None and time.time() - kept.at >= self.interval_s:
            kept.task = asyncio.create_task(self._scrape_topic(kept, topic, ranges))
        if kept.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(kept.task), wait_s)
            except TimeoutError:
                pass
        return kept.logs, kept.errors

    async def _scrape_topic(self, kept: _TopicLogs, topic: str, ranges: str) -> None:
        try:
            results = await asyncio.gather(
                *(
                    asyncio.to_thread(_scrape, b, scrape_url(url, LOGS, topic, ranges))
                    for b, url in sorted(self.endpoints.items())
                )
            )
            kept.logs = {r.broker_id: r.logs for r in results if r.error is None}
            kept.errors = [r.error for r in results if r.error is not None]
            kept.at = time.time()
            self.scrapes += len(results)
        finally:
            kept.task = None

    async def _round_done(self) -> None:
        if self._round is not None and not self._round.done():
            await asyncio.shield(self._round)  # join the round under way
            return
        self._round = asyncio.create_task(self._scrape_all())
        await asyncio.shield(self._round)

    async def _scrape_all(self) -> None:
        results = await asyncio.gather(
            *(
                asyncio.to_thread(_scrape, b, scrape_url(url, TOTALS))
                for b, url in sorted(self.endpoints.items())
            )
        )
        previous = list(self.latest.values())
        latest = {r.broker_id: r for r in results}
        rates = cluster_rates(previous, latest.values())
        if rates is not None:
            self.history.append(rates)
        # Keep the last good answer of a broker that failed this round, marked with the error,
        # so the rates resume from it when the broker answers again.
        for broker_id, scrape in latest.items():
            if scrape.error is not None and broker_id in self.latest:
                kept = self.latest[broker_id]
                latest[broker_id] = BrokerScrape(
                    broker_id, kept.at, kept.counters, kept.gauges, {}, scrape.error
                )
        self.latest = latest
        self.scrapes += len(results)
        self._last_round = time.time()
