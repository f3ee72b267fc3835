"""A local SparkSession set up for Odradek pipelines, tests and benchmarks.

PySpark starts Python worker processes with whatever `python3` is first on the PATH unless told
otherwise; those workers then cannot import `odradek`, `confluent_kafka` or `pyarrow` from the
project's virtualenv and every task fails with an ImportError far from its cause. So
`local_session` points `PYSPARK_PYTHON` and `PYSPARK_DRIVER_PYTHON` at this interpreter before the
JVM starts (the JVM reads them once, at launch), and applies a local configuration that suits one
small machine: few shuffle partitions, no web UI, everything bound to 127.0.0.1, quiet logs.

Concurrency: call from the main thread, before any other SparkSession exists in this process (a
second call returns the running session with the given conf applied where Spark allows it).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LOCAL_CONF", "local_session"]

# Every value can be overridden through `local_session(**conf)`.
LOCAL_CONF: dict[str, str] = {
    # Two cores on the machines this project targets: a shuffle of 200 partitions would spend
    # most of a micro-batch scheduling empty tasks.
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # A streaming query's stop() would otherwise wait indefinitely for a batch in flight.
    "spark.sql.streaming.stopTimeout": "60s",
    "spark.sql.session.timeZone": "UTC",
    "spark.log.level": "WARN",
}


def _conf_key(keyword: str) -> str:
    """`sql_shuffle_partitions` -> `spark.sql.shuffle.partitions`; dotted keys pass unchanged."""
    if "." in keyword:
        return keyword
    key = keyword.replace("_", ".")
    return key if key.startswith("spark.") else f"spark.{key}"


def local_session(
    app_name: str, master: str = "local[2]", **conf: str | int | bool
) -> SparkSession:
    """A SparkSession on `master` whose Python workers run this interpreter.

    `conf` keys are Spark properties, either with underscores for dots and the `spark.` prefix
    left out (`sql_shuffle_partitions=4`, `task_maxFailures=4`) or passed as a dict with their
    real names (`**{"spark.task.maxFailures": "4"}`). The data source is registered on the
    session before it is returned (see `odradek.spark.register`).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Spark binds its block manager and RPC endpoints to the address this resolves to.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from pyspark.sql import SparkSession

    from odradek.spark import register

    builder = SparkSession.builder.appName(app_name).master(master)
    settings = {**LOCAL_CONF, **{_conf_key(k): _conf_value(v) for k, v in conf.items()}}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def _conf_value(value: str | int | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
