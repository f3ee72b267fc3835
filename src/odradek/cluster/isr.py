"""The in-sync replica set as the leader sees it: committed, or with one change in flight.

A leader changes the ISR by writing the partition state znode conditionally on its version; until that
write returns, the change is *pending*. Kafka models this as a small tagged union, and so do we:

- `CommittedIsr(isr)`: what ZooKeeper holds.
- `PendingExpandIsr(isr, new_in_sync_replica)`: a follower caught up and is being added.
- `PendingShrinkIsr(isr, out_of_sync_replicas)`: followers fell behind and are being removed.

Two views of the set matter, and they differ only while a change is pending:

- `isr` — the committed set. `min.insync.replicas` is checked against it: a write must not be accepted
  on the strength of a replica ZooKeeper does not yet know to be in sync.
- `maximal_isr` — the committed set plus a replica being added (a shrink still counts the replicas
  being removed). The high watermark is the minimum log end offset over the *maximal* ISR: during an
  expansion the new member must already have the records before they count as committed (otherwise the
  HW could move past what the new ISR member holds once the expansion commits), and during a shrink
  the HW waits for the old members until ZooKeeper confirms they are out.

High watermark rule: HW = min(LEO of r for r in maximal_isr), never decreasing. It is re-evaluated when
(1) the leader appends (RF=1: HW follows the LEO at once), (2) a follower's fetch moves its LEO,
(3) an ISR change commits (a shrink can release the HW), (4) the partition becomes leader.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CommittedIsr:
    isr: frozenset[int]

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr

    @property
    def is_pending(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class PendingExpandIsr:
    isr: frozenset[int]
    new_in_sync_replica: int

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr | {self.new_in_sync_replica}

    @property
    def is_pending(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class PendingShrinkIsr:
    isr: frozenset[int]
    out_of_sync_replicas: frozenset[int]

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr

    @property
    def is_pending(self) -> bool:
        return True


IsrState = CommittedIsr | PendingExpandIsr | PendingShrinkIsr
