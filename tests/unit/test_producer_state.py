"""Producer state (log/producer_state.py): Kafka 3.9's rules for idempotent and transactional
batches, checked through the state manager and through the log (duplicates answered with the
original offsets, snapshots, recovery, truncation, expiration)."""

from __future__ import annotations

import struct
from pathlib import Path

import google_crc32c
import pytest

from odradek.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.producer_snapshot import (
    CorruptSnapshotError,
    SnapshotEntry,
    decode_snapshot,
    encode_snapshot,
    list_snapshots,
)
from odradek.log.producer_state import (
    INT32_MAX,
    AppendOrigin,
    ProducerStateManager,
    decrement_sequence,
    increment_sequence,
)
from odradek.log.producer_state_loading import markers_in
from odradek.protocol.record_batch import build_batch, iter_batches, read_header

SMALL = LogConfig(segment_bytes=800, index_interval_bytes=64)


def batch(
    pid: int,
    epoch: int,
    seq: int,
    n: int = 1,
    ts: int = 1_000,
    transactional: bool = False,
) -> bytes:
    return build_batch(
        [(None, f"v{seq + i}".encode(), [], ts + i) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=transactional,
    )


def control_batch(
    pid: int, epoch: int, commit: bool, coordinator_epoch: int, ts: int = 5_000
) -> bytes:
    """A COMMIT/ABORT marker batch as a transaction coordinator writes it."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, coordinator_epoch)
    data = bytearray(
        build_batch(
            [(key, value, [], ts)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=-1,
            is_transactional=True,
        )
    )
    attributes = struct.unpack_from(">h", data, 21)[0] | 0x20
    struct.pack_into(">h", data, 21, attributes)
    struct.pack_into(">I", data, 17, google_crc32c.value(bytes(data[21:])))
    return bytes(data)


def open_log(path: Path, config: LogConfig = SMALL, **kwargs: object) -> Log:
    options: dict[str, object] = {
        "recovery_point": 0,
        "log_start_offset": 0,
        "clean_shutdown": True,
        "now_ms": 10_000,
    }
    options.update(kwargs)
    return Log.open(path / "t-0", config, **options)  # type: ignore[arg-type]


def stamped(log: Log, data: bytes) -> bytes:
    """`data` as a leader would have stamped it at the log end (for follower appends)."""
    buf = bytearray(data)
    struct.pack_into(">q", buf, 0, log.log_end_offset)
    return bytes(buf)


# -- sequence arithmetic ----------------------------------------------------------------------


def test_sequences_wrap_at_int32_max() -> None:
    assert increment_sequence(INT32_MAX, 1) == 0
    assert increment_sequence(INT32_MAX - 1, 3) == 1
    assert decrement_sequence(1, 3) == INT32_MAX - 1
    assert decrement_sequence(10, 3) == 7


# -- the leader's checks, through the log -----------------------------------------------------


def test_in_sequence_batches_are_appended(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.append_as_leader(batch(7, 0, 0, 3), 0, 0).first_offset == 0
    assert log.append_as_leader(batch(7, 0, 3, 2), 0, 0).first_offset == 3
    entry = log.producer_state.last_entry(7)
    assert entry is not None and entry.last_seq == 4 and entry.last_data_offset == 4


def test_duplicate_of_one_of_the_last_five_batches_gets_its_original_offsets(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path)
    offsets = []
    for i in range(6):
        log.append_as_leader(batch(99, 0, 0, 1), 0, 0)  # another producer interleaves
        offsets.append(log.append_as_leader(batch(7, 0, 2 * i, 2), 0, 0).first_offset)
    end = log.log_end_offset
    for i in range(1, 6):  # the last five are recognised
        info = log.append_as_leader(batch(7, 0, 2 * i, 2), 0, 0)
        assert (info.first_offset, info.last_offset, info.batch_count) == (
            offsets[i],
            offsets[i] + 1,
            0,
        )
    assert log.log_end_offset == end, "a duplicate must not be appended"
    with pytest.raises(OutOfOrderSequenceError):  # the sixth-last is too old to recognise
        log.append_as_leader(batch(7, 0, 0, 2), 0, 0)


def test_gap_in_sequence_is_out_of_order(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(7, 0, 0, 2), 0, 0)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(7, 0, 3), 0, 0)
    with pytest.raises(OutOfOrderSequenceError):  # overlaps but is not an exact duplicate
        log.append_as_leader(batch(7, 0, 1, 2), 0, 0)
    assert log.log_end_offset == 2


def test_older_epoch_is_fenced_and_newer_epoch_must_start_at_zero(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(7, 3, 0, 2), 0, 0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(batch(7, 2, 2), 0, 0)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(7, 4, 5), 0, 0)
    # KIP-360: the producer bumps its epoch and restarts its sequences at 0.
    assert log.append_as_leader(batch(7, 4, 0), 0, 0).first_offset == 2
    entry = log.producer_state.last_entry(7)
    assert entry is not None and entry.producer_epoch == 4 and len(entry.batches) == 1


def test_unknown_producer_is_accepted_with_any_sequence(tmp_path: Path) -> None:
    # Kafka 3.9 (KIP-360): no UNKNOWN_PRODUCER_ID; the producer's state may have been removed by
    # retention, DeleteRecords or expiration.
    log = open_log(tmp_path)
    assert log.append_as_leader(batch(7, 0, 42), 0, 0).first_offset == 0
    assert log.append_as_leader(batch(7, 0, 43), 0, 0).first_offset == 1


def test_sequence_wraps_to_zero(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(7, 0, INT32_MAX - 1, 2), 0, 0)
    assert log.append_as_leader(batch(7, 0, 0), 0, 0).first_offset == 2


def test_non_idempotent_batches_are_not_tracked(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(build_batch([(None, b"x", [], 1)]), 0, 0)
    log.append_as_leader(build_batch([(None, b"x", [], 1)]), 0, 0)
    assert log.producer_state.producers == {}
    assert log.producer_state.map_end_offset == 2


# -- followers ----------------------------------------------------------------------------------


def test_follower_builds_the_same_state_and_can_then_deduplicate(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    for seq in range(0, 10, 2):
        leader.append_as_leader(batch(7, 0, seq, 2), 0, 0)
    follower.append_as_follower(leader.read(0, 1 << 20))
    entry = follower.producer_state.last_entry(7)
    assert entry is not None and entry.last_seq == 9 and len(entry.batches) == 5
    # After failover the former follower recognises the producer's retry.
    info = follower.append_as_leader(batch(7, 0, 8, 2), 1, 0)
    assert (info.first_offset, info.batch_count) == (8, 0)


def test_follower_does_not_check_sequences(tmp_path: Path) -> None:
    follower = open_log(tmp_path)
    follower.append_as_follower(stamped(follower, batch(7, 2, 0)))
    follower.append_as_follower(stamped(follower, batch(7, 2, 5)))  # a gap: not checked
    follower.append_as_follower(stamped(follower, batch(7, 1, 9)))  # an older epoch: logged only
    assert follower.log_end_offset == 3


# -- transactions -----------------------------------------------------------------------------


def test_transaction_bookkeeping_and_first_unstable_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    state = log.producer_state
    log.append_as_leader(batch(1, 0, 0), 0, 0)  # offset 0, idempotent only
    log.append_as_leader(batch(5, 0, 0, 2, transactional=True), 0, 0)  # offsets 1-2
    log.append_as_leader(batch(6, 0, 0, transactional=True), 0, 0)  # offset 3
    assert state.first_undecided_offset() == 1 and state.first_unstable_offset() == 1
    with pytest.raises(InvalidTxnStateError):  # non-transactional write inside a transaction
        log.append_as_leader(batch(5, 0, 2), 0, 0)
    info = log.append_as_leader(
        control_batch(5, 0, commit=True, coordinator_epoch=3), 0, 0, origin=AppendOrigin.COORDINATOR
    )
    assert info.first_offset == 4
    assert set(state.ongoing_txns) == {3}
    assert state.unreplicated_txns[1].last_offset == 4
    assert state.first_unstable_offset() == 1  # the marker is above the high watermark
    state.on_high_watermark_updated(5)
    assert state.first_unstable_offset() == 3
    entry = state.last_entry(5)
    assert (
        entry is not None and entry.coordinator_epoch == 3 and entry.current_txn_first_offset == -1
    )
    log.append_as_leader(
        control_batch(6, 0, commit=False, coordinator_epoch=1),
        0,
        0,
        origin=AppendOrigin.COORDINATOR,
    )
    with pytest.raises(TransactionCoordinatorFencedError):  # an older coordinator's marker
        log.append_as_leader(
            control_batch(6, 0, commit=False, coordinator_epoch=0),
            0,
            0,
            origin=AppendOrigin.COORDINATOR,
        )


def test_last_stable_offset_of_a_completed_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    state = log.producer_state
    log.append_as_leader(batch(5, 0, 0, transactional=True), 0, 0)  # 0
    log.append_as_leader(batch(6, 0, 0, transactional=True), 0, 0)  # 1
    marker = stamped(log, control_batch(5, 0, commit=False, coordinator_epoch=0))
    _infos, completed = state.apply_batches(
        iter_batches(marker),
        AppendOrigin.REPLICATION,
        markers_in(marker, list(iter_batches(marker))),
    )
    assert len(completed) == 1 and completed[0].is_aborted
    assert (completed[0].first_offset, completed[0].last_offset) == (0, 2)
    # Producer 6's transaction (from offset 1) is still open: the LSO stops there.
    assert state.last_stable_offset(completed[0]) == 1


# -- snapshots, recovery, truncation ----------------------------------------------------------


def test_snapshot_format_round_trip_and_crc() -> None:
    entries = [
        SnapshotEntry(7, 1, 41, 100, 3, 123456, -1, -1),
        SnapshotEntry(8, 0, -1, -1, 0, 5, 2, 77),
    ]
    data = encode_snapshot(entries)
    assert struct.unpack_from(">h", data, 0)[0] == 1
    assert struct.unpack_from(">I", data, 2)[0] == google_crc32c.value(data[6:])
    assert len(data) == 10 + 2 * 46
    assert decode_snapshot(data) == entries
    corrupt = bytearray(data)
    corrupt[-1] ^= 1
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(bytes(corrupt))


def test_snapshot_at_roll_and_clean_shutdown_then_reload(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for seq in range(0, 60, 3):
        log.append_as_leader(batch(7, 0, seq, 3, ts=10_000), 0, 0)
    assert log.segment_count > 1
    snapshots = list_snapshots(log.dir)
    assert set(snapshots) == {s.base_offset for s in log.segments()[1:]}
    log.close()
    assert log.log_end_offset in list_snapshots(log.dir)
    reopened = open_log(tmp_path)
    entry = reopened.producer_state.last_entry(7)
    assert entry is not None and entry.last_seq == 59 and entry.last_data_offset == 59
    info = reopened.append_as_leader(batch(7, 0, 57, 3), 0, 0)  # the last batch: a duplicate
    assert (info.first_offset, info.batch_count) == (57, 0)
    with pytest.raises(OutOfOrderSequenceError):
        reopened.append_as_leader(batch(7, 0, 61), 0, 0)


def test_unclean_restart_replays_the_log_after_the_last_snapshot(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for seq in range(0, 60, 3):
        log.append_as_leader(batch(7, 0, seq, 3, ts=10_000), 0, 0)
        log.append_as_leader(batch(8, 2, seq, 3, ts=10_000), 0, 0)
    log.flush()
    # No close(): as after a SIGKILL (no snapshot at the log end).
    reopened = open_log(tmp_path, clean_shutdown=False, recovery_point=log.recovery_point)
    for pid, epoch in ((7, 0), (8, 2)):
        entry = reopened.producer_state.last_entry(pid)
        assert entry is not None and (entry.producer_epoch, entry.last_seq) == (epoch, 59)
    assert reopened.append_as_leader(batch(8, 2, 57, 3), 0, 0).batch_count == 0


def test_corrupt_snapshot_falls_back_to_an_older_one(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for seq in range(0, 60, 3):
        log.append_as_leader(batch(7, 0, seq, 3, ts=10_000), 0, 0)
    log.close()
    snapshots = list_snapshots(log.dir)
    latest = snapshots[max(snapshots)]
    latest.write_bytes(latest.read_bytes()[:-3])
    reopened = open_log(tmp_path)
    entry = reopened.producer_state.last_entry(7)
    assert entry is not None and entry.last_seq == 59


def test_truncation_reloads_state_below_the_truncation_point(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for seq in range(0, 60, 3):
        log.append_as_leader(batch(7, 0, seq, 3, ts=10_000), 0, 0)
    log.truncate_to(31)  # the batch 30-32 goes too
    entry = log.producer_state.last_entry(7)
    assert entry is not None and entry.last_seq == 29 and log.log_end_offset == 30
    assert all(offset <= 30 for offset in list_snapshots(log.dir))
    assert log.append_as_leader(batch(7, 0, 30, 3), 0, 0).first_offset == 30
    log.truncate_to(0)
    assert log.producer_state.last_entry(7) is None


def test_retention_deletes_snapshots_with_their_segments(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=800, index_interval_bytes=64, retention_bytes=1500)
    log = open_log(tmp_path, config)
    for seq in range(0, 90, 3):
        log.append_as_leader(batch(7, 0, seq, 3, ts=10_000), 0, 0)
    log.delete_retention_segments(now_ms=10_000)
    first = log.segments()[0].base_offset
    assert first > 0 and all(offset >= first for offset in list_snapshots(log.dir))


def test_expired_producers_are_forgotten_and_not_reloaded(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=2000, index_interval_bytes=64, producer_id_expiration_ms=1_000)
    log = open_log(tmp_path, config)
    log.append_as_leader(batch(7, 0, 0, ts=10_000), 0, 0)
    log.append_as_leader(batch(8, 0, 0, ts=20_000), 0, 0)
    log.append_as_leader(batch(9, 0, 0, ts=10_000, transactional=True), 0, 0)
    assert log.producer_state.remove_expired_producers(20_500) == 1
    assert set(log.producer_state.producers) == {8, 9}  # 9 has an open transaction
    log.close()
    reopened = open_log(tmp_path, config, now_ms=30_000)
    assert set(reopened.producer_state.producers) == {9}


def test_state_manager_refuses_nothing_from_replication_and_keeps_five_batches(
    tmp_path: Path,
) -> None:
    state = ProducerStateManager(tmp_path, "t-0", 10**9)
    headers = []
    for i in range(8):
        buf = bytearray(batch(7, 0, i * 2, 2))
        struct.pack_into(">q", buf, 0, i * 2)
        headers.append(read_header(buf))
    infos, completed = state.apply_batches(headers, AppendOrigin.REPLICATION)
    state.commit(infos, completed, 16)
    entry = state.last_entry(7)
    assert entry is not None and [b.first_seq for b in entry.batches] == [6, 8, 10, 12, 14]
