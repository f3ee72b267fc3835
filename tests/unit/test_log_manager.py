"""LogManager: start-up (clean and unclean), placement, checkpoints, deletion, shutdown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from odradek.errors import OperatorError
from odradek.log.config import LogConfig
from odradek.log.log_manager import LogManager
from odradek.log.naming import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
)
from odradek.protocol.record_batch import build_batch, iter_batches

CONFIG = LogConfig(segment_bytes=500)


def batch(n: int = 2, ts: int = 0) -> bytes:
    return build_batch([(None, f"v{i}".encode(), [], ts + i) for i in range(n)])


def manager(dirs: list[Path], config: LogConfig = CONFIG) -> LogManager:
    m = LogManager(dirs, config)
    m.startup(now_ms=0)
    return m


def test_new_logs_go_to_the_directory_with_fewest_logs(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    m = manager(dirs)
    logs = [m.get_or_create_log("t", p) for p in range(4)]
    assert [log.dir.parent for log in logs] == [dirs[0], dirs[1], dirs[0], dirs[1]]
    assert m.get_or_create_log("t", 0) is logs[0]
    assert m.get_log("t", 9) is None
    assert len(m.all_logs()) == 4
    m.shutdown()


def test_clean_restart_preserves_logs_and_offsets(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    m = manager(dirs)
    for p in range(3):
        log = m.get_or_create_log("orders", p)
        for _ in range(10 * (p + 1)):
            log.append_as_leader(batch(), 0, 0)
    m.get_log("orders", 2).maybe_increment_log_start_offset(5)  # type: ignore[union-attr]
    m.shutdown()
    for d in dirs:
        assert (d / CLEAN_SHUTDOWN_FILE).exists()
    assert "orders 0 20" in (dirs[0] / RECOVERY_POINT_CHECKPOINT).read_text()
    assert "orders 2 5" in (dirs[0] / LOG_START_OFFSET_CHECKPOINT).read_text()

    again = manager(dirs)
    assert not any((d / CLEAN_SHUTDOWN_FILE).exists() for d in dirs)
    ends = {(log.topic, log.partition): log.log_end_offset for log in again.all_logs()}
    assert ends == {("orders", 0): 20, ("orders", 1): 40, ("orders", 2): 60}
    assert again.get_log("orders", 2).log_start_offset == 5  # type: ignore[union-attr]
    again.shutdown()


def test_a_log_loaded_at_start_up_takes_its_topic_config_when_its_partition_is_made(
    tmp_path: Path,
) -> None:
    """Start-up opens logs with the defaults (topic configs are in ZooKeeper, read later); the
    replica manager's get_or_create_log with the topic's config must replace them."""
    m = manager([tmp_path])
    m.get_or_create_log("compacted", 0).append_as_leader(batch(), 0, 0)
    m.shutdown()
    again = manager([tmp_path])
    loaded = again.get_log("compacted", 0)
    assert loaded is not None and loaded.config == CONFIG
    topic_config = LogConfig(segment_bytes=500, cleanup_policy=("compact",))
    assert again.get_or_create_log("compacted", 0, topic_config) is loaded
    assert loaded.config == topic_config and loaded.config.compact
    again.shutdown()


def test_unclean_start_recovers_from_the_checkpointed_recovery_point(tmp_path: Path) -> None:
    m = manager([tmp_path])
    log = m.get_or_create_log("t", 0)
    for _ in range(30):
        log.append_as_leader(batch(), 0, 0)
    m.flush_all()
    m.checkpoint_recovery_points_and_start_offsets()
    for _ in range(5):
        log.append_as_leader(batch(), 0, 0)
    tail = log.active_segment.log_path
    # Crash: no shutdown, no marker; the last batch is torn.
    last = list(iter_batches(tail.read_bytes()))[-1]
    os.truncate(tail, last.position + 10)
    for fd in list(m._lock_fds.values()):
        os.close(fd)

    recovered = manager([tmp_path])
    log = recovered.get_log("t", 0)
    assert log is not None
    assert log.log_end_offset == 68
    assert log.recovery_point == 60
    recovered.shutdown()


def test_second_manager_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    m = manager([tmp_path])
    with pytest.raises(OperatorError, match="in use"):
        manager([tmp_path])
    m.shutdown()
    manager([tmp_path]).shutdown()


def test_delete_log_and_leftover_delete_directories(tmp_path: Path) -> None:
    m = manager([tmp_path])
    log = m.get_or_create_log("t", 0)
    log.append_as_leader(batch(), 0, 0)
    m.get_or_create_log("t", 1)
    assert m.delete_log("t", 0)
    assert not m.delete_log("t", 0)
    assert not (tmp_path / "t-0").exists()
    assert m.get_log("t", 0) is None
    assert "t 0" not in (tmp_path / RECOVERY_POINT_CHECKPOINT).read_text()
    m.shutdown()
    leftover = tmp_path / "t-7.0123abcd-delete"
    leftover.mkdir()
    (leftover / "00000000000000000000.log").write_bytes(b"")
    (tmp_path / "not-a-log-dir").mkdir()
    again = manager([tmp_path])
    assert not leftover.exists()
    assert [(log.topic, log.partition) for log in again.all_logs()] == [("t", 1)]
    again.shutdown()


def test_recreated_topic_does_not_inherit_old_offsets(tmp_path: Path) -> None:
    m = manager([tmp_path])
    log = m.get_or_create_log("t", 0)
    for _ in range(10):
        log.append_as_leader(batch(), 0, 0)
    log.maybe_increment_log_start_offset(15)
    m.checkpoint_recovery_points_and_start_offsets()
    m.delete_log("t", 0)
    m.get_or_create_log("t", 0)
    m.shutdown()
    again = manager([tmp_path])
    assert again.get_log("t", 0).log_start_offset == 0  # type: ignore[union-attr]
    again.shutdown()


def test_update_config_and_cleanup(tmp_path: Path) -> None:
    m = manager([tmp_path], LogConfig(segment_bytes=len(batch()) * 2))
    log = m.get_or_create_log("t", 0)
    other = m.get_or_create_log("u", 0)
    for _ in range(10):
        log.append_as_leader(batch(), 0, 0)
        other.append_as_leader(batch(), 0, 0)
    m.update_config("t", LogConfig(segment_bytes=len(batch()) * 2, retention_bytes=0))
    assert m.config_for("t").retention_bytes == 0 and m.config_for("u").retention_bytes == -1
    moved: list[tuple[str, int]] = []
    assert m.cleanup(now_ms=0, on_deleted=lambda topic, index: moved.append((topic, index))) == 4
    assert log.log_start_offset == 16 and other.log_start_offset == 0
    assert moved == [("t", 0)]  # told of the log whose start moved, not of the other
    assert m.cleanup(now_ms=0, high_watermark_of=lambda topic, partition: 0) == 0
    m.shutdown()


def test_corrupt_checkpoint_means_full_recovery(tmp_path: Path) -> None:
    m = manager([tmp_path])
    log = m.get_or_create_log("t", 0)
    for _ in range(5):
        log.append_as_leader(batch(), 0, 0)
    m.shutdown()
    (tmp_path / CLEAN_SHUTDOWN_FILE).unlink()
    (tmp_path / RECOVERY_POINT_CHECKPOINT).write_text("garbage")
    again = manager([tmp_path])
    log = again.get_log("t", 0)
    assert log is not None and log.log_end_offset == 10 and log.recovery_point == 0
    again.shutdown()
