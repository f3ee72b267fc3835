"""One SparkSession for every test in tests/spark (starting one costs 10-30 s).

`local[2,3]`: two cores, and a failed task is tried up to three times -- in plain `local[2]` Spark
never retries a task, whatever `spark.task.maxFailures` says, and the sink tests need retries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from odradek.spark.session import local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TASK_ATTEMPTS = 3


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session("odradek-spark-tests", master=f"local[2,{TASK_ATTEMPTS}]")
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()
