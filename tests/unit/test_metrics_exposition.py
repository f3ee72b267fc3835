"""Kafka's metric names as the JMX exporter gives them, and the text format the broker serves."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from prometheus_client.parser import text_string_to_metric_families

from odradek.cluster.broker_topic_stats import BrokerTopicStats
from odradek.errors import OperatorError
from odradek.network.request_context import RequestContext
from odradek.protocol.codec import ApiKey
from odradek.server.metrics.exporter import MetricsExporter, parse_metrics_listener
from odradek.server.metrics.names import jmx_metric_name, request_name
from odradek.server.metrics.request_metrics import RequestMetrics
from odradek.server.metrics.snapshot import collect


@pytest.mark.parametrize(
    ("mbean", "expected"),
    [
        (
            ("kafka.server", "BrokerTopicMetrics", "MessagesInPerSec", "Count"),
            "kafka_server_brokertopicmetrics_messagesinpersec_count",
        ),
        (
            ("kafka.server", "ReplicaManager", "UnderReplicatedPartitions", "Value"),
            "kafka_server_replicamanager_underreplicatedpartitions_value",
        ),
        (
            ("kafka.controller", "KafkaController", "ActiveControllerCount", "Value"),
            "kafka_controller_kafkacontroller_activecontrollercount_value",
        ),
        (
            ("kafka.coordinator.group", "GroupMetadataManager", "NumGroups", "Value"),
            "kafka_coordinator_group_groupmetadatamanager_numgroups_value",
        ),
        (
            ("kafka.server", "socket-server-metrics", None, "connection-count"),
            "kafka_server_socket_server_metrics_connection_count",
        ),
    ],
)
def test_jmx_exporter_names(mbean: tuple[Any, ...], expected: str) -> None:
    assert jmx_metric_name(*mbean) == expected


def test_request_names_are_kafkas() -> None:
    assert request_name(ApiKey.PRODUCE) == "Produce"
    assert request_name(ApiKey.LEADER_AND_ISR) == "LeaderAndIsr"
    assert request_name(ApiKey.OFFSET_COMMIT) == "OffsetCommit"
    assert request_name(9999) == "Unknown9999"


@pytest.mark.parametrize("value", ["http://127.0.0.1:9404", "http://:9404/", "http://host:1"])
def test_metrics_listener_accepted(value: str) -> None:
    host, port = parse_metrics_listener(value)
    assert port > 0 and host


@pytest.mark.parametrize("value", ["127.0.0.1:9404", "https://h:1", "http://h", "http://h:1/x"])
def test_metrics_listener_refused(value: str) -> None:
    with pytest.raises(OperatorError):
        parse_metrics_listener(value)


def test_broker_topic_stats_count_per_topic_and_total() -> None:
    stats = BrokerTopicStats()
    stats.record_append("a", 3, 300)
    stats.record_append("b", 2, 50)
    stats.record_failed_produce("a")
    stats.record_fetch("a", 120, failed=False)
    stats.record_fetch("b", 0, failed=True)
    assert stats.topic("a").messages_in == 3 and stats.topic("a").bytes_in == 300
    assert stats.all_topics.messages_in == 5 and stats.all_topics.bytes_in == 350
    assert stats.all_topics.failed_produce_requests == 1
    assert stats.all_topics.total_produce_requests == 3
    assert stats.all_topics.bytes_out == 120 and stats.all_topics.failed_fetch_requests == 1
    stats.remove_topic("a")
    assert "a" not in stats.topics and stats.all_topics.messages_in == 5


def _context(api_key: int) -> RequestContext:
    header = SimpleNamespace(api_key=api_key, api_version=0, correlation_id=1, client_id="c")
    return RequestContext(header, "127.0.0.1:1", "127.0.0.1")  # type: ignore[arg-type]


def test_request_metrics_time_sync_and_async_requests() -> None:
    metrics = RequestMetrics()

    async def run() -> None:
        release = asyncio.Event()

        async def waits() -> str:
            await release.wait()
            return "done"

        def dispatch(context: RequestContext, frame: bytes) -> Any:
            return waits() if context.header.api_key == ApiKey.FETCH else "answer"

        metered = metrics.metered(dispatch)
        assert metered(_context(ApiKey.PRODUCE), b"") == "answer"
        future = metered(_context(ApiKey.FETCH), b"")
        await asyncio.sleep(0)
        fetch = metrics.stats(ApiKey.FETCH)
        assert fetch.requests == 1 and fetch.total.count == 0  # not complete yet
        assert fetch.queue.count == fetch.local.count == 1
        release.set()
        assert await future == "done"

    asyncio.run(run())
    produce, fetch = metrics.stats(ApiKey.PRODUCE), metrics.stats(ApiKey.FETCH)
    assert produce.requests == 1 and produce.total.sum_ns >= produce.local.sum_ns >= 0
    assert fetch.total.count == fetch.remote.count == 1
    assert fetch.total.sum_ns >= fetch.remote.sum_ns > 0


def test_request_queue_time_runs_from_the_read_and_errors_count_by_code() -> None:
    """RequestQueueTimeMs starts at `received_ns` (the read); ErrorsPerSec counts the response's
    top-level error code, and a handler that raised as UNKNOWN_SERVER_ERROR."""
    metrics = RequestMetrics()

    def dispatch(context: RequestContext, frame: bytes) -> Any:
        if frame == b"raise":
            raise RuntimeError("boom")
        return SimpleNamespace(error_code=ErrorCode.not_controller if frame else ErrorCode.none)

    metered = metrics.metered(dispatch)
    header = SimpleNamespace(api_key=ApiKey.CREATE_TOPICS, api_version=0, correlation_id=1)
    read_at = time.perf_counter_ns() - 5_000_000  # read 5 ms ago, behind earlier requests
    context = RequestContext(header, "c", "h", received_ns=read_at)  # type: ignore[arg-type]
    metered(context, b"")
    metered(context, b"x")
    with pytest.raises(RuntimeError):
        metered(context, b"raise")
    stats = metrics.stats(ApiKey.CREATE_TOPICS)
    assert stats.requests == 3 and stats.queue.count == 3
    assert stats.queue.max_ns >= 5_000_000 and stats.total.count == 2
    assert stats.total.sum_ns >= 2 * 5_000_000
    metrics.response_sent(ApiKey.CREATE_TOPICS, 1500)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in collect(_fake_broker(), metrics)
        for s in f.samples
    }
    errors = "kafka_network_requestmetrics_errorspersec_count"
    for error, count in (("NONE", 1), ("NOT_CONTROLLER", 1), ("UNKNOWN_SERVER_ERROR", 1)):
        assert samples[(errors, (("error", error), ("request", "CreateTopics")))] == count
    label = (("request", "CreateTopics"),)
    assert samples[("kafka_network_requestmetrics_requestqueuetimems_count", label)] == 3
    assert samples[("kafka_network_requestmetrics_requestqueuetimems_max", label)] >= 5
    assert samples[("kafka_network_requestmetrics_requestqueuetimems_50thpercentile", label)] > 0
    assert samples[("kafka_network_requestmetrics_responsesendtimems_count", label)] == 1
    send_p99 = samples[("kafka_network_requestmetrics_responsesendtimems_99thpercentile", label)]
    assert send_p99 == pytest.approx(0.0015, rel=0.07)
    for attribute in ("50th", "75th", "95th", "98th", "99th", "999th"):
        name = f"kafka_network_requestmetrics_totaltimems_{attribute}percentile"
        assert samples[(name, label)] >= 5 * (1 - 1 / 16)  # a bucket's middle, within 1/16


def _fake_broker() -> Any:
    stats = BrokerTopicStats()
    stats.record_append("orders", 10, 1000)
    partition = SimpleNamespace(
        topic="orders",
        partition=0,
        is_leader=True,
        is_under_replicated=True,
        is_under_min_isr=False,
        is_at_min_isr=True,
        leader_high_watermark=-1,
        log_end_offset=10,
        log_start_offset=0,
        high_watermark=10,
        log=SimpleNamespace(size_in_bytes=1000),
    )
    committed = SimpleNamespace(value=SimpleNamespace(offset=4))
    group = SimpleNamespace(
        group_id="g",
        state=SimpleNamespace(value="Stable"),
        offsets=SimpleNamespace(committed={("orders", 0): committed}),
    )
    return SimpleNamespace(
        replica_manager=SimpleNamespace(
            broker_topic_stats=stats,
            partitions={("orders", 0): partition},
            offline_partitions={("lost", 0)},
        ),
        log_manager=SimpleNamespace(failure_channel=SimpleNamespace(offline_log_dirs={"/d2"})),
        controller=None,
        group_coordinator=SimpleNamespace(
            manager=SimpleNamespace(groups={"g": group}), offset_commits=7
        ),
        socket_servers=[
            SimpleNamespace(
                listener="PLAINTEXT",
                connections={1, 2},
                incoming_bytes=100,
                outgoing_bytes=200,
                connections_created=5,
                connections_closed=3,
                authentications_succeeded=5,
                authentications_failed=1,
                handshakes_failed=1,
            )
        ],
        zk=None,
    )


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_exporter_serves_the_snapshot_over_http() -> None:
    broker = _fake_broker()

    async def run() -> str:
        exporter = MetricsExporter(
            "127.0.0.1",
            0,
            lambda names, replicas: collect(broker, RequestMetrics(), names, replicas),
        )
        exporter.start()
        try:
            url = f"http://127.0.0.1:{exporter.port}/metrics"
            response = await asyncio.to_thread(urllib.request.urlopen, url, None, 10)
            return response.read().decode()
        finally:
            await exporter.stop()

    samples = _samples(asyncio.run(run()))
    messages = "kafka_server_brokertopicmetrics_messagesinpersec_count"
    assert samples[(messages, (("topic", "orders"),))] == 10
    assert samples[(messages, (("topic", ""),))] == 10
    assert samples[("kafka_server_replicamanager_underreplicatedpartitions_value", ())] == 1
    assert samples[("kafka_server_replicamanager_leadercount_value", ())] == 1
    assert samples[("kafka_server_replicamanager_atminisrpartitioncount_value", ())] == 1
    assert ("kafka_log_logflushstats_logflushrateandtimems_count", ()) in samples
    assert ("kafka_log_logflushstats_logflushrateandtimems_99thpercentile", ()) in samples
    assert samples[("kafka_server_replicamanager_offlinereplicacount_value", ())] == 1
    assert samples[("kafka_log_logmanager_offlinelogdirectorycount_value", ())] == 1
    size = ("kafka_log_log_size_value", (("partition", "0"), ("topic", "orders")))
    assert samples[size] == 1000
    lag_labels = (("consumergroup", "g"), ("partition", "0"), ("topic", "orders"))
    assert samples[("kafka_consumergroup_lag", lag_labels)] == 6
    assert samples[("kafka_coordinator_group_groupmetadatamanager_numgroupsstable_value", ())] == 1
    listener = (("listener", "PLAINTEXT"),)
    socket_server = "kafka_server_socket_server_metrics_"
    for attribute, value in (
        ("connection_count", 2),
        ("incoming_byte_total", 100),
        ("outgoing_byte_total", 200),
        ("connection_creation_total", 5),
        ("connection_close_total", 3),
        ("successful_authentication_total", 5),
        ("failed_authentication_total", 2),
    ):
        assert samples[(socket_server + attribute, listener)] == value


def test_a_scrape_with_name_parameters_gets_only_those_samples() -> None:
    """Prometheus' `name[]` parameters (what the console's overview sends): only the named
    samples, and the per-replica log gauges are not even built when none is asked for."""
    broker = _fake_broker()
    asked: list[object] = []

    def snapshot(names: object, replicas: object) -> list:  # type: ignore[type-arg]
        asked.append(names)
        return collect(broker, RequestMetrics(), names)  # type: ignore[arg-type]

    async def run(query: str) -> str:
        exporter = MetricsExporter("127.0.0.1", 0, snapshot)
        exporter.start()
        try:
            url = f"http://127.0.0.1:{exporter.port}/metrics{query}"
            response = await asyncio.to_thread(urllib.request.urlopen, url, None, 10)
            return response.read().decode()
        finally:
            await exporter.stop()

    messages = "kafka_server_brokertopicmetrics_messagesinpersec_count"
    leaders = "kafka_server_replicamanager_leadercount_value"
    samples = _samples(asyncio.run(run(f"?name[]={messages}&name[]={leaders}")))
    assert samples == {
        (messages, (("topic", ""),)): 10,
        (messages, (("topic", "orders"),)): 10,
        (leaders, ()): 1,
    }
    assert asked == [frozenset({messages, leaders})]
    from odradek.server.metrics.snapshot import _replica_manager

    def log_families(logs: bool) -> list[str]:
        return [
            f.name for f in _replica_manager(broker, logs) if f.name.startswith("kafka_log_log_")
        ]

    assert log_families(False) == [] and len(log_families(True)) == 3
    sizes = collect(broker, RequestMetrics(), {"kafka_log_log_size_value"})
    assert [s.name for f in sizes for s in f.samples] == ["kafka_log_log_size_value"]
