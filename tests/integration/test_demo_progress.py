"""The demo's progress reporting through the fault that once froze it.

The demo kills the leader of `pageviews-0`. When that broker was also the coordinator of the
demo's progress consumer group, librdkafka (after asking the new coordinator for broker-only
metadata that no longer listed the dead broker) dropped the dead broker's handle, and from then
on the consumer's `get_watermark_offsets` failed locally with `_UNKNOWN_PARTITION` for minutes,
sending nothing: the demo printed `produced ? (leader moving)` until its deadline. The demo now
asks for end offsets through `odradek.demo_progress.TopicWatch` (ListOffsets from an AdminClient
that is replaced after a failure). This test recreates the fault, with a consumer group member
whose coordinator is the victim, and checks that the end offsets come back within seconds of the
new leader's election and then count every acknowledged record.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription

from odradek.demo_progress import TopicWatch
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.integration._replication import (
    StreamingProducer,
    create_topic,
    metadata_of_brokers,
)

TOPIC = "pageviews"  # TopicWatch watches the demo's input topic
VICTIM = 1
_COORDINATOR_NOT_READY = (
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
)
RECOVERY_S = 15.0  # "within seconds" of the election, with room for a loaded 2-core machine


def _group_coordinated_by(bootstrap: str, broker_id: int) -> str:
    """A group id whose coordinator is `broker_id` (the coordinator follows the group id)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def describe(group: str) -> ConsumerGroupDescription:
        # The first describe creates __consumer_offsets; until its partitions are loaded the
        # coordinator answers COORDINATOR_LOAD_IN_PROGRESS, which librdkafka's admin client
        # hands back instead of retrying (Kafka's Java admin client retries it).
        deadline = time.monotonic() + 60
        while True:
            try:
                return admin.describe_consumer_groups([group])[group].result(30)
            except KafkaException as e:
                if e.args[0].code() not in _COORDINATOR_NOT_READY or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    for index in range(200):
        group = f"demo-progress-{index}"
        if describe(group).coordinator.id == broker_id:
            return group
    raise AssertionError(f"no group id among 200 is coordinated by broker {broker_id}")


def _join(bootstrap: str, group: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([TOPIC])

    def assigned() -> bool:
        consumer.poll(0.2)
        return bool(consumer.assignment())

    wait_until(assigned, 60, f"the consumer to join {group}")
    return consumer


def test_end_offsets_recover_when_the_killed_leader_was_the_group_coordinator(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(3)
    bootstrap = cluster.bootstrap_servers
    create_topic(cluster, TOPIC, [[1, 2, 3], [2, 3, 1], [3, 1, 2]], {"min.insync.replicas": "2"})
    group = _group_coordinated_by(bootstrap, VICTIM)
    consumer = _join(bootstrap, group)
    producer = StreamingProducer(bootstrap, TOPIC, "view", acks="all", interval=0.005).start()
    watch = TopicWatch(bootstrap)
    try:
        wait_until(lambda: watch.end_offsets()[0] > 200, 60, "records in the topic")
        assert cluster.kill(VICTIM)

        def new_leader() -> bool:
            consumer.poll(0.1)  # the group member carries on through the fault too
            watch.end_offsets()  # and so does the demo's reporting
            views = metadata_of_brokers(cluster, TOPIC, 0, [2, 3])
            return all(v is not None and v.leader in (2, 3) for v in views.values())

        wait_until(new_leader, 60, f"a new leader of {TOPIC}-0 in the survivors' metadata")
        acknowledged_then = producer.acknowledged_count()

        def counted() -> bool:
            consumer.poll(0.1)
            total, missing = watch.end_offsets()
            return not missing and total >= acknowledged_then

        wait_until(counted, RECOVERY_S, "every partition's end offset after the election")
    finally:
        deliveries = producer.stop()
        consumer.close()
    acknowledged = len(deliveries.acknowledged)

    def complete() -> int | None:
        total, missing = watch.end_offsets()
        return None if missing else total

    total = wait_until(complete, RECOVERY_S, "end offsets of every partition")
    # Without idempotence a retried batch may be written twice: at least every acknowledged one.
    assert total is not None and total >= acknowledged > 0
