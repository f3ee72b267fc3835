"""A PySpark Python worker imports `odradek.spark` (to unpickle the data source) without kio's
optional import of hypothesis (0.35 s of CPU per worker, and per streaming query start, whose
driver-side runner is a fresh worker); any other process importing it keeps hypothesis. Each case
runs in a fresh interpreter whose main module is named as PySpark's daemon names its workers'."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import importlib.machinery, sys
if sys.argv[1] != "-":
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec(sys.argv[1], None)
import odradek.spark
print("kio" in sys.modules, repr(sys.modules.get("hypothesis", "absent"))[:30])
"""


def _after_import(main_module: str) -> tuple[bool, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, main_module],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    kio, hypothesis = done.stdout.strip().split(" ", 1)
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
