"""`odradek dump-log` on files the `odradek.log` package wrote: what it prints equals what was
appended, and damage (a wrong index entry, a wrong time index timestamp, a torn tail, a torn index,
a missing file) is reported, not printed as data."""

from __future__ import annotations

import io
import re
import struct
from pathlib import Path

from odradek.cli.dump_log import DumpOptions, run
from odradek.coordinator.transaction.log_records import build_marker_batch
from odradek.log.checkpoints import write_offset_checkpoint
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.producer_snapshot import SnapshotEntry, write_snapshot
from odradek.log.producer_state import AppendOrigin
from odradek.protocol.record_batch import build_batch

NOW = 1_700_000_000_000
SMALL = LogConfig(segment_bytes=100_000, index_interval_bytes=64)


def _open(path: Path) -> Log:
    return Log.open(
        path / "t-0", SMALL, recovery_point=0, log_start_offset=0, clean_shutdown=True, now_ms=NOW
    )


def _dump(*files: Path, **options: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run(list(files), DumpOptions(**options), out, err)  # type: ignore[arg-type]
    return status, out.getvalue(), err.getvalue()


def _plain_log(tmp_path: Path, batches: int = 6) -> Path:
    log = _open(tmp_path)
    for b in range(batches):
        records = [
            (f"k{b}-{i}".encode(), f"v{b}-{i}".encode(), [("h", b"x")], NOW + 3 * b + i)
            for i in range(3)
        ]
        log.append_as_leader(build_batch(records), 0, NOW)
    log.flush()
    log.close()
    return tmp_path / "t-0"


def test_segment_batches_and_records_are_what_was_appended(tmp_path: Path) -> None:
    directory = _plain_log(tmp_path)
    segment = directory / "00000000000000000000.log"
    status, out, err = _dump(segment)
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[:2] == [f"Dumping {segment}", "Log starting offset: 0"]
    batches = [line for line in lines if line.startswith("baseOffset:")]
    assert len(batches) == 6
    positions = [int(re.search(r"position: (\d+)", b).group(1)) for b in batches]  # type: ignore[union-attr]
    sizes = [int(re.search(r"size: (\d+)", b).group(1)) for b in batches]  # type: ignore[union-attr]
    assert positions == [sum(sizes[:i]) for i in range(6)]  # consecutive, from 0
    assert sum(sizes) == segment.stat().st_size
    assert batches[1].startswith("baseOffset: 3 lastOffset: 5 count: 3 baseSequence: -1 ")
    assert "CreateTime: 1700000000005 " in batches[1]
    assert batches[1].endswith("magic: 2 compresscodec: none crc: " + batches[1].split("crc: ")[1])
    assert all(b.endswith("isvalid: true") for b in batches)
    assert not any(line.startswith("|") for line in lines)  # shallow by default

    status, out, _ = _dump(segment, print_data_log=True)
    records = [line for line in out.splitlines() if line.startswith("| ")]
    assert len(records) == 18
    assert records[4] == (
        "| offset: 4 CreateTime: 1700000000004 keySize: 4 valueSize: 4 sequence: -1 "
        "headerKeys: [h] key: k1-1 payload: v1-1"
    )
    status, out, _ = _dump(segment, deep_iteration=True)
    assert "| offset: 17 CreateTime: 1700000000017 keySize: 4 valueSize: 4" in out
    assert "payload" not in out


def test_damage_is_reported(tmp_path: Path) -> None:
    directory = _plain_log(tmp_path)
    segment = directory / "00000000000000000000.log"
    index = directory / "00000000000000000000.index"
    time_index = directory / "00000000000000000000.timeindex"
    status, out, err = _dump(index, time_index)
    assert status == 0 and err == ""
    entries = re.findall(r"offset: (\d+) position: (\d+)", out)
    assert entries and all(int(o) % 3 == 2 for o, _ in entries)  # each ends a batch
    assert "timestamp: 1700000000005 offset: 5" in out

    # An index entry pointing at the wrong batch, a time index entry with the wrong timestamp.
    data = bytearray(index.read_bytes())
    struct.pack_into(">i", data, 4, 0)  # the first entry's position: the first batch's
    index.write_bytes(bytes(data))
    first_ts, _ = struct.unpack_from(">qi", time_index.read_bytes(), 0)
    damaged = bytearray(time_index.read_bytes())
    struct.pack_into(">q", damaged, 0, first_ts - 1)
    time_index.write_bytes(bytes(damaged))
    status, out, err = _dump(index, time_index, verify_index_only=True)
    assert status == 0 and "position:" not in out
    assert f"Mismatches in :{index.absolute()}" in err
    assert f"  Index offset: {entries[0][0]}, log offset: 2" in err
    assert f"Found timestamp mismatch in :{time_index.absolute()}" in err
    assert f"  Index timestamp: {first_ts - 1}, log timestamp: {first_ts}" in err

    # A torn index entry fails the sanity check the broker runs.
    index.write_bytes(index.read_bytes() + b"\x00\x00\x00")
    status, out, err = _dump(index, index_sanity_check=True)
    assert status == 1 and "passed sanity check" not in out
    assert "is corrupt" in err and err.count("\n") == 1

    # Garbage after the last batch.
    with segment.open("ab") as file:
        file.write(b"\x00" * 10)
    status, out, err = _dump(segment)
    assert "Found 10 invalid bytes at the end of 00000000000000000000.log" in out


def test_transactional_log_markers_txnindex_and_snapshot(tmp_path: Path) -> None:
    log = _open(tmp_path)
    for producer_id in (1, 2):
        log.append_as_leader(
            build_batch(
                [(None, b"v", (), NOW), (None, b"w", (), NOW)],
                producer_id=producer_id,
                producer_epoch=0,
                base_sequence=0,
                is_transactional=True,
            ),
            0,
            NOW,
        )
    for producer_id, commit in ((1, False), (2, True)):
        log.append_as_leader(
            build_marker_batch(producer_id, 0, commit, 7, NOW),
            0,
            NOW,
            origin=AppendOrigin.COORDINATOR,
        )
    log.flush()
    log.close()
    directory = tmp_path / "t-0"
    status, out, err = _dump(directory / "00000000000000000000.log", deep_iteration=True)
    assert status == 0, err
    assert "producerId: 1 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true " in out
    assert "baseSequence: 0 lastSequence: 1 producerId: 2" in out
    assert "| offset: 4 CreateTime: 1700000000000 keySize: 4 valueSize: 6 sequence: -1 " in out
    assert "headerKeys: [] endTxnMarker: ABORT coordinatorEpoch: 7" in out
    assert "endTxnMarker: COMMIT coordinatorEpoch: 7" in out
    assert "isControl: true" in out

    status, out, _ = _dump(directory / "00000000000000000000.txnindex")
    assert out.splitlines()[1:] == [
        "version: 0 producerId: 1 firstOffset: 0 lastOffset: 4 lastStableOffset: 2"
    ]
    write_snapshot(directory, 6, [SnapshotEntry(2, 0, 1, 3, 1, NOW, 7, -1)])
    status, out, _ = _dump(directory / "00000000000000000006.snapshot")
    assert out.splitlines()[1] == (
        "producerId: 2 producerEpoch: 0 coordinatorEpoch: 7 currentTxnFirstOffset: -1 "
        f"lastTimestamp: {NOW} firstSequence: 0 lastSequence: 1 lastOffset: 3 offsetDelta: 1 "
        f"timestamp: {NOW}"
    )


def test_checkpoints_unknown_and_missing_files(tmp_path: Path) -> None:
    directory = _plain_log(tmp_path, batches=1)
    checkpoint = tmp_path / "replication-offset-checkpoint"
    write_offset_checkpoint(checkpoint, {("t", 0): 3, ("a", 2): 9})
    unknown = tmp_path / "notes.txt"
    unknown.write_text("hello")
    missing = directory / "00000000000000000099.log"
    status, out, err = _dump(
        checkpoint, directory / "leader-epoch-checkpoint", unknown, missing, directory / "00000000000000000000.log"
    )  # fmt: skip
    assert status == 1
    assert "topic: a partition: 2 offset: 9\ntopic: t partition: 0 offset: 3\n" in out
    assert "epoch: 0 startOffset: 0" in out
    assert f"Ignoring unknown file {unknown}" in err
    assert f"odradek: error: {missing}: " in err
    assert "baseOffset: 0 lastOffset: 2" in out  # the files after the missing one are dumped
