"""The leader epoch cache: which leader epoch started at which offset (KIP-101, KIP-279).

Each entry `(epoch, start_offset)` says "the leader of `epoch` appended its first batch at
`start_offset`". Entries are strictly increasing in both fields. A follower that becomes a follower
again asks the new leader, with OffsetForLeaderEpoch, where its latest epoch ended on the leader and
truncates there: truncating to the high watermark alone can lose acknowledged data or let replicas
diverge.

Persisted in the partition directory as `leader-epoch-checkpoint` in Kafka's checkpoint format
(see checkpoints.py)::

    0
    2
    0 0
    3 1500

i.e. version 0, two entries, epoch 0 from offset 0 and epoch 3 from offset 1500. The file is rewritten
atomically after every change; changes happen on leader elections, truncation and retention, never
per append, so the fsync cost is negligible.

Concurrency: not thread-safe; owned by one `Log` and called from the broker's event loop thread.
"""

from __future__ import annotations

import itertools
import logging
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import NamedTuple

from odradek.errors import KafkaStorageError
from odradek.log.checkpoints import read_checkpoint, write_checkpoint

logger = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


def _parse_epoch_entry(fields: list[str]) -> EpochEntry:
    if len(fields) != 2:
        raise ValueError("expected '<epoch> <start offset>'")
    entry = EpochEntry(int(fields[0]), int(fields[1]))
    if entry.epoch < 0 or entry.start_offset < 0:
        raise ValueError("negative epoch or offset")
    return entry


class LeaderEpochCache:
    """Leader epoch -> start offset history of one partition, backed by its checkpoint file.

    Not thread-safe: owned by one `Log`; called from the broker's event loop thread (the
    partition on leader changes, the log on appends, truncation and retention, request handlers
    for OffsetForLeaderEpoch).
    """

    def __init__(self, path: Path, *, exists: bool = True) -> None:
        """Reads the checkpoint at `path` unless the caller knows there is none (`exists`)."""
        self.path = path
        self._epochs: list[int] = []
        self._start_offsets: list[int] = []
        self._unsynced = False
        entries = read_checkpoint(path, _parse_epoch_entry) if exists else []
        for previous, entry in itertools.pairwise(entries):
            # Both columns increase in every file this cache writes: anything else is damage
            # (regression: test_torn_writes, a leader-epoch-checkpoint whose last line was cut
            # to "3 1" read as epoch 3 starting at offset 1 and dropped epoch 2).
            if entry.epoch <= previous.epoch or entry.start_offset <= previous.start_offset:
                raise KafkaStorageError(
                    f"malformed checkpoint file {path}: entry {entry} does not follow {previous}"
                )
        for entry in entries:
            self._assign(entry.epoch, entry.start_offset)

    # -- queries -------------------------------------------------------------------------------

    @property
    def latest_epoch(self) -> int:
        """The newest epoch with data, or -1 (UNDEFINED_EPOCH) when the cache is empty."""
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    @property
    def latest_entry(self) -> EpochEntry | None:
        if not self._epochs:
            return None
        return EpochEntry(self._epochs[-1], self._start_offsets[-1])

    @property
    def earliest_entry(self) -> EpochEntry | None:
        if not self._epochs:
            return None
        return EpochEntry(self._epochs[0], self._start_offsets[0])

    def epoch_entries(self) -> list[EpochEntry]:
        return [EpochEntry(e, o) for e, o in zip(self._epochs, self._start_offsets, strict=True)]

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch whose range holds `offset`, or -1 if it precedes every entry."""
        index = bisect_right(self._start_offsets, offset) - 1
        return self._epochs[index] if index >= 0 else UNDEFINED_EPOCH

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest epoch <= requested, where that epoch ended).

        - requested == the latest epoch: (requested, log_end_offset), the epoch is still open;
        - between two entries: (largest epoch <= requested, start offset of the next higher
          epoch);
        - below the first entry: (requested, start offset of the first entry). Kafka answers
          this way (rather than "unknown") so that a follower whose history was removed by
          retention truncates to the leader's oldest known epoch boundary;
        - above the latest epoch, -1, or an empty cache: (-1, -1), unknown.
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self._epochs[-1]:
            return requested_epoch, log_end_offset
        higher = bisect_right(self._epochs, requested_epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, self._start_offsets[0]
        return self._epochs[higher - 1], self._start_offsets[higher]

    # -- updates -------------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`; return whether the cache changed.

        Entries that would not extend the history are ignored: an epoch older than the latest
        (a stale leader), or the latest epoch again at the same or a later offset (every
        append of a leader calls this). Kafka's two corrections are kept: the latest epoch at a
        lower offset moves its start back, and a newer epoch starting at or below existing
        entries' start offsets removes those entries first, so both columns stay increasing.
        """
        if epoch < 0 or start_offset < 0:
            raise KafkaStorageError(
                f"invalid leader epoch entry (epoch {epoch}, start offset {start_offset})"
            )
        latest = self.latest_entry
        if latest is not None:
            if epoch < latest.epoch:
                logger.warning(
                    "%s: ignoring stale leader epoch %d at offset %d (latest is %s)",
                    self.path,
                    epoch,
                    start_offset,
                    latest,
                )
                return False
            if epoch == latest.epoch and start_offset >= latest.start_offset:
                return False
        self._assign(epoch, start_offset)
        self._flush()
        return True

    def _assign(self, epoch: int, start_offset: int) -> None:
        removed = []
        while self._epochs and (
            self._epochs[-1] >= epoch or self._start_offsets[-1] >= start_offset
        ):
            removed.append(EpochEntry(self._epochs.pop(), self._start_offsets.pop()))
        if len(removed) > 1 or (removed and removed[0].start_offset != start_offset):
            logger.warning(
                "%s: new epoch entry (%d, %d) replaced conflicting entries %s",
                self.path,
                epoch,
                start_offset,
                removed,
            )
        self._epochs.append(epoch)
        self._start_offsets.append(start_offset)

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after `end_offset` (the log was truncated there)."""
        if end_offset < 0 or not self._start_offsets or self._start_offsets[-1] < end_offset:
            return
        keep = bisect_left(self._start_offsets, end_offset)
        del self._epochs[keep:]
        del self._start_offsets[keep:]
        self._flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget history before `start_offset` (retention moved the log start).

        The epoch in force at `start_offset` is kept with its start moved up to `start_offset`,
        so the cache still answers for every offset that remains in the log.
        """
        if not self._start_offsets or self._start_offsets[0] > start_offset:
            return
        in_force = bisect_right(self._start_offsets, start_offset) - 1
        epoch = self._epochs[in_force]
        if in_force == 0 and self._start_offsets[0] == start_offset:
            return
        del self._epochs[: in_force + 1]
        del self._start_offsets[: in_force + 1]
        self._epochs.insert(0, epoch)
        self._start_offsets.insert(0, start_offset)
        self._flush()

    def clear_and_flush(self) -> None:
        self._epochs.clear()
        self._start_offsets.clear()
        self._flush()

    def _flush(self) -> None:
        # Written lazily: `sync` writes the file, and the log calls it before it advances its
        # recovery point and when it closes. Every batch carries its leader epoch, so after a crash
        # recovery re-records the epochs of everything past the recovery point from the data (see
        # Log.open); an epoch with no data yet needs no entry to survive a crash. Writing here cost
        # a file replacement (and two disk syncs) per partition on every leadership change.
        self._unsynced = True

    def sync(self) -> None:
        """Make the checkpoint durable. The log calls this before it advances its recovery point,
        so that recovery never starts past data whose epoch history could be lost."""
        if self._unsynced:
            # The file's data is synced; its directory entry is not (one directory fsync per
            # partition made a broker with 10,000 partitions take 20 s to shut down). The rename
            # becomes durable with the next journal commit of the file system, at the latest when
            # the recovery-point checkpoint (written after this, with its directory fsynced) or
            # the clean-shutdown marker is: ext4 and XFS commit metadata changes in order.
            write_checkpoint(
                self.path,
                (f"{e} {o}\n" for e, o in zip(self._epochs, self._start_offsets, strict=True)),
                sync_dir=False,
            )
            self._unsynced = False
