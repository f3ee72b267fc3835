"""The console's partition history and controller pages' logic (merging the brokers' state-change
entries, reading the controller's events) and the topic page's per-topic scrape, against a real
in-process metrics endpoint serving a fake broker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from odradek.console.broker_json import BrokerAnswer, ask, json_url
from odradek.console.broker_metrics import MetricsSampler, scrape_url
from odradek.console.controller_view import pick_active, read_controller_events
from odradek.console.history import merge_history
from odradek.server.metrics.exporter import MetricsExporter
from odradek.server.metrics.json_endpoints import broker_json_endpoints
from odradek.server.metrics.request_metrics import RequestMetrics
from odradek.server.metrics.snapshot import collect
from tests.unit.test_metrics_topic_filter import _broker, _logger_with_history


def _entry(epoch: int, time_ms: int, to_state: str, **more: Any) -> dict[str, Any]:
    return {
        "time_ms": time_ms,
        "controller_id": more.pop("controller_id", 1),
        "controller_epoch": epoch,
        "topic": "t",
        "partition": 0,
        "replica": more.pop("replica", None),
        "from_state": more.pop("from_state", "OnlinePartition"),
        "to_state": to_state,
        "leader": more.pop("leader", None),
        "leader_epoch": more.pop("leader_epoch", None),
        "isr": more.pop("isr", None),
    }


def test_history_merges_brokers_by_controller_epoch_and_says_what_changed() -> None:
    # Broker 1 was controller (epoch 1); broker 2 took over (epoch 2) with a clock 10 s behind:
    # the epoch, not the clock, orders them.
    old = [
        _entry(1, 50_000, "NewPartition", from_state="NonExistentPartition"),
        _entry(1, 50_001, "OnlinePartition", from_state="NewPartition", leader=1, isr=[1, 2]),
        _entry(1, 50_002, "OfflineReplica", replica=2, from_state="OnlineReplica"),
        _entry(1, 50_003, "OnlinePartition", leader=1, isr=[1], leader_epoch=1),
    ]
    new = [
        _entry(2, 41_000, "OfflinePartition", controller_id=2),
        _entry(2, 41_001, "OnlinePartition", controller_id=2, leader=2, isr=[2], leader_epoch=2),
    ]
    answers = {
        1: BrokerAnswer(1, {"entries": old}),
        2: BrokerAnswer(2, {"entries": new}),
        3: BrokerAnswer(3, error="connection refused"),
    }
    rows, errors = merge_history(answers)
    assert [(r.controller_epoch, r.to_state) for r in reversed(rows)] == [
        (1, "NewPartition"),
        (1, "OnlinePartition"),
        (1, "OfflineReplica"),
        (1, "OnlinePartition"),
        (2, "OfflinePartition"),
        (2, "OnlinePartition"),
    ]
    assert [r.note for r in reversed(rows)] == [
        "",
        "leader 1, ISR [1, 2]",
        "",
        "ISR [1, 2] -> [1]",
        "no leader",
        "leader 1 -> 2; ISR [1] -> [2]",
    ]
    assert rows[0].broker_id == 2 and rows[-1].subject == "partition"
    assert rows[3].subject == "replica 2"
    assert errors == ["broker 3: connection refused"]


def test_history_skips_what_it_cannot_read() -> None:
    answers = {
        1: BrokerAnswer(1, {"entries": [_entry(1, 1, "X"), {"time_ms": "soon"}, 7, None]}),
        2: BrokerAnswer(2, ["not", "a", "dict"]),
        3: BrokerAnswer(3, {"entries": [_entry(1, 2, "Y", isr=["a"])]}),
    }
    rows, errors = merge_history(answers)
    assert [r.to_state for r in rows] == ["X"]
    assert errors == [
        "broker 1: 3 unreadable entries skipped",
        "broker 2: an answer without entries",
        "broker 3: 1 unreadable entries skipped",
    ]


def test_controller_events_are_read_from_the_active_controller_only() -> None:
    active = {
        "broker_id": 2,
        "active": True,
        "controller_epoch": 5,
        "queue_size": 3,
        "events_processed": 40,
        "in_progress": {"name": "BrokerChange", "started_ms": 1_000, "queue_ms": 2.5},
        "recent": [
            {
                "name": "IsrChangeNotification",
                "queued_at_ms": 900,
                "queue_ms": 0.1,
                "process_ms": 12.0,
                "failed": False,
            },
            {"name": "Broken"},
            {
                "name": "TopicChange",
                "queued_at_ms": 800,
                "queue_ms": 1,
                "process_ms": 3,
                "failed": True,
            },
        ],
    }
    events = read_controller_events(active, now_ms=1_250)
    assert events is not None
    assert (events.broker_id, events.controller_epoch, events.queue_size) == (2, 5, 3)
    assert events.in_progress == "BrokerChange" and events.in_progress_ms == 250
    assert [(e.name, e.failed) for e in events.recent] == [
        ("IsrChangeNotification", False),
        ("TopicChange", True),
    ]
    inactive = {"broker_id": 1, "active": False, "message": "broker 1 is not the active controller"}
    assert read_controller_events(inactive, 0) is None
    assert read_controller_events("garbage", 0) is None
    picked, notes = pick_active(
        {1: BrokerAnswer(1, inactive), 2: BrokerAnswer(2, active), 3: BrokerAnswer(3, error="x")},
        1_250,
    )
    assert picked == events and notes == ["broker 1: broker 1 is not the active controller"]
    none, notes = pick_active({1: BrokerAnswer(1, inactive)}, 0)
    assert none is None and len(notes) == 1


def test_json_urls_and_topic_scrape_urls() -> None:
    metrics = "http://127.0.0.1:9404/metrics"
    assert (
        json_url(metrics, "/state-changes", {"topic": "a b", "partition": 3})
        == "http://127.0.0.1:9404/state-changes?topic=a+b&partition=3"
    )
    url = scrape_url(metrics, ["kafka_log_log_size_value"], "orders", "0-99")
    assert url.endswith("?name[]=kafka_log_log_size_value&topic=orders&partition=0-99")


def test_topic_page_scrapes_and_history_against_a_real_endpoint() -> None:
    """The sampler's per-topic scrape gets only the page's replicas; `ask` gets the broker's
    state-change entries (a real exporter, serving a fake broker on this loop)."""
    controller = SimpleNamespace(
        state_change_logger=_logger_with_history(),
        event_manager=None,
        is_active=False,
        active_controller_id=2,
        context=SimpleNamespace(epoch=3),
    )
    broker = _broker(controller)

    async def run() -> tuple[Any, Any, Any]:
        exporter = MetricsExporter(
            "127.0.0.1",
            0,
            lambda names, replicas: collect(broker, RequestMetrics(), names, replicas),
            broker_json_endpoints(broker),
        )
        exporter.start()
        try:
            url = f"http://127.0.0.1:{exporter.port}/metrics"
            sampler = MetricsSampler({1: url}, interval_s=60)
            logs, errors = await sampler.topic_logs("orders", [3, 4, 5, 9], wait_s=10)
            again = await sampler.topic_logs("orders", [3, 4, 5, 9], wait_s=10)
            assert await sampler.topic_logs("orders", [], wait_s=10) == ({}, [])
            # The reassignments page: only the moving partitions, one scrape per topic.
            moving, moving_errors = await sampler.moving_logs(
                [("orders", 7), ("payments", 2), ("orders", 1)], wait_s=10
            )
            assert moving_errors == [] and sampler.scrapes == 3
            assert sorted(moving[1]) == [("orders", 1), ("orders", 7), ("payments", 2)]
            answers = await ask({1: url}, "/state-changes", {"topic": "orders", "partition": 0})
            return (logs, errors, sampler.scrapes, again), answers, None
        finally:
            await exporter.stop()

    (logs, errors, scrapes, again), answers, _ = asyncio.run(run())
    assert errors == [] and sorted(logs[1]) == [("orders", p) for p in (3, 4, 5, 9)]
    assert logs[1][("orders", 4)].log_end_offset == 104 and logs[1][("orders", 4)].size == 1004
    assert scrapes == 3 and again[0] is logs  # the second call was served from the last round
    rows, errors = merge_history(answers)
    assert errors == [] and [r.to_state for r in rows] == [
        "OnlinePartition",
        "NewReplica",
        "NewPartition",
    ]
    assert rows[0].note == "leader 2, ISR [2, 3]"
