"""What the data source does differently inside PySpark's Python workers.

A reused worker (PySpark's default, `spark.python.worker.reuse`) runs a full `gc.collect()` after
every task (`pyspark.daemon`). Once `odradek.spark`, PyArrow and confluent-kafka are imported, a
worker tracks ~50,000 objects -- modules, classes, functions that live as long as the process --
and that collection took 20-85 ms per task on a busy two-core machine (median 49 ms over the 121
tasks of one `bench/spark_read.py` run), in the worker, before it takes its next task.
`freeze_heap_once` moves the objects alive at the end of the first task into the collector's
permanent generation (`gc.freeze()`), so later collections look only at what later tasks create.
Objects frozen are still freed when unreferenced; only a reference cycle among them would stay,
which is bounded by what one task holds at its end.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["freeze_heap_once", "in_pyspark_worker"]

_frozen = False


def in_pyspark_worker() -> bool:
    """Whether this process is one of PySpark's Python workers (its main module is PySpark's:
    `pyspark.daemon` and the workers it forks, or a worker started on its own)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and str(spec.name).startswith("pyspark.")


def freeze_heap_once() -> bool:
    """In a PySpark worker, the first call freezes the collector's view of the heap; any other
    call, and any call outside a worker, does nothing. Returns whether this call froze it."""
    global _frozen
    if _frozen or not in_pyspark_worker():
        return False
    _frozen = True
    gc.freeze()
    return True
