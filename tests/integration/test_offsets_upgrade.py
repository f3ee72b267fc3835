"""The upgrade from ZooKeeper-stored offsets: earlier Odradek versions kept a group's committed
offsets in `/consumers/<group>/offsets/<topic>/<partition>` (the offset as decimal text). A broker
of this version imports them into `__consumer_offsets` once, when it first loads the group's
partition (`odradek.coordinator.group.zk_import`): the groups resume where they were, the import
is marked in ZooKeeper, and later commits are never overwritten by a second import.

The test writes the old znodes the way the old store did, restarts the broker (the upgrade), and
reads the offsets back with real clients.
"""

from __future__ import annotations

import json
import time
from typing import Any

from kazoo.client import KazooClient

from odradek.coordinator.group.zk_offsets import ConsumerOffsetZNode
from tests.integration._clients import create_topic, unique_topic, wait_until_serving
from tests.integration._groups import (
    CLIENT_TIMEOUT_S,
    Position,
    committed,
    kafka_python_consumer,
    produce,
)


def kafka_python_consume(bootstrap: str, group: str, topic: str, count: int) -> list[Position]:
    consumer = kafka_python_consumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        got: list[Position] = []
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while len(got) < count:
            assert time.monotonic() < deadline, f"kafka-python got only {got}"
            for records in consumer.poll(timeout_ms=200).values():
                got.extend((r.partition, r.offset) for r in records)
        consumer.commit()
        return got
    finally:
        consumer.close()


def test_zookeeper_offsets_are_imported_once_on_upgrade(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    bootstrap = cluster.bootstrap_servers
    wait_until_serving(bootstrap)
    topic = unique_topic("legacy")
    create_topic(bootstrap, topic, partitions=2)
    produce(bootstrap, topic, {0: 10, 1: 10}, "old")
    legacy = {"legacy-group": {0: 4, 1: 7}, "orders/eu": {0: 9}}
    zk = KazooClient(hosts=cluster.zookeeper_connect)
    zk.start(timeout=15)
    try:
        for group, offsets in legacy.items():
            for partition, offset in offsets.items():
                zk.create(
                    ConsumerOffsetZNode.path(group, topic, partition),
                    ConsumerOffsetZNode.encode(offset),
                    makepath=True,
                )
        # The upgrade: the broker restarts as this version.
        (broker_id,) = cluster.broker_ids
        cluster.kill(broker_id)
        cluster.start_broker(broker_id)
        wait_until_serving(bootstrap)
        assert committed(bootstrap, "legacy-group", topic, 2) == {0: 4, 1: 7}
        assert committed(bootstrap, "orders/eu", topic, 2) == {0: 9, 1: -1001}
        for group in legacy:
            marker, _ = zk.get(f"{ConsumerOffsetZNode.group_path(group)}/imported")
            assert json.loads(marker)["topic"] == "__consumer_offsets"
        # The group resumes where the old store left it, and commits on.
        resumed = kafka_python_consume(bootstrap, "legacy-group", topic, 9)
        assert sorted(resumed) == [(0, o) for o in range(4, 10)] + [(1, o) for o in range(7, 10)]
        assert committed(bootstrap, "legacy-group", topic, 2) == {0: 10, 1: 10}
        # Another restart: the marked group is not imported again over its newer commits, and
        # the offsets live in the topic alone (the old znodes may go).
        zk.delete(ConsumerOffsetZNode.group_path("orders/eu") + "/offsets", recursive=True)
        cluster.kill(broker_id)
        cluster.start_broker(broker_id)
        wait_until_serving(bootstrap)
        assert committed(bootstrap, "legacy-group", topic, 2) == {0: 10, 1: 10}
        assert committed(bootstrap, "orders/eu", topic, 2) == {0: 9, 1: -1001}
        assert zk.get(ConsumerOffsetZNode.path("legacy-group", topic, 0))[0] == b"4"
    finally:
        zk.stop()
        zk.close()
