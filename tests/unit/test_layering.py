"""The package layering of DESIGN.md §9 holds: `lint-imports` (import-linter) checks the contracts
in pyproject.toml. Run here so that CI enforces them with the rest of the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    executable = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert executable is not None, "import-linter is not installed (./dev setup installs it)"
    result = subprocess.run(
        [executable, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
