"""A bench's scratch directory: created under the system's temporary directory and removed when
the bench exits, so that repeated runs do not fill the disk (a failover or security run leaves
gigabytes of logs). Benches that take `--dir` keep what is written there."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path


def temporary_directory(prefix: str) -> Path:
    """A new directory, removed at the interpreter's exit (after the bench's own clean-up has
    stopped its brokers)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
