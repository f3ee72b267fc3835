"""One SparkSession for every test in tests/spark (starting one costs 10-30 s).

`local[2,3]`: two cores, and a failed task is tried up to three times -- in plain `local[2]` Spark
never retries a task, whatever `spark.task.maxFailures` says, and the sink tests need retries.
Spark's own Kafka connector (`format("kafka")`) is on the session's classpath (`spark.jars`, from
the jar cache `./dev setup` fills; see `odradek.spark.connector`) for the tests that compare the
two; without the cache the session starts without it and those tests fail saying so.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from odradek.errors import OperatorError
from odradek.spark.connector import connector_jars
from odradek.spark.session import local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TASK_ATTEMPTS = 3


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    try:
        jars = {"spark.jars": ",".join(connector_jars())}
    except OperatorError:
        jars = {}  # the tests that need the connector fail through `kafka_connector`
    session = local_session("odradek-spark-tests", master=f"local[2,{TASK_ATTEMPTS}]", **jars)
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


@pytest.fixture
def kafka_connector(spark: SparkSession) -> None:
    """Fails the test, saying what to run, when Spark's Kafka connector is not in the jar cache
    (the session then started without it and `format("kafka")` would be unknown)."""
    try:
        connector_jars()
    except OperatorError as e:
        pytest.fail(str(e))
