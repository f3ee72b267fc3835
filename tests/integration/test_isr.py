"""The ISR and the high watermark under paused followers (SIGSTOP), against real brokers.

* A follower frozen with SIGSTOP leaves the ISR after replica.lag.time.max.ms; with
  min.insync.replicas=2 acks=all writes go on; a second frozen follower takes the ISR below
  min.insync.replicas, so acks=all writes are refused with NOT_ENOUGH_REPLICAS while acks=1 writes
  succeed; after SIGCONT both catch up and rejoin, and ZooKeeper and every broker's Metadata say
  so. The pauses stay well inside the ZooKeeper session timeout: the followers are slow, not dead.
* A consumer never receives a record at or above the HW: while a follower in the ISR lags, acks=1
  records sit between the HW and the leader's LEO and stay invisible (in the same Fetch response
  that reports the HW, and to a real kafka-python consumer) until the follower catches up or
  leaves the ISR.

The leader of each partition is the controller: the followers we freeze must not take the
controller down with them, or ISR changes would never reach the brokers' metadata.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import KafkaError as ConfluentKafkaError
from kafka import KafkaConsumer, TopicPartition
from kio.schema.errors import ErrorCode

from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._replication import (
    AckedProducer,
    assert_acknowledged_present,
    create_topic,
    fetch_records,
    latest_offset,
    log_end_offset,
    produce_raw,
    read_committed,
    records_of,
    replica_batches,
    replica_records,
    unique_topic,
    wait_for_identical_replicas,
    wait_for_isr,
    wait_for_metadata,
    zk_partition_state,
)

LAG_TIME_MS = 3000
SESSION_TIMEOUT_MS = 30000
ISR_TIMEOUT_S = 30.0
# How much earlier than the pause a follower may have last been caught up: its last fetch can
# have waited replica.fetch.wait.max.ms (0.5 s) at the leader, and the one before that as long.
CAUGHT_UP_SLACK_S = 1.0


def _leader_and_followers(cluster: LocalCluster) -> tuple[int, int, int]:
    leader = cluster.controller_id()
    assert leader is not None
    first, second = (b for b in cluster.broker_ids if b != leader)
    return leader, first, second


def test_paused_followers_leave_and_rejoin_the_isr_and_min_insync_replicas_guards_acks_all(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(
        brokers=3,
        replica_lag_time_max_ms=LAG_TIME_MS,
        zookeeper_session_timeout_ms=SESSION_TIMEOUT_MS,
    )
    leader_id, first_id, second_id = _leader_and_followers(cluster)
    everyone = [leader_id, first_id, second_id]
    leader = cluster.broker(leader_id)
    topic = unique_topic("isr")
    create_topic(cluster, topic, [everyone], {"min.insync.replicas": "2"})
    producer = AckedProducer(cluster.bootstrap_servers, acks="all")
    producer.send(topic, [b"full-isr-%d" % i for i in range(20)], partition=0)
    assert produce_raw(leader, topic, 0, [b"full-isr-raw"], acks=-1).error == ErrorCode.none

    # 1. One follower freezes: it leaves the ISR after the lag time, not before.
    cluster.stop(first_id)
    paused_at = time.monotonic()
    state = wait_for_isr(cluster, topic, 0, [leader_id, second_id], ISR_TIMEOUT_S)
    assert time.monotonic() - paused_at >= LAG_TIME_MS / 1000 - CAUGHT_UP_SLACK_S
    assert state.leader == leader_id
    wait_for_metadata(
        cluster,
        topic,
        0,
        [leader_id, second_id],
        lambda v: sorted(v.isr) == sorted([leader_id, second_id]),
        ISR_TIMEOUT_S,
        "the shrunk ISR",
    )
    # Two in-sync replicas are enough for min.insync.replicas=2: acks=all goes on.
    answer = produce_raw(leader, topic, 0, [b"two-in-sync-raw"], acks=-1)
    assert answer.error == ErrorCode.none, answer
    deliveries = producer.send(topic, [b"two-in-sync-%d" % i for i in range(20)], partition=0)
    assert not deliveries.failed, deliveries.failed[:3]

    # 2. The second follower freezes too: the ISR falls below min.insync.replicas.
    cluster.stop(second_id)
    wait_for_isr(cluster, topic, 0, [leader_id], ISR_TIMEOUT_S)
    end_before_refusal = log_end_offset(replica_batches(leader, topic, 0))
    refused = produce_raw(leader, topic, 0, [b"refused"], acks=-1)
    assert refused.error == ErrorCode.not_enough_replicas, refused
    # A real client sees the same error (no retries, so it reports it instead of retrying).
    strict = AckedProducer(cluster.bootstrap_servers, acks="all", retries=0)
    report = strict.send(topic, [b"refused-by-client"], partition=0).reports[0]
    assert report.error is not None
    assert report.error.code() == ConfluentKafkaError.NOT_ENOUGH_REPLICAS, report.error
    # The refusal comes before the append: the leader's log did not grow.
    assert log_end_offset(replica_batches(leader, topic, 0)) == end_before_refusal
    # acks=1 does not wait for replicas, so min.insync.replicas does not apply to it.
    answer = produce_raw(leader, topic, 0, [b"acks-1-alone"], acks=1)
    assert (answer.error, answer.base_offset) == (ErrorCode.none, end_before_refusal)
    relaxed = AckedProducer(cluster.bootstrap_servers, acks="1")
    deliveries = relaxed.send(topic, [b"acks-1-client-%d" % i for i in range(5)], partition=0)
    assert not deliveries.failed, deliveries.failed[:3]

    # 3. Both resume: they catch up, rejoin the ISR, and everybody learns it.
    cluster.cont(first_id)
    cluster.cont(second_id)
    state = wait_for_isr(cluster, topic, 0, everyone, ISR_TIMEOUT_S)
    assert state.leader == leader_id
    wait_for_metadata(
        cluster,
        topic,
        0,
        everyone,
        lambda v: sorted(v.isr) == sorted(everyone) and v.leader == leader_id,
        ISR_TIMEOUT_S,
        "the full ISR",
    )
    leader_end = log_end_offset(replica_batches(leader, topic, 0))
    common = wait_for_identical_replicas(
        cluster, everyone, topic, 0, ISR_TIMEOUT_S, min_end_offset=leader_end
    )
    values = [r.value for r in replica_records(leader, topic, 0)]
    assert b"refused" not in values and b"refused-by-client" not in values
    acked = producer.deliveries.acknowledged_by_partition()[0]
    assert_acknowledged_present(acked, records_of(common), "the replicas' files")
    # With the ISR whole again, acks=all is accepted once more.
    answer = produce_raw(leader, topic, 0, [b"after-rejoin"], acks=-1)
    assert answer.error == ErrorCode.none, answer


def _kafka_python_consumer(cluster: LocalCluster, topic: str) -> KafkaConsumer:
    """A group-less consumer of partition 0 from the beginning (no coordinator needed)."""
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        enable_incremental_fetch_sessions=False,
    )
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek(TopicPartition(topic, 0), 0)
    return consumer


def _poll_offsets(consumer: KafkaConsumer, until: Callable[[list[int]], bool]) -> list[int]:
    """Poll until `until(offsets received so far)` holds; the offsets received."""
    received: list[int] = []

    def step() -> bool:
        for records in consumer.poll(timeout_ms=200).values():
            received.extend(r.offset for r in records)
        return until(received)

    wait_until(step, ISR_TIMEOUT_S, "the consumer to receive the expected records")
    return received


def test_a_consumer_never_receives_records_above_the_high_watermark(
    make_cluster: Callable[..., LocalCluster],
):
    # A lag time long enough that phase 1 finishes well inside it on a slow machine.
    lag_time_ms = 8000
    cluster = make_cluster(
        brokers=3,
        replica_lag_time_max_ms=lag_time_ms,
        zookeeper_session_timeout_ms=SESSION_TIMEOUT_MS,
    )
    leader_id, lagging_id, other_id = _leader_and_followers(cluster)
    everyone = [leader_id, lagging_id, other_id]
    leader = cluster.broker(leader_id)
    topic = unique_topic("below-hw")
    create_topic(cluster, topic, [everyone])
    for i in range(10):
        assert produce_raw(leader, topic, 0, [b"committed-%d" % i], acks=-1).error == ErrorCode.none
    consumer = _kafka_python_consumer(cluster, topic)
    try:
        assert _poll_offsets(consumer, lambda got: len(got) >= 10) == list(range(10))

        # 1. The follower lags but stays in the ISR: acks=1 records are written, not committed.
        cluster.stop(lagging_id)
        isr_version = zk_partition_state(cluster, topic, 0).zk_version
        for i in range(20):
            produced = produce_raw(leader, topic, 0, [b"pending-%d" % i], acks=1)
            assert produced.error == ErrorCode.none
        leader_end = log_end_offset(replica_batches(leader, topic, 0))
        assert leader_end == 30
        answer = fetch_records(leader, topic, 0, 0)
        assert answer.error == ErrorCode.none
        assert answer.records and answer.records[-1].offset + 1 <= answer.high_watermark
        above = fetch_records(leader, topic, 0, answer.high_watermark)
        assert (above.error, above.records) == (ErrorCode.none, [])
        hw_error, hw = latest_offset(leader, topic, 0)
        assert hw_error == ErrorCode.none
        # A real consumer, already at the HW, polls again and again and gets nothing new.
        for _ in range(5):
            polled = [r.offset for rs in consumer.poll(timeout_ms=100).values() for r in rs]
            assert polled == [], polled
        # As long as the ISR has not changed, the HW was held at the lagging follower's offset.
        assert zk_partition_state(cluster, topic, 0).zk_version == isr_version
        assert answer.high_watermark == hw == 10

        # 2. The follower catches up before the lag time: the HW moves to the LEO, ISR unchanged.
        cluster.cont(lagging_id)
        wait_until(
            lambda: latest_offset(leader, topic, 0)[1] == leader_end, ISR_TIMEOUT_S, "HW == LEO"
        )
        assert sorted(zk_partition_state(cluster, topic, 0).isr) == sorted(everyone)
        offsets = _poll_offsets(consumer, lambda got: len(got) >= 20)
        assert offsets == list(range(10, 30))

        # 3. Frozen past the lag time: records wait until the ISR shrinks, then become visible.
        cluster.stop(lagging_id)
        for i in range(20):
            assert produce_raw(leader, topic, 0, [b"shrink-%d" % i], acks=1).error == ErrorCode.none
        answer = fetch_records(leader, topic, 0, 30)
        assert answer.error == ErrorCode.none
        assert all(r.offset < answer.high_watermark for r in answer.records)
        if zk_partition_state(cluster, topic, 0).isr.count(lagging_id):
            assert answer.high_watermark == 30 and answer.records == []
        wait_for_isr(cluster, topic, 0, [leader_id, other_id], ISR_TIMEOUT_S + lag_time_ms / 1000)
        offsets = _poll_offsets(consumer, lambda got: len(got) >= 20)
        assert offsets == list(range(30, 50))
        assert latest_offset(leader, topic, 0)[1] == 50
    finally:
        consumer.close()
        cluster.cont(lagging_id)
    wait_for_isr(cluster, topic, 0, everyone, ISR_TIMEOUT_S)
    read = read_committed(leader, topic, 0)
    assert [r.offset for r in read.records] == list(range(50))
    wait_for_identical_replicas(cluster, everyone, topic, 0, ISR_TIMEOUT_S, min_end_offset=50)
