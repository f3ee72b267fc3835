"""Telling apart a topic's duplicates: a broker that stored an idempotent retry again, or a client
that sent a record again.

An idempotent producer numbers its records per partition; a retry of a batch repeats the
producer id, epoch and sequence numbers, and the partition leader answers it with the offsets it
first stored it at (`odradek.log.producer_state`). So two records of one partition stored under
one (producer id, epoch, sequence) are a broker fault, while a value stored twice under
different sequences was sent twice: by a non-idempotent producer's retry, or by a Spark task
retried after a failure, which resends its rows as new records.

`stored_records` reads how each record is stored from the segment files of each partition's
leader (written with pwrite, so what it serves up to its log end); `copy_problems` is the pure
check the Spark sink tests apply to a topic that copies another one.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from odradek.protocol.record_batch import iter_batches
from odradek.testing import LocalCluster
from tests.spark.topics import Record


@dataclass(frozen=True)
class StoredAs:
    """How one record is stored: its producer id, epoch and sequence (from its batch's header),
    and the batch's leader epoch, first offset and broker, for failure messages."""

    partition: int
    producer_id: int
    producer_epoch: int
    sequence: int
    leader_epoch: int
    batch_base_offset: int
    broker: int

    @property
    def producer_key(self) -> tuple[int, int, int, int]:
        """What an idempotent producer's retry repeats: partition, producer id, epoch, sequence."""
        return (self.partition, self.producer_id, self.producer_epoch, self.sequence)


def stored_records(
    cluster: LocalCluster, bootstrap: str, topic: str
) -> dict[tuple[int, int], StoredAs]:
    """(partition, offset) -> how the record is stored, from each partition's current leader."""
    stored = {}
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    for partition, meta in metadata.topics[topic].partitions.items():
        directory = cluster.broker(meta.leader).data_dir / f"{topic}-{partition}"
        for segment in sorted(directory.glob("*.log")):
            for batch in iter_batches(segment.read_bytes()):
                for delta in range(batch.last_offset_delta + 1):
                    stored[(partition, batch.base_offset + delta)] = StoredAs(
                        partition,
                        batch.producer_id,
                        batch.producer_epoch,
                        -1 if batch.base_sequence < 0 else batch.base_sequence + delta,
                        batch.partition_leader_epoch,
                        batch.base_offset,
                        meta.leader,
                    )
    return stored


def describe(records: Sequence[Record], stored: dict[tuple[int, int], StoredAs]) -> list[str]:
    return [
        f"{r.value!r} p{r.partition}@{r.offset}: {stored.get((r.partition, r.offset))}"
        for r in records
    ]


def copy_problems(
    inputs: Sequence[Record],
    copy: Sequence[Record],
    stored: dict[tuple[int, int], StoredAs],
    failed_tasks: int,
) -> list[str]:
    """What is wrong with `copy`, written by an idempotent at-least-once sink from `inputs`
    (`stored`: how each copy record is stored; `failed_tasks`: Spark tasks that failed while it
    ran). Empty when every input value is in the copy at least as often as in the input, more
    often only if a task failed, and no record was stored twice under one producer sequence."""
    problems = []
    by_key: dict[tuple[int, int, int, int], list[Record]] = defaultdict(list)
    for r in copy:
        by_key[stored[(r.partition, r.offset)].producer_key].append(r)
    if anonymous := [r for r in copy if stored[(r.partition, r.offset)].producer_id < 0]:
        problems.append(
            f"{len(anonymous)} records written without a producer id (is the sink idempotent?), "
            f"as {describe(anonymous[:3], stored)}"
        )
        by_key = {k: rs for k, rs in by_key.items() if k[1] >= 0}
    twice = [describe(rs, stored) for rs in by_key.values() if len(rs) > 1]
    if twice:
        problems.append(f"stored twice under one producer sequence (a broker fault): {twice}")
    expected = Counter(r.value for r in inputs)
    copied = Counter(r.value for r in copy)
    if missing := expected - copied:
        problems.append(f"input values missing from the copy: {dict(missing)}")
    if (extra := copied - expected) and failed_tasks == 0:
        problems.append(
            "copied more often than the input holds them, with no Spark task failed: "
            f"{describe([r for r in copy if r.value in extra], stored)}"
        )
    return problems
