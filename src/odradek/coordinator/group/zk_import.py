"""The upgrade path: offsets that earlier Odradek versions stored in ZooKeeper, imported once into
`__consumer_offsets`.

Before offsets moved to the offsets topic, Odradek kept each committed offset in a znode
`/consumers/<group>/offsets/<topic>/<partition>` (`zk_offsets`). The import is part of loading an
offsets partition (`GroupMetadataManager._import_legacy`), so whichever broker first leads a
group's partition after the upgrade imports the group, and nothing else has to run:

1. list `/consumers` (at most once per `LISTING_TTL_S`, however many partitions load at once)
   and keep the groups placed in the partition being loaded;
2. skip a group whose `/consumers/<group>/imported` marker exists: it was imported before;
3. read every offset znode of the others (all reads in flight at once);
4. the manager appends, for each of those offsets that the partition's log has no commit for,
   an offset commit (acks=all, timestamped with the import) — a commit in the log is newer than
   anything in ZooKeeper, since only the new coordinator writes the log; then
5. creates the group's marker (`{"version":1,"topic":"__consumer_offsets","partition":P,
   "timestamp":ms}`), only after the append is committed.

Crash safety: a broker that dies between 4 and 5 leaves no marker, and the next leader imports the
group again, skipping the partitions the log now holds; a ZooKeeper error during 1-3 fails the load,
which is retried (the partition answers COORDINATOR_LOAD_IN_PROGRESS meanwhile), so a group's
offsets are never served without its ZooKeeper offsets. The znodes themselves are left in place
(an operator can delete `/consumers` once every group is marked), so a rollback to the earlier
version finds them as they were at the upgrade.

Concurrency: event-loop thread only; ZooKeeper calls are awaited.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from odradek.coordinator.group.placement import OFFSETS_TOPIC
from odradek.coordinator.group.zk_offsets import (
    CONSUMERS_PATH,
    ConsumerOffsetZNode,
    group_id_from_znode_name,
)
from odradek.zk.client import ZkClient
from odradek.zk.errors import InvalidZNodeDataError, NodeExistsError, NoNodeError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

IMPORTED_MARKER = "imported"
LISTING_TTL_S = 30.0


def imported_marker_path(group_id: str) -> str:
    return f"{ConsumerOffsetZNode.group_path(group_id)}/{IMPORTED_MARKER}"


class ZkLegacyOffsets:
    """`metadata_manager.LegacyOffsets` over ZooKeeper (module docstring)."""

    def __init__(self, zk: ZkClient, clock: Callable[[], float] = time.monotonic) -> None:
        self.zk = zk
        self._clock = clock
        self._listing: tuple[float, asyncio.Task[list[str]]] | None = None

    async def _groups(self) -> list[str]:
        """The group ids under /consumers; partitions loading together share one listing."""
        now = self._clock()
        if (
            self._listing is None
            or now - self._listing[0] >= LISTING_TTL_S
            or (self._listing[1].done() and self._listing[1].exception() is not None)
        ):
            self._listing = (now, asyncio.get_running_loop().create_task(self._list()))
        return await asyncio.shield(self._listing[1])

    async def _list(self) -> list[str]:
        try:
            names = await self.zk.get_children(CONSUMERS_PATH)
        except NoNodeError:
            names = []
        return [group_id_from_znode_name(name) for name in names]

    async def unimported_offsets(
        self, partition: int, partition_of: Callable[[str], int]
    ) -> dict[str, dict[TopicPartition, int]]:
        """The ZooKeeper offsets of the not yet imported groups placed in `partition`."""
        groups = [g for g in await self._groups() if partition_of(g) == partition]
        found = await asyncio.gather(*(self._unimported(g) for g in groups))
        return {g: offsets for g, offsets in zip(groups, found, strict=True) if offsets is not None}

    async def _unimported(self, group_id: str) -> dict[TopicPartition, int] | None:
        try:
            children = await self.zk.get_children(ConsumerOffsetZNode.group_path(group_id))
        except NoNodeError:
            return None
        if IMPORTED_MARKER in children:
            return None
        return await self._read_offsets(group_id) if "offsets" in children else {}

    async def _read_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        try:
            topics = await self.zk.get_children(ConsumerOffsetZNode.offsets_path(group_id))
        except NoNodeError:
            return {}
        listed = await asyncio.gather(
            *(
                self.zk.children_or_empty(ConsumerOffsetZNode.topic_path(group_id, t))
                for t in topics
            )
        )
        paths = [
            ((topic, int(name)), ConsumerOffsetZNode.path(group_id, topic, int(name)))
            for topic, names in zip(topics, listed, strict=True)
            for name in names
            if name.isdigit()
        ]
        values = await asyncio.gather(
            *(self.zk.get(path) for _, path in paths), return_exceptions=True
        )
        offsets: dict[TopicPartition, int] = {}
        for (partition, path), value in zip(paths, values, strict=True):
            if isinstance(value, NoNodeError):
                continue
            if isinstance(value, BaseException):
                raise value
            try:
                offsets[partition] = ConsumerOffsetZNode.decode(value[0], path)
            except InvalidZNodeDataError as e:
                log.warning("not importing an offset of group %s: %s", group_id, e)
        return offsets

    async def mark_imported(self, group_id: str, partition: int) -> None:
        data = json.dumps(
            {
                "version": 1,
                "topic": OFFSETS_TOPIC,
                "partition": partition,
                "timestamp": int(time.time() * 1000),
            }
        ).encode()
        try:
            await self.zk.create(imported_marker_path(group_id), data, makepath=True)
        except NodeExistsError:
            pass
