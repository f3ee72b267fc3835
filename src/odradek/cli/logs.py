"""Where a broker process logs: standard error, or a size-rotated log file.

`odradek server --log-file PATH` writes the log to PATH through `BrokerLogHandler`, a
`RotatingFileHandler`: when the file would grow past `broker.log.max.bytes` (100 MiB by default;
0 never rotates) it becomes `PATH.1`, `PATH.1` becomes `PATH.2`, ... and the oldest beyond
`broker.log.backup.count` (10) is deleted -- the size-based equivalent of the log4j appender Kafka
configures for `server.log`. Without `--log-file` the log goes to standard error, as before.

A local cluster's broker also has its standard output and error appended to the same file (a
crash's traceback, the one-line `odradek: error: ...`). When the handler rotates the file and the
process's stdout/stderr pointed at it, they are pointed at the new file too (`os.dup2`), so that
nothing keeps being written into `PATH.1`.

Concurrency: logging's own lock serialises records and rotation; called from any thread.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import sys
from pathlib import Path

LOG_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"


class BrokerLogHandler(logging.handlers.RotatingFileHandler):
    """A size-rotated log file that takes the process's stdout/stderr along when it rotates."""

    def __init__(self, path: Path, max_bytes: int, backup_count: int) -> None:
        super().__init__(path, maxBytes=max_bytes, backupCount=backup_count, encoding="utf-8")

    def doRollover(self) -> None:
        redirected = self._standard_streams_on_this_file()
        super().doRollover()
        if self.stream is None or not redirected:
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for fd in redirected:
            with contextlib.suppress(OSError):
                os.dup2(self.stream.fileno(), fd)

    def _standard_streams_on_this_file(self) -> list[int]:
        """The descriptors among 1 and 2 that refer to the file being rotated."""
        if self.stream is None:
            return []
        try:
            current = os.fstat(self.stream.fileno())
        except OSError:
            return []
        same = []
        for fd in (1, 2):
            try:
                info = os.fstat(fd)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) == (current.st_dev, current.st_ino):
                same.append(fd)
        return same


def configure_logging(
    level: str = "INFO",
    log_file: Path | None = None,
    max_bytes: int = 0,
    backup_count: int = 0,
) -> None:
    """Log at `level` to standard error, or to `log_file` rotated by size (see the module doc)."""
    handler: logging.Handler
    if log_file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = BrokerLogHandler(log_file, max_bytes, backup_count)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    logging.getLogger("kazoo").setLevel(logging.WARNING)
