"""Zombie leaders: a broker that still believes it leads a partition after the controller has
moved on must not acknowledge writes, and whatever it accepted meanwhile must not survive.

* *Frozen past its session.* The leader is SIGSTOPped longer than zookeeper.session.timeout.ms;
  the controller elects another ISR member with a new leader epoch. On SIGCONT the old leader
  tries to shrink the ISR (its followers have not fetched for seconds); that conditional write
  does not land (ZooKeeper keeps the new leader's state), an acks=all produce sent straight to it
  is never acknowledged, it soon answers NOT_LEADER_OR_FOLLOWER to everything, and the records it
  took in the moment before it learnt its new role are truncated when it follows the new leader.
* *ISR write rejected on the znode version.* The partition state znode changes behind the
  leader's back (as when the controller has written a new state whose LeaderAndIsr has not reached
  the leader yet). When a follower falls behind, the leader's ISR shrink names the old znode
  version and is rejected: from then on the leader refuses produce requests with
  NOT_LEADER_OR_FOLLOWER, at any acks, until the controller tells it its role.

In both, a confluent-kafka producer (acks=all) writes throughout, bootstrapped from every broker:
every record it got acknowledged is on the new leader and, once the old leader has caught up, in
every replica's files. Produce requests to the old leader go over the project's own
`BrokerConnection` to that broker alone, so no client retry or metadata refresh hides its answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kio.schema.errors import ErrorCode

from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._replication import (
    StreamingProducer,
    assert_acknowledged_present,
    create_topic,
    log_end_offset,
    produce_raw,
    read_committed,
    records_of,
    replica_batches,
    rewrite_partition_state,
    unique_topic,
    wait_for_identical_replicas,
    wait_for_isr,
    wait_for_metadata,
    wait_for_zk_leader,
    zk_partition_state,
)

LAG_TIME_MS = 3000
SESSION_TIMEOUT_MS = 6000
TIMEOUT_S = 45.0
STREAM_SETTINGS = {
    # A frozen leader never answers: give up on a request after 5 s and look for the new leader.
    "request_timeout_ms": 5000,
    "socket_timeout_ms": 5000,
}


def _zombie_values(cluster: LocalCluster, broker_ids: list[int], topic: str) -> list[bytes]:
    return [
        r.value
        for b in broker_ids
        for r in records_of(replica_batches(cluster.broker(b), topic, 0))
        if r.value is not None and r.value.startswith(b"zombie-")
    ]


def _heal_and_check(
    cluster: LocalCluster,
    topic: str,
    replicas: list[int],
    new_leader: int,
    acked: Mapping[int, bytes | None],
) -> None:
    """Every acknowledged record is on the new leader; once the old leader has rejoined the ISR,
    all replicas are byte-identical and hold none of what only the zombie accepted."""
    read = read_committed(cluster.broker(new_leader), topic, 0)
    assert read.error == ErrorCode.none
    assert_acknowledged_present(acked, read.records, f"the new leader {new_leader}")
    wait_for_isr(cluster, topic, 0, replicas, TIMEOUT_S)
    end = log_end_offset(replica_batches(cluster.broker(new_leader), topic, 0))
    common = wait_for_identical_replicas(cluster, replicas, topic, 0, TIMEOUT_S, min_end_offset=end)
    assert_acknowledged_present(acked, records_of(common), "every replica's files")
    assert _zombie_values(cluster, replicas, topic) == []


def test_a_leader_frozen_past_its_session_is_deposed_and_acknowledges_nothing(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(
        brokers=3,
        replica_lag_time_max_ms=LAG_TIME_MS,
        zookeeper_session_timeout_ms=SESSION_TIMEOUT_MS,
    )
    controller = cluster.controller_id()
    old_leader = next(b for b in cluster.broker_ids if b != controller)
    replicas = [old_leader, *(b for b in cluster.broker_ids if b != old_leader)]
    topic = unique_topic("zombie-session")
    create_topic(cluster, topic, [replicas], {"min.insync.replicas": "2"})
    first = zk_partition_state(cluster, topic, 0)

    stream = StreamingProducer(
        cluster.bootstrap_servers, topic, "acked", acks="all", partition=0, **STREAM_SETTINGS
    ).start()
    try:
        wait_until(lambda: stream.acknowledged_count() >= 200, TIMEOUT_S, "200 acknowledged")
        # 1. Frozen past its session: the controller elects another ISR member.
        cluster.stop(old_leader)
        deposed = wait_for_zk_leader(
            cluster,
            topic,
            0,
            lambda s: s.leader not in (old_leader, -1),
            TIMEOUT_S,
            "the controller to elect a new leader",
        )
        assert deposed.leader_epoch > first.leader_epoch
        assert old_leader not in deposed.isr
        live = [b for b in replicas if b != old_leader]
        wait_for_metadata(
            cluster,
            topic,
            0,
            live,
            lambda v: v.leader == deposed.leader,
            TIMEOUT_S,
            "the new leader",
        )

        # 2. It wakes up believing it leads. acks=all sent straight to it is never acknowledged:
        # its followers now fetch from the new leader, so its HW cannot move.
        cluster.cont(old_leader)
        zombie = cluster.broker(old_leader)
        answer = produce_raw(zombie, topic, 0, [b"zombie-acks-all"], acks=-1, timeout_ms=5000)
        assert answer.error in (
            ErrorCode.not_leader_or_follower,
            ErrorCode.request_timed_out,
        ), answer
        # It stops taking writes at all as soon as it learns it was deposed.
        probes = iter(range(1_000_000))
        wait_until(
            lambda: (
                produce_raw(zombie, topic, 0, [b"zombie-%d" % next(probes)], acks=1).error
                == ErrorCode.not_leader_or_follower
            ),
            TIMEOUT_S,
            "the old leader to refuse writes",
        )
        for acks in (1, -1):
            refused = produce_raw(zombie, topic, 0, [b"zombie-refused"], acks=acks)
            assert refused.error == ErrorCode.not_leader_or_follower, refused
        # Its ISR shrink never landed: ZooKeeper still holds the new leader's state.
        state = zk_partition_state(cluster, topic, 0)
        assert (state.leader, state.leader_epoch) == (deposed.leader, deposed.leader_epoch)

        acknowledged_at_wake = stream.acknowledged_count()
        wait_until(
            lambda: stream.acknowledged_count() >= acknowledged_at_wake + 200,
            TIMEOUT_S,
            "writes through the new leader",
        )
    except BaseException:
        stream.abandon()
        raise
    deliveries = stream.stop()
    assert not deliveries.failed, deliveries.failed[:5]
    _heal_and_check(
        cluster, topic, replicas, deposed.leader, deliveries.acknowledged_by_partition()[0]
    )


def test_a_leader_whose_isr_write_is_rejected_on_the_znode_version_refuses_writes(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(brokers=3, replica_lag_time_max_ms=LAG_TIME_MS)
    controller = cluster.controller_id()
    assert controller is not None
    # The follower we freeze must not be the controller, which has to depose the leader later.
    leader_id, lagging_id = (b for b in cluster.broker_ids if b != controller)
    replicas = [leader_id, controller, lagging_id]
    topic = unique_topic("zombie-version")
    create_topic(cluster, topic, [replicas], {"min.insync.replicas": "2"})
    leader = cluster.broker(leader_id)

    stream = StreamingProducer(
        cluster.bootstrap_servers, topic, "acked", acks="all", partition=0, **STREAM_SETTINGS
    ).start()
    try:
        wait_until(lambda: stream.acknowledged_count() >= 200, TIMEOUT_S, "200 acknowledged")
        # 1. The state znode moves on without the leader knowing; then a follower lags, so the
        # leader tries to shrink the ISR with the version it holds.
        before = zk_partition_state(cluster, topic, 0)
        moved_version = rewrite_partition_state(cluster, topic, 0)
        cluster.stop(lagging_id)
        probes = iter(range(1_000_000))
        wait_until(
            lambda: (
                produce_raw(leader, topic, 0, [b"probe-%d" % next(probes)], acks=1).error
                == ErrorCode.not_leader_or_follower
            ),
            TIMEOUT_S,
            "the leader to refuse writes after its ISR write was rejected",
        )
        # 2. The write was rejected, not applied: ZooKeeper holds what it held.
        state = zk_partition_state(cluster, topic, 0)
        assert state.zk_version == moved_version
        assert (state.leader, state.leader_epoch, sorted(state.isr)) == (
            before.leader,
            before.leader_epoch,
            sorted(before.isr),
        )
        # 3. A fenced leader refuses every write, whatever the acks.
        for acks in (1, -1):
            refused = produce_raw(leader, topic, 0, [b"zombie-fenced"], acks=acks)
            assert refused.error == ErrorCode.not_leader_or_follower, refused
        end_when_fenced = log_end_offset(replica_batches(leader, topic, 0))
        cluster.cont(lagging_id)
        refused = produce_raw(leader, topic, 0, [b"zombie-still-fenced"], acks=1)
        assert refused.error == ErrorCode.not_leader_or_follower, refused
        assert log_end_offset(replica_batches(leader, topic, 0)) == end_when_fenced

        # 4. Only the controller ends it: the fenced leader dies, another ISR member leads.
        acknowledged_when_fenced = stream.acknowledged_count()
        cluster.kill(leader_id)
        deposed = wait_for_zk_leader(
            cluster,
            topic,
            0,
            lambda s: s.leader not in (leader_id, -1),
            TIMEOUT_S,
            "the controller to elect a new leader",
        )
        assert deposed.leader_epoch > before.leader_epoch
        wait_until(
            lambda: stream.acknowledged_count() >= acknowledged_when_fenced + 200,
            TIMEOUT_S,
            "writes through the new leader",
        )
    except BaseException:
        stream.abandon()
        raise
    deliveries = stream.stop()
    assert not deliveries.failed, deliveries.failed[:5]
    cluster.start_broker(leader_id)
    _heal_and_check(
        cluster, topic, replicas, deposed.leader, deliveries.acknowledged_by_partition()[0]
    )
