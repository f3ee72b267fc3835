"""Every broker's Metadata, replica placement, and client routing on real 3-broker clusters.

* Topics with replication factor 1, 2 and 3 and 60 partitions each: leaders spread evenly (each
  broker leads 20, within one), replicas spread evenly, no broker twice in a partition, and every
  broker answers Metadata identically -- leaders, replicas, ISR, leader epochs, topic ids,
  controller id, broker list -- and as ZooKeeper's assignment and partition state znodes say.
* Real clients (confluent-kafka, kafka-python, aiokafka) bootstrapped from one broker only produce
  (acks=1) to and consume from partitions led by every broker.
* Rack-aware placement: on brokers with racks, a replication factor up to the number of racks puts
  every replica of a partition on a different rack (checked with one broker per rack, as in the
  issue, and with two brokers sharing a rack, where ignoring racks would break it).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from odradek.testing import LocalCluster
from tests.integration._controller import (
    create_topics,
    leaders_per_broker,
    replicas_per_broker,
    roundtrip,
    topic_spec,
    topic_uuid,
    wait_for_agreement,
    zk_controller,
    zk_partition_states,
    zk_topic,
)
from tests.integration._replication import unique_topic

# kafka-python 3.0 loads its protocol schemas with importlib.resources' deprecated functions.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.* is deprecated\. Use files\(\) instead:DeprecationWarning"
)

PARTITIONS = 60
AGREEMENT_TIMEOUT_S = 60.0


def test_placement_is_balanced_and_every_broker_answers_metadata_identically(
    cluster3: LocalCluster,
):
    broker_ids = cluster3.broker_ids
    topics = {unique_topic(f"spread-rf{rf}"): rf for rf in (1, 2, 3)}
    answers = create_topics(
        cluster3.broker(broker_ids[0]),
        [topic_spec(name, PARTITIONS, rf) for name, rf in topics.items()],
    )
    assert {n: a.error.name for n, a in answers.items()} == {n: "none" for n in topics}
    names = list(topics)
    view = wait_for_agreement(
        cluster3,
        names,
        lambda v: v.all_led(names, dict.fromkeys(names, PARTITIONS)),
        timeout=AGREEMENT_TIMEOUT_S,
        what="leaders for every partition",
    )
    controller = zk_controller(cluster3).broker_id
    assert view.controller_id == controller
    assert view.broker_ids == broker_ids
    share = PARTITIONS // len(broker_ids)

    for name, rf in topics.items():
        info = view.topic(name)
        assert info is not None and info.topic_id is not None
        for index, partition in info.partitions.items():
            assert len(partition.replicas) == rf, (name, index, partition)
            assert len(set(partition.replicas)) == rf, f"a broker twice in {name}-{index}"
            assert set(partition.replicas) <= set(broker_ids)
            # A new topic: the preferred (first) replica leads, every replica is in sync.
            assert partition.leader == partition.replicas[0], (name, index, partition)
            assert sorted(partition.isr) == sorted(partition.replicas)
            assert partition.leader_epoch == 0
            assert partition.offline_replicas == ()
        leaders = leaders_per_broker(info, broker_ids)
        assert all(abs(count - share) <= 1 for count in leaders.values()), (name, leaders)
        replicas = replicas_per_broker(info, broker_ids)
        assert set(replicas.values()) == {rf * share}, (name, replicas)

        # What the brokers say is what ZooKeeper says.
        assignment = zk_topic(cluster3, name)
        assert assignment is not None
        assert topic_uuid(assignment) == info.topic_id
        assert {p: a.replicas for p, a in assignment.partitions.items()} == {
            p: i.replicas for p, i in info.partitions.items()
        }
        states = zk_partition_states(cluster3, name, range(PARTITIONS))
        assert {p: (s.leader, s.leader_epoch, s.isr) for p, s in states.items()} == {
            p: (i.leader, i.leader_epoch, i.isr) for p, i in info.partitions.items()
        }


# Each bootstrap broker with a different client library; the topic's three partitions are led
# by brokers 1, 2 and 3, so two of them are always led by a broker the client was not given.
@pytest.mark.parametrize(
    ("bootstrap_id", "client"), [(1, "confluent"), (2, "kafka-python"), (3, "aiokafka")]
)
def test_clients_produce_and_consume_through_any_single_bootstrap_broker(
    cluster3: LocalCluster, bootstrap_id: int, client: str
):
    topic = unique_topic(f"route-{bootstrap_id}")
    assignment = {0: [1, 2], 1: [2, 3], 2: [3, 1]}
    answers = create_topics(cluster3.broker(1), [topic_spec(topic, assignment=assignment)])
    assert answers[topic].error.name == "none", answers
    wait_for_agreement(cluster3, [topic], lambda v: v.all_led([topic]), what=f"leaders of {topic}")
    roundtrip(client, cluster3.broker(bootstrap_id).bootstrap, topic, assignment)


RACK_LAYOUTS = {
    # The layout: one broker per rack.
    "one-broker-per-rack": {1: "a", 2: "b", 3: "c"},
    # Brokers 1 and 4 share rack a: rack-unaware placement would often put a partition's two
    # replicas (or two of its three) on them.
    "shared-rack": {1: "a", 2: "b", 3: "c", 4: "a"},
}


@pytest.mark.parametrize("layout", sorted(RACK_LAYOUTS))
def test_rack_aware_placement_spans_distinct_racks(
    make_cluster: Callable[..., LocalCluster], layout: str
):
    racks = RACK_LAYOUTS[layout]
    cluster = make_cluster(brokers=len(racks), racks=racks, shared_zookeeper=True)
    partitions = 12
    topics = {unique_topic("racks-rf3"): 3, unique_topic("racks-rf2"): 2}
    answers = create_topics(
        cluster.broker(1), [topic_spec(name, partitions, rf) for name, rf in topics.items()]
    )
    assert {n: a.error.name for n, a in answers.items()} == {n: "none" for n in topics}
    names = list(topics)
    view = wait_for_agreement(
        cluster,
        names,
        lambda v: v.all_led(names, dict.fromkeys(names, partitions)),
        timeout=AGREEMENT_TIMEOUT_S,
        what="leaders for every partition",
    )
    # The brokers advertise their racks in Metadata, as configured.
    assert {b.id: b.rack for b in view.brokers} == racks
    for name, rf in topics.items():
        info = view.topic(name)
        assert info is not None
        for index, partition in info.partitions.items():
            spanned = {racks[r] for r in partition.replicas}
            assert len(partition.replicas) == rf
            assert len(spanned) == rf, f"{name}-{index} on {partition.replicas}: racks {spanned}"
        leaders = leaders_per_broker(info, cluster.broker_ids)
        share = partitions // len(racks)
        assert all(abs(count - share) <= 1 for count in leaders.values()), (name, leaders)
