"""Structure-aware fuzzing of every API and version the broker advertises, against a live broker.

Frames are random valid requests built from kio's message schemas, then mutated (truncation, bit
flips, spliced and inserted bytes, extreme integers, length prefixes set to huge or negative
values, random tails, wrong frame sizes), plus Produce requests carrying mutated record batches;
see frames.py for which frames are sent and what the broker must do with each (answer, close, or
wait), and driver.py for how they are sent (one connection each, 24 at a time).

The run: a one-broker cluster with two topics: `fuzz-target`, which frames may write to, and a
canary written once before the run, which no frame may name. ODRADEK_FUZZ_FRAMES frames (50,000
by default; 1,000,000 with ODRADEK_SOAK=1) from a random seed, printed at the start;
ODRADEK_FUZZ_SEED replays a run and ODRADEK_FUZZ_FRAME=N sends just frame N of it. The first frame
handled wrongly fails the test with its hex dump. At the end:

* the broker process is alive and registered, and serves a normal producer and consumer;
* its RSS grew by less than RSS_GROWTH_BOUND after the first tenth of the run (warm-up);
* the canary's partitions hold exactly the bytes they held before;
* every record stored in `fuzz-target` (whatever the fuzzer's Produce frames got accepted) reads
  back with librdkafka, offset after offset, to the log end.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from odradek.protocol.record_batch import iter_batches
from tests.fixtures.cluster import wait_until
from tests.fuzz.driver import Stats, alive, rss_bytes, run
from tests.fuzz.frames import make_frame
from tests.fuzz.generate import Names
from tests.integration import _wire
from tests.integration._clients import (
    Rec,
    confluent_consumer,
    consume,
    create_topic,
    produce,
)

SOAK = os.environ.get("ODRADEK_SOAK") == "1"
FRAMES = int(os.environ.get("ODRADEK_FUZZ_FRAMES", 1_000_000 if SOAK else 50_000))
# A CI run grows the broker by 2-5 MB; a soak's million frames by 10-20 MB (producer states of
# fuzzed producer ids, groups). 24 MB catches what 96 MB let through: cyclic garbage frozen alive
# after every small controller request (controller/gc_pause.py) grew a CI run by about 40 MB.
RSS_GROWTH_BOUND = (24 if FRAMES <= 100_000 else 96) * 1024 * 1024
PARTITIONS = 3


def fuzz_seed() -> int:
    seed = int(os.environ.get("ODRADEK_FUZZ_SEED", random.SystemRandom().randrange(2**32)))
    print(f"fuzz seed {seed} (replay with ODRADEK_FUZZ_SEED={seed})")
    return seed


def snapshot(bootstrap: str, topic: str) -> list[bytes]:
    out = []
    with _wire.WireConnection.to(bootstrap) as connection:
        for partition in range(PARTITIONS):
            out.append(_wire.fetch(connection, topic, partition, 0, 64 << 20).records)
    return out


CONTROL_FLAG = 0x20  # the control bit of a v2 batch's attributes


def _control_offsets(connection: Any, topic: str, partition: int, start: int) -> set[int]:
    """The offsets of the partition's control batches (transaction markers), from `start`."""
    found: set[int] = set()
    while True:
        records = _wire.fetch(connection, topic, partition, start, 64 << 20).records or b""
        before = start
        for header in iter_batches(records):
            if header.attributes & CONTROL_FLAG:
                found.update(range(header.base_offset, header.next_offset))
            start = header.next_offset
        if start == before:  # nothing more (or only part of a batch) below the high watermark
            return found


def read_everything(bootstrap: str, topic: str) -> dict[int, list[int]]:
    """Every offset librdkafka reads from each partition, from its log start offset (retention
    may have deleted old segments: the fuzzer writes records of 2023) to its log end offset.

    Read uncommitted: fuzzed produce requests carry transactional batches that no coordinator
    ever ends (Kafka 3.9 accepts them too, without KIP-890's verification), and a read_committed
    reader — librdkafka's default — stops at the first of them. Control records, which no client
    delivers, are left out of what is expected."""
    with _wire.WireConnection.to(bootstrap) as connection:
        starts = {
            p: _wire.list_offset(connection, topic, p, _wire.EARLIEST) for p in range(PARTITIONS)
        }
        control = {p: _control_offsets(connection, topic, p, starts[p]) for p in range(PARTITIONS)}
    ends = {p: _wire.log_end_offset(bootstrap, topic, p) for p in range(PARTITIONS)}
    offsets: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    consumer = confluent_consumer(bootstrap, **{"isolation.level": "read_uncommitted"})
    try:
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(
            len(offsets[p]) < ends[p] - starts[p] - len(control[p]) for p in range(PARTITIONS)
        ):
            for message in consumer.consume(1000, 0.5):
                if message.error():
                    raise AssertionError(f"librdkafka: {message.error()}")
                message.key(), message.value(), message.headers()
                offsets[message.partition()].append(message.offset())
    finally:
        consumer.close()
    for partition in range(PARTITIONS):
        expected = [
            o for o in range(starts[partition], ends[partition]) if o not in control[partition]
        ]
        assert offsets[partition] == expected, f"partition {partition}"
    return offsets


@pytest.mark.timeout(max(600, FRAMES // 200))  # a soak of 1,000,000 frames takes 10-20 minutes
def test_fuzzed_requests_of_every_api(make_cluster: Any) -> None:
    seed = fuzz_seed()
    cluster = make_cluster(1, auto_create_topics_enable=False, group_initial_rebalance_delay_ms=0)
    broker = cluster.broker(1)
    bootstrap = broker.bootstrap
    host, _, port = bootstrap.rpartition(":")
    target, canary = "fuzz-target", f"canary-{uuid.uuid4().hex}"
    for topic in (target, canary):
        create_topic(bootstrap, topic, partitions=PARTITIONS, replication_factor=1)
    wait_until(lambda: _wire.log_end_offset(bootstrap, canary, 2) == 0, 30, "canary leaders")
    for partition in range(PARTITIONS):
        records = [Rec(f"k{i}".encode(), f"canary-{partition}-{i}".encode()) for i in range(50)]
        assert produce("confluent", bootstrap, canary, partition, records) == list(range(50))
    before = snapshot(bootstrap, canary)
    names = Names(
        topics=(target, "fz-absent"),
        groups=("fuzz-group", "fz-group-2"),
        forbidden=frozenset({canary}),
    )
    protected = frozenset({target, canary})

    def make(index: int) -> Any:
        return make_frame(seed, index, names, protected)

    stats = Stats()
    only = os.environ.get("ODRADEK_FUZZ_FRAME")
    pid = broker.pid
    warmup = max(1, FRAMES // 10)
    if only is not None:
        asyncio.run(run(host, int(port), pid, 1, make, stats, start_index=int(only)))
    else:
        asyncio.run(run(host, int(port), pid, warmup, make, stats))
        rss_after_warmup = rss_bytes(pid)
        asyncio.run(run(host, int(port), pid, FRAMES - warmup, make, stats, warmup))
        grown = rss_bytes(pid) - rss_after_warmup
        print(
            f"{stats.sent} frames sent ({stats.skipped} skipped as unsafe) in "
            f"{stats.seconds:.0f}s; outcomes {dict(stats.outcomes)}; RSS after warm-up "
            f"{rss_after_warmup >> 20} MB, grown {grown >> 20} MB since; samples "
            f"{[(n, r >> 20) for n, r in stats.rss_samples[-5:]]}"
        )
        results = os.environ.get("ODRADEK_FUZZ_RESULTS")
        if results:  # ./dev soak's JSON summary
            Path(results).write_text(
                json.dumps(
                    {
                        "frames": stats.sent,
                        "skipped": stats.skipped,
                        "seconds": round(stats.seconds),
                        "outcomes": dict(stats.outcomes),
                        "rss_after_warmup_mb": rss_after_warmup >> 20,
                        "rss_grown_mb": grown >> 20,
                    },
                    indent=2,
                )
                + "\n"
            )
        assert grown < RSS_GROWTH_BOUND, f"the broker's RSS grew by {grown >> 20} MB"
    assert alive(pid)
    assert cluster.registered_brokers() == [1]
    assert snapshot(bootstrap, canary) == before
    read_everything(bootstrap, target)
    after = [Rec(b"after", b"fuzzing")]
    offset = _wire.log_end_offset(bootstrap, canary, 0)
    assert produce("confluent", bootstrap, canary, 0, after) == [offset]
    assert consume("confluent", bootstrap, canary, 0, offset, 1)[0].value == b"fuzzing"
