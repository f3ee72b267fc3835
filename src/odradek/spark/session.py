"""A local SparkSession set up for Odradek pipelines, tests and benchmarks.

PySpark starts Python worker processes with whatever `python3` is first on the PATH unless told
otherwise; those workers then cannot import `odradek`, `confluent_kafka` or `pyarrow` from the
project's virtualenv and every task fails with an ImportError far from its cause. So
`local_session` points `PYSPARK_PYTHON` and `PYSPARK_DRIVER_PYTHON` at this interpreter before the
JVM starts (the JVM reads them once, at launch), and applies a local configuration that suits one
small machine: few shuffle partitions, no web UI, everything bound to 127.0.0.1, quiet logs.

Streaming checkpoints: Spark's default checkpoint file manager renames through Hadoop's
`FileContext`, which on a local disk -- without Hadoop's native library, which PySpark does not
ship -- starts a `readlink` process for each side of each rename and a `chmod` for each file it
creates: about twenty processes per micro-batch for the offset and commit logs, which then took
104-125 ms of each micro-batch on a busy two-core machine (29-39 ms without them), and more for a
stateful query's state files.
`use_file_system_checkpoints` switches a session to Spark's `FileSystem`-based manager, which
renames with one `rename(2)` (one `chmod` per file remains). `local_session` applies it unless told
otherwise; a session made elsewhere (`spark-submit`) can call it.

Concurrency: call from the main thread, before any other SparkSession exists in this process (a
second call returns the running session with the given conf applied where Spark allows it).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "CHECKPOINT_MANAGER_KEY",
    "LOCAL_CONF",
    "local_session",
    "use_file_system_checkpoints",
]

CHECKPOINT_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
# Spark 4.x keeps it in `checkpointing`; earlier releases one package up.
_FILE_SYSTEM_CHECKPOINT_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)

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
    use_file_system_checkpoints(spark)  # keeps a manager `conf` named
    register(spark)
    return spark


def use_file_system_checkpoints(spark: SparkSession) -> str | None:
    """Make `spark`'s streaming queries write checkpoints through Spark's `FileSystem`-based
    checkpoint file manager, unless the session already names one; returns the class in use
    (None if this Spark has neither known name).

    That manager relies on the file system's `rename` being atomic, as it is on a local disk and
    on HDFS -- the same assumption Spark makes for any file system without a `FileContext`.
    Applies to queries started afterwards.
    """
    chosen = spark.conf.get(CHECKPOINT_MANAGER_KEY, None)
    if chosen:
        return chosen
    for name in _FILE_SYSTEM_CHECKPOINT_MANAGERS:
        if spark._jvm.org.apache.spark.util.Utils.classIsLoadable(name):  # type: ignore[union-attr]
            spark.conf.set(CHECKPOINT_MANAGER_KEY, name)
            return name
    return None


def _conf_value(value: str | int | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
