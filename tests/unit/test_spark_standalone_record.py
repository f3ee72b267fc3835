"""The Spark standalone cluster's entry in cluster.json (odradek.testing.spark_standalone), without
processes: written and read back, kept when LocalCluster rewrites the file, dropped on request; a
recorded daemon that is not running is seen as dead; bad worker settings are one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from odradek.errors import OperatorError
from odradek.testing import CLUSTER_FILE, LocalCluster
from odradek.testing.spark_standalone import (
    SparkDaemon,
    SparkStandalone,
    check_worker_settings,
    set_cluster_record,
)


def _broker_cluster_file(directory: Path) -> None:
    broker_dir = directory / "broker-1"
    document = {
        "zookeeper": {"connect": "127.0.0.1:1", "port": 1, "pid": None, "dir": None, "log": None},
        "brokers": [
            {
                "id": 1,
                "host": "127.0.0.1",
                "port": 1,
                "pid": None,
                "dir": str(broker_dir),
                "data_dir": str(broker_dir / "data"),
                "log": str(broker_dir / "broker.log"),
                "config": str(broker_dir / "server.properties"),
            }
        ],
        "bootstrap": "127.0.0.1:1",
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CLUSTER_FILE).write_text(json.dumps(document))


def _standalone(directory: Path, pid: int | None) -> SparkStandalone:
    root = directory / "spark"
    master = SparkDaemon(0, 7077, 8080, root / "master", root / "m.log", root / "m.properties", pid)
    worker = SparkDaemon(
        1, 7078, 8081, root / "w1", root / "w1.log", root / "w1.properties", pid, 1, "1g"
    )
    return SparkStandalone(directory, master, [worker], Path("/spark"), sys.executable)


def test_the_record_survives_local_cluster_rewrites_and_reads_back(tmp_path: Path) -> None:
    _broker_cluster_file(tmp_path)
    set_cluster_record(tmp_path, _standalone(tmp_path, pid=None).to_json())
    cluster = LocalCluster.load(tmp_path)
    cluster._save()  # as after a broker kill or restart
    cluster._save([1])
    document = json.loads((tmp_path / CLUSTER_FILE).read_text())
    assert document["spark"]["master_url"] == "spark://127.0.0.1:7077"
    assert document["bootstrap"] == "127.0.0.1:1"

    loaded = SparkStandalone.load(tmp_path)
    assert loaded is not None
    assert loaded.master_url == "spark://127.0.0.1:7077"
    assert loaded.worker(1).memory == "1g" and loaded.worker(1).cores == 1
    assert loaded.master.web_ui == "http://127.0.0.1:8080"
    with pytest.raises(OperatorError, match="no Spark worker 2"):
        loaded.worker(2)

    set_cluster_record(tmp_path, None)
    assert SparkStandalone.load(tmp_path) is None
    assert LocalCluster.load(tmp_path).bootstrap_servers == "127.0.0.1:1"


def test_a_recorded_daemon_that_is_not_ours_is_dead(tmp_path: Path) -> None:
    # pid 1 is alive, but its command line does not name the daemon's properties file: as for a
    # recycled pid, the daemon is dead and nothing is ever signalled.
    set_cluster_record(tmp_path, _standalone(tmp_path, pid=1).to_json())
    loaded = SparkStandalone.load(tmp_path)
    assert loaded is not None
    assert not loaded.is_alive(0) and not loaded.is_alive(1)
    assert not loaded.running()
    assert loaded.executors() == []


def test_no_record_and_a_damaged_record(tmp_path: Path) -> None:
    assert SparkStandalone.load(tmp_path) is None
    _broker_cluster_file(tmp_path)
    assert SparkStandalone.load(tmp_path) is None
    document = json.loads((tmp_path / CLUSTER_FILE).read_text())
    (tmp_path / CLUSTER_FILE).write_text(json.dumps({**document, "spark": {"master": {}}}))
    with pytest.raises(OperatorError, match="invalid 'spark' entry"):
        SparkStandalone.load(tmp_path)


@pytest.mark.parametrize(
    ("workers", "cores", "memory", "error"),
    [
        (0, 1, "1g", "--spark-workers must be at least 1, not 0"),
        (2, 0, "1g", "--spark-worker-cores must be at least 1, not 0"),
        (2, 1, "1 g", "--spark-worker-memory '1 g': expected a size like 1g or 512m"),
        (2, 1, "0g", "expected a size like"),
        (2, 1, "1024", "expected a size like"),
    ],
)
def test_bad_worker_settings(workers: int, cores: int, memory: str, error: str) -> None:
    with pytest.raises(OperatorError, match=error):
        check_worker_settings(workers, cores, memory)


def test_good_worker_settings() -> None:
    for memory in ("1g", "512m", "2G", "1536M"):
        check_worker_settings(2, 1, memory)
