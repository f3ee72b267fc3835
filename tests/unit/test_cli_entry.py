"""The `odradek` command and `python -m odradek.cli.main` start without importing hypothesis,
which kio would otherwise import for its test strategies (a third of a broker's start-up CPU):
each is run as a user runs it, with Python's import log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _imported(argv: list[str]) -> set[str]:
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60, check=True)
    # -X importtime lines: "import time: self | cumulative | <indent>module"
    return {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_python_dash_m_skips_hypothesis() -> None:
    imported = _imported([sys.executable, "-X", "importtime", "-m", "odradek.cli.main"])
    assert "kio.static._phantom" in imported  # the check below means something
    assert "hypothesis" not in imported


def test_console_script_skips_hypothesis() -> None:
    script = Path(sys.executable).parent / "odradek"
    if not script.exists():
        pytest.fail(f"no console script at {script}: `./dev setup` installs it")
    imported = _imported([sys.executable, "-X", "importtime", str(script)])
    assert "kio.static._phantom" in imported
    assert "hypothesis" not in imported


def test_without_the_guard_kio_would_import_it() -> None:
    imported = _imported(
        [sys.executable, "-X", "importtime", "-c",
         "import sys; from odradek.cli.main import main; sys.exit(main())"]
    )  # fmt: skip
    assert "hypothesis" in imported
