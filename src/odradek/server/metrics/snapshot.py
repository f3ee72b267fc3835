"""Every metric of one broker, read from its components at scrape time (on the event loop thread).

Gauges (partition counts, log sizes, consumer lag) are computed here rather than kept up to date on
the request path; counters are read from the components that bump them (BrokerTopicStats in the
replica manager, RequestMetrics, the ZooKeeper client, the group coordinator). One scrape walks the
hosted partitions and the coordinated groups once: O(partitions + committed offsets).

Consumer lag follows kafka_exporter's names (`kafka_consumergroup_lag`), since Kafka's broker has no
such MBean: a broker reports it for the groups it coordinates, for the partitions it hosts a
replica of, as that replica's high watermark minus the committed offset.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from kio.schema.errors import ErrorCode
from prometheus_client.core import GaugeMetricFamily, Metric, UnknownMetricFamily

from odradek.log.log import LOG_FLUSH_TIMES
from odradek.server.metrics.filters import ReplicaFilter
from odradek.server.metrics.names import jmx_metric_name, request_name
from odradek.server.metrics.request_metrics import UNKNOWN_SERVER_ERROR, RequestMetrics
from odradek.server.metrics.text import RowFamily
from odradek.server.metrics.timers import Deferred, Row, expand, take, timer_families

# BrokerTopicMetrics: MBean name -> TopicMeters field.
_TOPIC_METERS = {
    "MessagesInPerSec": "messages_in",
    "BytesInPerSec": "bytes_in",
    "BytesOutPerSec": "bytes_out",
    "FailedProduceRequestsPerSec": "failed_produce_requests",
    "FailedFetchRequestsPerSec": "failed_fetch_requests",
    "TotalProduceRequestsPerSec": "total_produce_requests",
    "TotalFetchRequestsPerSec": "total_fetch_requests",
}

# RequestMetrics' time histograms: MBean name -> ApiRequestStats field.
_REQUEST_TIMES = {
    "RequestQueueTimeMs": "queue",
    "LocalTimeMs": "local",
    "RemoteTimeMs": "remote",
    "TotalTimeMs": "total",
    "ResponseSendTimeMs": "response_send",
}

# Kafka's ControllerState values (kafka.controller.ControllerState), by odradek event class name.
_CONTROLLER_STATES = {
    "ControllerChange": 1,
    "Startup": 1,
    "Reelect": 1,
    "Expire": 1,
    "BrokerChange": 2,
    "BrokerModification": 2,
    "RegisterBrokerAndReelect": 1,
    "TopicChange": 3,
    "PartitionModifications": 3,
    "TopicDeletion": 4,
    "TopicDeletionStopReplicaResponseReceived": 4,
    "PartitionReassignment": 5,
    "ApiPartitionReassignment": 5,
    "ListPartitionReassignments": 15,
    "PartitionReassignmentIsrChange": 5,
    "AutoPreferredReplicaLeaderElection": 6,
    "PreferredReplicaElection": 7,
    "ReplicaLeaderElection": 7,
    "ControlledShutdown": 8,
    "IsrChangeNotification": 9,
    "BrokerResponseReceived": 10,
    "Shutdown": 12,
    "TopicUncleanLeaderElectionEnable": 14,
}


def _untyped(name: str, doc: str, labels: Iterable[str] = ()) -> UnknownMetricFamily:
    # JMX exporter output is untyped unless a rule says otherwise; untyped also keeps the name
    # exactly as given (prometheus_client would append `_total` to a counter's).
    return UnknownMetricFamily(name, doc, labels=list(labels))


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


LOG_PREFIX = "kafka_log_log_"
_COUNT_PREFIXES = (
    "kafka_server_replicamanager_",
    "kafka_log_logmanager_",
    "kafka_server_replicafetchermanager_",
)


# One timer MBean name: domain, type, name, doc, label names, and its rows (histograms copied).
TimerSpec = tuple[str, str, str, str, tuple[str, ...], list[Row]]


def collect(
    broker: Any,
    request_metrics: RequestMetrics,
    names: Collection[str] | None = None,
    replicas: ReplicaFilter | None = None,
    defer: bool = False,
) -> list[Any]:
    """All families of `broker` now, or only the samples named in `names` (a scrape with
    Prometheus' `name[]` parameters), and with `replicas` (`topic=`, `partition=`; see `filters`)
    only the samples of that topic among those with a `topic` label. Call on the broker's event
    loop thread.

    The one part that grows with the partition count -- every hosted replica's `kafka_log_log_*`
    gauges -- is not even built unless one of them is asked for (`names`), and with `replicas`
    it is built only for those replicas: a scrape of the few totals a dashboard or the console's
    overview needs, or of one page of one topic's replicas, costs a broker hosting 10,000
    replicas next to nothing, where the whole text costs it tens of milliseconds.

    The timers (request times per API, the controller's, log flushes) are copied here and their
    families built from the copies: with `defer`, later, by `timers.expand` off the loop (the
    exporter), the last item of the list being a `timers.Deferred`; else before returning."""
    logs = names is None or any(n.startswith(LOG_PREFIX) for n in names)
    # The ReplicaManager's counts walk every hosted partition too: not for a scrape of only the
    # per-replica gauges of one topic's page (the console's topic page).
    counts = names is None or any(n.startswith(_COUNT_PREFIXES) for n in names)
    families: list[Metric] = []
    timers: list[TimerSpec] = []
    families.extend(_broker_topic_metrics(broker))
    families.extend(_request_metrics(request_metrics, timers))
    families.extend(_replica_manager(broker, logs, replicas, counts))
    families.extend(_fetch_sessions(broker))
    families.extend(_controller(broker, timers))
    timers.append(
        (
            "kafka.log",
            "LogFlushStats",
            "LogFlushRateAndTimeMs",
            "log flushes (fsync)",
            (),
            [((), LOG_FLUSH_TIMES)],
        )
    )
    families.extend(_group_coordinator(broker))
    families.extend(_network(broker))
    families.extend(_zookeeper(broker))
    if replicas is not None:  # (no timer has a topic label)
        for family in families:
            family.samples = [s for s in family.samples if _kept(s.labels, replicas)]
    if names is not None:
        wanted = set(names)
        restricted = (family._restricted_metric(wanted) for family in families)
        families = [family for family in restricted if family is not None]
    # The histograms go on changing on this loop: the families are built from their kept
    # summaries or from copies (`timers.take`), only of the timers the scrape asks for.
    copies = [
        (*spec[:5], [(labels, take(histogram)) for labels, histogram in spec[5]])
        for spec in timers
        if names is None or _timer_named(spec, names)
    ]
    deferred = Deferred(lambda: [f for spec in copies for f in timer_families(*spec, names)], names)
    return [*families, deferred] if defer else [*families, *expand([deferred])]


def _timer_named(spec: TimerSpec, names: Collection[str]) -> bool:
    prefix = jmx_metric_name(spec[0], spec[1], spec[2], "")  # kafka_..._totaltimems_
    return any(n.startswith(prefix) for n in names)


def _kept(labels: dict[str, str], replicas: ReplicaFilter) -> bool:
    topic = labels.get("topic")
    if topic is None:
        return True
    partition = labels.get("partition")
    return replicas.matches(topic, int(partition) if partition is not None else None)


def _broker_topic_metrics(broker: Any) -> Iterator[Metric]:
    replica_manager = broker.replica_manager
    if replica_manager is None:
        return
    stats = replica_manager.broker_topic_stats
    topics = [((topic,), meters) for topic, meters in sorted(stats.topics.items())]
    for mbean, field in _TOPIC_METERS.items():
        # The all-topics MBean has no topic key; an empty label is the same series to Prometheus.
        rows = [(("",), getattr(stats.all_topics, field))]
        rows.extend((labels, getattr(meters, field)) for labels, meters in topics)
        yield RowFamily(
            jmx_metric_name("kafka.server", "BrokerTopicMetrics", mbean, "Count"),
            f"kafka.server:type=BrokerTopicMetrics,name={mbean} (all topics, and per topic)",
            ("topic",),
            rows,
        )


def _error_name(code: Any) -> str:
    if code == UNKNOWN_SERVER_ERROR:
        return "UNKNOWN_SERVER_ERROR"
    try:
        return ErrorCode(int(code)).name.upper()
    except ValueError:
        return str(int(code))


def _request_metrics(request_metrics: RequestMetrics, timers: list[TimerSpec]) -> Iterator[Metric]:
    def family(mbean: str, attribute: str, doc: str, labels: list[str]) -> UnknownMetricFamily:
        return _untyped(
            jmx_metric_name("kafka.network", "RequestMetrics", mbean, attribute), doc, labels
        )

    requests = family("RequestsPerSec", "Count", "requests received, per API", ["request"])
    errors = family(
        "ErrorsPerSec",
        "Count",
        "responses by top-level error code (NONE included), per API",
        ["request", "error"],
    )
    apis = sorted(request_metrics.by_api.items())
    for api_key, stats in apis:
        label = request_name(api_key)
        requests.add_metric([label], stats.requests)
        for code, count in sorted(stats.errors.items(), key=lambda item: int(item[0])):
            errors.add_metric([label, _error_name(code)], count)
    yield requests
    yield errors
    for mbean, field in _REQUEST_TIMES.items():
        rows: list[Row] = [
            ((request_name(api_key),), getattr(stats, field)) for api_key, stats in apis
        ]
        timers.append(
            ("kafka.network", "RequestMetrics", mbean, f"{mbean}, per API", ("request",), rows)
        )


def _replica_manager(
    broker: Any, logs: bool = True, replicas: ReplicaFilter | None = None, counts: bool = True
) -> Iterator[Metric]:
    """The ReplicaManager's counts (`counts`: a walk over every hosted partition) and the
    per-replica log gauges (`logs`, of `replicas` only if given)."""
    replica_manager = broker.replica_manager
    if replica_manager is None:
        return
    if counts:
        yield from _replica_manager_counts(broker, replica_manager)
    if logs:
        yield from _replica_logs(replica_manager, replicas)


def _fetch_sessions(broker: Any) -> Iterator[Metric]:
    """Kafka's FetchSessionCache gauges and evictions, and Odradek's count of session
    partitions whose read a follower's fetch skipped (`server/fetch_quiet`)."""
    manager = getattr(broker, "fetch_manager", None)
    if manager is None:
        return
    cache = manager.cache

    def family(mbean: str, attribute: str, doc: str, value: float) -> Metric:
        make = _gauge if attribute == "Value" else _untyped
        metric = make(jmx_metric_name("kafka.server", "FetchSessionCache", mbean, attribute), doc)
        metric.add_metric([], value)
        return metric

    sessions = list(cache.sessions.values())
    yield family("NumIncrementalFetchSessions", "Value", "fetch sessions cached", len(sessions))
    yield family(
        "NumIncrementalFetchPartitionsCached",
        "Value",
        "partitions in the cached fetch sessions",
        sum(len(s.partitions) for s in sessions),
    )
    yield family(
        "IncrementalFetchSessionEvictionsPerSec",
        "Count",
        "fetch sessions evicted to make room for another",
        cache.evictions,
    )
    yield family(
        "QuietPartitionsSkippedPerSec",
        "Count",
        "session partitions a follower's fetch did not read: nothing changed since its last answer",
        cache.quiet_skips,
    )


def _replica_manager_counts(broker: Any, replica_manager: Any) -> Iterator[Metric]:
    partitions = list(replica_manager.partitions.values())

    def gauge(mbean: str, doc: str, value: float) -> GaugeMetricFamily:
        family = _gauge(jmx_metric_name("kafka.server", "ReplicaManager", mbean, "Value"), doc)
        family.add_metric([], value)
        return family

    yield gauge(
        "UnderReplicatedPartitions",
        "partitions led here whose ISR is smaller than their assignment",
        sum(1 for p in partitions if p.is_under_replicated),
    )
    yield gauge(
        "UnderMinIsrPartitionCount",
        "partitions led here with fewer in-sync replicas than min.insync.replicas",
        sum(1 for p in partitions if p.is_under_min_isr),
    )
    yield gauge(
        "AtMinIsrPartitionCount",
        "partitions led here with exactly min.insync.replicas in-sync replicas",
        sum(1 for p in partitions if p.is_at_min_isr),
    )
    yield gauge("PartitionCount", "partitions hosted here", len(partitions))
    yield gauge("LeaderCount", "partitions led here", sum(1 for p in partitions if p.is_leader))
    yield gauge(
        "OfflineReplicaCount",
        "replicas in failed log directories (KIP-112)",
        len(replica_manager.offline_partitions),
    )
    log_manager = broker.log_manager
    if log_manager is not None:
        offline_dirs = _gauge(
            jmx_metric_name("kafka.log", "LogManager", "OfflineLogDirectoryCount", "Value"),
            "log directories that failed",
        )
        offline_dirs.add_metric([], len(log_manager.failure_channel.offline_log_dirs))
        yield offline_dirs
    stats = replica_manager.broker_topic_stats
    for mbean, value in (
        ("IsrShrinksPerSec", stats.isr_shrinks),
        ("IsrExpandsPerSec", stats.isr_expands),
    ):
        family = _untyped(
            jmx_metric_name("kafka.server", "ReplicaManager", mbean, "Count"),
            f"ISR {mbean[3:-6].lower()} written to ZooKeeper by this broker as leader",
        )
        family.add_metric([], value)
        yield family
    max_lag = _gauge(
        jmx_metric_name("kafka.server", "ReplicaFetcherManager", "MaxLag", "Value"),
        "largest lag (leader HW - own LEO, in messages) of the partitions followed here",
        ["clientid"],
    )
    lags = [
        p.leader_high_watermark - p.log_end_offset
        for p in partitions
        if not p.is_leader and p.leader_high_watermark >= 0
    ]
    max_lag.add_metric(["Replica"], max([0, *lags]))
    yield max_lag


def _replica_logs(replica_manager: Any, replicas: ReplicaFilter | None) -> Iterator[Metric]:
    hosted = [
        ((p.topic, str(p.partition)), p)
        for p in _hosted_replicas(replica_manager.partitions, replicas)
    ]
    labels = ("topic", "partition")

    def gauge(mbean: str, doc: str, rows: list[tuple[tuple[str, ...], float]]) -> RowFamily:
        return RowFamily(
            jmx_metric_name("kafka.log", "Log", mbean, "Value"), doc, labels, rows, "gauge"
        )

    yield gauge(
        "Size", "bytes of a hosted partition's log", [(k, p.log.size_in_bytes) for k, p in hosted]
    )
    yield gauge(
        "LogEndOffset",
        "a hosted partition's log end offset",
        [(k, p.log_end_offset) for k, p in hosted],
    )
    yield gauge(
        "LogStartOffset",
        "a hosted partition's log start offset",
        [(k, p.log_start_offset) for k, p in hosted],
    )


def _hosted_replicas(hosted: dict[Any, Any], replicas: ReplicaFilter | None) -> list[Any]:
    """The hosted partitions `replicas` names, in (topic, partition) order: looked up one by one
    when it names fewer partitions than are hosted (a page of a topic), else picked out of all."""
    if replicas is None:
        chosen = list(hosted.values())
    else:
        count = replicas.partition_count
        if count is not None and count <= len(hosted):
            keys = ((replicas.topic, i) for i in replicas.partitions())
            return [hosted[key] for key in keys if key in hosted]
        chosen = [p for (topic, i), p in hosted.items() if replicas.matches(topic, i)]
    return sorted(chosen, key=lambda p: (p.topic, p.partition))


def _controller(broker: Any, timers: list[TimerSpec]) -> Iterator[Metric]:
    controller = broker.controller
    if controller is None:
        return
    stats = getattr(controller, "stats", None)  # None: a test's stand-in controller
    if stats is not None:
        yield from _controller_stats(stats, timers)
    active = controller.is_active
    context = controller.context
    event_manager = controller.event_manager

    def gauge(mbean: str, doc: str, value: float) -> GaugeMetricFamily:
        family = _gauge(jmx_metric_name("kafka.controller", "KafkaController", mbean, "Value"), doc)
        family.add_metric([], value)
        return family

    yield gauge("ActiveControllerCount", "1 on the active controller, else 0", int(active))
    # Like Kafka, only the active controller reports the cluster-wide counts (0 elsewhere).
    yield gauge(
        "OfflinePartitionsCount",
        "partitions without a live leader",
        context.offline_partition_count() if active else 0,
    )
    yield gauge(
        "GlobalPartitionCount",
        "partitions in the cluster",
        sum(len(parts) for parts in context.assignments.values()) if active else 0,
    )
    yield gauge(
        "GlobalTopicCount", "topics in the cluster", len(context.assignments) if active else 0
    )
    current = event_manager.current_event if event_manager is not None else None
    state = _CONTROLLER_STATES.get(type(current).__name__, 0) if current is not None else 0
    yield gauge("ControllerState", "Kafka's ControllerState of the event being processed", state)
    queue = _gauge(
        jmx_metric_name("kafka.controller", "ControllerEventManager", "EventQueueSize", "Value"),
        "events waiting in the controller's queue",
    )
    queue.add_metric([], event_manager.queue_size if event_manager is not None else 0)
    yield queue


def _controller_stats(stats: Any, timers: list[TimerSpec]) -> Iterator[Metric]:
    """ControllerStats and the event queue time: on every broker (0 where never controller)."""
    timers.append(
        (
            "kafka.controller",
            "ControllerStats",
            "LeaderElectionRateAndTimeMs",
            "BrokerChange events (a broker came or went: leaders elected), processing time",
            (),
            [((), stats.leader_election)],
        )
    )
    unclean = _untyped(
        jmx_metric_name(
            "kafka.controller", "ControllerStats", "UncleanLeaderElectionsPerSec", "Count"
        ),
        "leaders this broker's controller elected from outside the ISR",
    )
    unclean.add_metric([], stats.unclean_leader_elections)
    yield unclean
    timers.append(
        (
            "kafka.controller",
            "ControllerEventManager",
            "EventQueueTimeMs",
            "controller events' wait in the queue",
            (),
            [((), stats.event_queue)],
        )
    )


def _group_coordinator(broker: Any) -> Iterator[Metric]:
    coordinator = broker.group_coordinator
    if coordinator is None:
        return
    groups = list(coordinator.manager.groups.values())
    by_state: dict[str, int] = {}
    offsets = 0
    for group in groups:
        by_state[group.state.value] = by_state.get(group.state.value, 0) + 1
        offsets += len(group.offsets.committed)

    def gauge(mbean: str, doc: str, value: float) -> GaugeMetricFamily:
        family = _gauge(
            jmx_metric_name("kafka.coordinator.group", "GroupMetadataManager", mbean, "Value"), doc
        )
        family.add_metric([], value)
        return family

    yield gauge("NumGroups", "groups coordinated here", len(groups))
    for state in ("PreparingRebalance", "CompletingRebalance", "Stable", "Dead", "Empty"):
        yield gauge(f"NumGroups{state}", f"groups in state {state}", by_state.get(state, 0))
    yield gauge("NumOffsets", "committed offsets held here", offsets)
    commits = _untyped(
        jmx_metric_name("kafka.server", "group-coordinator-metrics", None, "offset-commit-count"),
        "partition offsets accepted for commit by this coordinator",
    )
    commits.add_metric([], coordinator.offset_commits)
    yield commits
    lags: list[tuple[tuple[str, ...], float]] = []
    offsets_committed: list[tuple[tuple[str, ...], float]] = []
    hosted = broker.replica_manager.partitions if broker.replica_manager is not None else {}
    for group in sorted(groups, key=lambda g: g.group_id):
        for (topic, index), committed in sorted(group.offsets.committed.items()):
            labels = (group.group_id, topic, str(index))
            offset = committed.value.offset
            offsets_committed.append((labels, offset))
            partition = hosted.get((topic, index))
            if partition is not None:
                lags.append((labels, max(0, partition.high_watermark - offset)))
    group_labels = ("consumergroup", "topic", "partition")
    yield RowFamily(
        "kafka_consumergroup_lag",
        "high watermark of the local replica minus the group's committed offset",
        group_labels,
        lags,
        "gauge",
    )
    yield RowFamily(
        "kafka_consumergroup_current_offset",
        "the group's committed offset",
        group_labels,
        offsets_committed,
        "gauge",
    )


def _network(broker: Any) -> Iterator[Metric]:
    connections = _gauge(
        jmx_metric_name("kafka.server", "socket-server-metrics", None, "connection-count"),
        "open connections, per listener",
        ["listener"],
    )
    for server in broker.socket_servers:
        connections.add_metric([server.listener], len(server.connections))
    yield connections
    for attribute, doc, value in _SOCKET_SERVER_TOTALS:
        family = _untyped(
            jmx_metric_name("kafka.server", "socket-server-metrics", None, attribute),
            f"{doc}, per listener",
            ["listener"],
        )
        for server in broker.socket_servers:
            family.add_metric([server.listener], value(server))
        yield family


# socket-server-metrics' cumulative attributes: name, doc, value of a SocketServer.
_SOCKET_SERVER_TOTALS: tuple[tuple[str, str, Callable[[Any], float]], ...] = (
    ("incoming-byte-total", "bytes read from clients", lambda s: s.incoming_bytes),
    (
        "outgoing-byte-total",
        "bytes written to clients (sendfile included)",
        lambda s: s.outgoing_bytes,
    ),
    ("connection-creation-total", "connections accepted", lambda s: s.connections_created),
    ("connection-close-total", "connections closed", lambda s: s.connections_closed),
    (
        "successful-authentication-total",
        "connections authenticated (PLAINTEXT and TLS: every connection; SASL: each success)",
        lambda s: s.authentications_succeeded,
    ),
    (
        "failed-authentication-total",
        "failed authentications (TLS handshakes included)",
        lambda s: s.authentications_failed + s.handshakes_failed,
    ),
)


def _zookeeper(broker: Any) -> Iterator[Metric]:
    zk = broker.zk
    if zk is None:
        return
    count = zk.request_count

    def latency(attribute: str, value: float) -> UnknownMetricFamily:
        family = _untyped(
            jmx_metric_name(
                "kafka.server", "ZooKeeperClientMetrics", "ZooKeeperRequestLatencyMs", attribute
            ),
            f"ZooKeeper request latency, {attribute.lower()}",
        )
        family.add_metric([], value)
        return family

    yield latency("Count", count)
    yield latency("Mean", zk.request_latency_ms_total / count if count else 0.0)
    yield latency("Max", zk.request_latency_ms_max)
    state = _gauge(
        jmx_metric_name("kafka.server", "SessionExpireListener", "SessionState", "Value"),
        "1 for the ZooKeeper session's current state",
        ["state"],
    )
    state.add_metric(["CONNECTED" if zk.connected else zk.session_state], 1)
    yield state
