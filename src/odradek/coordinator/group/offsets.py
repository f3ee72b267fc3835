"""A group's committed offsets in memory: what each partition's last committed record says, the
commits still being written, and which offsets have expired (KIP-211).

The cache follows the log. A commit is appended to `__consumer_offsets` first; only when the
append is committed (acks=all) does `complete` put the value here, and only if its record lies
after the record that set the partition's current value (`appended_offset`), so that two commits
of one partition finishing in any order leave the later record's value: the last commit wins,
as it does when the partition is replayed from the log. A value imported from ZooKeeper or
replayed without an offset uses -1 there.

Expiry (KIP-211, Kafka 2.1+). An offset expires once `offsets.retention.minutes` has passed since
a base time that depends on the group:

| group                                     | base time                     | which offsets      |
|-------------------------------------------|-------------------------------|--------------------|
| has a protocol type and is Empty          | when it became Empty (or, if  | all                |
|                                           | unknown, the commit time)     |                    |
| "consumer" protocol, Stable, subscriptions| the commit time               | topics no member   |
| known                                     |                               | subscribes to      |
| no protocol type (only commits: a simple  | the commit time               | all                |
| consumer managing partitions itself)      |                               |                    |
| any other                                 | never expires                 |                    |

A commit written by OffsetCommit v1-v4 with an explicit retention carries its own expire
timestamp and expires then, whatever the group. A partition with a commit in flight never expires.

Nothing here does I/O or reads a clock. Event-loop thread only, like the group that owns it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]

NO_LEADER_EPOCH = -1


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """One committed offset as a client committed it (Kafka's OffsetAndMetadata)."""

    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = -1
    """Set only by OffsetCommit v1-v4 with a retention time: then the offset expires at it."""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    value: OffsetAndMetadata
    appended_offset: int
    """The log offset of the record that committed this value (-1: not from an append)."""


@dataclass(slots=True, eq=False)
class GroupOffsets:
    """The committed offsets of one group, and its commits in flight."""

    committed: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    pending: dict[TopicPartition, int] = field(default_factory=dict)
    """Per partition, the number of commits appended but not yet committed (or failed)."""
    in_flight: set[asyncio.Future[object]] = field(default_factory=set)
    """The writes of those commits, for readers that must see them settle first."""

    def __bool__(self) -> bool:
        """Does the group hold any offset, committed or in flight?"""
        return bool(self.committed) or bool(self.pending)

    def get(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        found = self.committed.get(partition)
        return found.value if found is not None else None

    def prepare(self, partitions: Iterable[TopicPartition]) -> None:
        """Commits of these partitions were appended and wait to be committed."""
        for partition in partitions:
            self.pending[partition] = self.pending.get(partition, 0) + 1

    def _settle(self, partition: TopicPartition) -> None:
        count = self.pending.get(partition, 0) - 1
        if count > 0:
            self.pending[partition] = count
        else:
            self.pending.pop(partition, None)

    def complete(
        self, partition: TopicPartition, value: OffsetAndMetadata, appended_offset: int
    ) -> None:
        """A commit's record is committed: it becomes the partition's value unless a later
        record already set one."""
        self._settle(partition)
        self.load(partition, value, appended_offset)

    def fail(self, partition: TopicPartition) -> None:
        """A commit's append failed: nothing changes but the pending count."""
        self._settle(partition)

    def load(
        self, partition: TopicPartition, value: OffsetAndMetadata, appended_offset: int
    ) -> None:
        """Set a value read from the log (or imported), keeping the later record's."""
        current = self.committed.get(partition)
        if current is None or appended_offset < 0 or appended_offset > current.appended_offset:
            self.committed[partition] = CommittedOffset(value, appended_offset)

    def remove(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Forget these partitions' offsets; returns those that had one."""
        return [p for p in partitions if self.committed.pop(p, None) is not None]

    def remove_all(self) -> list[TopicPartition]:
        removed = list(self.committed)
        self.committed.clear()
        return removed

    def expired(
        self,
        now_ms: int,
        retention_ms: int,
        base_timestamp: Callable[[CommittedOffset], int],
        subscribed_topics: frozenset[str] = frozenset(),
    ) -> list[TopicPartition]:
        """The partitions whose offsets expire now (see the module docstring for `base_timestamp`
        and `subscribed_topics`, which never expire)."""
        expired = []
        for partition, committed in self.committed.items():
            if partition[0] in subscribed_topics or partition in self.pending:
                continue
            expire_timestamp = committed.value.expire_timestamp
            if expire_timestamp >= 0:
                if now_ms >= expire_timestamp:
                    expired.append(partition)
            elif now_ms - base_timestamp(committed) >= retention_ms:
                expired.append(partition)
        return expired


def expired_offsets(
    offsets: GroupOffsets,
    *,
    protocol_type: str | None,
    is_empty: bool,
    is_stable: bool,
    state_timestamp_ms: int,
    subscribed_topics: frozenset[str] | None,
    now_ms: int,
    retention_ms: int,
) -> list[TopicPartition]:
    """KIP-211: the group's offsets that expire now (the table in the module docstring).

    `protocol_type` None (or "") is a group that only ever committed offsets; `state_timestamp_ms`
    is when the group entered its current state (-1 if unknown, as for groups stored by Kafka
    before 2.1); `subscribed_topics` is None when the members' subscriptions are unknown."""
    if protocol_type and is_empty:
        return offsets.expired(
            now_ms,
            retention_ms,
            lambda committed: (
                state_timestamp_ms if state_timestamp_ms >= 0 else committed.value.commit_timestamp
            ),
        )
    if protocol_type == "consumer" and is_stable and subscribed_topics is not None:
        return offsets.expired(
            now_ms, retention_ms, lambda c: c.value.commit_timestamp, subscribed_topics
        )
    if not protocol_type:
        return offsets.expired(now_ms, retention_ms, lambda c: c.value.commit_timestamp)
    return []
