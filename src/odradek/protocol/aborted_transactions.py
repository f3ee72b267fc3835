"""Kafka's read_committed consumer rule for aborted transactions, shared by every reader here
that turns Fetch responses into records (the Spark decoder and the console's record browser).

A Fetch response at READ_COMMITTED lists, per partition, the aborted transactions that overlap
the returned range as (producer id, first offset) pairs. A reader drops a transactional batch of
producer P from the first offset of P's aborted transaction up to and including P's abort marker
(Kafka's `Fetcher`/`CompletedFetch` keeps the same heap ordered by first offset).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from odradek.protocol.record_batch import BatchHeader


class AbortedTransactions:
    """The aborted transactions a reader has been told about and not yet passed."""

    def __init__(self) -> None:
        self._pending: list[tuple[int, int]] = []  # (first offset, producer id), a heap
        self._aborting: set[int] = set()

    def add(self, aborted: Iterable[tuple[int, int]]) -> None:
        """(producer id, first offset) pairs from a Fetch response."""
        for producer_id, first_offset in aborted:
            heapq.heappush(self._pending, (first_offset, producer_id))

    def skip(self, header: BatchHeader) -> bool:
        """Whether the transactional batch `header` belongs to an aborted transaction. The abort
        marker that ends one is skipped too, and ends it."""
        while self._pending and self._pending[0][0] <= header.last_offset:
            self._aborting.add(heapq.heappop(self._pending)[1])
        if header.producer_id not in self._aborting:
            return False
        if header.is_control:
            self._aborting.discard(header.producer_id)
        return True
