"""read_committed fetches through the zero-copy path give what the copying path gives.

The zero-copy read hands a range of a segment file to sendfile without reading its batches, so it
cannot bound the aborted transactions by the last batch it read, as the copying read does; it bounds
them by the base offset of the batch after the range (one 8-byte read), as Kafka bounds them by its
fetch upper bound. Over a log of interleaved transactional producers (commits and aborts), plain
records and several segments, every read from every offset, large and small, must give the same
batches and the same aborted transactions both ways.
"""

from __future__ import annotations

import random
from pathlib import Path

from odradek.cluster.partition import Partition, PartitionStateInfo
from odradek.log.config import LogConfig
from odradek.protocol.fetch_response import FileRecords
from tests.unit.compacted_log import Harness, Producer


class _NoIsrWrites:
    async def __call__(self, update: object) -> int | None:
        raise AssertionError("a one-replica partition writes no ISR")


def _leader(h: Harness) -> Partition:
    partition = Partition(
        "compacted", 0, 1, h.log, _NoIsrWrites(), lambda t, p: None, lambda: 1, 10_000
    )
    partition.make_leader(
        PartitionStateInfo(
            controller_epoch=1, leader=1, leader_epoch=0, isr=(1,), zk_version=0, replicas=(1,)
        ),
        now=0.0,
    )
    return partition


def test_zero_copy_read_committed_matches_the_copying_read(tmp_path: Path) -> None:
    h = Harness(tmp_path, LogConfig(segment_bytes=4096, cleanup_policy=("delete",)))
    rng = random.Random(7)
    producers = [Producer(1000 + i, transactional=True) for i in range(3)]
    for step in range(300):
        producer = rng.choice([*producers, None])
        records = [(f"k{step}-{i}".encode(), b"v" * rng.randint(1, 60)) for i in range(3)]
        h.append(records, producer=producer)
        if producer is not None and rng.random() < 0.3:
            h.end_txn(producer, commit=rng.random() < 0.5)
    partition = _leader(h)
    partition._maybe_increment_high_watermark()
    lso = h.log.last_stable_offset(partition.high_watermark)
    assert lso > 100 and len(h.log.segments()) > 3
    aborted_seen = 0
    for offset in range(h.log.log_start_offset, lso):
        for max_bytes in (1, 300, 5000):
            copied = partition.read_records(
                offset, max_bytes, from_follower=False, read_committed=True, zero_copy=False
            )
            ranged = partition.read_records(
                offset, max_bytes, from_follower=False, read_committed=True, zero_copy=True
            )
            records = ranged.records
            data = records.read() if isinstance(records, FileRecords) else bytes(records)
            assert data == copied.records, (offset, max_bytes)
            assert ranged.aborted_transactions == copied.aborted_transactions, (offset, max_bytes)
            assert ranged.last_stable_offset == copied.last_stable_offset == lso
            aborted_seen += len(copied.aborted_transactions or [])
    assert aborted_seen > 0
