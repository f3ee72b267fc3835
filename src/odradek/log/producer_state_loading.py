"""Rebuilding a log's producer state from its snapshots and batch headers (Kafka's
`UnifiedLog.rebuildProducerState` and `loadProducersFromRecords`).

When a log is opened, and after a follower truncates it, the state must describe every batch below
the log end offset:

1. snapshots above the log end or at/below the log start are deleted; unless the state is already
   at the log end, it is reset and loaded from the newest remaining snapshot (expired producers
   skipped), or started empty at the log start when there is none;
2. the batches from the snapshot's offset to the log end are replayed as a follower applies them
   (origin REPLICATION: no sequence checks), reading only their headers -- and the one record of
   each control batch of a producer;
3. a snapshot is written at the log end, so that the next start replays nothing.

A log opened after a clean shutdown without any snapshot (written by a broker that predates
producer state, or holding no producer data) is not scanned: as Kafka does, empty snapshots are
taken at the base offsets of its last two segments and at the log end. After an unclean shutdown
without snapshots, the whole log is replayed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from odradek.log.producer_state import (
    AppendOrigin,
    CompletedTxn,
    EndTransactionMarker,
    ProducerStateManager,
    read_end_txn_marker,
)
from odradek.log.segment import LogSegment
from odradek.protocol.record_batch import BatchHeader, read_header

log = logging.getLogger(__name__)

Marker = tuple[EndTransactionMarker, int] | None
OnCompleted = Callable[[list[CompletedTxn]], None]
"""Told of the transactions a replay completes, before the state completes them (`Log` rebuilds
its aborted-transaction index from them after a crash)."""
_REPLAY_CHUNK = 10_000
"""Batch headers collected before they are applied (bounds memory on huge segments)."""


def markers_in(
    buf: bytes | bytearray | memoryview, headers: Sequence[BatchHeader]
) -> dict[int, Marker]:
    """The end-transaction markers of the producers' control batches among `headers` (read from
    `buf`, where each header's position points), by base offset."""
    markers: dict[int, Marker] = {}
    for header in headers:
        if header.is_control and header.producer_id >= 0:
            batch = bytes(buf[header.position : header.position + header.size])
            markers[header.base_offset] = read_end_txn_marker(batch, read_header(batch))
    return markers


def _replay_segment(
    state: ProducerStateManager,
    segment: LogSegment,
    start_offset: int,
    on_completed: OnCompleted | None = None,
) -> int:
    """Apply the batches of `segment` from `start_offset`; returns how many were read."""
    first = segment.find_batch(start_offset)
    if first is None:
        return 0
    replayed = 0
    chunk: list[BatchHeader] = []
    markers: dict[int, Marker] = {}
    for header in segment.scan_headers(first.position):
        if header.base_offset < start_offset:
            continue
        chunk.append(header)
        if header.is_control and header.producer_id >= 0:
            batch = segment.read_at(header.position, header.size)
            markers[header.base_offset] = read_end_txn_marker(batch, read_header(batch))
        if len(chunk) >= _REPLAY_CHUNK:
            _apply(state, chunk, markers, on_completed)
            replayed += len(chunk)
            chunk, markers = [], {}
    if chunk:
        _apply(state, chunk, markers, on_completed)
        replayed += len(chunk)
    return replayed


def _apply(
    state: ProducerStateManager,
    headers: list[BatchHeader],
    markers: dict[int, Marker],
    on_completed: OnCompleted | None = None,
) -> None:
    if on_completed is None:
        infos, completed = state.apply_batches(headers, AppendOrigin.REPLICATION, markers)
        state.commit(infos, completed, headers[-1].next_offset)
        return
    # The aborted-transaction index needs the LSO as each marker completes its transaction
    # (as LogSegment.recover does): the batches before a marker are applied first, then the
    # marker alone.
    pieces: list[list[BatchHeader]] = [[]]
    for header in headers:
        if header.is_control:
            pieces.append([header])
            pieces.append([])
        else:
            pieces[-1].append(header)
    for piece in pieces:
        if not piece:
            continue
        infos, completed = state.apply_batches(piece, AppendOrigin.REPLICATION, markers)
        if completed:
            on_completed(completed)  # the aborted-transaction index rebuilds from these
        state.commit(infos, completed, piece[-1].next_offset)


def rebuild_producer_state(
    state: ProducerStateManager,
    segments: Sequence[LogSegment],
    log_start_offset: int,
    log_end_offset: int,
    now_ms: int,
    *,
    reload_from_clean_shutdown: bool = False,
    on_completed: OnCompleted | None = None,
) -> None:
    """Bring `state` to `log_end_offset` (steps in the module docstring)."""
    bases = [segment.base_offset for segment in segments]
    offsets_to_snapshot = {*bases[-2:], log_end_offset}
    if state.latest_snapshot_offset() is None and reload_from_clean_shutdown:
        for offset in sorted(offsets_to_snapshot):
            state.update_map_end_offset(offset)
            state.take_snapshot()
        return
    started = time.monotonic()
    was_empty = state.is_empty and state.map_end_offset >= log_end_offset
    state.truncate_and_reload(log_start_offset, log_end_offset, now_ms)
    snapshot_offset = state.map_end_offset
    loaded = time.monotonic()
    replayed = 0
    if log_end_offset > state.map_end_offset and not was_empty:
        for segment, next_base in zip(segments, [*bases[1:], None], strict=True):
            if next_base is not None and next_base <= state.map_end_offset:
                continue
            start = max(segment.base_offset, state.map_end_offset, log_start_offset)
            state.update_map_end_offset(start)
            if segment.base_offset in offsets_to_snapshot:
                state.take_snapshot()
            replayed += _replay_segment(state, segment, start, on_completed)
    state.update_map_end_offset(log_end_offset)
    state.take_snapshot()
    if state.producers or replayed:
        log.info(
            "%s: producer state of %d producers loaded from offset %d in %.1f ms, then %d "
            "batches replayed up to offset %d in %.1f ms",
            state.where,
            len(state.producers),
            snapshot_offset,
            (loaded - started) * 1000,
            replayed,
            log_end_offset,
            (time.monotonic() - loaded) * 1000,
        )
