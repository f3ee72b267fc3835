"""Apache Kafka 3.9 in ZooKeeper mode as `bench/failover.py`'s other system (`--system kafka`):
three `kafka.Kafka` JVMs on a private ZooKeeper of the same build Odradek runs on, with the
settings the Odradek cluster gets (session timeout, replica lag, controlled-shutdown retries,
controller socket timeout), everything else at Kafka's defaults. `KafkaCluster` offers what the
scenarios use of `LocalCluster`: brokers with an id, address and log, the controller and the
registrations from ZooKeeper, SIGKILL, SIGTERM (Kafka's controlled shutdown) and teardown.

The jars come from `./dev kafka` (or ODRADEK_KAFKA_LIBS), found as `bench/peers.py` finds them.
Kafka logs at INFO (its default), to `kafka.log` in each broker's directory. Never part of the
test run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from peers import KAFKA_VERSION, free_port, kafka_libs

from odradek.zk.client import ZkClient
from odradek.zk.errors import NoNodeError
from odradek.zk.server import ZooKeeperServer

START_TIMEOUT_S = 180.0

LOG4J = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.state.change.logger=INFO, file
log4j.additivity.state.change.logger=false
"""


class KafkaBrokerProcess:
    """One broker: `id`, `host`, `port`, `dir`, `log` as the scenarios read them."""

    def __init__(self, broker_id: int, directory: Path, zk_connect: str, overrides: dict[str, str]):
        self.id = broker_id
        self.host = "127.0.0.1"
        self.port = free_port()
        self.dir = directory
        self.log = directory / "kafka.log"
        directory.mkdir(parents=True, exist_ok=True)
        properties = {
            "broker.id": str(broker_id),
            "listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "log.dirs": str(directory / "data"),
            "zookeeper.connect": zk_connect,
            "offsets.topic.replication.factor": "3",
            "auto.create.topics.enable": "false",
            **overrides,
        }
        (directory / "server.properties").write_text(
            "".join(f"{k}={v}\n" for k, v in properties.items())
        )
        (directory / "log4j.properties").write_text(LOG4J.format(log=self.log))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        command = [
            "java",
            "-Xmx1G",
            "-Xms1G",
            f"-Dlog4j.configuration=file:{self.dir / 'log4j.properties'}",
            "-cp",
            f"{kafka_libs()}/*",
            "kafka.Kafka",
            str(self.dir / "server.properties"),
        ]
        with open(self.dir / "stdout.log", "wb") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def signal(self, signum: int) -> bool:
        if self.process is None or self.process.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)
        return True

    def wait(self, timeout: float) -> bool:
        if self.process is None:
            return True
        try:
            self.process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False


class KafkaCluster:
    """Three (or `brokers`) Kafka brokers and their ZooKeeper (see the module docstring)."""

    def __init__(self, directory: Path, brokers: int, overrides: dict[str, str]) -> None:
        if not (kafka_libs() / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
            raise SystemExit(f"Kafka's jars are not in {kafka_libs()}: run ./dev kafka")
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.zookeeper = ZooKeeperServer(port=free_port(), data_dir=directory / "zookeeper")
        self.zk_connect = f"127.0.0.1:{self.zookeeper.port}"
        self._brokers = {
            i: KafkaBrokerProcess(i, directory / f"broker-{i}", self.zk_connect, overrides)
            for i in range(1, brokers + 1)
        }

    @classmethod
    def up(cls, directory: Path, brokers: int, overrides: dict[str, str]) -> KafkaCluster:
        cluster = cls(directory, brokers, overrides)
        cluster.zookeeper.start()
        try:
            for broker in cluster._brokers.values():
                broker.start()
            deadline = time.monotonic() + START_TIMEOUT_S
            while sorted(cluster.registered_brokers()) != cluster.broker_ids or (
                cluster.controller_id() is None
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Kafka did not start within {START_TIMEOUT_S:g}s")
                for broker in cluster._brokers.values():
                    if broker.process is not None and broker.process.poll() is not None:
                        raise RuntimeError(f"Kafka broker {broker.id} exited: {broker.log}")
                time.sleep(0.5)
        except BaseException:
            cluster.down(timeout=10)
            raise
        return cluster

    @property
    def broker_ids(self) -> list[int]:
        return sorted(self._brokers)

    @property
    def brokers(self) -> list[KafkaBrokerProcess]:
        return [self._brokers[i] for i in self.broker_ids]

    def broker(self, broker_id: int) -> KafkaBrokerProcess:
        return self._brokers[broker_id]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{b.host}:{b.port}" for b in self.brokers if b.pid is not None)

    def _zk(self, read):  # type: ignore[no-untyped-def]
        async def run():  # type: ignore[no-untyped-def]
            client = ZkClient(self.zk_connect)
            await client.start()
            try:
                return await read(client)
            finally:
                await client.close()

        return asyncio.run(run())

    def controller_id(self) -> int | None:
        async def read(zk: ZkClient) -> int | None:
            try:
                data, _stat = await zk.get("/controller")
            except NoNodeError:  # none elected
                return None
            return int(json.loads(data)["brokerid"])

        return self._zk(read)

    def registered_brokers(self) -> list[int]:
        async def read(zk: ZkClient) -> list[int]:
            try:
                return sorted(int(c) for c in await zk.get_children("/brokers/ids"))
            except NoNodeError:  # not created yet
                return []

        return self._zk(read)

    def kill(self, broker_id: int) -> bool:
        broker = self._brokers[broker_id]
        if not broker.signal(signal.SIGKILL):
            return False
        broker.wait(30)
        broker.process = None
        return True

    def terminate(self, broker_id: int, timeout: float = 60) -> bool:
        broker = self._brokers[broker_id]
        if not broker.signal(signal.SIGTERM):
            return False
        clean = broker.wait(timeout)
        if not clean:
            broker.signal(signal.SIGKILL)
            broker.wait(30)
        broker.process = None
        return clean

    def down(self, timeout: float = 60) -> None:
        for broker in self._brokers.values():
            broker.signal(signal.SIGKILL)  # teardown: nothing to measure, no controlled shutdown
        for broker in self._brokers.values():
            broker.wait(30)
            broker.process = None
        self.zookeeper.stop()
