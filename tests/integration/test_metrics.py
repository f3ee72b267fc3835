"""Prometheus metrics of a real 3-broker cluster under load and faults.

One cluster for the module (its brokers' `metrics.listener` come from `LocalCluster.up`), scraped
over HTTP as Prometheus would, and checked against what real clients did: ActiveControllerCount
sums to 1; MessagesInPerSec/BytesInPerSec follow produced records (bytes in equal the leader's log
size of a fresh partition); a paused consumer's lag follows what is produced past its commit;
UnderReplicatedPartitions rises after a broker's SIGKILL and returns to 0 once it is restarted and
caught up, and the controller's LeaderElectionRateAndTimeMs counts the election; produce and fetch
traffic moves the request-time histograms (queue, send, percentiles), the per-listener byte and
connection totals and the log flush timer. The fault test runs last: it leaves every broker running.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._replication import create_topic, unique_topic

TIMEOUT_S = 60.0
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("metrics-cluster")
    cluster = LocalCluster.up(
        directory, 3, timeout=120, overrides={"replica.lag.time.max.ms": "3000"}
    )
    try:
        yield cluster
    finally:
        cluster.down()
        cluster.kill_all()


def scrape(cluster: LocalCluster, broker_id: int) -> Samples:
    url = cluster.broker(broker_id).metrics
    assert url is not None
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(
    cluster: LocalCluster, name: str, brokers: list[int] | None = None, **labels: str
) -> float:
    """`name` summed over the brokers' series whose labels include `labels`."""
    found = 0.0
    for broker_id in brokers or cluster.broker_ids:
        for (sample, sample_labels), value in scrape(cluster, broker_id).items():
            if sample == name and set(labels.items()) <= set(sample_labels):
                found += value
    return found


def test_cluster_json_records_each_brokers_metrics_endpoint(cluster: LocalCluster) -> None:
    loaded = LocalCluster.load(cluster.directory)
    urls = {b.id: b.metrics for b in loaded.brokers}
    assert all(u and u.startswith("http://127.0.0.1:") for u in urls.values())
    assert len(set(urls.values())) == 3


def test_active_controller_count_sums_to_one(cluster: LocalCluster) -> None:
    name = "kafka_controller_kafkacontroller_activecontrollercount_value"
    counts = {b: scrape(cluster, b)[(name, ())] for b in cluster.broker_ids}
    assert sum(counts.values()) == 1
    assert counts[cluster.controller_id()] == 1


def _produce(cluster: LocalCluster, topic: str, count: int, size: int = 100) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(count):
        producer.produce(topic, value=b"x" * size, key=str(i).encode())
    assert producer.flush(30) == 0


def test_messages_and_bytes_in_follow_produced_records(cluster: LocalCluster) -> None:
    topic = unique_topic("metrics-in")
    create_topic(cluster, topic, [[1, 2, 3]])
    produce_requests = total(
        cluster, "kafka_network_requestmetrics_requestspersec_count", request="Produce"
    )
    _produce(cluster, topic, 500)
    messages = "kafka_server_brokertopicmetrics_messagesinpersec_count"
    assert total(cluster, messages, topic=topic) == 500
    bytes_in = total(cluster, "kafka_server_brokertopicmetrics_bytesinpersec_count", topic=topic)
    leader_log_size = max(
        scrape(cluster, b).get(
            ("kafka_log_log_size_value", (("partition", "0"), ("topic", topic))), 0
        )
        for b in cluster.broker_ids
    )
    assert bytes_in == leader_log_size > 500 * 100
    # The all-topics series counts them too.
    assert total(cluster, messages, topic="") >= 500
    after = total(cluster, "kafka_network_requestmetrics_requestspersec_count", request="Produce")
    assert after > produce_requests


def test_consumer_lag_follows_a_paused_consumer(cluster: LocalCluster) -> None:
    topic = unique_topic("metrics-lag")
    group = unique_topic("metrics-group")
    create_topic(cluster, topic, [[1, 2, 3]])
    _produce(cluster, topic, 20)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        read = 0

        def consumed_five() -> bool:
            nonlocal read
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read += 1
            return read >= 5

        wait_until(consumed_five, TIMEOUT_S, "five records consumed", interval=0)
        consumer.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
        consumer.pause([TopicPartition(topic, 0)])

        def lag() -> float:
            return total(cluster, "kafka_consumergroup_lag", consumergroup=group, topic=topic)

        wait_until(lambda: lag() == 15, TIMEOUT_S, "lag 15 after committing 5 of 20")
        _produce(cluster, topic, 10)
        wait_until(lambda: lag() == 25, TIMEOUT_S, "lag 25 after 10 more records")
        commits = "kafka_server_group_coordinator_metrics_offset_commit_count"
        assert total(cluster, commits) >= 1
        consumer.commit(offsets=[TopicPartition(topic, 0, 30)], asynchronous=False)
        wait_until(lambda: lag() == 0, TIMEOUT_S, "lag 0 after committing the end")
        stable = "kafka_coordinator_group_groupmetadatamanager_numgroupsstable_value"
        assert total(cluster, stable) >= 1
    finally:
        consumer.close()


def test_request_times_network_totals_and_flushes_move_with_traffic(cluster: LocalCluster) -> None:
    """Produce (acks=all) and fetch through the leader of a one-partition topic whose segments
    roll every few records: its request-time histograms, byte and connection totals and log
    flushes all move; the percentiles are served per API and ordered."""
    topic = unique_topic("metrics-times")
    create_topic(cluster, topic, [[1, 2, 3]], configs={"segment.bytes": "2048"})
    before = scrape(cluster, 1)
    # Batches of at most 5 records (~600 bytes): a batch larger than a segment is refused
    # (RECORD_BATCH_TOO_LARGE, as in Kafka).
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "acks": "all", "batch.num.messages": 5}
    )
    failed: list[object] = []
    for i in range(200):
        producer.produce(
            topic,
            value=b"x" * 100,
            key=str(i).encode(),
            on_delivery=lambda error, _message: error is not None and failed.append(error),
        )
    assert producer.flush(30) == 0 and failed == []
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": unique_topic("metrics-times-group"),
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        read = 0

        def consumed_all() -> bool:
            nonlocal read
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read += 1
            return read >= 200

        wait_until(consumed_all, TIMEOUT_S, "the 200 records consumed", interval=0)
    finally:
        consumer.close()
    after = scrape(cluster, 1)

    def grew(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    times = "kafka_network_requestmetrics_"
    for request in ("Produce", "Fetch"):
        label = (("request", request),)
        for mbean in ("requestqueuetimems", "localtimems", "totaltimems", "responsesendtimems"):
            assert grew(f"{times}{mbean}_count", label) > 0, (mbean, request)
        percentiles = [
            after[(f"{times}totaltimems_{p}percentile", label)]
            for p in ("50th", "75th", "95th", "98th", "99th", "999th")
        ]
        assert percentiles == sorted(percentiles) and percentiles[-1] > 0
        assert percentiles[-1] <= after[(f"{times}totaltimems_max", label)] * 1.07
    # ApiVersions answers carry a top-level error code: counted, by code.
    api_versions = (("error", "NONE"), ("request", "ApiVersions"))
    assert grew(f"{times}errorspersec_count", api_versions) >= 1
    listener = (("listener", "PLAINTEXT"),)
    network = "kafka_server_socket_server_metrics_"
    assert grew(network + "incoming_byte_total", listener) > 200 * 100  # the produced values
    assert grew(network + "outgoing_byte_total", listener) > 200 * 100  # fetched back
    assert grew(network + "connection_creation_total", listener) >= 1
    assert grew(network + "successful_authentication_total", listener) >= 1
    # 200 records of ~170 bytes in 2 KB segments: rolls, each flushing the segment before.
    assert grew("kafka_log_logflushstats_logflushrateandtimems_count") > 0


def test_idle_followers_skip_their_reads_and_stay_in_sync(cluster: LocalCluster) -> None:
    """Followers' incremental fetches of idle partitions skip the leader's reads
    (`fetch_quiet`, counted by QuietPartitionsSkippedPerSec), and still count as caught up: over
    three replica.lag.time.max.ms (3 s here) no ISR shrinks; then acks=all writes to every
    partition, which need every follower to fetch them, are acknowledged."""
    topic = unique_topic("metrics-quiet")
    partitions = 12
    create_topic(
        cluster,
        topic,
        [[(p + i) % 3 + 1 for i in range(3)] for p in range(partitions)],
        {"min.insync.replicas": "3"},
    )
    _produce(cluster, topic, 60)
    urp = "kafka_server_replicamanager_underreplicatedpartitions_value"
    shrinks = "kafka_server_replicamanager_isrshrinkspersec_count"
    skipped = "kafka_server_fetchsessioncache_quietpartitionsskippedpersec_count"
    wait_until(lambda: total(cluster, urp) == 0, TIMEOUT_S, "no under-replicated partition")
    skipped_before = total(cluster, skipped)
    wait_until(
        lambda: total(cluster, skipped) >= skipped_before + 10 * partitions,
        TIMEOUT_S,
        "follower fetches skipping idle partitions",
    )
    shrinks_before = total(cluster, shrinks)
    watch_until = time.monotonic() + 3 * 3.0
    while time.monotonic() < watch_until:  # a window to watch, not a wait for a condition
        assert total(cluster, shrinks) == shrinks_before
        assert total(cluster, urp) == 0
        time.sleep(0.5)
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "acks": "all", "linger.ms": 0}
    )
    failed: list[object] = []
    for partition in range(partitions):
        producer.produce(
            topic,
            value=b"after-the-quiet",
            partition=partition,
            on_delivery=lambda error, _message: failed.append(error) if error else None,
        )
    assert producer.flush(30) == 0
    assert failed == []
    sessions = "kafka_server_fetchsessioncache_numincrementalfetchsessions_value"
    assert total(cluster, sessions) > 0


def test_under_replicated_partitions_follow_a_killed_broker(cluster: LocalCluster) -> None:
    topic = unique_topic("metrics-urp")
    create_topic(cluster, topic, [[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    _produce(cluster, topic, 30)
    urp = "kafka_server_replicamanager_underreplicatedpartitions_value"
    expands = "kafka_server_replicamanager_isrexpandspersec_count"
    wait_until(lambda: total(cluster, urp) == 0, TIMEOUT_S, "no under-replicated partition")
    controller = cluster.controller_id()
    victim = next(b for b in cluster.broker_ids if b != controller)
    live = [b for b in cluster.broker_ids if b != victim]
    expands_before = total(cluster, expands, live)
    elections = "kafka_controller_controllerstats_leaderelectionrateandtimems_count"
    elections_before = scrape(cluster, controller)[(elections, ())]
    assert cluster.kill(victim)
    try:
        # The dead broker's partitions stay led elsewhere with a smaller ISR: at least the two
        # partitions it did not lead, once the controller has dropped it from their ISR.
        wait_until(
            lambda: total(cluster, urp, live) >= 2,
            TIMEOUT_S,
            "under-replicated partitions after the kill",
        )
        # The victim led partition 1 (or 2): the controller's BrokerChange elected a new leader.
        wait_until(
            lambda: scrape(cluster, controller)[(elections, ())] > elections_before,
            TIMEOUT_S,
            "LeaderElectionRateAndTimeMs counted on the controller",
        )
        samples = scrape(cluster, controller)
        assert samples[(elections.replace("_count", "_99thpercentile"), ())] > 0
        assert samples[("kafka_controller_controllereventmanager_eventqueuetimems_count", ())] > 0
    finally:
        cluster.start_broker(victim, timeout=120)
    wait_until(lambda: total(cluster, urp) == 0, TIMEOUT_S, "URP back to 0 after the restart")
    assert total(cluster, expands, live) > expands_before


def test_the_grafana_dashboard_uses_only_served_names(cluster: LocalCluster) -> None:
    dashboard = Path(__file__).resolve().parents[2] / "monitoring" / "grafana-dashboard.json"
    exprs = [
        target["expr"]
        for panel in json.loads(dashboard.read_text())["panels"]
        for target in panel["targets"]
    ]
    used = {name for expr in exprs for name in re.findall(r"\bkafka_[a-z0-9_]+", expr)}
    served = {name for b in cluster.broker_ids for name, _labels in scrape(cluster, b)}
    assert used and used <= served, sorted(used - served)
