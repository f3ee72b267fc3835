"""Validation of large produce requests off the event loop, with appends kept in order.

Validating a produce request's records (`odradek.log.validator`) is cheap for the batches
producers usually send: the native walker checks a 1 MB batch of 100-byte records in well under a
millisecond. A batch that decompresses to tens of megabytes takes tens of milliseconds, and the
event loop serves every connection of the broker: a few such batches would stall every fetch and
heartbeat behind them. So the replica manager validates on the loop only up to `INLINE_BUDGET`
bytes of records; past that the validator raises `NeedsWorkerThread` (having done at most that
much work) and the append goes through this queue:

1. the validation runs on a worker thread (decompression and the walk release the GIL);
2. back on the loop, the append waits for the previous deferred append to the same partition to
   finish, then appends with the validation's result.

Appends to one partition keep the order their requests arrived in: once a partition has a deferred
append in flight, every later append to it is deferred too (and validated on a worker thread)
until the queue drains. Other partitions are not held up.

The same goes for a batch the leader must recompress for the topic's compression.type (compressing
costs more than validating, so the inline budget for that is smaller: see the validator).

Concurrency: `AppendQueue` is used from the event loop thread only; the worker threads run
nothing but `validate_produce_records`, on immutable inputs (the request's `bytes` and the log's
frozen `LogConfig`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from odradek.log.config import LogConfig
from odradek.log.validator import ValidatedRecords, validate_produce_records

INLINE_BUDGET = 1024 * 1024
"""Bytes of records (decompressed) validated on the event loop; more go to a worker thread."""
WORKERS = 2

T = TypeVar("T")
TopicPartition = tuple[str, int]


class AppendQueue:
    """Deferred appends per partition, and the worker threads that validate them."""

    def __init__(self, workers: int = WORKERS, inline_budget: int = INLINE_BUDGET) -> None:
        self.inline_budget = inline_budget
        self._workers = workers
        self._executor: ThreadPoolExecutor | None = None
        self._tails: dict[TopicPartition, asyncio.Future[Any]] = {}

    def busy(self, key: TopicPartition) -> bool:
        """Whether `key` has a deferred append in flight (later appends must queue behind it)."""
        return key in self._tails

    def defer(
        self,
        key: TopicPartition,
        append: Callable[[asyncio.Future[Any] | None], Awaitable[T]],
    ) -> asyncio.Future[T]:
        """Start `append(previous)` as a task, where `previous` is the deferred append to `key`
        it must wait for (or None); it becomes the partition's new tail."""
        previous = self._tails.get(key)
        task = asyncio.ensure_future(append(previous))
        self._tails[key] = task

        def forget(done: asyncio.Future[Any]) -> None:
            if self._tails.get(key) is done:
                del self._tails[key]

        task.add_done_callback(forget)
        return task

    async def validate(
        self, records: bytes, config: LogConfig, now_ms: int, partition_name: str = ""
    ) -> ValidatedRecords:
        """Validate (and recompress, for the topic's compression.type) on a worker thread,
        without a budget."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self._workers, thread_name_prefix="odradek-validate"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, validate_produce_records, records, config, now_ms, None, partition_name
        )

    @staticmethod
    async def after(previous: asyncio.Future[Any] | None) -> None:
        """Wait for the previous deferred append, whatever its outcome."""
        if previous is not None and not previous.done():
            await asyncio.wait([previous])  # never raises the previous append's error

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
