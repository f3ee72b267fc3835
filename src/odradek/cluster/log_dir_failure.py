"""The replica manager's side of a failed log directory (Kafka's ReplicaManager.handleLogDirFailure).

Called by the broker's handler (`odradek.server.log_dir_failure`) once per directory, after the
failure channel took it offline. Steps, in this order so that no request sees a half-stopped
partition:

1. stop fetching for every partition of the directory (a follower's fetcher would otherwise keep
   failing appends);
2. mark each partition offline: requests for it get KAFKA_STORAGE_ERROR from now on (produce,
   fetch, ListOffsets, LeaderAndIsr, StopReplica), and every produce waiting for acks=all fails
   with KAFKA_STORAGE_ERROR — an append the leader could not persist is never acknowledged;
3. make the log manager forget the directory's logs (their files are closed without a write).

The caller then tells the controller (`/log_dir_event_notification`), which moves leadership to
other ISR members and marks these replicas offline, and halts the broker if no directory is left.

Concurrency: event loop thread only, like the replica manager.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from odradek.errors import KafkaStorageError

if TYPE_CHECKING:
    from odradek.cluster.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def handle_log_dir_failure(
    replica_manager: ReplicaManager, log_dir: Path | str
) -> list[TopicPartition]:
    """Stop every partition of the failed `log_dir` (steps in the module docstring); returns
    them, sorted."""
    target = os.path.abspath(log_dir)
    in_dir = [
        key
        for key, partition in replica_manager.partitions.items()
        if partition.log is not None and os.path.abspath(partition.log.dir.parent) == target
    ]
    # 1. no more fetching
    if replica_manager.fetcher_manager is not None:
        replica_manager.fetcher_manager.remove_partitions(in_dir)
    # 2. offline: waiters fail, requests get KAFKA_STORAGE_ERROR
    for key in in_dir:
        partition = replica_manager.partitions.pop(key)
        partition.make_offline(
            KafkaStorageError(f"{key[0]}-{key[1]}: log directory {target} is offline")
        )
        replica_manager.offline_partitions.add(key)
    # 3. the log manager forgets the directory's logs (also those no partition hosts yet)
    forgotten = replica_manager.log_manager.handle_log_dir_failure(target)
    replica_manager.offline_partitions.update(forgotten)
    stopped = sorted(set(in_dir) | set(forgotten))
    log.error(
        "log directory %s failed: stopped %d partitions (%s%s)",
        target,
        len(stopped),
        ", ".join(f"{t}-{p}" for t, p in stopped[:10]),
        ", ..." if len(stopped) > 10 else "",
    )
    return stopped
