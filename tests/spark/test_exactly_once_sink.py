"""The `odradek` sink with `exactlyOnce=true`: a streaming query whose driver (its own process,
tests/spark/eos_driver.py) is SIGKILLed in the middle of a micro-batch, one task committed and
the other still running, then restarted from the same checkpoint, leaves every input record
exactly once for a read_committed reader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import IO

import pytest
from pyspark.sql import SparkSession

from odradek.errors import DataSourceOptionError
from odradek.spark.options import SinkOptions
from odradek.testing import LocalCluster
from tests.fixtures.cluster import wait_until
from tests.spark.topics import create_topic, produce, unique_topic
from tests.spark.transactional import PARTITIONS, read_committed

pytestmark = pytest.mark.spark

DRIVER = Path(__file__).with_name("eos_driver.py")
PER_PARTITION = 150  # three micro-batches of 50 per partition (maxOffsetsPerTrigger=100)
STALL_VALUE = "p1-75"  # partition 1's row in micro-batch 1


def _start_driver(args: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    # Its own session, so that the kill reaches the JVM and the Python workers too.
    return subprocess.Popen(
        [sys.executable, str(DRIVER), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def test_sink_options() -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t"}
    assert not SinkOptions.parse(base).exactly_once
    assert SinkOptions.parse({**base, "exactlyOnce": "true"}).exactly_once
    with pytest.raises(DataSourceOptionError, match="needs the 'topic' option"):
        SinkOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:1", "exactlyOnce": "true"})
    with pytest.raises(DataSourceOptionError, match=r"transactional\.id is not supported"):
        SinkOptions.parse({**base, "kafka.transactional.id": "mine"})


def test_batch_write_refuses_exactly_once(spark: SparkSession, cluster3: LocalCluster) -> None:
    with pytest.raises(Exception, match="exactlyOnce applies to streaming writes"):
        spark.createDataFrame([("v",)], "value string").write.format("odradek").option(
            "kafka.bootstrap.servers", cluster3.bootstrap_servers
        ).option("topic", "unused").option("exactlyOnce", "true").mode("append").save()


def test_driver_sigkill_mid_batch_then_restart_writes_each_record_once(
    cluster3: LocalCluster, tmp_path: Path
) -> None:
    bootstrap = cluster3.bootstrap_servers
    source, sink = unique_topic("spark-eos-in"), unique_topic("spark-eos-out")
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, sink, PARTITIONS)
    inputs = [f"p{p}-{i}".encode() for p in range(PARTITIONS) for i in range(PER_PARTITION)]
    produce(bootstrap, source, ({"value": v, "partition": int(v[1:2])} for v in inputs))
    args = [bootstrap, source, sink, str(tmp_path / "chk")]
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"

    with first_log.open("wb") as log:
        first = _start_driver([*args, STALL_VALUE], log)
        try:
            # Batch 0 (100 rows) and batch 1's task for partition 0 (50 rows) are committed;
            # batch 1's task for partition 1 is stalled at its 26th row.
            def one_task_of_batch_1_committed() -> bool:
                assert first.poll() is None, first_log.read_text()[-3000:]
                return (
                    b"stalling" in first_log.read_bytes()
                    and len(read_committed(bootstrap, sink)) >= 150
                )

            wait_until(one_task_of_batch_1_committed, 300, "batch 1 half-written", interval=1)
        finally:
            _kill(first)
    before = read_committed(bootstrap, sink)
    assert len(before) == 150, len(before)

    with second_log.open("wb") as log:
        second = _start_driver(args, log)
        try:
            returncode = second.wait(300)
        finally:
            _kill(second)
    output = second_log.read_text()
    assert returncode == 0, output[-3000:]
    # The restart replayed micro-batch 1 (logged in the checkpoint, never committed) first.
    batches = [line for line in output.splitlines() if line.startswith("batch ")]
    assert batches[0].startswith("batch 1:"), batches

    written = Counter(read_committed(bootstrap, sink))
    assert written == Counter(inputs), (
        f"duplicates: {[v for v, n in written.items() if n > 1][:5]}, "
        f"missing: {sorted(set(inputs) - set(written))[:5]}"
    )
