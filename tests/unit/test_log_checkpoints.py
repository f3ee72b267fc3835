"""Offset checkpoint files: format, round trips, atomicity, malformed files; naming helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from odradek.errors import InvalidTopicError, KafkaStorageError
from odradek.log.checkpoints import (
    OffsetCheckpointFile,
    read_offset_checkpoint,
    write_offset_checkpoint,
)
from odradek.log.naming import (
    delete_dir_name,
    is_delete_dir_name,
    log_dir_name,
    log_file_name,
    parse_log_dir_name,
    parse_segment_file_name,
)


def test_round_trip_and_exact_format(tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    offsets = {("orders", 1): 42, ("a.b-c", 0): 7, ("orders", 0): 0}
    OffsetCheckpointFile(path).write(offsets)
    assert path.read_text() == "0\n3\na.b-c 0 7\norders 0 0\norders 1 42\n"
    assert OffsetCheckpointFile(path).read() == offsets
    assert not (tmp_path / "recovery-point-offset-checkpoint.tmp").exists()


def test_missing_file_reads_empty_and_empty_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "log-start-offset-checkpoint"
    assert read_offset_checkpoint(path) == {}
    write_offset_checkpoint(path, {})
    assert path.read_text() == "0\n0\n"
    assert read_offset_checkpoint(path) == {}


def test_rewrite_replaces_content(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    write_offset_checkpoint(path, {("t", 0): 1, ("t", 1): 2})
    write_offset_checkpoint(path, {("t", 0): 5})
    assert read_offset_checkpoint(path) == {("t", 0): 5}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("", "line 1"),
        ("1\n0\n", "line 1"),
        ("0\nx\n", "line 2"),
        ("0\n2\nt 0 1\n", "line 2"),
        ("0\n1\nt 0\n", "line 3"),
        ("0\n1\nt zero 1\n", "line 3"),
        ("0\n1\nt -1 1\n", "line 3"),
    ],
)
def test_malformed_files_are_clear_errors(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "cp"
    path.write_text(text)
    with pytest.raises(KafkaStorageError, match=where):
        read_offset_checkpoint(path)


def test_topic_names_with_spaces_cannot_be_written(tmp_path: Path) -> None:
    with pytest.raises(KafkaStorageError):
        write_offset_checkpoint(tmp_path / "cp", {("bad topic", 0): 1})


def test_naming_helpers() -> None:
    assert log_file_name(42) == "00000000000000000042.log"
    assert parse_segment_file_name("00000000000000000042.timeindex") == (42, ".timeindex")
    assert parse_segment_file_name("42.log") is None
    assert parse_segment_file_name("00000000000000000042.log.deleted") is None
    assert parse_log_dir_name("my-topic.v2-17") == ("my-topic.v2", 17)
    assert parse_log_dir_name("topic") is None
    assert parse_log_dir_name("-3") is None
    assert parse_log_dir_name("topic-x") is None
    assert log_dir_name("t", 3) == "t-3"
    with pytest.raises(InvalidTopicError):
        log_dir_name("../etc", 0)
    doomed = delete_dir_name("t", 3)
    assert doomed.startswith("t-3.") and is_delete_dir_name(doomed)
    assert parse_log_dir_name(doomed) is None
