"""DeleteRecords on the leaders this broker hosts (Kafka's ReplicaManager.deleteRecords).

Each leader moves its log start offset now (`Partition.delete_records_on_leader`: up to the high
watermark, -1 meaning the high watermark), the replica manager persists the log start offsets at
once, and the answer waits until every ISR follower has reported the new start in a fetch (the
partition's low watermark), or the request's timeout: REQUEST_TIMED_OUT for the partitions still
waiting. Followers move their own start when a fetch response carries the leader's, and persist
it before their next fetch reports it (`ReplicaFetcherManager.on_log_start_offset_moved`).

Concurrency: the broker's event loop thread, like the replica manager.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from odradek.errors import KafkaError, RequestTimedOutError

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ReplicaManager

TopicPartition = tuple[str, int]


def delete_records(
    replica_manager: ReplicaManager, offsets: dict[TopicPartition, int], timeout_ms: int
) -> Awaitable[dict[TopicPartition, tuple[int, KafkaError | None]]]:
    """Per partition, (low watermark, error) once the followers caught up or the timeout."""
    results: dict[TopicPartition, tuple[int, KafkaError | None]] = {}
    waits: dict[TopicPartition, asyncio.Future[int]] = {}
    moved = False
    for key, offset in offsets.items():
        try:
            partition = replica_manager.leader_partition(*key)
            before = partition.log_start_offset
            start = partition.delete_records_on_leader(offset)
        except KafkaError as e:
            results[key] = (-1, e)
            continue
        moved = moved or start != before
        waits[key] = partition.wait_for_low_watermark(start)
    if moved:
        replica_manager.on_log_start_offset_moved()

    async def wait() -> dict[TopicPartition, tuple[int, KafkaError | None]]:
        if waits:
            await asyncio.wait(waits.values(), timeout=timeout_ms / 1000)
        for key, future in waits.items():
            if not future.done():
                future.cancel()
                results[key] = (-1, RequestTimedOutError(f"{key}: low watermark not reached"))
            elif future.exception() is not None:
                error = future.exception()
                results[key] = (
                    -1,
                    error if isinstance(error, KafkaError) else KafkaError(str(error)),
                )
            else:
                results[key] = (future.result(), None)
        return results

    return wait()
