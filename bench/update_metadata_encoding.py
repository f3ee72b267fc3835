"""CPU to encode the controller's UpdateMetadata for every broker: one encoding per recipient (as
before) against one shared body with each recipient's broker epoch written into it
(`controller.channel_manager.with_broker_epoch`), in the same run. Prints one JSON object.

    .venv/bin/python bench/update_metadata_encoding.py --partitions 10000,100000 --brokers 3
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

from odradek.controller.channel_manager import UPDATE_METADATA_VERSION, with_broker_epoch
from odradek.protocol.build import build
from odradek.protocol.codec import ApiKey, EncodedRequest, encode_body, encode_request
from odradek.protocol.messages import UpdateMetadataRequestV7
from odradek.protocol.messages.update_metadata.v7.request import (
    UpdateMetadataPartitionState,
    UpdateMetadataTopicState,
)


def requests(partitions: int, brokers: int) -> list[Any]:
    """One UpdateMetadata per broker: `partitions` partitions in topics of 100, RF 3."""
    topics: dict[str, list[Any]] = {}
    for i in range(partitions):
        topics.setdefault(f"topic-{i // 100}", []).append(
            UpdateMetadataPartitionState(
                partition_index=i % 100,
                controller_epoch=3,
                leader=1 + i % brokers,
                leader_epoch=5,
                isr=(1, 2, 3),
                zk_version=7,
                replicas=(1, 2, 3),
                offline_replicas=(),
            )
        )
    topic_states = tuple(
        build(
            UpdateMetadataTopicState,
            {"topic_name": t, "topic_id": uuid.uuid4(), "partition_states": s},
        )
        for t, s in topics.items()
    )
    live = [
        {
            "id": b,
            "endpoints": [
                {"port": 9092, "host": "127.0.0.1", "listener": "PLAINTEXT", "security_protocol": 0}
            ],
            "rack": None,
        }
        for b in range(1, brokers + 1)
    ]
    return [
        build(
            UpdateMetadataRequestV7,
            {
                "controller_id": 1,
                "controller_epoch": 4,
                "broker_epoch": 1000 + b,
                "topic_states": topic_states,
                "live_brokers": live,
            },
        )
        for b in range(1, brokers + 1)
    ]


def frame(request: Any) -> bytes:
    return encode_request(ApiKey.UPDATE_METADATA, UPDATE_METADATA_VERSION, 1, "c", request)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", default="10000,100000")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = []
    for n in (int(p) for p in args.partitions.split(",")):
        batch = requests(n, args.brokers)
        each, shared = [], []
        for _ in range(args.rounds):
            started = time.process_time()
            before = [frame(r) for r in batch]
            each.append(time.process_time() - started)
            started = time.process_time()
            body = encode_body(batch[0]).body
            after = [
                frame(EncodedRequest(r, with_broker_epoch(body, r.broker_epoch))) for r in batch
            ]
            shared.append(time.process_time() - started)
            if before != after:
                raise SystemExit("the shared body differs from the per-broker encoding")
        results.append(
            {
                "partitions": n,
                "brokers": args.brokers,
                "frame_bytes": len(before[0]),
                "per_broker_cpu_s": round(min(each), 3),
                "shared_cpu_s": round(min(shared), 3),
                "ratio": round(min(each) / min(shared), 2),
            }
        )
    print(json.dumps({"bench": "update_metadata_encoding", "results": results}))


if __name__ == "__main__":
    main()
