"""The `odradek` command's entry point (pyproject's console script), light enough to run before
anything imports kio.

kio imports hypothesis, when it is installed, only to register strategies for its types in
property tests. No `odradek` process uses them, and the import (hypothesis pulls in pytest and
trio's testing module) was about a third of a broker's start-up CPU: 0.35-0.45 s of the ~1.1 s
its imports took here. `without_test_strategies` makes that import fail as if hypothesis were not
installed, which kio handles; a process that already imported hypothesis (a test run calling
`odradek.cli.main.main` in-process) keeps it. `python -m odradek.cli.main`, how local clusters
start their brokers, does the same first.
"""

from __future__ import annotations

import sys


def without_test_strategies() -> None:
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]


def main() -> int:
    without_test_strategies()
    from odradek.cli.main import main as run

    return run()
