"""The page-view pipeline (pipelines/pageviews) end to end on the shared cluster and session:
generator (its command line), the streaming job's two queries, the verifier's check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from odradek.testing import LocalCluster
from tests.spark.topics import unique_topic

pytestmark = pytest.mark.spark

PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "pageviews"


@pytest.fixture(scope="module")
def pipeline() -> tuple[object, object]:
    sys.path.insert(0, str(PIPELINE))
    try:
        import job
        import verify
    finally:
        sys.path.remove(str(PIPELINE))
    return job, verify


def test_pageviews_pipeline_output_is_complete(
    spark: SparkSession,
    cluster3: LocalCluster,
    tmp_path: Path,
    pipeline: tuple[object, object],
) -> None:
    job, verify = pipeline
    bootstrap = cluster3.bootstrap_servers
    source, sink = unique_topic("pageviews"), unique_topic("pageviews-agg")
    generated = subprocess.run(
        [
            sys.executable,
            str(PIPELINE / "generate.py"),
            f"--bootstrap={bootstrap}",
            f"--topic={source}",
            "--count=2000",
            "--rate=4000",
            "--event-rate=25",  # 80 s of event time: eight or nine windows per page
            "--replication-factor=3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert generated.returncode == 0, generated.stderr
    args = job.parse_args(  # type: ignore[attr-defined]
        [
            f"--bootstrap={bootstrap}",
            f"--topics={source}",
            f"--output-topic={sink}",
            f"--output-dir={tmp_path / 'out'}",
            f"--checkpoint-dir={tmp_path / 'chk'}",
            "--trigger=available-now",
            "--max-offsets-per-trigger=1000",  # several batches, windows closing as they go
        ]
    )
    queries = job.start(spark, args)  # type: ignore[attr-defined]
    try:
        for query in queries:
            assert query.awaitTermination(240), f"{query.name} did not finish"
            assert query.exception() is None
    finally:
        for query in queries:
            query.stop()
    report = verify.check(  # type: ignore[attr-defined]
        spark,
        verify.parse_args(  # type: ignore[attr-defined]
            [
                f"--bootstrap={bootstrap}",
                f"--topics={source}",
                f"--output-topic={sink}",
                f"--output-dir={tmp_path / 'out'}",
            ]
        ),
    )
    assert report["ok"], report
    assert report["expected_windows"] > 100
    assert report["parquet"]["rows"] == report["expected_windows"]


def test_pageviews_job_runs_under_spark_submit(
    spark: SparkSession,
    cluster3: LocalCluster,
    tmp_path: Path,
    pipeline: tuple[object, object],
) -> None:
    """The same job, launched the way a cluster runs it: spark-submit (its own JVM and master),
    with the project's interpreter for the Python workers."""
    import os

    _job, verify = pipeline
    bootstrap = cluster3.bootstrap_servers
    source = unique_topic("pageviews-submit")
    generated = subprocess.run(
        [
            sys.executable,
            str(PIPELINE / "generate.py"),
            f"--bootstrap={bootstrap}",
            f"--topic={source}",
            "--count=600",
            "--rate=5000",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert generated.returncode == 0, generated.stderr
    spark_submit = Path(sys.executable).parent / "spark-submit"
    submitted = subprocess.run(
        [
            str(spark_submit),
            "--master",
            "local[2]",
            str(PIPELINE / "job.py"),
            f"--bootstrap={bootstrap}",
            f"--topics={source}",
            f"--output-topic={unique_topic('pageviews-submit-agg')}",
            f"--output-dir={tmp_path / 'out'}",
            f"--checkpoint-dir={tmp_path / 'chk'}",
            "--trigger=available-now",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    report = verify.check(  # type: ignore[attr-defined]
        spark,
        verify.parse_args(  # type: ignore[attr-defined]
            [f"--bootstrap={bootstrap}", f"--topics={source}", f"--output-dir={tmp_path / 'out'}"]
        ),
    )
    assert report["ok"], report
    assert report["parquet"]["rows"] == report["expected_windows"] > 10
