"""The recent state-change log entries of this broker's controller, kept in memory per partition.

The state-change log (`states.StateChangeLogger`, `state-change.log`) is a file on the controller's
machine; a console watching a remote cluster cannot read it. So the logger also records each entry
here, as data, and the broker serves a partition's entries as JSON (`/state-changes` on its metrics
listener). Every broker that has been controller keeps what it logged while it was; merging the
brokers' answers gives the partition's history across controller failovers (for as long as the
brokers stay up: nothing here survives a restart).

Bounded two ways: at most `per_partition` entries per partition (the oldest go first), and at most
`max_total` entries over all partitions, evicting whole partitions, the one least recently
written first (a failover of 10,000 partitions keeps the newest ones' histories).

Concurrency: `record` is called by the controller's event task and `entries` by the metrics
endpoint's snapshot, both on the broker's event loop thread; nothing else may touch it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

PER_PARTITION = 64
# About 200 bytes an entry (measured with tracemalloc, 4 entries per partition): ~10 MB at most.
MAX_TOTAL = 50_000


class StateChangeEntry(NamedTuple):
    """One state-change log line as data. `replica` is None for a partition's own transition;
    `leader`, `leader_epoch` and `isr` are set when the transition elected or re-sent a leader.
    (Refused transitions, logged at ERROR, are only in the file.) A named tuple, not a frozen
    dataclass: a failover records one per replica, 300,000 for 100,000 partitions of RF 3, and a
    frozen dataclass's eleven guarded attribute writes made it ~4x dearer to build."""

    time_ms: int
    controller_id: int
    controller_epoch: int
    topic: str
    partition: int
    replica: int | None
    from_state: str
    to_state: str
    leader: int | None = None
    leader_epoch: int | None = None
    isr: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "time_ms": self.time_ms,
            "controller_id": self.controller_id,
            "controller_epoch": self.controller_epoch,
            "topic": self.topic,
            "partition": self.partition,
            "replica": self.replica,
            "from_state": self.from_state,
            "to_state": self.to_state,
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "isr": list(self.isr) if self.isr is not None else None,
        }


class StateChangeHistory:
    """Per-partition rings of `StateChangeEntry`, bounded in total (see the module docstring)."""

    def __init__(self, per_partition: int = PER_PARTITION, max_total: int = MAX_TOTAL) -> None:
        if per_partition < 1 or max_total < per_partition:
            raise ValueError("need 1 <= per_partition <= max_total")
        self.per_partition = per_partition
        self.max_total = max_total
        # Lists, not deques: a deque costs ~600 bytes even when nearly empty, and most
        # partitions hold a handful of entries.
        self._rings: OrderedDict[tuple[str, int], list[StateChangeEntry]] = OrderedDict()
        self._total = 0

    def __len__(self) -> int:
        return self._total

    def record(
        self,
        controller_id: int,
        controller_epoch: int,
        topic: str,
        partition: int,
        replica: int | None,
        from_state: object,
        to_state: object,
        *,
        leader: int | None = None,
        leader_epoch: int | None = None,
        isr: Sequence[int] | None = None,
    ) -> None:
        key = (topic, partition)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = []
        else:
            self._rings.move_to_end(key)
        if len(ring) >= self.per_partition:
            del ring[0]  # at most per_partition pointers moved
        else:
            self._total += 1
        ring.append(
            StateChangeEntry(
                int(time.time() * 1000),
                controller_id,
                controller_epoch,
                topic,
                partition,
                replica,
                str(from_state),
                str(to_state),
                leader,
                leader_epoch,
                tuple(isr) if isr is not None else None,
            )
        )
        while self._total > self.max_total:
            _, evicted = self._rings.popitem(last=False)
            self._total -= len(evicted)

    def entries(self, topic: str, partition: int) -> list[StateChangeEntry]:
        """The partition's entries, oldest first (a copy)."""
        ring = self._rings.get((topic, partition))
        return ring.copy() if ring is not None else []
