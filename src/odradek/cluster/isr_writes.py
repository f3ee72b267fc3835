"""A leader's ISR writes, coalesced into ZooKeeper multi() batches.

When a broker dies, every leader it followed shrinks the ISR of each partition it shares with it:
tens of thousands of conditional writes at once. One at a time through kazoo they cost ~300 µs
each and queue every other ZooKeeper request of this broker (its controller's too) behind them for
seconds. Writes issued in the same turn of the event loop (one ISR expiration sweep issues all of
its shrinks in one turn) go instead as multi() transactions of up to MAX_BATCH conditional setData
ops.

A multi is all or nothing: one partition whose znode version has moved on (the controller changed
its state; this leader is a zombie for it) fails the whole batch, and nothing of it is applied. The
batch is then written again one write at a time, through the single-write function, which decides
each partition's fate exactly as without batching (including the check for our own write that
landed before a connection loss). Each caller gets its own outcome: the new znode version, None
when the write was refused, or the write's exception.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from odradek.cluster.partition_isr import IsrUpdate
from odradek.zk.client import ZkClient
from odradek.zk.errors import BadVersionError, NoNodeError
from odradek.zk.ops import SetDataOp
from odradek.zk.znodes import TopicPartitionStateZNode

log = logging.getLogger(__name__)

MAX_BATCH = 1000  # ~150 bytes per op: far under ZooKeeper's 1 MB request limit

SingleWrite = Callable[[IsrUpdate], Awaitable[int | None]]


async def write_isr(zk: ZkClient, update: IsrUpdate) -> int | None:
    """One conditional ISR write; returns the new znode version, or None if refused (fenced)."""
    path = TopicPartitionStateZNode.path(update.topic, update.partition)
    try:
        stat = await zk.set(path, encode_state(update), update.zk_version)
        return int(stat.version)
    except BadVersionError:
        # Kafka's check: if the znode already holds exactly our state (our own write, retried
        # after a connection loss), it succeeded; otherwise the controller has moved on.
        try:
            current, stat = await zk.get(path)
        except NoNodeError:
            return None
        state = TopicPartitionStateZNode.decode(current, stat.version, path)
        if (
            state.leader == update.leader
            and state.leader_epoch == update.leader_epoch
            and tuple(state.isr) == tuple(update.isr)
            and stat.version == update.zk_version + 1
        ):
            return int(stat.version)
        return None


def encode_state(update: IsrUpdate) -> bytes:
    return TopicPartitionStateZNode.encode(
        leader=update.leader,
        leader_epoch=update.leader_epoch,
        isr=update.isr,
        controller_epoch=update.controller_epoch,
    )


class BatchedIsrWriter:
    """Call it with an IsrUpdate; returns the new znode version, or None if the write was refused."""

    def __init__(
        self, zk: ZkClient, single_write: SingleWrite | None = None, max_batch: int = MAX_BATCH
    ) -> None:
        self._zk = zk
        self._single_write = single_write or functools.partial(write_isr, zk)
        self._max_batch = max_batch
        self._pending: list[tuple[IsrUpdate, asyncio.Future[int | None]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.batches = 0  # multi() batches written (for tests and logs)

    async def __call__(self, update: IsrUpdate) -> int | None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int | None] = loop.create_future()
        self._pending.append((update, future))
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        batch: list[tuple[IsrUpdate, asyncio.Future[int | None]]] = []
        try:
            await asyncio.sleep(0)  # let the rest of this turn's writes join
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                await self._write(batch)
        except asyncio.CancelledError:  # shutting down: nobody is left to write for the callers
            for _, future in batch + self._pending:
                future.cancel()
            self._pending.clear()
            raise
        finally:
            self._drainer = None
            if self._pending:  # arrived while we were finishing: start again
                self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _write(self, batch: list[tuple[IsrUpdate, asyncio.Future[int | None]]]) -> None:
        if len(batch) > 1:
            ops = [
                SetDataOp(
                    TopicPartitionStateZNode.path(u.topic, u.partition),
                    encode_state(u),
                    u.zk_version,
                )
                for u, _ in batch
            ]
            try:
                results = await self._zk.multi(ops)
            except (BadVersionError, NoNodeError) as e:
                log.info(
                    "a batch of %d ISR writes was refused (%s): writing them one by one",
                    len(batch),
                    e,
                )
            except Exception as e:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                return
            else:
                self.batches += 1
                for (_, future), stat in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(int(stat.version))  # type: ignore[union-attr]
                return
        outcomes = await asyncio.gather(
            *(self._single_write(u) for u, _ in batch), return_exceptions=True
        )
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
