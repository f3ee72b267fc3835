"""Topic creation and metadata propagation time on a local cluster.

For each partition count N: create one topic with N partitions (CreateTopics through confluent-kafka's
AdminClient, which waits for the broker's answer), then poll every broker's Metadata until each shows a
leader for all N partitions. Prints one JSON object per N:

    .venv/bin/python bench/metadata_propagation.py --brokers 3 --partitions 1000,10000 --replication-factor 3

`create_s` is until the CreateTopics answer; `propagated_s` until every broker's Metadata shows every
leader; `metadata_request_s` is the time of one full Metadata request afterwards (cached).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from scratch import temporary_directory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def leaders_everywhere(bootstraps: list[str], topic: str, partitions: int) -> bool:
    for bootstrap in bootstraps:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
        metadata = admin.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None or len(metadata.partitions) != partitions:
            return False
        if any(p.leader < 0 for p in metadata.partitions.values()):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--partitions", default="1000,10000")
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()

    from odradek.testing import LocalCluster

    directory = args.dir or temporary_directory("odradek-bench-metadata-")
    cluster = LocalCluster.up(directory, brokers=args.brokers)
    try:
        bootstraps = [b.bootstrap for b in cluster.brokers]
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 2})
        for count in [int(n) for n in args.partitions.split(",")]:
            topic = f"meta-{count}"
            started = time.perf_counter()
            futures = admin.create_topics(
                [NewTopic(topic, num_partitions=count, replication_factor=args.replication_factor)],
                operation_timeout=600,
                request_timeout=600,
            )
            futures[topic].result(timeout=900)
            created = time.perf_counter() - started
            deadline = started + 900
            while not leaders_everywhere(bootstraps, topic, count):
                if time.perf_counter() > deadline:
                    raise SystemExit(f"metadata for {count} partitions did not propagate in time")
                time.sleep(0.05)
            propagated = time.perf_counter() - started
            one = time.perf_counter()
            AdminClient({"bootstrap.servers": bootstraps[0], "log_level": 2}).list_topics(
                timeout=60
            )
            metadata_request = time.perf_counter() - one
            print(
                json.dumps(
                    {
                        "bench": "metadata_propagation",
                        "brokers": args.brokers,
                        "partitions": count,
                        "replication_factor": args.replication_factor,
                        "create_s": round(created, 3),
                        "propagated_s": round(propagated, 3),
                        "metadata_request_s": round(metadata_request, 3),
                    }
                ),
                flush=True,
            )
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
