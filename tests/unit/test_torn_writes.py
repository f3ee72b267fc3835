"""Torn and corrupted files of a log directory, at arbitrary byte positions, for every file type
(issue 15, item 3): start-up must not crash, keep the data up to the last consistent point,
rebuild indexes and treat corrupt checkpoints as Kafka does (or more forgivingly, where that loses
nothing; the README's failure-behaviour table lists each).

A reference log directory (two partitions of 40 batches over several segments, three leader
epochs, sparse indexes, every checkpoint, meta.properties and partition.metadata) is built once;
each example copies it, damages one file (cut at a position, bytes overwritten at a position, or
the tail zeroed, as a torn page write leaves it), reopens it with a new `LogManager`, and checks:

* nothing raises, except OperatorError when meta.properties was damaged into naming another
  broker or cluster (Kafka refuses that too), or the directory goes offline when meta.properties
  became unreadable (Kafka's error directory);
* each partition's records are, offset for offset, a prefix of what was written — all of them
  unless a `.log` file of that partition was the one damaged — and every offset reads back from
  its own batch (indexes rebuilt or verified);
* the leader epoch cache agrees with the epochs stored in the batches;
* the log takes appends afterwards, and survives a clean restart unchanged.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odradek.cluster.replica_manager import HIGH_WATERMARK_CHECKPOINT, ReplicaManager
from odradek.errors import OperatorError
from odradek.log.checkpoints import write_offset_checkpoint
from odradek.log.config import LogConfig
from odradek.log.log import Log
from odradek.log.log_manager import LogManager
from odradek.log.meta_properties import META_PROPERTIES
from odradek.log.naming import (
    CLEAN_SHUTDOWN_FILE,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
)
from odradek.log.partition_metadata import (
    PARTITION_METADATA,
    read_partition_topic_id,
    write_partition_topic_id,
)
from odradek.protocol.record_batch import build_batch, decode_records, iter_batches

CONFIG = LogConfig(segment_bytes=1_500, index_interval_bytes=120)
BROKER_ID = 1
CLUSTER_ID = "cluster-id-of-the-test"
TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAQ"
PARTITIONS = 2
BATCHES = 40
RECORDS_PER_BATCH = 4

FILE_TYPES = (
    ".log",
    ".index",
    ".timeindex",
    ".snapshot",
    LEADER_EPOCH_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    HIGH_WATERMARK_CHECKPOINT,
    META_PROPERTIES,
    PARTITION_METADATA,
)


def _epoch_of_batch(i: int) -> int:
    return 1 + i // 15


def _batch(partition: int, i: int) -> bytes:
    """Partition 1 is written by an idempotent producer, so that its `.snapshot` files hold
    producer state; partition 0's batches carry no producer id."""
    idempotent = (
        {"producer_id": 4242, "producer_epoch": 0, "base_sequence": RECORDS_PER_BATCH * i}
        if partition == 1 and i < BATCHES
        else {}
    )
    return build_batch(
        [
            (None, f"p{partition}-r{i}-{j}".encode(), [], 1_000 + RECORDS_PER_BATCH * i + j)
            for j in range(RECORDS_PER_BATCH)
        ],
        **idempotent,  # type: ignore[arg-type]
    )


def expected(partition: int) -> list[tuple[int, bytes]]:
    return [
        (RECORDS_PER_BATCH * i + j, f"p{partition}-r{i}-{j}".encode())
        for i in range(BATCHES)
        for j in range(RECORDS_PER_BATCH)
    ]


def _crash(manager: LogManager) -> None:
    """Stop without flushing, checkpointing or the clean-shutdown marker (a SIGKILL)."""
    for log in manager.all_logs():
        log.close_quietly()
    for fd in manager._lock_fds.values():
        os.close(fd)
    manager._lock_fds.clear()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torn") / "logs"
    manager = LogManager([root], CONFIG)
    manager.startup(now_ms=0)
    manager.check_meta_properties(BROKER_ID, CLUSTER_ID)
    for partition in range(PARTITIONS):
        log = manager.get_or_create_log("events", partition, now_ms=0)
        write_partition_topic_id(log.dir, TOPIC_ID)
        for i in range(BATCHES):
            log.append_as_leader(_batch(partition, i), _epoch_of_batch(i), 0)
            if i == BATCHES // 2:
                log.flush()  # a recovery point in the middle
    manager.checkpoint_recovery_points_and_start_offsets()
    write_offset_checkpoint(
        root / HIGH_WATERMARK_CHECKPOINT,
        {("events", p): RECORDS_PER_BATCH * BATCHES for p in range(PARTITIONS)},
    )
    _crash(manager)
    return root


def _files_of_type(root: Path, file_type: str) -> list[Path]:
    if file_type in (".log", ".index", ".timeindex", ".snapshot"):
        found = [p for p in root.rglob(f"*{file_type}") if p.suffix == file_type]
    else:
        found = [p for p in root.rglob(file_type) if p.is_file()]
    return sorted(found)


def _damage(path: Path, kind: str, fraction: float, junk: bytes) -> None:
    data = path.read_bytes()
    position = int(fraction * len(data))
    if kind == "truncate":
        data = data[:position]
    elif kind == "overwrite":
        data = data[:position] + junk + data[position + len(junk) :]
    else:  # a torn page: the tail from `position` reads as zeros
        data = data[:position] + bytes(len(data) - position)
    path.write_bytes(data)


def all_values(log: Log) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        if not data:
            break
        for header in iter_batches(data):
            out += [(r.offset, r.value) for r in decode_records(data[header.position :])]
        offset = out[-1][0] + 1
    return out


def check_log(log: Log, damaged_its_data: bool) -> None:
    partition = log.partition
    values = all_values(log)
    reference = expected(partition)
    start = log.log_start_offset
    wanted = [(o, v) for o, v in reference if o >= start]
    assert values == wanted[: len(values)], "not a prefix of what was written"
    if not damaged_its_data:
        assert values == wanted, "records lost though no data file was damaged"
    assert log.log_end_offset == (values[-1][0] + 1 if values else start)
    # Every offset reads back from the batch that holds it (indexes rebuilt or verified).
    for offset, value in values[:: max(1, len(values) // 12)]:
        data = log.read(offset, 1)
        header = next(iter(iter_batches(data)))
        assert header.base_offset <= offset <= header.last_offset
        assert (offset, value) in [(r.offset, r.value) for r in decode_records(data)]
    # The leader epoch cache matches the epochs stored in the batches.
    epochs: dict[int, int] = {}
    offset = start
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        for header in iter_batches(data):
            epochs.setdefault(header.partition_leader_epoch, header.base_offset)
            offset = header.last_offset + 1
    cache = log.leader_epoch_cache
    for epoch, first_offset in epochs.items():
        found_epoch, end = cache.end_offset_for(epoch, log.log_end_offset)
        assert found_epoch == epoch, f"epoch {epoch} missing from the cache"
        assert end >= first_offset


def _reopen(root: Path) -> LogManager:
    manager = LogManager([root], CONFIG)
    manager.startup(now_ms=0)
    return manager


@settings(
    max_examples=int(os.environ.get("ODRADEK_TORN_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    file_type=st.sampled_from(FILE_TYPES),
    which=st.integers(min_value=0, max_value=1_000),
    kind=st.sampled_from(["truncate", "overwrite", "zeros"]),
    fraction=st.floats(min_value=0.0, max_value=1.0),
    junk=st.binary(min_size=1, max_size=16),
    clean_marker=st.booleans(),
    full_recovery=st.booleans(),
)
def test_a_torn_or_corrupt_file_is_recovered_at_start_up(
    reference: Path,
    file_type: str,
    which: int,
    kind: str,
    fraction: float,
    junk: bytes,
    clean_marker: bool,
    full_recovery: bool,
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "logs"
        shutil.copytree(reference, root)
        files = _files_of_type(root, file_type)
        assert files, f"the reference has no {file_type} file"
        if full_recovery:
            # No recovery points: every segment is validated, so any of them may be torn.
            (root / RECOVERY_POINT_CHECKPOINT).unlink(missing_ok=True)
        elif file_type == ".log":
            # Segments below the recovery point were fsynced before the crash (each roll
            # flushes): a torn write can only hit the active segment's unflushed tail. (Damage
            # to fsynced data is bit rot, which Kafka, too, only notices when a reader checks
            # the CRC.)
            files = [max(p.parent.glob("*.log")) for p in files]
        damaged = files[which % len(files)]
        if damaged.exists():  # (the recovery point checkpoint is gone with full_recovery)
            _damage(damaged, kind, fraction, junk)
        # A torn data file only exists after a crash; after a clean shutdown everything was
        # fsynced, so only the other files are damaged with the marker present.
        if clean_marker and file_type != ".log" and not full_recovery:
            (root / CLEAN_SHUTDOWN_FILE).touch()
        manager = _reopen(root)
        try:
            if file_type == META_PROPERTIES:
                try:
                    manager.check_meta_properties(BROKER_ID, CLUSTER_ID)
                except OperatorError as e:
                    assert "belongs to" in str(e) or "is usable" in str(e)
                    return
            else:
                manager.check_meta_properties(BROKER_ID, CLUSTER_ID)
            if file_type == HIGH_WATERMARK_CHECKPOINT:
                replica_manager = ReplicaManager(
                    BROKER_ID, manager, None, lambda t: CONFIG, lambda t: 1, None, None, 10_000
                )
                replica_manager.load_high_watermarks([root])  # must not raise
            if file_type == PARTITION_METADATA:
                # The right id, none (damage detected), or a well-formed other id (a flipped
                # base64 character: undetectable without a checksum, which Kafka lacks too).
                found = read_partition_topic_id(damaged.parent)
                assert found is None or len(found) == len(TOPIC_ID)
            for log in manager.all_logs():
                damaged_its_data = file_type == ".log" and damaged.parent == log.dir
                check_log(log, damaged_its_data)
                before = log.log_end_offset
                log.append_as_leader(_batch(log.partition, 999), 9, 0)
                assert log.log_end_offset == before + RECORDS_PER_BATCH
            ends = {log.partition: log.log_end_offset for log in manager.all_logs()}
            manager.shutdown()
            manager = _reopen(root)
            assert {log.partition: log.log_end_offset for log in manager.all_logs()} == ends
        finally:
            _crash(manager)


# -- regressions found by the test above, one per scenario ---------------------------------------


def _copy(reference: Path, tmp_path: Path) -> Path:
    root = tmp_path / "logs"
    shutil.copytree(reference, root)
    return root


def test_meta_properties_cut_inside_the_cluster_id_is_rewritten(reference: Path, tmp_path: Path):
    root = _copy(reference, tmp_path)
    path = root / META_PROPERTIES
    path.write_text(path.read_text()[:-5])  # "cluster.id=cluster-id-of-the" and no newline
    manager = _reopen(root)
    try:
        manager.check_meta_properties(BROKER_ID, CLUSTER_ID)  # not "belongs to cluster ..."
        assert f"cluster.id={CLUSTER_ID}\n" in path.read_text()
    finally:
        _crash(manager)


def test_leader_epoch_checkpoint_cut_in_its_last_line_is_rebuilt_from_the_data(
    reference: Path, tmp_path: Path
):
    root = _copy(reference, tmp_path)
    path = root / "events-0" / LEADER_EPOCH_CHECKPOINT
    text = path.read_text()
    assert text.endswith("\n3 120\n")
    path.write_text(text[:-3])  # "3 1": epoch 3 seemed to start at offset 1
    manager = _reopen(root)
    try:
        log = manager.get_log("events", 0)
        assert log is not None
        assert [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.epoch_entries()] == [
            (1, 0),
            (2, 60),
            (3, 120),
        ]
    finally:
        _crash(manager)


def test_segment_cut_at_a_batch_boundary_drops_the_segments_after_the_hole(
    reference: Path, tmp_path: Path
):
    root = _copy(reference, tmp_path)
    (root / RECOVERY_POINT_CHECKPOINT).unlink()  # recover every segment
    first = min((root / "events-0").glob("*.log"))
    first.write_bytes(b"")  # emptied: a batch boundary, no torn batch to notice
    manager = _reopen(root)
    try:
        log = manager.get_log("events", 0)
        assert log is not None
        assert log.log_end_offset == 0 and all_values(log) == []  # no data after a hole
    finally:
        _crash(manager)


def test_unreadable_high_watermark_checkpoint_does_not_stop_start_up(
    reference: Path, tmp_path: Path
):
    root = _copy(reference, tmp_path)
    (root / HIGH_WATERMARK_CHECKPOINT).write_bytes(b"0\n2\nevents 0 16\xff\n")
    manager = _reopen(root)
    try:
        replica_manager = ReplicaManager(
            BROKER_ID, manager, None, lambda t: CONFIG, lambda t: 1, None, None, 10_000
        )
        replica_manager.load_high_watermarks([root])  # raised KafkaStorageError before
    finally:
        _crash(manager)


def test_partition_metadata_with_a_damaged_topic_id_reads_as_none(reference: Path, tmp_path: Path):
    root = _copy(reference, tmp_path)
    path = root / "events-0" / PARTITION_METADATA
    path.write_bytes(path.read_bytes().replace(b"AAAA", b"A\x00AA", 1))
    assert read_partition_topic_id(path.parent) is None
    path.write_text("version: 0\ntopic_id: AAAA")  # torn
    assert read_partition_topic_id(path.parent) is None


def _overwrite_header_field(root: Path, batch_index: int, field_offset: int, value: bytes) -> Path:
    """Overwrite a field of the `batch_index`-th batch of events-0's first segment (a field the
    CRC does not cover: the base offset at 0, the partition leader epoch at 12)."""
    path = min((root / "events-0").glob("*.log"))
    data = bytearray(path.read_bytes())
    header = list(iter_batches(bytes(data)))[batch_index]
    data[header.position + field_offset : header.position + field_offset + len(value)] = value
    path.write_bytes(bytes(data))
    return path


def test_a_flipped_base_offset_bit_is_not_taken_for_a_gap(reference: Path, tmp_path: Path):
    root = _copy(reference, tmp_path)
    (root / RECOVERY_POINT_CHECKPOINT).unlink()
    _overwrite_header_field(root, 6, 4, (24 + (1 << 24)).to_bytes(4, "big"))  # 24 -> 16777240
    manager = _reopen(root)
    try:
        log = manager.get_log("events", 0)
        assert log is not None
        assert log.log_end_offset == 24  # cut before the damaged batch, nothing after it
        assert all_values(log) == expected(0)[:24]
    finally:
        _crash(manager)


def test_a_leader_epoch_that_goes_down_ends_the_recovered_log(reference: Path, tmp_path: Path):
    root = _copy(reference, tmp_path)
    (root / RECOVERY_POINT_CHECKPOINT).unlink()
    _overwrite_header_field(root, 5, 12, (7).to_bytes(4, "big"))  # batch 5: epoch 1 -> 7
    manager = _reopen(root)
    try:
        log = manager.get_log("events", 0)
        assert log is not None
        assert log.log_end_offset == 24  # batch 6 (epoch 1 after 7) and the rest are cut
        check_log(log, damaged_its_data=True)
    finally:
        _crash(manager)


def test_meta_properties_cut_inside_its_first_line_is_rewritten(reference: Path, tmp_path: Path):
    root = _copy(reference, tmp_path)
    path = root / META_PROPERTIES
    path.write_text("versi")  # found by tests/faults/disk (seed 2700907944)
    manager = _reopen(root)
    try:
        manager.check_meta_properties(BROKER_ID, CLUSTER_ID)  # was: no usable log directory
        assert path.read_text().startswith("version=0\n")
    finally:
        _crash(manager)


def test_a_compacted_log_keeps_its_offset_gaps_through_recovery(tmp_path: Path):
    """Recovery's contiguity rule is only for topics that are not compacted: the cleaner leaves
    gaps, which must survive an unclean restart."""
    compacted = replace(CONFIG, cleanup_policy=("compact",))
    log = Log.open(
        tmp_path / "kept-0",
        compacted,
        recovery_point=0,
        log_start_offset=0,
        clean_shutdown=True,
        now_ms=0,
    )
    log.append_as_follower(
        build_batch([(b"k", b"a", [], 1)], base_offset=0, partition_leader_epoch=1)
    )
    log.append_as_follower(
        build_batch([(b"k", b"b", [], 2)], base_offset=5, partition_leader_epoch=1)
    )
    log.close_quietly()
    reopened = Log.open(
        tmp_path / "kept-0",
        compacted,
        recovery_point=0,
        log_start_offset=0,
        clean_shutdown=False,
        now_ms=0,
    )
    assert reopened.log_end_offset == 6
    assert [o for o, _ in all_values(reopened)] == [0, 5]
