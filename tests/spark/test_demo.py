"""The README's demo, run as a user runs it: `python -m odradek.demo` end to end (its own cluster
and SparkSession, the broker kill and restart, the final check), asserting its PASS line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

DEMO_TIMEOUT_S = 900  # the demo's own deadlines fail it well before this


def test_demo_passes(tmp_path: Path) -> None:
    demo = subprocess.run(
        [sys.executable, "-m", "odradek.demo", f"--dir={tmp_path / 'demo'}"],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        check=False,
    )
    output = demo.stdout
    lines = output.splitlines()
    report = f"demo output:\n{output}\nstderr:\n{demo.stderr[-3000:]}"
    assert demo.returncode == 0, report
    assert any("] PASS: nothing lost, nothing doubled" in line for line in lines), report
    # The kill and the restart happened, and the progress lines were the demo's own.
    assert any("5. SIGKILL broker" in line for line in lines), report
    assert any("restarting broker" in line for line in lines), report
    assert all(line.startswith("[demo ") for line in lines), report
    # The web console ran beside the cluster and its URL was printed for the user.
    assert any("web console: http://127.0.0.1:" in line for line in lines), report
    assert "Exception" not in demo.stderr, report
