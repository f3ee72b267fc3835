"""The broker's log file: rotated by size, with stdout/stderr following the file it rotates."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from odradek.cli.logs import BrokerLogHandler
from odradek.server.config import KafkaConfig


def test_rotates_by_size_and_keeps_backup_count_files(tmp_path: Path) -> None:
    path = tmp_path / "broker.log"
    handler = BrokerLogHandler(path, max_bytes=200, backup_count=2)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("test.broker_log.rotation")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        for i in range(40):
            logger.warning("record %02d %s", i, "x" * 30)
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broker.log",
        "broker.log.1",
        "broker.log.2",
    ]
    assert all(p.stat().st_size <= 200 for p in tmp_path.iterdir())
    assert "record 39" in path.read_text()


def test_stdout_and_stderr_follow_the_file_across_a_rotation(tmp_path: Path) -> None:
    """As in a local cluster: the child's stderr is the log file; after a rotation, what it
    prints lands in the new file, not in broker.log.1."""
    path = tmp_path / "broker.log"
    script = textwrap.dedent(
        f"""
        import logging, sys
        from pathlib import Path
        from odradek.cli.logs import configure_logging
        configure_logging("INFO", Path({str(path)!r}), 300, 3)
        log = logging.getLogger("odradek.test")
        for i in range(20):
            log.info("line %d %s", i, "y" * 40)
        print("printed after the rotations", file=sys.stderr, flush=True)
        """
    )
    with open(path, "ab") as out:
        subprocess.run(
            [sys.executable, "-c", script],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    assert (tmp_path / "broker.log.1").exists()
    assert "printed after the rotations" in path.read_text()
    assert "printed after the rotations" not in (tmp_path / "broker.log.1").read_text()


def test_rotation_properties_and_their_defaults() -> None:
    defaults = KafkaConfig({"broker.id": "1", "zookeeper.connect": "z:2181"})
    assert defaults["broker.log.max.bytes"] == 100 * 1024 * 1024
    assert defaults["broker.log.backup.count"] == 10
    set_ = KafkaConfig(
        {
            "broker.id": "1",
            "zookeeper.connect": "z:2181",
            "broker.log.max.bytes": "1048576",
            "broker.log.backup.count": "3",
        }
    )
    assert (set_["broker.log.max.bytes"], set_["broker.log.backup.count"]) == (1048576, 3)
