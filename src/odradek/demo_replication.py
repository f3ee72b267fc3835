"""The README's demo: a local 3-broker cluster, a replicated topic, real clients, a broker killed.

    .venv/bin/python -m odradek.demo_replication [--dir DIR] [--keep]

Steps, each printed as it happens: start ZooKeeper and three brokers with the local cluster launcher;
create a topic with 6 partitions and replication factor 3 (min.insync.replicas=2); produce records
with confluent-kafka (acks=all); SIGKILL the leader of partition 0 in the middle of the stream; keep
producing (the client follows the new leader); restart the killed broker and wait until it is back in
every ISR; consume everything by partition assignment and check that every acknowledged record is
there exactly once; shut the cluster down cleanly.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="odradek.demo_replication", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dir", type=Path, help="cluster directory (default: a temporary one)")
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)

    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from odradek.testing import LocalCluster

    directory = args.dir or Path(tempfile.mkdtemp(prefix="odradek-demo-"))
    say(f"starting ZooKeeper and 3 brokers in {directory}")
    cluster = LocalCluster.up(directory, brokers=3)
    ok = False
    try:
        bootstrap = cluster.bootstrap_servers
        say(f"cluster up: bootstrap {bootstrap}, controller is broker {cluster.controller_id()}")
        quiet = {"log_level": 2}  # the kill is on purpose: no librdkafka connection warnings
        admin = AdminClient({"bootstrap.servers": bootstrap, **quiet})
        topic = "demo-events"
        futures = admin.create_topics(
            [
                NewTopic(
                    topic,
                    num_partitions=6,
                    replication_factor=3,
                    config={"min.insync.replicas": "2"},
                )
            ]
        )
        futures[topic].result(60)
        metadata = admin.list_topics(topic, timeout=10).topics[topic]
        for partition in sorted(metadata.partitions.values(), key=lambda p: p.id):
            say(
                f"  {topic}-{partition.id}: leader {partition.leader}, replicas {partition.replicas}, isr {partition.isrs}"
            )

        acked: dict[tuple[int, int], bytes] = {}
        failed = 0

        def on_delivery(err, message):  # type: ignore[no-untyped-def]
            nonlocal failed
            if err is None:
                acked[(message.partition(), message.offset())] = message.value()
            else:
                failed += 1

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 60000,
                **quiet,
            }
        )
        victim = metadata.partitions[0].leader
        half = args.records // 2
        say(
            f"producing {args.records} records with acks=all; broker {victim} (leader of partition 0) dies halfway"
        )
        started = time.monotonic()
        for i in range(args.records):
            if i == half:
                producer.flush(60)
                say(f"  {len(acked)} acknowledged; SIGKILL broker {victim}")
                cluster.kill(victim)
            producer.produce(
                topic,
                key=str(i % 97).encode(),
                value=f"event-{i}".encode(),
                on_delivery=on_delivery,
            )
            producer.poll(0)
        producer.flush(120)
        say(f"  {len(acked)} acknowledged, {failed} failed, in {time.monotonic() - started:.1f}s")
        metadata = admin.list_topics(topic, timeout=10).topics[topic]
        for partition in sorted(metadata.partitions.values(), key=lambda p: p.id):
            say(f"  {topic}-{partition.id}: leader {partition.leader}, isr {partition.isrs}")

        say(f"restarting broker {victim}")
        cluster.restart(victim)

        def all_in_sync() -> bool:
            current = admin.list_topics(topic, timeout=10).topics[topic]
            return all(len(p.isrs) == 3 for p in current.partitions.values())

        cluster.wait_for(all_in_sync, 120, "every replica back in sync")
        say(f"broker {victim} is back in every ISR")

        del producer
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "demo",
                "enable.auto.commit": False,
                **quiet,
            }
        )
        seen: dict[tuple[int, int], bytes] = {}
        for partition in range(6):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            consumer.assign([TopicPartition(topic, partition, low)])
            while True:
                position = max([o for (p, o) in seen if p == partition], default=low - 1) + 1
                if position >= high:
                    break
                for message in consumer.consume(1000, 5):
                    if message.error() is None:
                        seen[(message.partition(), message.offset())] = message.value()
        consumer.close()
        missing = [key for key in acked if seen.get(key) != acked[key]]
        say(
            f"consumed {len(seen)} records; acknowledged records missing or changed: {len(missing)}"
        )
        ok = not missing and len(seen) == len(set(seen.values()))
        say("every acknowledged record is there exactly once" if ok else "DATA CHECK FAILED")
        totals = cluster.status()["totals"]
        say(
            f"cluster status: {totals['partitions']} partitions, {totals['online']} online,"
            f" {totals['offline']} offline, {totals['under_replicated']} under-replicated"
        )

    finally:
        if args.keep:
            say(
                f"leaving the cluster running in {directory} (odradek cluster down --dir {directory})"
            )
        else:
            say("shutting down")
            cluster.down()
            if args.dir is None:
                shutil.rmtree(directory, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
