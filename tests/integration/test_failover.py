"""Broker failure, controller failure and a broker's return, against real broker processes (seed
000: Broker Failover, Controller Failover, Broker Startup).

* *A leader dies* (SIGKILL; RF=3, min.insync.replicas=2, unclean election off). Every partition it
  led gets a new leader from its ISR with a higher leader epoch, and the dead broker leaves every
  ISR. `LocalCluster.status()` (what `odradek cluster status` prints) shows those partitions
  under-replicated, and an RF=1 partition on the dead broker offline (leader -1, which every
  surviving broker's Metadata also says); acks=all writes go on. After a restart the broker
  catches up, the RF=1 partition is back online under it, status shows nothing degraded, and every
  acknowledged record is in every replica's files at its offset.
* *The unclean election switch* (RF=2, one topic with unclean.leader.election.enable=false, one
  with true). The follower dies and leaves the ISR, records are written to the leader alone, the
  leader dies, and only the former follower (out of the ISR) comes back: the clean topic stays
  offline (consistency), the unclean topic is led by it and has lost what only the old leader had
  (availability). When the old leader returns, the clean topic is led by it with everything, and
  in the unclean topic it truncates its divergent suffix and follows.
* *The controller dies.* Another broker wins the election with the controller epoch one higher,
  handles the dead controller's own broker failure (its partitions move), and every surviving
  broker's Metadata names the new controller and agrees with ZooKeeper on every leader. The old
  controller comes back as an ordinary broker.
* *A topic deleted and re-created while a broker is down.* Deleting a topic with a replica on a
  dead broker waits for that broker (as in Kafka), so the operator finishes it by hand, the way it
  is done in Kafka: remove `/brokers/topics/<t>`, `/config/topics/<t>`, `/admin/delete_topics/<t>`,
  then write the new topic's assignment (the same replicas, a new topic id), as
  `kafka-topics.sh --zookeeper` does. The returning broker deletes its directories of the old
  incarnation at start-up (their `partition.metadata` names the old topic id) and replicates the
  new topic from scratch: its files end holding the new records only.

Victims are chosen so that each scenario is the one named: the leader killed in the first test is
not the controller, and so on. Every wait is a deadline on a condition.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from odradek.cluster.replica_manager import read_partition_topic_id
from odradek.protocol.codec import ApiKey
from odradek.protocol.topic_ids import uuid_to_topic_id
from odradek.testing import LocalCluster
from odradek.zk.client import ZkClient
from odradek.zk.errors import NoNodeError
from odradek.zk.znodes import (
    DeleteTopicsTopicZNode,
    LeaderIsrAndControllerEpoch,
    TopicConfigZNode,
    TopicZNode,
)
from tests.fixtures.cluster import wait_until
from tests.integration._replication import (
    METADATA_VERSION,
    AckedProducer,
    PartitionView,
    assert_acknowledged_present,
    create_topic,
    partition_dir,
    read_committed,
    records_of,
    replica_records,
    request,
    unique_topic,
    wait_for_identical_replicas,
    wait_for_isr,
    wait_for_metadata,
    zk_partition_state,
)

TIMEOUT_S = 60.0
# A SIGKILLed broker's session expires after zookeeper.session.timeout.ms (6 s here); the
# controller acts on the expiry.
FAILURE_TIMEOUT_S = 30.0
LAG_TIME_MS = 3000
NO_LEADER = -1


def _others(cluster: LocalCluster, *excluded: int) -> list[int]:
    return [b for b in cluster.broker_ids if b not in excluded]


def _non_controller(cluster: LocalCluster) -> tuple[int, int]:
    """(controller, a broker that is not the controller)."""
    controller = cluster.controller_id()
    assert controller is not None
    return controller, next(b for b in cluster.broker_ids if b != controller)


def _states(
    cluster: LocalCluster, topic: str, partitions: int
) -> dict[int, LeaderIsrAndControllerEpoch]:
    return {p: zk_partition_state(cluster, topic, p) for p in range(partitions)}


def _wait_for_states(
    cluster: LocalCluster,
    topic: str,
    partitions: int,
    predicate: Callable[[int, LeaderIsrAndControllerEpoch], bool],
    what: str,
    timeout: float = FAILURE_TIMEOUT_S,
) -> dict[int, LeaderIsrAndControllerEpoch]:
    """Wait until every partition's state znode satisfies `predicate(partition, state)`."""

    def check() -> dict[int, LeaderIsrAndControllerEpoch] | None:
        states = _states(cluster, topic, partitions)
        return states if all(predicate(p, s) for p, s in states.items()) else None

    found = wait_until(check, timeout, what)
    assert found is not None
    return found


def _metadata(cluster: LocalCluster, broker_id: int, topics: Sequence[str]) -> Any:
    """One broker's whole Metadata response for `topics` (controller id included)."""
    return request(
        cluster.broker(broker_id),
        ApiKey.METADATA,
        METADATA_VERSION,
        {
            "topics": [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False,
        },
    )


def _status_degraded(cluster: LocalCluster) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    """(offline, under-replicated) partitions as `odradek cluster status` reports them."""
    status = cluster.status()
    offline, under = set(), set()
    for entry in status["topics"].values():
        offline |= {(d["topic"], d["partition"]) for d in entry["offline_partitions"]}
        under |= {(d["topic"], d["partition"]) for d in entry["under_replicated_partitions"]}
    return offline, under


def _assert_acknowledged_everywhere(
    cluster: LocalCluster, topic: str, acked: dict[int, dict[int, bytes | None]]
) -> None:
    """Each partition's acknowledged records are at their offsets in every replica's files."""
    for partition, records in acked.items():
        replicas = list(zk_partition_state(cluster, topic, partition).isr)
        common = wait_for_identical_replicas(
            cluster, replicas, topic, partition, TIMEOUT_S, min_end_offset=max(records) + 1
        )
        assert_acknowledged_present(records, records_of(common), f"{topic}-{partition} replicas")


def test_a_dead_leader_is_replaced_from_the_isr_and_status_shows_the_damage_until_it_returns(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(
        brokers=3,
        min_insync_replicas=2,
        unclean_leader_election_enable=False,
        replica_lag_time_max_ms=LAG_TIME_MS,
    )
    _controller, victim = _non_controller(cluster)
    first, second = _others(cluster, victim)
    # Six partitions, the victim preferred leader of three and follower of the other three.
    assignment = [
        [victim, first, second],
        [first, victim, second],
        [victim, second, first],
        [second, first, victim],
        [victim, first, second],
        [first, second, victim],
    ]
    replicated, single = unique_topic("rf3"), unique_topic("rf1")
    create_topic(cluster, replicated, assignment)
    create_topic(cluster, single, [[victim]], {"min.insync.replicas": "1"})
    before = _states(cluster, replicated, len(assignment))
    led = {p for p, s in before.items() if s.leader == victim}
    assert led == {0, 2, 4}

    producer = AckedProducer(cluster.bootstrap_servers, acks="all")
    single_producer = AckedProducer(cluster.bootstrap_servers, acks="all")
    sent = producer.send(replicated, [b"before-%d" % i for i in range(600)], keyed=True)
    assert not sent.failed, sent.failed[:5]
    single_values = [b"single-%d" % i for i in range(50)]
    single_sent = single_producer.send(single, single_values, partition=0)
    assert not single_sent.failed, single_sent.failed[:5]

    cluster.kill(victim)
    after = _wait_for_states(
        cluster,
        replicated,
        len(assignment),
        lambda p, s: s.leader != victim and victim not in s.isr,
        f"the controller to move leadership away from broker {victim}",
    )
    for partition in led:
        old, new = before[partition], after[partition]
        assert new.leader in old.isr and new.leader != NO_LEADER, (partition, old, new)
        assert new.leader_epoch > old.leader_epoch, (partition, old, new)
    # The partitions it only followed keep their leader; their ISR lost the victim.
    for partition in set(before) - led:
        assert after[partition].leader == before[partition].leader
    _wait_for_states(
        cluster, single, 1, lambda _p, s: s.leader == NO_LEADER, f"{single}-0 offline in ZooKeeper"
    )

    # Every survivor's Metadata agrees with ZooKeeper, and shows the RF=1 partition offline.
    survivors = _others(cluster, victim)
    for partition, state in after.items():

        def agrees(view: PartitionView, state: LeaderIsrAndControllerEpoch = state) -> bool:
            return (view.leader, view.leader_epoch) == (state.leader, state.leader_epoch)

        wait_for_metadata(
            cluster,
            replicated,
            partition,
            survivors,
            agrees,
            TIMEOUT_S,
            f"{replicated}-{partition} led by {state.leader} at epoch {state.leader_epoch}",
        )
    wait_for_metadata(
        cluster,
        single,
        0,
        survivors,
        lambda v: v.leader == NO_LEADER and v.error == ErrorCode.leader_not_available,
        TIMEOUT_S,
        f"{single}-0 without a leader",
    )
    offline, under = _status_degraded(cluster)
    assert offline == {(single, 0)}
    assert under == {(replicated, p) for p in range(len(assignment))}
    victim_status = next(b for b in cluster.status()["brokers"] if b["id"] == victim)
    assert (victim_status["registered"], victim_status["process"]) == (False, "dead")

    # Writes go on with the two live ISR members (min.insync.replicas=2), and everything
    # acknowledged so far is on the new leaders.
    sent = producer.send(replicated, [b"during-%d" % i for i in range(300)], keyed=True)
    assert not sent.failed, sent.failed[:5]
    acked = sent.acknowledged_by_partition()
    assert set(acked) == set(range(len(assignment)))
    for partition, records in acked.items():
        read = read_committed(cluster.broker(after[partition].leader), replicated, partition)
        assert read.error == ErrorCode.none
        assert_acknowledged_present(
            records, read.records, f"the leader of {replicated}-{partition}"
        )

    # The victim returns: it catches up, rejoins every ISR, and its RF=1 partition is back.
    cluster.start_broker(victim)
    wait_until(
        lambda: _status_degraded(cluster) == (set(), set()),
        TIMEOUT_S,
        "status to show no offline and no under-replicated partition",
    )
    assert zk_partition_state(cluster, single, 0).leader == victim
    wait_for_metadata(
        cluster,
        single,
        0,
        cluster.broker_ids,
        lambda v: v.leader == victim and v.error == ErrorCode.none,
        TIMEOUT_S,
        f"{single}-0 led by {victim} again",
    )
    assert [r.value for r in read_committed(cluster.broker(victim), single, 0).records] == (
        single_values
    )
    _assert_acknowledged_everywhere(cluster, replicated, acked)


def test_unclean_leader_election_trades_acknowledged_records_for_availability_per_topic(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(brokers=3, replica_lag_time_max_ms=LAG_TIME_MS)
    controller, _ = _non_controller(cluster)
    leader, follower = _others(cluster, controller)
    clean, unclean = unique_topic("clean"), unique_topic("unclean")
    for topic, allowed in ((clean, "false"), (unclean, "true")):
        create_topic(
            cluster,
            topic,
            [[leader, follower]],
            {"unclean.leader.election.enable": allowed, "min.insync.replicas": "1"},
        )
    producers = {t: AckedProducer(cluster.bootstrap_servers, acks="all") for t in (clean, unclean)}
    both = [b"both-%d" % i for i in range(100)]
    for topic, producer in producers.items():
        assert not producer.send(topic, both, partition=0).failed

    # 1. The follower dies and leaves the ISR; the leader alone takes more acks=all records.
    cluster.kill(follower)
    for topic in (clean, unclean):
        wait_for_isr(cluster, topic, 0, [leader], FAILURE_TIMEOUT_S)
    alone = [b"leader-only-%d" % i for i in range(100)]
    for topic, producer in producers.items():
        assert not producer.send(topic, alone, partition=0).failed

    # 2. The leader dies too: both partitions are offline, the ISR still names the leader.
    cluster.kill(leader)
    for topic in (clean, unclean):
        state = _wait_for_states(
            cluster, topic, 1, lambda _p, s: s.leader == NO_LEADER, f"{topic}-0 offline"
        )[0]
        assert list(state.isr) == [leader]

    # 3. Only the former follower returns. The unclean topic elects it (ISR = [it]); the clean
    # topic, decided in the same controller event, stays offline.
    epoch_before = zk_partition_state(cluster, unclean, 0).leader_epoch
    cluster.start_broker(follower)
    elected = _wait_for_states(
        cluster, unclean, 1, lambda _p, s: s.leader == follower, f"{unclean}-0 led by {follower}"
    )[0]
    assert list(elected.isr) == [follower] and elected.leader_epoch > epoch_before
    assert zk_partition_state(cluster, clean, 0).leader == NO_LEADER
    offline, _ = _status_degraded(cluster)
    assert (clean, 0) in offline and (unclean, 0) not in offline
    wait_for_metadata(
        cluster,
        clean,
        0,
        [controller, follower],
        lambda v: v.leader == NO_LEADER,
        TIMEOUT_S,
        f"{clean}-0 without a leader",
    )
    # Availability has its price: what only the old leader had is gone from the unclean topic.
    wait_for_metadata(
        cluster,
        unclean,
        0,
        [controller, follower],
        lambda v: v.leader == follower,
        TIMEOUT_S,
        f"{unclean}-0 led by {follower}",
    )
    assert [r.value for r in read_committed(cluster.broker(follower), unclean, 0).records] == both
    assert zk_partition_state(cluster, clean, 0).leader == NO_LEADER

    # 4. The old leader returns: it leads the clean topic with everything, and follows in the
    # unclean one, truncating the records nobody else has.
    cluster.start_broker(leader)
    _wait_for_states(
        cluster, clean, 1, lambda _p, s: s.leader == leader, f"{clean}-0 led by {leader}"
    )
    wait_for_isr(cluster, clean, 0, [leader, follower], TIMEOUT_S)
    wait_for_isr(cluster, unclean, 0, [leader, follower], TIMEOUT_S)
    assert [r.value for r in read_committed(cluster.broker(leader), clean, 0).records] == (
        both + alone
    )
    common = wait_for_identical_replicas(
        cluster, [leader, follower], unclean, 0, TIMEOUT_S, min_end_offset=len(both)
    )
    assert [r.value for r in records_of(common)] == both


def test_a_dead_controller_is_replaced_and_its_own_failure_handled(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(brokers=3, min_insync_replicas=2)
    controller, _ = _non_controller(cluster)
    first, second = _others(cluster, controller)
    assignment = [
        [controller, first, second],
        [first, controller, second],
        [controller, second, first],
        [second, first, controller],
    ]
    topic = unique_topic("controller-failover")
    create_topic(cluster, topic, assignment)
    epoch_before = cluster.status()["controller"]["epoch"]
    producer = AckedProducer(cluster.bootstrap_servers, acks="all")
    assert not producer.send(topic, [b"r-%d" % i for i in range(400)], keyed=True).failed

    cluster.kill(controller)

    def new_controller() -> dict[str, int] | None:
        current = cluster.status()["controller"]
        return current if current and current["id"] not in (None, controller) else None

    elected = wait_until(new_controller, FAILURE_TIMEOUT_S, "a new controller")
    assert elected is not None
    assert elected["epoch"] == epoch_before + 1
    # The new controller handles the old one's broker failure: its partitions move.
    _wait_for_states(
        cluster,
        topic,
        len(assignment),
        lambda _p, s: s.leader not in (controller, NO_LEADER) and controller not in s.isr,
        f"the partitions of broker {controller} to move",
    )
    survivors = [first, second]

    def metadata_agrees() -> bool:
        # Fresh states every time: leaders may change the ISR meanwhile.
        current = _states(cluster, topic, len(assignment))
        for broker_id in survivors:
            response = _metadata(cluster, broker_id, [topic])
            if response.controller_id != elected["id"]:
                return False
            (entry,) = response.topics
            views = {p.partition_index: p for p in entry.partitions}
            for partition, state in current.items():
                view = views.get(partition)
                if view is None or (view.leader_id, view.leader_epoch) != (
                    state.leader,
                    state.leader_epoch,
                ):
                    return False
                if sorted(view.isr_nodes) != sorted(state.isr):
                    return False
        return True

    wait_until(metadata_agrees, TIMEOUT_S, "every survivor's Metadata to agree with ZooKeeper")
    new_controller_log = cluster.broker(elected["id"]).log.read_text()
    assert "controller failover done in" in new_controller_log
    assert not producer.send(topic, [b"s-%d" % i for i in range(200)], keyed=True).failed

    # The old controller returns as an ordinary broker and rejoins every ISR.
    cluster.start_broker(controller)
    wait_until(
        lambda: _status_degraded(cluster) == (set(), set()),
        TIMEOUT_S,
        "every partition back to a full ISR",
    )
    final = cluster.status()["controller"]
    assert (final["id"], final["epoch"]) == (elected["id"], elected["epoch"])
    wait_until(
        lambda: _metadata(cluster, controller, [topic]).controller_id == elected["id"],
        TIMEOUT_S,
        f"broker {controller} to learn the new controller",
    )
    _assert_acknowledged_everywhere(cluster, topic, producer.deliveries.acknowledged_by_partition())


def _zk(cluster: LocalCluster, work: Callable[[ZkClient], Any]) -> Any:
    async def run() -> Any:
        zk = ZkClient(cluster.zookeeper_connect, session_timeout_s=10.0)
        await zk.start(timeout=10.0)
        try:
            return await work(zk)
        finally:
            await zk.close()

    return asyncio.run(run())


def _force_remove_topic(cluster: LocalCluster, topic: str) -> None:
    """What an operator does when a deletion waits for a dead broker: remove the topic's
    znodes by hand (assignment and partition states, config, deletion marker)."""

    async def remove(zk: ZkClient) -> None:
        for path, recursive in (
            (TopicZNode.path(topic), True),
            (TopicConfigZNode.path(topic), False),
            (DeleteTopicsTopicZNode.path(topic), False),
        ):
            try:
                await zk.delete(path, recursive=recursive)
            except NoNodeError:
                pass

    _zk(cluster, remove)


def _write_topic(
    cluster: LocalCluster, topic: str, assignment: Sequence[Sequence[int]], topic_id: str
) -> None:
    """Create a topic by writing its assignment znode (as `kafka-topics.sh --zookeeper` did,
    which, unlike CreateTopics, lets an assignment name a broker that is down)."""

    async def create(zk: ZkClient) -> None:
        data = TopicZNode.encode({p: list(r) for p, r in enumerate(assignment)}, topic_id)
        await zk.create(TopicZNode.path(topic), data, makepath=True)

    _zk(cluster, create)


def test_a_returning_broker_deletes_the_logs_of_a_topic_recreated_while_it_was_down(
    make_cluster: Callable[..., LocalCluster],
):
    cluster = make_cluster(brokers=3, replica_lag_time_max_ms=LAG_TIME_MS)
    _controller, victim = _non_controller(cluster)
    first, second = _others(cluster, victim)
    assignment = [[victim, first, second], [first, victim, second]]
    topic = unique_topic("reborn")
    create_topic(cluster, topic, assignment)
    old = AckedProducer(cluster.bootstrap_servers, acks="all")
    assert not old.send(topic, [b"old-%d" % i for i in range(300)], keyed=True).failed
    old_id = read_partition_topic_id(partition_dir(cluster.broker(victim), topic, 0))
    assert old_id

    # 1. The victim dies; the controller notices (its session expires).
    cluster.kill(victim)
    _wait_for_states(
        cluster,
        topic,
        len(assignment),
        lambda _p, s: victim not in s.isr and s.leader != victim,
        f"the controller to handle broker {victim}'s failure",
    )
    # 2. Deleting the topic deletes the live replicas and then waits for the dead one.
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    # No operation timeout: the deletion cannot complete while the victim is down.
    admin.delete_topics([topic])[topic].result(30)
    wait_until(
        lambda: (
            not any(
                partition_dir(cluster.broker(b), topic, p).exists()
                for b in (first, second)
                for p in range(len(assignment))
            )
        ),
        TIMEOUT_S,
        "the live replicas to be deleted",
    )
    assert cluster.status()["topics"][topic]["marked_for_deletion"]
    # 3. The operator finishes the deletion by hand and re-creates the topic (same replicas).
    _force_remove_topic(cluster, topic)
    wait_until(
        lambda: (
            topic not in cluster.status()["topics"]
            and all(
                not _metadata(cluster, b, [topic]).topics[0].partitions for b in (first, second)
            )
        ),
        TIMEOUT_S,
        "the topic to be gone",
    )
    new_id = uuid_to_topic_id(uuid.uuid4())
    _write_topic(cluster, topic, assignment, new_id)
    for partition in range(len(assignment)):
        wait_for_metadata(
            cluster,
            topic,
            partition,
            [first, second],
            lambda v: v.leader in (first, second),
            TIMEOUT_S,
            f"a leader for the new {topic}-{partition}",
        )
    new = AckedProducer(cluster.bootstrap_servers, acks="all")
    new_values = {p: [b"new-%d-%d" % (p, i) for i in range(20)] for p in range(len(assignment))}
    for partition, values in new_values.items():
        acked = new.send(topic, values, partition=partition)
    assert not acked.failed, acked.failed[:5]
    # The old incarnation is still on the victim's disk.
    assert read_partition_topic_id(partition_dir(cluster.broker(victim), topic, 0)) == old_id

    # 4. The victim returns: its old directories go, and it replicates the new topic.
    log_start = cluster.broker(victim).log.stat().st_size
    cluster.start_broker(victim)
    for partition in range(len(assignment)):
        wait_for_isr(cluster, topic, partition, assignment[partition], TIMEOUT_S)
    log_text = cluster.broker(victim).log.read_bytes()[log_start:].decode(errors="replace")
    for partition in range(len(assignment)):
        assert (
            f"deleting stray log {topic}-{partition}: it belongs to an earlier topic {topic} "
            f"(id {old_id})"
        ) in log_text
        directory = partition_dir(cluster.broker(victim), topic, partition)
        assert read_partition_topic_id(directory) == new_id
        common = wait_for_identical_replicas(
            cluster, assignment[partition], topic, partition, TIMEOUT_S
        )
        assert_acknowledged_present(
            acked.acknowledged_by_partition().get(partition, {}),
            records_of(common),
            f"{topic}-{partition} replicas",
        )
        victim_values = [r.value for r in replica_records(cluster.broker(victim), topic, partition)]
        assert victim_values == new_values[partition]
    assert not [
        d.name for d in cluster.broker(victim).data_dir.iterdir() if d.name.endswith("-delete")
    ]
