"""Kafka's small text checkpoint files, read and written atomically.

Every checkpoint file has the same shape (Kafka's CheckpointFile)::

    0                  format version, always 0
    3                  number of entry lines that follow
    <entry>            one line per entry, fields separated by single spaces
    ...

The offset checkpoints of a log directory (`recovery-point-offset-checkpoint`,
`log-start-offset-checkpoint`, `replication-offset-checkpoint`) hold one `<topic> <partition>
<offset>` line per partition; topic names never contain spaces. The per-partition
`leader-epoch-checkpoint` holds `<epoch> <start offset>` lines (see leader_epoch.py).

Writes are atomic: the new content goes to `<name>.tmp`, is fsynced, renamed over the old file, and
the directory is fsynced so that the rename itself survives a crash. A reader therefore sees either
the old or the new file, never a mix; a file that does not parse (including one whose last line
lacks its newline: a torn write) is reported as `KafkaStorageError` naming the file and line,
never silently treated as empty.

Not thread-safe: each file has one writer (the log manager or the log that owns it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from odradek.errors import KafkaStorageError
from odradek.log.naming import TEMP_SUFFIX

CHECKPOINT_VERSION = 0

T = TypeVar("T")

TopicPartition = tuple[str, int]


def fsync_dir(path: Path) -> None:
    """fsync a directory so that entries created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str, *, sync: bool = True, sync_dir: bool = True) -> None:
    """Replace `path` with `text`: temp file, fsync, rename, fsync the directory.

    With `sync=False` the rename still makes the replacement atomic for readers, but a crash may
    leave the old (or, on some file systems, an empty) file: only for files that can be rebuilt.
    """
    temp = path.with_name(path.name + TEMP_SUFFIX)
    try:
        with open(temp, "w", encoding="utf-8") as file:
            file.write(text)
            if sync:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temp, path)
        if sync and sync_dir:
            fsync_dir(path.parent)
    except OSError as e:
        raise KafkaStorageError(f"cannot write checkpoint {path}: {e}") from e


def write_checkpoint(
    path: Path, lines: Iterable[str], *, sync: bool = True, sync_dir: bool = True
) -> None:
    """Write a checkpoint file with the given entry lines (version and count are added)."""
    entries = list(lines)
    write_atomically(
        path,
        "".join([f"{CHECKPOINT_VERSION}\n{len(entries)}\n", *entries]),
        sync=sync,
        sync_dir=sync_dir,
    )


def read_checkpoint(path: Path, parse_entry: Callable[[list[str]], T]) -> list[T]:
    """Parse a checkpoint file; a missing file is empty, a malformed one is `KafkaStorageError`.

    `parse_entry` gets the space-separated fields of one line and raises ValueError if they do not
    form an entry.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise KafkaStorageError(f"cannot read checkpoint {path}: {e}") from e
    lines = text.split("\n")

    def malformed(line_number: int, why: str) -> KafkaStorageError:
        return KafkaStorageError(f"malformed checkpoint file {path}, line {line_number}: {why}")

    # Every line this module writes ends in a newline: a file that does not is torn (its last
    # line may still parse, as a prefix of the real one: "3 120" cut to "3 1").
    if text and lines[-1] != "":
        raise malformed(len(lines), "the last line is incomplete (a torn write)")
    if lines and lines[-1] == "":
        lines.pop()

    if len(lines) < 2:
        raise malformed(len(lines) + 1, "missing version or entry count")
    if lines[0].strip() != str(CHECKPOINT_VERSION):
        raise malformed(1, f"unsupported version {lines[0]!r}")
    try:
        count = int(lines[1])
    except ValueError:
        raise malformed(2, f"entry count {lines[1]!r} is not an integer") from None
    if count < 0 or count != len(lines) - 2:
        raise malformed(2, f"entry count {count} but {len(lines) - 2} entry lines")
    entries: list[T] = []
    for line_number, line in enumerate(lines[2:], start=3):
        try:
            entries.append(parse_entry(line.split(" ")))
        except ValueError as e:
            raise malformed(line_number, f"{line!r}: {e}") from None
    return entries


def _parse_offset_entry(fields: list[str]) -> tuple[TopicPartition, int]:
    if len(fields) != 3 or not fields[0]:
        raise ValueError("expected '<topic> <partition> <offset>'")
    partition = int(fields[1])
    offset = int(fields[2])
    if partition < 0:
        raise ValueError("negative partition")
    return (fields[0], partition), offset


class OffsetCheckpointFile:
    """One of a log directory's `<topic> <partition> <offset>` checkpoint files.

    Concurrency: one writer at a time (the log manager or replica manager on the broker's event
    loop); reads happen at start-up.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        for topic, _ in offsets:
            if not topic or " " in topic or "\n" in topic:
                raise KafkaStorageError(f"topic name {topic!r} cannot be stored in {self.path}")
        write_checkpoint(
            self.path,
            (
                f"{topic} {partition} {offset}\n"
                for (topic, partition), offset in sorted(offsets.items())
            ),
        )

    def read(self) -> dict[TopicPartition, int]:
        return dict(read_checkpoint(self.path, _parse_offset_entry))


def read_offset_checkpoint(path: Path) -> dict[TopicPartition, int]:
    """Shorthand for `OffsetCheckpointFile(path).read()`."""
    return OffsetCheckpointFile(path).read()


def write_offset_checkpoint(path: Path, offsets: Mapping[TopicPartition, int]) -> None:
    """Shorthand for `OffsetCheckpointFile(path).write(offsets)`."""
    OffsetCheckpointFile(path).write(offsets)
