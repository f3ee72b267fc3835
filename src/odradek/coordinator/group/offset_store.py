"""Committed consumer-group offsets, stored in ZooKeeper as Kafka 0.8 stored them.

Storage choice. Kafka since 0.9 keeps committed offsets in the compacted `__consumer_offsets`
topic; Odradek implements no log compaction, so that topic would grow without bound. Odradek uses
the ZooKeeper-era layout instead: one persistent znode per committed partition,

    /consumers/<group>/offsets/<topic>/<partition>

whose data is the committed offset as ASCII decimal text (`b"42"`), nothing else. It is replicated
by ZooKeeper, survives any broker, and every broker can read it, so when a group's coordinator moves
the new one finds the offsets where the old one left them; Kafka 0.8-era tools that read this path
keep working. What the format cannot hold is not kept: the commit's metadata string and leader epoch
(OffsetFetch answers "" and -1), and no retention applies (offsets stay until DeleteGroups).

Cache. The coordinator keeps each group's offsets in memory, loaded in full on first use (the
children of the group's `offsets` znode, then every partition znode, all requests in flight at
once) and updated after each successful write. The cache of a group is dropped when the group stops
being coordinated here (`forget`, `retain`), so a group that moves away and back is read afresh.
Offsets of one group are written only by its coordinator; during a change of coordinator two brokers
may briefly both accept commits, and the later ZooKeeper write wins, as with any last-writer-wins
store.

Commit. All partitions of one OffsetCommit go out as one pipelined batch of transactions
(`ZkClient.chunked_multi`): a set for a znode known to exist, a create otherwise (its topic znode
is created first if the cache does not know it). A create that finds the znode there, or a set that
finds it gone, is retried once the other way. Each partition gets its own result.

Concurrency: event-loop thread only; ZooKeeper calls are awaited, and two commits of one group may
be in flight at once (ZooKeeper applies one session's requests in order, so the later commit wins).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.schemas import (
    CONSUMERS_PATH,
    ConsumerOffsetZNode,
    group_id_from_znode_name,
)
from odradek.zk.client import CreateOp, SetDataOp, ZkClient, ZkOp
from odradek.zk.errors import (
    ConnectionLossError,
    InvalidZNodeDataError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
    ZkError,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass(slots=True, eq=False)
class _GroupOffsets:
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    topic_paths: set[str] = field(default_factory=set)  # topic znodes known to exist


def _commit_error(error: BaseException) -> ErrorCode:
    """Kafka's mapping of a failed offsets write: retriable for the client where it can help."""
    if isinstance(error, ConnectionLossError | SessionExpiredError):
        return ErrorCode.coordinator_not_available
    return ErrorCode.unknown_server_error


class OffsetStore:
    """Committed offsets of the groups this broker coordinates, cached per group (see above)."""

    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk
        self._groups: dict[str, _GroupOffsets] = {}
        self._loading: dict[str, asyncio.Task[_GroupOffsets]] = {}
        self._writes: dict[str, set[asyncio.Task[Any]]] = {}  # commits in flight, per group

    # -- cache lifecycle ---------------------------------------------------------------------------

    def forget(self, group_id: str) -> None:
        """Drop the group's cache (it moved away or was deleted)."""
        self._groups.pop(group_id, None)
        self._loading.pop(group_id, None)

    def retain(self, is_local: Callable[[str], bool]) -> None:
        """Keep only the caches of groups `is_local` still places on this broker."""
        for group_id in [g for g in [*self._groups, *self._loading] if not is_local(g)]:
            self.forget(group_id)

    def cached_groups(self) -> list[str]:
        return sorted(self._groups)

    async def _load(self, group_id: str) -> _GroupOffsets:
        """The group's cache, reading it from ZooKeeper on first use.

        The read runs as its own task that concurrent callers share, so a caller whose request
        is cancelled (its client went away) cancels neither the read nor the other callers."""
        entry = self._groups.get(group_id)
        if entry is not None:
            return entry
        task = self._loading.get(group_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load_task(group_id))
            self._loading[group_id] = task
        return await asyncio.shield(task)

    async def _load_task(self, group_id: str) -> _GroupOffsets:
        me = asyncio.current_task()
        try:
            entry = await self._read_group(group_id)
            # A `forget` while we read means the read may predate a change elsewhere: the next
            # caller reads again rather than trusting it.
            if self._loading.get(group_id) is me:
                self._groups[group_id] = entry
            return entry
        finally:
            if self._loading.get(group_id) is me:
                del self._loading[group_id]

    async def _read_group(self, group_id: str) -> _GroupOffsets:
        entry = _GroupOffsets()
        try:
            topics = await self.zk.get_children(ConsumerOffsetZNode.offsets_path(group_id))
        except NoNodeError:
            return entry
        topic_children = await asyncio.gather(
            *(self._children(ConsumerOffsetZNode.topic_path(group_id, t)) for t in topics)
        )
        paths: list[tuple[TopicPartition, str]] = []
        for topic, partitions in zip(topics, topic_children, strict=True):
            if partitions is None:
                continue
            entry.topic_paths.add(ConsumerOffsetZNode.topic_path(group_id, topic))
            for name in partitions:
                if name.isdigit():
                    paths.append(
                        ((topic, int(name)), ConsumerOffsetZNode.path(group_id, topic, int(name)))
                    )
        values = await asyncio.gather(
            *(self.zk.get(path) for _, path in paths), return_exceptions=True
        )
        for (topic_partition, path), value in zip(paths, values, strict=True):
            if isinstance(value, NoNodeError):
                continue
            if isinstance(value, BaseException):
                raise value
            data, _stat = value
            try:
                entry.offsets[topic_partition] = ConsumerOffsetZNode.decode(data, path)
            except InvalidZNodeDataError as e:
                log.warning("ignoring committed offset of group %s: %s", group_id, e)
        return entry

    async def _children(self, path: str) -> list[str] | None:
        try:
            return await self.zk.get_children(path)
        except NoNodeError:
            return None

    # -- reads -------------------------------------------------------------------------------------

    def fetch(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> Awaitable[dict[TopicPartition, int]]:
        """Committed offsets of `partitions` (all the group has when None); absent = never
        committed. The answer reflects every commit of the group started before this call.
        Raises ZkError if ZooKeeper cannot be read."""
        earlier = tuple(self._writes.get(group_id, ()))
        wanted = None if partitions is None else list(partitions)
        return self._fetch(group_id, wanted, earlier)

    async def _fetch(
        self,
        group_id: str,
        partitions: list[TopicPartition] | None,
        earlier: tuple[asyncio.Task[Any], ...],
    ) -> dict[TopicPartition, int]:
        if earlier:
            await asyncio.wait(earlier)  # their errors are their committers' to report
        entry = await self._load(group_id)
        if partitions is None:
            return dict(entry.offsets)
        return {tp: entry.offsets[tp] for tp in partitions if tp in entry.offsets}

    async def group_exists(self, group_id: str) -> bool:
        """Does ZooKeeper hold anything for the group (committed offsets, usually)?"""
        if self._groups.get(group_id) is not None and self._groups[group_id].offsets:
            return True
        return await self.zk.exists(ConsumerOffsetZNode.group_path(group_id)) is not None

    async def list_groups(self) -> list[str]:
        """Every group with a znode under /consumers."""
        try:
            names = await self.zk.get_children(CONSUMERS_PATH)
        except NoNodeError:
            return []
        return [group_id_from_znode_name(name) for name in names]

    # -- writes ------------------------------------------------------------------------------------

    def commit(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> Awaitable[dict[TopicPartition, ErrorCode]]:
        """Start writing `offsets` now; the awaitable gives each partition's result (NONE, or the
        error to answer). The write goes on if the awaiting request is cancelled, and later
        `fetch`es of the group wait for it."""
        task = asyncio.get_running_loop().create_task(self._commit(group_id, dict(offsets)))
        writes = self._writes.setdefault(group_id, set())
        writes.add(task)
        task.add_done_callback(lambda done: self._write_done(group_id, done))
        return asyncio.shield(task)

    def _write_done(self, group_id: str, task: asyncio.Task[Any]) -> None:
        writes = self._writes.get(group_id)
        if writes is not None:
            writes.discard(task)
            if not writes:
                del self._writes[group_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("committing offsets of group %s failed", group_id, exc_info=task.exception())

    async def _commit(
        self, group_id: str, offsets: dict[TopicPartition, int]
    ) -> dict[TopicPartition, ErrorCode]:
        if not offsets:
            return {}
        try:
            entry = await self._load(group_id)
            await self._ensure_topic_paths(group_id, entry, {t for t, _ in offsets})
        except ZkError as e:
            log.warning("cannot commit offsets of group %s: %s", group_id, e)
            return dict.fromkeys(offsets, _commit_error(e))
        items = list(offsets.items())
        ops = [self._write_op(group_id, entry, tp, offset, create=None) for tp, offset in items]
        try:
            results = await self.zk.chunked_multi(None, ops)
        except ZkError as e:
            log.warning("cannot commit offsets of group %s: %s", group_id, e)
            return dict.fromkeys(offsets, _commit_error(e))
        # A create that raced with another writer, or a set of a znode deleted meanwhile: once more
        # the other way round.
        retry = [
            index
            for index, result in enumerate(results)
            if isinstance(result, NodeExistsError | NoNodeError)
        ]
        if retry:
            retry_ops = [
                self._write_op(
                    group_id,
                    entry,
                    items[i][0],
                    items[i][1],
                    create=isinstance(results[i], NoNodeError),
                )
                for i in retry
            ]
            try:
                retried = await self.zk.chunked_multi(None, retry_ops)
            except ZkError as e:
                retried = [e] * len(retry_ops)
            for index, result in zip(retry, retried, strict=True):
                results[index] = result
        answer: dict[TopicPartition, ErrorCode] = {}
        for (topic_partition, offset), result in zip(items, results, strict=True):
            if isinstance(result, ZkError):
                log.warning(
                    "cannot commit offset %d of %s-%d for group %s: %s",
                    offset,
                    topic_partition[0],
                    topic_partition[1],
                    group_id,
                    result,
                )
                answer[topic_partition] = _commit_error(result)
            else:
                entry.offsets[topic_partition] = offset
                answer[topic_partition] = ErrorCode.none
        return answer

    @staticmethod
    def _write_op(
        group_id: str,
        entry: _GroupOffsets,
        topic_partition: TopicPartition,
        offset: int,
        create: bool | None,
    ) -> ZkOp:
        topic, partition = topic_partition
        path = ConsumerOffsetZNode.path(group_id, topic, partition)
        data = ConsumerOffsetZNode.encode(offset)
        if create is None:
            create = topic_partition not in entry.offsets
        return CreateOp(path, data) if create else SetDataOp(path, data)

    async def _ensure_topic_paths(
        self, group_id: str, entry: _GroupOffsets, topics: set[str]
    ) -> None:
        missing = [
            path
            for path in (ConsumerOffsetZNode.topic_path(group_id, t) for t in sorted(topics))
            if path not in entry.topic_paths
        ]
        if missing:
            await self.zk.ensure_paths(missing)
            entry.topic_paths.update(missing)

    async def delete_group(self, group_id: str) -> bool:
        """Delete everything ZooKeeper holds for the group; False if there was nothing."""
        self.forget(group_id)
        try:
            await self.zk.delete(ConsumerOffsetZNode.group_path(group_id), recursive=True)
        except NoNodeError:
            return False
        finally:
            self.forget(group_id)
        return True
