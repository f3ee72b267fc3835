"""Which log directories have failed, and who must hear about it (Kafka's LogDirFailureChannel).

KIP-112: a broker with several `log.dirs` (JBOD) survives the failure of one of them. Any I/O error
while reading or writing a file of a log directory — a segment append, an fsync, a roll, an index
or a checkpoint write, a directory that went read-only or filled up — takes the whole directory
offline, not just the partition that hit it: the disk under it is no longer trusted. From then on:

1. every operation on a log of that directory raises `KafkaStorageError` before touching a file
   (`Log` asks `has_offline_log_dir` first), so nothing is acknowledged that could not be
   persisted and no half-written state is built on;
2. the listener the broker registered (`on_offline`) is called once per directory; the broker's
   handler stops the directory's partitions (leaders and followers), drops its logs from the log
   manager, tells the controller through `/log_dir_event_notification` and halts the broker if no
   directory is left;
3. the directory stays offline until the broker restarts (Kafka has no way back either: the
   operator fixes or replaces the disk and restarts the broker, whose replicas then recover by
   truncation and catch-up).

Running out of file descriptors (EMFILE, ENFILE) is not such an error: the operation fails with
`KafkaStorageError` and a message naming the limit to raise, and the directory stays online
(fd_limit). The segment writes files only once every descriptor an append needs is open
(`LogSegment.append`), so a refused open leaves nothing half-written.

Concurrency: event loop thread only. `maybe_add_offline_log_dir` may be called from inside any log
operation, so the listener must not call back into the log layer synchronously: the broker's
listener only schedules its handler on the loop.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from odradek.errors import KafkaStorageError
from odradek.log.fd_limit import descriptor_limit_message, is_descriptor_exhaustion

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def _key(log_dir: Path | str) -> str:
    return os.path.abspath(log_dir)


class LogDirFailureChannel:
    """The set of offline log directories and the listener told of each new one."""

    def __init__(self, on_offline: Callable[[Path], None] | None = None) -> None:
        self.on_offline = on_offline
        self._offline: dict[str, str] = {}

    def maybe_add_offline_log_dir(self, log_dir: Path | str, message: str) -> bool:
        """Take `log_dir` offline (once); returns whether it was online until now."""
        key = _key(log_dir)
        if key in self._offline:
            return False
        self._offline[key] = message
        logger.error("log directory %s is offline: %s", key, message)
        if self.on_offline is not None:
            self.on_offline(Path(key))
        return True

    def has_offline_log_dir(self, log_dir: Path | str) -> bool:
        return bool(self._offline) and _key(log_dir) in self._offline

    @property
    def offline_log_dirs(self) -> list[Path]:
        return [Path(d) for d in self._offline]

    def reason(self, log_dir: Path | str) -> str | None:
        return self._offline.get(_key(log_dir))


def is_io_failure(error: BaseException) -> bool:
    """Did this error come from the file system (and so condemn its directory)? Running out of
    file descriptors (EMFILE, ENFILE) did not: the disk is fine (fd_limit)."""
    if is_descriptor_exhaustion(error):
        return False
    if isinstance(error, OSError):
        return True
    cause = error.__cause__
    return isinstance(cause, OSError)


def storage_errors(method: Callable[P, R]) -> Callable[P, R]:
    """Decorates `Log` methods: translate OSError into KafkaStorageError at the log's boundary,
    and apply KIP-112: a log whose directory is offline refuses every operation, and an I/O
    error takes the directory offline."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        # Duck-typed (a method of `Log`, whose instances carry these two attributes; a
        # classmethod's first argument, the class, does not).
        log: Any = args[0] if args and hasattr(args[0], "failure_channel") else None
        channel: LogDirFailureChannel | None = log.failure_channel if log is not None else None
        if channel is not None and log is not None and channel.has_offline_log_dir(log.parent_dir):
            raise KafkaStorageError(f"{log}: log directory {log.parent_dir} is offline")
        try:
            return method(*args, **kwargs)
        except OSError as e:
            if is_descriptor_exhaustion(e):
                # Not a disk fault: the operation fails (KAFKA_STORAGE_ERROR, which clients
                # retry) and the directory stays online.
                message = f"{method.__qualname__}: {descriptor_limit_message(e)}"
                raise KafkaStorageError(message) from e
            error = KafkaStorageError(f"I/O error in {method.__qualname__}: {e}")
            if channel is not None and log is not None:
                channel.maybe_add_offline_log_dir(log.parent_dir, str(error))
            raise error from e
        except KafkaStorageError as e:
            if channel is not None and log is not None and is_io_failure(e):
                channel.maybe_add_offline_log_dir(log.parent_dir, str(e))
            raise

    return wrapper
