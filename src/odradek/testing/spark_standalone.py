"""A Spark standalone cluster beside a local Odradek cluster: one master and N workers.

`odradek cluster up --spark-workers N` starts it (`SparkStandalone.start`), `cluster status` shows
it and `cluster down` stops it; pipelines run on it with `spark-submit --master spark://...`, and
so do the demo (`--spark standalone`) and `tests/spark/test_standalone_cluster.py`. The daemons are
Spark's own `org.apache.spark.deploy.master.Master` and `...deploy.worker.Worker`, started through
PySpark's launcher `bin/spark-class` (the pip-installed PySpark has no `sbin/start-master.sh`).
Everything binds to 127.0.0.1, on free ports.

Directory layout, under the cluster directory DIR:

* `DIR/spark/master/spark.properties` -- the master's settings (`--properties-file`), and
  `master.log` beside it, the master's output.
* `DIR/spark/worker-<i>/spark.properties`, `worker.log` -- the same for worker i; `work/` holds
  one directory per application and executor (the executor's stdout and stderr, rolled by size
  after `EXECUTOR_LOG_MAX_BYTES`), `local/` the executors' shuffle and spill files.
* `cluster.json`, key `spark`: {master_url, web_ui, spark_home, python, master: {port, web_ui_port,
  pid, dir, log, config}, workers: [{id, port, web_ui_port, cores, memory, pid, dir, log,
  config}]}; a pid is null when that daemon is not running. `LocalCluster` keeps this key when it
  rewrites the file.

Python: executors run the Python their driver names in `PYSPARK_PYTHON` (Spark sends the path with
every Python function; a worker's own environment does not change it, and without it executors
run `python3`). `python` in cluster.json is the interpreter that started the cluster, the
project's virtualenv where `odradek` is installed: the drivers this project starts name it, and
`spark-submit` must be given it. The package is not shipped with a job: it has C extensions, which
a `--py-files` zip cannot carry (Python does not import extension modules from a zip), so it is
installed in the environment the executors' Python runs in.

Processes: every daemon is a JVM in a session of its own, so it leads a process group; a worker's
executors (`CoarseGrainedExecutorBackend` JVMs) and their Python workers are its children and in
its group, so stopping a worker's group stops everything it started. A daemon known only by its
pid in cluster.json is recognised by its properties file on its command line
(`odradek.testing.processes`).

Concurrency: a `SparkStandalone` belongs to the thread that created it; its methods block.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from odradek.errors import OperatorError
from odradek.testing.cluster_files import (
    CLUSTER_FILE,
    HOST,
    cluster_file_lock,
    from_json,
    tail,
    to_json,
    write_properties,
)
from odradek.testing.processes import ClusterProcess, free_ports

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
CLUSTER_KEY = "spark"
# Heap of each daemon JVM (SPARK_DAEMON_MEMORY; Spark's default is 1g): the master and a worker
# only keep bookkeeping. Executors get `spark.executor.memory` (1g by default) out of the
# worker's `--memory`.
DAEMON_MEMORY = "512m"
EXECUTOR_LOG_MAX_BYTES = 10 * 1024 * 1024
EXECUTOR_LOG_FILES = 5
_MEMORY = re.compile(r"^[1-9][0-9]*[mMgG]$")
_POLL_INTERVAL_S = 0.2


@dataclass
class SparkDaemon:
    """The master (`id` 0) or worker `id` of the standalone cluster: ports and files."""

    id: int
    port: int
    web_ui_port: int
    dir: Path
    log: Path
    config: Path
    pid: int | None = None
    cores: int | None = None  # a worker's cores and memory ("1g") offered to executors
    memory: str | None = None

    @property
    def web_ui(self) -> str:
        return f"http://{HOST}:{self.web_ui_port}"


@dataclass
class SparkExecutor:
    """An executor JVM a worker runs for an application."""

    pid: int
    worker: int
    executor_id: str
    app_id: str


@dataclass
class SparkStandalone:
    """A standalone master and its workers on this machine (module docstring). Build one with
    `start(...)` or `load(cluster_dir)`."""

    cluster_dir: Path
    master: SparkDaemon
    workers: list[SparkDaemon]
    spark_home: Path
    python: str
    _processes: dict[int, ClusterProcess] = field(default_factory=dict)

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master.port}"

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        cluster_dir: Path,
        workers: int,
        cores: int = 1,
        memory: str = "1g",
        timeout: float = 90.0,
        python: str | None = None,
    ) -> SparkStandalone:
        """Start a master and `workers` workers with `cores` and `memory` each; return once the
        master counts every worker alive. On failure everything started is killed and an
        OperatorError (with the failing daemon's last log lines) is raised."""
        check_worker_settings(workers, cores, memory)
        cluster_dir = Path(cluster_dir).resolve()
        previous = cls.load(cluster_dir)
        if previous is not None and previous.running():
            raise OperatorError(
                f"a Spark cluster is already running in {cluster_dir}: "
                f"run 'odradek cluster down --dir {cluster_dir}' first"
            )
        spark_home = _spark_home()
        root = cluster_dir / "spark"
        ports = free_ports(2 + 2 * workers, HOST)
        master_dir = root / "master"
        master = SparkDaemon(
            0,
            ports[0],
            ports[1],
            master_dir,
            master_dir / "master.log",
            master_dir / "spark.properties",
        )
        daemons = [
            SparkDaemon(
                i,
                ports[2 * i],
                ports[2 * i + 1],
                root / f"worker-{i}",
                root / f"worker-{i}" / "worker.log",
                root / f"worker-{i}" / "spark.properties",
                cores=cores,
                memory=memory.lower(),
            )
            for i in range(1, workers + 1)
        ]
        standalone = cls(cluster_dir, master, daemons, spark_home, python or sys.executable)
        try:
            standalone._spawn(master, [MASTER_CLASS], _MASTER_PROPERTIES)
            standalone._save()
            standalone._wait_for_master(timeout)
            for worker in daemons:
                (worker.dir / "work").mkdir(parents=True, exist_ok=True)
                (worker.dir / "local").mkdir(parents=True, exist_ok=True)
                standalone._spawn(worker, [WORKER_CLASS], _worker_properties())
            standalone._save()
            standalone._wait_for_workers(timeout)
        except BaseException:
            standalone.kill_all()
            raise
        return standalone

    @classmethod
    def load(cls, cluster_dir: Path) -> SparkStandalone | None:
        """The standalone cluster recorded in `cluster_dir/cluster.json`, or None if there is
        none; OperatorError if the record is damaged."""
        cluster_dir = Path(cluster_dir).resolve()
        path = cluster_dir / CLUSTER_FILE
        try:
            record = json.loads(path.read_text()).get(CLUSTER_KEY)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, AttributeError) as e:
            raise OperatorError(f"{path} is not a valid cluster file: {e}") from None
        if not record:
            return None
        try:
            standalone = cls(
                cluster_dir,
                from_json(SparkDaemon, record["master"]),
                [from_json(SparkDaemon, w) for w in record["workers"]],
                Path(record["spark_home"]),
                record["python"],
            )
        except (KeyError, TypeError) as e:
            raise OperatorError(f"{path}: invalid '{CLUSTER_KEY}' entry: {e}") from None
        for daemon in standalone.daemons:
            if daemon.pid is not None:
                standalone._processes[daemon.id] = ClusterProcess(daemon.pid, str(daemon.config))
        return standalone

    # -- what there is ------------------------------------------------------------------------

    @property
    def daemons(self) -> list[SparkDaemon]:
        return [self.master, *self.workers]

    def worker(self, worker_id: int) -> SparkDaemon:
        for worker in self.workers:
            if worker.id == worker_id:
                return worker
        raise OperatorError(f"no Spark worker {worker_id} (workers: 1-{len(self.workers)})")

    def is_alive(self, daemon_id: int) -> bool:
        process = self._processes.get(daemon_id)
        return process is not None and process.alive

    def running(self) -> bool:
        """True while any daemon of the cluster, or anything a worker started, is alive."""
        return any(self.is_alive(d.id) for d in self.daemons) or any(
            _group_members(d.pid) for d in self.daemons if d.pid is not None
        )

    def master_state(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The master's own view (its web UI's `/json/`: workers, applications), or None when it
        does not answer."""
        try:
            with urllib.request.urlopen(f"{self.master.web_ui}/json/", timeout=timeout) as answer:
                state: dict[str, Any] = json.loads(answer.read())
                return state
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def executors(self, worker_id: int | None = None) -> list[SparkExecutor]:
        """The executor JVMs the workers (or worker `worker_id`) run now, found in /proc."""
        found = []
        for worker in self.workers:
            if worker_id is not None and worker.id != worker_id:
                continue
            if worker.pid is None or not self.is_alive(worker.id):
                continue
            for pid in _children(worker.pid):
                args = _cmdline(pid)
                if EXECUTOR_CLASS in args:
                    found.append(
                        SparkExecutor(
                            pid, worker.id, _arg(args, "--executor-id"), _arg(args, "--app-id")
                        )
                    )
        return found

    def status(self) -> dict[str, Any]:
        """What `cluster status` shows: the daemons' processes and the master's view."""
        state = self.master_state()
        registered = {w.get("port"): w for w in (state or {}).get("workers", [])}
        executors = self.executors()
        return {
            "master_url": self.master_url,
            "web_ui": self.master.web_ui,
            "master": {
                **to_json(self.master),
                "process": "running" if self.is_alive(0) else "dead",
                "answering": state is not None,
            },
            "workers": [
                {
                    **to_json(w),
                    "process": "running" if self.is_alive(w.id) else "dead",
                    "state": registered.get(w.port, {}).get("state"),
                    "executors": [e.pid for e in executors if e.worker == w.id],
                }
                for w in self.workers
            ],
            "alive_workers": state.get("aliveworkers") if state else None,
            "applications": (
                [a.get("name") for a in state.get("activeapps", [])] if state else None
            ),
        }

    # -- starting -----------------------------------------------------------------------------

    def _spawn(self, daemon: SparkDaemon, command: list[str], settings: dict[str, str]) -> None:
        daemon.dir.mkdir(parents=True, exist_ok=True)
        write_properties(
            daemon.config,
            settings,
            f"Spark {'master' if daemon.id == 0 else f'worker {daemon.id}'} of the local cluster"
            f" in {self.cluster_dir}",
        )
        arguments = [
            "--host",
            HOST,
            "--port",
            str(daemon.port),
            "--webui-port",
            str(daemon.web_ui_port),
            "--properties-file",
            str(daemon.config),
        ]
        if daemon.id != 0:
            arguments += [
                "--cores",
                str(daemon.cores),
                "--memory",
                str(daemon.memory),
                "--work-dir",
                str(daemon.dir / "work"),
                self.master_url,
            ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
        env.update(
            SPARK_HOME=str(self.spark_home),
            SPARK_LOCAL_IP=HOST,
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
        )
        if daemon.id != 0:
            env["SPARK_LOCAL_DIRS"] = str(daemon.dir / "local")
        with open(daemon.log, "ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"=== odradek cluster: starting at {stamp} ===\n".encode())
            log.flush()
            popen = subprocess.Popen(
                [str(self.spark_home / "bin" / "spark-class"), *command, *arguments],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=daemon.dir,
                env=env,
                start_new_session=True,
            )
        daemon.pid = popen.pid
        self._processes[daemon.id] = ClusterProcess(popen.pid, str(daemon.config), popen)

    def _wait_for_master(self, timeout: float) -> None:
        self._wait(
            lambda: (self.master_state() or {}).get("status") == "ALIVE",
            timeout,
            "the Spark master to answer",
        )

    def _wait_for_workers(self, timeout: float) -> None:
        ports = {w.port for w in self.workers}

        def all_registered() -> bool:
            state = self.master_state() or {}
            alive = {w.get("port") for w in state.get("workers", []) if w.get("state") == "ALIVE"}
            return ports <= alive

        self._wait(all_registered, timeout, f"{len(ports)} Spark workers to register")

    def _wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for daemon in self.daemons:
                if daemon.pid is not None and not self.is_alive(daemon.id):
                    raise OperatorError(
                        f"{_name(daemon)} exited while waiting for {what}; "
                        f"last lines of {daemon.log}:\n{tail(daemon.log, 15)}"
                    )
            if time.monotonic() >= deadline:
                logs = "\n".join(
                    f"--- {d.log}:\n{tail(d.log, 8)}" for d in self.daemons if d.pid is not None
                )
                raise OperatorError(f"timed out after {timeout:g}s waiting for {what}:\n{logs}")
            time.sleep(_POLL_INTERVAL_S)

    # -- stopping -----------------------------------------------------------------------------

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the workers (a worker kills its executors on the way out), then the master;
        SIGKILL whatever is still alive after `timeout`, executors and Python workers included."""
        deadline = time.monotonic() + timeout
        for phase in (self.workers, [self.master]):
            live = [d for d in phase if self.is_alive(d.id)]
            for daemon in live:
                self._processes[daemon.id].signal(signal.SIGTERM)
            for daemon in live:
                if not self._processes[daemon.id].wait(max(0.0, deadline - time.monotonic())):
                    self._processes[daemon.id].kill()
        self._sweep(deadline)

    def kill_all(self) -> None:
        """SIGKILL every daemon and everything they started. For failed start-ups and test
        harness clean-up."""
        for daemon in self.daemons:
            process = self._processes.get(daemon.id)
            if process is not None and process.alive:
                with contextlib.suppress(OperatorError):
                    process.kill()
        self._sweep(time.monotonic() + 10.0)

    def _sweep(self, deadline: float) -> None:
        """SIGKILL what is left in the daemons' process groups (an executor or Python worker that
        outlived its worker), wait until the groups are empty, and record the daemons stopped."""
        give_up = max(deadline, time.monotonic()) + 10.0
        for daemon in self.daemons:
            if daemon.pid is None:
                continue
            while members := _group_members(daemon.pid):
                for pid in members:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(daemon.pid, os.WNOHANG)
                if time.monotonic() >= give_up:
                    raise OperatorError(f"processes {members} of {_name(daemon)} survived SIGKILL")
                time.sleep(0.05)
            daemon.pid = None
        self._processes.clear()
        self._save()

    # -- cluster.json -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "master_url": self.master_url,
            "web_ui": self.master.web_ui,
            "spark_home": str(self.spark_home),
            "python": self.python,
            "master": to_json(self.master),
            "workers": [to_json(w) for w in self.workers],
        }

    def _save(self) -> None:
        set_cluster_record(self.cluster_dir, self.to_json())


def check_worker_settings(workers: int, cores: int, memory: str) -> None:
    """OperatorError (one line) unless these make a cluster: at least one worker, one core, and a
    memory size Spark understands."""
    if workers < 1:
        raise OperatorError(f"--spark-workers must be at least 1, not {workers}")
    if cores < 1:
        raise OperatorError(f"--spark-worker-cores must be at least 1, not {cores}")
    if not _MEMORY.match(memory):
        raise OperatorError(f"--spark-worker-memory {memory!r}: expected a size like 1g or 512m")


def set_cluster_record(cluster_dir: Path, record: dict[str, Any] | None) -> None:
    """Write (or, with None, remove) the `spark` entry of cluster.json, leaving the rest as is."""
    path = Path(cluster_dir) / CLUSTER_FILE
    with cluster_file_lock(Path(cluster_dir)):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            document = {}
        if record is None:
            if CLUSTER_KEY not in document:
                return
            document.pop(CLUSTER_KEY)
        else:
            document[CLUSTER_KEY] = record
        temporary = path.with_name(f".{CLUSTER_FILE}.{os.getpid()}.spark.tmp")
        temporary.write_text(json.dumps(document, indent=2) + "\n")
        os.replace(temporary, path)


_MASTER_PROPERTIES = {
    # No REST submission server (port 6066 by default, shared by every master on the machine):
    # jobs are submitted in client mode, by spark-submit.
    "spark.master.rest.enabled": "false",
}


def _worker_properties() -> dict[str, str]:
    # Executor logs are written by the worker (into work/<app>/<executor>/): bounded by size, and
    # the directories of applications that ended a day ago are removed (checked every half hour).
    return {
        "spark.executor.logs.rolling.strategy": "size",
        "spark.executor.logs.rolling.maxSize": str(EXECUTOR_LOG_MAX_BYTES),
        "spark.executor.logs.rolling.maxRetainedFiles": str(EXECUTOR_LOG_FILES),
        "spark.worker.cleanup.enabled": "true",
        "spark.worker.cleanup.appDataTtl": str(24 * 3600),
    }


def _spark_home() -> Path:
    """$SPARK_HOME if it holds Spark's launcher, else the installed PySpark package (which ships
    `bin/spark-class` and Spark's jars)."""
    configured = os.environ.get("SPARK_HOME")
    if configured and (Path(configured) / "bin" / "spark-class").exists():
        return Path(configured)
    try:
        import pyspark
    except ImportError:
        raise OperatorError(
            "a Spark cluster needs PySpark: install the project with its 'spark' extra"
        ) from None
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise OperatorError(f"PySpark in {home} has no bin/spark-class: set SPARK_HOME")
    return home


def _name(daemon: SparkDaemon) -> str:
    return "the Spark master" if daemon.id == 0 else f"Spark worker {daemon.id}"


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _all_pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def _children(pid: int) -> list[int]:
    return [p for p in _all_pids() if (fields := _stat(p)) is not None and fields[1] == str(pid)]


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) Spark processes of process group `pgid`: JVMs with Spark's jars and
    PySpark's Python workers (a check on the command line, so that a group id recycled by an
    unrelated session is never signalled)."""
    return [
        p
        for p in _all_pids()
        if (fields := _stat(p)) is not None
        and fields[2] == str(pgid)
        and fields[0] not in "ZX"
        and "spark" in " ".join(_cmdline(p)).lower()
    ]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _arg(args: list[str], name: str) -> str:
    with contextlib.suppress(ValueError, IndexError):
        return args[args.index(name) + 1]
    return ""
