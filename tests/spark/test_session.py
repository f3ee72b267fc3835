"""`local_session` makes streaming queries checkpoint through Spark's `FileSystem`-based file
manager, which renames without starting `readlink` processes (see `odradek.spark.session`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from odradek.spark.session import CHECKPOINT_MANAGER_KEY, local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_streaming_checkpoints_go_through_the_file_system_manager(
    spark: SparkSession, tmp_path: Path
) -> None:
    chosen = spark.conf.get(CHECKPOINT_MANAGER_KEY, None)
    assert chosen and chosen.endswith(".FileSystemBasedCheckpointFileManager")
    # The manager Spark itself builds for a checkpoint directory, as a query's logs do.
    jvm = spark._jvm
    assert jvm is not None
    factory = jvm
    for part in chosen.rsplit(".", 1)[0].split("."):
        factory = getattr(factory, part)
    manager = factory.CheckpointFileManager.create(
        jvm.org.apache.hadoop.fs.Path(tmp_path.as_uri()),
        spark._jsparkSession.sessionState().newHadoopConf(),
    )
    assert manager.getClass().getName() == chosen


def test_a_manager_the_caller_names_is_kept(spark: SparkSession) -> None:
    # local_session's second call returns the running session with `conf` applied.
    mine = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
    chosen = spark.conf.get(CHECKPOINT_MANAGER_KEY)
    try:
        again = local_session("odradek-spark-tests", **{CHECKPOINT_MANAGER_KEY: mine})
        assert again.conf.get(CHECKPOINT_MANAGER_KEY) == mine
    finally:
        spark.conf.set(CHECKPOINT_MANAGER_KEY, chosen)
