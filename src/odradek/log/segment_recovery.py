"""Recovering a log segment after an unclean shutdown: validate every batch, rebuild both indexes,
and cut the file after the last valid batch (a torn write, garbage, a flipped bit); and rebuilding
the indexes of trusted data.

`SegmentRecovery` is a base of `LogSegment` (segment.py); it works on the fields and helpers
`LogSegment` defines, declared below. The log's recovery (which segments, from which offset) is
`recovery.py`'s.

Concurrency: as `LogSegment`'s — owned by one `Log`, used from the broker's event loop thread.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from odradek.errors import CorruptRecordError
from odradek.log.index import OffsetIndex, TimeIndex
from odradek.log.leader_epoch import LeaderEpochCache
from odradek.protocol.record_batch import (
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    BatchHeader,
    validate_stored_batch,
)

logger = logging.getLogger(__name__)

RECOVERY_CHUNK_BYTES = 1024 * 1024
"""Bytes read per pread while validating a segment during recovery."""

_INT32_MAX = 2**31 - 1
_BATCH_LENGTH = struct.Struct(">i")


@dataclass(slots=True)
class _RecoveryState:
    """What `LogSegment.recover` carries from one chunk to the next."""

    expected_offset: int
    leader_epoch_cache: LeaderEpochCache | None
    problem: str | None = None
    previous_epoch: int = -1
    contiguous: bool = True
    """Each batch starts where the previous ended (no compaction); else only increasing."""


class SegmentRecovery:
    """Recovery and index rebuilding of a `LogSegment` (see the module docstring)."""

    # set by LogSegment.__init__
    base_offset: int
    log_path: Path
    offset_index: OffsetIndex
    time_index: TimeIndex
    size: int
    _dirty: bool
    _tail_loaded: bool
    _rolling_timestamp: int | None

    if TYPE_CHECKING:  # defined by LogSegment

        @property
        def fd(self) -> int: ...

        def read_at(self, position: int, length: int) -> bytes: ...

        def scan_headers(self, start: int = 0, end: int | None = None) -> Iterator[BatchHeader]: ...

        def _index_batch(self, header: BatchHeader, position: int) -> None: ...

        def _reset_tail_state(self) -> None: ...

    # -- recovery --------------------------------------------------------------------------------

    def recover(
        self,
        min_offset: int,
        leader_epoch_cache: LeaderEpochCache | None = None,
        *,
        contiguous: bool = True,
    ) -> int:
        """Validate every batch, rebuild both indexes and cut the file after the last valid batch.

        A batch is valid when its header is sane, its CRC matches, its offsets lie in this
        segment (>= `min_offset`, which is at least the base offset and the previous segment's
        end) and increase strictly. Everything from the first invalid or incomplete batch on is
        truncated (a torn write, garbage, a flipped bit). New leader epochs seen in the data are
        recorded in `leader_epoch_cache` in case its checkpoint file lagged behind. Returns the
        number of bytes truncated.
        """
        file_size = os.fstat(self.fd).st_size
        # Until the end, the tail state is being rebuilt: an error half way (EMFILE on an
        # index file) must leave it to be loaded again, not trusted half reset.
        self._tail_loaded = False
        self._reset_tail_state()
        self.offset_index.reset()
        self.time_index.reset()
        state = _RecoveryState(
            max(min_offset, self.base_offset), leader_epoch_cache, contiguous=contiguous
        )
        valid_end = 0
        while valid_end < file_size and state.problem is None:
            chunk = self.read_at(valid_end, min(RECOVERY_CHUNK_BYTES, file_size - valid_end))
            if len(chunk) >= HEADER_SIZE:
                batch_size = LOG_OVERHEAD + _BATCH_LENGTH.unpack_from(chunk, 8)[0]
                if len(chunk) < batch_size <= file_size - valid_end:
                    chunk = self.read_at(valid_end, batch_size)  # one batch larger than a chunk
            consumed = self._recover_chunk(chunk, valid_end, file_size, state)
            if consumed == 0 and state.problem is None:
                state.problem = "no complete batch"
            valid_end += consumed
        truncated = file_size - valid_end
        if truncated:
            logger.warning(
                "%s: truncating %d bytes at position %d: %s",
                self.log_path,
                truncated,
                valid_end,
                state.problem,
            )
            os.ftruncate(self.fd, valid_end)
            self._dirty = True
        self.size = valid_end
        self._tail_loaded = True
        return truncated

    def _recover_chunk(
        self, chunk: bytes, chunk_position: int, file_size: int, state: _RecoveryState
    ) -> int:
        """Validate and index the complete batches at the start of `chunk`; return the bytes
        they cover. Sets `state.problem` at the first invalid batch or at an incomplete tail."""
        in_chunk = 0
        available = len(chunk)
        while True:
            at_end_of_file = chunk_position + available == file_size
            if in_chunk + HEADER_SIZE > available:
                if at_end_of_file and in_chunk < available:
                    state.problem = f"{available - in_chunk} trailing bytes are not a batch"
                return in_chunk
            header = BatchHeader._make((*HEADER.unpack_from(chunk, in_chunk), in_chunk))
            if header.batch_length < MIN_BATCH_LENGTH:
                state.problem = f"batchLength {header.batch_length} is too small"
                return in_chunk
            if in_chunk + header.size > available:
                if at_end_of_file:
                    state.problem = "the last batch is incomplete"
                return in_chunk
            try:
                validate_stored_batch(chunk, header)
            except CorruptRecordError as e:
                state.problem = str(e)
                return in_chunk
            last_offset = header.base_offset + header.last_offset_delta
            # Neither the base offset nor the leader epoch is covered by the CRC, so a flipped
            # bit there passes validate_stored_batch. Odradek's logs are contiguous (leaders
            # assign consecutive offsets, a roll starts the new segment at the LEO, there is no
            # compaction), so each batch must start exactly where the previous one ended, and
            # epochs never go down along a log. Regression: test_torn_writes, a base offset
            # overwritten to 16777240 in the middle of a segment was taken for a gap.
            if (
                header.base_offset < state.expected_offset
                or (state.contiguous and header.base_offset != state.expected_offset)
                or last_offset - self.base_offset > _INT32_MAX
            ):
                state.problem = (
                    f"batch offsets {header.base_offset}..{last_offset} do not follow offset "
                    f"{state.expected_offset - 1} in a segment based at {self.base_offset}"
                )
                return in_chunk
            epoch = header.partition_leader_epoch
            if epoch < state.previous_epoch:
                state.problem = (
                    f"batch at offset {header.base_offset} has leader epoch {epoch}, below the "
                    f"previous batch's {state.previous_epoch}"
                )
                return in_chunk
            state.previous_epoch = epoch
            self._index_batch(header, chunk_position + in_chunk)
            if self._rolling_timestamp is None:
                self._rolling_timestamp = header.max_timestamp
            cache = state.leader_epoch_cache
            if cache is not None and epoch >= 0 and epoch > cache.latest_epoch:
                cache.assign(epoch, header.base_offset)
            state.expected_offset = last_offset + 1
            in_chunk += header.size

    def rebuild_indexes(self) -> None:
        """Recreate both indexes from the data (which is trusted: no CRC checks)."""
        self._tail_loaded = False  # as in `recover`
        self._reset_tail_state()
        self.offset_index.reset()
        self.time_index.reset()
        for header in self.scan_headers(0):
            self._index_batch(header, header.position)
        self._tail_loaded = True
