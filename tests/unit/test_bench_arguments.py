"""The Spark benches refuse bad arguments with one line and exit status 2, before they start a
cluster or a SparkSession."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize(
    ("script", "arguments", "message"),
    [
        (
            "spark_read.py",
            ["--write-records", "-1"],
            "--write-records must be 0 (no write) or more",
        ),
        ("spark_read.py", ["--rounds", "0"], "--rounds must be at least 1"),
        ("spark_streaming_latency.py", ["--conf", "nope"], "--conf takes KEY=VALUE, got 'nope'"),
        ("spark_streaming_latency.py", ["--conf", "=x"], "--conf takes KEY=VALUE, got '=x'"),
    ],
)
def test_a_bad_argument_is_one_line(script: str, arguments: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BENCH,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(message)
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
