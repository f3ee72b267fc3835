"""The console's view of ZooKeeper: one `ClusterSnapshot` at a time, refreshed while pages are read.

Every read of one level is issued before the first answer is awaited, and the partition state
znodes (one per partition: 10,000 on a big cluster) go through `ZkClient.get_many`, which above a
few hundred paths pipelines them over private sessions (`odradek.zk.bulk_read`): a snapshot of
10,000 partitions costs ZooKeeper about a tenth of a second of reads, and the console takes one at
most every `max_age_s` seconds, only while someone is looking (`ZkView.current`), never when idle.

Pages are served from the snapshot in hand: when it is older than `max_age_s`, one refresh starts
in the background and the page renders the previous one (a live page polls again a moment
later), so no page waits on ZooKeeper except the very first, and after an operator action
(`ZkView.refresh`, awaited). A failed refresh keeps the previous snapshot and records the error
for the page to show.

Concurrency: one event loop (uvicorn's); a snapshot's decoding and judging (what it read, turned
into rows) run in worker threads, so that pages are served meanwhile. The ZkClient session is the
console's own, started and closed by the app's lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from odradek.console.snapshot import (
    BrokerRow,
    ClusterSnapshot,
    PartitionChange,
    RawPartition,
    build_snapshot,
    diff_snapshots,
)
from odradek.zk.client import ZkClient
from odradek.zk.errors import InvalidZNodeDataError, ZkError
from odradek.zk.znodes import (
    BrokerIdsZNode,
    BrokerIdZNode,
    ClusterIdZNode,
    ControllerEpochZNode,
    ControllerZNode,
    DeleteTopicsZNode,
    IsrChangeNotificationZNode,
    TopicConfigZNode,
    TopicPartitionStateZNode,
    TopicsZNode,
    TopicZNode,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_AGE_S = 2.0
CHANGES_KEPT = 1000


def _endpoints(info: Any) -> tuple[str, ...]:
    return tuple(
        f"{e.listener_name}://{e.host}:{e.port}"
        + ("" if e.security_protocol == e.listener_name else f" ({e.security_protocol})")
        for e in info.endpoints
    )


# What `read_snapshot` does with what it read, in a worker thread: at 10,000 partitions the
# decoding and judging take the CPU for a few hundred ms (more on a loaded machine), which on the
# event loop would hold up every page request arriving meanwhile. In a thread the loop gets the
# interpreter back every switch interval (5 ms) and serves pages from the snapshot in hand.

RawTopics = dict[str, tuple[str | None, list[RawPartition]]]


def _decode_topics(
    topic_names: Sequence[str], assignments: Sequence[Any], config_reads: Sequence[Any]
) -> tuple[RawTopics, dict[str, dict[str, str]], list[tuple[str, int]]]:
    """Each topic's id and partitions (replicas, no state yet), its config overrides, and every
    partition's key, from the reads of its assignment and config znodes."""
    topics: RawTopics = {}
    configs: dict[str, dict[str, str]] = {}
    keys: list[tuple[str, int]] = []
    for name, got, config in zip(topic_names, assignments, config_reads, strict=True):
        if isinstance(got, ZkError):
            continue  # deleted between the reads
        try:
            assignment = TopicZNode.decode(name, got[0], got[1].version)
        except InvalidZNodeDataError as e:
            log.warning("skipping topic %s: %s", name, e)
            continue
        topics[name] = (
            assignment.topic_id,
            [
                RawPartition(p, a.replicas, a.adding_replicas, a.removing_replicas)
                for p, a in assignment.partitions.items()
            ],
        )
        keys.extend((name, p) for p in assignment.partitions)
        if not isinstance(config, ZkError):
            with contextlib.suppress(InvalidZNodeDataError):
                configs[name] = dict(TopicConfigZNode.decode(config[0], config[1].version).config)
    return topics, configs, keys


def _add_states(topics: RawTopics, keys: Sequence[tuple[str, int]], states: Sequence[Any]) -> None:
    """Each partition's leader, leader epoch and ISR from its state znode read, into `topics`."""
    by_key: dict[tuple[str, int], Any] = {}
    for key, got in zip(keys, states, strict=True):
        if isinstance(got, ZkError):
            continue  # no state yet: offline
        try:
            by_key[key] = TopicPartitionStateZNode.decode(got[0], got[1].version)
        except InvalidZNodeDataError:
            continue  # undecodable counts as offline, as `odradek cluster status` counts it
    for name, (_topic_id, raws) in topics.items():
        for index, raw in enumerate(raws):
            state = by_key.get((name, raw.partition))
            if state is not None:
                raws[index] = RawPartition(
                    raw.partition,
                    raw.replicas,
                    raw.adding_replicas,
                    raw.removing_replicas,
                    state.leader,
                    state.leader_epoch,
                    tuple(state.isr),
                )


async def read_snapshot(
    zk: ZkClient, known_broker_ids: Iterable[int] = (), default_min_insync_replicas: int = 1
) -> ClusterSnapshot:
    """Everything the pages show from ZooKeeper, read now (see the module docstring)."""
    started = time.perf_counter()
    (
        broker_ids,
        controller,
        epoch,
        topic_names,
        deleting,
        isr_changes,
        cluster,
    ) = await asyncio.gather(
        zk.children_or_empty(BrokerIdsZNode.path()),
        zk.get_or_none(ControllerZNode.path()),
        zk.get_or_none(ControllerEpochZNode.path()),
        zk.children_or_empty(TopicsZNode.path()),
        zk.children_or_empty(DeleteTopicsZNode.path()),
        zk.children_or_empty(IsrChangeNotificationZNode.path()),
        zk.get_or_none(ClusterIdZNode.path()),
    )
    ids = sorted(int(c) for c in broker_ids if c.isdigit())
    topic_names = sorted(topic_names)
    level2 = await zk.get_many(
        [BrokerIdZNode.path(i) for i in ids]
        + [TopicZNode.path(t) for t in topic_names]
        + [TopicConfigZNode.path(t) for t in topic_names]
    )
    registrations: dict[int, BrokerRow] = {}
    for broker_id, got in zip(ids, level2[: len(ids)], strict=True):
        if isinstance(got, ZkError):
            continue  # gone between the two reads: dead
        try:
            info = BrokerIdZNode.decode(broker_id, got[0], got[1].czxid)
        except InvalidZNodeDataError:
            registrations[broker_id] = BrokerRow(id=broker_id, alive=True)
            continue
        registrations[broker_id] = BrokerRow(
            id=broker_id,
            alive=True,
            rack=info.rack,
            listeners=_endpoints(info),
            broker_epoch=info.broker_epoch,
        )
    assignments = level2[len(ids) : len(ids) + len(topic_names)]
    config_reads = level2[len(ids) + len(topic_names) :]
    topics, configs, keys = await asyncio.to_thread(
        _decode_topics, topic_names, assignments, config_reads
    )
    states = await zk.get_many([TopicPartitionStateZNode.path(t, p) for t, p in keys])
    await asyncio.to_thread(_add_states, topics, keys, states)
    controller_id = (
        ControllerZNode.decode(controller[0], controller[1].version).broker_id
        if controller
        else None
    )
    controller_epoch = (
        ControllerEpochZNode.decode(epoch[0], epoch[1].version).epoch if epoch else None
    )
    cluster_id = None
    if cluster is not None:
        with contextlib.suppress(InvalidZNodeDataError):
            cluster_id = ClusterIdZNode.decode(cluster[0], cluster[1].version).id
    return await asyncio.to_thread(
        build_snapshot,
        registrations=registrations,
        known_broker_ids=known_broker_ids,
        controller_id=controller_id,
        controller_epoch=controller_epoch,
        topics=topics,
        topic_configs=configs,
        deleting=deleting,
        default_min_insync_replicas=default_min_insync_replicas,
        pending_isr_change_notifications=len(isr_changes),
        cluster_id=cluster_id,
        read_ms=(time.perf_counter() - started) * 1000,
    )


class ZkView:
    """The latest snapshot and its refreshes (see the module docstring). Loop-thread only."""

    def __init__(
        self,
        connect: str,
        known_broker_ids: Iterable[int] = (),
        max_age_s: float = DEFAULT_MAX_AGE_S,
        session_timeout_s: float = 10.0,
    ) -> None:
        self.connect = connect
        self.known_broker_ids = tuple(known_broker_ids)
        self.max_age_s = max_age_s
        self.default_min_insync_replicas = 1
        self.last_error: str | None = None
        self._zk = ZkClient(
            connect, session_timeout_s=session_timeout_s, connection_loss_retry_s=5.0
        )
        self._snapshot: ClusterSnapshot | None = None
        # Leader, epoch and ISR changes seen between consecutive snapshots, oldest first: the
        # history a watcher sees while the console is open (elections, ISR shrinks and growth).
        self.changes: deque[PartitionChange] = deque(maxlen=CHANGES_KEPT)
        self._refreshing: asyncio.Task[ClusterSnapshot] | None = None

    async def start(self, timeout: float = 15.0) -> None:
        await self._zk.start(timeout=timeout)

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(BaseException):
                await self._refreshing
        await self._zk.close()

    async def refresh(self) -> ClusterSnapshot:
        """A fresh snapshot, waited for (joins a refresh already under way)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._read())
        return await asyncio.shield(self._refreshing)

    async def current(self) -> ClusterSnapshot:
        """The snapshot in hand, starting a background refresh when it is stale; the first call
        waits for one."""
        snapshot = self._snapshot
        if snapshot is None:
            return await self.refresh()
        # On a big cluster, read at most a fifth of the time: a snapshot that took 400 ms is
        # refreshed at most every 2 s, whatever `max_age_s` says.
        max_age = max(self.max_age_s, 5 * snapshot.read_ms / 1000)
        if time.time() - snapshot.taken_at > max_age and (
            self._refreshing is None or self._refreshing.done()
        ):
            self._refreshing = asyncio.create_task(self._read())
        return snapshot

    async def _read(self) -> ClusterSnapshot:
        try:
            snapshot = await read_snapshot(
                self._zk, self.known_broker_ids, self.default_min_insync_replicas
            )
        except (ZkError, OSError) as e:
            self.last_error = f"ZooKeeper: {e}"
            log.warning("reading ZooKeeper failed: %s", e)
            if self._snapshot is None:
                raise
            return self._snapshot
        self.last_error = None
        if self._snapshot is not None:
            # In a thread too: it compares every partition.
            self.changes.extend(await asyncio.to_thread(diff_snapshots, self._snapshot, snapshot))
        self._snapshot = snapshot
        return snapshot

    async def leaders(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Each partition's leader as its state znode says now (-1 without one): for a page whose
        snapshot named a leader that has moved since (`leader_offsets.CurrentLeaders`). A partition
        whose znode could not be read or decoded is left out; a ZooKeeper failure leaves out all."""
        try:
            got = await self._zk.get_many(
                [TopicPartitionStateZNode.path(t, p) for t, p in partitions]
            )
        except (ZkError, OSError) as e:
            log.info("reading %d partitions' leaders failed: %s", len(partitions), e)
            return {}
        leaders: dict[tuple[str, int], int] = {}
        for key, answer in zip(partitions, got, strict=True):
            if isinstance(answer, ZkError):
                leaders[key] = -1  # no state znode: not created yet, or deleted
                continue
            with contextlib.suppress(InvalidZNodeDataError):
                leaders[key] = TopicPartitionStateZNode.decode(answer[0], answer[1].version).leader
        return leaders

    def recent_changes(self, topic: str | None = None, limit: int = 20) -> list[PartitionChange]:
        """The latest changes seen (of one topic, or all), newest first."""
        found = []
        for change in reversed(self.changes):
            if topic is None or change.topic == topic:
                found.append(change)
                if len(found) >= limit:
                    break
        return found
