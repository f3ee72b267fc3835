"""`use_file_system_checkpoints` picks the first checkpoint file manager this Spark can load,
and never replaces one the session already names. The session is a stand-in here; the real one
is checked in tests/spark/test_session.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from odradek.spark.session import CHECKPOINT_MANAGER_KEY, use_file_system_checkpoints

NEW = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
OLD = "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"


class Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


def session(loadable: set[str], conf: dict[str, str] | None = None) -> Any:
    utils = SimpleNamespace(classIsLoadable=lambda name: name in loadable)
    jvm = SimpleNamespace(
        org=SimpleNamespace(
            apache=SimpleNamespace(spark=SimpleNamespace(util=SimpleNamespace(Utils=utils)))
        )
    )
    return SimpleNamespace(conf=Conf(dict(conf or {})), _jvm=jvm)


def test_the_current_package_first() -> None:
    spark = session({NEW, OLD})
    assert use_file_system_checkpoints(spark) == NEW
    assert spark.conf.values == {CHECKPOINT_MANAGER_KEY: NEW}


def test_an_older_spark() -> None:
    spark = session({OLD})
    assert use_file_system_checkpoints(spark) == OLD
    assert spark.conf.values == {CHECKPOINT_MANAGER_KEY: OLD}


def test_a_spark_with_neither_is_left_alone() -> None:
    spark = session(set())
    assert use_file_system_checkpoints(spark) is None
    assert spark.conf.values == {}


def test_the_session_s_own_choice_stays() -> None:
    spark = session({NEW}, {CHECKPOINT_MANAGER_KEY: "com.example.Mine"})
    assert use_file_system_checkpoints(spark) == "com.example.Mine"
    assert spark.conf.values == {CHECKPOINT_MANAGER_KEY: "com.example.Mine"}
