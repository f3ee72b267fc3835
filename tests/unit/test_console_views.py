"""The web console's pure logic: partition health, paging, filtering, lag arithmetic, record
rendering, the metrics parser and rates, and the validation of operator actions."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from odradek.console import actions, views
from odradek.console.broker_metrics import (
    BrokerScrape,
    ReplicaLog,
    cluster_rates,
    parse_scrape,
)
from odradek.console.snapshot import BrokerRow, RawPartition, build_snapshot


def snapshot_of(partitions: dict[str, list[RawPartition]], alive=(1, 2, 3), configs=None, **kw):
    return build_snapshot(
        registrations={b: BrokerRow(id=b, alive=True) for b in alive},
        known_broker_ids=kw.pop("known", ()),
        controller_id=1,
        controller_epoch=7,
        topics={name: (None, raws) for name, raws in partitions.items()},
        topic_configs=configs or {},
        deleting=kw.pop("deleting", ()),
        default_min_insync_replicas=kw.pop("default_min_isr", 1),
    )


def raw(p, replicas, leader, isr, adding=(), removing=()):
    return RawPartition(p, tuple(replicas), tuple(adding), tuple(removing), leader, 3, tuple(isr))


# -- health -----------------------------------------------------------------------------------


def test_health_follows_kafkas_definitions() -> None:
    snapshot = snapshot_of(
        {
            "t": [
                raw(0, [1, 2, 3], 1, [1, 2, 3]),  # healthy
                raw(1, [2, 3, 4], 2, [2, 3]),  # under-replicated (4 is dead)
                raw(2, [4, 1], 4, [4]),  # led by a dead broker: offline, under min ISR 2
                raw(3, [1, 2], -1, []),  # no leader
            ]
        },
        configs={"t": {"min.insync.replicas": "2"}},
    )
    topic = snapshot.topics["t"]
    assert topic.min_insync_replicas == 2
    assert (topic.counts.partitions, topic.counts.online, topic.counts.offline) == (4, 2, 2)
    assert topic.counts.under_replicated == 3
    assert topic.counts.under_min_isr == 2
    assert topic.status == "offline"
    assert snapshot.totals == topic.counts
    # Broker 4 is named by assignments but not registered: listed, dead.
    assert [(b.id, b.alive) for b in snapshot.brokers] == [
        (1, True),
        (2, True),
        (3, True),
        (4, False),
    ]
    assert snapshot.alive_brokers == 3


def test_min_isr_default_and_override_and_known_brokers() -> None:
    snapshot = snapshot_of(
        {"a": [raw(0, [1, 2], 1, [1])], "b": [raw(0, [1, 2], 1, [1])]},
        configs={"b": {"min.insync.replicas": "1"}},
        default_min_isr=2,
        known=(5,),
        deleting=("b",),
    )
    assert snapshot.topics["a"].counts.under_min_isr == 1
    assert snapshot.topics["a"].status == "under-min-isr"
    assert snapshot.topics["b"].counts.under_min_isr == 0
    assert snapshot.topics["b"].status == "deleting"
    assert snapshot.broker(5) == BrokerRow(id=5, alive=False)


def test_reassignments_are_collected() -> None:
    snapshot = snapshot_of({"t": [raw(0, [1, 2, 3], 1, [1, 2], adding=[3], removing=[])]})
    assert [(p.topic, p.partition, p.adding_replicas) for p in snapshot.reassignments] == [
        ("t", 0, (3,))
    ]


# -- paging and filtering ---------------------------------------------------------------------


@given(st.integers(0, 300), st.integers(-5, 50), st.integers(1, 60))
def test_paginate_covers_every_item_once(total: int, number: int, size: int) -> None:
    items = list(range(total))
    page = views.paginate(items, number, size)
    assert 1 <= page.number <= page.pages
    assert len(page.items) <= size
    assert list(page.items) == items[(page.number - 1) * size : page.number * size]
    pages = [views.paginate(items, n, size).items for n in range(1, page.pages + 1)]
    assert [i for p in pages for i in p] == items
    if total:
        assert page.first_index == (page.number - 1) * size + 1
        assert page.last_index == page.first_index + len(page.items) - 1
    assert page.has_next == (page.number < page.pages)


def test_parse_int_clamps_and_defaults() -> None:
    assert views.parse_int(None, 3, 1, 10) == 3
    assert views.parse_int("x", 3, 1, 10) == 3
    assert views.parse_int("0", 3, 1, 10) == 1
    assert views.parse_int("99", 3, 1, 10) == 10


def test_filter_topics_by_name_status_and_internal() -> None:
    snapshot = snapshot_of(
        {
            "orders": [raw(0, [1, 2], 1, [1, 2])],
            "Orders-eu": [raw(0, [1, 2], 1, [1])],
            "__consumer_offsets": [raw(0, [1], 1, [1])],
            "clicks": [raw(0, [1], -1, [])],
        }
    )
    topics = snapshot.topics.values()
    assert [t.name for t in views.filter_topics(topics, "ORDERS")] == ["Orders-eu", "orders"]
    assert [t.name for t in views.filter_topics(topics, status="unhealthy")] == [
        "Orders-eu",
        "clicks",
    ]
    assert [t.name for t in views.filter_topics(topics, status="offline")] == ["clicks"]
    assert "__consumer_offsets" not in [
        t.name for t in views.filter_topics(topics, include_internal=False)
    ]


def test_filter_topics_stays_fast_at_ten_thousand_topics() -> None:
    import time

    snapshot = snapshot_of(
        {f"topic-{i:05d}": [raw(0, [1, 2, 3], 1, [1, 2, 3])] for i in range(10_000)}
    )
    started = time.perf_counter()
    page = views.paginate(views.filter_topics(snapshot.topics.values(), "topic-09"), 2, 50)
    elapsed = time.perf_counter() - started
    assert page.total == 1000 and page.items[0].name == "topic-09050"
    assert elapsed < 0.5, elapsed


def test_filter_partitions() -> None:
    snapshot = snapshot_of(
        {"t": [raw(0, [1, 2], 1, [1, 2]), raw(1, [1, 2], 2, [1, 2]), raw(2, [1, 2], -1, [])]},
        default_min_isr=2,
    )
    partitions = snapshot.topics["t"].partitions
    assert [p.partition for p in views.filter_partitions(partitions, "not-preferred")] == [1, 2]
    assert [p.partition for p in views.filter_partitions(partitions, "offline")] == [2]
    assert [p.partition for p in views.filter_partitions(partitions, "under-min-isr")] == [2]
    assert len(views.filter_partitions(partitions, "all")) == 3


# -- lag --------------------------------------------------------------------------------------


def test_lag_arithmetic() -> None:
    assert views.lag(10, 25) == 15
    assert views.lag(30, 25) == 0  # committed past the end after a truncation
    assert views.lag(None, 25) is None
    assert views.lag(-1, 25) is None
    assert views.lag(10, None) is None
    rows = views.group_lag(
        {("t", 0): 5, ("t", 1): None},
        {("t", 0): 9, ("t", 1): 4, ("t", 2): 7},
        {("t", 2): ("m-1", "c-1", "/10.0.0.1"), ("t", 0): ("m-1", "c-1", "/10.0.0.1")},
    )
    assert [(r.partition, r.committed, r.log_end_offset, r.lag, r.client_id) for r in rows] == [
        (0, 5, 9, 4, "c-1"),
        (1, None, 4, None, None),
        (2, None, 7, None, "c-1"),
    ]
    assert views.total_lag(rows) == 4
    assert views.total_lag([]) is None


# -- records ----------------------------------------------------------------------------------


def test_render_bytes() -> None:
    assert views.render_bytes(None, "text") == "null"
    assert views.render_bytes(b"h\xffi", "text") == "h\\xffi"
    assert views.render_bytes(b'{"b":1,"a":[2]}', "json") == json.dumps(
        {"a": [2], "b": 1}, indent=2, sort_keys=True
    )
    assert views.render_bytes(b"not json", "json") == "not json"
    assert views.render_bytes(b"\x00\x10ab", "hex") == "00 10 61 62"


def test_start_offset_and_sparkline() -> None:
    assert views.start_offset(0, 100, 20) == 80
    assert views.start_offset(90, 100, 20) == 90
    assert views.sparkline([1.0]) == ""
    path = views.sparkline([0.0, 5.0, 10.0], width=100, height=40)
    points = [tuple(map(float, p.split(","))) for p in path[2:].split(" L ")]
    assert [x for x, _ in points] == [0.0, 50.0, 100.0]
    assert points[2][1] < points[1][1] < points[0][1]  # larger values higher up


def test_human_formats() -> None:
    assert views.human_bytes(512) == "512 B"
    assert views.human_bytes(1536) == "1.5 KiB"
    assert views.human_rate(1500) == "1.5k"
    assert views.human_rate(None) == "-"


# -- metrics ----------------------------------------------------------------------------------

SCRAPE = """\
# HELP kafka_server_brokertopicmetrics_messagesinpersec_count messages
# TYPE kafka_server_brokertopicmetrics_messagesinpersec_count untyped
kafka_server_brokertopicmetrics_messagesinpersec_count{topic=""} 1000.0
kafka_server_brokertopicmetrics_messagesinpersec_count{topic="t"} 900.0
kafka_server_brokertopicmetrics_bytesinpersec_count{topic=""} 64000.0
kafka_server_brokertopicmetrics_bytesoutpersec_count{topic=""} 32000.0
kafka_log_log_size_value{topic="t",partition="0"} 4096.0
kafka_log_log_logendoffset_value{topic="t",partition="0"} 57.0
kafka_log_log_logstartoffset_value{topic="t",partition="0"} 0.0
kafka_log_log_size_value{topic="we\\"ird",partition="3"} 1.0
kafka_controller_kafkacontroller_activecontrollercount_value 1.0
"""


def test_parse_scrape_keeps_totals_and_replica_logs() -> None:
    scrape = parse_scrape(2, SCRAPE, 10.0)
    assert scrape.counters == {"messages_in": 1000.0, "bytes_in": 64000.0, "bytes_out": 32000.0}
    assert scrape.logs[("t", 0)] == ReplicaLog(size=4096, log_end_offset=57, log_start_offset=0)
    assert scrape.logs[('we"ird', 3)] == ReplicaLog(size=1)
    assert scrape.gauges == {"active_controller": 1.0}


def test_cluster_rates_sum_brokers_and_survive_restarts() -> None:
    before = [
        BrokerScrape(1, 10.0, {"messages_in": 100.0, "bytes_in": 1000.0, "bytes_out": 0.0}),
        BrokerScrape(2, 10.0, {"messages_in": 500.0, "bytes_in": 5000.0, "bytes_out": 0.0}),
    ]
    after = [
        BrokerScrape(1, 12.0, {"messages_in": 300.0, "bytes_in": 3000.0, "bytes_out": 10.0}),
        # broker 2 restarted: its counter went down, so it counts from zero
        BrokerScrape(2, 12.0, {"messages_in": 40.0, "bytes_in": 400.0, "bytes_out": 0.0}),
        BrokerScrape(3, 12.0, {"messages_in": 1e9}),  # no earlier scrape: left out
    ]
    rates = cluster_rates(before, after)
    assert rates is not None
    assert rates.messages_in == pytest.approx(100.0 + 20.0)
    assert rates.bytes_in == pytest.approx(1000.0 + 200.0)
    assert rates.bytes_out == pytest.approx(5.0)
    failed = [BrokerScrape(1, 12.0, error="refused")]
    assert cluster_rates(before, failed) is None


# -- operator actions -------------------------------------------------------------------------


def test_topic_names_and_configs_are_validated() -> None:
    assert actions.topic_name(" good.name_1-x ") == "good.name_1-x"
    for bad in ("", ".", "..", "a b", "x" * 250, "ünï"):
        with pytest.raises(ValueError):
            actions.topic_name(bad)
    assert actions.parse_configs("retention.ms=1000\ncleanup.policy=compact,") == {
        "retention.ms": "1000",
        "cleanup.policy": "compact",
    }
    with pytest.raises(ValueError):
        actions.parse_configs("retention.ms")
    assert actions.parse_partitions("all", 3) == [0, 1, 2]
    assert actions.parse_partitions("2, 0,2", 3) == [0, 2]
    with pytest.raises(ValueError):
        actions.parse_partitions("3", 3)


def test_action_plans_refuse_what_the_cluster_would() -> None:
    snapshot = snapshot_of({"t": [raw(0, [1, 2], 1, [1, 2]), raw(1, [2, 1], 1, [1, 2])]})
    create = actions.ACTIONS["create-topic"].plan
    plan = create(
        {"topic": "new", "partitions": "6", "replication_factor": "3", "configs": "a=b"}, snapshot
    )
    assert plan.params == {"name": "new", "partitions": 6, "rf": 3, "configs": {"a": "b"}}
    assert "6 partition(s), replication factor 3" in plan.summary[0]
    with pytest.raises(ValueError, match="already exists"):
        create({"topic": "t", "partitions": "1", "replication_factor": "1"}, snapshot)
    with pytest.raises(ValueError, match="at least 1"):
        create({"topic": "u", "partitions": "0", "replication_factor": "1"}, snapshot)
    add = actions.ACTIONS["add-partitions"].plan
    with pytest.raises(ValueError, match="above the current 2"):
        add({"topic": "t", "total": "2"}, snapshot)
    assert add({"topic": "t", "total": "5"}, snapshot).params == {"name": "t", "total": 5}
    with pytest.raises(ValueError, match="does not exist"):
        actions.ACTIONS["delete-topic"].plan({"topic": "missing"}, snapshot)
    elect = actions.ACTIONS["elect-preferred"].plan({"topic": "t", "partitions": ""}, snapshot)
    assert elect.params == {"topic": "t", "partitions": [0, 1]}
    assert "[1]" in elect.summary[1]  # partition 1 is led by 1, its preferred replica is 2
    reset = actions.ACTIONS["reset-offsets"].plan
    assert reset(
        {"group": "g", "topic": "t", "partitions": "1", "to": "offset", "offset": "7"}, snapshot
    ).params == {"group": "g", "topic": "t", "partitions": [1], "to": "offset", "offset": 7}
    with pytest.raises(ValueError, match="Unknown reset target"):
        reset({"group": "g", "topic": "t", "to": "sideways"}, snapshot)
    alter = actions.ACTIONS["alter-config"].plan
    assert (
        alter({"topic": "t", "name": "retention.ms", "operation": "delete"}, snapshot).params[
            "value"
        ]
        is None
    )


# -- history ----------------------------------------------------------------------------------


def test_diff_snapshots_reports_elections_isr_changes_and_topics() -> None:
    from odradek.console.snapshot import diff_snapshots

    before = snapshot_of(
        {
            "t": [raw(0, [1, 2, 3], 1, [1, 2, 3]), raw(1, [2, 3, 1], 2, [2, 3, 1])],
            "gone": [raw(0, [1], 1, [1])],
        }
    )
    after = snapshot_of(
        {
            "t": [
                RawPartition(0, (1, 2, 3), (), (), 2, 4, (2, 3)),  # broker 1 died: new leader
                raw(1, [2, 3, 1], 2, [2, 3]),  # ISR shrank, same leader and epoch
                raw(2, [3, 1, 2], 3, [3, 1, 2]),  # partition added
            ],
            "new": [raw(p, [1], 1, [1]) for p in range(500)],
        }
    )
    changes = diff_snapshots(before, after)
    assert [(c.topic, c.partition, c.kind) for c in changes] == [
        ("gone", -1, "topic-deleted"),
        ("new", -1, "topic-created"),
        ("t", 0, "leader"),
        ("t", 1, "isr"),
        ("t", 2, "created"),
    ]
    assert changes[1].description == "topic created with 500 partition(s)"
    assert changes[2].description == "leader 1 -> 2 (epoch 4); ISR shrank [1, 2, 3] -> [2, 3]"
    assert changes[3].description == "ISR shrank [2, 3, 1] -> [2, 3]"
    back = diff_snapshots(after, before)
    assert [c.description for c in back if c.topic == "t"][1] == "ISR expanded [2, 3] -> [2, 3, 1]"
    assert diff_snapshots(after, after) == []
