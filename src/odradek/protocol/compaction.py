"""The log cleaner's work on bytes: an offset map of keys, and batches filtered through it.

Sans-I/O: buffers of record batches in, buffers of record batches out; the log cleaner
(`odradek.log.cleaner`) reads segments into these functions and writes what they return. The
per-record work is native (`_compaction.c`, whose comment states the retention rules and the delete
horizon); this module adds what the native code cannot do, compressed batches, whose codecs live
in Python's cramjam:

* `map_buffer(map, buffer, start_offset, ...)` adds the keys of every record at or after
  `start_offset` to the `OffsetMap`, decompressing compressed batches on the way;
* `filter_buffer(map, buffer, out, ...)` writes the batches of `buffer` into `out` with only the
  records to keep, adding each batch written to an `IndexBuilder`. A compressed batch that loses
  records (or gets its delete horizon) is decompressed, filtered natively and compressed again
  with its own codec (snappy in xerial framing and lz4 frames with independent blocks, as Kafka's
  Java producer writes them).

Both stop at the end of the complete batches in `buffer` and say how many bytes they consumed, so
the caller reads on from there; `needed` tells how large a buffer the next batch requires when
not even one batch fitted.

Batch decisions (`decisions`): the hook for transactions (see `BatchDecisions`).

Concurrency: an `OffsetMap` and an `IndexBuilder` are used by one thread at a time (the native code
refuses a second one with RuntimeError). Every function releases the GIL for its native work;
decompression and compression (cramjam) release it too.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from odradek.errors import CorruptRecordError
from odradek.protocol import _compaction
from odradek.protocol.compression import compress, decompress
from odradek.protocol.record_batch import (
    HEADER_SIZE,
    BatchHeader,
    TimestampType,
    read_header,
)

OffsetMap = _compaction.OffsetMap
IndexBuilder = _compaction.IndexBuilder

RETAIN_EMPTY = _compaction.RETAIN_EMPTY
"""Keep the batch (as a header without records) even when none of its records stays: Kafka keeps
the last batch of each live producer so that its sequence numbers survive."""
DISCARD_RECORDS = _compaction.DISCARD_RECORDS
"""Remove every record of the batch: aborted transactional data, a marker that may go."""
SET_HORIZON = _compaction.SET_HORIZON
"""Give the batch a delete horizon though it has no tombstone (a marker of an empty transaction)."""

DELETE_HORIZON_BIT = 0x40
"""Attribute bit 6: baseTimestamp holds the batch's delete horizon (KIP-534)."""

SLOT_SIZE = _compaction.SLOT_SIZE
"""Bytes per offset map slot: a 16-byte key digest and an 8-byte offset."""

_COMPRESSION_MASK = 0x07
_PAIR = struct.Struct("=qq")


class BatchDecisions:
    """Per-batch actions, by batch base offset, handed to the native passes as sorted pairs.

    Compaction alone needs none. Transactions (issue 18) will fill it from batch headers and the
    transaction index before cleaning a segment: RETAIN_EMPTY for the last batch of each live
    producer, DISCARD_RECORDS for aborted data and removable markers, SET_HORIZON for a marker
    of an empty transaction.
    """

    def __init__(self, actions: Iterable[tuple[int, int]] = ()) -> None:
        self._actions = dict(actions)
        self._packed: bytes | None = None

    def set(self, base_offset: int, action: int) -> None:
        self._actions[base_offset] = self._actions.get(base_offset, 0) | action
        self._packed = None

    def get(self, base_offset: int) -> int:
        return self._actions.get(base_offset, 0)

    def __bool__(self) -> bool:
        return bool(self._actions)

    def packed(self) -> bytes | None:
        """The native form (None when there are no decisions)."""
        if not self._actions:
            return None
        if self._packed is None:
            self._packed = b"".join(_PAIR.pack(*item) for item in sorted(self._actions.items()))
        return self._packed


@dataclass(slots=True)
class PassResult:
    """What a pass over a buffer did."""

    consumed: int
    """Bytes of whole batches handled from the start of the buffer."""
    records_read: int
    needed: int
    """When nothing more could be consumed: the bytes the next batch needs (a buffer at least
    that large must be offered)."""
    map_full: bool = False
    """map_buffer: the map filled up; `consumed` stops in the batch where it did."""
    output_full: bool = False
    """filter_buffer: `out` has no room for the next batch: write it out and call again."""
    written: int = 0
    """filter_buffer: the end of the data in `out`."""
    records_kept: int = 0
    tombstones_kept: int = 0
    """filter_buffer: tombstones among the records kept (they go at a later cleaning)."""


def _corrupt(error: Exception, where: str) -> CorruptRecordError:
    message = error.args[0] if error.args else str(error)
    return CorruptRecordError(f"{where}: {message}")


def map_buffer(
    offset_map: OffsetMap,
    buffer: bytes | bytearray | memoryview,
    start_offset: int,
    decompressed_limit: int,
    decisions: BatchDecisions | None = None,
) -> PassResult:
    """Add the keys of the batches in `buffer` to `offset_map` (module docstring)."""
    view = memoryview(buffer)
    packed = decisions.packed() if decisions else None
    consumed = records = 0
    try:
        while True:
            done, status, read, needed = _compaction.map_batches(
                offset_map, view[consumed:], start_offset, packed
            )
            consumed += done
            records += read
            if status == _compaction.PASS_MAP_FULL:
                return PassResult(consumed, records, 0, map_full=True)
            if status != _compaction.PASS_COMPRESSED:
                return PassResult(consumed, records, needed)
            header = read_header(view, consumed)
            section = _decompress(view, consumed, header, decompressed_limit)
            full = _compaction.map_records(
                offset_map,
                section,
                header.records_count,
                header.base_offset,
                header.base_timestamp,
                start_offset,
                header.last_offset,
            )
            records += header.records_count
            if full:
                return PassResult(consumed, records, 0, map_full=True)
            consumed += header.size
    except _compaction.InvalidRecordsError as e:
        raise _corrupt(e, "cannot map the keys of a batch") from None
    finally:
        view.release()


def filter_buffer(
    offset_map: OffsetMap,
    buffer: bytes | bytearray | memoryview,
    out: bytearray,
    out_offset: int,
    builder: IndexBuilder,
    now_ms: int,
    delete_retention_ms: int,
    decompressed_limit: int,
    decisions: BatchDecisions | None = None,
) -> PassResult:
    """Write the batches of `buffer` into `out` from `out_offset`, keeping what the cleaner keeps
    (module docstring)."""
    view = memoryview(buffer)
    packed = decisions.packed() if decisions else None
    horizon_ms = now_ms + delete_retention_ms
    consumed = records = kept = tombstones = 0
    written = out_offset
    try:
        while True:
            done, written, status, read, kept_now, tombstones_now, needed = (
                _compaction.filter_batches(
                    offset_map,
                    view[consumed:],
                    out,
                    written,
                    now_ms,
                    horizon_ms,
                    packed,
                    builder,
                )
            )
            consumed += done
            records += read
            kept += kept_now
            tombstones += tombstones_now
            if status != _compaction.PASS_COMPRESSED:
                return PassResult(
                    consumed,
                    records,
                    needed,
                    output_full=status == _compaction.PASS_OUTPUT_FULL,
                    written=written,
                    records_kept=kept,
                    tombstones_kept=tombstones,
                )
            header = read_header(view, consumed)
            action = decisions.get(header.base_offset) if decisions else 0
            batch, batch_tombstones = _filter_compressed(
                offset_map, view, consumed, header, now_ms, horizon_ms, action, decompressed_limit
            )
            if batch is not None:
                if len(batch) > len(out) - written:
                    return PassResult(
                        consumed,
                        records,
                        len(batch),
                        output_full=True,
                        written=written,
                        records_kept=kept,
                        tombstones_kept=tombstones,
                    )
                tombstones += batch_tombstones
                out[written : written + len(batch)] = batch
                written += len(batch)
                batch_header = read_header(batch)
                kept += batch_header.records_count
                builder.add(batch_header.last_offset, len(batch), batch_header.max_timestamp)
            records += header.records_count
            consumed += header.size
    except _compaction.InvalidRecordsError as e:
        raise _corrupt(e, "cannot filter a batch") from None
    finally:
        view.release()


def _decompress(view: memoryview, position: int, header: BatchHeader, limit: int) -> bytes:
    payload = view[position + HEADER_SIZE : position + header.size]
    try:
        return decompress(header.compression, payload, limit)
    finally:
        payload.release()


def _filter_compressed(
    offset_map: OffsetMap,
    view: memoryview,
    position: int,
    header: BatchHeader,
    now_ms: int,
    horizon_ms: int,
    action: int,
    limit: int,
) -> tuple[bytes | bytearray | None, int]:
    """The batch at `position` as it must be written (the same bytes when it keeps every record),
    or None when it goes; and how many tombstones it keeps."""
    section = _decompress(view, position, header, limit)
    kept, max_timestamp, set_horizon, records, tombstones = _compaction.filter_records(
        offset_map,
        section,
        header.records_count,
        header.base_offset,
        header.base_timestamp,
        header.attributes,
        now_ms,
        horizon_ms,
        action,
    )
    original = view[position : position + header.size]
    if records is None:
        return bytes(original), tombstones
    if kept == 0:
        if not action & RETAIN_EMPTY:
            return None, 0
        batch = bytearray(original[:HEADER_SIZE])
        _compaction.finish_batch(
            batch,
            header.attributes & ~(_COMPRESSION_MASK | DELETE_HORIZON_BIT),
            header.max_timestamp,
            header.max_timestamp,
            0,
        )
        return batch, 0
    batch = bytearray(original[:HEADER_SIZE])
    batch += compress(header.compression, records)
    log_append_time = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    _compaction.finish_batch(
        batch,
        header.attributes | (DELETE_HORIZON_BIT if set_horizon else 0),
        horizon_ms if set_horizon else header.base_timestamp,
        header.max_timestamp if log_append_time else max_timestamp,
        kept,
    )
    return batch, tombstones


def delete_horizon(header: BatchHeader) -> int | None:
    """The batch's delete horizon (KIP-534), or None when it has none."""
    return header.base_timestamp if header.attributes & DELETE_HORIZON_BIT else None
