"""`partition.metadata`: the topic id of a partition directory (KIP-516).

The file is two lines, `version: 0` and `topic_id: <base64 topic id>`; it tells a broker that a
local log belongs to an older topic of the same name (deleted and re-created while it was down).
It is written atomically (temp file, rename) like the checkpoints; a torn or unreadable file reads
as "no topic id", which only skips one stray check, and is rewritten by the next LeaderAndIsr that
carries the topic id.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from odradek.log.checkpoints import write_atomically
from odradek.protocol.topic_ids import topic_id_to_uuid, uuid_to_topic_id

PARTITION_METADATA = "partition.metadata"


def read_partition_topic_id(log_dir: Path) -> str | None:
    """The topic id recorded in a partition directory's `partition.metadata`, if any.

    A broker reads this for every log at start-up (10,000 of them in a few tenths of a second
    before this was made cheap): the file is read with plain system calls and its contents,
    the same for every partition of a topic, are parsed once per distinct text."""
    try:
        fd = os.open(os.path.join(log_dir, PARTITION_METADATA), os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, _MAX_FILE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _parse(data)


_MAX_FILE_BYTES = 4096
"""Far more than a valid file's ~50 bytes; a longer file is not one this module wrote."""


@functools.lru_cache(maxsize=1024)
def _parse(data: bytes) -> str | None:
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    lines = text.split("\n")
    if len(lines) < 3 or lines[0].strip() != "version: 0" or lines[2] != "":
        return None  # torn: a complete file ends with the topic id line and its newline
    key, _, value = lines[1].partition(":")
    topic_id = value.strip()
    if key.strip() != "topic_id" or not topic_id:
        return None
    parsed = topic_id_to_uuid(topic_id)
    if parsed is None or uuid_to_topic_id(parsed) != topic_id:
        return None  # damaged: not the base64 of 16 bytes (regression: test_torn_writes)
    return topic_id


def write_partition_topic_id(log_dir: Path, topic_id: str) -> None:
    """Record `topic_id` (KafkaStorageError when the directory cannot be written)."""
    write_atomically(
        log_dir / PARTITION_METADATA, f"version: 0\ntopic_id: {topic_id}\n", sync_dir=False
    )
