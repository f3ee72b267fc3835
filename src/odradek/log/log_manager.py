"""The broker's logs across its log directories: start-up, creation, deletion, checkpoints, shutdown.

Start-up, per log directory (`startup`):
  1. lock the directory (`.lock`, an advisory flock) so two brokers never share it;
  2. note whether `.kafka_cleanshutdown` exists: it decides whether logs are recovered;
  3. read `recovery-point-offset-checkpoint` and `log-start-offset-checkpoint` (an unreadable file
     is logged and treated as empty: every log is then recovered from offset 0, which is slow but
     safe);
  4. remove `*-delete` directories left by a deletion that a crash interrupted;
  5. open every `<topic>-<partition>` directory as a `Log` (lazily after a clean shutdown);
  6. only then remove the marker, so a crash during start-up recovers again next time.

Shutdown (`shutdown`), in the order that makes a crash at any step safe:
  1. flush every log (fsync; recovery points reach the log end offsets);
  2. write both checkpoints;
  3. close every log;
  4. write the clean shutdown marker last: if the broker dies before it, the next start-up
     recovers, which is merely slower.

Failed directories (KIP-112, `log_dir_failure`): an I/O error in a directory at start-up leaves
that directory out (offline) and the others load; an I/O error later, in any log or checkpoint of
a directory, takes it offline through the failure channel, and the broker's handler calls
`handle_log_dir_failure`, which forgets its logs (their files are closed without a write). New
logs go only to live directories; a log that is not new (`is_new=False`: the controller says the
replica existed) is not created afresh while some directory is offline, since its data may be
there (KAFKA_STORAGE_ERROR instead, as Kafka). Nothing is ever written into an offline directory
again, not even the clean-shutdown marker, so its logs are recovered at the next start-up.

Log cleaner. When the broker runs one (`set_cleaner`: odradek.log.log_cleaner), the log manager
tells it about truncations (through each log's `on_truncate`) and deletions, and retention skips
a log while it is being cleaned (Kafka pauses one for the other too); the next retention pass
takes it.

Deletion (`delete_log`) closes the log, renames its directory to `<topic>-<p>.<uuid>-delete` (an
atomic step after which the partition is gone even if removal is interrupted), removes it, and
rewrites that directory's checkpoints so that a recreated topic of the same name does not inherit
the old offsets. Kafka delays the removal by file.delete.delay.ms for readers that still hold the
files; here reads copy bytes synchronously on the same thread, so nobody can.

Concurrency: not thread-safe. Every method is called from the broker's event loop thread
(`startup` before the broker serves requests, `shutdown` after it stops). Lock order when a
partition is involved: partition before log manager before log.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from odradek.errors import KafkaStorageError, OperatorError
from odradek.log.checkpoints import OffsetCheckpointFile, TopicPartition, fsync_dir
from odradek.log.config import LogConfig
from odradek.log.fd_limit import is_descriptor_exhaustion
from odradek.log.log import Log
from odradek.log.log_dir_failure import LogDirFailureChannel, is_io_failure
from odradek.log.meta_properties import check_meta_properties
from odradek.log.naming import (
    CLEAN_SHUTDOWN_FILE,
    FUTURE_DIR_SUFFIX,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    child_path,
    delete_dir_name,
    is_delete_dir_name,
    log_dir_name,
    parse_log_dir_name,
)

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"


class CleanerHooks(Protocol):
    """What the log manager tells the log cleaner (`odradek.log.log_cleaner.LogCleaner`)."""

    def is_cleaning(self, topic_partition: TopicPartition) -> bool: ...

    def on_truncate(self, log: Log, offset: int) -> None: ...

    def on_delete(self, topic_partition: TopicPartition, log_dir: Path) -> None: ...


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class LogManager:
    """Owns every `Log` of the broker (see the module docstring for the protocols).

    Not thread-safe: called only from the broker's event loop thread; `startup` before requests
    are served, `shutdown` after serving stops. Its methods do synchronous file I/O (start-up
    recovery can take seconds after an unclean shutdown).
    """

    def __init__(
        self,
        log_dirs: Iterable[Path | str],
        default_config: LogConfig,
        topic_configs: Mapping[str, LogConfig] | None = None,
        failure_channel: LogDirFailureChannel | None = None,
    ) -> None:
        self.log_dirs = [Path(d) for d in log_dirs]
        self.failure_channel = failure_channel or LogDirFailureChannel()
        if not self.log_dirs:
            raise OperatorError("at least one log directory is needed (log.dirs)")
        self.default_config = default_config
        self._topic_configs: dict[str, LogConfig] = dict(topic_configs or {})
        self._logs: dict[TopicPartition, Log] = {}
        self._dir_of: dict[TopicPartition, Path] = {}
        self._log_counts: dict[Path, int] = {}
        self._loaded_dirs: list[Path] = []
        self._unsynced_dirs: set[Path] = set()
        self._lock_fds: dict[Path, int] = {}
        self._cleaner: CleanerHooks | None = None

    # -- start-up and shutdown ------------------------------------------------------------------

    def startup(self, now_ms: int | None = None) -> None:
        """Lock each log directory and open every log in it (steps in the module docstring)."""
        now_ms = _wall_clock_ms() if now_ms is None else now_ms
        for log_dir in self.log_dirs:
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
                self._lock(log_dir)
                self._load_dir(log_dir, now_ms)
            except OperatorError:
                raise
            except (OSError, KafkaStorageError) as e:
                if not is_io_failure(e):
                    raise
                self._forget_dir(log_dir)
                self.failure_channel.maybe_add_offline_log_dir(
                    log_dir, f"cannot load log directory {log_dir} at start-up: {e}"
                )
        if not self.live_log_dirs:
            raise OperatorError(
                f"none of the log directories {[str(d) for d in self.log_dirs]} could be loaded"
            )

    def _forget_dir(self, log_dir: Path) -> list[TopicPartition]:
        """Drop every log of `log_dir` (closing its files quietly) and stop using the directory."""
        keys = [key for key, d in self._dir_of.items() if d == log_dir]
        for key in keys:
            self._logs.pop(key).close_quietly()
            del self._dir_of[key]
        self._log_counts.pop(log_dir, None)
        self._unsynced_dirs.discard(log_dir)
        if log_dir in self._loaded_dirs:
            self._loaded_dirs.remove(log_dir)
        fd = self._lock_fds.pop(log_dir, None)
        if fd is not None:
            os.close(fd)  # releases the lock: the directory is not ours to use any more
        return keys

    def _load_dir(self, log_dir: Path, now_ms: int) -> None:
        """Load one directory's logs (steps 2-6 of the module docstring)."""
        marker = log_dir / CLEAN_SHUTDOWN_FILE
        clean_shutdown = marker.exists()
        recovery_points = self._read_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT)
        log_start_offsets = self._read_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT)
        opened = 0
        for entry in sorted(os.scandir(log_dir), key=lambda e: e.name):
            if not entry.is_dir():
                continue
            path = child_path(log_dir, entry.name)
            if is_delete_dir_name(entry.name):
                logger.info("removing %s, a log whose deletion was interrupted", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            if entry.name.endswith(FUTURE_DIR_SUFFIX):
                logger.warning("ignoring %s: moving logs between directories is unsupported", path)
                continue
            key = parse_log_dir_name(entry.name)
            if key is None:
                logger.warning("ignoring %s: not a <topic>-<partition> directory", path)
                continue
            if key in self._logs:
                raise KafkaStorageError(
                    f"{key[0]}-{key[1]} has directories in both {self._dir_of[key]} and {log_dir}"
                )
            self._logs[key] = Log.open(
                path,
                self.config_for(key[0]),
                recovery_point=recovery_points.get(key, 0),
                log_start_offset=log_start_offsets.get(key, 0),
                clean_shutdown=clean_shutdown,
                now_ms=now_ms,
                failure_channel=self.failure_channel,
            )
            self._logs[key].on_truncate = self._on_truncate
            self._dir_of[key] = log_dir
            self._log_counts[log_dir] = self._log_counts.get(log_dir, 0) + 1
            opened += 1
        if clean_shutdown:
            marker.unlink()
            fsync_dir(log_dir)
        self._loaded_dirs.append(log_dir)
        logger.info(
            "loaded %d logs from %s (%s shutdown)",
            opened,
            log_dir,
            "clean" if clean_shutdown else "unclean",
        )

    def shutdown(self) -> None:
        """Flush, checkpoint, close, then mark each directory as cleanly shut down.

        A directory that fails on the way (or had failed before) gets no marker: its logs are
        recovered at the next start-up."""
        for log in self._logs.values():
            with contextlib.suppress(KafkaStorageError):
                log.flush()
        self.checkpoint_recovery_points_and_start_offsets()
        for log in self._logs.values():
            try:
                log.close()
            except KafkaStorageError:
                log.close_quietly()
        # Only directories this process locked and loaded: after a failed start-up (another broker
        # holds a directory, say) nothing may be written into a directory we do not own.
        for log_dir in self._loaded_dirs:
            if self.failure_channel.has_offline_log_dir(log_dir):
                continue
            marker = log_dir / CLEAN_SHUTDOWN_FILE
            try:
                with open(marker, "w") as file:
                    os.fsync(file.fileno())
                fsync_dir(log_dir)
            except OSError as e:
                logger.error("cannot mark %s as cleanly shut down: %s", log_dir, e)
        self._logs.clear()
        self._dir_of.clear()
        self._loaded_dirs.clear()
        for fd in self._lock_fds.values():
            os.close(fd)
        self._lock_fds.clear()

    def _lock(self, log_dir: Path) -> None:
        fd = os.open(log_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise OperatorError(
                f"log directory {log_dir} is in use by another broker process"
            ) from None
        self._lock_fds[log_dir] = fd

    @staticmethod
    def _read_checkpoint(path: Path) -> dict[TopicPartition, int]:
        try:
            return OffsetCheckpointFile(path).read()
        except KafkaStorageError as e:
            logger.warning("%s; recovering every log in %s from offset 0", e, path.parent)
            return {}

    # -- failed directories (KIP-112) -----------------------------------------------------------

    @property
    def live_log_dirs(self) -> list[Path]:
        """The directories in use: loaded at start-up and not failed since."""
        channel = self.failure_channel
        return [d for d in self._loaded_dirs if not channel.has_offline_log_dir(d)]

    def is_log_dir_online(self, log_dir: Path | str) -> bool:
        return not self.failure_channel.has_offline_log_dir(log_dir) and any(
            os.path.abspath(d) == os.path.abspath(log_dir) for d in self._loaded_dirs
        )

    def handle_log_dir_failure(self, log_dir: Path | str) -> list[TopicPartition]:
        """Forget the logs of a directory that went offline; returns their partitions.

        The caller (the broker's failure handler) has stopped the partitions first and halts
        the broker when `live_log_dirs` is empty afterwards."""
        target = os.path.abspath(log_dir)
        for candidate in list(self._loaded_dirs) + self.log_dirs:
            if os.path.abspath(candidate) == target:
                return self._forget_dir(candidate)
        return []

    def check_meta_properties(self, broker_id: int, cluster_id: str) -> None:
        """Check or write every live directory's `meta.properties` (see `meta_properties`): a
        directory of another broker or cluster stops the start-up (OperatorError); one whose
        file cannot be read, parsed or written goes offline; none left is an OperatorError."""
        for log_dir in self.live_log_dirs:
            try:
                check_meta_properties(log_dir, broker_id, cluster_id)
            except KafkaStorageError as e:
                if is_descriptor_exhaustion(e):
                    raise
                self._forget_dir(log_dir)
                self._mark_offline(log_dir, e)
        if not self.live_log_dirs:
            raise OperatorError(
                f"none of the log directories {[str(d) for d in self.log_dirs]} is usable"
            )

    def _mark_offline(self, log_dir: Path, error: BaseException) -> None:
        if is_descriptor_exhaustion(error):  # the disk is fine (fd_limit)
            logger.error("%s: %s", log_dir, error)
            return
        self.failure_channel.maybe_add_offline_log_dir(log_dir, str(error))

    # -- configs -------------------------------------------------------------------------------

    def config_for(self, topic: str) -> LogConfig:
        return self._topic_configs.get(topic, self.default_config)

    def update_config(self, topic: str, config: LogConfig) -> None:
        """Apply a topic's new config to its logs (and to logs created later)."""
        self._topic_configs[topic] = config
        for (log_topic, _), log in self._logs.items():
            if log_topic == topic:
                log.config = config

    def update_default_config(self, config: LogConfig) -> None:
        """Apply new broker-wide defaults to every log without a topic-level config."""
        self.default_config = config
        for (topic, _), log in self._logs.items():
            if topic not in self._topic_configs:
                log.config = config

    # -- logs ----------------------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def get_or_create_log(
        self,
        topic: str,
        partition: int,
        config: LogConfig | None = None,
        now_ms: int | None = None,
        *,
        is_new: bool = True,
    ) -> Log:
        """The partition's log, created empty in the live log directory holding the fewest
        logs when it does not exist yet. `config` (the topic's, if the caller knows it better
        than this manager) becomes the log's config, also for a log loaded at start-up: start-up
        opens logs before the topic configs are read from ZooKeeper, so without it a restarted
        broker would keep the broker defaults (a compacted topic would be neither cleaned nor
        spared by retention) until the topic's config next changed. A replica that is not new
        is not created while a directory is offline (its log may be in it): KafkaStorageError."""
        key = (topic, partition)
        log = self._logs.get(key)
        if log is not None:
            if config is not None and log.config != config:
                log.config = config
            return log
        offline = self.failure_channel.offline_log_dirs
        if offline and not is_new:
            raise KafkaStorageError(
                f"cannot create the log of {topic}-{partition}: log directories "
                f"{[str(d) for d in offline]} are offline and may hold it"
            )
        live = self.live_log_dirs
        if not live:
            raise KafkaStorageError(
                f"cannot create the log of {topic}-{partition}: no live log dir"
            )
        name = log_dir_name(topic, partition)
        log_dir = min(live, key=lambda d: self._log_counts.get(d, 0))
        try:
            log = Log.open(
                log_dir / name,
                config or self.config_for(topic),
                recovery_point=0,
                log_start_offset=0,
                clean_shutdown=True,
                now_ms=_wall_clock_ms() if now_ms is None else now_ms,
                failure_channel=self.failure_channel,
            )
        except KafkaStorageError as e:
            if is_io_failure(e):
                self._mark_offline(log_dir, e)
            raise
        log.on_truncate = self._on_truncate
        # The directory entry is made durable in batches (`sync_created_logs`): one fsync per
        # directory per LeaderAndIsr rather than one per partition, which for 10,000 new
        # partitions is the difference between a fraction of a second and tens of seconds.
        self._unsynced_dirs.add(log_dir)
        self._logs[key] = log
        self._dir_of[key] = log_dir
        self._log_counts[log_dir] = self._log_counts.get(log_dir, 0) + 1
        logger.debug("created log for %s-%d in %s", topic, partition, log_dir)
        return log

    def sync_created_logs(self) -> None:
        """fsync the directories in which logs were created since the last call."""
        dirs, self._unsynced_dirs = self._unsynced_dirs, set()
        for log_dir in dirs:
            try:
                fsync_dir(log_dir)
            except OSError as e:
                self._mark_offline(log_dir, e)

    def all_logs(self) -> list[Log]:
        return list(self._logs.values())

    def logs_by_partition(self) -> dict[TopicPartition, Log]:
        """Every log by (topic, partition) (a copy)."""
        return dict(self._logs)

    def set_cleaner(self, cleaner: CleanerHooks | None) -> None:
        self._cleaner = cleaner

    def _on_truncate(self, log: Log, offset: int) -> None:
        if self._cleaner is not None:
            self._cleaner.on_truncate(log, offset)

    def log_dir_of(self, topic: str, partition: int) -> Path | None:
        return self._dir_of.get((topic, partition))

    def delete_log(self, topic: str, partition: int) -> bool:
        """Remove a partition's log from disk; returns False if there was none."""
        key = (topic, partition)
        log = self._logs.get(key)
        if log is None:
            return False
        log_dir = self._dir_of[key]
        if self.failure_channel.has_offline_log_dir(log_dir):
            raise KafkaStorageError(f"cannot delete {topic}-{partition}: {log_dir} is offline")
        del self._logs[key], self._dir_of[key]
        self._log_counts[log_dir] -= 1
        if self._cleaner is not None:
            self._cleaner.on_delete(key, log_dir)
        log.close()
        doomed = log_dir / delete_dir_name(topic, partition)
        try:
            os.rename(log.dir, doomed)
            fsync_dir(log_dir)
            shutil.rmtree(doomed)
        except OSError as e:
            self._mark_offline(log_dir, e)
            raise KafkaStorageError(f"cannot delete the log of {topic}-{partition}: {e}") from e
        self._checkpoint_dir(log_dir)
        logger.info("deleted log for %s-%d", topic, partition)
        return True

    # -- periodic work -------------------------------------------------------------------------

    def checkpoint_recovery_points_and_start_offsets(self) -> None:
        """Write both offset checkpoints of every live log directory this process loaded (a
        directory whose write fails goes offline; the others are still written)."""
        for log_dir in self.live_log_dirs:
            with contextlib.suppress(KafkaStorageError):
                self._checkpoint_dir(log_dir)

    def _checkpoint_dir(self, log_dir: Path) -> None:
        if self.failure_channel.has_offline_log_dir(log_dir):
            raise KafkaStorageError(f"log directory {log_dir} is offline")
        logs = {key: log for key, log in self._logs.items() if self._dir_of[key] == log_dir}
        try:
            OffsetCheckpointFile(log_dir / RECOVERY_POINT_CHECKPOINT).write(
                {key: log.recovery_point for key, log in logs.items()}
            )
            OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT).write(
                {key: log.log_start_offset for key, log in logs.items()}
            )
        except KafkaStorageError as e:
            if is_io_failure(e):
                self._mark_offline(log_dir, e)
            raise

    def flush_all(self) -> None:
        """fsync every log up to its log end offset (advancing the recovery points); a log in
        a failing directory takes it offline and the others are still flushed."""
        for log in list(self._logs.values()):
            with contextlib.suppress(KafkaStorageError):
                log.flush()

    def remove_expired_producers(self, now_ms: int | None = None) -> int:
        """Forget, in every log, producers idle longer than producer.id.expiration.ms (and
        with no open transaction); returns how many."""
        now_ms = _wall_clock_ms() if now_ms is None else now_ms
        return sum(
            log.producer_state.remove_expired_producers(now_ms) for log in self._logs.values()
        )

    def cleanup(
        self,
        now_ms: int | None = None,
        high_watermark_of: Callable[[str, int], int | None] | None = None,
        on_deleted: Callable[[str, int], None] | None = None,
    ) -> int:
        """Apply retention to every log; returns the number of segments deleted.

        `high_watermark_of(topic, partition)` (from the replica manager) keeps segments holding
        offsets at or above a partition's high watermark; None means no such limit.
        `on_deleted(topic, partition)` is told of each log that lost segments (its log start
        offset moved).
        """
        now_ms = _wall_clock_ms() if now_ms is None else now_ms
        deleted = 0
        for (topic, partition), log in list(self._logs.items()):
            if self._cleaner is not None and self._cleaner.is_cleaning((topic, partition)):
                continue
            high_watermark = (
                None if high_watermark_of is None else high_watermark_of(topic, partition)
            )
            try:
                count = log.delete_retention_segments(now_ms, high_watermark)
            except KafkaStorageError:
                logger.exception("retention failed for %s-%d", topic, partition)
                continue
            deleted += count
            if count and on_deleted is not None:
                on_deleted(topic, partition)
        return deleted
