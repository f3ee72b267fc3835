"""Follower truncation by leader epoch (KIP-101, KIP-279): the two scenarios in which truncating
to the high watermark loses acknowledged records or lets replicas diverge, played against real
brokers, with the outcome read from each replica's log files.

(a) *A follower restarts with a stale HW, then the leader dies.* B's HW checkpoint is far behind
    its log (the checkpoint interval is ten minutes and B is SIGKILLed). B comes back, catches up
    and rejoins the ISR while a client keeps writing with acks=all; the moment it is back, the
    leader A is killed and B takes over. Every acknowledged record must be on B, and A, when it
    returns, must follow B and end byte-identical to it.
(b) *Two replicas crash and come back with different records at the same offsets.* With
    min.insync.replicas=1 and unclean election enabled for the topic: the follower B dies, acks=1
    records go to the leader A alone, A dies, B returns first and is elected (uncleanly), takes
    new records at the same offsets, then A returns. A must truncate its divergent suffix (found
    by leader epoch, not by HW) so that both logs end byte-identical.
(c) The same divergence with a *clean* election and min.insync.replicas=2: B is frozen (still in
    the ISR) while A takes acks=1 records, A dies, B is elected from the ISR. Nothing that was
    acknowledged with acks=all is lost, and A again truncates what only it had.

Each partition is led and followed by the two brokers that are not the controller, so killing
them never costs a controller failover on top of the scenario.
"""

from __future__ import annotations

from collections.abc import Callable

from kio.schema.errors import ErrorCode

from odradek.cluster.replica_manager import HIGH_WATERMARK_CHECKPOINT
from odradek.log.checkpoints import read_offset_checkpoint
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._replication import (
    AckedProducer,
    StoredBatch,
    StreamingProducer,
    assert_acknowledged_present,
    create_topic,
    log_end_offset,
    produce_raw,
    read_committed,
    records_of,
    replica_batches,
    unique_topic,
    wait_for_identical_replicas,
    wait_for_isr,
    wait_for_zk_leader,
    zk_partition_state,
)

TIMEOUT_S = 60.0
# A dead leader's session expires after 6 s (the development default); the election follows.
ELECTION_TIMEOUT_S = 25.0
LAG_TIME_MS = 3000


def _two_non_controllers(cluster: LocalCluster) -> tuple[int, int]:
    controller = cluster.controller_id()
    a, b = (broker_id for broker_id in cluster.broker_ids if broker_id != controller)
    return a, b


def _produce_one_by_one(
    cluster: LocalCluster, broker_id: int, topic: str, values: list[bytes], acks: int
) -> dict[int, bytes]:
    """Each value as its own batch, straight to one broker; offset -> value of each accepted."""
    accepted = {}
    for value in values:
        answer = produce_raw(cluster.broker(broker_id), topic, 0, [value], acks=acks)
        assert answer.error == ErrorCode.none, (value, answer)
        accepted[answer.base_offset] = value
    return accepted


def _values(batches: list[StoredBatch]) -> dict[int, bytes | None]:
    return {r.offset: r.value for r in records_of(batches)}


def test_follower_restarted_with_a_stale_high_watermark_keeps_acknowledged_records(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(
        brokers=3,
        replica_lag_time_max_ms=LAG_TIME_MS,
        replica_high_watermark_checkpoint_interval_ms=600_000,
    )
    a, b = _two_non_controllers(cluster)
    topic = unique_topic("stale-hw")
    create_topic(cluster, topic, [[a, b]], {"min.insync.replicas": "1"})
    producer = AckedProducer(cluster.bootstrap_servers, acks="all", batch_num_messages=10)
    first = producer.send(topic, [b"before-restart-%d" % i for i in range(100)], partition=0)
    assert not first.failed
    wait_for_identical_replicas(cluster, [a, b], topic, 0, TIMEOUT_S, min_end_offset=100)

    # B crashes; its HW checkpoint (if any) is far behind the 100 records it holds.
    cluster.kill(b)
    checkpoint = read_offset_checkpoint(cluster.broker(b).data_dir / HIGH_WATERMARK_CHECKPOINT)
    assert checkpoint.get((topic, 0), 0) < 100, "the scenario needs a stale HW checkpoint"
    assert log_end_offset(replica_batches(cluster.broker(b), topic, 0)) == 100
    wait_for_isr(cluster, topic, 0, [a], TIMEOUT_S)

    stream = StreamingProducer(
        cluster.bootstrap_servers, topic, "around-restart", acks="all", partition=0
    ).start()
    try:
        wait_until(lambda: stream.acknowledged_count() >= 100, TIMEOUT_S, "writes while B is down")
        # B returns, truncates by leader epoch (not to its stale HW), catches up and rejoins...
        cluster.start_broker(b)
        wait_for_isr(cluster, topic, 0, [a, b], TIMEOUT_S)
        # ...and the leader dies at once. B is the only ISR member left: it must be elected.
        cluster.kill(a)
        acknowledged_when_a_died = stream.acknowledged_count()
        state = wait_for_zk_leader(
            cluster, topic, 0, lambda s: s.leader == b, ELECTION_TIMEOUT_S, f"broker {b} to lead"
        )
        assert list(state.isr) == [b]
        wait_until(
            lambda: stream.acknowledged_count() >= acknowledged_when_a_died + 100,
            TIMEOUT_S,
            "writes to the new leader",
        )
    except BaseException:
        stream.abandon()
        raise
    second = stream.stop()
    assert not second.failed, second.failed[:5]

    acked = {**first.acknowledged_by_partition()[0], **second.acknowledged_by_partition()[0]}
    read = read_committed(cluster.broker(b), topic, 0)
    assert read.error == ErrorCode.none
    assert_acknowledged_present(acked, read.records, f"the new leader {b}")

    # A returns as a follower of B and ends with exactly B's log.
    cluster.start_broker(a)
    wait_for_isr(cluster, topic, 0, [a, b], TIMEOUT_S)
    end = log_end_offset(replica_batches(cluster.broker(b), topic, 0))
    common = wait_for_identical_replicas(cluster, [b, a], topic, 0, TIMEOUT_S, min_end_offset=end)
    assert_acknowledged_present(acked, records_of(common), "both replicas' files")


def test_divergent_logs_after_an_unclean_election_are_healed_by_leader_epoch(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(brokers=3, replica_lag_time_max_ms=LAG_TIME_MS)
    a, b = _two_non_controllers(cluster)
    topic = unique_topic("unclean")
    create_topic(
        cluster,
        topic,
        [[a, b]],
        {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
    )
    committed = _produce_one_by_one(cluster, a, topic, [b"both-%d" % i for i in range(5)], -1)
    assert sorted(committed) == [0, 1, 2, 3, 4]
    wait_for_identical_replicas(cluster, [a, b], topic, 0, TIMEOUT_S, min_end_offset=5)
    first_epoch = zk_partition_state(cluster, topic, 0).leader_epoch

    # 1. The follower dies; records go to the leader alone (acks=1), then the leader dies.
    cluster.kill(b)
    wait_for_isr(cluster, topic, 0, [a], TIMEOUT_S)
    only_on_a = _produce_one_by_one(cluster, a, topic, [b"only-a-%d" % i for i in range(5)], 1)
    assert sorted(only_on_a) == [5, 6, 7, 8, 9]
    cluster.kill(a)
    a_files = replica_batches(cluster.broker(a), topic, 0)
    assert log_end_offset(a_files) == 10

    # 2. B returns first and is elected although it is not in the ISR (unclean election); it
    # takes different records at the same offsets.
    cluster.start_broker(b)
    state = wait_for_zk_leader(
        cluster, topic, 0, lambda s: s.leader == b, TIMEOUT_S, f"unclean election of {b}"
    )
    assert state.leader_epoch > first_epoch
    assert list(state.isr) == [b]
    only_on_b = _produce_one_by_one(cluster, b, topic, [b"only-b-%d" % i for i in range(7)], -1)
    assert sorted(only_on_b) == list(range(5, 12))
    b_files = replica_batches(cluster.broker(b), topic, 0)
    assert _values(b_files) == {**committed, **only_on_b}
    # The divergence the KIP describes: same offsets, different records, different epochs.
    assert _values(a_files)[5] != _values(b_files)[5]

    # 3. A returns: it must drop offsets 5..9 (found by OffsetForLeaderEpoch) and copy B's.
    cluster.start_broker(a)
    wait_for_isr(cluster, topic, 0, [a, b], TIMEOUT_S)
    common = wait_for_identical_replicas(cluster, [b, a], topic, 0, TIMEOUT_S, min_end_offset=12)
    assert common == b_files
    assert _values(common) == {**committed, **only_on_b}
    assert {batch.partition_leader_epoch for batch in common if batch.base_offset >= 5} == {
        state.leader_epoch
    }
    read = read_committed(cluster.broker(b), topic, 0)
    assert [(r.offset, r.value) for r in read.records] == sorted({**committed, **only_on_b}.items())


def test_clean_election_loses_no_acks_all_record_and_heals_the_divergence(
    make_cluster: Callable[..., LocalCluster],
):
    # A lag time long enough that B, frozen for a moment, stays in the ISR: the election that
    # follows A's death is clean.
    cluster = make_cluster(brokers=3, replica_lag_time_max_ms=20_000)
    a, b = _two_non_controllers(cluster)
    topic = unique_topic("clean")
    create_topic(cluster, topic, [[a, b]], {"min.insync.replicas": "2"})
    producer = AckedProducer(cluster.bootstrap_servers, acks="all", batch_num_messages=5)
    deliveries = producer.send(topic, [b"acks-all-%d" % i for i in range(50)], partition=0)
    assert not deliveries.failed
    acked = deliveries.acknowledged_by_partition()[0]
    wait_for_identical_replicas(cluster, [a, b], topic, 0, TIMEOUT_S, min_end_offset=50)
    first_epoch = zk_partition_state(cluster, topic, 0).leader_epoch

    # 1. B freezes (still in the ISR); A takes acks=1 records B never gets, and an acks=all record
    # that therefore is never acknowledged; then A dies and B resumes.
    cluster.stop(b)
    only_on_a = _produce_one_by_one(cluster, a, topic, [b"only-a-%d" % i for i in range(5)], 1)
    unacknowledged = produce_raw(
        cluster.broker(a), topic, 0, [b"never-acknowledged"], acks=-1, timeout_ms=300
    )
    assert unacknowledged.error == ErrorCode.request_timed_out, unacknowledged
    cluster.kill(a)
    cluster.cont(b)
    assert sorted(zk_partition_state(cluster, topic, 0).isr) == sorted([a, b])

    # 2. B is elected from the ISR once A's session expires: a clean election.
    state = wait_for_zk_leader(
        cluster, topic, 0, lambda s: s.leader == b, TIMEOUT_S, f"clean election of {b}"
    )
    assert state.leader_epoch > first_epoch
    assert list(state.isr) == [b]
    # B alone is below min.insync.replicas=2: acks=all is refused, acks=1 is not.
    refused = produce_raw(cluster.broker(b), topic, 0, [b"refused"], acks=-1)
    assert refused.error == ErrorCode.not_enough_replicas, refused
    b_end_at_election = log_end_offset(replica_batches(cluster.broker(b), topic, 0))
    # (B may have appended a fetch response that was waiting in its socket while it was frozen.)
    assert 50 <= b_end_at_election <= 50 + len(only_on_a)
    only_on_b = _produce_one_by_one(cluster, b, topic, [b"only-b-%d" % i for i in range(8)], 1)
    assert min(only_on_b) == b_end_at_election
    b_files = replica_batches(cluster.broker(b), topic, 0)
    assert_acknowledged_present(acked, records_of(b_files), f"the new leader {b}")

    # 3. A returns, truncates what only it had, and copies B's records.
    cluster.start_broker(a)
    wait_for_isr(cluster, topic, 0, [a, b], TIMEOUT_S)
    end = log_end_offset(b_files)
    common = wait_for_identical_replicas(cluster, [b, a], topic, 0, TIMEOUT_S, min_end_offset=end)
    assert common == b_files
    values = set(_values(common).values())
    assert b"never-acknowledged" not in values and b"refused" not in values
    assert {v for v in only_on_a.values() if v in values} == {
        v for o, v in only_on_a.items() if o < b_end_at_election
    }
    assert_acknowledged_present(acked, records_of(common), "both replicas' files")
    assert_acknowledged_present(only_on_b, records_of(common), "both replicas' files")
    # With both in the ISR again, acks=all is accepted.
    assert produce_raw(cluster.broker(b), topic, 0, [b"healed"], acks=-1).error == ErrorCode.none
