"""The broker's HTTP endpoints beyond plain `/metrics`: the `topic=`/`partition=` filter, the JSON
endpoints `/state-changes` and `/controller-events`, and what feeds them (the state-change
history ring and the controller event manager's record of processed events). Hostile query
parameters get a 400 with a reason, and the server keeps serving."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from odradek.cluster.broker_topic_stats import BrokerTopicStats
from odradek.controller.event_manager import RECENT_EVENTS, ControllerEventManager
from odradek.controller.state_change_history import StateChangeHistory
from odradek.controller.states import PartitionState, ReplicaState, StateChangeLogger
from odradek.server.metrics.exporter import MetricsExporter
from odradek.server.metrics.filters import (
    BadQuery,
    ReplicaFilter,
    format_partition_ranges,
    parse_partition_ranges,
    parse_replica_filter,
)
from odradek.server.metrics.json_endpoints import broker_json_endpoints
from odradek.server.metrics.request_metrics import RequestMetrics
from odradek.server.metrics.snapshot import _hosted_replicas, collect

LOG_END = "kafka_log_log_logendoffset_value"
MESSAGES = "kafka_server_brokertopicmetrics_messagesinpersec_count"
LEADERS = "kafka_server_replicamanager_leadercount_value"


def _partition(topic: str, index: int) -> Any:
    return SimpleNamespace(
        topic=topic,
        partition=index,
        is_leader=True,
        is_under_replicated=False,
        is_under_min_isr=False,
        is_at_min_isr=False,
        leader_high_watermark=-1,
        log_end_offset=100 + index,
        log_start_offset=0,
        high_watermark=100 + index,
        log=SimpleNamespace(size_in_bytes=1000 + index),
    )


def _broker(controller: Any = None) -> Any:
    stats = BrokerTopicStats()
    stats.record_append("orders", 10, 1000)
    stats.record_append("payments", 5, 500)
    hosted = {(t, i): _partition(t, i) for t in ("orders", "payments") for i in range(20)}
    committed = SimpleNamespace(value=SimpleNamespace(offset=4))
    group = SimpleNamespace(
        group_id="g",
        state=SimpleNamespace(value="Stable"),
        offsets=SimpleNamespace(committed={("orders", 0): committed, ("payments", 1): committed}),
    )
    return SimpleNamespace(
        broker_id=1,
        replica_manager=SimpleNamespace(
            broker_topic_stats=stats, partitions=hosted, offline_partitions=set()
        ),
        log_manager=None,
        controller=controller,
        group_coordinator=SimpleNamespace(
            manager=SimpleNamespace(groups={"g": group}), offset_commits=0
        ),
        socket_servers=[],
        zk=None,
    )


def _samples(families: Any) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items()))) for f in families for s in f.samples}


def _topics(samples: set[tuple[str, tuple[tuple[str, str], ...]]]) -> set[str]:
    return {dict(labels)["topic"] for _, labels in samples if "topic" in dict(labels)}


def test_a_topic_filter_keeps_only_that_topics_samples() -> None:
    broker = _broker()
    everything = _samples(collect(broker, RequestMetrics()))
    only = _samples(collect(broker, RequestMetrics(), None, ReplicaFilter("orders")))
    assert _topics(everything) == {"", "orders", "payments"}
    assert _topics(only) == {"orders"}
    assert sum(1 for name, _ in only if name == LOG_END) == 20
    # Samples without a topic label are untouched.
    assert (LEADERS, ()) in only
    assert {s for s in everything if "topic" not in dict(s[1])} <= only


def test_topic_and_partition_ranges_combine_with_names() -> None:
    broker = _broker()
    replicas = ReplicaFilter("payments", parse_partition_ranges("3,5-7,19,25-30"))
    families = collect(broker, RequestMetrics(), {LOG_END, LEADERS}, replicas)
    samples = _samples(families)
    ends = sorted(int(dict(labels)["partition"]) for name, labels in samples if name == LOG_END)
    assert ends == [3, 5, 6, 7, 19]
    assert {name for name, _ in samples} == {LOG_END, LEADERS}


def test_an_unknown_topic_gives_no_per_topic_samples_not_an_error() -> None:
    samples = _samples(collect(_broker(), RequestMetrics(), None, ReplicaFilter("nope")))
    assert _topics(samples) == set()
    assert (LEADERS, ()) in samples


def test_a_page_of_partitions_is_looked_up_not_searched() -> None:
    class Counting(dict):  # type: ignore[type-arg]
        def items(self) -> Any:  # the whole-map path would call this
            raise AssertionError("walked every hosted replica")

    hosted = Counting({("t", i): _partition("t", i) for i in range(1000)})
    chosen = _hosted_replicas(hosted, ReplicaFilter("t", ((10, 12), (990, 1005))))
    assert [p.partition for p in chosen] == [10, 11, 12, *range(990, 1000)]
    # Naming more partitions than are hosted walks them once instead.
    plain = dict(hosted)
    assert len(_hosted_replicas(plain, ReplicaFilter("t", ((0, 10**6),)))) == 1000
    assert len(_hosted_replicas(plain, ReplicaFilter("t"))) == 1000


@pytest.mark.parametrize(
    ("partitions", "text"),
    [([], ""), ([0], "0"), ([0, 1, 2, 5], "0-2,5"), ([9, 3, 4, 4, 10], "3-4,9-10")],
)
def test_partition_ranges_round_trip(partitions: list[int], text: str) -> None:
    assert format_partition_ranges(partitions) == text
    if text:
        named = ReplicaFilter("t", parse_partition_ranges(text))
        assert sorted(named.partitions()) == sorted(set(partitions))


@pytest.mark.parametrize(
    "query",
    [
        {"partition": ["1"]},
        {"topic": ["a", "b"]},
        {"topic": ["../etc/passwd"]},
        {"topic": [""]},
        {"topic": ["x" * 250]},
        {"topic": ["t"], "partition": ["5-1"]},
        {"topic": ["t"], "partition": ["abc"]},
        {"topic": ["t"], "partition": ["-1"]},
        {"topic": ["t"], "partition": ["99999999999"]},
        {"topic": ["t"], "partition": [",".join(["1"] * 1001)]},
        {"topic": ["t"], "partition": ["1,,2"]},
        {"topic": ["t"], "partition": ["\u0661"]},  # a non-ASCII digit
    ],
)
def test_malformed_filters_are_refused_with_a_reason(query: dict[str, list[str]]) -> None:
    with pytest.raises(BadQuery):
        parse_replica_filter(query)


def _serve(broker: Any, paths: list[str]) -> list[tuple[int, str]]:
    """GET each path of an exporter serving `broker`; (status, body) of each."""

    def get(url: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, None, 10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    async def run() -> list[tuple[int, str]]:
        exporter = MetricsExporter(
            "127.0.0.1",
            0,
            lambda names, replicas: collect(broker, RequestMetrics(), names, replicas),
            broker_json_endpoints(broker),
        )
        exporter.start()
        try:
            base = f"http://127.0.0.1:{exporter.port}"
            return [await asyncio.to_thread(get, base + path) for path in paths]
        finally:
            await exporter.stop()

    return asyncio.run(run())


def test_the_filter_over_http_and_hostile_queries() -> None:
    hostile = [
        "/metrics?partition=1",
        "/metrics?topic=a&topic=b",
        "/metrics?topic=%ff%fe",
        "/metrics?topic=orders&partition=1-",
        "/metrics?topic=",
        "/metrics?" + "&".join(f"name[]=x{i}" for i in range(500)),
        "/state-changes?topic=orders",
        "/state-changes?topic=orders&partition=x",
    ]
    answers = _serve(
        _broker(),
        [
            f"/metrics?topic=orders&partition=0-4&name[]={LOG_END}",
            "/metrics?topic=unknown",
            *hostile,
            f"/metrics?name[]={MESSAGES}",
        ],
    )
    (status, text), (unknown_status, unknown_text), *refused, (last, last_text) = answers
    assert status == 200
    families = list(text_string_to_metric_families(text))
    assert sorted(int(s.labels["partition"]) for f in families for s in f.samples) == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert unknown_status == 200 and "topic=" not in unknown_text
    for path, (code, body) in zip(hostile, refused, strict=True):
        assert code == 400, (path, code, body)
        assert body.strip() and "Traceback" not in body, path
    assert last == 200 and 'topic="payments"' in last_text


def _logger_with_history() -> StateChangeLogger:
    logger = StateChangeLogger(1)
    P, R = PartitionState, ReplicaState
    logger.partition_transition(3, "orders", 0, P.NonExistentPartition, P.NewPartition)
    logger.replica_transition(3, "orders", 0, 2, R.NonExistentReplica, R.NewReplica)
    logger.partition_transition(
        3, "orders", 0, P.NewPartition, P.OnlinePartition, leader=2, isr=[2, 3], leader_epoch=0
    )
    logger.partition_transition(3, "orders", 1, P.NonExistentPartition, P.NewPartition)
    return logger


def test_state_changes_endpoint_serves_one_partitions_entries() -> None:
    logger = _logger_with_history()
    controller = SimpleNamespace(
        state_change_logger=logger, event_manager=None, is_active=False, active_controller_id=2
    )
    broker = _broker(controller)
    [(status, body), (none_status, none_body)] = _serve(
        broker, ["/state-changes?topic=orders&partition=0", "/state-changes?topic=x&partition=0"]
    )
    assert status == 200 and none_status == 200
    answer = json.loads(body)
    assert answer["broker_id"] == 1 and answer["partition"] == 0
    entries = answer["entries"]
    assert [(e["replica"], e["from_state"], e["to_state"]) for e in entries] == [
        (None, "NonExistentPartition", "NewPartition"),
        (2, "NonExistentReplica", "NewReplica"),
        (None, "NewPartition", "OnlinePartition"),
    ]
    assert entries[2]["leader"] == 2 and entries[2]["isr"] == [2, 3]
    assert entries[2]["leader_epoch"] == 0 and entries[2]["controller_epoch"] == 3
    assert json.loads(none_body)["entries"] == []


def test_controller_events_endpoint_on_a_non_controller() -> None:
    controller = SimpleNamespace(
        state_change_logger=StateChangeLogger(1),
        event_manager=None,
        is_active=False,
        active_controller_id=2,
    )
    [(status, body)] = _serve(_broker(controller), ["/controller-events"])
    answer = json.loads(body)
    assert status == 200 and answer["active"] is False and answer["active_controller_id"] == 2
    assert "not the active controller" in answer["message"]


def test_controller_events_endpoint_on_the_active_controller() -> None:
    from odradek.controller.event_manager import ProcessedEvent

    manager = SimpleNamespace(
        current_event=SimpleNamespace(name="BrokerChange"),
        current_started_ms=int(time.time() * 1000) - 1500,
        current_queue_ms=2.0,
        queue_size=4,
        events_processed=9,
        recent=[ProcessedEvent("Startup", 1, 0.5, 3.0, False), ProcessedEvent("X", 2, 1, 2, True)],
    )
    controller = SimpleNamespace(
        state_change_logger=StateChangeLogger(1),
        event_manager=manager,
        is_active=True,
        active_controller_id=1,
        context=SimpleNamespace(epoch=7, assignments={}, offline_partition_count=lambda: 0),
    )
    [(status, body)] = _serve(_broker(controller), ["/controller-events"])
    answer = json.loads(body)
    assert status == 200 and answer["active"] is True and answer["controller_epoch"] == 7
    assert (answer["queue_size"], answer["events_processed"]) == (4, 9)
    assert answer["in_progress"]["name"] == "BrokerChange"
    assert answer["in_progress"]["running_ms"] >= 1500
    assert [(e["name"], e["failed"]) for e in answer["recent"]] == [("X", True), ("Startup", False)]


def test_state_change_history_is_bounded_per_partition_and_in_total() -> None:
    history = StateChangeHistory(per_partition=3, max_total=7)
    for i in range(5):
        history.record(1, 1, "t", 0, None, "A", f"S{i}")
    assert [e.to_state for e in history.entries("t", 0)] == ["S2", "S3", "S4"]
    assert len(history) == 3
    for partition in (1, 2):
        for i in range(3):
            history.record(1, 1, "t", partition, None, "A", f"S{i}")
    # 9 > 7: the partition written least recently (0) goes as a whole.
    assert history.entries("t", 0) == [] and len(history) == 6
    history.record(1, 1, "t", 1, 5, "A", "B")  # partition 1 is now the most recent
    history.record(1, 1, "t", 3, None, "A", "B")
    history.record(1, 1, "t", 3, None, "A", "B")
    assert history.entries("t", 2) == [] and len(history.entries("t", 1)) == 3
    assert len(history) == 5
    with pytest.raises(ValueError):
        StateChangeHistory(per_partition=0)


def test_event_manager_keeps_the_last_events_with_queue_and_processing_times() -> None:
    async def run() -> tuple[ControllerEventManager, list[str]]:
        seen: list[str] = []
        release = asyncio.Event()

        class Processor:
            async def process(self, event: Any) -> None:
                seen.append(event.name)
                if event.name == "Slow":
                    await release.wait()
                if event.name == "Boom":
                    raise RuntimeError("boom")

            def preempt(self, event: Any) -> None:
                pass

            async def on_error(self, event: Any, error: BaseException) -> None:
                pass

        manager = ControllerEventManager(Processor(), asyncio.get_running_loop())
        manager.start()
        manager.put(SimpleNamespace(name="Slow"))
        for i in range(RECENT_EVENTS + 5):
            manager.put(SimpleNamespace(name=f"E{i}"))
        manager.put(SimpleNamespace(name="Boom"))
        await _until(lambda: manager.current_event is not None)
        assert manager.current_event.name == "Slow" and manager.queue_size == RECENT_EVENTS + 6
        await asyncio.sleep(0.02)  # the events behind Slow wait at least this long
        release.set()
        await _until(lambda: manager.events_processed == RECENT_EVENTS + 7)
        await manager.close()
        return manager, seen

    manager, seen = asyncio.run(run())
    recent = list(manager.recent)
    assert len(recent) == RECENT_EVENTS and recent[-1].name == "Boom" and recent[-1].failed
    assert recent[-2].name == f"E{RECENT_EVENTS + 4}"
    assert all(e.queue_ms >= 20 and e.process_ms >= 0 for e in recent)
    assert not any(e.failed for e in recent[:-1])
    assert len(seen) == RECENT_EVENTS + 7


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


def test_a_scrape_of_one_pages_log_gauges_walks_no_other_partition() -> None:
    """The console's topic page names only `kafka_log_log_*` with a topic and partitions: the
    ReplicaManager's counts (a walk over every hosted partition) are not built either."""

    class Untouchable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"read {name} of a partition the scrape did not name")

    broker = _broker()
    hosted = broker.replica_manager.partitions
    for i in range(20, 1000):
        hosted[("big", i)] = Untouchable()
    replicas = ReplicaFilter("orders", parse_partition_ranges("0-4"))
    samples = _samples(collect(broker, RequestMetrics(), {LOG_END}, replicas))
    assert {name for name, _ in samples} == {LOG_END} and len(samples) == 5
