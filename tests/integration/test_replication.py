"""Leader/follower replication against real broker processes and real clients.

* acks=all from confluent-kafka: every replica's files hold byte-identical batches up to the HW,
  and the HW a consumer sees (ListOffsets latest) is the last acknowledged offset + 1.
* A follower refuses produce and consumer fetch requests with NOT_LEADER_OR_FOLLOWER (sent
  straight to it, so no client retry hides the answer).
* A leader killed mid-stream: confluent-kafka (acks=all, retries on) refreshes its metadata,
  follows the new leader, and every record it got acknowledged is readable afterwards; the killed
  broker comes back as a follower and ends byte-identical to the others.

The first two use the session's shared `cluster3` (no faults); the third its own cluster.
"""

from __future__ import annotations

from collections.abc import Callable

from kio.schema.errors import ErrorCode

from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._replication import (
    AckedProducer,
    StreamingProducer,
    assert_acknowledged_present,
    create_topic,
    fetch_records,
    latest_offset,
    produce_raw,
    read_committed,
    records_of,
    replica_records,
    unique_topic,
    wait_for_identical_replicas,
    wait_for_metadata,
    wait_for_zk_leader,
    zk_partition_state,
)

RECORDS = 3000
REPLICATION_TIMEOUT_S = 30.0
FAILOVER_TIMEOUT_S = 60.0


def test_acks_all_replicas_hold_identical_batches_up_to_the_high_watermark(
    cluster3: LocalCluster,
):
    topic = unique_topic("replicated")
    assignment = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
    create_topic(cluster3, topic, assignment, {"min.insync.replicas": "2"})
    # Small gzip batches: many batches per partition, each stored (and copied) as the producer
    # compressed it, so byte equality across replicas means nothing was re-encoded.
    producer = AckedProducer(
        cluster3.bootstrap_servers,
        acks="all",
        compression_type="gzip",
        batch_num_messages=40,
    )
    values = [f"record-{i}".encode() for i in range(RECORDS)]
    deliveries = producer.send(topic, values, keyed=True)
    assert not deliveries.failed, deliveries.failed[:5]
    acknowledged = deliveries.acknowledged_by_partition()
    assert sum(len(a) for a in acknowledged.values()) == RECORDS
    assert sorted(acknowledged) == [0, 1, 2], "the partitioner should have used every partition"

    for partition, replicas in enumerate(assignment):
        acked = acknowledged[partition]
        leader = cluster3.broker(replicas[0])
        error, high_watermark = latest_offset(leader, topic, partition)
        assert error == ErrorCode.none
        assert high_watermark == max(acked) + 1
        # No faults and no retries: the acknowledged offsets are exactly 0 .. HW-1.
        assert sorted(acked) == list(range(high_watermark))

        common = wait_for_identical_replicas(
            cluster3,
            replicas,
            topic,
            partition,
            REPLICATION_TIMEOUT_S,
            end_offset=high_watermark,
            min_end_offset=high_watermark,
        )
        assert common[0].base_offset == 0
        assert len(common) > 1
        leader_epoch = zk_partition_state(cluster3, topic, partition).leader_epoch
        assert {b.partition_leader_epoch for b in common} == {leader_epoch}
        assert_acknowledged_present(acked, records_of(common), f"the files of {replicas}")
        # What a consumer reads from the leader is exactly that, and stops at the HW.
        read = read_committed(leader, topic, partition)
        assert read.error == ErrorCode.none
        assert [(r.offset, r.value) for r in read.records] == sorted(acked.items())


def test_a_follower_refuses_produce_and_consumer_fetch(cluster3: LocalCluster):
    topic = unique_topic("follower-refuses")
    create_topic(cluster3, topic, [[1, 2, 3]])
    two_replicas = unique_topic("not-hosted")
    create_topic(cluster3, two_replicas, [[1, 2]])
    leader, follower, outsider = (cluster3.broker(b) for b in (1, 2, 3))

    accepted = produce_raw(leader, topic, 0, [b"to-the-leader"], acks=-1)
    assert (accepted.error, accepted.base_offset) == (ErrorCode.none, 0)

    for acks in (1, -1):
        refused = produce_raw(follower, topic, 0, [b"to-a-follower"], acks=acks)
        assert refused.error == ErrorCode.not_leader_or_follower, refused
    # A broker that knows the topic but hosts no replica of the partition answers the same way.
    refused = produce_raw(outsider, two_replicas, 0, [b"to-an-outsider"], acks=1)
    assert refused.error == ErrorCode.not_leader_or_follower, refused
    # Consumers may read only from the leader, too.
    assert fetch_records(follower, topic, 0, 0).error == ErrorCode.not_leader_or_follower
    assert latest_offset(follower, topic, 0)[0] == ErrorCode.not_leader_or_follower

    # The follower still copies the accepted record, and nothing else.
    def replicated() -> bool:
        return [r.value for r in replica_records(follower, topic, 0)] == [b"to-the-leader"]

    wait_until(replicated, REPLICATION_TIMEOUT_S, "the follower to copy the accepted record")
    assert [r.value for r in read_committed(leader, topic, 0).records] == [b"to-the-leader"]


def test_clients_follow_a_new_leader_after_the_leader_is_killed_mid_stream(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(brokers=3, replica_lag_time_max_ms=3000)
    controller = cluster.controller_id()
    # Lead from a broker that is not the controller: the failover measured is the partition's.
    old_leader = next(b for b in cluster.broker_ids if b != controller)
    replicas = [old_leader, *(b for b in cluster.broker_ids if b != old_leader)]
    topic = unique_topic("leader-killed")
    create_topic(cluster, topic, [replicas], {"min.insync.replicas": "2"})
    old_epoch = zk_partition_state(cluster, topic, 0).leader_epoch

    stream = StreamingProducer(
        cluster.bootstrap_servers, topic, "mid-stream", acks="all", partition=0
    ).start()
    try:
        wait_until(lambda: stream.acknowledged_count() >= 300, 30, "300 acknowledged records")
        cluster.kill(old_leader)
        acked_before_kill = stream.acknowledged_count()
        state = wait_for_zk_leader(
            cluster,
            topic,
            0,
            lambda s: s.leader not in (old_leader, -1),
            FAILOVER_TIMEOUT_S,
            "a new leader to be elected",
        )
        assert state.leader_epoch > old_epoch
        # The client finds the new leader by itself and goes on being acknowledged.
        wait_until(
            lambda: stream.acknowledged_count() >= acked_before_kill + 300,
            FAILOVER_TIMEOUT_S,
            "300 more acknowledged records after the leader change",
        )
    except BaseException:
        stream.abandon()
        raise
    deliveries = stream.stop()
    assert not deliveries.failed, deliveries.failed[:5]
    acked = deliveries.acknowledged_by_partition()[0]

    new_leader = cluster.broker(state.leader)
    read = read_committed(new_leader, topic, 0)
    assert read.error == ErrorCode.none
    assert_acknowledged_present(acked, read.records, f"the new leader {state.leader}")
    assert read.high_watermark >= max(acked) + 1

    # The old leader returns as a follower, truncates what it alone had, and catches up.
    cluster.start_broker(old_leader)
    survivors = [b for b in replicas if b != old_leader]
    wait_for_metadata(
        cluster,
        topic,
        0,
        cluster.broker_ids,
        lambda v: sorted(v.isr) == sorted(replicas) and v.leader == state.leader,
        FAILOVER_TIMEOUT_S,
        "the old leader back in the ISR",
    )
    common = wait_for_identical_replicas(
        cluster,
        [*survivors, old_leader],
        topic,
        0,
        REPLICATION_TIMEOUT_S,
        min_end_offset=read.high_watermark,
    )
    assert_acknowledged_present(acked, records_of(common), "every replica's files")
