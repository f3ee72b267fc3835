"""The page-view pipeline on a Spark standalone cluster, run as a user runs it, through faults.

`odradek cluster up --brokers 3 --spark-workers 2` starts the brokers and a standalone master with
two workers; `spark-submit --master spark://...` runs `pipelines/pageviews/job.py` on it (two
executors, one per worker, running the project's Python); the generator produces page views with
acks=all. Mid-stream the broker leading partition 0 of the input is SIGKILLed and, once another
broker leads it, restarted; then one executor JVM is SIGKILLed while it runs a task: Spark loses
the executor, runs its tasks again elsewhere, and the master starts a replacement. Once both
queries have read the whole topic and run a batch with a watermark past the last window, the job
is stopped and `pipelines/pageviews/verify.py` (on the tests' local session) checks the Parquet
output against a batch recomputation over the input (nothing lost, nothing doubled) and
the output topic (at least once). `odradek cluster down` must then leave nothing running.

How the test sees the job: from outside the driver, as an operator would -- the queries'
checkpoints (a batch is done once `commits/<id>` exists; `offsets/<id>` holds its source offsets
and the watermark it ran with) and the driver's REST API (`/api/v1/.../executors`: which
executor runs tasks now).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from odradek.demo import EVENT_RATE, allowed_lateness
from odradek.spark.session import LOCAL_CONF
from odradek.testing import LocalCluster
from odradek.testing.processes import free_ports
from odradek.testing.spark_standalone import SparkStandalone
from tests.fixtures.cluster import wait_until
from tests.spark.topics import create_topic, high_watermarks

# The steps below wait with deadlines of their own; this bounds the whole, cluster start-up and
# shutdown included, on a 2-core machine shared with other work.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "pageviews"
INPUT, OUTPUT = "pageviews", "pageviews-per-page"
EVENTS = 3000  # at least this many views; the generator goes on until both faults are done
MAX_EVENTS = 30_000  # its bound (200 s at RATE) should the test die before stopping it
RATE = 150.0  # records per second
QUERIES = ("parquet", "topic")  # the job's checkpoint subdirectories, one per query
# Spark's start and first micro-batch took 114-147 s at a load average of 4-11 on two cores, and
# over 150 s at 12; a run on a quiet machine takes a fraction of these deadlines.
FIRST_BATCH_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 240.0
KILL_ATTEMPTS = 3


def odradek(*args: str, timeout: float = 180) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "odradek.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"odradek {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    """Brokers and a standalone cluster started by `odradek cluster up`, brought down by `odradek
    cluster down` -- which must leave nothing running (anything left is killed, then the test
    fails)."""
    directory = tmp_path / "cluster"
    try:
        odradek(
            "cluster",
            "up",
            "--brokers=3",
            "--spark-workers=2",
            f"--dir={directory}",
            "--timeout=120",  # for the brokers, and again for Spark
            timeout=300,
        )
        yield directory
        odradek("cluster", "down", f"--dir={directory}", "--timeout=30", timeout=120)
    finally:
        spark = SparkStandalone.load(directory)
        left = spark is not None and spark.running()
        if spark is not None:
            spark.kill_all()
        if (directory / "cluster.json").exists():
            brokers = LocalCluster.load(directory)
            left = left or any(brokers.is_alive(b) for b in brokers.broker_ids)
            brokers.kill_all()
    assert not left, "odradek cluster down left Spark or broker processes running"


class Driver:
    """`spark-submit` of the page-view job, in a session of its own (the driver JVM and its
    Python process are one process group), its output in `log`."""

    def __init__(self, master: str, job_args: list[str], log: Path) -> None:
        self.ui_port = free_ports(1, "127.0.0.1")[0]
        conf = {**LOCAL_CONF, "spark.ui.enabled": "true", "spark.ui.port": str(self.ui_port)}
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "spark-submit"),
                    "--master",
                    master,
                    *[a for key, value in conf.items() for a in ("--conf", f"{key}={value}")],
                    str(PIPELINE / "job.py"),
                    *job_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # PYTHONFAULTHANDLER: `dump_stacks` has the driver's Python workers print
                # their threads' tracebacks (to this log) when the test fails.
                env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONFAULTHANDLER": "1"},
                start_new_session=True,
            )
        self.app_id: str | None = None

    def rest(self, path: str) -> Any:
        """The driver's REST API (`/api/v1/applications/<app>/<path>`); None if not answering."""
        try:
            base = f"http://127.0.0.1:{self.ui_port}/api/v1/applications"
            if self.app_id is None:
                with urllib.request.urlopen(base, timeout=5) as answer:
                    self.app_id = json.loads(answer.read())[0]["id"]
            with urllib.request.urlopen(f"{base}/{self.app_id}/{path}", timeout=5) as answer:
                return json.loads(answer.read())
        except (urllib.error.URLError, OSError, ValueError, IndexError, KeyError):
            return None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def dump_stacks(self) -> str:
        """Where the driver is, for a failed test's report: the JVM's stream execution threads
        (jstack), and every Python process under it aborted with SIGABRT, on which Python's
        fault handler writes all its threads' tracebacks to this log. Only for a test that
        has failed: the Python workers die of it."""
        if self.process.poll() is not None:
            return "the driver had exited"
        try:
            jstack = subprocess.run(
                ["jstack", str(self.process.pid)],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            jstack = f"jstack failed: {e!r}"
        threads = [t for t in jstack.split("\n\n") if "stream execution thread" in t]
        for pid in descendants(self.process.pid):
            if "python" in process_name(pid):
                try:
                    os.kill(pid, signal.SIGABRT)
                except ProcessLookupError:
                    pass
        time.sleep(1)  # the fault handler's output is written as the process dies
        return "\n\n".join(threads) or jstack[-4000:]

    def stop(self) -> None:
        """SIGTERM the driver's group (as Ctrl-C would stop a job), SIGKILL after a deadline."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_name(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def committed_batches(checkpoint: Path) -> list[tuple[int, int, dict[int, int]]]:
    """(batch id, watermark in ms, input offsets) of every batch a query's checkpoint records as
    committed (Spark's offset log: a version line, the batch metadata, one line per source)."""
    batches = []
    commits = checkpoint / "commits"
    # By batch id as a number: by name, batch 10 would sort before batch 9, and a query with
    # more than ten batches would look as if its last one were batch 9 (never drained).
    entries = [e for e in (commits.iterdir() if commits.exists() else []) if e.name.isdigit()]
    for entry in sorted(entries, key=lambda p: int(p.name)):
        lines = (checkpoint / "offsets" / entry.name).read_text().splitlines()
        metadata, source = json.loads(lines[1]), json.loads(lines[2])
        offsets = {int(p): int(o) for p, o in source.get(INPUT, {}).items()}
        batches.append((int(entry.name), int(metadata.get("batchWatermarkMs", 0)), offsets))
    return batches


def failed_tasks(driver: Driver) -> int:
    """Task attempts that failed so far, over every stage (the driver's REST API)."""
    return sum(stage["numFailedTasks"] for stage in driver.rest("stages") or [])


def executor_gone(spark: SparkStandalone, pid: int) -> bool:
    return pid not in {e.pid for e in spark.executors()}


def kill_executor_running_a_task(driver: Driver, spark: SparkStandalone) -> str:
    """SIGKILL an executor JVM while the driver shows it running a task, and return its id once
    the driver has counted that task as failed (it then runs it again). A task can end between
    the driver's answer and the signal: then no task was lost, and another executor is killed
    (at most KILL_ATTEMPTS; Spark's own limit is spark.deploy.maxExecutorRetries, 10)."""

    def executor_running_a_task() -> Any:
        busy = [
            e
            for e in driver.rest("executors") or []
            if e["id"] != "driver" and e["activeTasks"] > 0
        ]
        return busy[0] if busy else None

    for _ in range(KILL_ATTEMPTS):
        failed_before = failed_tasks(driver)
        busy = wait_until(executor_running_a_task, 60, "an executor running a task", interval=0.02)
        [victim] = [e for e in spark.executors() if e.executor_id == busy["id"]]
        os.kill(victim.pid, signal.SIGKILL)
        wait_until(partial(executor_gone, spark, victim.pid), 30, "the executor gone")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if failed_tasks(driver) > failed_before:
                return victim.executor_id
            time.sleep(0.2)  # polling the driver; the loop's deadline bounds it
    raise AssertionError(f"{KILL_ATTEMPTS} executors killed, and no task was lost with them")


def pipeline_module(name: str) -> Any:
    """A module of pipelines/pageviews (they import each other by their plain names)."""
    sys.path.insert(0, str(PIPELINE))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(PIPELINE))


def leader(bootstrap: str, partition: int) -> int:
    try:
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(INPUT, timeout=5)
        return int(metadata.topics[INPUT].partitions[partition].leader)
    except Exception:  # no answer while a broker dies: ask again
        return -1


def produced(bootstrap: str) -> int:
    try:
        return sum(high_watermarks(bootstrap, INPUT).values())
    except Exception:
        return 0


def test_pageviews_on_standalone_cluster_through_broker_and_executor_kills(
    cluster_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    phases = Phases()
    cluster = LocalCluster.load(cluster_dir)
    spark = SparkStandalone.load(cluster_dir)
    assert spark is not None
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, INPUT, 3, 3, {"min.insync.replicas": "2"})
    create_topic(bootstrap, OUTPUT, 3, 3, {"min.insync.replicas": "2"})
    watermark = allowed_lateness(RATE)
    checkpoints, output = tmp_path / "checkpoints", tmp_path / "output"
    job_args = [
        f"--bootstrap={bootstrap}",
        f"--topics={INPUT}",
        f"--output-topic={OUTPUT}",
        f"--output-dir={output}",
        f"--checkpoint-dir={checkpoints}",
        "--trigger=2 seconds",
        f"--watermark={watermark}",
    ]
    driver = Driver(spark.master_url, job_args, tmp_path / "driver.log")
    generator = None
    try:
        # 1. The first micro-batch (on the empty topic) starts the executors' Python workers.
        # (Spark gives a new Python worker a fixed 10 s to connect back; on a loaded machine the
        # driver's can miss it, and the job then starts its queries again from their
        # checkpoints: `job.py`, START_RETRIES.)
        deadline = time.monotonic() + FIRST_BATCH_TIMEOUT_S
        while not all(committed_batches(checkpoints / q) for q in QUERIES):
            assert driver.process.poll() is None, f"the job exited:\n{driver.output()[-4000:]}"
            assert time.monotonic() < deadline, f"no first batch:\n{driver.output()[-4000:]}"
            time.sleep(0.2)  # polling the checkpoints; the loop's deadline bounds it
        phases.done("first micro-batch")
        executors_at_start = {e.pid for e in spark.executors()}
        assert len(executors_at_start) == 2, spark.executors()

        # 2. The generator, with the faults in the middle of its run. It produces until told to
        # stop: killing an executor needs a task running, so data must still be coming in then
        # however long the broker's kill and restart took (CI: more than the 20 s that a fixed
        # count of 3,000 gave, and no task ran for 60 s).
        stop_file = tmp_path / "generator.stop"
        generator = subprocess.Popen(
            [
                sys.executable,
                str(PIPELINE / "generate.py"),
                f"--bootstrap={bootstrap}",
                f"--topic={INPUT}",
                f"--count={MAX_EVENTS}",
                f"--rate={RATE}",
                f"--event-rate={EVENT_RATE}",
                f"--stop-file={stop_file}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_until(lambda: produced(bootstrap) >= EVENTS // 4, 60, "a quarter of the events")
        victim = leader(bootstrap, 0)
        assert victim > 0
        assert cluster.kill(victim)
        wait_until(lambda: leader(bootstrap, 0) not in (victim, -1), 60, "a new leader")
        cluster.start_broker(victim)
        phases.done(f"broker {victim} killed and restarted")

        killed = kill_executor_running_a_task(driver, spark)
        phases.done(f"executor {killed} killed")

        wait_until(lambda: produced(bootstrap) >= EVENTS, 60, f"{EVENTS} events")
        stop_file.touch()
        generated, _ = generator.communicate(timeout=120)
        assert generator.returncode == 0, generated[-2000:]
        summary = [json.loads(line) for line in generated.splitlines() if line.startswith("{")][-1]

        # 3. Drained: each query committed a batch that read to the end of the topic and one
        # whose watermark passed the last window (the end-of-stream marker's doing).
        pageviews = pipeline_module("pageviews")
        target = high_watermarks(bootstrap, INPUT)
        last_window = pageviews.window_end(summary["last_view_time"], pageviews.DEFAULT_WINDOW)
        last_window_ms = last_window.timestamp() * 1000

        def drained() -> bool:
            assert driver.process.poll() is None, f"the job exited:\n{driver.output()[-4000:]}"
            for query in QUERIES:
                batches = committed_batches(checkpoints / query)
                read = batches[-1][2] if batches else {}
                if any(read.get(p, 0) < end for p, end in target.items()):
                    return False
                if max(mark for _, mark, _ in batches) < last_window_ms:
                    return False
            return True

        wait_until(drained, DRAIN_TIMEOUT_S, "both queries to drain", interval=0.2)
        phases.done("drained")
        # The master gave the application a new executor in place of the killed one.
        replacements = {e.pid for e in spark.executors()} - executors_at_start
        assert replacements, "the master started no executor in place of the killed one"
    except BaseException:
        try:
            where = driver.dump_stacks()
        except Exception as e:  # the diagnosis must never hide the failure itself
            where = f"(could not dump the driver's stacks: {e!r})"
        print(f"where the driver was:\n{where}")
        print(f"the driver's log, last lines:\n{driver.output()[-6000:]}")
        raise
    finally:
        if generator is not None and generator.poll() is None:
            generator.kill()
            generator.wait()
        driver.stop()
        phases.done("job stopped")
        print(phases)

    # 4. The check. The local session is asked for only now: its JVM would otherwise compete
    # with the cluster's for the machine's cores all along.
    verify = pipeline_module("verify")
    report = verify.check(
        request.getfixturevalue("spark"),
        verify.parse_args(
            [
                f"--bootstrap={bootstrap}",
                f"--topics={INPUT}",
                f"--output-dir={output}",
                f"--output-topic={OUTPUT}",
                f"--watermark={watermark}",
            ]
        ),
    )
    phases.done("verified")
    print(phases)
    assert report["ok"], report
    assert report["parquet"]["rows"] == report["expected_windows"] > 50, report


class Phases:
    """How long each step took, for the test's output (the test is bounded in time)."""

    def __init__(self) -> None:
        self.started = self.last = time.monotonic()
        self.steps: list[str] = []

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.steps.append(f"{step} {now - self.last:.0f} s")
        self.last = now

    def __str__(self) -> str:
        return f"{', '.join(self.steps)}; {self.last - self.started:.0f} s in all"


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--spark-workers=-1"], "--spark-workers must be at least 1"),
        (["--spark-workers=2", "--spark-worker-cores=0"], "--spark-worker-cores must be"),
        (["--spark-workers=2", "--spark-worker-memory=lots"], "expected a size like 1g"),
    ],
)
def test_bad_spark_settings_are_refused_before_anything_starts(
    tmp_path: Path, flags: list[str], error: str
) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "odradek.cli.main", "cluster", "up", f"--dir={tmp_path}", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("odradek: error: "), refused.stderr
    assert error in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    assert not (tmp_path / "cluster.json").exists()
