"""An in-memory `__consumer_offsets` for the group metadata manager (`metadata_manager.OffsetsLog`).

`FakeOffsetsLog` keeps each partition's batches as the replica manager would: the append assigns
the partition's next offsets (patching the batch's base offset, as a leader does) and reads return
whole batches from the one holding the offset asked for. Appends answer at once, or, while
`hold()` is on, return a future that `release()` completes (in any order a test chooses): that is
how a test makes two commits finish out of order. `fail_with(code)` makes the next appends fail.

Stricter than production: an append or read of a partition the test marked `gone` raises
NOT_LEADER_OR_FOLLOWER, the way the real log refuses once leadership moved; and every batch must
be a valid v2 batch whose record count matches its offsets.

Concurrency: single-threaded (a test's event loop).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from odradek.coordinator.group.metadata_manager import AppendResult
from odradek.errors import NotLeaderOrFollowerError
from odradek.protocol.record_batch import iter_batches

_INT64 = struct.Struct(">q")


@dataclass
class _Held:
    partition: int
    batch: bytes
    future: asyncio.Future[AppendResult]


@dataclass
class FakeOffsetsLog:
    batches: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    start: dict[int, int] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)
    held: list[_Held] = field(default_factory=list)
    appends: int = 0
    _hold: bool = False
    _fail: ErrorCode | None = None

    def end(self, partition: int) -> int:
        entries = self.batches.get(partition, [])
        if not entries:
            return self.start.get(partition, 0)
        base, data = entries[-1]
        (header,) = iter_batches(data)
        return base + header.last_offset_delta + 1

    def _write(self, partition: int, batch: bytes) -> int:
        headers = list(iter_batches(batch))
        if len(headers) != 1 or headers[0].records_count != headers[0].last_offset_delta + 1:
            raise AssertionError("the coordinator must append exactly one well-formed batch")
        base = self.end(partition)
        data = bytearray(batch)
        _INT64.pack_into(data, 0, base)
        self.batches.setdefault(partition, []).append((base, bytes(data)))
        return base

    # -- OffsetsLog --------------------------------------------------------------------------

    def append(
        self, partition: int, records: bytes, required_acks: int, timeout_ms: int
    ) -> AppendResult | asyncio.Future[AppendResult]:
        self.appends += 1
        if partition in self.gone:
            raise NotLeaderOrFollowerError(f"partition {partition} moved")
        if self._fail is not None:
            return AppendResult(self._fail)
        if self._hold:
            future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
            # The append happens now, as in the replica manager; only the acks wait.
            base = self._write(partition, records)
            self.held.append(_Held(partition, records, future))
            future.base = base  # type: ignore[attr-defined]
            return future
        return AppendResult(ErrorCode.none, self._write(partition, records))

    def read(self, partition: int, offset: int, max_bytes: int) -> bytes:
        if partition in self.gone:
            raise NotLeaderOrFollowerError(f"partition {partition} moved")
        out = bytearray()
        for base, data in self.batches.get(partition, []):
            (header,) = iter_batches(data)
            if base + header.last_offset_delta < offset:
                continue
            if out and len(out) + len(data) > max_bytes:
                break
            out += data
        return bytes(out)

    def log_start_offset(self, partition: int) -> int:
        return self.start.get(partition, 0)

    def log_end_offset(self, partition: int) -> int:
        return self.end(partition)

    # -- test controls -----------------------------------------------------------------------

    def hold(self) -> None:
        self._hold = True

    def release(self, index: int = 0, error: ErrorCode = ErrorCode.none) -> None:
        """Complete the held append number `index` (0: the oldest still held)."""
        held = self.held.pop(index)
        base = held.future.base  # type: ignore[attr-defined]
        held.future.set_result(AppendResult(error, base if error is ErrorCode.none else -1))

    def fail_with(self, code: ErrorCode | None) -> None:
        self._fail = code
