"""A real Apache Kafka 3.9 broker (ZooKeeper mode), to hold Odradek's answers against.

`./dev kafka` (and `./dev setup`) fetch the broker's jars from Maven Central into a cache outside
the repository; `kafka_libs()` finds them (ODRADEK_KAFKA_LIBS overrides the place). `KafkaBroker`
runs `java -cp 'libs/*' kafka.Kafka server.properties` against a chroot of the test session's
ZooKeeper, in a temporary directory, and is ready when it answers ApiVersions.

Several brokers form one cluster when they share the chroot and differ in `broker_id`. `pause()`
and `resume()` SIGSTOP and SIGCONT the JVM, as `LocalCluster.stop`/`cont` do an Odradek broker.

Concurrency: a `KafkaBroker` belongs to the test (thread) that started it; `stop()` kills the JVM
and is idempotent, and an atexit hook kills it should the interpreter exit first.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from pathlib import Path

from odradek.protocol.codec import ApiKey
from odradek.testing.processes import ClusterProcess, ProcessState
from tests.fixtures.zookeeper import free_port
from tests.integration import _wire

KAFKA_VERSION = "3.9.1"
START_TIMEOUT_S = 120.0

LOG4J = """\
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


def kafka_libs() -> Path:
    """Where `./dev kafka` puts Kafka's jars."""
    configured = os.environ.get("ODRADEK_KAFKA_LIBS")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "odradek" / f"kafka-{KAFKA_VERSION}" / "libs"


def kafka_available() -> bool:
    return (kafka_libs() / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file()


def require_kafka() -> None:
    """Skip the calling test when Kafka's jars are absent, except in CI (CI=true), where the
    differential tests must run: there it is a failure."""
    if kafka_available():
        return
    import pytest

    message = f"Kafka's jars are not in {kafka_libs()}: run ./dev kafka"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class KafkaBroker:
    """One Kafka broker process (see the module docstring)."""

    def __init__(
        self, directory: Path, zookeeper_connect: str, broker_id: int = 1, **properties: str
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = directory / "kafka.log"
        config = {
            "broker.id": str(broker_id),
            "listeners": f"PLAINTEXT://{self.bootstrap}",
            "log.dirs": str(directory / "data"),
            "zookeeper.connect": zookeeper_connect,
            "offsets.topic.replication.factor": "1",
            "auto.create.topics.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
            **properties,
        }
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "server.properties").write_text(
            "".join(f"{key}={value}\n" for key, value in config.items())
        )
        (directory / "log4j.properties").write_text(LOG4J.format(log=self.log))
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        command = [
            "java",
            "-Xmx768m",
            f"-Dlog4j.configuration=file:{self.directory / 'log4j.properties'}",
            "-cp",
            f"{kafka_libs()}/*",
            "kafka.Kafka",
            str(self.directory / "server.properties"),
        ]
        with open(self.directory / "stdout.log", "wb") as out:
            self._process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"Kafka exited with {self._process.returncode}: {self.log}")
            try:
                with _wire.WireConnection.to(self.bootstrap, timeout=5) as connection:
                    connection.request(ApiKey.API_VERSIONS, 3, {})
                    answer = connection.request(
                        ApiKey.METADATA, 9, {"topics": [], "allow_auto_topic_creation": False}
                    )
                if answer.controller_id >= 0:
                    return
            except (OSError, _wire.ConnectionClosed, _wire.NoAnswer):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"Kafka did not start within {timeout:g}s: {self.log}")

    def pause(self, timeout: float = 10.0) -> None:
        """SIGSTOP: the JVM freezes, keeping its sockets and (until it expires) its ZooKeeper
        session; returns once the kernel reports it stopped."""
        self._signal(signal.SIGSTOP, ProcessState.STOPPED, timeout)

    def resume(self, timeout: float = 10.0) -> None:
        """SIGCONT: the JVM frozen by `pause` runs again."""
        self._signal(signal.SIGCONT, ProcessState.RUNNING, timeout)

    def _signal(self, signum: int, expected: ProcessState, timeout: float) -> None:
        if self._process is None:
            raise RuntimeError("Kafka is not running")
        process = ClusterProcess(self._process.pid, "kafka.Kafka", self._process)
        os.kill(process.pid, signum)  # not killpg: the JVM shares the test's process group
        deadline = time.monotonic() + timeout
        while process.state() not in (expected, ProcessState.DEAD):
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka did not become {expected.value} within {timeout:g}s")
            time.sleep(0.01)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(30)
        atexit.unregister(self.stop)
