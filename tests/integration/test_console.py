"""The web console against a real 3-broker cluster (the session's shared `cluster3`), through
Starlette's TestClient: every page's content checked against what ZooKeeper, real clients and the
brokers' metrics say, and the operator actions' confirmation step and effects as an admin client
sees them. The browser test (tests/browser) drives the same pages in headless chromium.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from odradek.console.app import ConsoleSettings, create_app
from odradek.console.broker_json import json_url
from odradek.console.broker_metrics import scrape_url
from odradek.console.leader_offsets import LeaderOffsets
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._replication import create_topic, unique_topic

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def console(cluster3: LocalCluster) -> Iterator[TestClient]:
    settings = ConsoleSettings(
        bootstrap_servers=cluster3.bootstrap_servers,
        zookeeper=cluster3.zookeeper_connect,
        metrics={b.id: b.metrics for b in cluster3.brokers if b.metrics},
        metrics_interval_s=0.5,
    )
    app = create_app(settings)
    app.state.console.zk.max_age_s = 0.2
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="module")
def admin(cluster3: LocalCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster3.bootstrap_servers, "log_level": 0})


def fresh(client: TestClient, url: str, contains: str, **kwargs: object) -> str:
    """The page at `url` once it contains `contains` (the console serves its last snapshot and
    refreshes in the background, as a live page polling it would see)."""
    found: dict[str, str] = {}

    def page() -> bool:
        answer = client.get(url, **kwargs)  # type: ignore[arg-type]
        assert answer.status_code == 200, answer.text[:2000]
        found["text"] = answer.text
        return contains in answer.text

    wait_until(page, TIMEOUT_S, f"{contains!r} on {url}", interval=0.2)
    return found["text"]


def produce(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]], partition: int
) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0})
    for key, value in records:
        producer.produce(topic, value, key, partition=partition, headers=[("h", b"v")])
    assert producer.flush(30) == 0


def partition_cells(text: str, partition: int) -> list[str]:
    """The text of each cell of a partition's row on a topic page."""
    row = re.search(rf'<tr data-partition="{partition}">(.*?)</tr>', text, re.S)
    assert row is not None, text[:3000]
    return [
        " ".join(re.sub(r"<[^>]+>", "", cell).split())
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    ]


def confirmed(client: TestClient, slug: str, form: dict[str, str]) -> Any:
    """Post an action's form, then confirm it with the token of the confirmation page, as a
    browser does; the final answer."""
    review = client.post(f"/actions/{slug}", data=form)
    assert review.status_code == 200, review.text[:2000]
    token = re.search(r'name="token" value="([^"]+)"', review.text)
    assert token is not None, review.text[:2000]
    return client.post(
        f"/actions/{slug}", data={**form, "confirmed": "yes", "token": token.group(1)}
    )


def test_overview_shows_brokers_controller_and_partition_health(
    console: TestClient, cluster3: LocalCluster
) -> None:
    text = fresh(console, "/", 'id="brokers-alive">3 / 3<')
    controller = cluster3.controller_id()
    assert f'id="controller">{controller}<' in text
    for broker in cluster3.brokers:
        row = re.search(rf'<tr data-broker="{broker.id}">(.*?)</tr>', text, re.S)
        assert row is not None and "alive" in row.group(1)
        assert f"PLAINTEXT://{broker.host}:{broker.port}" in row.group(1)
    assert 'id="partitions-offline">0<' in text
    # The live region polls its fragment; two scrapes of the metrics give the throughput.
    fragment = fresh(console, "/fragments/overview", "messages in /s")
    assert fragment.startswith('<div id="overview"')


def test_topics_list_filters_and_pages_on_the_server(
    console: TestClient, cluster3: LocalCluster
) -> None:
    prefix = unique_topic("console-list")
    for i in range(3):
        create_topic(cluster3, f"{prefix}-{i}", [[1, 2], [2, 3]])
    text = fresh(console, f"/topics?q={prefix}", f"{prefix}-2")
    assert "3 topic(s) matching" in text
    assert all(f'data-topic="{prefix}-{i}"' in text for i in range(3))
    page2 = console.get(f"/topics?q={prefix}&size=2&page=2").text
    assert f'data-topic="{prefix}-2"' in page2 and f'data-topic="{prefix}-0"' not in page2
    assert "topics 3&ndash;3 of 3" in page2
    # htmx asks for the table only.
    fragment = console.get(
        f"/topics?q={prefix}-1", headers={"HX-Request": "true", "HX-Target": "topics-table"}
    ).text
    assert fragment.startswith('<div id="topics-table">') and "<html" not in fragment
    assert f'data-topic="{prefix}-1"' in fragment and f'data-topic="{prefix}-0"' not in fragment
    assert "healthy" in fragment


def test_topic_page_shows_replicas_high_watermarks_and_log_end_offsets(
    console: TestClient, cluster3: LocalCluster
) -> None:
    topic = unique_topic("console-topic")
    create_topic(cluster3, topic, [[1, 2, 3], [2, 3, 1]], {"retention.ms": "3600000"})
    produce(cluster3.bootstrap_servers, topic, [(b"k", b"v%d" % i) for i in range(7)], 1)
    # Partition 1: leader 2, replicas 2, 3, 1, 7 records: HW 7, and each replica's LEO 7 once
    # the followers have fetched (from the brokers' metrics).
    found: dict[str, object] = {}

    def caught_up() -> bool:
        found["text"] = text = console.get(f"/topics/{topic}").text
        found["cells"] = cells = partition_cells(text, 1)
        return cells[6] == "2: 7 · 3: 7 · 1: 7"

    wait_until(caught_up, TIMEOUT_S, "every replica's log end offset at 7", interval=0.2)
    text, cells = str(found["text"]), list(found["cells"])  # type: ignore[call-overload]
    assert cells[1].startswith("2") and cells[3] == "2, 3, 1" and cells[5] == "7", cells
    assert sorted(cells[4].split(", ")) == ["1", "2", "3"]
    assert cells[7].endswith("B")  # the leader's log size, from its metrics
    configs = re.search(r'<tr class="" data-config="retention.ms">(.*?)</tr>', text, re.S)
    assert configs is not None and "3600000" in configs.group(1)
    assert "DYNAMIC_TOPIC_CONFIG" in configs.group(1)
    missing = console.get("/topics/no-such-topic-here")
    assert missing.status_code == 404 and "does not exist" in missing.text


class StaleLeaders:
    """A `CurrentLeaders` that keeps naming the leaders it was given (a ZooKeeper read that has
    not seen a move either)."""

    def __init__(self, leaders: dict[tuple[str, int], int]) -> None:
        self.named = leaders

    async def leaders(self, partitions: Any) -> dict[tuple[str, int], int]:
        return {key: self.named[key] for key in partitions if key in self.named}


def test_topic_page_high_watermarks_are_the_leaders_own_even_when_a_leader_moved(
    console: TestClient, cluster3: LocalCluster
) -> None:
    """The page's high watermarks, asked of the leaders the console's snapshot names, are what a
    consumer's get_watermark_offsets says. When the leader named is not the leader any more (here
    the request names a follower, a broker without the partition, or none), the partition's leader
    is read again from ZooKeeper and the offset is still right; a partition nobody leads, or whose
    leader cannot be found, gets its own error and the others their offsets."""
    topic = unique_topic("console-hw")
    assignment = [[1, 2], [2, 3], [3, 1], [1, 3], [2, 1], [3, 2]]
    create_topic(cluster3, topic, assignment)
    for p in range(6):
        produce(cluster3.bootstrap_servers, topic, [(None, b"v")] * (3 * p + 1), p)
    consumer = Consumer(
        {"bootstrap.servers": cluster3.bootstrap_servers, "group.id": "hw-check", "log_level": 0}
    )
    try:
        expected = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(6)
        }
    finally:
        consumer.close()
    assert expected == {p: 3 * p + 1 for p in range(6)}
    wait_until(
        lambda: all(
            partition_cells(console.get(f"/topics/{topic}").text, p)[5] == str(expected[p])
            for p in range(6)
        ),
        TIMEOUT_S,
        "the page's high watermarks",
        interval=0.2,
    )
    assert console.portal is not None  # the app's event loop, where the clients live
    leader_offsets = console.app.state.console.leader_offsets  # type: ignore[attr-defined]
    moved = {(topic, p): assignment[p][1] for p in range(6)}  # a follower of each
    moved[(topic, 0)] = -1  # none
    moved[(topic, 1)] = 1  # a broker without a replica of it
    got = console.portal.call(leader_offsets.high_watermarks, moved)
    assert got == {(topic, p): expected[p] for p in range(6)}
    got = console.portal.call(leader_offsets.high_watermarks, {(topic, 6): 1, (topic, 2): 3})
    assert got[(topic, 2)] == expected[2] and str(got[(topic, 6)]) == "no leader"

    async def with_stale_zookeeper() -> dict[tuple[str, int], Any]:
        stubborn = LeaderOffsets(cluster3.bootstrap_servers, StaleLeaders(moved))
        try:
            return await stubborn.high_watermarks({(topic, 2): 1, (topic, 3): 1})
        finally:
            stubborn.close()

    got = console.portal.call(with_stale_zookeeper)
    assert got[(topic, 3)] == expected[3]
    assert str(got[(topic, 2)]).startswith("NOT_LEADER_OR_FOLLOWER: from broker 1"), got


def test_record_browser_latest_by_offset_and_formats(
    console: TestClient, cluster3: LocalCluster
) -> None:
    topic = unique_topic("console-records")
    create_topic(cluster3, topic, [[1, 2]])
    records = [(b"key-%d" % i, json.dumps({"n": i}).encode()) for i in range(30)]
    produce(cluster3.bootstrap_servers, topic, records, 0)
    fresh(console, "/topics", topic)
    latest = console.get(f"/topics/{topic}/records?partition=0&count=5").text
    assert re.findall(r'data-offset="(\d+)"', latest) == ["25", "26", "27", "28", "29"]
    assert "log start offset 0, high watermark 30" in latest
    assert "key-29" in latest and "{&#34;n&#34;: 29}" in latest
    by_offset = console.get(
        f"/topics/{topic}/records?partition=0&count=3&mode=offset&offset=10&format=json"
    ).text
    assert re.findall(r'data-offset="(\d+)"', by_offset) == ["10", "11", "12"]
    assert "&#34;n&#34;: 10" in by_offset
    hexed = console.get(f"/topics/{topic}/records?partition=0&count=1&format=hex").text
    assert "6b 65 79 2d 32 39" in hexed  # "key-29"
    by_time = console.get(
        f"/topics/{topic}/records?partition=0&count=2&mode=timestamp&timestamp=0"
    ).text
    assert re.findall(r'data-offset="(\d+)"', by_time) == ["0", "1"]
    bad = console.get(f"/topics/{topic}/records?mode=timestamp&timestamp=yesterday")
    assert bad.status_code == 200 and "Bad offset or timestamp" in bad.text


def test_consumer_group_page_shows_members_and_lag(
    console: TestClient, cluster3: LocalCluster
) -> None:
    topic = unique_topic("console-group")
    group = unique_topic("console-g")
    create_topic(cluster3, topic, [[1, 2], [2, 3]])
    produce(cluster3.bootstrap_servers, topic, [(None, b"x")] * 10, 0)
    produce(cluster3.bootstrap_servers, topic, [(None, b"y")] * 4, 1)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster3.bootstrap_servers,
            "group.id": group,
            "client.id": "console-test-client",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        consumer.subscribe([topic])
        wait_until(lambda: consumer.poll(0.5) is not None or consumer.assignment(), TIMEOUT_S)
        consumer.commit(
            offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 4)], asynchronous=False
        )
        text = fresh(console, f"/groups/{group}", 'id="group-lag">7<')
        assert 'id="group-state">Stable<' in text
        assert "console-test-client" in text
        row = re.search(rf'<tr data-partition="{topic}-0">(.*?)</tr>', text, re.S)
        assert row is not None
        numbers = re.findall(r'<td class="num">(-?\d+|-)</td>', row.group(1))
        assert numbers == ["0", "3", "10", "7"], numbers
        assert group in fresh(console, "/groups", group)
    finally:
        consumer.close()
    # An empty group's offsets can be reset (behind the confirmation step).
    form = {"group": group, "topic": topic, "partitions": "0", "to": "latest", "offset": ""}
    confirm = console.post("/actions/reset-offsets", data=form)
    assert confirm.status_code == 200 and "Commit the latest offset for group" in confirm.text
    done = confirmed(console, "reset-offsets", form)
    assert done.status_code == 200, done.text
    assert f"{topic}-0: 10" in done.text
    fresh(console, f"/groups/{group}", 'id="group-lag">0<')


def test_actions_need_confirmation_and_do_what_they_say(
    console: TestClient, cluster3: LocalCluster, admin: AdminClient
) -> None:
    topic = unique_topic("console-action")
    form = {
        "topic": topic,
        "partitions": "2",
        "replication_factor": "2",
        "configs": "retention.ms=60000",
    }
    confirm = console.post("/actions/create-topic", data=form)
    assert confirm.status_code == 200
    assert f"Create topic {topic} with 2 partition(s), replication factor 2." in confirm.text
    assert topic not in admin.list_topics(timeout=10).topics  # nothing done before confirming
    forged = console.post("/actions/create-topic", data={**form, "confirmed": "yes"})
    assert forged.status_code == 403 and "did not come from this console" in forged.text
    assert topic not in admin.list_topics(timeout=10).topics
    done = confirmed(console, "create-topic", form)
    assert done.status_code == 200 and f"Created topic {topic}." in done.text
    metadata = wait_until(
        lambda: (m := admin.list_topics(topic, timeout=10).topics[topic]).error is None and m,
        TIMEOUT_S,
    )
    assert len(metadata.partitions) == 2
    assert all(len(p.replicas) == 2 for p in metadata.partitions.values())

    bad = console.post("/actions/create-topic", data={**form, "topic": "no spaces"})
    assert bad.status_code == 400 and "Invalid topic name" in bad.text
    again = console.post("/actions/create-topic", data=form)
    assert again.status_code == 400 and "already exists" in again.text

    added = confirmed(console, "add-partitions", {"topic": topic, "total": "4"})
    assert added.status_code == 200 and f"{topic} now has 4 partitions." in added.text
    wait_until(
        lambda: len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 4, TIMEOUT_S
    )

    alter = {"topic": topic, "name": "retention.ms", "operation": "set", "value": "120000"}
    assert confirmed(console, "alter-config", alter).status_code == 200
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["retention.ms"].value == "120000"

    elect = confirmed(console, "elect-preferred", {"topic": topic, "partitions": "all"})
    assert elect.status_code == 200 and "Elected the preferred leader" in elect.text

    confirm_delete = console.post("/actions/delete-topic", data={"topic": topic})
    assert "every record in it is lost" in confirm_delete.text
    deleted = confirmed(console, "delete-topic", {"topic": topic})
    assert deleted.status_code == 200 and "Deletion of topic" in deleted.text
    wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, TIMEOUT_S)
    assert console.get("/actions/create-topic").status_code == 200
    assert console.get("/actions/no-such-action").status_code == 404


def test_command_line_mistakes_are_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "odradek.cli.main", "console", "--zookeeper", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip() == "odradek: error: --bootstrap-server is required (or --cluster-dir)"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "odradek.cli.main",
            "console",
            "--bootstrap-server",
            "127.0.0.1:1",
            "--zookeeper",
            "127.0.0.1:1",
            "--metrics",
            "one=http://x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "--metrics must be ID=" in result.stderr
    assert "Traceback" not in result.stderr


def state_changes(client: TestClient, topic: str, partition: int) -> str:
    """The state-changes table of a partition's history page."""
    answer = client.get(f"/topics/{topic}/partitions/{partition}")
    assert answer.status_code == 200, answer.text[:2000]
    table = re.search(r'<table id="state-changes">(.*?)</table>', answer.text, re.S)
    assert table is not None, answer.text[:3000]
    return table.group(1)


def test_partition_history_controller_page_and_the_topic_filter(
    console: TestClient, cluster3: LocalCluster
) -> None:
    """A new partition's history shows the controller's transitions that created it; the
    controller page shows the active controller's events; a non-controller's
    `/controller-events` says it is not the controller; `/metrics?topic=&partition=` of a real
    broker has only that replica's per-replica gauges, and a malformed one is a 400."""
    topic = unique_topic("console-history")
    create_topic(cluster3, topic, [[1, 2, 3], [2, 3, 1]])
    controller = cluster3.controller_id()
    wait_until(
        lambda: "leader 2, ISR [" in state_changes(console, topic, 1),
        TIMEOUT_S,
        "the partition's election in its state changes",
        interval=0.2,
    )
    table = state_changes(console, topic, 1)
    assert "NewPartition &rarr; OnlinePartition" in table
    assert re.search(r'class="replica-entry".*?NonExistentReplica &rarr; NewReplica', table, re.S)
    assert f'href="/topics/{topic}/partitions/1"' in console.get(f"/topics/{topic}").text
    assert console.get(f"/topics/{topic}/partitions/7").status_code == 404
    page = fresh(console, "/controller", f'id="controller-id">{controller}<')
    assert re.search(r'<tr data-event="\w+">', page), page[:3000]
    other = next(b for b in cluster3.brokers if b.id != controller and b.metrics)
    with urllib.request.urlopen(json_url(other.metrics, "/controller-events"), timeout=10) as r:
        answer = json.load(r)
    assert answer["active"] is False and answer["active_controller_id"] == controller
    metrics = cluster3.broker(2).metrics
    assert metrics is not None
    url = scrape_url(metrics, ["kafka_log_log_logendoffset_value"], topic, "1")
    with urllib.request.urlopen(url, timeout=10) as r:
        samples = [
            s.labels for f in text_string_to_metric_families(r.read().decode()) for s in f.samples
        ]
    assert samples == [{"topic": topic, "partition": "1"}]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{metrics}?topic={topic}&partition=2-1", timeout=10)
    assert refused.value.code == 400


def test_a_broker_failure_as_the_console_shows_it(make_cluster: Any) -> None:
    """SIGKILL the leader of a partition (not the controller): the overview shows the broker dead,
    the partition under-replicated and the leader's move; the partition's history page shows the
    controller's state changes with the new leader, and the controller page the BrokerChange
    event; after a restart the ISR grows back, and the console's history of changes has both
    (what the demo's user watches)."""
    cluster = make_cluster(3, replica_lag_time_max_ms=2000, zookeeper_session_timeout_ms=4000)
    topic = unique_topic("console-failover")
    controller = cluster.controller_id()
    victim = 2 if controller != 2 else 1
    assignment = [victim, *(b for b in (1, 2, 3) if b != victim)]
    create_topic(cluster, topic, [assignment])
    settings = ConsoleSettings(
        bootstrap_servers=cluster.bootstrap_servers,
        zookeeper=cluster.zookeeper_connect,
        metrics={b.id: b.metrics for b in cluster.brokers if b.metrics},
        metrics_interval_s=0.5,
    )
    app = create_app(settings)
    app.state.console.zk.max_age_s = 0.2
    with TestClient(app) as client:
        fresh(client, f"/topics/{topic}", "No leader or ISR change seen")
        wait_until(
            lambda: f"leader {victim}, ISR {assignment}" in state_changes(client, topic, 0),
            TIMEOUT_S,
            "the partition's first leader in its state changes",
            interval=0.2,
        )
        cluster.kill(victim)
        text = fresh(client, "/", 'id="brokers-alive">2 / 3<')
        assert re.search(rf'<tr data-broker="{victim}">.*?dead', text, re.S)
        history = fresh(client, f"/topics/{topic}", f"leader {victim} -&gt; ")
        assert f"ISR shrank {assignment} -&gt; " in history
        wait_until(
            lambda: (
                f"leader {victim} -&gt; " in state_changes(client, topic, 0)
                and "OnlineReplica &rarr; OfflineReplica" in state_changes(client, topic, 0)
            ),
            TIMEOUT_S,
            "the leader's move in the partition's state changes",
            interval=0.2,
        )
        fresh(client, "/controller", 'data-event="BrokerChange"')
        cluster.start_broker(victim)
        fresh(client, f"/topics/{topic}", "ISR expanded ")
        fresh(client, "/", 'id="partitions-under-replicated">0<')
