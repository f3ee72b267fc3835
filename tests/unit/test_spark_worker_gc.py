"""A PySpark worker's heap is frozen for the collector once, at the end of its first read task
(`odradek.spark.worker`); any other process's is never. Each case runs in a fresh interpreter
whose main module is named as PySpark's daemon names its workers'."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import gc, importlib.machinery, sys
if sys.argv[1] != "-":
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec(sys.argv[1], None)
from odradek.spark.worker import freeze_heap_once
first = freeze_heap_once()
frozen = gc.get_freeze_count()
second = freeze_heap_once()
print(first, frozen > 1000, second, gc.get_freeze_count() == frozen)
"""


def _run(main_module: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, main_module],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.split()


def test_a_worker_freezes_once() -> None:
    assert _run("pyspark.daemon") == ["True", "True", "False", "True"]


def test_other_processes_never_freeze() -> None:
    for main_module in ("-", "my_pipeline"):
        assert _run(main_module) == ["False", "False", "False", "True"]
