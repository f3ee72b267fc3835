"""What `odradek.spark` does differently inside a PySpark Python worker (`odradek.spark.worker`),
each case in a fresh interpreter whose main module is named as PySpark's daemon names its
workers':

* it is imported (to unpickle the data source) without kio's optional import of hypothesis
  (0.35 s of CPU per worker, and per streaming query start, whose driver-side runner is a fresh
  worker); any other process importing it keeps hypothesis;
* the worker's heap is frozen for the collector once, at the end of its first task; any other
  process's never is."""

from __future__ import annotations

import subprocess
import sys

SPEC = """
import importlib.machinery, sys
if sys.argv[1] != "-":
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec(sys.argv[1], None)
"""

IMPORTS = """
import odradek.spark
print("kio" in sys.modules, repr(sys.modules.get("hypothesis", "absent"))[:30])
"""

FREEZE = """
import gc
from odradek.spark.worker import freeze_heap_once
first = freeze_heap_once()
frozen = gc.get_freeze_count()
second = freeze_heap_once()
print(first, frozen > 1000, second, gc.get_freeze_count() == frozen)
"""


def _run_as(main_module: str, program: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SPEC + program, main_module],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def _after_import(main_module: str) -> tuple[bool, str]:
    kio, hypothesis = _run_as(main_module, IMPORTS).split(" ", 1)
    return kio == "True", hypothesis


def test_a_pyspark_worker_skips_hypothesis() -> None:
    kio, hypothesis = _after_import("pyspark.daemon")
    assert kio  # the check below means something: kio was imported
    assert hypothesis == "None"


def test_other_processes_keep_it() -> None:
    for main_module in ("-", "my_pipeline"):
        kio, hypothesis = _after_import(main_module)
        assert kio
        assert hypothesis.startswith("<module 'hypothesis'"), (main_module, hypothesis)


def test_a_worker_freezes_its_heap_once() -> None:
    assert _run_as("pyspark.daemon", FREEZE).split() == ["True", "True", "False", "True"]


def test_other_processes_never_freeze() -> None:
    for main_module in ("-", "my_pipeline"):
        assert _run_as(main_module, FREEZE).split() == ["False", "False", "False", "True"]
