"""Forged controller and follower requests from a plain client on the PLAINTEXT listener (issue 14,
item 8): refused, and every partition and record intact afterwards.

Kafka accepts a controller epoch larger than any it has seen, so one hand-made StopReplica with a
huge epoch would make a broker delete its partitions and then refuse the real controller. Odradek
checks a controller request's controller id and epoch against ZooKeeper (`/controller`,
`/controller_epoch`) and its broker epoch against the broker's own registration, whatever the
listener (`odradek.security.controller_requests`); a follower fetch must present the follower's
current broker epoch (Fetch v15). The requests here are hand-encoded and sent without any
authentication, as an attacker on the network would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from odradek.protocol.codec import ApiKey
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._controller import (
    TopicInfo,
    create_topics,
    send_leader_and_isr,
    send_stop_replica,
    topic_spec,
    wait_for_agreement,
    zk_broker_epoch,
    zk_controller,
    zk_partition_states,
)
from tests.integration._replication import partition_dir, produce_raw, read_committed
from tests.integration._wire import WireConnection

PARTITIONS = 3
FORGED_EPOCH_JUMP = 1_000_000


def _create(cluster: LocalCluster, topic: str) -> TopicInfo:
    brokers = cluster.broker_ids
    assignment = {p: [brokers[(p + i) % len(brokers)] for i in range(3)] for p in range(PARTITIONS)}
    answers = create_topics(cluster.broker(1), [topic_spec(topic, assignment=assignment)])
    assert answers[topic].error == ErrorCode.none, answers
    view = wait_for_agreement(
        cluster,
        [topic],
        lambda v: (
            v.all_led([topic], {topic: PARTITIONS})
            and all(len(p.isr) == 3 for p in v.topic(topic).partitions.values())
        ),
        what=f"{topic} led with full ISRs",
    )
    info = view.topic(topic)
    assert info is not None
    return info


def _records(cluster: LocalCluster, topic: str, leaders: dict[int, int]) -> dict[int, list[bytes]]:
    return {
        p: [r.value for r in read_committed(cluster.broker(leaders[p]), topic, p).records]
        for p in range(PARTITIONS)
    }


def _fetch_as_follower(
    connection: WireConnection, topic_id: object, replica_id: int, replica_epoch: int
) -> int:
    """A Fetch v15 in the name of replica `replica_id`; the partition's error code."""
    response = connection.request(
        ApiKey.FETCH,
        15,
        {
            "replica_state": {"replica_id": replica_id, "replica_epoch": replica_epoch},
            "max_wait": 0,
            "min_bytes": 0,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic_id": topic_id,
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": 0,
                            "last_fetched_epoch": -1,
                            "log_start_offset": 0,
                            "partition_max_bytes": 1 << 20,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )
    return int(response.responses[0].partitions[0].error_code)


def test_forged_controller_requests_are_refused_and_change_nothing(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(brokers=3, shared_zookeeper=True)
    topic = "forged-target"
    info = _create(cluster, topic)
    leaders = {p: info.partitions[p].leader for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        values = [b"%d-%d" % (p, i) for i in range(10)]
        answer = produce_raw(cluster.broker(leaders[p]), topic, p, values, acks=-1)
        assert answer.error == ErrorCode.none, answer
    before = _records(cluster, topic, leaders)
    states_before = zk_partition_states(cluster, topic, range(PARTITIONS))
    controller = zk_controller(cluster)
    assert controller.broker_id is not None
    impostor = next(b for b in cluster.broker_ids if b != controller.broker_id)

    for broker in cluster.brokers:
        own_epoch = zk_broker_epoch(cluster, broker.id)
        forgeries = {
            # an epoch from the future, with every other field right
            "huge epoch": (controller.broker_id, controller.epoch + FORGED_EPOCH_JUMP, own_epoch),
            # the current epoch in another broker's name
            "wrong controller": (impostor, controller.epoch, own_epoch),
            # the right controller, addressed to another incarnation of this broker
            "unknown broker epoch": (controller.broker_id, controller.epoch, -1),
            "invented broker epoch": (controller.broker_id, controller.epoch, own_epoch + 7),
        }
        expected = {
            "huge epoch": ErrorCode.stale_controller_epoch,
            "wrong controller": ErrorCode.stale_controller_epoch,
            "unknown broker epoch": ErrorCode.stale_broker_epoch,
            "invented broker epoch": ErrorCode.stale_broker_epoch,
        }
        for name, (controller_id, controller_epoch, broker_epoch) in forgeries.items():
            for p in range(PARTITIONS):
                stop = send_stop_replica(
                    broker,
                    controller_id=controller_id,
                    controller_epoch=controller_epoch,
                    broker_epoch=broker_epoch,
                    topic=topic,
                    partition=p,
                    leader_epoch=states_before[p].leader_epoch + 1,
                    delete=True,
                )
                assert stop.error_code == expected[name], (broker.id, name, stop)
            # A LeaderAndIsr that would make this broker sole leader of partition 0.
            coup = dataclasses.replace(
                states_before[0],
                leader=broker.id,
                leader_epoch=states_before[0].leader_epoch + 100,
                isr=(broker.id,),
                controller_epoch=controller_epoch,
                zk_version=states_before[0].zk_version + 100,
            )
            answer = send_leader_and_isr(
                broker,
                controller_id=controller_id,
                controller_epoch=controller_epoch,
                broker_epoch=broker_epoch,
                topic=topic,
                topic_id=info.topic_id,
                partition=0,
                state=coup,
                replicas=[broker.id],
                live_leaders=[broker],
            )
            assert answer.error_code == expected[name], (broker.id, name, answer)

        # Follower fetches in another replica's name without its current broker epoch.
        follower = next(r for r in info.partitions[0].replicas if r != leaders[0])
        if broker.id == leaders[0]:
            with WireConnection.to(broker.bootstrap) as connection:
                for epoch in (-1, zk_broker_epoch(cluster, follower) + 1):
                    code = _fetch_as_follower(connection, info.topic_id, follower, epoch)
                    assert code == ErrorCode.stale_broker_epoch, (epoch, code)

    # Every replica still has every partition, ZooKeeper's state and every record are unchanged.
    for p in range(PARTITIONS):
        for replica in info.partitions[p].replicas:
            assert partition_dir(cluster.broker(replica), topic, p).is_dir(), (p, replica)
    assert zk_partition_states(cluster, topic, range(PARTITIONS)) == states_before
    assert _records(cluster, topic, leaders) == before
    assert zk_controller(cluster) == controller

    # The real controller is still obeyed: a new topic is created, led and written everywhere.
    after = "forged-after"
    after_info = _create(cluster, after)
    leader = after_info.partitions[0].leader
    answer = produce_raw(cluster.broker(leader), after, 0, [b"still-obeyed"], acks=-1)
    assert answer.error == ErrorCode.none, answer
    wait_until(
        lambda: (
            [r.value for r in read_committed(cluster.broker(leader), after, 0).records]
            == [b"still-obeyed"]
        ),
        15,
        "the record after the forgeries",
    )
