"""A local Odradek cluster on one machine: a private ZooKeeper and N broker processes.

`LocalCluster` is the Python API behind `odradek cluster ...`, the integration tests, the
benchmarks and the demo. Every broker is a real `odradek server` process, so fault drills (SIGKILL,
SIGSTOP, controlled shutdown by SIGTERM) exercise exactly what an operator's cluster would see.

Directory layout (`DIR` is the cluster directory; nothing outside it is written):

* `DIR/zookeeper/` -- the private ZooKeeper's `zoo.cfg` and data; `DIR/zookeeper.log` its output.
  Absent when the cluster uses an external ZooKeeper (`zookeeper=` connect string).
* `DIR/broker-<id>/server.properties` -- the broker's whole configuration, written by `up()` and
  reused unchanged by every restart (same ports, same data). `broker.log` there collects the
  broker's log (rotated by size into `broker.log.1`, ...: `broker.log.max.bytes`) and the
  process's stdout and stderr (appended across restarts, each start preceded by a marker line),
  `state-change.log` the controller's state-change log, and `data/` is its `log.dirs`.
* `DIR/cluster.json` -- what the other commands need to find the processes again, rewritten
  (atomically, under `DIR/.cluster.lock`) whenever a pid changes. A JSON object:
  `zookeeper`: {connect, port, pid, dir, log, external}; `brokers`: a list, by id, of {id, host,
  port, pid, dir, data_dir, log, config, rack, listeners}; `bootstrap`: "host:port,host:port,..." of
  all brokers; `client_config`: the client properties the harness connects with (a secure cluster's
  administrator, `odradek.testing.secure`), or null for PLAINTEXT. Paths are absolute; a pid is
  null when that process is not running.

Processes: each child runs in its own session and is signalled as a group; one known only by its
pid in cluster.json is recognised by its command line first (see `odradek.testing.processes`). The
status report is read from ZooKeeper by `odradek.testing.cluster_status`. Waiting and ZooKeeper reads
are `cluster_view`'s, signals and stopping `cluster_signals`'s (mixins of `LocalCluster`).

Concurrency: a `LocalCluster` belongs to the thread that created it and its methods block. They
read ZooKeeper on a private event loop (in a helper thread if the caller already runs one), so
they may be called from synchronous tests and from inside asyncio code alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from odradek.errors import OperatorError
from odradek.testing.cluster_files import (
    CLUSTER_FILE,
    HOST,
    LocalBroker,
    ZooKeeperInfo,
    cluster_file_lock,
    development_defaults,
    from_json,
    run_sync,
    to_json,
    write_properties,
)
from odradek.testing.cluster_signals import ClusterSignals
from odradek.testing.cluster_status import (
    local_status,
    read_status,
)
from odradek.testing.netns import NetworkLab
from odradek.testing.processes import ClusterProcess, ProcessState, free_ports
from odradek.testing.zookeeper_ensemble import ZooKeeperEnsemble
from odradek.zk.server import port_is_free

# A broker in a network namespace of its own listens on Kafka's usual port on its own address.
NAMESPACE_BROKER_PORT = 9092
NAMESPACE_METRICS_PORT = 9404

T = TypeVar("T")

# cluster.json entries written by others, which `_save` carries over: the Spark standalone
# cluster of `odradek.testing.spark_standalone`.
_KEPT_KEYS = ("spark",)
_POLL_INTERVAL_S = 0.05
# status() of a cluster whose ZooKeeper is down should answer quickly, not hang for a session.
_STATUS_CONNECT_TIMEOUT_S = 3.0


@dataclass
class LocalCluster(ClusterSignals):
    """A ZooKeeper and N brokers on this machine (see the module docstring).

    Build one with `LocalCluster.up(...)` (starts everything) or `LocalCluster.load(dir)` (finds a
    cluster another process started). Not thread-safe: one owner thread.
    """

    directory: Path
    zookeeper: ZooKeeperInfo
    _brokers: dict[int, LocalBroker] = field(default_factory=dict)
    _processes: dict[int, ClusterProcess] = field(default_factory=dict)
    _ensemble: ZooKeeperEnsemble | None = None
    network: NetworkLab | None = None
    _log_offsets: dict[int, int] = field(default_factory=dict)
    client_config: Path | None = None
    broker_env: dict[int, dict[str, str]] = field(default_factory=dict)
    broker_exec_prefix: dict[int, list[str]] = field(default_factory=dict)
    """A command that runs some brokers' processes at their next starts (`prlimit --nofile=...
    --`, say: a test of a low descriptor limit); not saved in cluster.json."""

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def up(
        cls,
        directory: Path,
        brokers: int,
        base_port: int | None = None,
        overrides: Mapping[str, str] | None = None,
        per_broker_overrides: Mapping[int, Mapping[str, str]] | None = None,
        racks: Mapping[int, str] | None = None,
        timeout: float = 60,
        zookeeper: str | None = None,
        listeners: Mapping[str, str] | None = None,
        inter_broker_listener: str | None = None,
        client_config: Path | None = None,
        before_brokers: Callable[[str], None] | None = None,
        broker_env: Mapping[int, Mapping[str, str]] | None = None,
        zookeepers: int = 1,
        network: NetworkLab | None = None,
    ) -> LocalCluster:
        """Start ZooKeeper (unless `zookeeper` names an external one) and brokers 1..`brokers`.

        Returns once every broker is registered in ZooKeeper and a live broker holds
        `/controller`. Ports: ZooKeeper on `base_port` and broker i on `base_port + i` when
        `base_port` is given, else free ports. An existing directory whose processes are all
        dead is reused with its data (a cluster brought down can be brought up again); one with
        a live process is refused. On any failure everything started here is killed again and
        an OperatorError (one line, with the failing broker's last log lines) is raised.

        `listeners` ({name: security protocol}, the first being the clients' bootstrap listener)
        gives each broker several listeners on free ports, `inter_broker_listener` names the one
        brokers use between themselves, and `client_config` is the client properties file the
        harness connects with; `before_brokers(zookeeper_connect)` runs once ZooKeeper is up
        and before any broker starts (a secure cluster creates its SCRAM users there).
        `broker_env` adds environment variables to some brokers' processes (a fault-injection
        library in `LD_PRELOAD`, say), at every start; it is not saved in cluster.json.

        `zookeepers` > 1 runs a private ensemble of that many members
        (`odradek.testing.zookeeper_ensemble`). With `network`, every ZooKeeper server and every
        broker runs in a node of that `NetworkLab` of its own (`zk1`..., `broker1`...), on its
        own address with Kafka's usual ports; the calling thread must have entered one of the
        lab's nodes (`network.entered("client")`), since it talks to them.
        """
        if brokers < 1:
            raise OperatorError(f"--brokers must be at least 1, not {brokers}")
        directory = Path(directory).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        _refuse_running_cluster(directory)
        names = list(listeners or {})
        per_broker = max(1, len(names))
        if network is not None:
            if listeners:
                raise OperatorError("named listeners are not supported in a network lab")
            zk_port = 0
            all_ports = [NAMESPACE_BROKER_PORT] * brokers
            metrics_ports = [NAMESPACE_METRICS_PORT] * brokers
        else:
            if base_port is not None:
                if base_port < 1 or base_port + brokers * (per_broker + 1) > 65535:
                    raise OperatorError(f"--base-port {base_port} leaves ports out of range")
                zk_port = base_port
                all_ports = [base_port + i for i in range(1, brokers * (per_broker + 1) + 1)]
            else:
                zk_port, *all_ports = free_ports(brokers * (per_broker + 1) + 1, HOST)
            # After the Kafka listeners' ports: one metrics port per broker.
            all_ports, metrics_ports = (
                all_ports[: brokers * per_broker],
                all_ports[brokers * per_broker :],
            )
        broker_ports = all_ports[:brokers]
        for index, port in enumerate(all_ports + metrics_ports if network is None else []):
            if not port_is_free(port, HOST):
                raise OperatorError(
                    f"port {port} (broker {index % brokers + 1}) is in use on {HOST}"
                )

        ensemble = None
        if zookeeper is not None:
            zk_info = ZooKeeperInfo(connect=zookeeper)
        elif zookeepers == 1 and network is None:
            zk_info = ZooKeeperInfo(
                connect=f"{HOST}:{zk_port}",
                port=zk_port,
                dir=directory / "zookeeper",
                log=directory / "zookeeper.log",
            )
        else:
            ensemble = ZooKeeperEnsemble(directory, zookeepers, network)
            zk_info = ZooKeeperInfo(
                connect=ensemble.connect,
                port=ensemble.peers[0].client_port,
                dir=ensemble.member_dir(1),
                log=ensemble.servers[1].log_file,
            )
        cluster = cls(directory, zk_info, client_config=client_config, network=network)
        cluster._ensemble = ensemble
        cluster.broker_env = {b: dict(env) for b, env in (broker_env or {}).items()}
        properties = {**development_defaults(brokers), **(overrides or {})}
        if listeners:
            properties["listener.security.protocol.map"] = ",".join(
                f"{name}:{protocol}" for name, protocol in listeners.items()
            )
            properties["inter.broker.listener.name"] = inter_broker_listener or names[0]
        for broker_id, port in enumerate(broker_ports, start=1):
            broker_dir = directory / f"broker-{broker_id}"
            host = HOST if network is None else network.add_node(f"broker{broker_id}").address
            broker = LocalBroker(
                id=broker_id,
                host=host,
                port=port,
                dir=broker_dir,
                data_dir=broker_dir / "data",
                log=broker_dir / "broker.log",
                config=broker_dir / "server.properties",
                rack=(racks or {}).get(broker_id),
                listeners={
                    name: all_ports[brokers * index + broker_id - 1]
                    for index, name in enumerate(names)
                },
                metrics=f"http://{host}:{metrics_ports[broker_id - 1]}/metrics",
            )
            cluster._brokers[broker_id] = broker
            cluster._write_broker_config(
                broker, {**properties, **(per_broker_overrides or {}).get(broker_id, {})}
            )
        try:
            cluster._start_zookeeper(timeout)
            if before_brokers is not None:
                before_brokers(zk_info.connect)
            for broker_id in cluster._brokers:
                cluster._spawn(broker_id)
            cluster._save()
            cluster._wait_for_cluster(list(cluster._brokers), {}, timeout, need_controller=True)
        except BaseException:
            cluster.kill_all()
            raise
        return cluster

    @classmethod
    def load(cls, directory: Path) -> LocalCluster:
        """The cluster described by `directory/cluster.json`; OperatorError if there is none."""
        directory = Path(directory).resolve()
        path = directory / CLUSTER_FILE
        try:
            obj = json.loads(path.read_text())
            zk_info = from_json(ZooKeeperInfo, obj["zookeeper"])
            brokers = [from_json(LocalBroker, b) for b in obj["brokers"]]
        except FileNotFoundError:
            raise OperatorError(f"no cluster in {directory} ({CLUSTER_FILE} not found)") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise OperatorError(f"{path} is not a valid cluster file: {e}") from None
        client_config = obj.get("client_config")
        cluster = cls(
            directory, zk_info, client_config=Path(client_config) if client_config else None
        )
        for broker in brokers:
            cluster._brokers[broker.id] = broker
            if broker.pid is not None:
                cluster._processes[broker.id] = ClusterProcess(broker.pid, str(broker.config))
        return cluster

    # -- what there is ------------------------------------------------------------------------

    @property
    def brokers(self) -> list[LocalBroker]:
        return [self._brokers[i] for i in sorted(self._brokers)]

    @property
    def broker_ids(self) -> list[int]:
        return sorted(self._brokers)

    def broker(self, broker_id: int) -> LocalBroker:
        try:
            return self._brokers[broker_id]
        except KeyError:
            known = ", ".join(str(i) for i in self.broker_ids)
            raise OperatorError(
                f"no broker {broker_id} in the cluster in {self.directory} (brokers: {known})"
            ) from None

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    @property
    def zookeeper_connect(self) -> str:
        return self.zookeeper.connect

    def process_state(self, broker_id: int) -> ProcessState:
        self.broker(broker_id)
        process = self._processes.get(broker_id)
        return process.state() if process is not None else ProcessState.DEAD

    def is_alive(self, broker_id: int) -> bool:
        """True while the broker's process exists (running or stopped by SIGSTOP)."""
        return self.process_state(broker_id) is not ProcessState.DEAD

    @property
    def ensemble(self) -> ZooKeeperEnsemble:
        """The private ZooKeeper servers this object started (for faults on them)."""
        if self._ensemble is None:
            raise OperatorError("this cluster's ZooKeeper was not started by this object")
        return self._ensemble

    def zookeeper_alive(self) -> bool | None:
        """Whether the private ZooKeeper's process runs (any member of an ensemble); None for an
        external ZooKeeper."""
        if self.zookeeper.external:
            return None
        if self._ensemble is not None:
            return any(s.is_running for s in self._ensemble.servers.values())
        if self.zookeeper.servers:
            return any(p.alive for p in self._zookeeper_member_processes())
        process = self._zookeeper_process()
        return process is not None and process.alive

    # -- starting -----------------------------------------------------------------------------

    def _write_broker_config(self, broker: LocalBroker, properties: Mapping[str, str]) -> None:
        broker.dir.mkdir(parents=True, exist_ok=True)
        listeners = ",".join(
            f"{name}://{broker.host}:{port}"
            for name, port in (broker.listeners or {"PLAINTEXT": broker.port}).items()
        )
        config = {
            "broker.id": str(broker.id),
            "listeners": listeners,
            "advertised.listeners": listeners,
            "log.dirs": str(broker.data_dir),
            "zookeeper.connect": self.zookeeper.connect,
        }
        if broker.rack is not None:
            config["broker.rack"] = broker.rack
        if broker.metrics is not None:
            config["metrics.listener"] = broker.metrics.removesuffix("/metrics")
        config.update(properties)
        write_properties(
            broker.config, config, f"broker {broker.id} of the local cluster in {self.directory}"
        )

    def _start_zookeeper(self, timeout: float) -> None:
        info = self.zookeeper
        if info.external or info.port is None or info.dir is None:
            return
        # fsync off: a development cluster's ZooKeeper need not survive a power cut, and
        # ZooKeeper's fsync per transaction would dominate topic creation on slow disks.
        if self._ensemble is None:
            self._ensemble = ZooKeeperEnsemble(self.directory, 1, client_port=info.port)
        self._ensemble.start(timeout)
        info.pid = self._ensemble.servers[min(self._ensemble.servers)].pid
        if len(self._ensemble.servers) > 1 or self.network is not None:
            info.servers = self._ensemble.describe()

    def _command(self, broker: LocalBroker) -> list[str]:
        return [
            sys.executable,
            "-m",
            "odradek.cli.main",
            "server",
            str(broker.config),
            "--state-change-log",
            str(broker.dir),
            # The broker writes its log itself, so that it can rotate it (broker.log.max.bytes);
            # stdout and stderr are appended to the same file by _spawn.
            "--log-file",
            str(broker.log),
        ]

    def _spawn(self, broker_id: int) -> None:
        broker = self._brokers[broker_id]
        broker.data_dir.mkdir(parents=True, exist_ok=True)
        with open(broker.log, "ab") as log:
            self._log_offsets[broker_id] = log.tell()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"=== odradek cluster: starting broker {broker_id} at {stamp} ===\n".encode())
            log.flush()
            popen = subprocess.Popen(
                [
                    *(self.network.exec_prefix(f"broker{broker_id}") if self.network else []),
                    *self.broker_exec_prefix.get(broker_id, []),
                    *self._command(broker),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=broker.dir,
                env={
                    **os.environ,
                    "PYTHONUNBUFFERED": "1",
                    **self.broker_env.get(broker_id, {}),
                },
                start_new_session=True,
            )
        broker.pid = popen.pid
        self._processes[broker_id] = ClusterProcess(popen.pid, str(broker.config), popen)

    def start_broker(self, broker_id: int, timeout: float = 60, wait: bool = True) -> None:
        """Start a broker that is not running, with its existing config, ports and data; with
        `wait`, return once it has registered anew in ZooKeeper."""
        broker = self.broker(broker_id)
        if self.is_alive(broker_id):
            return
        if self.network is None and not port_is_free(broker.port, broker.host):
            raise OperatorError(f"port {broker.port} (broker {broker_id}) is in use on {HOST}")
        previous = self.registered_epochs() if wait else {}
        self._spawn(broker_id)
        self._save([broker_id])
        if wait:
            self._wait_for_cluster([broker_id], previous, timeout, need_controller=False)

    def restart(self, broker_id: int, timeout: float = 60) -> None:
        """Controlled shutdown (if running), then start again and wait until registered."""
        self.terminate(broker_id, timeout)
        self.start_broker(broker_id, timeout)

    # -- cluster.json -------------------------------------------------------------------------

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return cluster_file_lock(self.directory)

    def _save(self, broker_ids: Iterable[int] | None = None) -> None:
        """Write cluster.json. With `broker_ids`, only those brokers' entries are replaced in
        the file as it is now, so that two commands changing different brokers at the same time
        (`cluster kill 1` and `cluster restart 2`) do not undo each other."""
        path = self.directory / CLUSTER_FILE
        with self._locked():
            brokers = {b.id: to_json(b) for b in self.brokers}
            zookeeper = self.zookeeper.to_json()
            kept: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError, AttributeError):
                kept = {k: v for k, v in json.loads(path.read_text()).items() if k in _KEPT_KEYS}
            if broker_ids is not None and path.exists():
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    current = json.loads(path.read_text())
                    on_disk = {int(b["id"]): b for b in current["brokers"]}
                    changed = set(broker_ids)
                    brokers = {**on_disk, **{i: b for i, b in brokers.items() if i in changed}}
                    zookeeper = current["zookeeper"]
            ordered = [brokers[i] for i in sorted(brokers)]
            document = {
                "zookeeper": zookeeper,
                "brokers": ordered,
                "bootstrap": ",".join(f"{b['host']}:{b['port']}" for b in ordered),
                "client_config": str(self.client_config) if self.client_config else None,
                **kept,
            }
            temporary = path.with_name(f".{CLUSTER_FILE}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps(document, indent=2) + "\n")
            os.replace(temporary, path)

    def status(self) -> dict[str, Any]:
        """The cluster as ZooKeeper and the process table see it (see `local_status`)."""
        processes = {b.id: (b.pid, self.process_state(b.id)) for b in self.brokers}
        zookeeper = {
            **self.zookeeper.to_json(),
            "process_alive": self.zookeeper_alive(),
        }
        try:
            view = run_sync(lambda: read_status(self.zookeeper.connect, _STATUS_CONNECT_TIMEOUT_S))
        except OperatorError as e:
            view = None
            zookeeper["error"] = str(e)
        return local_status(
            self.directory, self.bootstrap_servers, zookeeper, self._brokers, processes, view
        )


def _refuse_running_cluster(directory: Path) -> None:
    if not (directory / CLUSTER_FILE).exists():
        return
    try:
        existing = LocalCluster.load(directory)
    except OperatorError:
        return  # an unreadable leftover: overwritten by the new cluster
    alive = [b.id for b in existing.brokers if existing.is_alive(b.id)]
    if alive or existing.zookeeper_alive():
        what = f"brokers {alive}" if alive else "its ZooKeeper"
        raise OperatorError(
            f"a cluster is already running in {directory} ({what} alive): "
            f"run 'odradek cluster down --dir {directory}' first"
        )
