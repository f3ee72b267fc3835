"""The files of a local cluster and the records they hold: each broker's place on disk
(`LocalBroker`), the ZooKeeper it uses (`ZooKeeperInfo`), their JSON form in `cluster.json`, the
broker properties a development cluster starts from, and small helpers the harness shares (reading
a log's tail, running ZooKeeper reads from synchronous code).

The directory layout itself is described in `odradek.testing.local_cluster`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from odradek.errors import OperatorError
from odradek.zk.errors import ZkError

T = TypeVar("T")
R = TypeVar("R")

HOST = "127.0.0.1"
CLUSTER_FILE = "cluster.json"
CLUSTER_LOCK_FILE = ".cluster.lock"


@contextlib.contextmanager
def cluster_file_lock(directory: Path) -> Iterator[None]:
    """Hold the cluster directory's lock: whoever rewrites cluster.json (`LocalCluster`, the Spark
    standalone cluster of `odradek.testing.spark_standalone`) reads and replaces it under it."""
    with open(directory / CLUSTER_LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def development_defaults(brokers: int) -> dict[str, str]:
    """Broker properties for a fast local cluster; every one can be overridden.

    Shorter than Kafka's production defaults where waiting would only slow a developer or a test
    down: a dead broker's session expires in 6 s instead of 18, a lagging follower leaves the ISR
    after 10 s, a refused controlled shutdown is retried after 0.5 s, retention runs every 5 s,
    and consumer groups rebalance without the initial 3 s delay. Replication factors (and the
    transaction log's min ISR) are capped by the number of brokers, so that a one-broker cluster
    can create topics at all.
    """
    replication = str(min(3, brokers))
    return {
        "zookeeper.session.timeout.ms": "6000",
        "replica.lag.time.max.ms": "10000",
        "num.partitions": "1",
        "default.replication.factor": replication,
        "offsets.topic.replication.factor": replication,
        "transaction.state.log.replication.factor": replication,
        "transaction.state.log.min.isr": str(min(2, brokers)),
        "controlled.shutdown.retry.backoff.ms": "500",
        "log.retention.check.interval.ms": "5000",
        "group.initial.rebalance.delay.ms": "0",
    }


def tail(path: Path, lines: int = 20, start: int = 0) -> str:
    """The last `lines` lines of a text file from byte `start` on ("" if unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(start, f.tell() - 32_768))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


def run_sync(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from synchronous code, even inside a running event loop.

    ZooKeeper errors (a connection lost for good, a session expired) become OperatorError here,
    so that the command line reports them in one line.
    """

    async def main() -> T:
        try:
            return await factory()
        except ZkError as e:
            raise OperatorError(f"ZooKeeper: {e}") from None

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="local-cluster") as pool:
        return pool.submit(asyncio.run, main()).result()


def to_json(record: Any) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(record).items()}


def from_json(cls: type[R], obj: Mapping[str, Any]) -> R:
    """A dataclass from its `_to_json` form; unknown keys are ignored, Path fields restored.
    TypeError if a required key is missing."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {
        key: Path(value) if value is not None and "Path" in str(fields[key].type) else value
        for key, value in obj.items()
        if key in fields
    }
    return cls(**values)


@dataclass
class LocalBroker:
    """One broker of a local cluster: where it listens and where its files are."""

    id: int
    host: str
    port: int
    dir: Path
    data_dir: Path
    log: Path
    config: Path
    pid: int | None = None
    rack: str | None = None
    # Every listener's port, by listener name, when the broker has more than PLAINTEXT on
    # `port` (a secure cluster); `port` is then the first (client) listener's.
    listeners: dict[str, int] = dataclasses.field(default_factory=dict)
    # Its Prometheus endpoint (`metrics.listener`): "http://host:port/metrics".
    metrics: str | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def address(self, listener: str) -> str:
        return f"{self.host}:{self.listeners.get(listener, self.port)}"


@dataclass
class ZooKeeperInfo:
    """The private ZooKeeper (`dir` set) or an external one (only `connect`)."""

    connect: str
    port: int | None = None
    pid: int | None = None
    dir: Path | None = None
    log: Path | None = None
    # The members of a private ensemble (or of a server in a network lab): {id, host, port,
    # pid, dir, config} each; empty for a single server on loopback, described by the above.
    servers: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def external(self) -> bool:
        return self.dir is None

    @property
    def config_file(self) -> Path | None:
        return self.dir / "zoo.cfg" if self.dir is not None else None

    def to_json(self) -> dict[str, Any]:
        return {**to_json(self), "external": self.external}


def write_properties(path: Path, properties: Mapping[str, str], header: str) -> None:
    lines = [f"# {header}"] + [f"{key}={value}" for key, value in properties.items()]
    path.write_text("\n".join(lines) + "\n")
